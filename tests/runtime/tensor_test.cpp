#include "runtime/tensor.h"

#include <gtest/gtest.h>

namespace qshard {
namespace {

TEST(Tensor, ViewsShareStorage) {
  std::vector<float> v = {1, 2, 3, 4, 5, 6};
  Tensor t = Tensor::from_vector({2, 3}, DType::kF32, v);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  Tensor r = t.reshape({3, 2});
  r.data<float>()[0] = 42;
  EXPECT_EQ(t.data<float>()[0], 42);
  Tensor s = t.flat_slice(2, 3);
  EXPECT_EQ(s.data<float>()[0], 3);
  EXPECT_EQ(s.shape(), Shape({3}));
  Tensor c = t.clone();
  c.data<float>()[1] = -1;
  EXPECT_EQ(t.data<float>()[1], 2);
  EXPECT_THROW(t.reshape({4, 2}), Error);
  EXPECT_THROW(t.flat_slice(4, 3), Error);
}

TEST(Tensor, ViewAsReinterpretsBytes) {
  Tensor t = Tensor::zeros({8, 1}, DType::kU8);
  Tensor b = t.view_as(DType::kBF16, {4, 1});
  EXPECT_EQ(b.nbytes(), 8u);
  EXPECT_THROW(t.view_as(DType::kF32, {3, 1}), Error);
}

TEST(Tensor, F32Conversions) {
  std::vector<float> v = {1.0f, -2.5f, 3.140625f};
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor t = Tensor::from_f32({3}, d, v);
    EXPECT_EQ(t.to_f32_vector(), v) << dtype_torch_name(d);
  }
  EXPECT_THROW(Tensor::zeros({2}, DType::kU8).to_f32_vector(), Error);
}

TEST(Tensor, DeviceWithoutCudaIsAnError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present";
  EXPECT_THROW(Tensor::empty({4}, DType::kF32, Device::kCuda), Error);
}

TEST(Tensor, ShapeOverflowIsAnError) {
  EXPECT_THROW(shape_numel({1LL << 40, 1LL << 40}), Error);
  EXPECT_THROW(shape_numel({-1}), Error);
}

}  // namespace
}  // namespace qshard
