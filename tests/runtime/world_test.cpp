// World: rank, size, node layout and device choice, checked against MPI itself. Runs under
// mpirun at several sizes and as a singleton (no mpirun).
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#if QSHARD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "runtime/error.h"
#include "runtime/tensor.h"
#include "runtime/world.h"

namespace qshard {
namespace {

TEST(World, RankAndSizeMatchMpi) {
  World& w = World::get();
  int r = -1, s = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  EXPECT_EQ(w.rank(), r);
  EXPECT_EQ(w.size(), s);
  EXPECT_EQ(w.is_root(), r == 0);
  EXPECT_EQ(error_rank(), r);
  EXPECT_GE(w.thread_level(), MPI_THREAD_FUNNELED);
}

TEST(World, InitIsIdempotent) {
  int argc = 0;
  char** argv = nullptr;
  EXPECT_EQ(&World::init(&argc, &argv), &World::get());
  EXPECT_TRUE(World::initialized());
}

TEST(World, LocalRanksAreConsistentAcrossTheJob) {
  World& w = World::get();
  EXPECT_GE(w.local_rank(), 0);
  EXPECT_LT(w.local_rank(), w.local_size());
  EXPECT_GE(w.num_nodes(), 1);
  EXPECT_LE(w.num_nodes(), w.size());
  // Gather (local_rank, local_size) from all ranks: each node's ranks are 0..local_size-1 exactly
  // once, and the node sizes add up to the world size.
  std::vector<int> mine = {w.local_rank(), w.local_size()}, all(2 * w.size());
  MPI_Allgather(mine.data(), 2, MPI_INT, all.data(), 2, MPI_INT, w.comm());
  int leaders = 0, total = 0;
  for (int r = 0; r < w.size(); ++r) {
    if (all[2 * r] == 0) {
      ++leaders;
      total += all[2 * r + 1];
    }
  }
  EXPECT_EQ(leaders, w.num_nodes());
  EXPECT_EQ(total, w.size());
  int local_size_mpi = 0;
  MPI_Comm_size(w.local_comm(), &local_size_mpi);
  EXPECT_EQ(local_size_mpi, w.local_size());
}

TEST(World, ErrorsReturnInsteadOfAborting) {
  MPI_Errhandler h;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &h);
  EXPECT_TRUE(h == MPI_ERRORS_RETURN);
  MPI_Errhandler_free(&h);
}

TEST(World, DeviceIsLocalRankModuloGpus) {
  World& w = World::get();
  if (!cuda_available()) {
    EXPECT_EQ(w.device(), -1);
    return;
  }
#if QSHARD_WITH_CUDA
  int n = 0, current = -1;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(w.device(), w.local_rank() % n);
  EXPECT_EQ(current, w.device());
#endif
}

}  // namespace
}  // namespace qshard
