// gtest main for tests that run under mpirun (and as a singleton without it).
//
// Starts the World, runs every test on every rank, then agrees on the result: the process exits
// non-zero on every rank when a test failed on any rank. Rank 0 prints gtest's usual output; the
// other ranks print only their failures, prefixed with their rank.
// Tests must run their collectives unconditionally (EXPECT_*, not an early ASSERT_* return,
// between collectives) so that a failure on one rank does not leave its peers waiting.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "runtime/world.h"

namespace {

class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  qshard::World& world = qshard::World::init(&argc, &argv);
  if (world.rank() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(world.rank()));
  }
  int rc = RUN_ALL_TESTS() == 0 ? 0 : 1;
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, world.comm());
  qshard::World::finalize();
  return any;
}
