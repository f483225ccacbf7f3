// bench/gather: the sharded-parameter manager on one GPU.
//  1. pinned host -> device copy bandwidth (the ceiling for offloaded shards), same run;
//  2. per unit: gather time with shards offloaded to pinned host memory (h2d + all-gather) and
//     with shards on the device (all-gather only); the difference is the h2d time, reported as
//     GB/s against the pinned ceiling;
//  3. overlap: a pass over the units with a fixed compute kernel per unit, without and with
//     prefetch of unit i+1 during compute on unit i.
// Units are Llama-3-8B decoder layers in NF4 with double quant (packed bytes + statistics:
// 117.6 MB), bf16 norms and LoRA r=16 on all projections (f32 master).
// Usage: mpirun -np 1 bench_gather [--units 8] [--json FILE]   (NCCL communicator)
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/cuda_check.h"
#include "runtime/nccl_communicator.h"
#include "runtime/world.h"
#include "shard/sharded_parameter_manager.h"

using namespace qshard;

namespace {

// The compute stream a job's DeviceContext would own.
Stream& bench_compute_stream() {
  static Stream s(stream_names::kCompute);
  return s;
}


__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  World& world = World::init(&argc, &argv);
  int units = 8;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--units") && i + 1 < argc) units = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
  }
  cudaDeviceProp prop{};
  QS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));

  // 1. Pinned H2D ceiling: 1 GiB, 10 copies.
  const size_t big = size_t(1) << 30;
  void *host = nullptr, *dev = nullptr;
  QS_CUDA_CHECK(cudaMallocHost(&host, big));
  QS_CUDA_CHECK(cudaMalloc(&dev, big));
  std::memset(host, 1, big);
  cudaEvent_t a, b;
  QS_CUDA_CHECK(cudaEventCreate(&a));
  QS_CUDA_CHECK(cudaEventCreate(&b));
  QS_CUDA_CHECK(cudaMemcpy(dev, host, big, cudaMemcpyHostToDevice));
  QS_CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < 10; ++i) QS_CUDA_CHECK(cudaMemcpyAsync(dev, host, big, cudaMemcpyHostToDevice));
  QS_CUDA_CHECK(cudaEventRecord(b));
  QS_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  QS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  const double pinned_gbs = 10.0 * big / (ms * 1e-3) / 1e9;
  QS_CUDA_CHECK(cudaFreeHost(host));
  QS_CUDA_CHECK(cudaFree(dev));

  NcclCommunicator comm(world.comm());
  // Unit contents (bytes are what the manager moves; values do not matter here).
  const int64_t packed = (int64_t(4096) * 4096 * 2 + int64_t(1024) * 4096 * 2 + int64_t(14336) * 4096 * 3) / 2;
  const int64_t stats = packed * 2 / 64 + 1024;  // uint8 absmax + nested
  const int64_t lora = 16 * ((4096 + 4096) * 2 + (4096 + 1024) * 2 + (4096 + 14336) * 3);
  auto build = [&](bool offload) {
    ShardOptions o;
    o.offload_params = o.offload_optimizer = offload;
    o.compute_device = Device::kCuda;
    auto mgr = std::make_unique<ShardedParameterManager>(comm, bench_compute_stream(), o);
    for (int u = 0; u < units; ++u) {
      const int id = mgr->add_unit("layers." + std::to_string(u));
      mgr->add_tensor(id, BufferKind::kFrozen4bit, "packed", Tensor::zeros({packed}, DType::kU8));
      mgr->add_tensor(id, BufferKind::kFrozen4bit, "stats", Tensor::zeros({stats}, DType::kU8));
      mgr->add_tensor(id, BufferKind::kFrozenFloat, "norms", Tensor::zeros({2, 4096}, DType::kBF16));
      mgr->add_tensor(id, BufferKind::kTrainable, "lora", Tensor::zeros({lora}, DType::kF32));
    }
    mgr->finalize();
    return mgr;
  };
  auto unit_shard_bytes = [&](ShardedParameterManager& m) {
    int64_t s = 0;
    for (int k = 0; k < kNumBufferKinds; ++k) s += m.layout(0, static_cast<BufferKind>(k)).shard_bytes();
    return s;
  };

  // 2. Gather latency per unit, offloaded vs resident shards.
  auto time_gathers = [&](ShardedParameterManager& m) {
    for (int u = 0; u < 2; ++u) {  // warm-up
      m.gather(u);
      m.release(u);
    }
    m.compute_stream().synchronize();
    const double t0 = now_ms();
    for (int u = 0; u < units; ++u) {
      m.gather(u);
      m.compute_stream().synchronize();
      m.release(u);
    }
    return (now_ms() - t0) / units;
  };
  auto off = build(true);
  const int64_t shard_bytes = unit_shard_bytes(*off);
  const double t_off = time_gathers(*off);
  off.reset();
  auto res = build(false);
  const double t_res = time_gathers(*res);
  const double h2d_ms = std::max(t_off - t_res, 1e-6);
  const double h2d_gbs = shard_bytes / (h2d_ms * 1e-3) / 1e9;
  const double off_gbs = shard_bytes / (t_off * 1e-3) / 1e9;

  // 3. Overlap: compute per unit ~ the offloaded gather time.
  auto m = build(true);
  int clock_khz = 0;
  QS_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const long long cycles = static_cast<long long>(t_off * 1e-3 * clock_khz * 1e3);
  auto pass = [&](bool prefetch) {
    m->compute_stream().synchronize();
    const double t0 = now_ms();
    for (int u = 0; u < units; ++u) {
      m->gather(u);
      if (prefetch && u + 1 < units) m->prefetch(u + 1);
      spin_kernel<<<1, 1, 0, static_cast<cudaStream_t>(m->compute_stream().handle())>>>(cycles);
      QS_CUDA_CHECK_LAUNCH();
      m->release(u);
    }
    m->compute_stream().synchronize();
    return now_ms() - t0;
  };
  pass(true);  // warm-up
  const double t_serial = pass(false), t_overlap = pass(true);
  // Compute alone.
  m->compute_stream().synchronize();
  double t0 = now_ms();
  for (int u = 0; u < units; ++u)
    spin_kernel<<<1, 1, 0, static_cast<cudaStream_t>(m->compute_stream().handle())>>>(cycles);
  m->compute_stream().synchronize();
  const double t_compute = now_ms() - t0;

  if (world.rank() == 0) {
    std::printf("device: %s, world %d (%s), units %d\n", prop.name, comm.size(), comm.name(), units);
    std::printf("pinned host->device copy (1 GiB x 10): %.1f GB/s\n", pinned_gbs);
    std::printf("unit shard: %.1f MB (4-bit %.1f MB + norms + LoRA %.1f MB)\n", shard_bytes / 1e6,
                (packed + stats) / 1e6 / comm.size(), lora * 4 / 1e6 / comm.size());
    std::printf("gather per unit: offloaded %.3f ms (%.1f GB/s end to end), resident %.3f ms\n", t_off, off_gbs, t_res);
    std::printf("h2d of an offloaded shard: %.3f ms = %.1f GB/s = %.1f%% of pinned\n", h2d_ms, h2d_gbs,
                100.0 * h2d_gbs / pinned_gbs);
    std::printf("pass over %d units with %.3f ms compute each: no prefetch %.2f ms, prefetch %.2f ms, compute alone %.2f ms\n",
                units, t_off, t_serial, t_overlap, t_compute);
    if (!json_path.empty()) {
      FILE* f = std::fopen(json_path.c_str(), "w");
      if (f) {
        std::fprintf(f,
                     "{\"device\": \"%s\", \"world\": %d, \"units\": %d, \"pinned_gbs\": %.2f, \"unit_shard_bytes\": %lld, "
                     "\"gather_offloaded_ms\": %.4f, \"gather_resident_ms\": %.4f, \"h2d_gbs\": %.2f, "
                     "\"pass_no_prefetch_ms\": %.3f, \"pass_prefetch_ms\": %.3f, \"compute_only_ms\": %.3f}\n",
                     prop.name, comm.size(), units, pinned_gbs, (long long)shard_bytes, t_off, t_res, h2d_gbs, t_serial,
                     t_overlap, t_compute);
        std::fclose(f);
      }
    }
  }
  m.reset();
  res.reset();
  World::finalize();
  return 0;
}
