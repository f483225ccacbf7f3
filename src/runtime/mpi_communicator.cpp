#include "runtime/mpi_communicator.h"
#include "runtime/sync_counters.h"

#include <climits>
#include <cstring>
#include <string>
#include <type_traits>

#include "runtime/error.h"
#include "runtime/failure.h"
#include "runtime/log.h"
#include "runtime/mpi_check.h"
#include "runtime/tensor.h"
#if QSHARD_WITH_CUDA
#include "runtime/cuda_check.h"
#endif

namespace qshard {
namespace {

// Bytes of any dtype travel as elements of this MPI type (same size, no conversion).
MPI_Datatype mpi_bytes_type(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kBF16:
    case DType::kF16: return MPI_UINT16_T;
    case DType::kU8: return MPI_UINT8_T;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kF64: return MPI_DOUBLE;
  }
  return MPI_BYTE;
}

bool is_half(DType t) { return t == DType::kBF16 || t == DType::kF16; }

// The type a reduction computes in: f32 for the float dtypes, the dtype itself for integers.
DType compute_type(DType t) { return dtype_is_float(t) ? DType::kF32 : t; }

void check_reduction(DType dtype, ReduceOp op, const char* call) {
  if (dtype == DType::kU8)
    throw_error(__FILE__, __LINE__, std::string(call) + ": reductions are not defined for u8");
  if (!dtype_is_float(dtype) && dtype != DType::kF64 && op == ReduceOp::kAvg)
    throw_error(__FILE__, __LINE__,
                std::string(call) + ": avg is defined for f32/bf16/f16 only, not " + dtype_torch_name(dtype));
}

// MPI counts are int: a broadcast past INT_MAX elements goes in pieces of 1 GiB (bytes are
// bytes, whatever the dtype).
size_t g_count_limit = static_cast<size_t>(INT_MAX);

void bcast_bytes_chunked(unsigned char* host, size_t bytes, int root, MPI_Comm comm) {
  const size_t chunk = std::min(size_t(1) << 30, g_count_limit);
  for (size_t off = 0; off < bytes; off += chunk)
    QS_MPI_CHECK(MPI_Bcast(host + off, static_cast<int>(std::min(chunk, bytes - off)), MPI_BYTE, root, comm));
}

int checked_int(size_t n, const char* call) {
  if (n > static_cast<size_t>(INT_MAX))
    throw_error(__FILE__, __LINE__,
                std::string(call) + ": " + std::to_string(n) +
                    " elements exceed MPI's int count; split the call into smaller ones");
  return static_cast<int>(n);
}

template <class T>
T combine(T acc, T v, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    if constexpr (std::is_floating_point_v<T>) return (v > acc || v != v) ? v : acc;  // NaN wins
    return v > acc ? v : acc;
  }
  return acc + v;
}

// out[i] = op over r = 0..P-1, in rank order, of slices[r * len + i]; avg divides by P.
template <class T>
void reduce_slices(const T* slices, int P, size_t len, T* out, ReduceOp op) {
  for (size_t i = 0; i < len; ++i) {
    T acc = slices[i];
    for (int r = 1; r < P; ++r) acc = combine(acc, slices[static_cast<size_t>(r) * len + i], op);
    if constexpr (std::is_floating_point_v<T>) {
      if (op == ReduceOp::kAvg) acc = acc / static_cast<T>(P);
    }
    out[i] = acc;
  }
}

void reduce_slices_any(DType ct, const void* slices, int P, size_t len, void* out, ReduceOp op) {
  switch (ct) {
    case DType::kF32:
      reduce_slices(static_cast<const float*>(slices), P, len, static_cast<float*>(out), op);
      break;
    case DType::kI32:
      reduce_slices(static_cast<const int32_t*>(slices), P, len, static_cast<int32_t*>(out), op);
      break;
    case DType::kI64:
      reduce_slices(static_cast<const int64_t*>(slices), P, len, static_cast<int64_t*>(out), op);
      break;
    case DType::kF64:
      reduce_slices(static_cast<const double*>(slices), P, len, static_cast<double*>(out), op);
      break;
    default: throw_error(__FILE__, __LINE__, "internal: no reduction for this compute type");
  }
}

void widen(const void* src, DType dtype, size_t n, float* dst) {
  const uint16_t* h = static_cast<const uint16_t*>(src);
  if (dtype == DType::kBF16)
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
  else
    for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
}

void narrow(const float* src, DType dtype, size_t n, void* dst) {
  uint16_t* h = static_cast<uint16_t*>(dst);
  if (dtype == DType::kBF16)
    for (size_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
  else
    for (size_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i]);
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  QS_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  QS_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  QS_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  QS_MPI_CHECK(MPI_Comm_size(comm_, &size_));
#if QSHARD_WITH_CUDA
  have_gpu_ = cuda_available();
#endif
  register_communicator(this, AbortScope::kJob);
}

