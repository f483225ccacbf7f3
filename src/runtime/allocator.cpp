#include "runtime/allocator.h"
#include "runtime/sync_counters.h"

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <new>
#include <string>

#include "runtime/error.h"
#include "runtime/parallel.h"
#include "runtime/tensor.h"
#if QSHARD_WITH_CUDA
#include "runtime/cuda_check.h"
#endif

namespace qshard {

namespace {
// Page-locked bytes held by every PinnedHostAllocator of the process (pinned_host_bytes()).
struct PinnedCount {
  std::mutex mu;
  std::unordered_map<void*, int64_t> blocks;
  int64_t current = 0, peak = 0;
};
PinnedCount& pinned_counter() {
  static PinnedCount c;
  return c;
}
[[maybe_unused]] void pinned_count(void* p, int64_t bytes) {  // bytes 0: p is freed
  PinnedCount& c = pinned_counter();
  std::lock_guard<std::mutex> lock(c.mu);
  if (bytes > 0) {
    c.blocks[p] = bytes;
    c.current += bytes;
    c.peak = std::max(c.peak, c.current);
  } else if (auto it = c.blocks.find(p); it != c.blocks.end()) {
    c.current -= it->second;
    c.blocks.erase(it);
  }
}
}  // namespace

int64_t pinned_host_bytes() {
  std::lock_guard<std::mutex> lock(pinned_counter().mu);
  return pinned_counter().current;
}
int64_t pinned_host_peak_bytes() {
  std::lock_guard<std::mutex> lock(pinned_counter().mu);
  return pinned_counter().peak;
}
namespace {
void* aligned_host_alloc(size_t bytes) {
  size_t rounded = (bytes + HostAllocator::kAlignment - 1) / HostAllocator::kAlignment * HostAllocator::kAlignment;
  return std::aligned_alloc(HostAllocator::kAlignment, rounded);
}
}  // namespace

// ---- CachingAllocator --------------------------------------------------------------------------

CachingAllocator::CachingAllocator(RawAlloc raw_alloc, RawFree raw_free)
    : raw_alloc_(std::move(raw_alloc)), raw_free_(std::move(raw_free)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  empty_cache_locked();
  for (auto& [p, size] : in_use_) raw_free_(p);
  in_use_.clear();
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes == 0) return 0;
  size_t step = bytes <= kSmallLimit ? kSmallStep : kLargeStep;
  return (bytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  size_t cls = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  auto it = free_.find(cls);
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
  } else {
    p = raw_alloc_(cls);
    if (!p && !free_.empty()) {
      empty_cache_locked();
      p = raw_alloc_(cls);
    }
    if (!p)
      throw_error(__FILE__, __LINE__,
                  "allocation of " + std::to_string(bytes) + " bytes (class " + std::to_string(cls) +
                      ") failed; " + std::to_string(stats_.reserved_bytes) + " bytes reserved");
    stats_.reserved_bytes += cls;
    stats_.raw_allocs += 1;
  }
  in_use_.emplace(p, cls);
  stats_.current_bytes += cls;
  if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
  return p;
}

void CachingAllocator::release(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_use_.find(p);
  QS_CHECK(it != in_use_.end(), "release of a pointer this allocator did not hand out");
  size_t cls = it->second;
  in_use_.erase(it);
  stats_.current_bytes -= cls;
  free_[cls].push_back(p);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  empty_cache_locked();
}

void CachingAllocator::empty_cache_locked() {
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) {
      raw_free_(p);
      stats_.reserved_bytes -= cls;
    }
  }
  free_.clear();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

// ---- DevicePool --------------------------------------------------------------------------------

#if QSHARD_WITH_CUDA
namespace {
int current_device_or_throw() {
  if (!cuda_available()) throw_error(__FILE__, __LINE__, "DevicePool needs a CUDA GPU; none is visible");
  int d = -1;
  QS_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}
}  // namespace

DevicePool::DevicePool()
    : device_(current_device_or_throw()),
      pool_(
          [](size_t n) -> void* {
            void* p = nullptr;
            count_device_alloc();
            if (cudaMalloc(&p, n) != cudaSuccess) {
              cudaGetLastError();  // out of memory is not sticky; clear it so the retry can run
              return nullptr;
            }
            return p;
          },
          [](void* p) { cudaFree(p); }) {}

