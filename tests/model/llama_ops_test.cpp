// The CPU ops of llama_ops.h: every backward against central finite differences of its forward,
// GEMM against a double oracle, dropout determinism and the RoPE / cross-entropy details.
//
// Tolerance (all ops): |fd - analytic| <= kTol * max(1, max|analytic|), fd with step kEps in fp32.
// Reason: the forward runs in fp32, so each objective value carries a rounding error of about
// 1e-7 relative; divided by the 2 * 1e-2 step that is ~1e-5 of the gradient scale, and the
// truncation error of central differences is O(eps^2 * f''') ~ 1e-4 for these O(1) inputs.
// 2e-3 leaves a margin of ~10x over the worst error seen while keeping real bugs (a missing
// term, a wrong sign or factor) far outside it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "model/llama_ops.h"
#include "model_test_util.h"

namespace qshard {
namespace {

using test::check_grad;
using test::dot;
using test::random_vec;

constexpr float kEps = 1e-2f;
constexpr double kTol = 2e-3;

// The CPU context the ops run in, with a workspace for their scratch.
DeviceContext& ctx() {
  static DeviceContext c(Backend::kCpu, -1);
  static const bool reserved = (c.workspace().reserve(1 << 20), true);
  (void)reserved;
  return c;
}

TEST(LlamaOps, EmbeddingGathersRowsAndRejectsBadIds) {
  const int64_t V = 5, C = 3;
  const std::vector<float> w = random_vec(V * C, 1);
  const std::vector<int64_t> ids = {4, 0, 4};
  std::vector<float> out(ids.size() * C);
  cpu::embedding_fwd(out.data(), ids.data(), w.data(), DType::kF32, 3, C, V, ctx());
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out[n * C + c], w[ids[n] * C + c]);
  const std::vector<int64_t> bad = {5};
  EXPECT_THROW(cpu::embedding_fwd(out.data(), bad.data(), w.data(), DType::kF32, 1, C, V, ctx()), InputError);
}

TEST(LlamaOps, RmsNormBackward) {
  const int64_t N = 3, C = 8;
  const float eps = 1e-5f;
  std::vector<float> x = random_vec(N * C, 2);
  std::vector<float> weight = random_vec(C, 3);
  for (float& w : weight) w += 1.0f;
  const std::vector<float> wout = random_vec(N * C, 4);
  std::vector<float> out(N * C), rstd(N);
  auto f = [&] {
    cpu::rmsnorm_fwd(out.data(), rstd.data(), x.data(), weight.data(), N, C, eps, ctx());
    return dot(wout, out.data(), out.size());
  };
  f();
  // HF formula spot check: out = w * (x * rsqrt(mean(x^2) + eps)).
  double ss = 0;
  for (int64_t c = 0; c < C; ++c) ss += double(x[c]) * x[c];
  EXPECT_NEAR(out[1], weight[1] * x[1] / std::sqrt(ss / C + eps), 1e-6);
  std::vector<float> dx(N * C, 0.0f);
  cpu::rmsnorm_bwd(dx.data(), wout.data(), x.data(), weight.data(), rstd.data(), N, C, ctx());
  check_grad("rmsnorm dx", x.data(), x.size(), dx, f, kEps, kTol);
}

TEST(LlamaOps, RopeForwardIsARotationAndBackwardItsTranspose) {
  RopeParams c;
  c.head_dim = 8;
  c.theta = 10000.0;
  const int64_t B = 2, T = 5, nh = 3, D = 8;
  std::vector<float> cs(T * D / 2), sn(T * D / 2);
  cpu::rope_tables(cs.data(), sn.data(), c, T, ctx());
  std::vector<float> x = random_vec(B * T * nh * D, 5);
  const std::vector<float> wout = random_vec(x.size(), 6);
  std::vector<float> y(x.size());
  auto f = [&] {
    y = x;
    cpu::rope_fwd(y.data(), cs.data(), sn.data(), B, T, nh, D, ctx());
    return dot(wout, y.data(), y.size());
  };
  f();
  // Position 0 is the identity; HF pairing: element i rotates with element i + D/2.
  for (int64_t i = 0; i < D; ++i) EXPECT_EQ(y[i], x[i]);
  const float* x1 = &x[(0 * T + 1) * nh * D];  // b 0, t 1, head 0
  const float* y1 = &y[(0 * T + 1) * nh * D];
  EXPECT_NEAR(y1[0], x1[0] * std::cos(1.0f) - x1[4] * std::sin(1.0f), 1e-6);
  EXPECT_NEAR(y1[4], x1[4] * std::cos(1.0f) + x1[0] * std::sin(1.0f), 1e-6);
  std::vector<float> dx = wout;
  cpu::rope_bwd(dx.data(), cs.data(), sn.data(), B, T, nh, D, ctx());
  check_grad("rope dx", x.data(), x.size(), dx, f, kEps, kTol);
  // bwd(fwd(x)) == x (rotation by -angle undoes +angle) up to rounding.
  f();
  std::vector<float> back = y;
  cpu::rope_bwd(back.data(), cs.data(), sn.data(), B, T, nh, D, ctx());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-5);
}

