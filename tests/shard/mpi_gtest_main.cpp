// GoogleTest main for tests run under mpirun: MPI up before the tests, down after; a failure on
// any rank makes that rank exit non-zero, and so mpirun.
#include <gtest/gtest.h>

#include "runtime/world.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  qshard::World& w = qshard::World::init(&argc, &argv);
  if (w.rank() != 0) {
    // One rank's report is enough unless it fails.
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  int any = rc, all = 0;
  MPI_Allreduce(&any, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  qshard::World::finalize();
  return all;
}
