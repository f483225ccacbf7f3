// CUDA kernels vs the CPU reference on fresh random inputs (label `cuda`; skips without a GPU).
// Tolerance: zero. Both paths do the same float32 operations in the same order (see
// quant/blockwise.h), so packed bytes, statistics and dequantized values must be bitwise equal.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <random>

#include "quant/blockwise.h"
#include "quant/params4bit.h"

namespace qshard {
namespace {

struct Case {
  QuantType type;
  int64_t blocksize;
  bool dq;
  DType dtype;
  int64_t n;
};

std::string name(const Case& c) {
  return std::string(quant_type_name(c.type)) + " bs" + std::to_string(c.blocksize) + (c.dq ? " dq " : " ") +
         dtype_torch_name(c.dtype) + " n=" + std::to_string(c.n);
}

Tensor random_input(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(c.n));
  for (auto& x : v) x = d(rng) * 0.05f;
  // An all-zero block and a block of large values, where the count allows.
  if (c.n > 3 * c.blocksize) {
    for (int64_t i = c.blocksize; i < 2 * c.blocksize; ++i) v[i] = 0.0f;
    for (int64_t i = 2 * c.blocksize; i < 3 * c.blocksize; ++i) v[i] *= 1000.0f;
  }
  return Tensor::from_f32({c.n}, c.dtype, v);
}

void expect_same(const Tensor& cpu, const Tensor& gpu_on_host, const std::string& what) {
  ASSERT_EQ(cpu.nbytes(), gpu_on_host.nbytes()) << what;
  EXPECT_TRUE(bitwise_equal(cpu, gpu_on_host)) << what << " differs";
}

class CudaVsCpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CudaVsCpu, QuantizeAndDequantizeBitwiseEqual) {
  const Case c = GetParam();
  Tensor x = random_input(c, static_cast<uint32_t>(c.n * 7 + c.blocksize));
  const QuantizeOptions o{c.type, c.blocksize, c.dq};
  Params4bit ref = quantize_4bit(x, o);
  Params4bit dev = quantize_4bit(x.to(Device::kCuda), o);
  ASSERT_EQ(dev.data.device(), Device::kCuda);
  expect_same(ref.data, dev.data.to(Device::kCpu), name(c) + " packed");
  expect_same(ref.quant_state.absmax, dev.quant_state.absmax.to(Device::kCpu), name(c) + " absmax");
  if (c.dq) {
    EXPECT_EQ(ref.quant_state.state2->offset, dev.quant_state.state2->offset);
    expect_same(ref.quant_state.state2->absmax, dev.quant_state.state2->absmax.to(Device::kCpu),
                name(c) + " nested_absmax");
  }
  for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor y_ref = dequantize_4bit(ref, out);
    Tensor y_dev = dequantize_4bit(dev, out).to(Device::kCpu);
    const auto a = y_ref.to_f32_vector(), b = y_dev.to_f32_vector();
    float max_err = 0;
    for (size_t i = 0; i < a.size(); ++i) max_err = std::max(max_err, std::fabs(a[i] - b[i]));
    std::printf("%s -> %s: cpu %.8g gpu %.8g | cpu %.8g gpu %.8g | max |diff| %g (tolerance 0)\n", name(c).c_str(),
                dtype_torch_name(out), a[0], b[0], a.back(), b.back(), max_err);
    expect_same(y_ref, y_dev, name(c) + " dequant " + dtype_torch_name(out));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, CudaVsCpu,
    ::testing::Values(Case{QuantType::kNf4, 64, true, DType::kBF16, 4096 * 64 + 7},
                      Case{QuantType::kNf4, 64, false, DType::kF32, 1},
                      Case{QuantType::kNf4, 32, true, DType::kF16, 63},
                      Case{QuantType::kNf4, 128, true, DType::kF32, 64 * 300 + 17},
                      Case{QuantType::kNf4, 4096, true, DType::kBF16, 4096 * 5 + 3},
                      Case{QuantType::kFp4, 64, true, DType::kBF16, 65},
                      Case{QuantType::kFp4, 256, false, DType::kF16, 4097},
                      Case{QuantType::kFp4, 2048, true, DType::kF32, 2048 * 300}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string s = name(info.param);
      for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return s;
    });

