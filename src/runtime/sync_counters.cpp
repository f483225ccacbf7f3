#include "runtime/sync_counters.h"

#include <atomic>

namespace qshard {
namespace {
std::atomic<uint64_t> g_host_syncs{0};
std::atomic<uint64_t> g_device_allocs{0};
std::atomic<uint64_t> g_name_lookups{0};
}  // namespace

SyncAllocCounts sync_alloc_counts() {
  return {g_host_syncs.load(std::memory_order_relaxed), g_device_allocs.load(std::memory_order_relaxed),
          g_name_lookups.load(std::memory_order_relaxed)};
}
void count_host_sync() { g_host_syncs.fetch_add(1, std::memory_order_relaxed); }
void count_device_alloc() { g_device_allocs.fetch_add(1, std::memory_order_relaxed); }
void count_name_lookup() { g_name_lookups.fetch_add(1, std::memory_order_relaxed); }

}  // namespace qshard
