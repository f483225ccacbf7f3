// bench/gemm: the base GEMMs of one Llama-3-8B decoder layer (the model's exact shapes and leading
// dimensions: q/k/v and gate/up widened by the LoRA fold) through cuBLASLt as ops::gemm calls it,
// beside the alternatives: the heuristic's first algorithm against the fastest of its first 16,
// q/k/v and gate/up fused into one GEMM, and the backward's dx = dy W with W stored transposed.
// bf16 in and out, f32 accumulation. TFLOP/s = 2 M N K / time.
// --sustain S: first S seconds of back-to-back GEMMs (the heuristic's first algorithm) for the
// square shape and the layer's largest ones, in windows of about 0.5 s: the first window is the
// burst rate a short measurement sees (qshard's MFU denominator: ten 8192^3 GEMMs, ~14 ms), the
// last the rate under sustained load, where a power-capped card has lowered its clock (a training
// step is seconds of such load).
// --sustain-algos K: the same for each of the heuristic's first K algorithms in turn, after a
// warm-up of the first (the card at its capped clock before any is timed) and the first once more
// at the end (the drift): which algorithm is fastest under the power cap, not in a burst.
// --sustain-fusion S: the backward's q/k/v input gradient as three GEMMs (q, then k and v adding into
// dx) against one fused GEMM (K = C + 2 KV), and the forward's three against one, each run back to
// back for S seconds, alternately twice, after a warm-up: the step's rate under the power cap.
// Usage: bench_gemm [--tokens N] [--iters N] [--sustain SECONDS] [--sustain-algos K] [--sustain-fusion S]
//                   [--json FILE]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda_check.h"

namespace {

#define LT_CHECK(x)                                                                        \
  do {                                                                                     \
    cublasStatus_t st_ = (x);                                                              \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                    \
      std::fprintf(stderr, "cuBLASLt error %d at %s:%d\n", int(st_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

__global__ void fill_kernel(__nv_bfloat16* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    x[i] = __float2bfloat16_rn((static_cast<float>(h & 0xffff) / 65535.0f - 0.5f) * 0.1f);
  }
}

// Row-major C[M,N] = op(A) op(B) (+ C), the ops::gemm convention: trans_b means B is stored [N,K].
struct Case {
  std::string name;
  int64_t M, N, K;
  bool trans_a, trans_b;
  int64_t lda, ldb, ldc;
  bool accumulate;
};

constexpr size_t kWorkspace = size_t{32} << 20;
cublasLtHandle_t g_lt;
void* g_ws;
cudaEvent_t g_e0, g_e1;

struct Result {
  double top1_ms = 0, best_ms = 0;
  int best_index = 0, algos = 0;
};

// A case's cuBLASLt description (cuBLASLt's A = our B, its B = our A) and its heuristic's first
// `want` algorithms (want <= 16).
struct LtCase {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulHeuristicResult_t heur[16];
  int found = 0;
  LtCase(const Case& c, int want) {
    LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (c.trans_b) LT_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, c.K, c.N, c.ldb));
    else LT_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, c.N, c.K, c.ldb));
    if (c.trans_a) LT_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, c.M, c.K, c.lda));
    else LT_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, c.K, c.M, c.lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, c.N, c.M, c.ldc));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace,
                                                  sizeof(kWorkspace)));
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(g_lt, op, la, lb, lc, lc, pref, want, heur, &found));
    cublasLtMatmulPreferenceDestroy(pref);
  }
  ~LtCase() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
  }
  LtCase(const LtCase&) = delete;
  LtCase& operator=(const LtCase&) = delete;
};

// Milliseconds of n back-to-back calls of launch() on the default stream (events around them).
template <typename F>
double time_launches(F&& launch, int n) {
  QS_CUDA_CHECK(cudaEventRecord(g_e0));
  for (int k = 0; k < n; ++k) launch();
  QS_CUDA_CHECK(cudaEventRecord(g_e1));
  QS_CUDA_CHECK(cudaEventSynchronize(g_e1));
  float ms = 0;
  QS_CUDA_CHECK(cudaEventElapsedTime(&ms, g_e0, g_e1));
  return static_cast<double>(ms);
}

cublasStatus_t matmul(const LtCase& lt, const Case& c, const cublasLtMatmulAlgo_t& algo, const void* A, const void* B,
                      void* C) {
  const float alpha = 1.0f, beta = c.accumulate ? 1.0f : 0.0f;
  return cublasLtMatmul(g_lt, lt.op, &alpha, B, lt.la, A, lt.lb, &beta, C, lt.lc, C, lt.lc, &algo, g_ws, kWorkspace,
                        nullptr);
}

