// nonfinite.h: the one check for NaN / Inf in float weights, run by every command that reads a
// model folder's float tensors (checkpoint/llama_loader.h's load, `qshard quantize`).
//
// count_nonfinite(t): one pass over a CPU f32/bf16/f16 tensor's bits (an exponent of all ones is
//   NaN or Inf; no conversion), in chunks of kNonfiniteChunk elements on up to `threads` host
//   threads (runtime/parallel.h; 0: host_threads(16)). Returns the count and the first flat index
//   (-1 when none). Other dtypes (integers) hold no NaN: {0, -1}.
// require_finite(t, where, name, allow): with allow false, an InputError
//   "<where>: tensor '<name>' holds <n> NaN/Inf values (the first at flat index <i>)<why>"
//   when count_nonfinite finds any; returns the count either way (for a report).
// Cost: one read of the bytes, memory-bound: 1 GiB of bf16 in 0.13 s on one thread (8.5 GB/s), ~10 GB/s
// on 2 threads, on the 2-core development VM, 2026-12-02 (nonfinite_test's DISABLED_Throughput).
// Thread safety: reads `t` only; safe to call concurrently on distinct or the same tensors.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/tensor.h"

namespace qshard {

constexpr int64_t kNonfiniteChunk = int64_t{1} << 22;  // 4 Mi elements per parallel item

struct NonfiniteCount {
  int64_t count = 0;
  int64_t first = -1;  // flat index of the first NaN/Inf, -1 when count == 0
};

// REQUIRES: t on the CPU (or undefined / a meta tensor: {0, -1}).
NonfiniteCount count_nonfinite(const Tensor& t, int threads = 0);

// `why` ends the message (e.g. "; refusing to load it (--allow-nonfinite to load anyway)").
int64_t require_finite(const Tensor& t, const std::string& where, const std::string& name, bool allow,
                       const std::string& why, int threads = 0);

}  // namespace qshard
