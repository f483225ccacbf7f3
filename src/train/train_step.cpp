#include "train/train_step.h"

#include <cmath>

#include "runtime/collective_status.h"
#include "runtime/error.h"
#if QSHARD_WITH_CUDA
#include "runtime/cuda_check.h"
#endif

namespace qshard {

FsdpDriver::FsdpDriver(LlamaModel& model, QloraModel& qm) : qm_(qm) {
  ShardedParameterManager& mgr = *qm.mgr;
  const int64_t L = model.config().num_hidden_layers;
  const int root = qm.root_unit();
  // Unit l is decoder layer l (shard_module_tree registers them in order); find each LoRA
  // gradient's entry once.
  grads_.resize(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    const FlatLayout& layout = mgr.layout(static_cast<int>(l), BufferKind::kTrainable);
    for (size_t i = 0; i < kLlamaProjections.size(); ++i) {
      const std::string p = "model.layers." + std::to_string(l) + "." + kLlamaProjections[i];
      grads_[l][i].a = layout.find(p + ".lora_A.weight");
      grads_[l][i].b = layout.find(p + ".lora_B.weight");
    }
  }
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
  model.layer_lora = [this, &mgr](int64_t l, Pass pass) {
    LayerLora g;
    const int unit = static_cast<int>(l);
    for (size_t i = 0; i < kLlamaProjections.size(); ++i) {
      const ProjGrad& e = grads_[static_cast<size_t>(l)][i];
      if (!e.a || !e.b) continue;
      g.A[i] = mgr.compute_data(unit, *e.a);  // the gathered bf16 copies on CUDA; null on the CPU
      g.B[i] = mgr.compute_data(unit, *e.b);
      if (pass == Pass::kBackward) {
        g.grad_A[i] = mgr.grad_data(unit, *e.a);
        g.grad_B[i] = mgr.grad_data(unit, *e.b);
      }
    }
    return g;
  };
}

OptimizerState make_optimizer_state(const QloraModel& qm) {
  OptimizerState s;
  for (int u = 0; u < qm.mgr->num_units(); ++u) {
    const Tensor master = qm.mgr->master_shard(u);
    s.exp_avg.push_back(Tensor::zeros({master.numel()}, DType::kF32, master.device()));
    s.exp_avg_sq.push_back(Tensor::zeros({master.numel()}, DType::kF32, master.device()));
  }
  return s;
}

namespace {

// Sum of squares of a gradient shard wherever it lives (read back to the host on a GPU: after
// wait_for_gradients, at the step's end).
double shard_sum_squares(const Tensor& g, Stream& compute) {
  if (g.numel() == 0) return 0.0;
  if (g.device() == Device::kCpu) return sum_squares(g.data<float>(), g.numel());
  compute.synchronize();
  const Tensor host = g.to(Device::kCpu);
  return sum_squares(host.data<float>(), host.numel());
}

void adamw_where_it_lives(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWParams& ap, int64_t step,
                          Stream& compute) {
  if (p.numel() == 0) return;
  if (p.device() == Device::kCpu) {
    // Master on the host (CPU backend, or offload.optimizer): the gradient shard comes to it.
    const Tensor gh = g.device() == Device::kCpu ? g : g.to(Device::kCpu);
    cpu::adamw_step(p.data<float>(), gh.data<float>(), m.data<float>(), v.data<float>(), p.numel(), ap, step);
    return;
  }
#if QSHARD_WITH_CUDA
  cuda::adamw_step(p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(), p.numel(), ap, step,
                  compute.handle());
#else
  (void)compute;
  throw Error("AdamW: master shard on a device in a build without CUDA");
#endif
}

}  // namespace

StepStats train_step(Runtime& rt, QloraModel& qm, LlamaModel& model, FsdpDriver& fsdp, OptimizerState& opt,
                     const std::vector<Batch>& micro_batches, const StepOptions& o) {
  ShardedParameterManager& mgr = *qm.mgr;
  const int world = rt.size();
  StepStats st;
  // The loss normalizer: non-ignored targets over every rank (i64 on the host communicator).
  int64_t local_tokens = 0;
  for (const Batch& b : micro_batches)
    for (auto t : b.targets) local_tokens += t != kIgnoreIndex;
  st.tokens = sum_over_ranks(rt.host, local_tokens);
  // The reduce-scatter averages over ranks: normalizing each rank's loss sum by
  // (global tokens / world) makes the averaged gradient that of the global mean loss.
  const double normalizer = std::max<double>(static_cast<double>(st.tokens), 1.0) / world;

  const DeviceContext::StepScope scope;
  int64_t row = 0;
  std::vector<int64_t> ids, targets;
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    const Batch& b = micro_batches[k];
    fsdp.set_micro_index(static_cast<int>(k));
    ids.assign(b.inputs.begin(), b.inputs.end());
    targets.assign(b.targets.begin(), b.targets.end());
    model.set_dropout_context(static_cast<uint64_t>(o.step), (o.rank_row_offset + row) * o.seq_len);
    model.forward_backward(ids, targets, b.B, b.T, normalizer);
    row += b.B;
  }
  mgr.wait_for_gradients();
  st.inside = scope.end();

  // Global gradient norm over every rank's shards (f64), clipping, AdamW where the masters live.
  double sq = 0;
  for (int u = 0; u < mgr.num_units(); ++u) sq += shard_sum_squares(mgr.grad_shard(u), rt.ctx.compute());
  st.grad_norm = std::sqrt(sum_over_ranks(rt.host, sq));
  AdamWParams ap = o.adamw;
  ap.grad_scale = o.grad_clip > 0 ? clip_coefficient(st.grad_norm, o.grad_clip) : 1.0;
  st.grad_scale = ap.grad_scale;
  for (int u = 0; u < mgr.num_units(); ++u) {
    Tensor p = mgr.master_shard(u);
    adamw_where_it_lives(p, mgr.grad_shard(u), opt.exp_avg[u], opt.exp_avg_sq[u], ap, o.step + 1, rt.ctx.compute());
  }
  st.loss = sum_over_ranks(rt.host, model.take_loss_sum()) / std::max<double>(static_cast<double>(st.tokens), 1.0);
  return st;
}

}  // namespace qshard
