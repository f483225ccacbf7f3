// The one-rank data communicator: every collective is the identity (a copy, or nothing in place),
// on host buffers here and on device buffers when a GPU is visible.
#include <gtest/gtest.h>

#include <vector>

#include "runtime/error.h"
#include "runtime/self_communicator.h"
#include "runtime/tensor.h"

namespace qshard {
namespace {

TEST(SelfCommunicator, CollectivesOfOneRankAreCopies) {
  SelfCommunicator c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  const std::vector<float> send = {1.5f, -2.0f, 3.25f, 7.0f};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
    std::vector<float> a(4, 0.0f), b(4, 0.0f);
    c.reduce_scatter(send.data(), a.data(), 4, DType::kF32, op, nullptr);
    c.all_reduce(send.data(), b.data(), 4, DType::kF32, op, nullptr);
    EXPECT_EQ(a, send);
    EXPECT_EQ(b, send);
  }
  std::vector<double> g(3, 0.0), d = {1.0, 2.0, 3.0};
  c.all_gather(d.data(), g.data(), 3, DType::kF64, nullptr);
  EXPECT_EQ(g, d);
  std::vector<int64_t> x = {5, 6}, y(2, 0);
  c.broadcast(x.data(), y.data(), 2, DType::kI64, 0, nullptr);
  EXPECT_EQ(y, x);
  // In place: the values stay.
  std::vector<float> in = send;
  c.all_reduce(in.data(), in.data(), 4, DType::kF32, ReduceOp::kAvg, nullptr);
  EXPECT_EQ(in, send);
  EXPECT_THROW(c.broadcast(x.data(), y.data(), 2, DType::kI64, 1, nullptr), Error);
}

TEST(SelfCommunicator, DeviceBuffersAreCopiedOnTheStream) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  SelfCommunicator c;
  const Tensor src = Tensor::from_vector({4}, DType::kF32, std::vector<float>{1, 2, 3, 4}).to(Device::kCuda);
  Tensor dst = Tensor::zeros({4}, DType::kF32, Device::kCuda);
  c.reduce_scatter(src.raw(), dst.raw(), 4, DType::kF32, ReduceOp::kAvg, nullptr);
  const Tensor back = dst.to(Device::kCpu);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back.data<float>()[i], static_cast<float>(i + 1));
}

}  // namespace
}  // namespace qshard
