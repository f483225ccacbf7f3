// Every backward of llama_layers.h against central finite differences of its forward, plus
// dropout determinism and the RoPE / cross-entropy details.
//
// Tolerance (all ops): |fd - analytic| <= kTol * max(1, max|analytic|), fd with step kEps in fp32.
// Reason: the forward runs in fp32, so each objective value carries a rounding error of about
// 1e-7 relative; divided by the 2 * 1e-2 step that is ~1e-5 of the gradient scale, and the
// truncation error of central differences is O(eps^2 * f''') ~ 1e-4 for these O(1) inputs.
// 2e-3 leaves a margin of ~10x over the worst error seen while keeping real bugs (a missing
// term, a wrong sign or factor) far outside it.
#include <gtest/gtest.h>

#include <cmath>

#include "model/llama_layers.h"
#include "model_test_util.h"

namespace qshard {
namespace {

using test::check_grad;
using test::dot;
using test::random_vec;

constexpr float kEps = 1e-2f;
constexpr double kTol = 2e-3;

TEST(LlamaLayers, EmbeddingGathersRowsAndRejectsBadIds) {
  const int64_t V = 5, C = 3;
  const std::vector<float> w = random_vec(V * C, 1);
  const std::vector<int64_t> ids = {4, 0, 4};
  std::vector<float> out(ids.size() * C);
  embedding_fwd(out.data(), ids.data(), w.data(), 3, C, V);
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out[n * C + c], w[ids[n] * C + c]);
  const std::vector<int64_t> bad = {5};
  EXPECT_THROW(embedding_fwd(out.data(), bad.data(), w.data(), 1, C, V), InputError);
}

TEST(LlamaLayers, RmsNormBackward) {
  const int64_t N = 3, C = 8;
  const float eps = 1e-5f;
  std::vector<float> x = random_vec(N * C, 2);
  std::vector<float> weight = random_vec(C, 3);
  for (float& w : weight) w += 1.0f;
  const std::vector<float> wout = random_vec(N * C, 4);
  std::vector<float> out(N * C), rstd(N);
  auto f = [&] {
    rmsnorm_fwd(out.data(), rstd.data(), x.data(), weight.data(), N, C, eps);
    return dot(wout, out.data(), out.size());
  };
  f();
  // HF formula spot check: out = w * (x * rsqrt(mean(x^2) + eps)).
  double ss = 0;
  for (int64_t c = 0; c < C; ++c) ss += double(x[c]) * x[c];
  EXPECT_NEAR(out[1], weight[1] * x[1] / std::sqrt(ss / C + eps), 1e-6);
  std::vector<float> dx(N * C, 0.0f);
  rmsnorm_bwd(dx.data(), wout.data(), x.data(), weight.data(), N, C, eps);
  check_grad("rmsnorm dx", x.data(), x.size(), dx, f, kEps, kTol);
}

TEST(LlamaLayers, RopeForwardIsARotationAndBackwardItsTranspose) {
  LlamaConfig c;
  c.head_dim = 8;
  c.rope_theta = 10000.0;
  const int64_t B = 2, T = 5, nh = 3, D = 8;
  const RopeTables rope = rope_tables(rope_inv_freq(c), T);
  std::vector<float> x = random_vec(B * T * nh * D, 5);
  const std::vector<float> wout = random_vec(x.size(), 6);
  std::vector<float> y(x.size());
  auto f = [&] {
    y = x;
    rope_fwd(y.data(), rope, B, T, nh, D);
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
  rope_bwd(dx.data(), rope, B, T, nh, D);
  check_grad("rope dx", x.data(), x.size(), dx, f, kEps, kTol);
  // bwd(fwd(x)) == x (rotation by -angle undoes +angle) up to rounding.
  f();
  std::vector<float> back = y;
  rope_bwd(back.data(), rope, B, T, nh, D);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-5);
}

TEST(LlamaLayers, RopeLlama3InvFreqBands) {
  // transformers' _compute_llama3_parameters with theta 10000, D 16, factor 8, low 1, high 4, old
  // context 32: wavelen 2pi/f; < 8 unchanged, > 32 divided by 8, in between interpolated.
  LlamaConfig c;
  c.head_dim = 16;
  c.rope_theta = 10000.0;
  c.rope_scaling.rope_type = "llama3";
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 32;
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

void attention_case(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, uint32_t seed) {
  std::vector<float> q = random_vec(B * T * H * D, seed), k = random_vec(B * T * Hkv * D, seed + 1),
                     v = random_vec(B * T * Hkv * D, seed + 2);
  const std::vector<float> wout = random_vec(B * T * H * D, seed + 3);
  std::vector<float> out(B * T * H * D), att(B * H * T * T);
  auto f = [&] {
    attention_fwd(out.data(), att.data(), q.data(), k.data(), v.data(), B, T, H, Hkv, D);
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
  std::vector<float> dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
  attention_bwd(dq.data(), dk.data(), dv.data(), wout.data(), q.data(), k.data(), v.data(), att.data(), B, T, H, Hkv,
                D);
  check_grad("attention dq", q.data(), q.size(), dq, f, kEps, kTol);
  check_grad("attention dk", k.data(), k.size(), dk, f, kEps, kTol);
  check_grad("attention dv", v.data(), v.size(), dv, f, kEps, kTol);
}

TEST(LlamaLayers, AttentionBackwardMultiHead) { attention_case(2, 5, 2, 2, 4, 10); }
TEST(LlamaLayers, AttentionBackwardGroupedQuery) { attention_case(2, 5, 4, 2, 4, 20); }
TEST(LlamaLayers, AttentionBackwardMultiQuery) { attention_case(1, 6, 3, 1, 4, 30); }

struct LoraFixture {
  int64_t N, in, out, r;
  std::vector<float> x, w, bias, A, B;
  LoraLinearParams p;
  LoraFixture(int64_t N_, int64_t in_, int64_t out_, int64_t r_, uint32_t seed, float dropout, bool with_bias)
      : N(N_), in(in_), out(out_), r(r_) {
    x = random_vec(N * in, seed);
    w = random_vec(out * in, seed + 1, 0.5f);
    A = random_vec(r * in, seed + 2, 0.5f);
    B = random_vec(out * r, seed + 3, 0.5f);
    if (with_bias) bias = random_vec(out, seed + 4);
    p.in = in;
    p.out = out;
    p.weight = w.data();
    p.bias = with_bias ? bias.data() : nullptr;
    p.r = r;
    p.lora_A = A.data();
    p.lora_B = B.data();
    p.scaling = lora_scaling(8.0, r, false);
    p.dropout = DropoutKey{dropout, 1234, 7, 3, 40};
  }
};

void lora_case(float dropout, bool bias) {
  LoraFixture fx(4, 6, 5, 3, 40, dropout, bias);
  const std::vector<float> wout = random_vec(fx.N * fx.out, 45);
  std::vector<float> y(fx.N * fx.out);
  auto f = [&] {
    lora_linear_fwd(y.data(), fx.x.data(), fx.p, fx.N);
    return dot(wout, y.data(), y.size());
  };
  std::vector<float> dx(fx.x.size(), 0.0f), dA(fx.A.size(), 0.0f), dB(fx.B.size(), 0.0f);
  lora_linear_bwd(dx.data(), dA.data(), dB.data(), wout.data(), fx.x.data(), fx.p, fx.N);
  check_grad("lora dx", fx.x.data(), fx.x.size(), dx, f, kEps, kTol);
  check_grad("lora dA", fx.A.data(), fx.A.size(), dA, f, kEps, kTol);
  check_grad("lora dB", fx.B.data(), fx.B.size(), dB, f, kEps, kTol);
  // "+=": a second backward doubles the gradients exactly.
  std::vector<float> dA2 = dA;
  lora_linear_bwd(nullptr, dA2.data(), nullptr, wout.data(), fx.x.data(), fx.p, fx.N);
  for (size_t i = 0; i < dA.size(); ++i) EXPECT_EQ(dA2[i], 2.0f * dA[i]);
}

TEST(LlamaLayers, LoraLinearBackward) { lora_case(0.0f, false); }
TEST(LlamaLayers, LoraLinearBackwardWithBiasAndDropout) { lora_case(0.3f, true); }

TEST(LlamaLayers, LoraScaling) {
  EXPECT_EQ(lora_scaling(8.0, 4, false), 2.0f);
  EXPECT_EQ(lora_scaling(8.0, 4, true), 4.0f);
  EXPECT_EQ(lora_scaling(8.0, 0, false), 0.0f);
}

TEST(LlamaLayers, MlpBackward) {
  // out = down(silu(gate(x)) * up(x)), every projection with LoRA.
  const int64_t N = 3, C = 6, I = 10, r = 2;
  LoraFixture gate(N, C, I, r, 50, 0.0f, false), up(N, C, I, r, 60, 0.0f, false), down(N, I, C, r, 70, 0.0f, false);
  std::vector<float> x = random_vec(N * C, 80);
  const std::vector<float> wout = random_vec(N * C, 81);
  std::vector<float> g(N * I), u(N * I), m(N * I), y(N * C);
  auto f = [&] {
    lora_linear_fwd(g.data(), x.data(), gate.p, N);
    lora_linear_fwd(u.data(), x.data(), up.p, N);
    swiglu_fwd(m.data(), g.data(), u.data(), N * I);
    lora_linear_fwd(y.data(), m.data(), down.p, N);
    return dot(wout, y.data(), y.size());
  };
  f();
  std::vector<float> dm(N * I, 0.0f), dg(N * I, 0.0f), du(N * I, 0.0f), dx(N * C, 0.0f);
  std::vector<float> dA[3], dB[3];
  LoraFixture* fx[3] = {&gate, &up, &down};
  for (int i = 0; i < 3; ++i) dA[i].assign(fx[i]->A.size(), 0.0f), dB[i].assign(fx[i]->B.size(), 0.0f);
  lora_linear_bwd(dm.data(), dA[2].data(), dB[2].data(), wout.data(), m.data(), down.p, N);
  swiglu_bwd(dg.data(), du.data(), dm.data(), g.data(), u.data(), N * I);
  lora_linear_bwd(dx.data(), dA[0].data(), dB[0].data(), dg.data(), x.data(), gate.p, N);
  lora_linear_bwd(dx.data(), dA[1].data(), dB[1].data(), du.data(), x.data(), up.p, N);
  check_grad("mlp dx", x.data(), x.size(), dx, f, kEps, kTol);
  const char* names[3] = {"gate", "up", "down"};
  for (int i = 0; i < 3; ++i) {
    check_grad(std::string("mlp ") + names[i] + " dA", fx[i]->A.data(), fx[i]->A.size(), dA[i], f, kEps, kTol);
    check_grad(std::string("mlp ") + names[i] + " dB", fx[i]->B.data(), fx[i]->B.size(), dB[i], f, kEps, kTol);
  }
}

TEST(LlamaLayers, CrossEntropyBackwardAndIgnoreIndex) {
  const int64_t N = 5, V = 7;
  std::vector<float> logits = random_vec(N * V, 90, 2.0f);
  const std::vector<int64_t> targets = {3, kIgnoreIndex, 0, 6, kIgnoreIndex};
  const double normalizer = 7.0;  // as if other ranks held more tokens
  std::vector<float> dlogits(N * V);
  const float loss = cross_entropy_fwd_bwd(dlogits.data(), logits.data(), targets.data(), N, V, normalizer);
  double want = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] == kIgnoreIndex) continue;
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(double(logits[n * V + v]));
    want += std::log(s) - logits[n * V + targets[n]];
  }
  EXPECT_NEAR(loss, want / normalizer, 1e-6);
  for (int64_t v = 0; v < V; ++v) EXPECT_EQ(dlogits[1 * V + v], 0.0f);
  auto f = [&] { return double(cross_entropy_fwd_bwd(nullptr, logits.data(), targets.data(), N, V, normalizer)); };
  check_grad("cross entropy dlogits", logits.data(), logits.size(), dlogits, f, kEps, kTol);
  const std::vector<int64_t> bad = {7};
  EXPECT_THROW(cross_entropy_fwd_bwd(nullptr, logits.data(), bad.data(), 1, V, 1.0), InputError);
}

