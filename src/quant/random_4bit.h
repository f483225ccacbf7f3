// random_4bit.h: a random 4-bit weight drawn directly in its quantized form: the bytes that
// quantize_4bit of a N(0, std) tensor gives, in distribution, without the float tensor (a bench or
// test base needs no float original; drawing and quantizing one is the slow part of a 70B build).
//
// What: random_4bit(shape, dtype, options, std, key, threads) returns the Params4bit (packed codes,
// absmax and, with options.compress_statistics, the nested statistics) distributed as
// quantize_4bit(x, options) for x of `shape` holding iid N(0, std) values stored in `dtype`.
// Per block of L values (L = blocksize; the last block may be shorter):
//   absmax   M = max |x_i| of L half-normals, by inverse CDF: M = std * Phi^-1(1 - q/2) with
//            q = 1 - U^(1/L); stored as A = M rounded to `dtype` (a bf16 / f16 tensor holds rounded
//            values, and rounding is monotone: the max of the rounded values is the rounded max).
//   its element  at a uniform position of the block, sign uniform; its code is the one
//            quantize_4bit gives +-A: encode_4bit(+-A * (1/A)) (NF4 15 / 0, FP4 0x3 / 0xB).
//   the others   iid N(0, std) truncated to [-M, M]. quantize_4bit codes x by the interval of the
//            encoder's decision boundaries b_0 < ... < b_14 (read off encode_4bit itself, so they
//            cannot disagree with it) that x / A falls in; the code is drawn from those interval
//            probabilities: P(interval <= k) = (Phi(A b_k / std) - Phi(-M / std)) /
//            (Phi(M / std) - Phi(-M / std)), one 32-bit uniform per element against the 15
//            cumulative thresholds of its block (a 4-step branchless search).
// Exact in distribution up to: the uniforms' 2^-32 resolution of those probabilities; Phi from a
// table with cubic Hermite interpolation (absolute error < 1e-10) and Phi^-1 by Acklam's rational
// approximation (relative error < 1.2e-9, below float32's rounding of M); and the input dtype's
// rounding of the values themselves near a boundary (quantize_4bit of a bf16 tensor compares
// values rounded to 8 significant bits: one within 2^-9 relative of A b_k may fall on the other
// side, in either direction), which the draw ignores.
// Layout: quantize_4bit's (blockwise.h): element 2j in the high nibble of byte j, 2j+1 in the low
// one, an odd count padded with zero_code; absmax float32 per block. Double quant: the float32
// absmax vector goes through params4bit_from_blocks, quantize_4bit's own path, so the nested
// statistics are exactly what quantize_4bit makes of that absmax.
// Determinism: block b draws the 64-bit words splitmix64(k + c * 0x9e3779b97f4a7c15) for counters
// c = b * (blocksize / 2 + 2) + j, k = splitmix64 of `key` (model_init passes random_normal's
// seed-and-name hash): a pure function of key and block index, so the bytes do not depend on
// `threads`, on the order blocks are drawn in, nor on where: the per-block arithmetic is one
// source for the host and the GPU (quant/random_4bit_block.h, which states how the two round
// alike), so the CUDA draw gives the CPU draw's bytes.
// Threads: blocks are drawn in chunks of 2^20 values on up to `threads` threads (runtime/parallel.h);
// threads = 1 draws on the caller's thread (for callers that already run tensors in parallel).
// GPU: random_4bit(..., Device::kCuda, stream) returns the Params4bit in device memory;
// random_4bit_to_host draws many tensors on the GPU into host Params4bit (a model's base).
// Speed: docs/PERFORMANCE.md ("random 4-bit base"), measured by bench/random_4bit.cpp.
// Errors: InputError naming the value for a bad blocksize, a non-float dtype, an empty shape, or
// std outside [1e-6, 1e3]; Error "op random_4bit...: no cuda implementation in this build" for
// Device::kCuda in a CPU build. Thread safety: pure; the CPU draw's result is a fresh CPU Params4bit.
#pragma once

#include <cstdint>
#include <span>

#include "quant/params4bit.h"

namespace qshard {

Params4bit random_4bit(const Shape& shape, DType dtype, const QuantizeOptions& options, double std, uint64_t key,
                       int threads = 1);

// The same draw on `draw_on`. kCuda: codes and absmax drawn by the kernel on `stream` (a
// cudaStream_t as void*; nullptr the default stream), the nested statistics made by
// params4bit_from_blocks's CUDA kernels (bitwise equal to the host's); the tensors are in device
// memory; returns when they are ready. kCpu: the host draw above on the caller's thread.
Params4bit random_4bit(const Shape& shape, DType dtype, const QuantizeOptions& options, double std, uint64_t key,
                       Device draw_on, void* stream);

// One tensor of a batch: *out = random_4bit(shape, dtype, options, std, key), host tensors.
struct Random4bitJob {
  Shape shape;
  DType dtype = DType::kBF16;
  QuantizeOptions options;
  double std = 0.02;
  uint64_t key = 0;
  Params4bit* out = nullptr;
};
// Draws every job into its host Params4bit; the bytes are the CPU draw's wherever it is drawn.
// kCpu: one job per host thread on up to `threads` threads, largest first as given.
// kCuda: up to `threads` host threads (at most 8), each with its own stream ("random_4bit") and
// double-buffered staging (two device and two pinned chunks of 2^24 values: 8 MB of codes and
// 2 MB of absmax each, 20 MB device and 20 MB pinned per thread), draw a job chunk by chunk on the GPU and copy each chunk into the host tensors
// while the next is drawn; the nested statistics (1/blocksize of the data) on the host. Returns
// when every job is done; the staging is freed. REQUIRES: distinct `out`s.
void random_4bit_to_host(std::span<const Random4bitJob> jobs, Device draw_on, int threads);

// The encoder's decision boundaries in scaled units (x / absmax) and the code of each interval:
// encode_4bit(t, flush_subnormal(v)) == code[#{k : v > bound[k]}] for every float v (read off the
// encoder by bisection on first use). NF4: code[i] = i; FP4: sign and magnitude bits.
struct CodeIntervals {
  float bound[15];
  uint8_t code[16];
};
const CodeIntervals& code_intervals(QuantType t);

}  // namespace qshard
