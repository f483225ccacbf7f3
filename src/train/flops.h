// flops.h: the useful work of a QLoRA training step, and the GPU's bf16 GEMM rate, for MFU.
//
// useful_flops_per_token: forward + input-gradient backward of the frozen base (2 + 2 FLOPs per
// weight of every projection and of the LM head; the head and base get no weight gradient),
// attention counted as PaLM does (12 * L * H * D * T per token for forward + backward, not halved
// for the causal mask; T is min(T, sliding_window) with a sliding window), and the LoRA adapters' forward, input and weight gradients (6 FLOPs per
// trainable parameter). No recompute: activation checkpointing's extra forward is not useful work.
// For Llama-3.1-8B at T = 2048 with r = 16 on all seven projections this is 33.5 GFLOP per token.
// MFU = useful_flops_per_token * tokens per second / measured bf16 GEMM FLOP/s.
// measure_gemm_flops: bf16 x bf16 -> bf16 8192^3 GEMMs with f32 accumulation through ops::gemm on
// ctx's stream on random operands (3 warm-up, 10 timed with events; zeros would run faster than
// real data); 0 on the CPU backend. Start-up work: allocates.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/hf_config.h"
#include "runtime/device_context.h"

namespace qshard {

double useful_flops_per_token(const LlamaConfig& config, int64_t seq_len, uint64_t lora_parameters);
double measure_gemm_flops(DeviceContext& ctx);
// The job's MFU denominator from logging.gemm_tflops: -1 measures it now (measure_gemm_flops), 0
// is none (no MFU), > 0 is that many TFLOP/s; FLOP/s. 0 on the CPU backend either way (no MFU there).
double job_gemm_flops(DeviceContext& ctx, double gemm_tflops);
// Device-to-device copy of 1 GiB (bytes read + written per second) and pinned host-to-device
// copy of 1 GiB (bytes per second) on ctx's stream, best of 5; 0 on the CPU. Start-up work: allocates.
double measure_copy_bandwidth(DeviceContext& ctx);
double measure_h2d_bandwidth(DeviceContext& ctx);
// The dense bf16 tensor-core rate of the GPU named `device_name` (as CUDA names it:
// runtime/tensor.h device_name()) from NVIDIA's data sheets, without sparsity, FLOP/s: H100 / H200
// SXM and GH200 989.4 TFLOP/s, H100 / H200 NVL 835, H100 PCIe 756, A100 312, L40S 362, RTX 4090
// 165.2 (f32 accumulate), B200 2,250; 0 for any other name. MFU against it beside the measured
// GEMM rate: a card under its power cap runs below both.
double dense_bf16_spec_flops(const std::string& device_name);

}  // namespace qshard
