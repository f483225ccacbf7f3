// sync_counters.h: process-wide counts of host synchronizations and raw device allocations.
//
// What: the promise "inside a training step: no host synchronization and no device allocation"
// made checkable. Every place in the runtime that blocks the host on device work (Stream and
// Event synchronize, synchronous copies to or from the device, the MPI communicator's staging
// waits, NcclCommunicator::wait) calls count_host_sync(); every raw device allocation
// (cudaMalloc behind Tensor storage or a DevicePool cache miss) calls count_device_alloc().
// Name lookups are counted too, on every backend: every lookup by name in a flat layout
// (shard/flat_layout.h: FlatLayout::find) or a module tree (checkpoint/module_tree.h: Module::child,
// slot, find_module) calls count_name_lookup(), so "the step does no string work" is checkable: a
// step binds through entries and slots found once, before it starts.
// A step reads sync_alloc_counts() before and after and compares (DeviceContext::StepScope).
// On the CPU backend nothing is counted: the work is synchronous and host memory is not device
// memory, so the counts stay at zero.
// Thread safety: atomic counters, any thread.
#pragma once

#include <cstdint>

namespace qshard {

struct SyncAllocCounts {
  uint64_t host_syncs = 0;     // host waits on device work
  uint64_t device_allocs = 0;  // cudaMalloc calls (pool misses and direct storage)
  uint64_t name_lookups = 0;   // lookups of a tensor or module by name (every backend)
};

SyncAllocCounts sync_alloc_counts();
void count_host_sync();
void count_device_alloc();
void count_name_lookup();

}  // namespace qshard
