#include "model/eval_loss.h"

namespace qshard {

LossTotals sequence_losses(LlamaModel& model, int64_t count, const SequenceSource& get) {
  const bool was_training = model.training();
  model.set_training(false);
  LossTotals t;
  EvalSequence seq;
  try {
    for (int64_t k = 0; k < count; ++k) {
      seq.positions.clear();
      const bool counted = get(k, seq);
      const int64_t T = static_cast<int64_t>(seq.ids.size());
      model.forward_loss(seq.ids, seq.targets, 1, T, seq.positions);
      const double sum = model.take_loss_sum();
      if (!counted) continue;
      t.loss_sum += sum;
      for (auto y : seq.targets) t.tokens += y != kIgnoreIndex;
      ++t.sequences;
    }
  } catch (...) {
    model.set_training(was_training);
    throw;
  }
  model.set_training(was_training);
  return t;
}

}  // namespace qshard