namespace {
// Large pinned blocks: plain pages first touched on every host thread (the kernel zeroes them in
// parallel), then page-locked and mapped with cudaHostRegister. cudaMallocHost does both on one
// thread: about 1.5 GB/s, 20-30 s for a 70B base's 34 GB of offloaded shards (H200 host).
constexpr size_t kRegisterAbove = size_t{64} << 20;
constexpr size_t kTouchChunk = size_t{32} << 20;
std::mutex& registered_mu() {
  static std::mutex mu;
  return mu;
}
std::unordered_map<void*, bool>& registered() {  // block -> came from cudaHostRegister
  static std::unordered_map<void*, bool> m;
  return m;
}

void* pinned_alloc(size_t n) {
  void* p = nullptr;
  if (n >= kRegisterAbove) {
    p = aligned_host_alloc(n);
    if (p) {
      auto* bytes = static_cast<unsigned char*>(p);
      const size_t chunks = (n + kTouchChunk - 1) / kTouchChunk;
      parallel_for(chunks, host_threads(32), [&](size_t i) {
        const size_t at = i * kTouchChunk;
        std::memset(bytes + at, 0, std::min(kTouchChunk, n - at));
      });
      if (cudaHostRegister(p, n, cudaHostRegisterDefault) == cudaSuccess) {
        std::lock_guard<std::mutex> lock(registered_mu());
        registered()[p] = true;
        return p;
      }
      cudaGetLastError();  // not sticky: fall back to cudaMallocHost
      std::free(p);
      p = nullptr;
    }
  }
  if (cudaMallocHost(&p, n) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void pinned_free(void* p) {
  bool was_registered = false;
  {
    std::lock_guard<std::mutex> lock(registered_mu());
    was_registered = registered().erase(p) > 0;
  }
  if (was_registered) {
    cudaHostUnregister(p);
    std::free(p);
  } else {
    cudaFreeHost(p);
  }
}
}  // namespace

PinnedHostAllocator::PinnedHostAllocator()
    : pinned_(cuda_available()),
      pool_(
          [pinned = pinned_](size_t n) -> void* {
            if (!pinned) return aligned_host_alloc(n);
            void* p = pinned_alloc(n);
            if (p) pinned_count(p, static_cast<int64_t>(n));
            return p;
          },
          [pinned = pinned_](void* p) {
            if (pinned) {
              pinned_count(p, 0);
              pinned_free(p);
            } else {
              std::free(p);
            }
          }) {}

bool device_reads_at_host_address(const void* p) {
  if (!cuda_available()) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // not sticky
    return false;
  }
  return attr.type == cudaMemoryTypeHost && attr.devicePointer == p;
}
#else
bool device_reads_at_host_address(const void*) { return false; }

DevicePool::DevicePool()
    : pool_([](size_t) -> void* { return nullptr; }, [](void*) {}) {
  throw_error(__FILE__, __LINE__, "DevicePool needs a CUDA build (this is a CPU-only build)");
}

PinnedHostAllocator::PinnedHostAllocator()
    : pinned_(false), pool_([](size_t n) { return aligned_host_alloc(n); }, [](void* p) { std::free(p); }) {}
#endif

// ---- HostAllocator -----------------------------------------------------------------------------

HostAllocator::~HostAllocator() {
  for (auto& [p, n] : in_use_) std::free(p);
}

void* HostAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = aligned_host_alloc(bytes);
  if (!p) throw_error(__FILE__, __LINE__, "host allocation of " + std::to_string(bytes) + " bytes failed");
  std::lock_guard<std::mutex> lock(mu_);
  in_use_.emplace(p, bytes);
  stats_.current_bytes += bytes;
  stats_.reserved_bytes += bytes;
  stats_.raw_allocs += 1;
  if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
  return p;
}

void HostAllocator::release(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_use_.find(p);
  QS_CHECK(it != in_use_.end(), "release of a pointer this allocator did not hand out");
  stats_.current_bytes -= it->second;
  stats_.reserved_bytes -= it->second;
  in_use_.erase(it);
  std::free(p);
}

MemoryStats HostAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace qshard
