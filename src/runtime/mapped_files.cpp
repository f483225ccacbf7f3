#include "runtime/mapped_files.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace qshard {
namespace {

struct Mapping {
  std::atomic<const char*> base{nullptr};
  size_t length = 0;
  char path[512] = {};
};

Mapping g_maps[kMaxMappings];
std::atomic_flag g_lock = ATOMIC_FLAG_INIT;
struct sigaction g_previous {};

void lock() {
  while (g_lock.test_and_set(std::memory_order_acquire)) {
  }
}
void unlock() { g_lock.clear(std::memory_order_release); }

void write_all(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  const char* addr = static_cast<const char*>(info->si_addr);
  for (Mapping& m : g_maps) {
    const char* b = m.base.load(std::memory_order_acquire);
    if (b == nullptr || addr < b || addr >= b + m.length) continue;
    write_all("qshard: error: ");
    write_all(m.path);
    write_all(": the file shrank (was truncated or rewritten) while it was being read; nothing of the step "
              "that read it was saved\n");
    ::_exit(2);
  }
  // Not ours: what would have happened without this handler.
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) {
      g_previous.sa_sigaction(sig, info, ctx);
      return;
    }
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler) {
    g_previous.sa_handler(sig);
    return;
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void register_mapping(const void* base, size_t length, const std::string& path) {
  lock();
  for (Mapping& m : g_maps) {
    if (m.base.load(std::memory_order_relaxed) != nullptr) continue;
    m.length = length;
    const size_t n = std::min(path.size(), sizeof m.path - 1);
    std::memcpy(m.path, path.data(), n);
    m.path[n] = '\0';
    m.base.store(static_cast<const char*>(base), std::memory_order_release);
    break;
  }
  unlock();
}

void unregister_mapping(const void* base) {
  lock();
  for (Mapping& m : g_maps)
    if (m.base.load(std::memory_order_relaxed) == base) {
      m.base.store(nullptr, std::memory_order_release);
      break;
    }
  unlock();
}

void install_sigbus_report() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace qshard
