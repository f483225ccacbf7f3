// MpiCommunicator against serial references computed by every rank from known per-rank data.
//
// Tolerance: zero. MpiCommunicator defines its reduction order (rank 0, 1, ..., size-1, in f32,
// one rounding to bf16/f16 at the end), so every expected value below is that serial loop and
// every comparison is bitwise: integer-valued inputs (exact sums) and non-integer inputs (sums
// that round) alike.
// Counts are chosen not to divide by anything (1, 7, 1000003) and smaller than the world size.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/comm_test_util.h"
#include "runtime/mpi_communicator.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"
#include "runtime/world.h"

namespace qshard {
namespace {

using test::int_value;
using test::pattern_byte;
using test::rand_value;

std::vector<uint8_t> pattern(int rank, size_t nbytes, uint64_t salt) {
  std::vector<uint8_t> v(nbytes);
  for (size_t i = 0; i < nbytes; ++i) v[i] = pattern_byte(rank, i, salt);
  return v;
}

float serial(ReduceOp op, int P, size_t j, float (*value)(int, size_t, uint64_t), uint64_t salt) {
  float acc = value(0, j, salt);
  for (int r = 1; r < P; ++r) {
    float v = value(r, j, salt);
    acc = op == ReduceOp::kMax ? (v > acc ? v : acc) : acc + v;
  }
  return op == ReduceOp::kAvg ? acc / static_cast<float>(P) : acc;
}

size_t first_mismatch(const void* a, const void* b, size_t n, size_t esize) {
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(static_cast<const char*>(a) + i * esize, static_cast<const char*>(b) + i * esize, esize) != 0)
      return i;
  return n;
}

class MpiComm : public ::testing::Test {
 protected:
  MpiComm() : comm_(World::get().comm()), P_(comm_.size()), me_(comm_.rank()) {}
  MpiCommunicator comm_;
  int P_;
  int me_;
};

TEST_F(MpiComm, SizeAndRankMatchTheWorld) {
  EXPECT_EQ(comm_.size(), World::get().size());
  EXPECT_EQ(comm_.rank(), World::get().rank());
  EXPECT_STREQ(comm_.name(), "mpi");
}

TEST_F(MpiComm, AllGatherIsTheConcatenationBitwise) {
  struct Case { size_t count; DType dtype; };
  for (Case c : {Case{1, DType::kF32}, Case{7, DType::kBF16}, Case{7, DType::kU8}, Case{7, DType::kI64},
                 Case{1000003, DType::kF32}, Case{1000003, DType::kU8}}) {
    size_t bytes = c.count * dtype_size(c.dtype);
    uint64_t salt = c.count * 10 + static_cast<int>(c.dtype);
    std::vector<uint8_t> send = pattern(me_, bytes, salt);
    std::vector<uint8_t> recv(bytes * P_, 0xEE), expected;
    for (int r = 0; r < P_; ++r) {
      auto p = pattern(r, bytes, salt);
      expected.insert(expected.end(), p.begin(), p.end());
    }
    comm_.all_gather(send.data(), recv.data(), c.count, c.dtype, nullptr);
    EXPECT_EQ(first_mismatch(recv.data(), expected.data(), recv.size(), 1), recv.size())
        << "count " << c.count << " dtype " << dtype_torch_name(c.dtype);
  }
}

TEST_F(MpiComm, AllGatherInPlace) {
  for (size_t count : {size_t{1}, size_t{7}, size_t{1001}}) {
    std::vector<uint8_t> recv(count * 4 * P_, 0xEE), expected;
    auto mine = pattern(me_, count * 4, count);
    std::memcpy(recv.data() + me_ * count * 4, mine.data(), mine.size());
    for (int r = 0; r < P_; ++r) {
      auto p = pattern(r, count * 4, count);
      expected.insert(expected.end(), p.begin(), p.end());
    }
    comm_.all_gather(recv.data() + me_ * count * 4, recv.data(), count, DType::kF32, nullptr);
    EXPECT_EQ(recv, expected) << "count " << count;
  }
}

// reduce_scatter of f32 for one value generator, op and placement.
void check_reduce_scatter(MpiCommunicator& comm, size_t count, ReduceOp op,
                          float (*value)(int, size_t, uint64_t), bool in_place, uint64_t salt) {
  int P = comm.size(), me = comm.rank();
  std::vector<float> send(count * P), recv(count, -1.0f), expected(count);
  for (size_t j = 0; j < send.size(); ++j) send[j] = value(me, j, salt);
  for (size_t i = 0; i < count; ++i) expected[i] = serial(op, P, me * count + i, value, salt);
  float* out = in_place ? send.data() + me * count : recv.data();
  comm.reduce_scatter(send.data(), out, count, DType::kF32, op, nullptr);
  size_t bad = first_mismatch(out, expected.data(), count, 4);
  EXPECT_EQ(bad, count) << "count " << count << " op " << static_cast<int>(op) << " in_place " << in_place
                        << (bad < count ? " got " + std::to_string(out[bad]) + " want " + std::to_string(expected[bad])
                                        : std::string());
}

TEST_F(MpiComm, ReduceScatterEqualsSerialSumExactInputs) {
  for (size_t count : {size_t{1}, size_t{7}, size_t{10007}})
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax})
      check_reduce_scatter(comm_, count, op, int_value, false, 1);
}

