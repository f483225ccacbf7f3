// nccl_communicator.h: the Communicator of the CUDA backend, over NCCL (CUDA builds with NCCL).
//
// What: implements communicator.h with NCCL collectives on device buffers; work is enqueued on
// `stream` (a cudaStream_t) and the call returns at once; results are ready for later work on
// that stream. In-place rules are NCCL's own, the same as communicator.h's.
// Types: all_gather / broadcast any dtype; reductions f32, f64, bf16, f16 (sum, avg = ncclAvg, max)
// and i32 / i64 (sum, max). NCCL reduces 16-bit types in their own precision, so a bf16 sum can differ
// from MpiCommunicator's (which reduces in f32) by a few ulps.
// Bootstrap (kept apart from transport): rank 0 calls ncclGetUniqueId, MPI_Bcast sends it over
// the given MPI communicator, every rank calls ncclCommInitRankConfig in non-blocking mode and
// polls ncclCommGetAsyncError until ready, an error, or the timeout (then ncclCommAbort + throw).
// Errors never hang: every call is followed by a poll of ncclCommGetAsyncError (non-blocking
// mode returns ncclInProgress while work is being set up); wait(stream) blocks the host for a
// stream's work while polling cudaStreamQuery and ncclCommGetAsyncError, and aborts the
// communicator and throws on an asynchronous error (e.g. a peer's abort) or after the timeout.
// abort() calls ncclCommAbort: peers blocked in a collective with this rank then see an error.
// Timeouts: QSHARD_COLLECTIVE_TIMEOUT_S (failure.h) when positive; otherwise initialisation
// waits at most kDefaultInitTimeoutS and wait() waits as long as no error is reported.
// Ownership: owns the ncclComm_t (ncclCommFinalize + ncclCommDestroy in the destructor, or
// nothing after abort()) and a 4-byte device scratch buffer for barrier().
// Thread safety: as communicator.h: one thread, same call order on every rank.
// REQUIRES: constructed by every rank of `comm` (collective), with its device current (World
// sets it); one rank per GPU (NCCL refuses two ranks on one GPU: use MpiCommunicator there);
// buffers are device memory on that GPU.
#pragma once

#include <mpi.h>
#include <nccl.h>

#include "runtime/communicator.h"

namespace qshard {

class NcclCommunicator final : public Communicator {
 public:
  static constexpr double kDefaultInitTimeoutS = 300.0;

  explicit NcclCommunicator(MPI_Comm comm);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "nccl"; }
  ncclComm_t handle() const { return comm_; }

  void all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) override;
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                      void* stream) override;
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, void* stream) override;
  void broadcast(const void* send, void* recv, size_t count, DType dtype, int root, void* stream) override;
  // Host-blocking: a 1-element all-reduce on an internal buffer, then wait().
  void barrier() override;
  void abort() noexcept override;
  // ncclGroupStart / ncclGroupEnd; the calls inside are settled once, at the outermost end.
  void group_begin() override;
  void group_end() override;

  // Blocks until the work on `stream` is done. timeout_s < 0: QSHARD_COLLECTIVE_TIMEOUT_S
  // (0 = no limit). Throws qshard::Error (after aborting) on an NCCL error or a timeout.
  void wait(void* stream, double timeout_s = -1);

 private:
  // Polls ncclCommGetAsyncError until it is not ncclInProgress; aborts and throws on error.
  void settle(const char* call, double timeout_s);
  void check_device_buffer(const void* p, const char* call) const;
  void begin(const char* call) const;

  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  int device_ = -1;
  bool aborted_ = false;
  int group_depth_ = 0;
  float* scratch_ = nullptr;
};

}  // namespace qshard
