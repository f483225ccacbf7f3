// CUDA twins of random_4bit (quant/random_4bit_block.h): the kernel runs the same per-block
// functions as the host (r4::draw_block, r4::block_byte), compiled with -fmad=false, so the bytes
// are the CPU draw's. random_4bit_to_host pipelines chunks of a tensor through pinned staging.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "quant/random_4bit.h"
#include "quant/random_4bit_block.h"
#include "runtime/allocator.h"
#include "runtime/cuda_check.h"
#include "runtime/parallel.h"
#include "runtime/stream.h"

namespace qshard {
namespace {

constexpr int kThreads = 256;

// Blocks per CUDA block: up to 256 (one per thread for the per-block math), fewer for large
// blocksizes so a CUDA block writes at most 32 KB of codes.
int blocks_per_cta(int64_t blocksize) { return blocksize <= 256 ? 256 : static_cast<int>(65536 / blocksize); }

// Phase 1: thread i draws block b0 + i's absmax, thresholds and max element into shared memory.
// Phase 2: the CUDA block writes those blocks' bytes, 4 per thread per step (one 32-bit store).
// packed / absmax start at first_block; the CUDA block x covers blocks first_block + x * bpc ...
__global__ void random_4bit_fwd_kernel(Random4bitArgs a, int64_t first_block, int64_t count, int bpc,
                                       uint8_t* packed, float* absmax) {
  extern __shared__ Random4bitBlock blocks[];  // [bpc]
  const int64_t b0 = first_block + static_cast<int64_t>(blockIdx.x) * bpc;
  const int nb = static_cast<int>(min(static_cast<int64_t>(bpc), first_block + count - b0));
  for (int i = threadIdx.x; i < nb; i += blockDim.x) {
    r4::draw_block(a, b0 + i, blocks[i]);
    absmax[b0 + i - first_block] = blocks[i].absmax;
  }
  __syncthreads();
  const int64_t half = a.blocksize / 2;  // bytes per full block
  const int64_t base = first_block * half;
  const int64_t byte_end = min((b0 + nb) * half, (a.n + 1) / 2);
  for (int64_t j = b0 * half + 4 * static_cast<int64_t>(threadIdx.x); j < byte_end; j += 4 * blockDim.x) {
    const int k_end = static_cast<int>(min(int64_t{4}, byte_end - j));
    uint32_t v = 0;
    for (int k = 0; k < k_end; ++k) {
      const int64_t jj = j + k, b = jj / half;
      v |= static_cast<uint32_t>(r4::block_byte(a, blocks[b - b0], r4::block_counter(a, b), jj - b * half)) << (8 * k);
    }
    if (k_end == 4) {
      *reinterpret_cast<uint32_t*>(packed + (j - base)) = v;  // little-endian: byte j first
    } else {
      for (int k = 0; k < k_end; ++k) packed[j - base + k] = static_cast<uint8_t>(v >> (8 * k));
    }
  }
}

// Enqueues the draw of blocks [first_block, first_block + count) on `stream`; a.table on the device.
void launch(const Random4bitArgs& a, int64_t first_block, int64_t count, uint8_t* packed, float* absmax,
            cudaStream_t stream) {
  if (count <= 0) return;
  const int bpc = blocks_per_cta(a.blocksize);
  const int64_t grid = (count + bpc - 1) / bpc;
  QS_CHECK(grid <= INT32_MAX, "random_4bit: too many blocks for one launch");
  random_4bit_fwd_kernel<<<static_cast<unsigned>(grid), kThreads, bpc * sizeof(Random4bitBlock), stream>>>(
      a, first_block, count, bpc, packed, absmax);
  QS_CUDA_CHECK_LAUNCH();
}

// The host Phi table of `a` in device memory (synchronous copy).
Tensor device_table(const double* host_table) {
  Tensor t = Tensor::empty({kPhiTableDoubles}, DType::kF64, Device::kCuda);
  copy_bytes(t.raw(), Device::kCuda, host_table, Device::kCpu, sizeof(double) * kPhiTableDoubles);
  return t;
}

// Values per chunk of random_4bit_to_host (a multiple of every blocksize): 8 MB of codes.
constexpr int64_t kChunkValues = int64_t{1} << 24;

// One host thread's share of random_4bit_to_host: a stream and two chunks of device and pinned
// staging; chunk c is drawn and copied to pinned memory on the stream while the host copies chunk
// c - 1 out of the other pinned buffer into the tensors.
class Stager {
 public:
  explicit Stager(PinnedHostAllocator& pinned) : pinned_(pinned), stream_("random_4bit") {
    for (int i = 0; i < 2; ++i) {
      dev_packed_[i] = Tensor::empty({kChunkValues / 2}, DType::kU8, Device::kCuda);
      dev_absmax_[i] = Tensor::empty({kChunkValues / 32}, DType::kF32, Device::kCuda);  // blocksize >= 32
      host_packed_[i] = static_cast<uint8_t*>(pinned_.allocate(kChunkValues / 2));
      host_absmax_[i] = static_cast<float*>(pinned_.allocate(sizeof(float) * (kChunkValues / 32)));
    }
  }
  ~Stager() {
    stream_.synchronize();
    for (int i = 0; i < 2; ++i) {
      pinned_.release(host_packed_[i]);
      pinned_.release(host_absmax_[i]);
    }
  }
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  void draw(const Random4bitJob& job, const double* device_table) {
    const QuantizeOptions& o = job.options;
    Random4bitArgs a = random_4bit_args(job.shape, job.dtype, o.quant_type, o.blocksize, job.std, job.key);
    a.table = device_table;
    const int64_t n = a.n, nb = (n + o.blocksize - 1) / o.blocksize, half = o.blocksize / 2;
    const int64_t bytes = (n + 1) / 2, per_chunk = kChunkValues / o.blocksize;
    const int64_t chunks = (nb + per_chunk - 1) / per_chunk;
    Tensor packed = Tensor::empty({bytes, 1}, DType::kU8);
    Tensor absmax = Tensor::empty({nb}, DType::kF32);
    auto span = [&](int64_t c, int64_t& first, int64_t& count, int64_t& nbytes) {
      first = c * per_chunk;
      count = std::min(nb, first + per_chunk) - first;
      nbytes = std::min((first + count) * half, bytes) - first * half;
    };
    auto land = [&](int64_t c) {  // chunk c from pinned memory into the tensors
      int64_t first, count, nbytes;
      span(c, first, count, nbytes);
      done_[c % 2].synchronize();
      std::memcpy(packed.data<uint8_t>() + first * half, host_packed_[c % 2], static_cast<size_t>(nbytes));
      std::memcpy(absmax.data<float>() + first, host_absmax_[c % 2], sizeof(float) * static_cast<size_t>(count));
    };
    const cudaStream_t s = static_cast<cudaStream_t>(stream_.handle());
    for (int64_t c = 0; c < chunks; ++c) {
      // Buffers c % 2 are free: chunk c - 2 was landed in the previous step.
      int64_t first, count, nbytes;
      span(c, first, count, nbytes);
      launch(a, first, count, dev_packed_[c % 2].data<uint8_t>(), dev_absmax_[c % 2].data<float>(), s);
      QS_CUDA_CHECK(cudaMemcpyAsync(host_packed_[c % 2], dev_packed_[c % 2].raw(), static_cast<size_t>(nbytes),
                                    cudaMemcpyDeviceToHost, s));
      QS_CUDA_CHECK(cudaMemcpyAsync(host_absmax_[c % 2], dev_absmax_[c % 2].raw(),
                                    sizeof(float) * static_cast<size_t>(count), cudaMemcpyDeviceToHost, s));
      stream_.record(done_[c % 2]);
      if (c > 0) land(c - 1);
    }
    land(chunks - 1);
    *job.out = params4bit_from_blocks(std::move(packed), std::move(absmax), job.shape, job.dtype, o);
  }