TEST_F(MpiComm, ReduceScatterEqualsSerialSumInRankOrder) {
  for (size_t count : {size_t{1}, size_t{7}, size_t{10007}})
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax})
      check_reduce_scatter(comm_, count, op, rand_value, false, 2);
}

TEST_F(MpiComm, ReduceScatterInPlace) {
  for (size_t count : {size_t{1}, size_t{7}, size_t{1001}}) {
    check_reduce_scatter(comm_, count, ReduceOp::kSum, rand_value, true, 3);
    check_reduce_scatter(comm_, count, ReduceOp::kAvg, int_value, true, 4);
  }
}

void check_all_reduce(MpiCommunicator& comm, size_t count, ReduceOp op, float (*value)(int, size_t, uint64_t),
                      bool in_place, uint64_t salt) {
  int P = comm.size(), me = comm.rank();
  std::vector<float> send(count), recv(count, -1.0f), expected(count);
  for (size_t j = 0; j < count; ++j) {
    send[j] = value(me, j, salt);
    expected[j] = serial(op, P, j, value, salt);
  }
  float* out = in_place ? send.data() : recv.data();
  comm.all_reduce(send.data(), out, count, DType::kF32, op, nullptr);
  size_t bad = first_mismatch(out, expected.data(), count, 4);
  EXPECT_EQ(bad, count) << "count " << count << " op " << static_cast<int>(op) << " in_place " << in_place
                        << (bad < count ? " at " + std::to_string(bad) + " got " + std::to_string(out[bad]) +
                                              " want " + std::to_string(expected[bad])
                                        : std::string());
}

TEST_F(MpiComm, AllReduceEqualsSerialSumExactInputs) {
  for (size_t count : {size_t{1}, size_t{2}, size_t{7}, size_t{1000003}})
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax})
      check_all_reduce(comm_, count, op, int_value, false, 5);
}

TEST_F(MpiComm, AllReduceEqualsSerialSumInRankOrder) {
  for (size_t count : {size_t{1}, size_t{3}, size_t{7}, size_t{100003}})
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
      check_all_reduce(comm_, count, op, rand_value, false, 6);
}

TEST_F(MpiComm, AllReduceInPlace) {
  for (size_t count : {size_t{1}, size_t{7}, size_t{10007}}) {
    check_all_reduce(comm_, count, ReduceOp::kSum, rand_value, true, 7);
    check_all_reduce(comm_, count, ReduceOp::kMax, int_value, true, 8);
  }
}

