// bench/elementwise: the element-wise kernels of one Llama-3.1-8B decoder layer in a training step
// (RMSNorm, SwiGLU, RoPE, forward and backward) as LlamaModel runs them (src/model/llama_model.cpp),
// each through its ops:: function with the model's shapes, leading dimensions, dtypes and aliasing,
// beside the device copy rate measured in the same run. All of them are memory-bound, so the rate
// that matters is bytes moved per second against the copy's:
//   bytes = every operand read once + every output written once (an accumulated or in-place output
//   counted read and written); copy rate = 2 x bytes / time (read + write), as bench_lora counts it.
// The layer, in the order the step runs it (every layer kept: the forward once; a layer recomputed
// under activation checkpointing runs the five forward rows again):
//   forward:  rmsnorm_fwd input_norm -> h1 (rows C + 3r apart: the q/k/v LoRA fold's columns beside),
//             rope_fwd q [N, 32, 128], rope_fwd k [N, 8, 128] (in place),
//             rmsnorm_fwd post_norm -> h2 (rows C + 2r apart: the gate/up fold), swiglu_fwd m = silu(g) u;
//   backward: swiglu_bwd (dm over m, dgate / dup over g / u, as llama_buffer_aliases has them),
//             rmsnorm_bwd post_norm (dh2 rows C + 2r apart, adds into dx), rope_bwd dq, dk (in place),
//             rmsnorm_bwd input_norm (dh1 rows C + 3r apart, adds into dx).
// RoPE tables: Llama-3.1's (theta 500000, llama3 scaling: factor 8, low 1, high 4, original 8192
// positions), [T, 64] f32 cos and sin by ops::rope_tables; T = --seq, B = tokens / T sequences.
// RMSNorm eps 1e-5, f32 weights near 1; bf16 activations (scale 1.0) and gradients (scale 0.02).
// Repeated calls run on their own outputs (in-place RoPE, swiglu_bwd over its inputs, dx growing by
// accumulation): the values drift, the bytes and the work do not.
// Usage: bench_elementwise [--tokens N (16384)] [--seq T (2048)] [--iters N (20)] [--rank R (16)]
//        [--json FILE]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.cuh"
#include "model/llama_ops.h"
#include "runtime/cuda_check.h"
#include "runtime/device_context.h"
#include "runtime/tensor.h"

using namespace qshard;

namespace {

// Device buffers freed together at the end.
class DeviceBuffers {
 public:
  DeviceBuffers() = default;
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <typename T>
  T* alloc(int64_t n) {
    void* p = nullptr;
    QS_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(T)));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }

 private:
  std::vector<void*> ptrs_;
};

// Bytes moved by each op (bf16 activations: 2 bytes, f32 weights / rstd / tables: 4 bytes).
// rmsnorm_fwd: x read, weight read, out written, rstd written.
double rmsnorm_fwd_bytes(int64_t N, int64_t C) { return 2.0 * N * C + 4.0 * C + 2.0 * N * C + 4.0 * N; }
// rmsnorm_bwd: dout, x, weight, rstd read; dx read and written (it accumulates).
double rmsnorm_bwd_bytes(int64_t N, int64_t C) { return 2.0 * N * C * 2 + 4.0 * C + 4.0 * N + 2.0 * N * C * 2; }
// swiglu_fwd: gate, up read; h written.
double swiglu_fwd_bytes(int64_t n) { return 2.0 * n * 3; }
// swiglu_bwd: dh, gate, up read; dgate, dup written (over gate / up: still one read and one write).
double swiglu_bwd_bytes(int64_t n) { return 2.0 * n * 5; }
// rope: x [N, nh, D] read and written in place; cos and sin [T, D/2] read.
double rope_bytes(int64_t N, int64_t nh, int64_t D, int64_t T) { return 2.0 * N * nh * D * 2 + 4.0 * T * (D / 2) * 2; }