TEST(LlamaOps, RopeLlama3InvFreqBands) {
  // transformers' _compute_llama3_parameters with theta 10000, D 16, factor 8, low 1, high 4, old
  // context 32: wavelen 2pi/f; < 8 unchanged, > 32 divided by 8, in between interpolated.
  RopeParams c;
  c.head_dim = 16;
  c.theta = 10000.0;
  c.llama3 = true;
  c.factor = 8.0;
  c.low_freq_factor = 1.0;
  c.high_freq_factor = 4.0;
  c.original_max_position_embeddings = 32;
  const std::vector<float> inv = rope_inv_freq(c);
  ASSERT_EQ(inv.size(), 8u);
  for (size_t i = 0; i < inv.size(); ++i) {
    const double f = 1.0 / std::pow(10000.0, 2.0 * i / 16.0);
    const double wl = 2 * M_PI / f;
    double want = f;
    if (wl > 32) want = f / 8;
    else if (wl >= 8) {
      const double s = (32 / wl - 1) / (4 - 1);
      want = (1 - s) * f / 8 + s * f;
    }
    std::printf("  inv_freq[%zu] %.8e (want %.8e, wavelen %.1f)\n", i, inv[i], want, wl);
    EXPECT_NEAR(inv[i], want, 1e-6 * want);
  }
}

// window: a sliding window (0: none); scores: Gemma's scale and soft-cap (default: 1 / sqrt(D)).
void attention_case(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, uint32_t seed, int64_t window = 0,
                    AttentionScores scores = {}) {
  std::vector<float> q = random_vec(B * T * H * D, seed), k = random_vec(B * T * Hkv * D, seed + 1),
                     v = random_vec(B * T * Hkv * D, seed + 2);
  const std::vector<float> wout = random_vec(B * T * H * D, seed + 3);
  std::vector<float> out(B * T * H * D), att(B * H * T * T);
  auto f = [&] {
    cpu::attention_fwd(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, H, Hkv, D, ctx(), window, nullptr,
                       scores);
    return dot(wout, out.data(), out.size());
  };
  f();
  // Causality: row t has zeros above the diagonal and sums to 1.
  for (int64_t t = 0; t < T; ++t) {
    double s = 0;
    for (int64_t u = 0; u < T; ++u) {
      s += att[t * T + u];
      if (u > t) {
        EXPECT_EQ(att[t * T + u], 0.0f);
      }
    }
    EXPECT_NEAR(s, 1.0, 1e-6);
  }
  EXPECT_EQ(attention_saved_bytes(Backend::kCpu, B, T, H, Hkv, D), att.size() * sizeof(float));
  std::vector<float> dq(q.size(), 7.0f), dk(k.size(), 7.0f), dv(v.size(), 7.0f);  // overwritten
  cpu::attention_bwd(dq.data(), dk.data(), dv.data(), wout.data(), q.data(), k.data(), v.data(), out.data(),
                     att.data(), B, T, H, Hkv, D, ctx(), window, nullptr, scores);
  check_grad("attention dq", q.data(), q.size(), dq, f, kEps, kTol);
  check_grad("attention dk", k.data(), k.size(), dk, f, kEps, kTol);
  check_grad("attention dv", v.data(), v.size(), dv, f, kEps, kTol);
}

