#include "runtime/runtime.h"

#include "runtime/mpi_check.h"
#include "runtime/mpi_communicator.h"
#include "runtime/self_communicator.h"
#include "runtime/world.h"
#if QSHARD_WITH_CUDA
#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"
#endif
#if QSHARD_WITH_NCCL
#include "runtime/nccl_communicator.h"
#endif

namespace qshard {

std::unique_ptr<Communicator> make_data_communicator(const World& world, const DeviceContext& ctx) {
  if (!ctx.is_cuda()) return nullptr;
  if (world.size() == 1) return std::make_unique<SelfCommunicator>();  // nothing to exchange: no NCCL
  int shares = 0;  // this rank's GPU serves another rank of the node too
#if QSHARD_WITH_CUDA
  int gpus = 0;
  QS_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  shares = world.local_size() > gpus ? 1 : 0;
#endif
  int any_shares = 0;
  QS_MPI_CHECK(MPI_Allreduce(&shares, &any_shares, 1, MPI_INT, MPI_MAX, world.comm()));
#if QSHARD_WITH_NCCL
  if (!any_shares) return std::make_unique<NcclCommunicator>(world.comm());
#endif
  return std::make_unique<MpiCommunicator>(world.comm());
}

JobRuntime::JobRuntime(const World& world, DeviceChoice choice, const std::string& setting) {
  ctx_ = make_device_context(choice, world.device(), setting);
  host_ = std::make_unique<MpiCommunicator>(world.comm());
  data_ = make_data_communicator(world, *ctx_);
  rt_ = std::make_unique<Runtime>(Runtime{*ctx_, *host_, data_ ? *data_ : *host_});
}

JobRuntime::~JobRuntime() {
  rt_.reset();
  data_.reset();
  host_.reset();
  ctx_.reset();
}

}  // namespace qshard