TEST(CudaDequant, EveryUnitsPerThreadVariantAgrees) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (bool dq : {false, true}) {
    const Case c{QuantType::kNf4, 64, dq, DType::kBF16, 64 * 4099 + 8};
    Params4bit ref = quantize_4bit(random_input(c, 5), {c.type, c.blocksize, c.dq});
    const Tensor expect = dequantize_4bit(ref, DType::kBF16);
    Params4bit dev = quantize_4bit(random_input(c, 5).to(Device::kCuda), {c.type, c.blocksize, c.dq});
    Dequant4bitArgs a = dequant_args(dev);
    for (int u : {0, 1, 2, 4, 8, 16}) {
      a.units_per_thread = u;
      Tensor out = Tensor::empty({c.n}, DType::kBF16, Device::kCuda);
      cuda::dequantize_4bit(a, out.raw(), DType::kBF16, nullptr);
      expect_same(expect, out.to(Device::kCpu), "units_per_thread " + std::to_string(u) + (dq ? " dq" : ""));
    }
  }
}

TEST(CudaDequant, BatchOfMixedTensorsMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  // Nine tensors (more than one launch's worth), mixed nested/plain, blocksizes and odd counts.
  std::vector<Case> cases;
  for (int i = 0; i < 9; ++i)
    cases.push_back(Case{i % 3 == 2 ? QuantType::kFp4 : QuantType::kNf4, int64_t(32) << (i % 4), i % 2 == 0,
                         DType::kBF16, 64 * (100 + 37 * i) + (i % 3) * 5});
  std::vector<Params4bit> dev;
  std::vector<Tensor> outs, expect;
  std::vector<Dequant4bitArgs> args;
  std::vector<void*> out_ptrs;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    Params4bit ref = quantize_4bit(random_input(c, 40 + i), {c.type, c.blocksize, c.dq});
    expect.push_back(dequantize_4bit(ref, DType::kF16));
    dev.push_back(quantize_4bit(random_input(c, 40 + i).to(Device::kCuda), {c.type, c.blocksize, c.dq}));
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    Dequant4bitArgs a = dequant_args(dev[i]);
    args.push_back(a);
    outs.push_back(Tensor::empty({cases[i].n}, DType::kF16, Device::kCuda));
    out_ptrs.push_back(outs.back().raw());
  }
  cuda::dequantize_4bit_batch(args.data(), out_ptrs.data(), static_cast<int>(args.size()), DType::kF16, nullptr);
  for (size_t i = 0; i < cases.size(); ++i) expect_same(expect[i], outs[i].to(Device::kCpu), "batch " + name(cases[i]));
}

TEST(CudaDequant, UnalignedViewsUseTheScalarPath) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Case c{QuantType::kNf4, 64, true, DType::kBF16, 64 * 40};
  Params4bit ref = quantize_4bit(random_input(c, 99), {c.type, c.blocksize, c.dq});
  // Put the packed bytes at an odd device address.
  Tensor buf = Tensor::zeros({ref.data.numel() + 1}, DType::kU8, Device::kCuda);
  Tensor shifted = buf.flat_slice(1, ref.data.numel());
  shifted.copy_from(ref.data);
  Params4bit dev = ref;
  dev.data = shifted.reshape(ref.data.shape());
  dev.quant_state.absmax = ref.quant_state.absmax.to(Device::kCuda);
  dev.quant_state.code = ref.quant_state.code.to(Device::kCuda);
  dev.quant_state.state2->absmax = ref.quant_state.state2->absmax.to(Device::kCuda);
  dev.quant_state.state2->code = ref.quant_state.state2->code.to(Device::kCuda);
  expect_same(dequantize_4bit(ref), dequantize_4bit(dev).to(Device::kCpu), "unaligned dequant");
}

}  // namespace
}  // namespace qshard