TEST(LlamaOps, AttentionBackwardMultiHead) { attention_case(2, 5, 2, 2, 4, 10); }
TEST(LlamaOps, AttentionBackwardGroupedQuery) { attention_case(2, 5, 4, 2, 4, 20); }
TEST(LlamaOps, AttentionBackwardMultiQuery) { attention_case(1, 6, 3, 1, 4, 30); }
// Gemma's scores: scale 0.7 (not 1 / sqrt(4)) and a soft-cap of 1.5, which bends the scores (of
// about 1.4 here) well into tanh's curve; then with a sliding window of 3.
TEST(LlamaOps, AttentionBackwardSoftcapAndScale) { attention_case(2, 5, 4, 2, 4, 40, 0, {0.7f, 1.5f}); }
TEST(LlamaOps, AttentionBackwardSoftcapWindow) { attention_case(1, 6, 2, 1, 4, 50, 3, {0.7f, 1.5f}); }

// The gated MLP's backward, SwiGLU's silu and GeGLU's tanh gelu: dgate and dup against central
// differences of h = act(gate) * up (gates of scale 1.5: both curves' bends and tails).
TEST(LlamaOps, GatedActivationBackward) {
  for (const GatedAct act : {GatedAct::kSilu, GatedAct::kGeluTanh}) {
    const char* name = act == GatedAct::kSilu ? "swiglu" : "geglu";
    const int64_t n = 24;
    std::vector<float> gate = random_vec(n, 60, 1.5f), up = random_vec(n, 61);
    const std::vector<float> wout = random_vec(n, 62);
    std::vector<float> h(n);
    auto f = [&] {
      cpu::swiglu_fwd(h.data(), gate.data(), up.data(), n, ctx(), act);
      return dot(wout, h.data(), h.size());
    };
    f();
    if (act == GatedAct::kGeluTanh) {  // transformers' gelu_pytorch_tanh at one point
      const double g = gate[0], th = std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g));
      EXPECT_NEAR(h[0], 0.5 * g * (1.0 + th) * up[0], 1e-6 * std::max(1.0, std::fabs(double(h[0]))));
    }
    std::vector<float> dgate(n, 7.0f), dup(n, 7.0f);  // overwritten
    cpu::swiglu_bwd(dgate.data(), dup.data(), wout.data(), gate.data(), up.data(), n, ctx(), act);
    check_grad(std::string(name) + " dgate", gate.data(), n, dgate, f, kEps, kTol);
    check_grad(std::string(name) + " dup", up.data(), n, dup, f, kEps, kTol);
  }
}

