// Allocators: the caching logic on host memory (any machine), the pinned and plain host
// allocators, and the device pool (label `cuda`, skipped without a GPU).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

namespace qshard {
namespace {

CachingAllocator host_caching(int* raw_frees = nullptr) {
  return CachingAllocator([](size_t n) { return std::malloc(n); },
                          [raw_frees](void* p) {
                            if (raw_frees) ++*raw_frees;
                            std::free(p);
                          });
}

TEST(CachingAllocator, RoundsToSizeClasses) {
  EXPECT_EQ(CachingAllocator::round_size(0), 0u);
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(size_t{1} << 20), size_t{1} << 20);
  EXPECT_EQ(CachingAllocator::round_size((size_t{1} << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(CachingAllocator::round_size((size_t{2} << 20) + 1), size_t{4} << 20);
}

TEST(CachingAllocator, ReusesReleasedBlocksOfTheSameClass) {
  int frees = 0;
  {
    CachingAllocator a = host_caching(&frees);
    void* p = a.allocate(1000);
    std::memset(p, 1, 1000);
    EXPECT_EQ(a.stats().current_bytes, 1024u);
    a.release(p);
    EXPECT_EQ(a.stats().current_bytes, 0u);
    EXPECT_EQ(a.stats().reserved_bytes, 1024u);
    void* q = a.allocate(1024);  // same class: the cached block
    EXPECT_EQ(q, p);
    EXPECT_EQ(a.stats().raw_allocs, 1u);
    void* r = a.allocate(3000);  // other class: a new block
    EXPECT_NE(r, q);
    EXPECT_EQ(a.stats().raw_allocs, 2u);
    EXPECT_EQ(a.stats().current_bytes, 1024u + 3072u);
    EXPECT_EQ(a.stats().peak_bytes, 1024u + 3072u);
    a.release(q);
    a.release(r);
    EXPECT_EQ(a.stats().peak_bytes, 1024u + 3072u);
    a.empty_cache();
    EXPECT_EQ(frees, 2);
    EXPECT_EQ(a.stats().reserved_bytes, 0u);
    EXPECT_EQ(a.allocate(0), nullptr);
    a.release(nullptr);
  }
  EXPECT_EQ(frees, 2);
}

TEST(CachingAllocator, EmptiesTheCacheAndRetriesWhenTheRawAllocatorFails) {
  size_t budget = 4096;
  size_t used = 0;
  CachingAllocator a(
      [&](size_t n) -> void* {
        if (used + n > budget) return nullptr;
        used += n;
        return std::malloc(n);
      },
      [&](void* p) {
        used -= 512;  // only 512-byte blocks are freed in this test
        std::free(p);
      });
  std::vector<void*> small;
  for (int i = 0; i < 8; ++i) small.push_back(a.allocate(512));
  for (void* p : small) a.release(p);
  void* big = a.allocate(2048);  // fails at first (4096 reserved in the cache), then succeeds
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(a.stats().reserved_bytes, 2048u);
  EXPECT_THROW(a.allocate(8192), Error);
  a.release(big);
}

TEST(CachingAllocator, RejectsUnknownPointers) {
  CachingAllocator a = host_caching();
  int x = 0;
  EXPECT_THROW(a.release(&x), Error);
}

TEST(CachingAllocator, IsThreadSafe) {
  CachingAllocator a = host_caching();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&a, t] {
      for (int i = 0; i < 2000; ++i) {
        void* p = a.allocate(512 * (1 + (i + t) % 5));
        static_cast<char*>(p)[0] = 1;
        a.release(p);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(a.stats().current_bytes, 0u);
  EXPECT_LE(a.stats().raw_allocs, 20u);  // at most one block per class per thread
}

TEST(PinnedHostAllocator, AllocatesUsableMemoryAndCounts) {
  PinnedHostAllocator a;
  EXPECT_EQ(a.pinned(), cuda_available());
  auto* p = static_cast<uint8_t*>(a.allocate(100000));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  std::memset(p, 7, 100000);
  EXPECT_EQ(a.stats().current_bytes, CachingAllocator::round_size(100000));
  a.release(p);
  EXPECT_EQ(a.allocate(100000), p);
  a.release(p);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, 0u);
}

TEST(HostAllocator, CountsCurrentAndPeak) {
  HostAllocator a;
  void* p = a.allocate(100);
  void* q = a.allocate(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % HostAllocator::kAlignment, 0u);
  EXPECT_EQ(a.stats().current_bytes, 1100u);
  a.release(p);
  EXPECT_EQ(a.stats().current_bytes, 1000u);
  EXPECT_EQ(a.stats().peak_bytes, 1100u);
  EXPECT_EQ(a.stats().raw_allocs, 2u);
  int x;
  EXPECT_THROW(a.release(&x), Error);
  a.release(q);
  EXPECT_EQ(a.stats().current_bytes, 0u);
}

TEST(DevicePool, CachesDeviceBlocks) {
  if (!cuda_available()) {
    EXPECT_THROW(DevicePool(), Error);
    GTEST_SKIP() << "no GPU";
  }
  DevicePool pool;
  void* p = pool.allocate(3 << 20);
  std::vector<uint8_t> h(3 << 20, 5), back(3 << 20);
  copy_bytes(p, Device::kCuda, h.data(), Device::kCpu, h.size());
  copy_bytes(back.data(), Device::kCpu, p, Device::kCuda, h.size());
  EXPECT_EQ(back, h);
  EXPECT_EQ(pool.stats().current_bytes, size_t{4} << 20);
  pool.release(p);
  EXPECT_EQ(pool.allocate(4 << 20), p);
  EXPECT_EQ(pool.stats().raw_allocs, 1u);
  pool.release(p);
  pool.empty_cache();
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
}

}  // namespace
}  // namespace qshard