Result run_case(const Case& c, const void* A, const void* B, void* C, int iters) {
  const LtCase lt(c, 16);
  Result r;
  r.algos = lt.found;
  for (int i = 0; i < lt.found; ++i) {
    auto launch = [&] { return matmul(lt, c, lt.heur[i].algo, A, B, C); };
    if (launch() != CUBLAS_STATUS_SUCCESS) continue;
    launch();
    const double per = time_launches(launch, iters) / iters;
    if (i == 0) r.top1_ms = per;
    if (r.best_ms == 0 || per < r.best_ms) {
      r.best_ms = per;
      r.best_index = i;
    }
  }
  return r;
}

// Back-to-back launches of the heuristic's algorithm `algo` (0: its first) for `seconds`, timed in
// windows of about 0.5 s (the launch count from a short first timing); TFLOP/s per window. Empty
// when the heuristic has no such algorithm or it refuses the problem.
std::vector<double> sustain_case(const Case& c, const void* A, const void* B, void* C, double seconds, int algo = 0) {
  const LtCase lt(c, algo + 1);
  std::vector<double> rates;
  if (lt.found <= algo) return rates;
  if (matmul(lt, c, lt.heur[algo].algo, A, B, C) != CUBLAS_STATUS_SUCCESS) return rates;
  auto launch = [&] { LT_CHECK(matmul(lt, c, lt.heur[algo].algo, A, B, C)); };
  launch();
  const double first_ms = time_launches(launch, 3) / 3;
  const int per_window = std::max(1, static_cast<int>(500.0 / std::max(first_ms, 1e-3)));
  const double flop = 2.0 * c.M * c.N * c.K * per_window;
  for (double spent = 0; spent < seconds * 1e3;) {
    const double ms = time_launches(launch, per_window);
    spent += ms;
    rates.push_back(flop / (ms * 1e-3) / 1e12);
  }
  return rates;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t T = 8192;
  int iters = 20;
  double sustain_s = 0;
  int sustain_algos = 1;
  double fusion_s = 0;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) T = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--sustain") && i + 1 < argc) sustain_s = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--sustain-algos") && i + 1 < argc) sustain_algos = std::clamp(std::atoi(argv[++i]), 1, 16);
    else if (!std::strcmp(argv[i], "--sustain-fusion") && i + 1 < argc) fusion_s = std::atof(argv[++i]);
  }
  LT_CHECK(cublasLtCreate(&g_lt));
  QS_CUDA_CHECK(cudaMalloc(&g_ws, kWorkspace));
  QS_CUDA_CHECK(cudaEventCreate(&g_e0));
  QS_CUDA_CHECK(cudaEventCreate(&g_e1));
  const int64_t C = 4096, F = 14336, KV = 1024, R1 = 48, R2 = 32;
  const int64_t big = std::max<int64_t>(T * (2 * F + 64), 8192LL * 8192);
  void *A, *B, *Cbuf;
  QS_CUDA_CHECK(cudaMalloc(&A, big * 2));
  QS_CUDA_CHECK(cudaMalloc(&B, big * 2));
  QS_CUDA_CHECK(cudaMalloc(&Cbuf, big * 2));
  fill_kernel<<<4096, 256>>>(static_cast<__nv_bfloat16*>(A), big, 1);
  fill_kernel<<<4096, 256>>>(static_cast<__nv_bfloat16*>(B), big, 2);
  fill_kernel<<<4096, 256>>>(static_cast<__nv_bfloat16*>(Cbuf), big, 3);
  QS_CUDA_CHECK(cudaDeviceSynchronize());
  const int64_t L1 = C + R1, L2 = C + R2;
  // Forward: y = x W_ext^T (TN). Backward: dx (+)= dy W (NN), or dy (W^T)^T with W^T stored (TN).
  std::vector<Case> cases = {
      {"square 8192^3", 8192, 8192, 8192, false, true, 8192, 8192, 8192, false},
      {"fwd q (folded)", T, C, L1, false, true, L1, L1, C, false},
      {"fwd k (folded)", T, KV, L1, false, true, L1, L1, KV, false},
      {"fwd v (folded)", T, KV, L1, false, true, L1, L1, KV, false},
      {"fwd qkv fused", T, C + 2 * KV, L1, false, true, L1, L1, C + 2 * KV, false},
      {"fwd o", T, C, C, false, true, C, C, C, false},
      {"fwd gate (folded)", T, F, L2, false, true, L2, L2, F, false},
      {"fwd up (folded)", T, F, L2, false, true, L2, L2, F, false},
      {"fwd gate_up fused", T, 2 * F, L2, false, true, L2, L2, 2 * F, false},
      {"fwd down", T, C, F, false, true, F, F, C, false},
      {"bwd q dx (NN)", T, C, C, false, false, C, L1, L1, false},
      {"bwd k dx (NN, +=)", T, C, KV, false, false, KV, L1, L1, true},
      {"bwd v dx (NN, +=)", T, C, KV, false, false, KV, L1, L1, true},
      {"bwd qkv fused dx (NN)", T, C, C + 2 * KV, false, false, C + 2 * KV, L1, L1, false},
      {"bwd qkv fused dx (W^T, TN)", T, C, C + 2 * KV, false, true, C + 2 * KV, C + 2 * KV, L1, false},
      {"bwd o dx (NN)", T, C, C, false, false, C, C, C, false},
      {"bwd o dx (W^T, TN)", T, C, C, false, true, C, C, C, false},
      {"bwd gate dx (NN)", T, C, F, false, false, F, L2, L2, false},
      {"bwd up dx (NN, +=)", T, C, F, false, false, F, L2, L2, true},
      {"bwd gate_up fused dx (NN)", T, C, 2 * F, false, false, 2 * F, L2, L2, false},
      {"bwd gate_up fused dx (W^T, TN)", T, C, 2 * F, false, true, 2 * F, 2 * F, L2, false},
      {"bwd down dx (NN)", T, F, C, false, false, C, F, F, false},
      {"bwd down dx (W^T, TN)", T, F, C, false, true, C, C, F, false},
      {"bwd q dx (NN, packed ld)", T, C, C, false, false, C, C, C, false},
      {"bwd gate dx (NN, packed ld)", T, C, F, false, false, F, C, C, false},
  };
  cudaDeviceProp prop{};
  QS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, tokens %lld, iters %d\n", prop.name, (long long)T, iters);
  std::printf("| GEMM | M x N x K | heuristic #1 TFLOP/s | best of %s TFLOP/s (index) | algos |\n|---|---|---|---|---|\n",
              "16");
  std::string json = "{\"device\": \"" + std::string(prop.name) + "\", \"tokens\": " + std::to_string(T) + ", \"cases\": [";
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const Result r = run_case(c, A, B, Cbuf, iters);
    const double flop = 2.0 * c.M * c.N * c.K;
    const double t1 = flop / (r.top1_ms * 1e-3) / 1e12, tb = flop / (r.best_ms * 1e-3) / 1e12;
    std::printf("| %s | %lld x %lld x %lld | %.0f (%.3f ms) | %.0f (%d) | %d |\n", c.name.c_str(), (long long)c.M,
                (long long)c.N, (long long)c.K, t1, r.top1_ms, tb, r.best_index, r.algos);
    json += std::string(i ? ", " : "") + "{\"name\": \"" + c.name + "\", \"M\": " + std::to_string(c.M) +
            ", \"N\": " + std::to_string(c.N) + ", \"K\": " + std::to_string(c.K) +
            ", \"top1_ms\": " + std::to_string(r.top1_ms) + ", \"best_ms\": " + std::to_string(r.best_ms) +
            ", \"best_index\": " + std::to_string(r.best_index) + "}";
  }
  json += "]";
  if (sustain_s > 0) {
    // The square shape and the layer's two largest GEMMs (gate|up forward, folded; down forward).
    std::printf("\nsustained (%.0f s each, windows of ~0.5 s): TFLOP/s first window / median / last window\n",
                sustain_s);
    json += ", \"sustained\": [";
    bool first_case = true;
    for (const char* name : {"square 8192^3", "fwd gate_up fused", "fwd down"}) {
      for (const Case& c : cases) {
        if (c.name != name) continue;
        std::vector<double> w = sustain_case(c, A, B, Cbuf, sustain_s);
        if (w.empty()) continue;
        std::vector<double> sorted = w;
        std::sort(sorted.begin(), sorted.end());
        std::printf("| %s | %.0f | %.0f | %.0f | %zu windows |\n", name, w.front(), sorted[sorted.size() / 2], w.back(),
                    w.size());
        json += std::string(first_case ? "" : ", ") + "{\"name\": \"" + c.name + "\", \"windows_tflops\": [";
        for (size_t k = 0; k < w.size(); ++k) json += (k ? ", " : "") + std::to_string(w[k]);
        json += "]}";
        first_case = false;
      }
    }
    json += "]";
  }
  if (sustain_s > 0 && sustain_algos > 1) {
    // Each of the first K algorithms under sustained load: the first warms the card up (untimed
    // in the comparison), then each in turn, then the first again (the drift between).
    std::printf("\nsustained per algorithm (%.0f s each after a warm-up): median TFLOP/s\n", sustain_s);
    json += ", \"sustained_algos\": [";
    bool first_case = true;
    for (const char* name : {"fwd gate_up fused", "fwd down", "bwd gate_up fused dx (NN)", "bwd down dx (NN)"}) {
      for (const Case& c : cases) {
        if (c.name != name) continue;
        auto median = [](std::vector<double> w) {
          std::sort(w.begin(), w.end());
          return w.empty() ? 0.0 : w[w.size() / 2];
        };
        sustain_case(c, A, B, Cbuf, sustain_s);  // warm-up
        std::printf("| %s |", name);
        json += std::string(first_case ? "" : ", ") + "{\"name\": \"" + c.name + "\", \"median_tflops\": [";
        for (int k = 0; k <= sustain_algos; ++k) {
          const int algo = k < sustain_algos ? k : 0;  // the last: the first again
          const double m = median(sustain_case(c, A, B, Cbuf, sustain_s, algo));
          std::printf(" %s%d: %.0f |", k < sustain_algos ? "" : "again ", algo, m);
          json += (k ? ", " : "") + std::to_string(m);
        }
        std::printf("\n");
        json += "]}";
        first_case = false;
      }
    }
    json += "]";
  }
  if (fusion_s > 0) {
    // Separate against fused, each a group of GEMMs launched back to back for fusion_s seconds: ms
    // a group (median of ~0.5 s windows), alternately twice after a warm-up.
    struct Group {
      const char* name;
      std::vector<const char*> parts;
    };
    const std::vector<Group> groups = {
        {"bwd q/k/v dx: q, k +=, v +=", {"bwd q dx (NN)", "bwd k dx (NN, +=)", "bwd v dx (NN, +=)"}},
        {"bwd q/k/v dx: fused (K = C + 2 KV)", {"bwd qkv fused dx (NN)"}},
        {"fwd q/k/v: three GEMMs", {"fwd q (folded)", "fwd k (folded)", "fwd v (folded)"}},
        {"fwd q/k/v: fused (N = C + 2 KV)", {"fwd qkv fused"}},
    };
    auto find = [&](const char* n) -> const Case& {
      for (const Case& c : cases)
        if (c.name == n) return c;
      std::fprintf(stderr, "no case %s\n", n);
      std::exit(1);
    };
    auto group_ms = [&](const Group& g, double seconds) {
      std::vector<std::unique_ptr<LtCase>> lts;
      for (const char* n : g.parts) lts.push_back(std::make_unique<LtCase>(find(n), 1));
      auto launch = [&] {
        for (size_t k = 0; k < lts.size(); ++k) LT_CHECK(matmul(*lts[k], find(g.parts[k]), lts[k]->heur[0].algo, A, B, Cbuf));
      };
      launch();
      const double first = time_launches(launch, 3) / 3;
      const int per_window = std::max(1, static_cast<int>(500.0 / std::max(first, 1e-3)));
      std::vector<double> ms;
      for (double spent = 0; spent < seconds * 1e3;) {
        const double w = time_launches(launch, per_window);
        spent += w;
        ms.push_back(w / per_window);
      }
      std::sort(ms.begin(), ms.end());
      return ms[ms.size() / 2];
    };
    std::printf("\nsustained fusion (%.0f s each, alternately; ms a group, median of ~0.5 s windows)\n", fusion_s);
    group_ms(groups[0], fusion_s);  // warm-up: the card at its capped clock
    json += ", \"sustained_fusion\": [";
    for (int round = 0; round < 2; ++round) {
      for (size_t gi = 0; gi < groups.size(); ++gi) {
        const double m = group_ms(groups[gi], fusion_s);
        std::printf("| round %d | %s | %.4f ms |\n", round + 1, groups[gi].name, m);
        json += std::string(round == 0 && gi == 0 ? "" : ", ") + "{\"name\": \"" + groups[gi].name +
                "\", \"round\": " + std::to_string(round + 1) + ", \"ms\": " + std::to_string(m) + "}";
      }
    }
    json += "]";
  }
  json += "}\n";
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f) {
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
  }
  return 0;
}
