// adamw_step_cuda vs adamw_step_cpu on fresh random inputs (label `cuda`; skips without a GPU).
// Tolerance: 1e-6 relative. Both do the same float operations in the same order without FMA
// contraction and with IEEE sqrt/division, so they are expected to agree bit for bit; the
// tolerance only guards against a toolchain that rounds one operation differently.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "runtime/tensor.h"
#include "optim/adamw.h"

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

// The gradient norm on the device (add_sum_squares, clip_from_sum_squares) against the CPU twins:
// sums agree to 1e-12 relative (f64, another summation order), the device sum is the same bits on a
// second run (fixed grid and tree), n = 0 and a shard smaller than the grid work, and AdamW reading
// the coefficient from device memory equals AdamW given it as a parameter.
TEST(GradNormCuda, MatchesCpuAndIsDeterministic) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const std::vector<int64_t> sizes = {100003, 0, 17, 4096 * 300 + 5};
  std::vector<Tensor> shards;
  std::vector<std::vector<float>> host;
  for (int64_t n : sizes) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = d(rng) * 0.01f;
    host.push_back(x);
    shards.push_back(Tensor::from_vector({n}, DType::kF32, x).to(Device::kCuda));
  }
  double cpu_acc = 0;
  for (size_t u = 0; u < host.size(); ++u)
    cpu::add_sum_squares(&cpu_acc, nullptr, host[u].data(), static_cast<int64_t>(host[u].size()), u > 0);
  Tensor scratch = Tensor::zeros({2 + kSumSquaresBlocks}, DType::kF64, Device::kCuda);
  Tensor scale = Tensor::zeros({1}, DType::kF32, Device::kCuda);
  double* acc = static_cast<double*>(scratch.raw());
  double got[2][2];
  for (int run = 0; run < 2; ++run) {
    for (size_t u = 0; u < shards.size(); ++u)
      cuda::add_sum_squares(acc, acc + 2, shards[u].data<float>(), shards[u].numel(), u > 0, nullptr);
    cuda::clip_from_sum_squares(acc, 0.5, acc + 1, scale.data<float>(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    copy_bytes(got[run], Device::kCpu, acc, Device::kCuda, 2 * sizeof(double));
  }
  std::printf("  sum of squares: cpu %.17g cuda %.17g\n", cpu_acc, got[0][0]);
  EXPECT_NEAR(got[0][0], cpu_acc, 1e-12 * cpu_acc);
  EXPECT_EQ(std::memcmp(got[0], got[1], sizeof(got[0])), 0) << "the device sum changed between runs";
  double cpu_norm = 0;
  float cpu_scale = 0;
  cpu::clip_from_sum_squares(&got[0][0], 0.5, &cpu_norm, &cpu_scale);
  float dev_scale = 0;
  copy_bytes(&dev_scale, Device::kCpu, scale.raw(), Device::kCuda, sizeof(float));
  EXPECT_EQ(got[0][1], cpu_norm);
  EXPECT_EQ(dev_scale, cpu_scale);
  EXPECT_LT(dev_scale, 1.0f);  // the norm (~11.5) is above 0.5: clipped

  // AdamW with the coefficient in device memory == AdamW with it as a parameter.
  const int64_t n = sizes[0];
  Tensor p1 = shards[0].to(Device::kCuda), p2 = shards[0].to(Device::kCuda);
  Tensor m1 = Tensor::zeros({n}, DType::kF32, Device::kCuda), m2 = Tensor::zeros({n}, DType::kF32, Device::kCuda);
  Tensor v1 = Tensor::zeros({n}, DType::kF32, Device::kCuda), v2 = Tensor::zeros({n}, DType::kF32, Device::kCuda);
  AdamWParams a{1e-3, 0.9, 0.999, 1e-8, 0.01, static_cast<double>(dev_scale)};
  cuda::adamw_step(p1.data<float>(), shards[3].data<float>(), m1.data<float>(), v1.data<float>(), n, a, 1, nullptr);
  a.grad_scale = 3.0;  // ignored: the pointer wins
  cuda::adamw_step(p2.data<float>(), shards[3].data<float>(), m2.data<float>(), v2.data<float>(), n, a, 1, nullptr,
                   scale.data<float>());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(bitwise_equal(p1.to(Device::kCpu), p2.to(Device::kCpu)));
  EXPECT_TRUE(bitwise_equal(v1.to(Device::kCpu), v2.to(Device::kCpu)));
}

}  // namespace
}  // namespace qshard