// Packed data's pieces in cuDNN's ragged layout: the lengths, then the offsets of q/out, k/v, the
// statistics rows and the gradients side by side (rows ld_dqkv wide), in elements; the unused
// entries length 0 at the end of the rows; more pieces than the graphs hold, or offsets past
// int32, are refused.
TEST(LlamaOps, RaggedLayoutOfPackedPieces) {
  const std::vector<int64_t> pos = {0, 1, 2, 0, 0, 1, 0, 1, 2, 3};  // pieces of 3, 1, 2, 4 rows
  const int64_t H = 4, Hkv = 2, D = 8, P = 6;
  std::vector<int32_t> r(static_cast<size_t>(ragged_layout_ints(P)), -1);
  EXPECT_EQ(4, ragged_layout(r.data(), pos.data(), 10, P, H, Hkv, D, (H + 2 * Hkv) * D));
  const std::vector<int32_t> len(r.begin(), r.begin() + P), q(r.begin() + P, r.begin() + 2 * P + 1),
      kv(r.begin() + 2 * P + 1, r.begin() + 3 * P + 2), stats(r.begin() + 3 * P + 2, r.begin() + 4 * P + 3),
      grads(r.begin() + 4 * P + 3, r.end());
  EXPECT_EQ((std::vector<int32_t>{3, 1, 2, 4, 0, 0}), len);
  EXPECT_EQ((std::vector<int32_t>{0, 96, 128, 192, 320, 320, 320}), q);      // rows 0 3 4 6 10 x H*D
  EXPECT_EQ((std::vector<int32_t>{0, 48, 64, 96, 160, 160, 160}), kv);       // x Hkv*D
  EXPECT_EQ((std::vector<int32_t>{0, 12, 16, 24, 40, 40, 40}), stats);       // x H
  EXPECT_EQ((std::vector<int32_t>{0, 192, 256, 384, 640, 640, 640}), grads);  // x (H + 2 Hkv) D
  EXPECT_THROW(ragged_layout(r.data(), pos.data(), 10, P, H, Hkv, D, int64_t{1} << 29), Error);
  EXPECT_THROW(ragged_layout(r.data(), pos.data(), 10, 3, H, Hkv, D), Error);
  const std::vector<int64_t> bad = {1, 2};
  EXPECT_THROW(ragged_layout(r.data(), bad.data(), 2, P, H, Hkv, D), Error);
}

TEST(LlamaOps, LoraScaling) {
  EXPECT_EQ(lora_scaling(8.0, 4, false), 2.0f);
  EXPECT_EQ(lora_scaling(8.0, 4, true), 4.0f);
  EXPECT_EQ(lora_scaling(8.0, 0, false), 0.0f);
}

// GEMM in every transpose combination, with alpha/beta and a bf16 B, against a double oracle.
// Tolerance: f32 accumulation over K <= 37 terms of O(1) products: ~K * 6e-8 relative; 1e-5 of
// the output scale leaves margin while a wrong index or transpose is off by O(1).
TEST(LlamaOps, GemmMatchesDoubleOracleInEveryLayout) {
  const int64_t M = 5, N = 7, K = 37;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (DType bt : {DType::kF32, DType::kBF16}) {
        const std::vector<float> A = random_vec(M * K, 200 + ta), Bf = random_vec(K * N, 210 + tb);
        std::vector<uint16_t> Bh(Bf.size());
        std::vector<float> Bv(Bf.size());
        for (size_t i = 0; i < Bf.size(); ++i) {
          Bh[i] = f32_to_bf16(Bf[i]);
          Bv[i] = bt == DType::kBF16 ? bf16_to_f32(Bh[i]) : Bf[i];
        }
        std::vector<float> C = random_vec(M * N, 220), C0 = C;
        GemmShape s{M, N, K, ta == 1, tb == 1, 0.5f, 2.0f};
        s.b_type = bt;
        const void* Bp = bt == DType::kBF16 ? static_cast<const void*>(Bh.data()) : Bf.data();
        cpu::gemm(C.data(), A.data(), Bp, s, ctx());
        double worst = 0;
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            double acc = 0;
            for (int64_t k = 0; k < K; ++k) {
              const double a = ta ? A[k * M + m] : A[m * K + k];
              const double b = tb ? Bv[n * K + k] : Bv[k * N + n];
              acc += a * b;
            }
            const double want = 0.5 * acc + 2.0 * C0[m * N + n];
            worst = std::max(worst, std::fabs(want - C[m * N + n]));
          }
        std::printf("  gemm ta=%d tb=%d b=%s: max |diff| %.3e\n", ta, tb, dtype_torch_name(bt), worst);
        EXPECT_LE(worst, 1e-5 * K);
      }
  EXPECT_EQ(ctx().workspace().used(), 0u) << "gemm gives its scratch back";
}

