#include "runtime/failure.h"

#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/error.h"
#include "runtime/job_settings.h"
#include "runtime/log.h"
#include "runtime/mpi_check.h"
#include "runtime/numbers.h"
#include "runtime/world.h"

namespace qshard {
namespace {

using Clock = std::chrono::steady_clock;

struct Registry {
  std::mutex mu;
  std::vector<std::pair<Communicator*, AbortScope>> comms;
};
Registry& registry() {
  static Registry* r = new Registry();  // leaked on purpose: usable during static destruction
  return *r;
}

std::atomic<bool> g_aborting{false};
// Set once every rank has agreed on an input error and ends cleanly: a SIGTERM then is mpirun
// ending the job because a peer already exited with 2, and this rank is exiting with 2 as well
// (an abort now would print a banner after the one error line, or kill the line's rank first).
std::atomic<bool> g_ending_cleanly{false};

bool mpi_usable() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

// ---- watchdog ----------------------------------------------------------------------------------

struct Pending {
  const char* call;
  const char* comm;
  Clock::time_point start;
};
struct Watchdog {
  std::mutex mu;
  std::map<unsigned long long, Pending> pending;
  unsigned long long next_id = 1;
  bool started = false;
};
Watchdog& watchdog() {
  static Watchdog* w = new Watchdog();
  return *w;
}

void watchdog_loop() {
  for (;;) {
    // The limit is read every round: a job's runtime.collective_timeout_s may set it after the
    // watchdog started (0 = off: nothing is late).
    const double timeout_s = collective_timeout_s();
    std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s > 0 ? std::min(1.0, timeout_s / 4) : 1.0));
    if (timeout_s <= 0) continue;
    std::string late;
    {
      std::lock_guard<std::mutex> lock(watchdog().mu);
      auto now = Clock::now();
      for (auto& [id, p] : watchdog().pending) {
        double s = std::chrono::duration<double>(now - p.start).count();
        if (s > timeout_s) {
          late = std::string(p.call) + " on communicator '" + p.comm + "' has not returned after " +
                 std::to_string(static_cast<int>(s)) + " s (the limit: " +
                 std::to_string(timeout_s) + " s, runtime.collective_timeout_s or QSHARD_COLLECTIVE_TIMEOUT_S): a peer "
                 "rank died, hangs or issued different collectives";
          break;
        }
      }
    }
    if (!late.empty()) abort_job(kTimeoutExitCode, late);
  }
}

// ---- signals -----------------------------------------------------------------------------------

sigset_t handled_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

void signal_loop() {
  sigset_t set = handled_signals();
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (g_ending_cleanly.load()) continue;
    abort_job(128 + sig, std::string("received ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
                             " (from the user, the scheduler, or the launcher ending the job after a failure)");
  }
}

}  // namespace

void register_communicator(Communicator* comm, AbortScope scope) {
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().comms.emplace_back(comm, scope);
}

void unregister_communicator(Communicator* comm) {
  std::lock_guard<std::mutex> lock(registry().mu);
  auto& v = registry().comms;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it->first == comm) {
      v.erase(it);
      return;
    }
  }
}

void abort_job(int code, const std::string& reason) noexcept {
  if (g_aborting.exchange(true)) {
    for (;;) pause();  // another thread is already ending the process
  }
  try {
    QS_LOG_ERROR("fatal: {}; aborting the job (exit code {})", reason, code);
    logger().flush();
  } catch (...) {
    const char msg[] = "qshard: fatal error; aborting the job\n";
    (void)!write(2, msg, sizeof(msg) - 1);
  }
  // Not under the registry lock's normal discipline: a thread holding it cannot be waiting for a
  // peer, so try_lock failing means a (de)registration is in flight; abort what we can see.
  std::unique_lock<std::mutex> lock(registry().mu, std::try_to_lock);
  for (auto& [comm, scope] : registry().comms)
    if (scope == AbortScope::kCommunicator) comm->abort();
  if (mpi_usable()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

JobInputError::JobInputError(const std::string& what, bool reporter) : InputError(what), reporter_(reporter) {}

void agree_on_input(World& world, const std::function<void()>& check) {
  std::string error;
  try {
    check();
  } catch (const InputError& e) {
    error = e.what();
  }
  // The lowest failing rank, or size() when none failed.
  int mine = error.empty() ? world.size() : world.rank(), first = world.size();
  QS_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, world.comm()));
  if (first == world.size()) return;
  if (!error.empty()) throw JobInputError(error, world.rank() == first);
  throw JobInputError("rank " + std::to_string(first) + " refused the job's input", false);
}

