// Streams and events: the same calls on both backends (no-ops on the CPU); on a GPU, a
// cross-stream record + wait orders an async copy chain (label `cuda`).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "runtime/stream.h"
#include "runtime/tensor.h"
#if QSHARD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace qshard {
namespace {

TEST(Stream, NamedAndUsableOnEveryBackend) {
  Stream s(stream_names::kCompute);
  EXPECT_EQ(s.name(), "compute");
  Event e;
  s.record(e);
  s.wait(e);
  s.synchronize();
  e.synchronize();
  EXPECT_TRUE(e.query());
  EXPECT_EQ(s.handle() != nullptr, cuda_available());
  Stream moved = std::move(s);
  EXPECT_EQ(moved.name(), "compute");
  EXPECT_EQ(s.handle(), nullptr);
}

TEST(StreamCuda, EventOrdersWorkAcrossStreams) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU";
#if QSHARD_WITH_CUDA
  Stream h2d(stream_names::kH2D), compute(stream_names::kCompute);
  const size_t n = 16 << 20;
  std::vector<uint8_t> host(n, 3), back(n, 0);
  void* a = device_malloc(n);
  void* b = device_malloc(n);
  Event copied;
  ASSERT_EQ(cudaMemcpyAsync(a, host.data(), n, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(h2d.handle())),
            cudaSuccess);
  h2d.record(copied);
  compute.wait(copied);
  ASSERT_EQ(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(compute.handle())),
            cudaSuccess);
  compute.synchronize();
  copy_bytes(back.data(), Device::kCpu, b, Device::kCuda, n);
  EXPECT_EQ(back, host);
  device_free(a);
  device_free(b);
#endif
}

}  // namespace
}  // namespace qshard