// bf16 / f16: widened to f32, summed in rank order, rounded once.
TEST_F(MpiComm, HalfPrecisionReducesInF32AndRoundsOnce) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    auto to_half = [dt](float f) { return dt == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f); };
    auto to_f32 = [dt](uint16_t h) { return dt == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h); };
    const size_t count = 1001;
    std::vector<uint16_t> send(count * P_), out_ar(count * P_), out_rs(count);
    for (size_t j = 0; j < send.size(); ++j) send[j] = to_half(rand_value(me_, j, 9));
    comm_.all_reduce(send.data(), out_ar.data(), send.size(), dt, ReduceOp::kSum, nullptr);
    comm_.reduce_scatter(send.data(), out_rs.data(), count, dt, ReduceOp::kAvg, nullptr);
    size_t bad_ar = 0, bad_rs = 0;
    for (size_t j = 0; j < send.size(); ++j) {
      float acc = to_f32(to_half(rand_value(0, j, 9)));
      for (int r = 1; r < P_; ++r) acc += to_f32(to_half(rand_value(r, j, 9)));
      bad_ar += out_ar[j] != to_half(acc);
      if (j / count == static_cast<size_t>(me_)) bad_rs += out_rs[j % count] != to_half(acc / static_cast<float>(P_));
    }
    EXPECT_EQ(bad_ar, 0u) << dtype_torch_name(dt);
    EXPECT_EQ(bad_rs, 0u) << dtype_torch_name(dt);
  }
}

TEST_F(MpiComm, IntegerSumAndMax) {
  const size_t count = 13;
  std::vector<int64_t> s64(count), r64(count);
  std::vector<int32_t> s32(count * P_), r32(count);
  for (size_t j = 0; j < count; ++j) s64[j] = (int64_t{1} << 40) * (me_ + 1) + static_cast<int64_t>(j);
  for (size_t j = 0; j < s32.size(); ++j) s32[j] = static_cast<int32_t>(int_value(me_, j, 10));
  comm_.all_reduce(s64.data(), r64.data(), count, DType::kI64, ReduceOp::kSum, nullptr);
  comm_.reduce_scatter(s32.data(), r32.data(), count, DType::kI32, ReduceOp::kMax, nullptr);
  for (size_t j = 0; j < count; ++j) {
    int64_t want = 0;
    int32_t want_max = INT32_MIN;
    for (int r = 0; r < P_; ++r) {
      want += (int64_t{1} << 40) * (r + 1) + static_cast<int64_t>(j);
      want_max = std::max(want_max, static_cast<int32_t>(int_value(r, me_ * count + j, 10)));
    }
    EXPECT_EQ(r64[j], want) << j;
    EXPECT_EQ(r32[j], want_max) << j;
  }
}

// f64 sums (loss sums, squared gradient norms) keep what f32 would lose: 1e8 + 1e-3 * rank.
TEST_F(MpiComm, Float64SumAndAvgInRankOrder) {
  std::vector<double> s(3), r(3), a(3);
  for (size_t j = 0; j < s.size(); ++j) s[j] = 1e8 + 1e-3 * (me_ + 1) + static_cast<double>(j);
  comm_.all_reduce(s.data(), r.data(), s.size(), DType::kF64, ReduceOp::kSum, nullptr);
  comm_.all_reduce(s.data(), a.data(), s.size(), DType::kF64, ReduceOp::kAvg, nullptr);
  for (size_t j = 0; j < s.size(); ++j) {
    double want = 0;
    for (int q = 0; q < P_; ++q) want += 1e8 + 1e-3 * (q + 1) + static_cast<double>(j);
    EXPECT_EQ(r[j], want) << j;
    EXPECT_EQ(a[j], want / P_) << j;
  }
  if (P_ > 1) {
    EXPECT_NE(static_cast<float>(r[0]), r[0]) << "the sum needs more than f32";
  }
}