struct Row {
  std::string name;
  double ms = 0, bytes = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t N = 16384, T = 2048, r = 16;
  int iters = 20;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) N = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--seq") && i + 1 < argc) T = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--rank") && i + 1 < argc) r = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (N <= 0 || T <= 0 || N % T != 0) {
    std::fprintf(stderr, "--tokens %lld must be a positive multiple of --seq %lld\n", static_cast<long long>(N),
                 static_cast<long long>(T));
    return 2;
  }
  if (iters <= 0 || r < 0) {
    std::fprintf(stderr, "--iters %d must be positive and --rank %lld not negative\n", iters,
                 static_cast<long long>(r));
    return 2;
  }
  // Llama-3.1-8B: C hidden, I intermediate, H / Hkv heads of D; ld1 / ld2 the fold strides of h1 / h2.
  const int64_t C = 4096, I = 14336, H = 32, Hkv = 8, D = 128, B = N / T, L = 32;
  const int64_t ld1 = C + 3 * r, ld2 = C + 2 * r, NI = N * I;
  const float eps = 1e-5f;
  DeviceContext ctx(Backend::kCuda, 0);
  ops::prepare(ctx);
  cudaStream_t st = static_cast<cudaStream_t>(ctx.compute().handle());

  DeviceBuffers bufs;
  uint16_t* x = bufs.alloc<uint16_t>(N * C);     // [N, C] a norm's input
  uint16_t* h = bufs.alloc<uint16_t>(N * ld1);   // [N, ld] a norm's output (h1 / h2)
  uint16_t* dh = bufs.alloc<uint16_t>(N * ld1);  // [N, ld] the gradient at a norm's output
  uint16_t* dx = bufs.alloc<uint16_t>(N * C);    // [N, C] the residual stream's gradient
  float* rstd = bufs.alloc<float>(N);            // [N]
  float* w = bufs.alloc<float>(C);               // [C] a norm's weight
  uint16_t* q = bufs.alloc<uint16_t>(N * H * D);     // [N, H, D]
  uint16_t* k = bufs.alloc<uint16_t>(N * Hkv * D);   // [N, Hkv, D]
  uint16_t* dq = bufs.alloc<uint16_t>(N * H * D);    // [N, H, D]
  uint16_t* dk = bufs.alloc<uint16_t>(N * Hkv * D);  // [N, Hkv, D]
  float* cos = bufs.alloc<float>(T * D / 2);         // [T, D/2]
  float* sin = bufs.alloc<float>(T * D / 2);         // [T, D/2]
  uint16_t* g = bufs.alloc<uint16_t>(NI);  // [N, I] gate_proj's output, then its gradient
  uint16_t* u = bufs.alloc<uint16_t>(NI);  // [N, I] up_proj's output, then its gradient
  uint16_t* m = bufs.alloc<uint16_t>(NI);  // [N, I] silu(g) u, then its gradient dm
  const int64_t copy_n = int64_t{256} << 20;  // bytes
  uint8_t* copy_src = bufs.alloc<uint8_t>(copy_n);
  uint8_t* copy_dst = bufs.alloc<uint8_t>(copy_n);

  bench::fill_bf16(x, N * C, 1, 1.0f, st);
  bench::fill_bf16(dh, N * ld1, 2, 0.02f, st);
  bench::fill_bf16(dx, N * C, 3, 0.02f, st);
  bench::fill_bf16(q, N * H * D, 4, 1.0f, st);
  bench::fill_bf16(k, N * Hkv * D, 5, 1.0f, st);
  bench::fill_bf16(dq, N * H * D, 6, 0.02f, st);
  bench::fill_bf16(dk, N * Hkv * D, 7, 0.02f, st);
  bench::fill_bf16(g, NI, 8, 1.0f, st);
  bench::fill_bf16(u, NI, 9, 1.0f, st);
  bench::fill_bf16(reinterpret_cast<uint16_t*>(copy_src), copy_n / 2, 10, 1.0f, st);
  std::vector<float> w_host(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) w_host[static_cast<size_t>(c)] = 1.0f + 0.001f * static_cast<float>(c % 41 - 20);
  QS_CUDA_CHECK(cudaMemcpyAsync(w, w_host.data(), static_cast<size_t>(C) * 4, cudaMemcpyHostToDevice, st));
  RopeParams rp;  // Llama-3.1-8B's config.json
  rp.theta = 500000.0;
  rp.head_dim = D;
  rp.llama3 = true;
  rp.factor = 8.0;
  rp.low_freq_factor = 1.0;
  rp.high_freq_factor = 4.0;
  rp.original_max_position_embeddings = 8192;
  ops::rope_tables(cos, sin, rp, T, ctx);  // synchronizes the stream (w_host's copy done too)

  bench::EventTimer timer(st);
  auto time_ms = [&](auto&& body) { return timer.mean_ms(iters, body); };
  const double copy_ms = time_ms([&] {
    QS_CUDA_CHECK(cudaMemcpyAsync(copy_dst, copy_src, static_cast<size_t>(copy_n), cudaMemcpyDeviceToDevice, st));
  });
  const double copy_rate = 2.0 * copy_n / copy_ms / 1e6;  // read + write, GB/s

  // The layer's rows in the order the step runs them.
  std::vector<Row> rows;
  auto run = [&](std::string name, double bytes, auto&& body) {
    rows.push_back({std::move(name), time_ms(body), bytes});
  };
  run("rmsnorm_fwd input_norm (ld " + std::to_string(ld1) + ")", rmsnorm_fwd_bytes(N, C),
      [&] { ops::rmsnorm_fwd(h, rstd, x, w, N, C, eps, ctx, ld1); });
  run("rope_fwd q [N,32,128]", rope_bytes(N, H, D, T), [&] { ops::rope_fwd(q, cos, sin, B, T, H, D, ctx); });
  run("rope_fwd k [N,8,128]", rope_bytes(N, Hkv, D, T), [&] { ops::rope_fwd(k, cos, sin, B, T, Hkv, D, ctx); });
  run("rmsnorm_fwd post_norm (ld " + std::to_string(ld2) + ")", rmsnorm_fwd_bytes(N, C),
      [&] { ops::rmsnorm_fwd(h, rstd, x, w, N, C, eps, ctx, ld2); });
  run("swiglu_fwd [N,14336]", swiglu_fwd_bytes(NI), [&] { ops::swiglu_fwd(m, g, u, NI, ctx, GatedAct::kSilu); });
  bench::fill_bf16(m, NI, 11, 0.02f, st);  // m now holds dm (llama_buffer_aliases: dm over m)
  run("swiglu_bwd [N,14336] (over g, u)", swiglu_bwd_bytes(NI),
      [&] { ops::swiglu_bwd(g, u, m, g, u, NI, ctx, GatedAct::kSilu); });
  // rstd: post_norm's forward row above left it (the last rmsnorm_fwd timed).
  run("rmsnorm_bwd post_norm (ld " + std::to_string(ld2) + ")", rmsnorm_bwd_bytes(N, C),
      [&] { ops::rmsnorm_bwd(dx, dh, x, w, rstd, N, C, ctx, ld2); });
  run("rope_bwd dq [N,32,128]", rope_bytes(N, H, D, T), [&] { ops::rope_bwd(dq, cos, sin, B, T, H, D, ctx); });
  run("rope_bwd dk [N,8,128]", rope_bytes(N, Hkv, D, T), [&] { ops::rope_bwd(dk, cos, sin, B, T, Hkv, D, ctx); });
  run("rmsnorm_bwd input_norm (ld " + std::to_string(ld1) + ")", rmsnorm_bwd_bytes(N, C),
      [&] { ops::rmsnorm_bwd(dx, dh, x, w, rstd, N, C, ctx, ld1); });

  const std::string device = device_name();
  std::printf("Element-wise ops of one 8B layer, %lld tokens (%lld x %lld), LoRA fold r %lld; %s, copy %.0f GB/s\n",
              static_cast<long long>(N), static_cast<long long>(B), static_cast<long long>(T),
              static_cast<long long>(r), device.c_str(), copy_rate);
  std::printf("%-36s %9s %10s %9s %6s\n", "op", "ms", "MB", "GB/s", "%copy");
  std::printf("%-36s %9.4f %10.1f %9.1f %5.1f%%\n", "copy D2D 256 MiB (read + write)", copy_ms, 2.0 * copy_n / 1e6,
              copy_rate, 100.0);
  double total = 0, total_bytes = 0;
  for (const Row& row : rows) {
    total += row.ms;
    total_bytes += row.bytes;
    const double rate = row.bytes / row.ms / 1e6;
    std::printf("%-36s %9.4f %10.1f %9.1f %5.1f%%\n", row.name.c_str(), row.ms, row.bytes / 1e6, rate,
                100.0 * rate / copy_rate);
  }
  const double total_rate = total_bytes / total / 1e6;
  std::printf("%-36s %9.4f %10.1f %9.1f %5.1f%%   (x %lld layers: %.1f ms a step)\n", "layer total", total,
              total_bytes / 1e6, total_rate, 100.0 * total_rate / copy_rate, static_cast<long long>(L), L * total);

  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "--json %s: cannot open for writing\n", json_path.c_str());
      return 1;
    }
    std::fprintf(f, "{\"device\": \"%s\", \"tokens\": %lld, \"seq\": %lld, \"rank\": %lld, \"iters\": %d,\n",
                 device.c_str(), static_cast<long long>(N), static_cast<long long>(T), static_cast<long long>(r),
                 iters);
    std::fprintf(f, " \"copy\": {\"ms\": %.6f, \"bytes\": %.0f, \"gbs\": %.3f},\n \"ops\": [\n", copy_ms, 2.0 * copy_n,
                 copy_rate);
    for (size_t i = 0; i < rows.size(); ++i) {
      const double rate = rows[i].bytes / rows[i].ms / 1e6;
      std::fprintf(f, "  {\"name\": \"%s\", \"ms\": %.6f, \"bytes\": %.0f, \"gbs\": %.3f, \"pct_copy\": %.2f}%s\n",
                   rows[i].name.c_str(), rows[i].ms, rows[i].bytes, rate, 100.0 * rate / copy_rate,
                   i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(f, " ],\n \"layer\": {\"ms\": %.6f, \"bytes\": %.0f, \"gbs\": %.3f, \"pct_copy\": %.2f},\n", total,
                 total_bytes, total_rate, 100.0 * total_rate / copy_rate);
    std::fprintf(f, " \"layers\": %lld, \"step_ms\": %.4f}\n", static_cast<long long>(L), L * total);
    if (std::fclose(f) != 0) {
      std::fprintf(stderr, "--json %s: write failed\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
