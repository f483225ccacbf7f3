// machine.h: what this machine has, asked before a command builds anything large, so that a
// model too big for it is a clear error naming the bytes instead of an out-of-memory kill, a
// failed allocation deep inside, or a full disk after hours.
//
// host_memory_available: the bytes this process can still allocate: the smallest of
//   /proc/meminfo's MemAvailable, the address-space limit (ulimit -v: RLIMIT_AS minus the
//   process's current VmSize), the data limit (RLIMIT_DATA minus VmData) and the cgroup v2 limit
//   (memory.max minus memory.current); `limited_by` names which one. QSHARD_HOST_MEMORY_BYTES
//   (when set) caps it further, for tests and for users who share a machine.
// disk_free_bytes: free bytes for an unprivileged writer on the file system that holds `path`
//   (or its nearest existing parent folder).
// require_host_memory / require_disk / require_device_memory: InputError "<what> needs N GB of host memory (<detail>);
//   <limited_by> leaves M GB" when need > what is there.
// human_bytes: "12.3 GB" in decimal units (1 GB = 1e9 bytes; the progress line's format_bytes
//   counts in 1024s), "3.54e+20 bytes" past 1e18; takes doubles, as hostile sizes pass int64.
// Thread safety: free functions reading /proc and limits; no shared state.
#pragma once

#include <cstdint>
#include <string>

namespace qshard {

struct HostMemory {
  uint64_t bytes = 0;
  std::string limited_by;  // "MemAvailable", "ulimit -v", "ulimit -d", "cgroup memory.max", "QSHARD_HOST_MEMORY_BYTES"
};

HostMemory host_memory_available();
uint64_t disk_free_bytes(const std::string& path);
std::string human_bytes(double bytes);

// Seconds since this process started (its static initialization, before main()).
double seconds_since_launch();
// The most resident memory this process has used so far (getrusage's ru_maxrss), bytes.
int64_t peak_rss_bytes();
void require_host_memory(double need_bytes, const std::string& what, const std::string& detail);
void require_disk(double need_bytes, const std::string& path, const std::string& what);
// The same for the current GPU's free memory (cudaMemGetInfo); nothing when it is unknown.
void require_device_memory(double need_bytes, const std::string& what, const std::string& detail);

}  // namespace qshard