TEST_F(MpiComm, BroadcastFromEveryRoot) {
  for (int root = 0; root < P_; ++root) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{100003}}) {
      auto expected = pattern(root, count * 2, root * 100 + count);
      std::vector<uint8_t> recv(count * 2, 0xEE);
      std::vector<uint8_t> send = me_ == root ? expected : std::vector<uint8_t>();
      comm_.broadcast(me_ == root ? send.data() : nullptr, recv.data(), count, DType::kBF16, root, nullptr);
      EXPECT_EQ(recv, expected) << "root " << root << " count " << count;
      // In place: the root's buffer is both.
      std::vector<uint8_t> buf = me_ == root ? expected : std::vector<uint8_t>(count * 2, 0xEE);
      comm_.broadcast(buf.data(), buf.data(), count, DType::kBF16, root, nullptr);
      EXPECT_EQ(buf, expected) << "in place, root " << root << " count " << count;
    }
  }
}

// Calls past MPI's int count (an 8B model's f32 root unit is 4.2 GB) go in pieces; a lowered
// threshold runs that path with small buffers: the same bits as one call.
TEST_F(MpiComm, CallsPastTheCountLimitGoInPieces) {
  MpiCommunicator::set_split_threshold(1000);
  for (DType dt : {DType::kF32, DType::kU8}) {
    const size_t count = 1000003, bytes = count * dtype_size(dt);
    std::vector<uint8_t> send = pattern(me_, bytes, 77), recv(bytes * P_, 0xEE), expected;
    for (int r = 0; r < P_; ++r) {
      auto p = pattern(r, bytes, 77);
      expected.insert(expected.end(), p.begin(), p.end());
    }
    comm_.all_gather(send.data(), recv.data(), count, dt, nullptr);
    EXPECT_EQ(recv, expected) << "split all_gather, dtype " << dtype_torch_name(dt);
  }
  for (int root = 0; root < P_; ++root) {
    const size_t count = 100003;
    auto expected = pattern(root, count * 2, 500 + root);
    std::vector<uint8_t> buf = me_ == root ? expected : std::vector<uint8_t>(count * 2, 0xEE);
    comm_.broadcast(buf.data(), buf.data(), count, DType::kBF16, root, nullptr);
    EXPECT_EQ(buf, expected) << "split broadcast, root " << root;
  }
  MpiCommunicator::set_split_threshold(0);
}

TEST_F(MpiComm, ZeroCountIsANoOp) {
  float x = 1.0f;
  comm_.all_reduce(&x, &x, 0, DType::kF32, ReduceOp::kSum, nullptr);
  comm_.all_gather(&x, &x, 0, DType::kF32, nullptr);
  EXPECT_EQ(x, 1.0f);
}

