// parallel.h: independent host work items on a few threads.
//
// parallel_for(count, threads, body): body(i) for every i in [0, count), each exactly once, on up
//   to `threads` threads (the caller's included; fewer when count is smaller). Items are taken in
//   order from a shared counter, so an item's result must not depend on which thread ran it. The
//   first exception thrown by a body stops the taking of new items and is rethrown once every
//   thread has finished.
// host_threads(cap): std::thread::hardware_concurrency() clamped to [1, cap].
// Thread safety: body runs concurrently with itself; it must write only what item i owns.
#pragma once

#include <cstddef>
#include <functional>

namespace qshard {

void parallel_for(size_t count, int threads, const std::function<void(size_t)>& body);
int host_threads(int cap);

}  // namespace qshard
