// run_lock.h: one job at a time in a checkpoint folder (checkpoint.dir).
//
// Two jobs writing one folder would interleave their checkpoints and metrics and both "succeed".
// A job (rank 0 of it, before anything is written there) takes the folder's lock for its whole
// life; a second job refuses to start, naming the holder.
//
// The lock: the file CKPT/.qshard.lock, holding one JSON line {"host": H, "pid": P}, and an
// flock(2) (LOCK_EX) on it, held while the RunLock lives. The kernel drops the flock when the
// process ends, however it ends, so the flock says whether the holder runs; the file's text only
// names it. Taking it:
//   flock held by another open file      refused: InputError "checkpoint.dir D is in use by another
//                                        job: pid P on host H (lock file D/.qshard.lock) ..."
//   flock free, the file empty or absent taken.
//   flock free, the file names a process taken over from a holder that died (a job killed by a
//     on this host                       signal or an abort), with a log line naming it.
//   flock free, the file names another   refused as in use: flock may not reach across hosts on
//     host                               every file system, so that job may still run; the message
//                                        says to delete the file if it does not.
//   flock not supported by the file      the file alone: taken over only when it names this host
//     system (ENOLCK, EOPNOTSUPP)        and a pid that no longer runs (kill(pid, 0) fails ESRCH).
// Release (the destructor, also while an exception unwinds): the file is removed under the flock,
// then closed; then the folder too when this lock created it and nothing else is in it (a job
// that saved nothing leaves no empty run folder). A taker re-checks after its flock that the path still names the file it locked
// (a release between its open and its flock removed it), else it starts over.
// Thread safety: one RunLock per folder per process; a second one in the same process is refused
// like another job's (the flock belongs to the open file).
#pragma once

#include <string>

namespace qshard {

inline constexpr const char* kRunLockFile = ".qshard.lock";

class RunLock {
 public:
  // Creates `dir` when absent and takes its lock. Throws InputError naming the folder (cannot
  // create it / in use by pid P on host H).
  explicit RunLock(const std::string& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string made_dir_;  // the folder, when this lock created it (removed at release if left empty)
  int fd_ = -1;
};

// This machine's host name (gethostname), as the lock file names it.
std::string this_host_name();

}  // namespace qshard