 private:
  PinnedHostAllocator& pinned_;
  Stream stream_;
  Event done_[2];
  Tensor dev_packed_[2], dev_absmax_[2];
  uint8_t* host_packed_[2] = {};
  float* host_absmax_[2] = {};
};

}  // namespace

namespace cuda {

void random_4bit_blocks(const Random4bitArgs& args, int64_t first_block, int64_t count, uint8_t* packed,
                        float* absmax, void* stream) {
  const Tensor table = device_table(args.table);
  Random4bitArgs a = args;
  a.table = table.data<double>();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  launch(a, first_block, count, packed, absmax, s);
  QS_CUDA_CHECK(cudaStreamSynchronize(s));  // the table is freed on return; the twin returns when written
}

void random_4bit_to_host(std::span<const Random4bitJob> jobs, int threads) {
  if (jobs.empty()) return;
  int device = 0;
  QS_CUDA_CHECK(cudaGetDevice(&device));
  const Tensor nf4 = device_table(random_4bit_args({1}, DType::kF32, QuantType::kNf4, 64, 1.0, 0).table);
  const Tensor fp4 = device_table(random_4bit_args({1}, DType::kF32, QuantType::kFp4, 64, 1.0, 0).table);
  PinnedHostAllocator pinned;  // freed on return
  const int workers = static_cast<int>(std::min<size_t>(jobs.size(), static_cast<size_t>(std::clamp(threads, 1, 8))));
  std::atomic<size_t> next{0};
  parallel_for(static_cast<size_t>(workers), workers, [&](size_t) {
    QS_CUDA_CHECK(cudaSetDevice(device));  // a new thread starts on device 0
    Stager stager(pinned);
    for (size_t i = next++; i < jobs.size(); i = next++) {
      try {
        const QuantType t = jobs[i].options.quant_type;
        stager.draw(jobs[i], (t == QuantType::kNf4 ? nf4 : fp4).data<double>());
      } catch (...) {
        next = jobs.size();  // the other workers stop taking jobs
        throw;
      }
    }
  });
}

}  // namespace cuda
}  // namespace qshard
