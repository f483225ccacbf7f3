#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/log.h"

namespace qshard {
namespace {

struct Holder {
  std::string text;  // the file's text, as read ("" = nobody)
  std::string host;  // "" when the text is not {"host": H, "pid": P}
  long pid = 0;
};

Holder read_holder(int fd) {
  Holder h;
  char buf[4096];
  const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  if (n <= 0) return h;
  h.text.assign(buf, static_cast<size_t>(n));
  const auto j = nlohmann::json::parse(h.text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("host") && j["host"].is_string() && j.contains("pid") &&
      j["pid"].is_number_integer()) {
    h.host = j["host"].get<std::string>();
    h.pid = j["pid"].get<long>();
  }
  return h;
}

std::string describe(const Holder& h) {
  if (h.host.empty()) {  // its first 80 bytes, printable (a NUL cut the message short)
    std::string shown;
    for (const unsigned char c : h.text.substr(0, 80))
      shown += c >= 0x20 && c < 0x7f ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
    return "an unknown job (the lock file reads '" + shown + "')";
  }
  return fmt::format("pid {} on host {}", h.pid, h.host);
}

[[noreturn]] void in_use(const std::string& dir, const std::string& path, const Holder& h, bool may_be_gone) {
  throw InputError(fmt::format(
      "checkpoint.dir {} is in use by another job: {} (lock file {}); {}", dir, describe(h), path,
      may_be_gone ? "qshard cannot tell from this host whether that job still runs: if it does not, delete the lock "
                    "file; or choose another checkpoint.dir"
                  : "wait for it to end, or choose another checkpoint.dir"));
}

bool same_inode(int fd, const std::string& path) {
  struct stat a {}, b {};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

std::string this_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

RunLock::RunLock(const std::string& dir) : path_(dir + "/" + kRunLockFile) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) made_dir_ = dir;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError("checkpoint.dir " + dir + ": cannot create it: " + ec.message());
  const std::string host = this_host_name();
  const long me = static_cast<long>(::getpid());
  for (int attempt = 0;; ++attempt) {
    // Never through a symbolic link (the holder's line would be written over its target) and only
    // a regular file (a FIFO or a device there is not a lock qshard made).
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    struct stat st {};
    const int open_err = fd < 0 ? errno : 0;
    if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      if (fd >= 0) ::close(fd);
      std::error_code ec;
      if (!made_dir_.empty()) std::filesystem::remove(made_dir_, ec);
      const std::string what = open_err == ELOOP ? "is a symbolic link"
                               : fd >= 0         ? "is not a regular file (a FIFO, socket or device)"
                                                 : std::string("cannot be created: ") + std::strerror(open_err);
      throw InputError(fmt::format("checkpoint.dir {}: its lock file {} {}; qshard makes it as a regular file "
                                   "(remove what is there)",
                                   dir, path_, what));
    }
    bool flock_works = true;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        const Holder h = read_holder(fd);
        ::close(fd);
        in_use(dir, path_, h, /*may_be_gone=*/false);
      }
      if (err != ENOLCK && err != EOPNOTSUPP && err != EINVAL) {
        ::close(fd);
        throw InputError(fmt::format("checkpoint.dir {}: cannot lock {}: {}", dir, path_, std::strerror(err)));
      }
      flock_works = false;  // the file alone says who holds the folder
    }
    // A holder releasing between our open and our flock removed the file we locked: start over.
    if (!same_inode(fd, path_)) {
      ::close(fd);
      if (attempt < 100) continue;
      throw InputError(fmt::format("checkpoint.dir {}: its lock file {} keeps changing; another job starts or ends "
                                   "there",
                                   dir, path_));
    }
    const Holder h = read_holder(fd);
    if (!h.text.empty() && !(h.host == host && h.pid == me)) {
      // Nobody holds the flock: the named process died (on this host the flock is the truth;
      // without flock, the pid must be gone). From another host it may still run.
      const bool here = !h.host.empty() && h.host == host;
      const bool gone = here && h.pid > 0 && ::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH;
      if (!here || (!flock_works && !gone)) {
        ::close(fd);
        in_use(dir, path_, h, /*may_be_gone=*/!here);
      }
      QS_LOG_WARN("checkpoint.dir {}: took over the lock left by pid {} on host {}: that job ended without "
                  "releasing it", dir, h.pid, h.host);
    }
    const std::string text = nlohmann::json{{"host", host}, {"pid", me}}.dump() + "\n";
    if (::ftruncate(fd, 0) != 0 ||
        ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
      const int err = errno;
      ::unlink(path_.c_str());  // ours (flocked, or taken over): a full disk leaves no lock behind
      ::close(fd);
      std::error_code ec;
      if (!made_dir_.empty()) std::filesystem::remove(made_dir_, ec);
      throw InputError(fmt::format("checkpoint.dir {}: cannot write its lock file {}: {}", dir, path_,
                                   std::strerror(err)));
    }
    fd_ = fd;
    return;
  }
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // under the flock: a taker that opened it before finds it gone and starts over
  ::close(fd_);
  std::error_code ec;
  if (!made_dir_.empty()) std::filesystem::remove(made_dir_, ec);  // only when empty: a job that saved nothing
}

}  // namespace qshard
