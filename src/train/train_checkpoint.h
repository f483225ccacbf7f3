// train_checkpoint.h: what a training job stores in a resumable checkpoint beyond the sharded
// tensors, how `--resume` finds the checkpoint, and `qshard export CKPT`.
//
// The "trainer" object of metadata.json (checkpoint/sharded_checkpoint.h), identical on every rank:
//   {"qshard_version": "0.x.y",
//    "config": "<the job's YAML (to_yaml), model/data paths made absolute>",
//    "max_steps": 30,
//    "data": {"epoch", "step", "offset", "seed", "num_sequences", "global_batch"}   (DataLoader)
//    "scheduler": {"type", "lr", "warmup_steps", "max_steps", "min_lr_ratio", "next_step"},
//    "optimizer": {"type": "adamw", "step", "beta1", "beta2", "eps", "weight_decay", "grad_clip"},
//    "rng": {"kind": "counter", "lora_init_seed", "dropout_seed", "data_seed", "base_init_seed",
//            "next_step"},
//    "history": {"loss": [per step], "eval_loss": [[step, loss], ...]}}
// RNG: every random draw of a job is a pure function of (seed, name or step, position) (LoRA
// init by tensor name, dropout masks by step and global token position, the sampler's shuffle by
// epoch), so the seeds and the next step are the whole RNG state. Loss values that are not finite
// are stored as null and read back as NaN.
//
// Resume (resolve_resume): config.checkpoint.resume "" = fresh start; "auto" = the newest complete
// checkpoint under checkpoint.dir, or a fresh start when there is none (logged); anything else a
// checkpoint folder or a folder of step-N checkpoints (InputError when none is complete).
// check_resume_config: the keys that define the model, the adapter and the data order must equal
// the checkpoint's (model.*, lora.* but lora.fold and lora.fuse_qkv_backward, seed, data.max_seq_len, data.seed, data.eval_fraction,
// batch.global_batch_size; model.path compared as canonical paths); any other key may change
// (logging, world size, offload, micro batch). A difference is an InputError naming the key, the
// checkpoint's value and this job's value.
// check_resume_schedule: the LR schedule (trainer.scheduler: schedule.type, optimizer.lr,
// schedule.warmup_steps, the run's steps, schedule.min_lr_ratio) must equal the checkpoint's, or
// every later step's learning rate silently changes. A difference is an InputError listing each
// value as "checkpoint -> this job", unless checkpoint.allow_schedule_change (`qshard train
// --allow-schedule-change`) asks for it, e.g. to extend a run by more steps: then a warning lists
// them. A checkpoint without trainer.scheduler (written before it existed) is not checked.
//
// check_resume_state: the rest of trainer.* against this job, before anything loads: the
// optimizer and RNG kinds this trainer has (optimizer.type "adamw", rng.kind "counter"), the step
// counters (optimizer.step, rng.next_step, scheduler.next_step) equal to the checkpoint's step, the
// seeds in rng equal to this job's seed, data.seed and (a random base) model.init.seed, and
// trainer.data present; a difference, a missing field or a wrong type is an InputError naming
// metadata.json, the field and both values. AdamW's beta1, beta2, eps, weight_decay and grad_clip
// may change on resume: the differences come back ("optimizer.beta2 0.999 -> 0.99") for a warning.
// The data position itself is checked after the loader restores it (train_job.cpp: the step it
// holds must be the checkpoint's).
//
// Export (export_checkpoint, collective): rebuilds the job's model from the checkpoint's config at
// this world size, loads the fp32 LoRA weights ("master" slices, resharded) and runs export_model
// (checkpoint/export.h) in the requested format; PEFT fields (r, alpha, rsLoRA, dropout, targets)
// come from the config; base_model_name_or_path from the options, else the config's model.path.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/export.h"
#include "checkpoint/sharded_checkpoint.h"
#include "text/data_loader.h"
#include "train/lr_schedule.h"
#include "runtime/runtime.h"
#include "train/train_config.h"

namespace qshard {

struct TrainHistory {
  std::vector<double> losses;                           // per step, 1..step
  std::vector<std::pair<int64_t, double>> eval_losses;  // (step, mean eval loss)
};

// The config as stored: to_yaml() with model.path, data.train and data.eval made absolute.
std::string checkpoint_config_yaml(const TrainConfig& config);

nlohmann::json trainer_state_json(const TrainConfig& config, int64_t step, int64_t max_steps, const DataLoader& loader,
                                  const LrSchedule& schedule, const TrainHistory& history);

// The config stored in a checkpoint (source "<dir>/metadata.json config").
TrainConfig checkpoint_train_config(const CheckpointInfo& info);
TrainHistory checkpoint_history(const CheckpointInfo& info);

std::optional<CheckpointInfo> resolve_resume(const TrainConfig& config);
void check_resume_config(const TrainConfig& job, const TrainConfig& saved, const std::string& checkpoint_dir);
// Returns the differences ("steps 30 -> 40, ..."; "" when none).
std::string check_resume_schedule(const CheckpointInfo& info, const LrSchedule& job, bool allow_change);
// Returns AdamW's hyper-parameters that change ("optimizer.eps 1e-08 -> 1e-06"; empty when none).
std::vector<std::string> check_resume_state(const CheckpointInfo& info, const TrainConfig& job);

// Collective. `options.out_dir`, `format`, `max_shard_bytes` and (optionally)
// `base_model_name_or_path` are taken from `options`; the LoRA fields from the checkpoint.
ExportReport export_checkpoint(const std::string& checkpoint, ExportOptions options, Runtime& rt);

}  // namespace qshard
