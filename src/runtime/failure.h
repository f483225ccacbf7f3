// failure.h: job-wide error handling: any error on any rank ends the whole job, never a hang.
//
// What:
//   run_job(argc, argv, body)  the main() of every qshard program that talks to other ranks.
//       Blocks SIGINT/SIGTERM (before MPI starts its threads) and hands them to a signal thread,
//       starts the World, runs body(world). An exception escaping body, a non-zero return from
//       body, or a signal calls abort_job(). A zero return finalizes MPI and returns 0.
//       A JobInputError (every rank refused the same input at one agreed point) ends the job
//       cleanly instead: every rank finalizes MPI and returns 2, and the reporting rank then
//       prints "qshard: error: <message>" - one line, once, after everything else the job printed
//       (no MPI_Abort banner; mpirun adds a note on the exit code unless run with -q). Any
//       InputError of a job of one rank takes this path too (no peer can be waiting).
//   agree_on_input(world, check)  runs check() on every rank (each rank the same checks: the
//       job's config, its input files), then agrees over MPI_COMM_WORLD (one MPI_Allreduce):
//       when any rank's check threw InputError, every rank throws JobInputError, the lowest
//       failing rank reporting its own message. Collective; other exceptions pass through
//       (and abort the job as above).
//   abort_job(code, reason)  logs "[rank R] ... fatal: reason" (QS_LOG_ERROR), aborts every
//       registered communicator that can be aborted on its own (NCCL: ncclCommAbort), then
//       MPI_Abort(MPI_COMM_WORLD, code): mpirun / srun then end every rank with a non-zero status.
//       Without MPI (or after MPI_Finalize) the process _Exit()s with `code`.
//   register_communicator / unregister_communicator  the registry abort_job() walks. Every
//       Communicator registers itself in its constructor and leaves in its destructor.
//   CollectiveScope  marks one collective call for the watchdog: a watchdog thread calls
//       abort_job() for any collective that has not returned after QSHARD_COLLECTIVE_TIMEOUT_S
//       seconds, else the job's runtime.collective_timeout_s (job_settings.h), else
//       kDefaultCollectiveTimeoutS = 1800; 0 turns the watchdog off: a peer that died, stopped
//       (SIGSTOP) or diverged ends the job instead of hanging it for ever.
// Exit codes: 1 for an exception, body's code for a non-zero return, 128 + signal for a signal,
// kTimeoutExitCode for the watchdog.
// Thread safety: all functions are thread safe. abort_job() may be called from any thread (the
// watchdog and the signal thread do); the first caller wins, later callers block until the
// process ends. MPI_Abort from a thread other than the main one is outside
// MPI_THREAD_FUNNELED's letter; Open MPI implements it through its runtime, not the
// communication layers, and it works there (tests/runtime/failure_*).
// REQUIRES: run_job once, from main(); registered communicators outlive their registration.
#pragma once

#include <functional>
#include <string>

#include "runtime/error.h"

namespace qshard {

class Communicator;
class World;

inline constexpr int kTimeoutExitCode = 124;
// The watchdog's limit when QSHARD_COLLECTIVE_TIMEOUT_S is unset: far above any collective of a
// healthy job (rank 0 writing a 70B export while the others wait is minutes), far below "for ever".
inline constexpr double kDefaultCollectiveTimeoutS = 1800.0;
// QSHARD_COLLECTIVE_TIMEOUT_S's range (besides 0 = off): below a second a healthy collective (a
// barrier while rank 0 reads a file) ends the job; above a day it is "off" in all but name.
inline constexpr double kMinCollectiveTimeoutS = 1.0, kMaxCollectiveTimeoutS = 86400.0;

// How a registered communicator's abort() behaves.
enum class AbortScope {
  kCommunicator,  // abort() returns (NCCL): abort_job() calls it before MPI_Abort.
  kJob,           // abort() ends the job itself (MPI_Abort): abort_job()'s MPI_Abort covers it.
};

void register_communicator(Communicator* comm, AbortScope scope);
void unregister_communicator(Communicator* comm);

// Logs `reason` with this rank, aborts communicators, ends the job with `code`. Never returns.
[[noreturn]] void abort_job(int code, const std::string& reason) noexcept;

// An InputError that every rank of the job raised together at one agreed point (agree_on_input,
// collective_status.h's throw_if_any_failed); reporter(): this rank prints it.
class JobInputError : public InputError {
 public:
  JobInputError(const std::string& what, bool reporter);
  bool reporter() const { return reporter_; }

 private:
  bool reporter_;
};

void agree_on_input(World& world, const std::function<void()>& check);

// Runs `body` as described above and returns its 0 (2 after a JobInputError); on any other
// failure the process does not return.
int run_job(int argc, char** argv, const std::function<int(World&)>& body);

// Seconds after which a collective aborts the job (QSHARD_COLLECTIVE_TIMEOUT_S, read once;
// unset = the job's setting (job_settings.h; kDefaultCollectiveTimeoutS unless set), 0 = off, else in [kMinCollectiveTimeoutS,
// kMaxCollectiveTimeoutS]). Throws qshard::InputError naming the variable, its value and the range
// for anything else (runtime/numbers.h: the whole text, a finite number).
double collective_timeout_s();
// The same for a given text (nullptr or "": unset), without the environment: testable.
double parse_collective_timeout_s(const char* text);

class CollectiveScope {
 public:
  // `call` and `comm_name` are string literals (kept by pointer).
  CollectiveScope(const char* call, const char* comm_name);
  ~CollectiveScope();
  CollectiveScope(const CollectiveScope&) = delete;
  CollectiveScope& operator=(const CollectiveScope&) = delete;

 private:
  unsigned long long id_ = 0;  // 0: watchdog off
};

}  // namespace qshard
