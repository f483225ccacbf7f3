// eval_loss.h: the one loss routine of evaluation, shared by the trainer's eval and `qshard eval`.
//
// sequence_losses() runs the model in eval mode (no LoRA dropout; training mode restored after)
// over `count` sequences: get(k, seq) fills sequence k (ids [T], targets [T] aligned with the
// logits, kIgnoreIndex where none; positions [T] for packed data, else left empty) and returns
// whether it counts. A sequence that does not
// count still runs its forward: a sharded model gathers units in every forward, so every rank runs
// the same number of them. Losses: forward_loss's device-side sum, read back per sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/llama_model.h"

namespace qshard {

struct LossTotals {
  double loss_sum = 0;  // sum over counted targets of -log p
  int64_t tokens = 0;   // counted targets
  int64_t sequences = 0;
};

struct EvalSequence {
  std::vector<int64_t> ids, targets, positions;
};
using SequenceSource = std::function<bool(int64_t k, EvalSequence& seq)>;

LossTotals sequence_losses(LlamaModel& model, int64_t count, const SequenceSource& get);

}  // namespace qshard
