#include "model/eval_loss.h"

namespace qshard {

LossTotals sequence_losses(LlamaModel& model, int64_t count, const SequenceSource& get) {
  const bool was_training = model.training();
  model.set_training(false);
  LossTotals t;
  std::vector<int64_t> ids, targets;
  try {
    for (int64_t k = 0; k < count; ++k) {
      const bool counted = get(k, ids, targets);
      const int64_t T = static_cast<int64_t>(ids.size());
      model.forward_loss(ids, targets, 1, T);
      const double sum = model.take_loss_sum();
      if (!counted) continue;
      t.loss_sum += sum;
      for (auto y : targets) t.tokens += y != kIgnoreIndex;
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
