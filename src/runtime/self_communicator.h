// self_communicator.h: the data communicator of a one-rank job.
//
// What: a Communicator (runtime/communicator.h) of size 1. Over one rank every collective is the
// identity: all_gather, reduce_scatter (sum, average or max of one value), all_reduce and
// broadcast copy send to recv (an asynchronous copy on `stream`, host or device memory alike:
// copy_bytes_anywhere_async), and do nothing in place; barrier and groups are no-ops. A
// world-size-1 GPU job uses it instead of NCCL, whose communicator would hold device memory and
// start-up time for nothing (the memory ledger's "before the build" line).
// Ordering: like NCCL's, the copy is enqueued on `stream` after the work already there.
// Thread safety: calls from one thread.
#pragma once

#include "runtime/communicator.h"

namespace qshard {

class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* name() const override { return "self"; }
  void all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) override;
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, void* stream) override;
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, void* stream) override;
  void broadcast(const void* send, void* recv, size_t count, DType dtype, int root, void* stream) override;
  void barrier() override {}
  void abort() noexcept override {}
};

}  // namespace qshard
