// AdamW (CPU reference) against torch.optim.AdamW. Reference values made with torch 2.x on CPU:
//
//   import torch
//   p0 = [0.5, -1.25, 0.003, 2.0, -0.75, 0.1]
//   def grads(step):  # step 1..5
//       return [0.1 * step - 0.3, 0.02 * step, -0.5 + 0.07 * step, 1e-4 * step, -2.0 / step, 0.0]
//   def run(lr, b1, b2, eps, wd, coef, steps):
//       p = torch.nn.Parameter(torch.tensor(p0, dtype=torch.float32))
//       opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, foreach=False)
//       for s in range(1, steps + 1):
//           p.grad = torch.tensor(grads(s), dtype=torch.float32)
//           if coef != 1.0: p.grad.mul_(coef)
//           opt.step()
//       st = opt.state[p]
//       f = lambda t: ', '.join('%.9gf' % x for x in t.tolist())
//       print('p:', f(p.data)); print('m:', f(st['exp_avg'])); print('v:', f(st['exp_avg_sq']))
//   run(1e-3, 0.9, 0.999, 1e-8, 0.01, 1.0, 5)
//   run(3e-2, 0.8, 0.95, 1e-6, 0.1, 0.25, 3)
//
// Tolerance: 1e-6 relative (+1e-12 absolute). torch's vectorised CPU kernels may round a few
// operations differently (fused multiply-add in lerp/addcmul); the formula and order are the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "optim/adamw.h"

namespace qshard {
namespace {

std::vector<float> grads(int step) {
  const double s = step;
  return {static_cast<float>(0.1 * s - 0.3), static_cast<float>(0.02 * s), static_cast<float>(-0.5 + 0.07 * s),
          static_cast<float>(1e-4 * s),      static_cast<float>(-2.0 / s),  0.0f};
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double max_rel = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double tol = 1e-6 * std::fabs(want[i]) + 1e-12;
    if (i < 3) std::printf("  %s[%zu]: qshard %.9g torch %.9g\n", what, i, got[i], want[i]);
    EXPECT_LE(err, tol) << what << "[" << i << "] qshard " << got[i] << " torch " << want[i];
    if (want[i] != 0) max_rel = std::max(max_rel, err / std::fabs(want[i]));
  }
  std::printf("  %s: max relative error %.3g (tolerance 1e-6)\n", what, max_rel);
}

struct Ref {
  AdamWParams params;
  int steps;
  std::vector<float> p, m, v;
};

void run_case(const Ref& ref) {
  std::vector<float> p = {0.5f, -1.25f, 0.003f, 2.0f, -0.75f, 0.1f}, m(6, 0.0f), v(6, 0.0f);
  for (int s = 1; s <= ref.steps; ++s) {
    const auto g = grads(s);
    cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), 6, ref.params, s);
  }
  expect_close(p, ref.p, "p");
  expect_close(m, ref.m, "m");
  expect_close(v, ref.v, "v");
}

TEST(AdamW, MatchesTorchDefaults) {
  Ref r;
  r.params = {1e-3, 0.9, 0.999, 1e-8, 0.01, 1.0};
  r.steps = 5;
  r.p = {0.502780557f, -1.2547884f, 0.00780935632f, 1.99504924f, -0.745561123f, 0.0999950096f};
  r.m = {0.0085880002f, 0.0262882002f, -0.112746306f, 0.000131441004f, -0.343120009f, 0.0f};
  r.v = {9.98002724e-05f, 2.19800113e-05f, 0.000468156621f, 5.49500334e-10f, 0.00583433313f, 0.0f};
  run_case(r);
}

TEST(AdamW, MatchesTorchWithClipScaleAndStrongDecay) {
  Ref r;
  r.params = {3e-2, 0.8, 0.95, 1e-6, 0.1, 0.25};  // grad_scale = torch's p.grad.mul_(0.25)
  r.steps = 3;
  r.p = {0.573095322f, -1.32718897f, 0.091326274f, 1.89602506f, -0.660417318f, 0.0991026908f};
  r.m = {-0.0104f, 0.00523999985f, -0.0426600017f, 2.62000012e-05f, -0.137333348f, 0.0f};
  r.v = {0.000142500008f, 1.71281245e-05f, 0.00116903835f, 4.2820314e-10f, 0.0156388879f, 0.0f};
  run_case(r);
}

TEST(AdamW, EmptyArrayIsANoOp) { cpu::adamw_step(nullptr, nullptr, nullptr, nullptr, 0, AdamWParams{}, 1); }

TEST(GradClip, SumSquaresAndCoefficient) {
  const std::vector<float> g = {3.0f, -4.0f, 0.0f};
  EXPECT_DOUBLE_EQ(sum_squares(g.data(), 3), 25.0);
  EXPECT_DOUBLE_EQ(sum_squares(g.data(), 0), 0.0);
  // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1.
  EXPECT_DOUBLE_EQ(clip_coefficient(5.0, 1.0), 1.0 / (5.0 + 1e-6));
  EXPECT_DOUBLE_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_coefficient(5.0, 0.0), 1.0);  // clipping off
  EXPECT_DOUBLE_EQ(clip_coefficient(NAN, 1.0), 1.0);
}

}  // namespace
}  // namespace qshard

namespace qshard {
namespace {
// A large array runs on several threads (contiguous slices): the same bits as slice-sized calls,
// which run on one thread each.
TEST(AdamW, ThreadedStepIsBitwiseTheSerialOne) {
  const int64_t n = 3'000'017;
  std::vector<float> p(n), g(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = std::sin(0.001f * i);
    g[i] = std::cos(0.0007f * i) * 1e-2f;
    m[i] = 1e-3f * std::sin(0.01f * i);
    v[i] = 1e-6f * (1.0f + std::cos(0.02f * i));
  }
  auto p2 = p, g2 = g, m2 = m, v2 = v;
  AdamWParams a;
  a.lr = 2e-4;
  a.grad_scale = 0.5;
  cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), n, a, 3);
  for (int64_t lo = 0; lo < n; lo += 100'000) {
    const int64_t len = std::min<int64_t>(100'000, n - lo);
    cpu::adamw_step(p2.data() + lo, g2.data() + lo, m2.data() + lo, v2.data() + lo, len, a, 3);
  }
  EXPECT_EQ(0, std::memcmp(p.data(), p2.data(), n * 4));
  EXPECT_EQ(0, std::memcmp(m.data(), m2.data(), n * 4));
  EXPECT_EQ(0, std::memcmp(v.data(), v2.data(), n * 4));
}
}  // namespace
}  // namespace qshard
