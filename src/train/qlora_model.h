// qlora_model.h: the sharded QLoRA model of a training job, built the same way by `qshard train`
// and `qshard export` (so a checkpoint's trainable state fits the model rebuilt from its config).
//
// build_qlora_model(config, rt): the Llama config (model.path's config.json, or model.init's
// sizes), the module tree (Linear4bit base weights: model.path's weights through
// checkpoint/llama_loader.h, quantized on load when they are float, tensors without a slot ignored,
// or a seeded random base; the frozen float tensors in model.path's stored dtypes, model.init.dtype
// for a random base; LoRA A/B in PEFT's init, seeded by name), sharded through a ShardedParameterManager over
// rt.data on rt.ctx's compute stream and device (one unit per decoder layer + a root unit with a
// slot of its own; offload per config.offload.params / .optimizer), finalized; the tree then keeps
// shapes only until a unit is gathered. Identical on every rank and world size.
// state_shards(): this rank's trainable state per unit for sharded_checkpoint.h: the master
// shard ("master") and, when given, the optimizer's moments ("exp_avg", "exp_avg_sq").
// weights: what a LlamaModel over this tree computes with (LlamaModel::set_weights): the
// manager's post-gather step fills it (train/sharded_llama_weights.h); the tree is re-pointed
// only inside a TreeViews scope (export).
// Ownership: QloraModel owns the tree, the manager and the weights; the manager's hooks point
// into the tree and the weights.
// Not movable once built (hooks hold references); held through unique_ptr.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/hf_config.h"
#include "checkpoint/module_tree.h"
#include "checkpoint/sharded_checkpoint.h"
#include "checkpoint/sharded_tree.h"
#include "runtime/runtime.h"
#include "shard/sharded_parameter_manager.h"
#include "model/llama_binding.h"
#include "train/memory_plan.h"
#include "train/sharded_llama_weights.h"
#include "train/train_config.h"

namespace qshard {

struct QloraModel {
  LlamaConfig config;
  std::unique_ptr<Module> tree;
  std::unique_ptr<ShardedParameterManager> mgr;
  ShardedTree units;
  std::unique_ptr<ShardedLlamaWeights> weights;  // the model's weights, bound at each gather
  uint64_t trainable_parameters = 0;
  // Seconds per phase of the build (tree, random base or load, LoRA, shards), for the start-up line.
  std::vector<std::pair<std::string, double>> build_seconds;
  int root_unit() const { return mgr->num_units() - 1; }
};

// The Llama config a job trains: model.path's config.json, or one made from model.init.
LlamaConfig job_llama_config(const ModelConfig& model);

// Before building, checks that the host (and the GPU) can hold the 4-bit base
// (llama_4bit_bytes) and, for training, the step's buffers of `plan` (its BufferPlan for
// micro_batch_size x max_seq_len): a model this machine cannot hold is an InputError naming the
// keys and the bytes. Training: `plan` (made once by plan_memory) decides offload.params /
// .optimizer and lora.init_adapter is applied; null `plan`: a build for export (offload as the
// config says, PEFT's init).
std::unique_ptr<QloraModel> build_qlora_model(const TrainConfig& config, Runtime& rt, const MemoryPlan* plan);
// The same with plan_memory's plan for this config and rt (kTraining), or none (kExport).
enum class BuildFor { kTraining, kExport };
std::unique_ptr<QloraModel> build_qlora_model(const TrainConfig& config, Runtime& rt,
                                              BuildFor what = BuildFor::kTraining);

// REQUIRES: exp_avg / exp_avg_sq empty or one f32 tensor per unit of the master shard's size.
std::vector<UnitStateShard> state_shards(QloraModel& model, const std::vector<Tensor>& exp_avg = {},
                                         const std::vector<Tensor>& exp_avg_sq = {});

}  // namespace qshard