TEST(LlamaOps, CrossEntropyBackwardAndIgnoreIndex) {
  const int64_t N = 5, V = 7;
  std::vector<float> logits = random_vec(N * V, 90, 2.0f);
  const std::vector<int64_t> targets = {3, kIgnoreIndex, 0, 6, kIgnoreIndex};
  const double normalizer = 7.0;  // as if other ranks held more tokens
  const float scale = static_cast<float>(1.0 / normalizer);
  std::vector<float> dlogits = logits;
  double loss_sum = 0.25;  // accumulates onto what is there
  cpu::cross_entropy_fwd_bwd(dlogits.data(), &loss_sum, targets.data(), N, V, scale, ctx());
  double want = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == kIgnoreIndex) continue;
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(double(logits[n * V + v]));
    want += std::log(s) - logits[n * V + targets[n]];
  }
  EXPECT_NEAR(loss_sum, 0.25 + want, 1e-5);
  for (int64_t v = 0; v < V; ++v) EXPECT_EQ(dlogits[1 * V + v], 0.0f);
  auto f = [&] {
    std::vector<float> l = logits;
    double sum = 0;
    cpu::cross_entropy_fwd_bwd(l.data(), &sum, targets.data(), N, V, 0.0f, ctx());
    EXPECT_EQ(l, logits) << "grad_scale 0 leaves the logits alone";
    return sum / normalizer;
  };
  check_grad("cross entropy dlogits", logits.data(), logits.size(), dlogits, f, kEps, kTol);
  const std::vector<int64_t> bad = {7};
  double sum = 0;
  EXPECT_THROW(cpu::cross_entropy_fwd_bwd(logits.data(), &sum, bad.data(), 1, V, 0.0f, ctx()), InputError);
}

// Gemma 2's final soft-cap: the loss of logit_softcap's logits, and cross entropy's gradient given
// the capped logits and the cap, against central differences in the RAW logits (cap 2.5 bends
// logits of scale 2).
TEST(LlamaOps, CrossEntropyThroughLogitSoftcap) {
  const int64_t N = 4, V = 7;
  const float cap = 2.5f;
  std::vector<float> logits = random_vec(N * V, 95, 2.0f);
  const std::vector<int64_t> targets = {2, 6, kIgnoreIndex, 0};
  const double normalizer = 3.0;
  const float scale = static_cast<float>(1.0 / normalizer);
  std::vector<float> dlogits = logits;
  cpu::logit_softcap(dlogits.data(), N * V, cap, ctx());
  for (int64_t i = 0; i < N * V; ++i) EXPECT_NEAR(dlogits[i], cap * std::tanh(logits[i] / cap), 1e-6);
  double loss_sum = 0;
  cpu::cross_entropy_fwd_bwd(dlogits.data(), &loss_sum, targets.data(), N, V, scale, ctx(), cap);
  auto f = [&] {
    std::vector<float> l = logits;
    cpu::logit_softcap(l.data(), N * V, cap, ctx());
    double sum = 0;
    cpu::cross_entropy_fwd_bwd(l.data(), &sum, targets.data(), N, V, 0.0f, ctx(), cap);
    return sum / normalizer;
  };
  double want = 0;  // the loss of the capped logits, in double
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == kIgnoreIndex) continue;
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(cap * std::tanh(double(logits[n * V + v]) / cap));
    want += std::log(s) - cap * std::tanh(double(logits[n * V + targets[n]]) / cap);
  }
  EXPECT_NEAR(loss_sum, want, 1e-5);
  check_grad("cross entropy through logit_softcap dlogits", logits.data(), logits.size(), dlogits, f, kEps, kTol);
}

TEST(LlamaOps, ShiftLabelsLikeTransformers) {
  const std::vector<int64_t> labels = {1, 2, 3, -100, 5, 6};
  EXPECT_EQ(shift_labels(labels.data(), 2, 3), (std::vector<int64_t>{2, 3, -100, 5, 6, -100}));
}

