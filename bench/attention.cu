// bench/attention: the fused attention of one Llama-3.1-8B layer (cuDNN SDPA, causal, 32 query
// heads over 8 kv heads of 128) forward and backward at the step's shapes, as the model calls it
// (cuda::attention_fwd / attention_bwd, [B, T, heads, D] bf16 rows, f32 row statistics), with the
// backward's deterministic algorithm (the default) and the non-deterministic one.
// FLOPs counted as the FlashAttention papers count them, causal: forward 2 matmuls of
// 2 B H T^2 D each, halved by the mask = 2 B H T^2 D; backward 2.5x the forward (5 matmuls).
// Issue 23's target: forward + backward >= 350 TFLOP/s at 4 x 2048.
// Usage: bench_attention [--iters N (20)] [--shapes BxT,BxT,... (1x2048,2x2048,4x2048,8x2048,1x8192)]
//        [--heads H (32)] [--kv-heads Hkv (8)] [--head-dim D (128)] [--softcap C (0: none)]
// --softcap C > 0: Gemma 2's soft-capped scores, which run the eager attention (attention_eager.cu;
// one row a shape, its arithmetic deterministic).
#include <cuda_runtime.h>

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

using namespace qshard;

namespace {

std::vector<std::pair<int64_t, int64_t>> parse_shapes(const char* s) {
  std::vector<std::pair<int64_t, int64_t>> out;
  std::string all(s);
  size_t pos = 0;
  while (pos < all.size()) {
    size_t end = all.find(',', pos);
    if (end == std::string::npos) end = all.size();
    const std::string item = all.substr(pos, end - pos);
    const size_t x = item.find('x');
    if (x == std::string::npos) {
      std::fprintf(stderr, "--shapes: '%s' is not BxT\n", item.c_str());
      std::exit(2);
    }
    out.emplace_back(std::atoll(item.substr(0, x).c_str()), std::atoll(item.substr(x + 1).c_str()));
    pos = end + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
#ifndef QSHARD_WITH_CUDNN
  std::fprintf(stderr, "bench_attention: this build has no cuDNN attention\n");
  return 1;
#else
  int iters = 20;
  int64_t H = 32, Hkv = 8, D = 128;
  float softcap = 0.0f;
  std::vector<std::pair<int64_t, int64_t>> shapes = parse_shapes("1x2048,2x2048,4x2048,8x2048,1x8192");
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc) shapes = parse_shapes(argv[++i]);
    else if (!std::strcmp(argv[i], "--heads") && i + 1 < argc) H = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--kv-heads") && i + 1 < argc) Hkv = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--head-dim") && i + 1 < argc) D = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--softcap") && i + 1 < argc) softcap = static_cast<float>(std::atof(argv[++i]));
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  DeviceContext ctx(Backend::kCuda, 0);
  ops::prepare(ctx);
  cudaStream_t s = static_cast<cudaStream_t>(ctx.compute().handle());
  bench::EventTimer timer(s);
  const AttentionScores scores{0.0f, softcap};
  std::printf("%s, H %lld, Hkv %lld, D %lld, causal; %d timed calls each\n",
              softcap > 0.0f ? "eager attention (soft-capped scores)" : "fused attention (cuDNN SDPA)",
              static_cast<long long>(H), static_cast<long long>(Hkv), static_cast<long long>(D), iters);
  std::printf("%-8s %-20s %9s %9s %9s %9s %9s\n", "shape", "backward", "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s",
              "f+b TF/s");
  for (const auto& [B, T] : shapes) {
    const int64_t nq = B * T * H * D, nkv = B * T * Hkv * D;
    uint16_t *q, *k, *v, *o, *dO, *dq, *dk, *dv;
    void* stats;
    for (auto [p, n] : {std::pair{&q, nq}, {&k, nkv}, {&v, nkv}, {&o, nq}, {&dO, nq}, {&dq, nq}, {&dk, nkv}, {&dv, nkv}})
      QS_CUDA_CHECK(cudaMalloc(p, static_cast<size_t>(n) * 2));
    QS_CUDA_CHECK(cudaMalloc(&stats, static_cast<size_t>(B * H * T) * 4));
    bench::fill_bf16(q, nq, 1, 1.0f, s);
    bench::fill_bf16(k, nkv, 2, 1.0f, s);
    bench::fill_bf16(v, nkv, 3, 1.0f, s);
    bench::fill_bf16(dO, nq, 4, 1.0f, s);
    const double fwd_flop = 2.0 * B * H * static_cast<double>(T) * T * D, bwd_flop = 2.5 * fwd_flop;
    for (bool det : {true, false}) {
      if (softcap > 0.0f && !det) break;  // the eager attention has one algorithm
      cuda::set_attention_deterministic(ctx, det);
      cuda::prepare_attention(ctx, B, T, H, Hkv, D, 0, 0, scores);
      // What ran: the deterministic backward may run in calls of fewer sequences, or (one sequence
      // past its workspace limit) fall back to the non-deterministic one.
      const cuda::AttentionBackwardPlan bp = cuda::attention_backward_plan(ctx, B, T, H, Hkv, D, 0, 0, scores);
      const std::string label = softcap > 0.0f    ? std::string("eager")
                                : !bp.deterministic ? std::string(det ? "non-det (fallback)" : "non-deterministic")
                                : bp.sequences_per_call < B
                                    ? "det, " + std::to_string(bp.sequences_per_call) + " seq a call"
                                    : std::string("deterministic");
      const double f = timer.mean_ms(
          iters, [&] { cuda::attention_fwd(o, stats, q, k, v, B, T, H, Hkv, D, ctx, 0, nullptr, scores); });
      const double bw = timer.mean_ms(iters, [&] {
        cuda::attention_bwd(dq, dk, dv, dO, q, k, v, o, stats, B, T, H, Hkv, D, ctx, 0, nullptr, scores);
      });
      std::printf("%lldx%-6lld %-20s %9.3f %9.1f %9.3f %9.1f %9.1f\n", static_cast<long long>(B),
                  static_cast<long long>(T), label.c_str(), f,
                  fwd_flop / f / 1e9, bw,
                  bwd_flop / bw / 1e9, (fwd_flop + bwd_flop) / (f + bw) / 1e9);
    }
    cuda::set_attention_deterministic(ctx, true);
    for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(o),
                    static_cast<void*>(dO), static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv),
                    stats})
      cudaFree(p);
  }
  return 0;
#endif
}
