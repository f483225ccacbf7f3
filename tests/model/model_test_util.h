// Helpers of the model tests: random inputs and a finite-difference gradient check.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace qshard::test {

inline std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// sum_i w[i] * y[i] in double: the scalar objective whose gradient wrt y is w.
inline double dot(const std::vector<float>& w, const float* y, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(w[i]) * static_cast<double>(y[i]);
  return s;
}

// Compares `grad` (analytic d f / d x) with central differences of f over every element of x
// (x is perturbed in place and restored). f runs the fp32 forward and returns the objective in
// double. Pass: |fd - grad| <= tol * max(1, max_i |grad_i|) for every element. Prints the worst
// element and a few pairs.
inline void check_grad(const std::string& what, float* x, size_t n, const std::vector<float>& grad,
                       const std::function<double()>& f, float eps, double tol) {
  ASSERT_EQ(grad.size(), n) << what;
  double gmax = 0.0;
  for (float g : grad) gmax = std::max(gmax, std::fabs(static_cast<double>(g)));
  const double bound = tol * std::max(1.0, gmax);
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < n; ++i) {
    const float saved = x[i];
    x[i] = saved + eps;
    const double xp = x[i];
    const double fp = f();
    x[i] = saved - eps;
    const double xm = x[i];
    const double fm = f();
    x[i] = saved;
    const double fd = (fp - fm) / (xp - xm);
    const double err = std::fabs(fd - static_cast<double>(grad[i]));
    if (i < 3) std::printf("  %s[%zu]: analytic % .6e  fd % .6e\n", what.c_str(), i, grad[i], fd);
    if (err > worst) worst = err, worst_i = i;
    EXPECT_LE(err, bound) << what << "[" << i << "]: analytic " << grad[i] << " fd " << fd;
  }
  std::printf("  %s: %zu elements, max|grad| %.3e, worst |fd - analytic| %.3e at %zu (bound %.3e)\n", what.c_str(), n,
              gmax, worst, worst_i, bound);
}

}  // namespace qshard::test
