// op_harness.h: the op harness's machinery, shared by its test files (op_harness_test.cpp: the
// model's ops through ops::; op_harness_twins_test.cpp: the kernel twins of quant/, shard/ and
// optim/ through their dispatch). Every case runs on every backend this build has and this machine
// can run (the CPU always; CUDA in a CUDA build with a visible GPU), on random then adversarial
// inputs (never zeros), and reports a few value pairs and the scaled max error against the
// tolerance declared next to the op with its reason.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "model/llama_ops.h"
#include "runtime/device_context.h"
#include "runtime/tensor.h"

namespace qshard::op_harness {

// ---- backends and transport -------------------------------------------------------------------

inline std::vector<std::unique_ptr<DeviceContext>> backends() {
  std::vector<std::unique_ptr<DeviceContext>> out;
  out.push_back(std::make_unique<DeviceContext>(Backend::kCpu, -1));
  if (ops::has_backend(Backend::kCuda) && cuda_available()) {
    out.push_back(std::make_unique<DeviceContext>(Backend::kCuda, 0));
    ops::prepare(*out.back());
  }
  for (auto& c : out) c->workspace().reserve(8 << 20);
  return out;
}

// f32 values -> a tensor in the context's activation dtype on its device.
inline Tensor to_act(DeviceContext& ctx, const std::vector<float>& v) {
  const Tensor host = Tensor::from_f32({static_cast<int64_t>(v.size())}, ctx.activation_dtype(), v);
  return host.to(ctx.compute_device());
}
inline Tensor to_f32_dev(DeviceContext& ctx, const std::vector<float>& v) {
  return Tensor::from_vector({static_cast<int64_t>(v.size())}, DType::kF32, v).to(ctx.compute_device());
}
inline std::vector<float> back(DeviceContext& ctx, const Tensor& t) {
  ctx.compute().synchronize();
  return t.to(Device::kCpu).to_f32_vector();
}

struct Inputs {
  std::mt19937 rng;
  bool adversarial;
  Inputs(uint32_t seed, bool adv) : rng(seed), adversarial(adv) {}
  // N(0, scale); adversarial: x100 magnitudes and a few huge outliers.
  std::vector<float> vec(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.f, scale * (adversarial ? 100.f : 1.f));
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    if (adversarial && n > 4) v[n / 3] *= 50.f, v[n / 2] = -v[n / 2] * 30.f;
    return v;
  }
  std::vector<float> bounded(size_t n, float scale = 1.0f) {  // never blown up (norm weights, ...)
    std::normal_distribution<float> d(0.f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
  }
};

// The tolerance of the backend: `cpu` on the CPU, `cuda` on CUDA.
inline double tol(const DeviceContext& ctx, double cpu, double cuda) { return ctx.is_cuda() ? cuda : cpu; }

// max |got - want| / max(1, max |want|): the error relative to the output's scale.
inline double scaled_error(const std::vector<float>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double scale = 1.0, err = 0.0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
  return err / scale;
}

inline void report(const DeviceContext& ctx, const char* op, bool adv, const std::vector<float>& got,
                   const std::vector<double>& want, double tol) {
  const double e = scaled_error(got, want);
  std::printf("  %-22s %-4s %-11s got %+.6e want %+.6e ... scaled max err %.2e (tol %.0e)\n", op,
              backend_name(ctx.backend()), adv ? "adversarial" : "random", got.empty() ? 0.0 : got[0],
              want.empty() ? 0.0 : want[0], e, tol);
  EXPECT_LE(e, tol) << op << " on " << backend_name(ctx.backend()) << (adv ? " (adversarial)" : "");
}

// Runs `body` on every backend, on random then adversarial inputs, with a fresh seed each time.
inline void for_each_case(const std::function<void(DeviceContext&, Inputs&)>& body) {
  uint32_t seed = 1000;
  for (auto& ctx : backends())
    for (bool adv : {false, true}) {
      Inputs in(++seed, adv);
      body(*ctx, in);
      ctx->workspace().reset();
    }
}

}  // namespace qshard::op_harness