MpiCommunicator::~MpiCommunicator() {
  unregister_communicator(this);
  pinned_.release(stage_in_.ptr);
  pinned_.release(stage_out_.ptr);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL && MPI_Comm_free(&comm_) != MPI_SUCCESS)
    QS_LOG_WARN("MPI_Comm_free failed while destroying an MpiCommunicator");
}

void MpiCommunicator::abort() noexcept {
  aborted_ = true;
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Abort(comm_ != MPI_COMM_NULL ? comm_ : MPI_COMM_WORLD, 1);
}

void* MpiCommunicator::staging(Staging& s, size_t bytes) {
  if (bytes > s.capacity) {
    pinned_.release(s.ptr);
    s.ptr = nullptr;
    s.capacity = 0;
    s.ptr = pinned_.allocate(bytes);
    s.capacity = bytes;
  }
  return s.ptr;
}

bool MpiCommunicator::is_device(const void* p) const {
#if QSHARD_WITH_CUDA
  if (!have_gpu_ || !p) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // older runtimes report plain host memory as an error
    return false;
  }
  return attr.type == cudaMemoryTypeDevice;
#else
  (void)p;
  return false;
#endif
}

void MpiCommunicator::begin(const char* call, void* stream) const {
  if (aborted_) throw_error(__FILE__, __LINE__, std::string(call) + " on an aborted MpiCommunicator");
#if QSHARD_WITH_CUDA
  if (stream && have_gpu_) {
    count_host_sync();
    QS_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  }
#else
  (void)stream;
#endif
}

const void* MpiCommunicator::host_input(const void* src, size_t bytes, Staging& s, void* stream) {
  if (!is_device(src)) return src;
  void* dst = staging(s, bytes);
#if QSHARD_WITH_CUDA
  auto st = static_cast<cudaStream_t>(stream);
  QS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st));
  count_host_sync();
  QS_CUDA_CHECK(cudaStreamSynchronize(st));
#else
  (void)stream;
#endif
  return dst;
}

void MpiCommunicator::copy_to_device(void* dst, const void* src, size_t bytes, void* stream) {
#if QSHARD_WITH_CUDA
  auto st = static_cast<cudaStream_t>(stream);
  QS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st));
  count_host_sync();
  QS_CUDA_CHECK(cudaStreamSynchronize(st));
#else
  (void)dst, (void)src, (void)bytes, (void)stream;
  throw_error(__FILE__, __LINE__, "internal: device copy in a CPU build");
#endif
}

const void* MpiCommunicator::reduction_input(const void* send, size_t n, DType dtype, void* stream) {
  const void* raw = host_input(send, n * dtype_size(dtype), stage_in_, stream);
  if (!is_half(dtype)) return raw;
  work_in_.resize(n * sizeof(float));
  widen(raw, dtype, n, reinterpret_cast<float*>(work_in_.data()));
  return work_in_.data();
}

void* MpiCommunicator::reduction_output(void* recv, size_t n, DType dtype) {
  if (is_half(dtype)) {
    work_out_.resize(n * sizeof(float));
    return work_out_.data();
  }
  return is_device(recv) ? staging(stage_out_, n * dtype_size(dtype)) : recv;
}

void MpiCommunicator::finish_reduction(void* recv, const void* out, size_t n, DType dtype, void* stream) {
  bool dev = is_device(recv);
  if (is_half(dtype)) {
    void* dst = dev ? staging(stage_out_, n * 2) : recv;
    narrow(static_cast<const float*>(out), dtype, n, dst);
    if (dev) copy_to_device(recv, dst, n * 2, stream);
  } else if (dev) {
    copy_to_device(recv, out, n * dtype_size(dtype), stream);
  }
}

void MpiCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) {
  CollectiveScope scope("all_gather", name());
  begin("all_gather", stream);
  if (count == 0) return;
  size_t bytes = count * dtype_size(dtype);
  bool recv_dev = is_device(recv);
  auto* host = static_cast<unsigned char*>(recv_dev ? staging(stage_out_, bytes * size_) : recv);
  unsigned char* mine = host + bytes * rank_;
  if (is_device(send)) {
#if QSHARD_WITH_CUDA
    auto st = static_cast<cudaStream_t>(stream);
    QS_CUDA_CHECK(cudaMemcpyAsync(mine, send, bytes, cudaMemcpyDeviceToHost, st));
    count_host_sync();
    QS_CUDA_CHECK(cudaStreamSynchronize(st));
#endif
  } else if (send != mine) {
    std::memmove(mine, send, bytes);
  }
  if (count <= g_count_limit) {
    QS_MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, host, static_cast<int>(count),
                               mpi_bytes_type(dtype), comm_));
  } else {  // past MPI's int count (e.g. an 8B model's f32 embeddings): each rank's block in turn
    for (int r = 0; r < size_; ++r) bcast_bytes_chunked(host + bytes * r, bytes, r, comm_);
  }
  if (recv_dev) copy_to_device(recv, host, bytes * size_, stream);
}

void MpiCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                     void* stream) {
  CollectiveScope scope("reduce_scatter", name());
  begin("reduce_scatter", stream);
  check_reduction(dtype, op, "reduce_scatter");
  int n = checked_int(count, "reduce_scatter");
  if (count == 0) return;
  DType ct = compute_type(dtype);
  size_t cs = dtype_size(ct);
  const void* in = reduction_input(send, count * size_, dtype, stream);
  // slices[r * count + i] = element i of rank r's chunk rank_.
  work_tmp_.resize(count * size_ * cs);
  QS_MPI_CHECK(MPI_Alltoall(in, n, mpi_bytes_type(ct), work_tmp_.data(), n, mpi_bytes_type(ct), comm_));
  void* out = reduction_output(recv, count, dtype);
  reduce_slices_any(ct, work_tmp_.data(), size_, count, out, op);
  finish_reduction(recv, out, count, dtype, stream);
}

void MpiCommunicator::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                 void* stream) {
  CollectiveScope scope("all_reduce", name());
  begin("all_reduce", stream);
  check_reduction(dtype, op, "all_reduce");
  checked_int(count, "all_reduce");
  if (count == 0) return;
  DType ct = compute_type(dtype);
  size_t cs = dtype_size(ct);
  MPI_Datatype mt = mpi_bytes_type(ct);
  // Rank r owns part r: len[r] elements from off[r] (the first count % size parts one longer).
  std::vector<int> len(size_), off(size_), mine_len(size_), mine_off(size_);
  size_t base = count / size_, rem = count % size_;
  for (int r = 0; r < size_; ++r) {
    len[r] = static_cast<int>(base + (static_cast<size_t>(r) < rem ? 1 : 0));
    off[r] = static_cast<int>(r * base + std::min<size_t>(r, rem));
  }
  for (int r = 0; r < size_; ++r) {
    mine_len[r] = len[rank_];
    mine_off[r] = r * len[rank_];
  }
  const void* in = reduction_input(send, count, dtype, stream);
  work_tmp_.resize(static_cast<size_t>(len[rank_]) * size_ * cs);
  QS_MPI_CHECK(MPI_Alltoallv(in, len.data(), off.data(), mt, work_tmp_.data(), mine_len.data(), mine_off.data(),
                             mt, comm_));
  void* out = reduction_output(recv, count, dtype);
  reduce_slices_any(ct, work_tmp_.data(), size_, static_cast<size_t>(len[rank_]),
                    static_cast<unsigned char*>(out) + static_cast<size_t>(off[rank_]) * cs, op);
  QS_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, len.data(), off.data(), mt, comm_));
  finish_reduction(recv, out, count, dtype, stream);
}

void MpiCommunicator::broadcast(const void* send, void* recv, size_t count, DType dtype, int root,
                                void* stream) {
  CollectiveScope scope("broadcast", name());
  begin("broadcast", stream);
  QS_CHECK(root >= 0 && root < size_, "broadcast root " + std::to_string(root) + " outside [0, " +
                                          std::to_string(size_) + ")");
  if (count == 0) return;
  size_t bytes = count * dtype_size(dtype);
  bool recv_dev = is_device(recv);
  void* host = recv_dev ? staging(stage_out_, bytes) : recv;
  if (rank_ == root) {
    if (is_device(send)) {
#if QSHARD_WITH_CUDA
      auto st = static_cast<cudaStream_t>(stream);
      QS_CUDA_CHECK(cudaMemcpyAsync(host, send, bytes, cudaMemcpyDeviceToHost, st));
      count_host_sync();
      QS_CUDA_CHECK(cudaStreamSynchronize(st));
#endif
    } else if (send != host) {
      std::memmove(host, send, bytes);
    }
  }
  if (count <= g_count_limit) {
    QS_MPI_CHECK(MPI_Bcast(host, static_cast<int>(count), mpi_bytes_type(dtype), root, comm_));
  } else {
    bcast_bytes_chunked(static_cast<unsigned char*>(host), bytes, root, comm_);
  }
  bool root_in_place = rank_ == root && send == recv;
  if (recv_dev && !root_in_place) copy_to_device(recv, host, bytes, stream);
}

void MpiCommunicator::set_split_threshold(size_t count) {
  g_count_limit = count == 0 ? static_cast<size_t>(INT_MAX) : std::min(count, static_cast<size_t>(INT_MAX));
}

void MpiCommunicator::barrier() {
  CollectiveScope scope("barrier", name());
  begin("barrier", nullptr);
  QS_MPI_CHECK(MPI_Barrier(comm_));
}

}  // namespace qshard
