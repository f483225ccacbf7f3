// adamw_step_cuda vs adamw_step_cpu on fresh random inputs (label `cuda`; skips without a GPU).
// Tolerance: 1e-6 relative. Both do the same float operations in the same order without FMA
// contraction and with IEEE sqrt/division, so they are expected to agree bit for bit; the
// tolerance only guards against a toolchain that rounds one operation differently.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "runtime/tensor.h"
#include "train/adamw.h"

namespace qshard {
namespace {

TEST(AdamWCuda, MatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 100003;  // not a multiple of the block size
  std::mt19937 rng(42);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> p(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = d(rng) * 0.1f;
    m[i] = d(rng) * 0.01f;
    v[i] = std::fabs(d(rng)) * 1e-4f;
  }
  Tensor tp = Tensor::from_vector({n}, DType::kF32, p).to(Device::kCuda);
  Tensor tm = Tensor::from_vector({n}, DType::kF32, m).to(Device::kCuda);
  Tensor tv = Tensor::from_vector({n}, DType::kF32, v).to(Device::kCuda);
  const AdamWParams a{2e-3, 0.9, 0.999, 1e-8, 0.05, 0.5};
  for (int64_t step = 1; step <= 4; ++step) {
    std::vector<float> g(n);
    for (auto& x : g) x = d(rng);
    Tensor tg = Tensor::from_vector({n}, DType::kF32, g).to(Device::kCuda);
    cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), n, a, step);
    cuda::adamw_step(tp.data<float>(), tg.data<float>(), tm.data<float>(), tv.data<float>(), n, a, step, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  const auto check = [](const std::vector<float>& cpu, const Tensor& dev, const char* what) {
    const std::vector<float> got = dev.to(Device::kCpu).to_f32_vector();
    double max_rel = 0;
    int64_t bad = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      const double err = std::fabs(static_cast<double>(got[i]) - cpu[i]);
      if (err > 1e-6 * std::fabs(cpu[i]) + 1e-30) ++bad;
      if (cpu[i] != 0) max_rel = std::max(max_rel, err / std::fabs(cpu[i]));
    }
    for (int i = 0; i < 3; ++i) std::printf("  %s[%d]: cpu %.9g cuda %.9g\n", what, i, cpu[i], got[i]);
    std::printf("  %s: max relative error %.3g (tolerance 1e-6), %lld outside\n", what, max_rel,
                static_cast<long long>(bad));
    EXPECT_EQ(bad, 0) << what;
  };
  check(p, tp, "p");
  check(m, tm, "m");
  check(v, tv, "v");
}

}  // namespace
}  // namespace qshard
