#include <cmath>

#include "runtime/error.h"
#include "train/adamw.h"

namespace qshard {

void cpu::adamw_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& a, int64_t step,
                     void* stream) {
  (void)stream;
  QS_CHECK(n >= 0 && step >= 1, "cpu::adamw_step: n >= 0 and step >= 1");
  const float decay = static_cast<float>(1.0 - a.lr * a.weight_decay);
  const float one_minus_b1 = static_cast<float>(1.0 - a.beta1);
  const float b2 = static_cast<float>(a.beta2);
  const float one_minus_b2 = static_cast<float>(1.0 - a.beta2);
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(step));
  const float neg_step_size = static_cast<float>(-(a.lr / bc1));
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float eps = static_cast<float>(a.eps);
  const float scale = static_cast<float>(a.grad_scale);
  for (int64_t i = 0; i < n; ++i) {
    const float gi = a.grad_scale == 1.0 ? g[i] : g[i] * scale;
    float pi = p[i] * decay;
    const float mi = m[i] + one_minus_b1 * (gi - m[i]);
    const float vi = v[i] * b2 + one_minus_b2 * gi * gi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    pi = pi + (neg_step_size * mi) / denom;  // torch addcdiv_: self + (value * t1) / t2
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

double sum_squares(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

double clip_coefficient(double total_norm, double max_norm) {
  if (max_norm <= 0.0 || !std::isfinite(total_norm)) return 1.0;
  const double c = max_norm / (total_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

}  // namespace qshard
