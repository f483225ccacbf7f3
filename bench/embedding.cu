// bench/embedding: the embedding lookup of one Llama-3.1-8B step (a 128256 x 4096 bf16 table) with
// the table on the device and in pinned host memory read in place (memory.embedding: host), beside
// the pinned host-to-device copy of the same rows measured in the same run.
// Rate = bytes of the rows read / time (the lookup writes as many on the device).
// Usage: bench_embedding [--tokens N (8192)] [--iters N (50)]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "model/llama_ops.h"
#include "runtime/allocator.h"
#include "runtime/cuda_check.h"
#include "runtime/device_context.h"

using namespace qshard;

int main(int argc, char** argv) {
  int64_t N = 8192;
  int iters = 50;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) N = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
  }
  const int64_t V = 128256, C = 4096;
  const size_t table_bytes = static_cast<size_t>(V * C * 2), row_bytes = static_cast<size_t>(C * 2);
  DeviceContext ctx(Backend::kCuda, 0);
  cudaStream_t s = static_cast<cudaStream_t>(ctx.compute().handle());
  std::vector<uint16_t> host_init(static_cast<size_t>(V * C));
  for (size_t i = 0; i < host_init.size(); ++i) host_init[i] = static_cast<uint16_t>(0x3c00 + (i * 2654435761u >> 20) % 512);
  void* dev_table = nullptr;
  QS_CUDA_CHECK(cudaMalloc(&dev_table, table_bytes));
  QS_CUDA_CHECK(cudaMemcpy(dev_table, host_init.data(), table_bytes, cudaMemcpyHostToDevice));
  PinnedHostAllocator pinned;
  void* host_table = pinned.allocate(table_bytes);
  std::memcpy(host_table, host_init.data(), table_bytes);
  if (!device_reads_at_host_address(host_table)) {
    std::fprintf(stderr, "this GPU does not read pinned host memory at its host address\n");
    return 1;
  }
  std::vector<int64_t> ids(static_cast<size_t>(N));
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int64_t& id : ids) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    id = static_cast<int64_t>(x % static_cast<uint64_t>(V));
  }
  int64_t* d_ids = nullptr;
  void *out = nullptr, *staged = nullptr;
  QS_CUDA_CHECK(cudaMalloc(&d_ids, ids.size() * sizeof(int64_t)));
  QS_CUDA_CHECK(cudaMemcpy(d_ids, ids.data(), ids.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  QS_CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(N) * row_bytes));
  QS_CUDA_CHECK(cudaMalloc(&staged, static_cast<size_t>(N) * row_bytes));
  cudaEvent_t a, b;
  QS_CUDA_CHECK(cudaEventCreate(&a));
  QS_CUDA_CHECK(cudaEventCreate(&b));
  auto time_ms = [&](auto&& body) {
    body();  // warm-up
    QS_CUDA_CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < iters; ++i) body();
    QS_CUDA_CHECK(cudaEventRecord(b, s));
    QS_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    QS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return static_cast<double>(ms) / iters;
  };
  const double rows = static_cast<double>(N) * static_cast<double>(row_bytes);
  const double dev_ms = time_ms([&] { ops::embedding_fwd(out, d_ids, dev_table, DType::kBF16, N, C, V, ctx); });
  std::vector<uint16_t> from_dev(static_cast<size_t>(N * C)), from_host(static_cast<size_t>(N * C));
  QS_CUDA_CHECK(cudaMemcpy(from_dev.data(), out, rows, cudaMemcpyDeviceToHost));
  const double host_ms = time_ms([&] { ops::embedding_fwd(out, d_ids, host_table, DType::kBF16, N, C, V, ctx); });
  QS_CUDA_CHECK(cudaMemcpy(from_host.data(), out, rows, cudaMemcpyDeviceToHost));
  const double copy_ms = time_ms([&] {
    QS_CUDA_CHECK(cudaMemcpyAsync(staged, host_table, static_cast<size_t>(rows), cudaMemcpyHostToDevice, s));
  });
  const bool same = from_dev == from_host;
  std::printf("embedding lookup, %lld rows of %lld bf16 from a %lld-row table (%.2f GB), %d iterations:\n",
              static_cast<long long>(N), static_cast<long long>(C), static_cast<long long>(V), table_bytes / 1e9, iters);
  std::printf("  table on the device       %8.3f ms  %7.1f GB/s\n", dev_ms, rows / dev_ms / 1e6);
  std::printf("  table in pinned host      %8.3f ms  %7.1f GB/s  (%.1f%% of the pinned copy)\n", host_ms,
              rows / host_ms / 1e6, 100.0 * copy_ms / host_ms);
  std::printf("  pinned copy of as many bytes %5.3f ms  %7.1f GB/s\n", copy_ms, rows / copy_ms / 1e6);
  std::printf("  rows identical: %s\n", same ? "yes" : "NO");
  pinned.release(host_table);
  cudaFree(dev_table);
  cudaFree(d_ids);
  cudaFree(out);
  cudaFree(staged);
  return same ? 0 : 1;
}
