#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "optim/adamw.h"

namespace qshard {

void cpu::adamw_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& a, int64_t step,
                     void* stream, const float* grad_scale_ptr) {
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
  const float scale = grad_scale_ptr ? *grad_scale_ptr : static_cast<float>(a.grad_scale);
  const bool scaled = grad_scale_ptr ? scale != 1.0f : a.grad_scale != 1.0;
  auto run = [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float gi = scaled ? g[i] * scale : g[i];
      float pi = p[i] * decay;
      const float mi = m[i] + one_minus_b1 * (gi - m[i]);
      const float vi = v[i] * b2 + one_minus_b2 * gi * gi;
      const float denom = std::sqrt(vi) / bc2_sqrt + eps;
      pi = pi + (neg_step_size * mi) / denom;  // torch addcdiv_: self + (value * t1) / t2
      p[i] = pi;
      m[i] = mi;
      v[i] = vi;
    }
  };
  // Element-wise, so threads over contiguous slices give the same bits as one loop. The host
  // step of offload.optimizer is memory-bound (~20 bytes per element): one core takes ~0.2 s for
  // an 8B model's r16 LoRA shards, the machine's cores a fraction of it.
  constexpr int64_t kPerThread = int64_t{1} << 18;
  const int64_t threads = std::min<int64_t>({static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency())),
                                             16, n / kPerThread});
  if (threads <= 1) return run(0, n);
  std::vector<std::thread> pool;
  const int64_t per = (n + threads - 1) / threads;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(run, t * per, std::min(n, (t + 1) * per));
  run(0, std::min(n, per));
  for (auto& th : pool) th.join();
}

double sum_squares(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

void cpu::add_sum_squares(double* acc, double* partials, const float* x, int64_t n, bool accumulate, void* stream) {
  (void)partials;
  (void)stream;
  acc[0] = (accumulate ? acc[0] : 0.0) + sum_squares(x, n);
}

void cpu::clip_from_sum_squares(const double* sum_sq, double max_norm, double* norm, float* scale, void* stream) {
  (void)stream;
  norm[0] = std::sqrt(sum_sq[0]);
  scale[0] = static_cast<float>(clip_coefficient(norm[0], max_norm));
}

double clip_coefficient(double total_norm, double max_norm) {
  if (max_norm <= 0.0 || !std::isfinite(total_norm)) return 1.0;
  const double c = max_norm / (total_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

}  // namespace qshard