TEST(LlamaOps, DropoutIsDeterministicAndIndependentOfTheSplit) {
  const int64_t N = 8, W = 64;
  const std::vector<float> x = random_vec(N * W, 100);
  DropoutKey key{0.25f, 42, 3, 5, 16};
  std::vector<float> a(N * W), b(N * W), c(N * W);
  cpu::dropout_fwd(a.data(), x.data(), key, N, W, ctx());
  cpu::dropout_fwd(b.data(), x.data(), key, N, W, ctx());
  EXPECT_EQ(a, b) << "same key, same mask";
  // Two ranks with 4 rows each (row offsets 16 and 20) give the same mask as one rank with 8.
  DropoutKey k0 = key, k1 = key;
  k1.row_offset = key.row_offset + 4;
  cpu::dropout_fwd(c.data(), x.data(), k0, 4, W, ctx());
  cpu::dropout_fwd(c.data() + 4 * W, x.data() + 4 * W, k1, 4, W, ctx());
  EXPECT_EQ(a, c) << "mask depends on the global row, not the split";
  int64_t kept = 0;
  for (int64_t i = 0; i < N * W; ++i) {
    if (a[i] != 0.0f) {
      ++kept;
      EXPECT_EQ(a[i], x[i] * (1.0f / 0.75f));
    }
  }
  std::printf("  kept %lld of %lld (p = 0.25)\n", static_cast<long long>(kept), static_cast<long long>(N * W));
  EXPECT_NEAR(double(kept) / (N * W), 0.75, 0.06);
  DropoutKey other = key;
  other.step = 4;
  cpu::dropout_fwd(b.data(), x.data(), other, N, W, ctx());
  EXPECT_NE(a, b) << "another step, another mask";
  other = key;
  other.module_id = 6;
  cpu::dropout_fwd(b.data(), x.data(), other, N, W, ctx());
  EXPECT_NE(a, b) << "another module, another mask";
}

TEST(LlamaOps, DropoutZeroIsExactIdentity) {
  const int64_t N = 4, W = 16;
  const std::vector<float> x = random_vec(N * W, 110);
  std::vector<float> y(N * W);
  cpu::dropout_fwd(y.data(), x.data(), DropoutKey{0.0f, 1, 2, 3, 4}, N, W, ctx());
  EXPECT_EQ(y, x);
}

// The eager attention's workspace (CUDA, Gemma 2): the layout of T chunks its rows within the
// chunk bytes (whole when they fit, else a multiple of 64, at least 64), and its bound (what
// prepare_attention allocates for T) holds the layout of every shorter sequence, so that a step
// of a shorter sequence never allocates; at Gemma-2-9B's kv heads (8 x 256) and lengths past the
// point where chunks begin.
TEST(LlamaOps, EagerAttentionWorkspaceHoldsShorterSequences) {
  for (const int64_t T : {int64_t{67}, int64_t{2048}, int64_t{5000}, int64_t{8192}, int64_t{20000}}) {
    const EagerAttentionLayout top = eager_attention_layout(T, 8, 256);
    EXPECT_GE(top.bound, top.total());
    EXPECT_EQ(top.rows, T * 8 * ((T + 7) / 8 * 8) * 10 <= kEagerAttentionChunkBytes ? T : top.rows) << T;
    EXPECT_TRUE(top.rows == T || top.rows % 64 == 0) << T << " rows " << top.rows;
    EXPECT_LE(2 * top.scores_bytes + top.probs_bytes, static_cast<size_t>(kEagerAttentionChunkBytes) + 768) << T;
    for (int64_t t = 1; t <= T; t += std::max<int64_t>(1, T / 997))
      ASSERT_LE(eager_attention_layout(t, 8, 256).total(), top.bound) << "T " << T << " t " << t;
  }
  // A chunk of 64 rows past the chunk bytes (the smallest chunk).
  EXPECT_EQ(eager_attention_layout(200, 2, 64, /*chunk_bytes=*/1).rows, 64);
}

}  // namespace
}  // namespace qshard
