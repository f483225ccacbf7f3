// bench/lora: the LoRA work of one Llama-3.1-8B decoder layer (r 16 on all seven projections) as
// LlamaModel runs it (src/model/llama_model.cpp: the fold for q/k/v and gate/up, separate LoRA
// GEMMs for o and down), each GEMM through ops::gemm with the model's shapes, leading dimensions
// and dtypes (bf16 activations, f32 gradients), beside the device copy rate measured in the same
// run. These GEMMs move far more bytes than they compute, so the rate that matters is bytes moved
// (every operand read once, the output written once, read too when accumulated) per second.
// Usage: bench_lora [--tokens N (8192)] [--iters N (20)] [--rank R (16)]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.cuh"
#include "model/llama_ops.h"
#include "runtime/cuda_check.h"
#include "runtime/device_context.h"

using namespace qshard;

namespace {

struct Op {
  std::string name;
  GemmShape s;
};

GemmShape shape(int64_t M, int64_t N, int64_t K, bool ta, bool tb, float beta, DType c, int64_t lda = 0,
                int64_t ldb = 0, int64_t ldc = 0) {
  GemmShape s{M, N, K, ta, tb, 1.0f, beta};
  s.a_type = s.b_type = DType::kBF16;
  s.c_type = c;
  s.lda = lda, s.ldb = ldb, s.ldc = ldc;
  return s;
}

double bytes_of(const GemmShape& s) {
  const double a = static_cast<double>(s.M) * s.K * 2, b = static_cast<double>(s.K) * s.N * 2;
  const double c = static_cast<double>(s.M) * s.N * (s.c_type == DType::kF32 ? 4 : 2);
  return a + b + c * (s.beta != 0.0f ? 2 : 1);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t N = 8192, r = 16;
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) N = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--rank") && i + 1 < argc) r = std::atoll(argv[++i]);
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  const int64_t C = 4096, I = 14336, KV = 1024, R0 = 3 * r, R1 = 2 * r;
  const DType bf = DType::kBF16, f32 = DType::kF32;
  // The layer's LoRA GEMMs in the order the model runs them (forward, then backward).
  const std::vector<Op> ops_list = {
      {"fwd  t = h1 A_qkv^T (fold)", shape(N, R0, C, false, true, 0, bf, C + R0, 0, C + R0)},
      {"fwd  o: t = a A^T", shape(N, r, C, false, true, 0, bf)},
      {"fwd  o: y += s t B^T", shape(N, C, r, false, true, 1, bf)},
      {"fwd  t = h2 A_gu^T (fold)", shape(N, R1, C, false, true, 0, bf, C + R1, 0, C + R1)},
      {"fwd  down: t = m A^T", shape(N, r, I, false, true, 0, bf)},
      {"fwd  down: y += s t B^T", shape(N, C, r, false, true, 1, bf)},
      {"bwd  down: t = m A^T", shape(N, r, I, false, true, 0, bf)},
      {"bwd  down: dB += s dy^T t", shape(C, r, N, true, false, 1, f32)},
      {"bwd  down: dt = dy B", shape(N, r, C, false, false, 0, bf)},
      {"bwd  down: dA += s dt^T m", shape(r, I, N, true, false, 1, f32)},
      {"bwd  down: dm += s dt A", shape(N, I, r, false, false, 1, bf)},
      {"bwd  gate: dt (fold, W_ext block)", shape(N, R1, I, false, false, 0, bf, 0, C + R1, C + R1)},
      {"bwd  gate: dB += s dy^T t", shape(I, r, N, true, false, 1, f32, 0, C + R1)},
      {"bwd  up: dt (fold, W_ext block)", shape(N, R1, I, false, false, 1, bf, 0, C + R1, C + R1)},
      {"bwd  up: dB += s dy^T t", shape(I, r, N, true, false, 1, f32, 0, C + R1)},
      {"bwd  gate: dA += dt^T h2 (fold)", shape(r, C, N, true, false, 1, f32, C + R1, C + R1)},
      {"bwd  up: dA += dt^T h2 (fold)", shape(r, C, N, true, false, 1, f32, C + R1, C + R1)},
      {"bwd  h2: dx += dt A_gu (fold)", shape(N, C, R1, false, false, 1, bf, C + R1, 0, C + R1)},
      {"bwd  o: t = a A^T", shape(N, r, C, false, true, 0, bf)},
      {"bwd  o: dB += s dy^T t", shape(C, r, N, true, false, 1, f32)},
      {"bwd  o: dt = dy B", shape(N, r, C, false, false, 0, bf)},
      {"bwd  o: dA += s dt^T a", shape(r, C, N, true, false, 1, f32)},
      {"bwd  o: da += s dt A", shape(N, C, r, false, false, 1, bf)},
      {"bwd  q: dt (fold, W_ext block)", shape(N, R0, C, false, false, 0, bf, 0, C + R0, C + R0)},
      {"bwd  q: dB += s dy^T t", shape(C, r, N, true, false, 1, f32, 0, C + R0)},
      {"bwd  k: dt (fold, W_ext block)", shape(N, R0, KV, false, false, 1, bf, 0, C + R0, C + R0)},
      {"bwd  k: dB += s dy^T t", shape(KV, r, N, true, false, 1, f32, 0, C + R0)},
      {"bwd  v: dt (fold, W_ext block)", shape(N, R0, KV, false, false, 1, bf, 0, C + R0, C + R0)},
      {"bwd  v: dB += s dy^T t", shape(KV, r, N, true, false, 1, f32, 0, C + R0)},
      {"bwd  q: dA += dt^T h1 (fold)", shape(r, C, N, true, false, 1, f32, C + R0, C + R0)},
      {"bwd  k: dA += dt^T h1 (fold)", shape(r, C, N, true, false, 1, f32, C + R0, C + R0)},
      {"bwd  v: dA += dt^T h1 (fold)", shape(r, C, N, true, false, 1, f32, C + R0, C + R0)},
      {"bwd  h1: dx += dt A_qkv (fold)", shape(N, C, R0, false, false, 1, bf, C + R0, 0, C + R0)},
  };
  DeviceContext ctx(Backend::kCuda, 0);
  ops::prepare(ctx);
  cudaStream_t st = static_cast<cudaStream_t>(ctx.compute().handle());
  // One buffer per operand role, large enough for every op's extent in it (rows x leading
  // dimension: the W_ext blocks are [I, C + R] whatever the token count, more than [N, I] below
  // 4,096 tokens), f32 outputs.
  int64_t big = 0;
  for (const Op& op : ops_list) {
    const GemmShape& s = op.s;
    const int64_t a = (s.trans_a ? s.K : s.M) * (s.lda ? s.lda : (s.trans_a ? s.M : s.K));
    const int64_t b = (s.trans_b ? s.N : s.K) * (s.ldb ? s.ldb : (s.trans_b ? s.K : s.N));
    const int64_t c = s.M * (s.ldc ? s.ldc : s.N);
    big = std::max({big, a, b, c});
  }
  uint16_t *A, *B;
  void* Cbuf;
  QS_CUDA_CHECK(cudaMalloc(&A, static_cast<size_t>(big) * 2));
  QS_CUDA_CHECK(cudaMalloc(&B, static_cast<size_t>(big) * 2));
  QS_CUDA_CHECK(cudaMalloc(&Cbuf, static_cast<size_t>(big) * 4));
  bench::fill_bf16(A, big, 1, 0.1f, st);
  bench::fill_bf16(B, big, 2, 0.1f, st);
  bench::fill_bf16(static_cast<uint16_t*>(Cbuf), big * 2, 3, 0.1f, st);
  bench::EventTimer timer(st);
  auto time_ms = [&](auto&& body) { return timer.mean_ms(iters, body); };
  const double copy_bytes = static_cast<double>(N) * I * 2;
  const double copy_ms = time_ms(
      [&] { QS_CUDA_CHECK(cudaMemcpyAsync(B, A, static_cast<size_t>(copy_bytes), cudaMemcpyDeviceToDevice, st)); });
  const double copy_rate = 2 * copy_bytes / copy_ms / 1e6;  // read + write, GB/s
  std::printf("LoRA GEMMs of one 8B layer, %lld tokens, r %lld (ops::gemm, cuBLASLt); device copy %.0f GB/s\n",
              static_cast<long long>(N), static_cast<long long>(r), copy_rate);
  std::printf("%-36s %6s %6s %6s %9s %9s %6s\n", "op", "M", "N", "K", "ms", "GB/s", "%copy");
  double total = 0, total_bytes = 0;
  for (const Op& op : ops_list) {
    const double ms = time_ms([&] { ops::gemm(Cbuf, A, B, op.s, ctx); });
    const double bytes = bytes_of(op.s);
    total += ms;
    total_bytes += bytes;
    std::printf("%-36s %6lld %6lld %6lld %9.4f %9.1f %5.1f%%\n", op.name.c_str(), static_cast<long long>(op.s.M),
                static_cast<long long>(op.s.N), static_cast<long long>(op.s.K), ms, bytes / ms / 1e6,
                100.0 * bytes / ms / 1e6 / copy_rate);
  }
  std::printf("%-36s %20s %9.4f %9.1f %5.1f%%   (x 32 layers: %.1f ms a step)\n", "layer total", "", total,
              total_bytes / total / 1e6, 100.0 * total_bytes / total / 1e6 / copy_rate, 32 * total);
  cudaFree(A);
  cudaFree(B);
  cudaFree(Cbuf);
  return 0;
}
