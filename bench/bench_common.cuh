// bench_common.cuh: what the CUDA benchmarks share: random bf16 fills on the device and the mean
// time of a call on a stream, by events.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda_check.h"

namespace qshard::bench {

// p[i] = bf16 of a uniform value in [-scale, scale) from a hash of (i, seed).
__global__ inline void fill_bf16(uint16_t* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15, x *= 0x2c1b3c6du, x ^= x >> 12;
    const float u = (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * 2.0f * scale;
    const uint32_t bits = __float_as_uint(u);
    p[i] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
}

inline void fill_bf16(uint16_t* p, int64_t n, uint32_t seed, float scale, cudaStream_t s) {
  fill_bf16<<<2048, 256, 0, s>>>(p, n, seed, scale);
  QS_CUDA_CHECK(cudaGetLastError());
}

// Mean milliseconds of body() over `iters` calls on stream s, after `warm` untimed ones.
class EventTimer {
 public:
  explicit EventTimer(cudaStream_t s) : s_(s) {
    QS_CUDA_CHECK(cudaEventCreate(&a_));
    QS_CUDA_CHECK(cudaEventCreate(&b_));
  }
  ~EventTimer() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  template <typename Body>
  double mean_ms(int iters, Body&& body, int warm = 2) {
    for (int i = 0; i < warm; ++i) body();
    QS_CUDA_CHECK(cudaEventRecord(a_, s_));
    for (int i = 0; i < iters; ++i) body();
    QS_CUDA_CHECK(cudaEventRecord(b_, s_));
    QS_CUDA_CHECK(cudaEventSynchronize(b_));
    float ms = 0;
    QS_CUDA_CHECK(cudaEventElapsedTime(&ms, a_, b_));
    return static_cast<double>(ms) / iters;
  }

 private:
  cudaStream_t s_;
  cudaEvent_t a_{}, b_{};
};

}  // namespace qshard::bench
