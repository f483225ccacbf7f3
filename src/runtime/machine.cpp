#include "runtime/machine.h"
#include "runtime/job_settings.h"

#include <chrono>

#include <sys/resource.h>
#include <sys/statvfs.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"
#include "runtime/numbers.h"
#include "runtime/tensor.h"

namespace qshard {

namespace {
// Static initialization of this library: before main(), within milliseconds of the launch.
const std::chrono::steady_clock::time_point kProcessStart = std::chrono::steady_clock::now();
}  // namespace

double seconds_since_launch() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - kProcessStart).count();
}

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

namespace {

// A "Key:   123 kB" line of a /proc file, in bytes; -1 when absent.
double proc_kb(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    std::istringstream s(line.substr(key.size() + 1));
    double kb = -1;
    s >> kb;
    return kb < 0 ? -1 : kb * 1024.0;
  }
  return -1;
}

// A number in a one-line file ("max" or missing: -1).
double file_number(const std::string& path) {
  std::ifstream in(path);
  std::string v;
  if (!(in >> v) || v == "max") return -1;
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  return end && *end == '\0' ? d : -1;
}

void take_min(HostMemory& m, double bytes, const char* name) {
  if (bytes < 0) return;
  const uint64_t b = bytes <= 0 ? 0 : static_cast<uint64_t>(bytes);
  if (m.limited_by.empty() || b < m.bytes) m.bytes = b, m.limited_by = name;
}

}  // namespace

HostMemory host_memory_available() {
  HostMemory m;
  take_min(m, proc_kb("/proc/meminfo", "MemAvailable"), "MemAvailable");
  rlimit r{};
  if (getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY) {
    const double used = proc_kb("/proc/self/status", "VmSize");
    take_min(m, static_cast<double>(r.rlim_cur) - (used < 0 ? 0 : used), "ulimit -v");
  }
  if (getrlimit(RLIMIT_DATA, &r) == 0 && r.rlim_cur != RLIM_INFINITY) {
    const double used = proc_kb("/proc/self/status", "VmData");
    take_min(m, static_cast<double>(r.rlim_cur) - (used < 0 ? 0 : used), "ulimit -d");
  }
  {  // cgroup v2: "0::/path" in /proc/self/cgroup
    std::ifstream in("/proc/self/cgroup");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("0::", 0) != 0) continue;
      const std::string dir = "/sys/fs/cgroup" + line.substr(3);
      const double max = file_number(dir + "/memory.max");
      if (max >= 0) {
        const double cur = file_number(dir + "/memory.current");
        take_min(m, max - (cur < 0 ? 0 : cur), "cgroup memory.max");
      }
    }
  }
  // The variable, when set, wins over the job's runtime.host_memory_bytes (job_settings.h).
  if (const char* env = std::getenv("QSHARD_HOST_MEMORY_BYTES"); env && *env) {
    take_min(m, parse_double("environment variable QSHARD_HOST_MEMORY_BYTES", env, 0, 1e18),
             "QSHARD_HOST_MEMORY_BYTES");
  } else if (const double cap = job_settings().host_memory_bytes; cap > 0) {
    take_min(m, cap, "runtime.host_memory_bytes");
  }
  if (m.limited_by.empty()) m.bytes = UINT64_MAX, m.limited_by = "no known limit";
  return m;
}

uint64_t disk_free_bytes(const std::string& path) {
  std::filesystem::path p = std::filesystem::absolute(path);
  std::error_code ec;
  while (!p.empty() && !std::filesystem::exists(p, ec) && p != p.parent_path()) p = p.parent_path();
  struct statvfs s{};
  if (statvfs(p.c_str(), &s) != 0) return UINT64_MAX;  // unknown: do not refuse
  return static_cast<uint64_t>(s.f_bavail) * static_cast<uint64_t>(s.f_frsize);
}

std::string human_bytes(double bytes) {
  char buf[64];
  if (bytes >= 1e18) std::snprintf(buf, sizeof buf, "%.3g bytes", bytes);
  else if (bytes >= 1e15) std::snprintf(buf, sizeof buf, "%.3g PB", bytes / 1e15);
  else if (bytes >= 1e12) std::snprintf(buf, sizeof buf, "%.3g TB", bytes / 1e12);
  else if (bytes >= 1e9) std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  else std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  return buf;
}

void require_host_memory(double need_bytes, const std::string& what, const std::string& detail) {
  const HostMemory m = host_memory_available();
  if (need_bytes <= static_cast<double>(m.bytes)) return;
  throw InputError(what + " needs at least " + human_bytes(need_bytes) + " of host memory (" + detail + "); " +
                   m.limited_by + " leaves " + human_bytes(static_cast<double>(m.bytes)) + " on this machine");
}

void require_device_memory(double need_bytes, const std::string& what, const std::string& detail) {
  const int64_t free = device_memory_free();
  if (free < 0 || need_bytes <= static_cast<double>(free)) return;
  throw InputError(what + " needs at least " + human_bytes(need_bytes) + " of GPU memory (" + detail + "); the GPU has " +
                   human_bytes(static_cast<double>(free)) + " free");
}

void require_disk(double need_bytes, const std::string& path, const std::string& what) {
  const uint64_t free = disk_free_bytes(path);
  if (need_bytes <= static_cast<double>(free)) return;
  throw InputError(what + " writes about " + human_bytes(need_bytes) + " to " + path + ", but its file system has " +
                   human_bytes(static_cast<double>(free)) + " free");
}

}  // namespace qshard
