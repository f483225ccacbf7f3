// NcclCommunicator on device buffers (label `cuda`; skipped without a GPU, or when ranks would
// share a GPU, which NCCL refuses). Compared with MpiCommunicator-style serial references; NCCL's
// reduction order is its own, so sums of non-integers use a tolerance: |got - want| <=
// 1e-6 * size * max|x| (f32: a few ulps of the largest partial sum), bitwise for integer values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/comm_test_util.h"
#include "runtime/nccl_communicator.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"
#include "runtime/world.h"

namespace qshard {
namespace {

using test::int_value;
using test::pattern_byte;
using test::rand_value;

class NcclComm : public ::testing::Test {
 protected:
  void SetUp() override {
    World& w = World::get();
    int gpus = 0;
    if (w.device() < 0) GTEST_SKIP() << "no GPU";
    cudaGetDeviceCount(&gpus);
    if (w.local_size() > gpus) GTEST_SKIP() << w.local_size() << " ranks on " << gpus << " GPU(s): NCCL needs one each";
    comm_ = std::make_unique<NcclCommunicator>(w.comm());
    P_ = comm_->size();
    me_ = comm_->rank();
  }
  void* dev(const void* host, size_t bytes) {
    void* d = device_malloc(bytes);
    if (host) copy_bytes(d, Device::kCuda, host, Device::kCpu, bytes);
    owned_.push_back(d);
    return d;
  }
  template <class T>
  std::vector<T> host(const void* d, size_t n) {
    std::vector<T> h(n);
    copy_bytes(h.data(), Device::kCpu, d, Device::kCuda, n * sizeof(T));
    return h;
  }
  void TearDown() override {
    for (void* p : owned_) device_free(p);
    comm_.reset();
  }
  std::unique_ptr<NcclCommunicator> comm_;
  std::vector<void*> owned_;
  int P_ = 1, me_ = 0;
};

TEST_F(NcclComm, AllGatherBitwise) {
  Stream s(stream_names::kGather);
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000003}}) {
    std::vector<uint8_t> mine(count * 2), expected;
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = pattern_byte(me_, i, count);
    for (int r = 0; r < P_; ++r)
      for (size_t i = 0; i < mine.size(); ++i) expected.push_back(pattern_byte(r, i, count));
    void* d_send = dev(mine.data(), mine.size());
    void* d_recv = dev(nullptr, expected.size());
    comm_->all_gather(d_send, d_recv, count, DType::kBF16, s.handle());
    comm_->wait(s.handle());
    EXPECT_EQ(host<uint8_t>(d_recv, expected.size()), expected) << count;
  }
}

TEST_F(NcclComm, AllReduceAndReduceScatterSums) {
  Stream s(stream_names::kReduce);
  const size_t count = 10007;
  std::vector<float> send(count * P_);
  for (size_t j = 0; j < send.size(); ++j) send[j] = int_value(me_, j, 1);
  void* d_send = dev(send.data(), send.size() * 4);
  void* d_ar = dev(nullptr, send.size() * 4);
  void* d_rs = dev(nullptr, count * 4);
  comm_->all_reduce(d_send, d_ar, send.size(), DType::kF32, ReduceOp::kSum, s.handle());
  comm_->reduce_scatter(d_send, d_rs, count, DType::kF32, ReduceOp::kMax, s.handle());
  comm_->wait(s.handle());
  auto ar = host<float>(d_ar, send.size());
  auto rs = host<float>(d_rs, count);
  size_t bad = 0;
  for (size_t j = 0; j < send.size(); ++j) {
    float want = 0, mx = -1e30f;
    for (int r = 0; r < P_; ++r) {
      want += int_value(r, j, 1);
      mx = std::max(mx, int_value(r, j, 1));
    }
    bad += ar[j] != want;
    if (j / count == static_cast<size_t>(me_)) bad += rs[j % count] != mx;
  }
  EXPECT_EQ(bad, 0u);
}

TEST_F(NcclComm, Bf16AvgInPlaceWithinTolerance) {
  Stream s(stream_names::kReduce);
  const size_t count = 4099;
  std::vector<uint16_t> h(count);
  for (size_t j = 0; j < count; ++j) h[j] = f32_to_bf16(rand_value(me_, j, 2));
  void* d = dev(h.data(), count * 2);
  comm_->all_reduce(d, d, count, DType::kBF16, ReduceOp::kAvg, s.handle());
  comm_->wait(s.handle());
  auto out = host<uint16_t>(d, count);
  double max_rel = 0;
  for (size_t j = 0; j < count; ++j) {
    double want = 0, scale = 0;
    for (int r = 0; r < P_; ++r) {
      double v = bf16_to_f32(f32_to_bf16(rand_value(r, j, 2)));
      want += v;
      scale = std::max(scale, std::fabs(v));
    }
    want /= P_;
    max_rel = std::max(max_rel, std::fabs(bf16_to_f32(out[j]) - want) / scale);
  }
  // bf16 keeps 8 significant bits: each of the size-1 additions and the division may round by
  // half an ulp (2^-9) of a value bounded by size * max|x|.
  EXPECT_LE(max_rel, P_ * P_ * std::ldexp(1.0, -8)) << "max relative error " << max_rel;
}

TEST_F(NcclComm, BroadcastFromEveryRootAndBarrier) {
  Stream s(stream_names::kCompute);
  for (int root = 0; root < P_; ++root) {
    std::vector<uint8_t> expected(4096);
    for (size_t i = 0; i < expected.size(); ++i) expected[i] = pattern_byte(root, i, 3);
    std::vector<uint8_t> init = me_ == root ? expected : std::vector<uint8_t>(4096, 0xEE);
    void* d = dev(init.data(), init.size());
    comm_->broadcast(d, d, 4096, DType::kU8, root, s.handle());
    comm_->wait(s.handle());
    EXPECT_EQ(host<uint8_t>(d, 4096), expected) << root;
  }
  comm_->barrier();
}

TEST_F(NcclComm, HostBuffersAreRejected) {
  std::vector<float> h(4);
  void* d = dev(nullptr, 16);
  EXPECT_THROW(comm_->all_reduce(h.data(), d, 4, DType::kF32, ReduceOp::kSum, nullptr), Error);
  comm_->barrier();
}

}  // namespace
}  // namespace qshard
