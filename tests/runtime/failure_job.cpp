// A small job for the failure tests (tests/runtime/CMakeLists.txt runs it under mpirun through
// expect_failure.cmake). Every rank loops over all_reduce calls; argv[1] picks what goes wrong:
//   ok      nothing: the job must exit 0.
//   throw   rank 1 throws qshard::Error at iteration 20, between two all_reduce calls: its peers
//           are blocked in the next all_reduce and must be ended by the job abort.
//   signal  rank 0 sends itself SIGTERM at iteration 20 and works on (sleeps) until the abort ends it.
//   hang    rank 1 sleeps instead of calling all_reduce at iteration 5 (a peer that hangs): the
//           watchdog (QSHARD_COLLECTIVE_TIMEOUT_S set by the test) must end the job.
//   agreed  ranks 1 and up refuse their input in agree_on_input: every rank must end cleanly with
//           exit code 2 and only rank 1 (the lowest failing rank) print its one error line.
//   status  the same through throw_if_any_failed after some all_reduce calls (rank 2 fails).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "runtime/collective_status.h"
#include "runtime/error.h"
#include "runtime/failure.h"
#include "runtime/log.h"
#include "runtime/mpi_communicator.h"
#include "runtime/world.h"

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "ok";
  return qshard::run_job(argc, argv, [&](qshard::World& world) {
    if (mode == "agreed")
      qshard::agree_on_input(world, [&] {
        if (world.rank() >= 1) throw qshard::InputError("input of rank " + std::to_string(world.rank()) + " refused");
      });
    qshard::MpiCommunicator comm(world.comm());
    std::vector<float> buf(1024, 1.0f);
    for (int i = 0; i < 200; ++i) {
      if (mode == "throw" && world.rank() == 1 && i == 20)
        QS_CHECK(false, "injected failure at iteration " + std::to_string(i));
      if (mode == "signal" && world.rank() == 0 && i == 20) {
        // As in a long job: the abort comes while this rank still works and its peer waits in the
        // next all_reduce. (Running on, the 200 short iterations ended while the abort was in
        // flight and the peer in MPI_Finalize, and Open MPI 4.1's mpiexec at times crashed in
        // PMIx_server_finalize tearing that down.)
        kill(getpid(), SIGTERM);
        std::this_thread::sleep_for(std::chrono::seconds(60));
      }
      if (mode == "hang" && world.rank() == 1 && i == 5) std::this_thread::sleep_for(std::chrono::seconds(120));
      comm.all_reduce(buf.data(), buf.data(), buf.size(), qshard::DType::kF32, qshard::ReduceOp::kAvg, nullptr);
      if (mode == "status" && i == 10)
        qshard::throw_if_any_failed(comm, world.rank() == 2 ? "rank 2's file is bad" : "");
    }
    if (world.is_root()) QS_LOG_INFO("failure_job {}: done, value {}", mode, buf[0]);
    return 0;
  });
}