// Asserts ordering, with a wide margin: no rank leaves the barrier before rank 0 has entered it.
TEST_F(MpiComm, BarrierHoldsEveryRankUntilAllArrive) {
  comm_.barrier();
  auto t0 = std::chrono::steady_clock::now();
  if (me_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  comm_.barrier();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (P_ > 1) {
    EXPECT_GE(ms, 100.0);
  }
}

TEST_F(MpiComm, InvalidCallsThrowOnEveryRank) {
  std::vector<int32_t> v(4);
  std::vector<uint8_t> u(4);
  EXPECT_THROW(comm_.all_reduce(v.data(), v.data(), 4, DType::kI32, ReduceOp::kAvg, nullptr), Error);
  EXPECT_THROW(comm_.all_reduce(u.data(), u.data(), 4, DType::kU8, ReduceOp::kSum, nullptr), Error);
  EXPECT_THROW(comm_.broadcast(u.data(), u.data(), 4, DType::kU8, P_, nullptr), Error);
  try {
    comm_.all_reduce(v.data(), v.data(), 4, DType::kI32, ReduceOp::kAvg, nullptr);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[rank " + std::to_string(me_) + "]"), std::string::npos) << e.what();
  }
  comm_.barrier();  // still usable
}

// ---- device buffers through pinned staging (label `cuda`; skipped without a GPU) ----------------

class MpiCommDevice : public MpiComm {
 protected:
  void SetUp() override {
    if (World::get().device() < 0) GTEST_SKIP() << "no GPU";
  }
  void* to_device(const void* host, size_t bytes) {
    void* d = device_malloc(bytes);
    copy_bytes(d, Device::kCuda, host, Device::kCpu, bytes);
    owned_.push_back(d);
    return d;
  }
  template <class T>
  std::vector<T> from_device(const void* d, size_t n) {
    std::vector<T> h(n);
    copy_bytes(h.data(), Device::kCpu, d, Device::kCuda, n * sizeof(T));
    return h;
  }
  ~MpiCommDevice() override {
    for (void* p : owned_) device_free(p);
  }
  std::vector<void*> owned_;
};

TEST_F(MpiCommDevice, AllGatherDeviceToDevice) {
  Stream stream(stream_names::kGather);
  const size_t count = 1000003;
  auto mine = pattern(me_, count, 11);
  void* d_send = to_device(mine.data(), count);
  std::vector<uint8_t> init(count * P_, 0xEE), expected;
  void* d_recv = to_device(init.data(), init.size());
  for (int r = 0; r < P_; ++r) {
    auto p = pattern(r, count, 11);
    expected.insert(expected.end(), p.begin(), p.end());
  }
  comm_.all_gather(d_send, d_recv, count, DType::kU8, stream.handle());
  EXPECT_EQ(from_device<uint8_t>(d_recv, count * P_), expected);
}

TEST_F(MpiCommDevice, ReduceScatterHostToDeviceAndAllReduceBf16InPlace) {
  Stream stream(stream_names::kReduce);
  const size_t count = 1001;
  std::vector<float> send(count * P_);
  for (size_t j = 0; j < send.size(); ++j) send[j] = rand_value(me_, j, 12);
  std::vector<float> zeros(count, 0.0f);
  void* d_out = to_device(zeros.data(), count * 4);
  comm_.reduce_scatter(send.data(), d_out, count, DType::kF32, ReduceOp::kSum, stream.handle());
  auto got = from_device<float>(d_out, count);
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    float want = serial(ReduceOp::kSum, P_, me_ * count + i, rand_value, 12);
    bad += std::memcmp(&got[i], &want, 4) != 0;
  }
  EXPECT_EQ(bad, 0u);

  std::vector<uint16_t> h(count);
  for (size_t j = 0; j < count; ++j) h[j] = f32_to_bf16(rand_value(me_, j, 13));
  void* d_buf = to_device(h.data(), count * 2);
  comm_.all_reduce(d_buf, d_buf, count, DType::kBF16, ReduceOp::kSum, stream.handle());
  auto out = from_device<uint16_t>(d_buf, count);
  size_t bad16 = 0;
  for (size_t j = 0; j < count; ++j) {
    float acc = bf16_to_f32(f32_to_bf16(rand_value(0, j, 13)));
    for (int r = 1; r < P_; ++r) acc += bf16_to_f32(f32_to_bf16(rand_value(r, j, 13)));
    bad16 += out[j] != f32_to_bf16(acc);
  }
  EXPECT_EQ(bad16, 0u);
}

TEST_F(MpiCommDevice, BroadcastDevice) {
  Stream stream(stream_names::kCompute);
  for (int root = 0; root < P_; ++root) {
    auto expected = pattern(root, 4096, 14);
    std::vector<uint8_t> init = me_ == root ? expected : std::vector<uint8_t>(4096, 0xEE);
    void* d = to_device(init.data(), init.size());
    comm_.broadcast(d, d, 1024, DType::kF32, root, stream.handle());
    EXPECT_EQ(from_device<uint8_t>(d, 4096), expected) << "root " << root;
  }
}

}  // namespace
}  // namespace qshard
