// communicator.h: one interface for the collectives qshard uses, in NCCL's argument order.
//
// What: all_gather, reduce_scatter, all_reduce, broadcast and barrier over the ranks of a World.
// Implementations: NcclCommunicator (device buffers, work enqueued on `stream`), MpiCommunicator
// (host buffers; device buffers are staged through pinned host memory, so several ranks can share
// one GPU in tests, which NCCL refuses).
// Buffers: `count` elements of `dtype`; a pointer may be host or device memory (implementations
// find out, e.g. with cudaPointerGetAttributes). Reductions are defined for f32 (and bf16/f16 on
// NCCL); the average is the sum divided by size() in the buffer's dtype.
//   all_gather:      send [count]            -> recv [size() * count], rank r's part at r * count.
//                    In place when send == recv + rank() * count.
//   reduce_scatter:  send [size() * count]   -> recv [count] = op over ranks of chunk rank().
//                    In place when recv == send + rank() * count.
//   all_reduce:      send [count] -> recv [count]; in place when send == recv.
//   broadcast:       root's send [count] -> every rank's recv [count]; in place when send == recv.
// Groups: calls between group_begin() and group_end() may be fused into one launch (NCCL's
// ncclGroupStart/End: a unit's per-kind all-gathers go out as one collective); results are
// ready only after group_end(). Groups nest. The MPI communicator completes each call at once
// (its group calls are no-ops).
// Precise sums: token counts reduce in i64, loss sums and squared norms in f64 (both
// implementations support them), never in f32.
// Ordering: a call is ordered after all work already enqueued on `stream`; the results are ready
// for later work on `stream` (MPI: the call returns when done; it synchronises `stream` first).
// Errors: a failing call throws qshard::Error naming the rank and the call; abort() tears the
// communicator down so that peers blocked in a collective return or are killed (never hang).
// Thread safety: calls on one communicator come from one thread, in the same order on every rank.
#pragma once

#include <cstddef>

#include "runtime/dtype.h"

namespace qshard {

enum class ReduceOp { kSum, kAvg, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;

  // `stream` is a cudaStream_t (nullptr: the default stream; ignored for host-only work).
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) = 0;
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                              void* stream) = 0;
  virtual void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, void* stream) = 0;
  virtual void broadcast(const void* send, void* recv, size_t count, DType dtype, int root, void* stream) = 0;
  virtual void barrier() = 0;
  virtual void group_begin() {}
  virtual void group_end() {}
  // Best effort, never throws: abandons outstanding work so no peer waits for this rank forever.
  virtual void abort() noexcept = 0;
};

}  // namespace qshard