int run_job(int argc, char** argv, const std::function<int(World&)>& body) {
  // Block the signals in this thread before MPI (or anyone) starts threads, so every thread
  // inherits the mask and only the signal thread receives them.
  sigset_t set = handled_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread(signal_loop).detach();
  int rc = 0;
  bool agreed = false;  // a JobInputError: every rank ends cleanly with exit code 2
  bool reporter = false;
  std::string agreed_error;
  try {
    World& world = World::init(&argc, &argv);
    collective_timeout_s();  // a bad QSHARD_COLLECTIVE_TIMEOUT_S is refused (exit 2) before any work, at any size
    rc = body(world);
  } catch (const JobInputError& e) {
    agreed = true;
    agreed_error = e.what();
    reporter = e.reporter();
    g_ending_cleanly.store(true);
  } catch (const InputError& e) {
    // A job of one rank has no peer to end: its bad input is agreed by definition.
    if (!World::initialized() || World::get().size() != 1)
      abort_job(2, std::string("bad input: ") + e.what());  // a config, checkpoint or data file: exit 2
    agreed = true;
    agreed_error = e.what();
    reporter = true;
    g_ending_cleanly.store(true);
  } catch (const std::exception& e) {
    abort_job(1, std::string("uncaught exception: ") + e.what());
  } catch (...) {
    abort_job(1, "uncaught non-standard exception");
  }
  if (rc != 0) abort_job(rc, "the job returned exit code " + std::to_string(rc));
  // Another thread (signal, watchdog) is ending the job: finalizing now would race its MPI_Abort.
  if (g_aborting.load()) {
    for (;;) pause();
  }
  if (agreed) {
    // Every rank is here (the error was agreed on): after a barrier every rank's earlier output is
    // out, so the one line comes last (but for mpirun's own note on the exit code, which `mpirun
    // -q` leaves out). Printed BEFORE MPI_Finalize: a peer that finalized and exited with 2 gets
    // mpirun to end the job, and a reporter still on its way out was at times killed before its
    // line (failure_status_input_np3, 1 run in 6 on a loaded 2-core machine).
    if (mpi_usable()) MPI_Barrier(MPI_COMM_WORLD);
    logger().flush();
    std::fflush(stdout);
    if (reporter) {
      std::fprintf(stderr, "qshard: error: %s\n", agreed_error.c_str());
      std::fflush(stderr);
    }
  }
  try {
    World::finalize();
  } catch (const std::exception& e) {
    abort_job(1, std::string("MPI finalize failed: ") + e.what());
  }
  return agreed ? 2 : 0;
}

double parse_collective_timeout_s(const char* text) {
  if (!text || !*text) return kDefaultCollectiveTimeoutS;  // bounded by default: a stuck peer ends the job
  // 0 turns the watchdog off; else at least kMinCollectiveTimeoutS: a healthy collective takes
  // milliseconds and more, so a millisecond limit ended healthy jobs with exit code 124 - the code
  // `timeout` gives a hang, which is how it was read.
  if (std::string_view(text) == "0") return 0.0;
  try {
    return parse_double("environment variable QSHARD_COLLECTIVE_TIMEOUT_S", text, kMinCollectiveTimeoutS,
                        kMaxCollectiveTimeoutS);
  } catch (const InputError& e) {
    throw InputError(std::string(e.what()) + " (or 0: the watchdog off)");
  }
}

double collective_timeout_s() {
  // The variable, when set, wins over the job's runtime.collective_timeout_s (job_settings.h).
  static const char* const env = std::getenv("QSHARD_COLLECTIVE_TIMEOUT_S");
  if (env != nullptr && *env != '\0') {
    static const double t = parse_collective_timeout_s(env);
    return t;
  }
  return job_settings().collective_timeout_s;
}

CollectiveScope::CollectiveScope(const char* call, const char* comm_name) {
  double timeout = collective_timeout_s();
  if (timeout <= 0) return;
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mu);
  if (!w.started) {
    std::thread(watchdog_loop).detach();
    w.started = true;
  }
  id_ = w.next_id++;
  w.pending.emplace(id_, Pending{call, comm_name, Clock::now()});
}

CollectiveScope::~CollectiveScope() {
  if (id_ == 0) return;
  std::lock_guard<std::mutex> lock(watchdog().mu);
  watchdog().pending.erase(id_);
}

}  // namespace qshard
