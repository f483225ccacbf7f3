#include "runtime/nccl_communicator.h"
#include "runtime/sync_counters.h"

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "runtime/failure.h"
#include "runtime/job_settings.h"
#include "runtime/numbers.h"
#include "runtime/log.h"
#include "runtime/mpi_check.h"

namespace qshard {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kU8: return ncclUint8;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kF64: return ncclFloat64;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op, DType t, const char* call) {
  if (t == DType::kU8) throw_error(__FILE__, __LINE__, std::string(call) + ": reductions are not defined for u8");
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kAvg:
      if (!dtype_is_float(t) && t != DType::kF64)
        throw_error(__FILE__, __LINE__,
                    std::string(call) + ": avg is defined for f32/bf16/f16 only, not " + dtype_torch_name(t));
      return ncclAvg;
  }
  return ncclSum;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm comm) {
  QS_MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  QS_MPI_CHECK(MPI_Comm_size(comm, &size_));
  QS_CUDA_CHECK(cudaGetDevice(&device_));
  ncclUniqueId id{};
  if (rank_ == 0) QS_NCCL_CHECK(ncclGetUniqueId(&id));
  QS_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // Non-blocking by default (failures surface through ncclCommGetAsyncError instead of hanging);
  // QSHARD_NCCL_BLOCKING=1 (or the job's runtime.nccl_blocking; the variable wins) selects NCCL's
  // blocking mode.
  const char* blocking_env = std::getenv("QSHARD_NCCL_BLOCKING");
  config.blocking = blocking_env && *blocking_env
                        ? static_cast<int>(parse_int("environment variable QSHARD_NCCL_BLOCKING", blocking_env, 0, 1))
                        : (job_settings().nccl_blocking ? 1 : 0);
  QS_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
  double t = collective_timeout_s();
  settle("ncclCommInitRankConfig", t > 0 ? t : kDefaultInitTimeoutS);
  QS_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
  register_communicator(this, AbortScope::kCommunicator);
  QS_LOG_DEBUG("nccl communicator: rank {}/{} on device {}", rank_, size_, device_);
}

NcclCommunicator::~NcclCommunicator() {
  unregister_communicator(this);
  if (scratch_) cudaFree(scratch_);
  if (!comm_ || aborted_) return;
  // Finalize flushes outstanding work; in non-blocking mode it may return ncclInProgress.
  ncclResult_t state = ncclCommFinalize(comm_);
  auto t0 = Clock::now();
  while (state == ncclInProgress && seconds_since(t0) < kDefaultInitTimeoutS) {
    std::this_thread::yield();
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
  }
  if (state != ncclSuccess) {
    QS_LOG_WARN("ncclCommFinalize did not finish cleanly ({}); aborting the communicator",
                ncclGetErrorString(state));
    ncclCommAbort(comm_);
    return;
  }
  ncclCommDestroy(comm_);
}

void NcclCommunicator::abort() noexcept {
  if (aborted_ || !comm_) return;
  aborted_ = true;
  ncclCommAbort(comm_);
}

void NcclCommunicator::group_begin() {
  begin("group_begin");
  QS_NCCL_CHECK(ncclGroupStart());
  ++group_depth_;
}

void NcclCommunicator::group_end() {
  QS_CHECK(group_depth_ > 0, "group_end without group_begin");
  --group_depth_;
  QS_NCCL_CHECK(ncclGroupEnd());
  if (group_depth_ == 0) settle("ncclGroupEnd", collective_timeout_s());
}

void NcclCommunicator::settle(const char* call, double timeout_s) {
  if (group_depth_ > 0) return;  // launched (and settled) at the outermost group_end()
  auto t0 = Clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    QS_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      abort();
      throw_error(__FILE__, __LINE__,
                  std::string("NCCL ") + call + " failed: " + ncclGetErrorString(state) +
                      (ncclGetLastError(comm_) ? std::string(" (") + ncclGetLastError(comm_) + ")" : ""));
    }
    if (timeout_s > 0 && seconds_since(t0) > timeout_s) {
      abort();
      throw_error(__FILE__, __LINE__,
                  std::string("NCCL ") + call + " did not complete within " + std::to_string(timeout_s) + " s");
    }
    std::this_thread::yield();
  }
}

