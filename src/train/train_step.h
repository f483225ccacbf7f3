// train_step.h: one optimizer step of QLoRA training, the same code on every backend.
//
// FsdpDriver connects a LlamaModel to the sharded manager of a QloraModel (the FSDP schedule):
//   forward   root gathered for the embedding, released; layer l gathered (forward: gradients
//             untouched), layer l+1 prefetched; at the last layer the root is prefetched into its
//             own slot and stays gathered through the head's forward and backward;
//   backward  layer l gathered with its gradients zeroed, layer l-1 prefetched; after the layer,
//             its LoRA gradients reduce-scattered (averaged over ranks) into this rank's fp32
//             gradient shards on the reduce stream (added from the second micro-batch on);
//   LoRA      the model's LoRA operands (on CUDA the manager's bf16 compute copies, written at
//             gather) and gradient pointers come from flat-layout entries found once here, so a
//             gather binds them with pointer arithmetic only.
// train_step(): the micro-batches of one step (this rank's slice of the global batch), the token
// count agreed over the host communicator in i64 (the loss normalizer), forward_backward per
// micro-batch (loss summed on the device), waiting for the gradients, the global gradient norm
// where the gradients live (squares summed in f64 on the device, deterministically; all-reduced in
// f64 over the data communicator), the clip coefficient computed there too, and AdamW on each
// rank's fp32 master shards where they live (the context's device, reading the coefficient from
// device memory; or the host with offload.optimizer). The loss, norm and coefficient are read
// back after the step (one host wait, the step's end). StepStats::inside counts the host
// synchronizations and device allocations made between the first gather and the optimizer: both
// 0 on CUDA with NCCL (runtime/sync_counters.h); on the CPU there is nothing to count.
// Thread safety: one thread per rank; every rank calls in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/llama_model.h"
#include "runtime/runtime.h"
#include "optim/adamw.h"
#include "text/data_loader.h"
#include "train/host_adamw.h"
#include "train/qlora_model.h"

namespace qshard {

class FsdpDriver {
 public:
  // Installs the gather/release hooks on `model` and points it at qm's sharded weights (the
  // manager's post-gather step). Both must outlive the driver.
  FsdpDriver(LlamaModel& model, QloraModel& qm);
  // Micro-batch index of the current forward_backward (0: gradients written, >0: added).
  void set_micro_index(int k) { micro_index_ = k; }

 private:
  QloraModel& qm_;
  int micro_index_ = 0;
};

// AdamW moments of this rank's shards, per unit, where the master shards live; the gradient norm's
// scratch where the gradient shards live (the compute device).
struct OptimizerState {
  std::vector<Tensor> exp_avg, exp_avg_sq;  // f32, the master shard's size
  Tensor norm_scratch;  // f64 [2 + kSumSquaresBlocks]: sum of squares, norm, partial sums
  Tensor clip_scale;    // f32 [1]: the clip coefficient AdamW reads
  // Masters in host memory (offload.optimizer): AdamW on a thread of its own, overlapping the next
  // forward (train/host_adamw.h); null when the masters live where the compute is.
  std::shared_ptr<HostAdamW> host;
  // Every unit's update is final (before the moments are read: a checkpoint).
  void finish() const {
    if (host) host->finish();
  }
};
OptimizerState make_optimizer_state(const QloraModel& qm);

struct StepOptions {
  int64_t step = 0;              // 0-based; AdamW's count is step + 1
  AdamWParams adamw;             // lr for this step; grad_scale unused (the clip coefficient replaces it)
  double grad_clip = 0;          // max global norm; 0 = none
  int64_t rank_row_offset = 0;   // global index of this rank's first sequence in the global batch
  int64_t seq_len = 0;           // T
};

struct StepStats {
  double loss = 0;           // mean over every rank's non-ignored targets
  double grad_norm = 0;      // global, before clipping
  double grad_scale = 1;     // the clip coefficient applied
  int64_t tokens = 0;        // non-ignored targets over all ranks
  int64_t input_tokens = 0;  // input positions holding a token (padding excluded) over all ranks
  SyncAllocCounts inside;    // host syncs / device allocations between the first gather and AdamW
};

StepStats train_step(Runtime& rt, QloraModel& qm, LlamaModel& model, FsdpDriver& fsdp, OptimizerState& opt,
                     const std::vector<Batch>& micro_batches, const StepOptions& options);

}  // namespace qshard
