#include "runtime/error.h"

#include <atomic>

namespace qshard {
namespace {
std::atomic<int> g_rank{-1};

std::string prefix(const char* file, int line) {
  std::string p = "[rank " + std::to_string(g_rank.load()) + "] ";
  p += file;
  p += ":" + std::to_string(line) + ": ";
  return p;
}
}  // namespace

void set_error_rank(int rank) { g_rank.store(rank); }
int error_rank() { return g_rank.load(); }

void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(prefix(file, line) + msg);
}

void throw_library_error(const char* lib, const char* expr, const std::string& detail, const char* file,
                         int line) {
  throw Error(prefix(file, line) + lib + " call `" + expr + "` failed: " + detail);
}

}  // namespace qshard