void NcclCommunicator::wait(void* stream, double timeout_s) {
  if (timeout_s < 0) timeout_s = collective_timeout_s();
  count_host_sync();
  auto st = static_cast<cudaStream_t>(stream);
  auto t0 = Clock::now();
  for (;;) {
    cudaError_t q = cudaStreamQuery(st);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) QS_CUDA_CHECK(q);
    ncclResult_t state = ncclSuccess;
    QS_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclSuccess && state != ncclInProgress) {
      abort();
      throw_error(__FILE__, __LINE__, std::string("NCCL asynchronous error while waiting: ") + ncclGetErrorString(state));
    }
    if (timeout_s > 0 && seconds_since(t0) > timeout_s) {
      abort();
      throw_error(__FILE__, __LINE__,
                  "NCCL work on the stream did not finish within " + std::to_string(timeout_s) +
                      " s (QSHARD_COLLECTIVE_TIMEOUT_S); communicator aborted");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclCommunicator::begin(const char* call) const {
  if (aborted_) throw_error(__FILE__, __LINE__, std::string(call) + " on an aborted NcclCommunicator");
}

void NcclCommunicator::check_device_buffer(const void* p, const char* call) const {
  cudaPointerAttributes attr{};
  QS_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    throw_error(__FILE__, __LINE__,
                std::string(call) + ": NcclCommunicator needs device buffers; use MpiCommunicator for host memory");
}

void NcclCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) {
  CollectiveScope scope("all_gather", name());
  begin("all_gather");
  check_device_buffer(send, "all_gather");
  check_device_buffer(recv, "all_gather");
  QS_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, static_cast<cudaStream_t>(stream)));
  settle("ncclAllGather", collective_timeout_s());
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                      void* stream) {
  CollectiveScope scope("reduce_scatter", name());
  begin("reduce_scatter");
  ncclRedOp_t nop = nccl_op(op, dtype, "reduce_scatter");
  check_device_buffer(send, "reduce_scatter");
  check_device_buffer(recv, "reduce_scatter");
  QS_NCCL_CHECK(
      ncclReduceScatter(send, recv, count, nccl_type(dtype), nop, comm_, static_cast<cudaStream_t>(stream)));
  settle("ncclReduceScatter", collective_timeout_s());
}

void NcclCommunicator::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                  void* stream) {
  CollectiveScope scope("all_reduce", name());
  begin("all_reduce");
  ncclRedOp_t nop = nccl_op(op, dtype, "all_reduce");
  check_device_buffer(send, "all_reduce");
  check_device_buffer(recv, "all_reduce");
  QS_NCCL_CHECK(ncclAllReduce(send, recv, count, nccl_type(dtype), nop, comm_, static_cast<cudaStream_t>(stream)));
  settle("ncclAllReduce", collective_timeout_s());
}

void NcclCommunicator::broadcast(const void* send, void* recv, size_t count, DType dtype, int root,
                                 void* stream) {
  CollectiveScope scope("broadcast", name());
  begin("broadcast");
  QS_CHECK(root >= 0 && root < size_, "broadcast root " + std::to_string(root) + " outside [0, " +
                                          std::to_string(size_) + ")");
  if (rank_ == root) check_device_buffer(send, "broadcast");
  check_device_buffer(recv, "broadcast");
  QS_NCCL_CHECK(
      ncclBroadcast(send, recv, count, nccl_type(dtype), root, comm_, static_cast<cudaStream_t>(stream)));
  settle("ncclBroadcast", collective_timeout_s());
}

void NcclCommunicator::barrier() {
  CollectiveScope scope("barrier", name());
  begin("barrier");
  QS_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, nullptr));
  settle("ncclAllReduce (barrier)", collective_timeout_s());
  wait(nullptr);
}

}  // namespace qshard
