#include "runtime/world.h"

#include <memory>

#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/mpi_check.h"
#include "runtime/tensor.h"
#if QSHARD_WITH_CUDA
#include "runtime/cuda_check.h"
#endif

namespace qshard {
namespace {
std::unique_ptr<World>& instance() {
  static std::unique_ptr<World> w;
  return w;
}
bool g_finalized = false;
}  // namespace

World& World::init(int* argc, char*** argv) {
  auto& w = instance();
  if (w) return *w;
  if (g_finalized) throw_error(__FILE__, __LINE__, "World::init after World::finalize: MPI cannot restart");
  w.reset(new World());
  int already = 0;
  QS_MPI_CHECK(MPI_Initialized(&already));
  if (!already) {
    // Before MPI is up its errors abort the process on their own (MPI_ERRORS_ARE_FATAL).
    QS_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &w->thread_level_));
    w->owns_mpi_ = true;
  } else {
    QS_MPI_CHECK(MPI_Query_thread(&w->thread_level_));
  }
  QS_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  w->discover();
  return *w;
}

void World::discover() {
  QS_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  QS_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  set_error_rank(rank_);
  set_log_rank(rank_);
  QS_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_comm_));
  QS_MPI_CHECK(MPI_Comm_set_errhandler(local_comm_, MPI_ERRORS_RETURN));
  QS_MPI_CHECK(MPI_Comm_rank(local_comm_, &local_rank_));
  QS_MPI_CHECK(MPI_Comm_size(local_comm_, &local_size_));
  int leader = local_rank_ == 0 ? 1 : 0;
  QS_MPI_CHECK(MPI_Allreduce(&leader, &num_nodes_, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  device_ = -1;
#if QSHARD_WITH_CUDA
  if (cuda_available()) {
    int n = 0;
    QS_CUDA_CHECK(cudaGetDeviceCount(&n));
    device_ = local_rank_ % n;
    QS_CUDA_CHECK(cudaSetDevice(device_));
  }
#endif
  QS_LOG_DEBUG("world: rank {}/{}, local {}/{}, {} node(s), device {}", rank_, size_, local_rank_, local_size_,
               num_nodes_, device_);
}

World& World::get() {
  auto& w = instance();
  if (!w) throw_error(__FILE__, __LINE__, "World::get before World::init (or after finalize)");
  return *w;
}

bool World::initialized() { return instance() != nullptr; }

void World::finalize() {
  auto& w = instance();
  if (!w) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    if (w->local_comm_ != MPI_COMM_NULL) QS_MPI_CHECK(MPI_Comm_free(&w->local_comm_));
    if (w->owns_mpi_) QS_MPI_CHECK(MPI_Finalize());
  }
  w.reset();
  g_finalized = true;
}

}  // namespace qshard
