#include "runtime/failure.h"

#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/error.h"
#include "runtime/log.h"
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

void watchdog_loop(double timeout_s) {
  auto period = std::chrono::duration<double>(std::min(1.0, timeout_s / 4));
  for (;;) {
    std::this_thread::sleep_for(period);
    std::string late;
    {
      std::lock_guard<std::mutex> lock(watchdog().mu);
      auto now = Clock::now();
      for (auto& [id, p] : watchdog().pending) {
        double s = std::chrono::duration<double>(now - p.start).count();
        if (s > timeout_s) {
          late = std::string(p.call) + " on communicator '" + p.comm + "' has not returned after " +
                 std::to_string(static_cast<int>(s)) + " s (QSHARD_COLLECTIVE_TIMEOUT_S=" +
                 std::to_string(timeout_s) + "): a peer rank died, hangs or issued different collectives";
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

int run_job(int argc, char** argv, const std::function<int(World&)>& body) {
  // Block the signals in this thread before MPI (or anyone) starts threads, so every thread
  // inherits the mask and only the signal thread receives them.
  sigset_t set = handled_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread(signal_loop).detach();
  int rc = 0;
  try {
    World& world = World::init(&argc, &argv);
    collective_timeout_s();  // a bad QSHARD_COLLECTIVE_TIMEOUT_S is refused (exit 2) before any work, at any size
    rc = body(world);
  } catch (const InputError& e) {
    abort_job(2, std::string("bad input: ") + e.what());  // a config, checkpoint or data file: exit 2
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
  try {
    World::finalize();
  } catch (const std::exception& e) {
    abort_job(1, std::string("MPI finalize failed: ") + e.what());
  }
  return 0;
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
  static const double t = parse_collective_timeout_s(std::getenv("QSHARD_COLLECTIVE_TIMEOUT_S"));
  return t;
}

CollectiveScope::CollectiveScope(const char* call, const char* comm_name) {
  double timeout = collective_timeout_s();
  if (timeout <= 0) return;
  Watchdog& w = watchdog();
  std::lock_guard<std::mutex> lock(w.mu);
  if (!w.started) {
    std::thread(watchdog_loop, timeout).detach();
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
