#include "runtime/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace qshard {

void parallel_for(size_t count, int threads, const std::function<void(size_t)>& body) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr failure;
  auto worker = [&] {
    for (size_t i = next++; i < count; i = next++) {
      try {
        body(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mu);
        if (!failure) failure = std::current_exception();
        next = count;
      }
    }
  };
  const size_t n = std::min(count, static_cast<size_t>(std::max(1, threads)));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

int host_threads(int cap) {
  return static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1u, static_cast<unsigned>(std::max(1, cap))));
}

}  // namespace qshard
