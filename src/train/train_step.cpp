#include "train/train_step.h"

#include <cmath>

#include "runtime/collective_status.h"
#include "runtime/error.h"

namespace qshard {

FsdpDriver::FsdpDriver(LlamaModel& model, QloraModel& qm) : qm_(qm) {
  ShardedParameterManager& mgr = *qm.mgr;
  const int64_t L = model.config().num_hidden_layers;
  const int root = qm.root_unit();
  // Unit l is decoder layer l (shard_module_tree registers them in order); the manager's
  // post-gather step binds the weights the model reads (train/sharded_llama_weights.h).
  model.set_weights(qm.weights.get());
  model.before_root = [&mgr, root, L](Pass pass) {
    mgr.gather(root);
    if (pass == Pass::kBackward && L > 0) mgr.prefetch(static_cast<int>(L - 1));
    if (pass == Pass::kForward && L > 0 && mgr.state(0) == UnitState::kSharded) mgr.prefetch(0);
  };
  model.after_root = [&mgr, root](Pass) { mgr.release(root); };
  model.before_layer = [&mgr, root, L](int64_t l, Pass pass) {
    mgr.gather(static_cast<int>(l), pass == Pass::kBackward ? GatherFor::kBackward : GatherFor::kForward);
    if (pass == Pass::kForward) {
      if (l + 1 < L) mgr.prefetch(static_cast<int>(l + 1));
      else mgr.prefetch(root);  // its own slot: stays gathered through the head's backward
    } else if (l > 0) {
      mgr.prefetch(static_cast<int>(l - 1));
    }
  };
  model.after_layer = [this, &mgr](int64_t l, Pass pass) {
    if (pass == Pass::kBackward) mgr.reduce_scatter_grads(static_cast<int>(l), /*accumulate=*/micro_index_ > 0);
    mgr.release(static_cast<int>(l));
  };
}

OptimizerState make_optimizer_state(const QloraModel& qm) {
  OptimizerState s;
  for (int u = 0; u < qm.mgr->num_units(); ++u) {
    const Tensor master = qm.mgr->master_shard(u);
    s.exp_avg.push_back(Tensor::zeros({master.numel()}, DType::kF32, master.device()));
    s.exp_avg_sq.push_back(Tensor::zeros({master.numel()}, DType::kF32, master.device()));
  }
  const Device grads = qm.mgr->num_units() > 0 ? qm.mgr->grad_shard(0).device() : Device::kCpu;
  s.norm_scratch = Tensor::zeros({2 + kSumSquaresBlocks}, DType::kF64, grads);
  s.clip_scale = Tensor::zeros({1}, DType::kF32, grads);
  if (qm.mgr->options().offload_optimizer && qm.mgr->num_units() > 0) {
    // The next forward gathers the root unit (the embedding) first, then the layers in order.
    std::vector<int> order = {qm.root_unit()};
    for (int u = 0; u < qm.mgr->num_units(); ++u)
      if (u != qm.root_unit()) order.push_back(u);
    s.host = std::make_shared<HostAdamW>(*qm.mgr, std::move(order));
  }
  return s;
}

StepStats train_step(Runtime& rt, QloraModel& qm, LlamaModel& model, FsdpDriver& fsdp, OptimizerState& opt,
                     const std::vector<Batch>& micro_batches, const StepOptions& o) {
  ShardedParameterManager& mgr = *qm.mgr;
  const int world = rt.size();
  StepStats st;
  // The loss normalizer: non-ignored targets over every rank (i64 on the host communicator).
  int64_t local_tokens = 0, local_inputs = 0;
  for (const Batch& b : micro_batches) {
    for (auto t : b.targets) local_tokens += t != kIgnoreIndex;
    local_inputs += b.tokens;
  }
  st.tokens = sum_over_ranks(rt.host, local_tokens);
  st.input_tokens = sum_over_ranks(rt.host, local_inputs);  // throughput only
  // The reduce-scatter averages over ranks: normalizing each rank's loss sum by
  // (global tokens / world) makes the averaged gradient that of the global mean loss.
  const double normalizer = std::max<double>(static_cast<double>(st.tokens), 1.0) / world;

  const DeviceContext::StepScope scope;
  int64_t row = 0;
  std::vector<int64_t> ids, targets, positions;
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    const Batch& b = micro_batches[k];
    fsdp.set_micro_index(static_cast<int>(k));
    ids.assign(b.inputs.begin(), b.inputs.end());
    targets.assign(b.targets.begin(), b.targets.end());
    positions.assign(b.positions.begin(), b.positions.end());  // packed data; else empty
    model.set_dropout_context(static_cast<uint64_t>(o.step), (o.rank_row_offset + row) * o.seq_len);
    model.forward_backward(ids, targets, b.B, b.T, normalizer, positions);
    row += b.B;
  }
  mgr.wait_for_gradients();
  st.inside = scope.end();

  // Global gradient norm where the gradients live (f64, all-reduced over the data communicator),
  // the clip coefficient there too, AdamW where the masters live: no host round trip on a GPU.
  const Device gdev = opt.norm_scratch.device();
  void* cs = rt.ctx.compute().handle();
  double* acc = static_cast<double*>(opt.norm_scratch.raw());
  double* norm = acc + 1;
  double* partials = acc + 2;
  float* scale = static_cast<float*>(opt.clip_scale.raw());
  for (int u = 0; u < mgr.num_units(); ++u) {
    const Tensor g = mgr.grad_shard(u);
    optim::add_sum_squares(gdev, acc, partials, g.data<float>(), g.numel(), u > 0, cs);
  }
  rt.data.all_reduce(acc, acc, 1, DType::kF64, ReduceOp::kSum, cs);
  optim::clip_from_sum_squares(gdev, acc, o.grad_clip, norm, scale, cs);
  if (opt.host) {
    // Masters on the host: the gradients and the coefficient go to pinned memory on the compute
    // stream, AdamW runs on the optimizer's thread, each unit's next gather waits for its update.
    opt.host->submit(opt.exp_avg, opt.exp_avg_sq, scale, o.adamw, o.step + 1, rt.ctx.compute());
  } else {
    for (int u = 0; u < mgr.num_units(); ++u) {
      Tensor p = mgr.master_shard(u);
      optim::adamw_step(p, mgr.grad_shard(u), opt.exp_avg[u], opt.exp_avg_sq[u], o.adamw, o.step + 1,
                        rt.ctx.compute().handle(), scale);
    }
  }
  mgr.masters_written();  // the next step's gathers read the updated masters after these writes
  st.loss = sum_over_ranks(rt.host, model.take_loss_sum()) / std::max<double>(static_cast<double>(st.tokens), 1.0);
  // take_loss_sum waited for the compute stream: the norm and the coefficient are final.
  double norm_host = 0;
  float scale_host = 1.0f;
  copy_bytes(&norm_host, Device::kCpu, norm, gdev, sizeof(double));
  copy_bytes(&scale_host, Device::kCpu, scale, gdev, sizeof(float));
  st.grad_norm = norm_host;
  st.grad_scale = scale_host;
  return st;
}

}  // namespace qshard
