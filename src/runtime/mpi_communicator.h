// mpi_communicator.h: the Communicator of the CPU backend, over MPI.
//
// What: implements communicator.h over a duplicate of an MPI communicator (usually the World's).
// Host buffers are used directly. Device buffers (found with cudaPointerGetAttributes in CUDA
// builds) are copied through reusable pinned host staging buffers on `stream`: several ranks can
// then share one GPU, which NCCL refuses.
// Types: all_gather and broadcast move bytes of any dtype. Reductions: f32, bf16 and f16 (sum,
// avg, max) and i32 / i64 (sum, max; avg throws). bf16/f16 values are widened to f32, reduced in
// f32 and rounded once (nearest even) to the buffer's dtype: the result is at least as accurate as
// NCCL's, not always bit-equal to it.
// Determinism: a reduction does not use MPI's reduction operators (whose order depends on the
// algorithm Open MPI picks). Each rank receives every rank's slice of the part it owns
// (MPI_Alltoall / MPI_Alltoallv), reduces it in rank order 0, 1, ..., size-1:
//   sum[i] = ((x_0[i] + x_1[i]) + x_2[i]) + ...     avg[i] = sum[i] / size
// and all_reduce all-gathers the parts. Every rank gets the same bits, equal to that serial loop.
// Max propagates NaN.
// Limits: MPI counts are int. all_gather and broadcast past 2^31 - 1 elements (an 8B model's f32
// embeddings and LM head are 4.2 GB of one unit) go in pieces: broadcasts of at most 1 GiB, an
// all-gather as one chunked broadcast per rank's block. Reductions (gradients) must fit an int
// per rank's part; a larger call throws qshard::Error (split it).
// Ordering: a call first synchronises `stream` (when non-null and a GPU is present), so data
// produced on it (a kernel, an async copy into pinned memory) is complete; it returns when the
// results are in place (device results copied on `stream` and synchronised).
// Ownership: owns its MPI communicator (freed in the destructor unless MPI is already finalized)
// and its staging buffers (grown on demand, kept until destruction).
// Thread safety: as communicator.h: one thread per communicator, same call order on every rank.
// Errors: MPI calls return errors (MPI_ERRORS_RETURN) checked with QS_MPI_CHECK: qshard::Error
// naming the rank, file:line and the call. abort() calls MPI_Abort: MPI cannot cancel one
// blocked collective, so aborting an MPI communicator ends the job (failure.h knows this).
// REQUIRES: constructed by every rank of `comm` (collective); destroyed before World::finalize().
#pragma once

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/communicator.h"

namespace qshard {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }

  void all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) override;
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                      void* stream) override;
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, void* stream) override;
  void broadcast(const void* send, void* recv, size_t count, DType dtype, int root, void* stream) override;
  // Element count above which all_gather / broadcast take the split path (default and 0: INT_MAX;
  // process-wide). Lets tests exercise that path with small buffers.
  static void set_split_threshold(size_t count);
  void barrier() override;
  void abort() noexcept override;

 private:
  // A pinned host buffer reused across calls.
  struct Staging {
    void* ptr = nullptr;
    size_t capacity = 0;
  };
  void* staging(Staging& s, size_t bytes);
  bool is_device(const void* p) const;
  void begin(const char* call, void* stream) const;
  // Host bytes of `src` (itself when on the host, else a copy in `s`).
  const void* host_input(const void* src, size_t bytes, Staging& s, void* stream);
  // Reduction input as `size_t n` elements of the compute type (f32 for float dtypes).
  const void* reduction_input(const void* send, size_t n, DType dtype, void* stream);
  // Where a reduction writes `n` compute-type elements before finish_reduction() moves them.
  void* reduction_output(void* recv, size_t n, DType dtype);
  void finish_reduction(void* recv, const void* out, size_t n, DType dtype, void* stream);
  void copy_to_device(void* dst, const void* src, size_t bytes, void* stream);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool have_gpu_ = false;
  bool aborted_ = false;
  PinnedHostAllocator pinned_;
  Staging stage_in_;
  Staging stage_out_;
  std::vector<unsigned char> work_in_;   // widened reduction input
  std::vector<unsigned char> work_tmp_;  // slices received from every rank
  std::vector<unsigned char> work_out_;  // reduction result before narrowing / device copy
};

}  // namespace qshard