TEST(LlamaLayers, ShiftLabelsLikeTransformers) {
  const std::vector<int64_t> labels = {1, 2, 3, -100, 5, 6};
  EXPECT_EQ(shift_labels(labels.data(), 2, 3), (std::vector<int64_t>{2, 3, -100, 5, 6, -100}));
}

TEST(LlamaLayers, DropoutIsDeterministicAndIndependentOfTheSplit) {
  const int64_t N = 8, W = 64;
  const std::vector<float> x = random_vec(N * W, 100);
  DropoutKey key{0.25f, 42, 3, 5, 16};
  std::vector<float> a(N * W), b(N * W), c(N * W);
  dropout_fwd(a.data(), x.data(), key, N, W);
  dropout_fwd(b.data(), x.data(), key, N, W);
  EXPECT_EQ(a, b) << "same key, same mask";
  // Two ranks with 4 rows each (row offsets 16 and 20) give the same mask as one rank with 8.
  DropoutKey k0 = key, k1 = key;
  k1.row_offset = key.row_offset + 4;
  dropout_fwd(c.data(), x.data(), k0, 4, W);
  dropout_fwd(c.data() + 4 * W, x.data() + 4 * W, k1, 4, W);
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
  dropout_fwd(b.data(), x.data(), other, N, W);
  EXPECT_NE(a, b) << "another step, another mask";
  other = key;
  other.module_id = 6;
  dropout_fwd(b.data(), x.data(), other, N, W);
  EXPECT_NE(a, b) << "another module, another mask";
}

TEST(LlamaLayers, DropoutZeroIsExactIdentity) {
  const int64_t N = 4, W = 16;
  const std::vector<float> x = random_vec(N * W, 110);
  std::vector<float> y(N * W);
  dropout_fwd(y.data(), x.data(), DropoutKey{0.0f, 1, 2, 3, 4}, N, W);
  EXPECT_EQ(y, x);
  // A LoRA Linear with dropout 0 equals, bit for bit, the same layer whatever the dropout key.
  LoraFixture f1(3, 6, 5, 2, 120, 0.0f, false), f2(3, 6, 5, 2, 120, 0.0f, false);
  f2.p.dropout.seed = 999;
  f2.p.dropout.step = 17;
  std::vector<float> y1(15), y2(15);
  lora_linear_fwd(y1.data(), f1.x.data(), f1.p, 3);
  lora_linear_fwd(y2.data(), f2.x.data(), f2.p, 3);
  EXPECT_EQ(y1, y2);
}

}  // namespace
}  // namespace qshard
