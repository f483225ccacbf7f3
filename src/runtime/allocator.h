// allocator.h: counted memory allocators: a caching device pool, pinned host memory, plain host.
//
// What:
//   CachingAllocator     the caching logic, over any raw allocate/free pair (tests drive it with
//                        host memory). A request is rounded up to its size class (kSmallStep
//                        bytes up to kSmallLimit, kLargeStep above); release() keeps the block on
//                        the free list of its class and a later request of the same class reuses
//                        it. Blocks are never split or merged: the FSDP units of a model ask for
//                        the same few sizes again and again, which exact classes serve well.
//                        When the raw allocator fails, the cache is emptied and the request
//                        retried once.
//   DevicePool           CachingAllocator over cudaMalloc/cudaFree on the current device (CUDA
//                        builds with a GPU; otherwise constructing one throws qshard::Error).
//   PinnedHostAllocator  CachingAllocator over cudaMallocHost/cudaFreeHost when a GPU is present
//                        (pinned() true), else over 64-byte aligned host memory (pinned() false):
//                        CPU builds use the same code path, without the fast DMA.
//   HostAllocator        plain aligned host memory with the same counters (no caching): the CPU
//                        backend's memory accounting.
// Counters (MemoryStats): current_bytes = bytes handed out now (rounded sizes), peak_bytes = the
// largest current_bytes seen, reserved_bytes = bytes held from the raw allocator (handed out +
// cached), raw_allocs = raw allocator calls so far (cache misses).
// Ownership: the allocator owns every block; release() gives one back; destroying the allocator
// frees all blocks, handed out or cached (users must have released them).
// Streams: none. A released device block may be handed out again at once: REQUIRES that work
// using a block is finished, or ordered before the next user's work (same stream, or an event
// wait), before release().
// Thread safety: every member function is thread safe (one mutex per allocator).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace qshard {

struct MemoryStats {
  size_t current_bytes = 0;
  size_t peak_bytes = 0;
  size_t reserved_bytes = 0;
  size_t raw_allocs = 0;
};

class CachingAllocator {
 public:
  static constexpr size_t kSmallStep = 512;
  static constexpr size_t kSmallLimit = size_t{1} << 20;  // 1 MiB
  static constexpr size_t kLargeStep = size_t{2} << 20;   // 2 MiB

  using RawAlloc = std::function<void*(size_t)>;  // returns nullptr on failure
  using RawFree = std::function<void(void*)>;
  CachingAllocator(RawAlloc raw_alloc, RawFree raw_free);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` bytes (0 gives nullptr). Throws qshard::Error when the raw
  // allocator fails even after emptying the cache.
  void* allocate(size_t bytes);
  // Returns a block from allocate() (nullptr is ignored). Throws for an unknown pointer.
  void release(void* p);
  // Frees every cached (not handed-out) block.
  void empty_cache();
  MemoryStats stats() const;
  // The size class of a request.
  static size_t round_size(size_t bytes);

 private:
  void empty_cache_locked();

  RawAlloc raw_alloc_;
  RawFree raw_free_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;      // size class -> cached blocks
  std::unordered_map<void*, size_t> in_use_;       // block -> size class
  MemoryStats stats_;
};

class DevicePool {
 public:
  // Pool on the current CUDA device. Throws qshard::Error without CUDA or GPU.
  DevicePool();
  void* allocate(size_t bytes) { return pool_.allocate(bytes); }
  void release(void* p) { pool_.release(p); }
  void empty_cache() { pool_.empty_cache(); }
  MemoryStats stats() const { return pool_.stats(); }
  int device() const { return device_; }

 private:
  int device_ = -1;
  CachingAllocator pool_;
};

class PinnedHostAllocator {
 public:
  PinnedHostAllocator();
  void* allocate(size_t bytes) { return pool_.allocate(bytes); }
  void release(void* p) { pool_.release(p); }
  void empty_cache() { pool_.empty_cache(); }
  MemoryStats stats() const { return pool_.stats(); }
  // True when blocks are page-locked (cudaMallocHost); false on the aligned-host fallback.
  bool pinned() const { return pinned_; }

 private:
  bool pinned_ = false;
  CachingAllocator pool_;
};

// Page-locked host bytes all PinnedHostAllocators of this process hold from cudaMallocHost (cached
// blocks included), now and at most so far; 0 without a GPU.
int64_t pinned_host_bytes();
int64_t pinned_host_peak_bytes();

// True when the GPU reads the page-locked host memory at `p` through the address `p` itself
// (unified addressing: a kernel may take the host pointer); false without a GPU or for memory
// that is not page-locked.
bool device_reads_at_host_address(const void* p);

class HostAllocator {
 public:
  static constexpr size_t kAlignment = 64;
  ~HostAllocator();
  // Uninitialised, 64-byte aligned; 0 bytes gives nullptr. Throws on exhaustion.
  void* allocate(size_t bytes);
  void release(void* p);
  MemoryStats stats() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> in_use_;
  MemoryStats stats_;
};

}  // namespace qshard
