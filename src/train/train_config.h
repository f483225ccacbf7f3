// train_config.h: the training job's configuration (`qshard train --config X.yaml --set k=v`).
//
// What: `TrainConfig`, plain structs with defaults, one per YAML section. Every leaf has a dotted
// key ("optimizer.lr"); the full list with types is `config_keys()` and the YAML written by
// `to_yaml()` (which reads back to the same config).
//
// Loading: `load_train_config(path, overrides)` reads a YAML file with yaml-cpp, then applies
// `--set key=value` overrides in order. An override value is parsed as a YAML scalar (or flow
// list: `--set lora.target_modules=[q_proj,v_proj]`), so it gets the same typing as in the file.
// Errors are InputError naming the source (the file, or "--set key=value") and the key path:
//   unknown key      "configs/x.yaml: unknown key 'optimizer.lrr' (did you mean 'optimizer.lr'?)"
//                    (nearest_config_key: the nearest full dotted key, leaf against leaf, the
//                    user's section preferred: 'lr' and 'optimizer.learning_rate' suggest
//                    'optimizer.lr', 'lora.targets' suggests 'lora.target_modules')
//   wrong type       "configs/x.yaml: key 'optimizer.lr': expected a number, got 'fast'"
//   bad enum value   "configs/x.yaml: key 'schedule.type': expected one of warmup_cosine, linear,
//                    constant, got 'cosine'"
//   duplicate key    "configs/x.yaml: duplicate key 'optimizer.lr'"
//   section as leaf  "configs/x.yaml: key 'optimizer' is a section: expected a mapping"
// A YAML null (`path:` with nothing after it) is accepted for string keys (= empty string).
//
// Value checks are separate: `validate(world_size)` checks ranges and cross-field rules (positive
// lr, warmup <= steps, global batch divisible by micro batch x world size, seq len within the
// model's positions, ...) and throws InputError naming the source, the key and the value. The
// trainer calls it once the world size is known; rank 0 then logs `describe()`.
//
// Steps or epochs: exactly one of `steps` (optimizer steps) and `epochs` is > 0;
// `max_steps(num_train_sequences)` turns epochs into steps (whole global batches per epoch).
// Thread safety: plain data; the functions are pure.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/random_llama.h"
#include "quant/codebook.h"
#include "runtime/device_context.h"
#include "runtime/tensor.h"
#include "train/lr_schedule.h"

namespace qshard {

// Sizes of a Llama made from scratch (used when model.path is empty): the one LlamaSizes struct
// (checkpoint/random_llama.h) with configs/tiny.yaml's defaults, plus the seed of the one
// generator (`qshard init-model --seed s` writes the same weights).
// Upper bounds of the job's sizes (validate() refuses more; see there).
inline constexpr int64_t kMaxBatch = int64_t{1} << 30;        // sequences per global batch
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 24;       // tokens per sequence
inline constexpr int64_t kMaxMicroTokens = int64_t{1} << 28;  // micro_batch_size x max_seq_len
inline constexpr int64_t kMaxSteps = int64_t{1} << 40;
inline constexpr int64_t kMaxEpochs = int64_t{1} << 20;

struct ModelInitConfig : LlamaSizes {
  ModelInitConfig() {
    vocab_size = 258;  // the byte tokenizer (text/byte_tokenizer.h)
    hidden_size = 128;
    intermediate_size = 352;
    num_hidden_layers = 4;
    num_attention_heads = 4;
    num_key_value_heads = 2;
    max_position_embeddings = 512;
  }
  uint64_t seed = 0;  // weight init
  // The random base's dtype: its frozen float tensors (embeddings, norms, LM head) and the 4-bit
  // weights' QuantState dtype (a Hugging Face checkpoint's torch_dtype). float32 | bfloat16 | float16.
  DType dtype = DType::kF32;
  // The 4-bit projections drawn directly in 4-bit (quant/random_4bit.h: the codes and statistics
  // quantize_4bit gives a N(0, 0.02) tensor, in distribution, not its bytes) instead of drawn in
  // float and quantized: no float original, ~5x less CPU per value (docs/PERFORMANCE.md); what
  // `qshard bench` uses. Another base than false's: `qshard init-model --config` refuses to write
  // it, and a resume must keep the value.
  bool draw_4bit = false;
};

struct ModelConfig {
  std::string path;  // Hugging Face folder (plain or bitsandbytes 4-bit); empty: build from `init`
  ModelInitConfig init;
  QuantType quant_type = QuantType::kNf4;
  int64_t blocksize = 64;
  bool double_quant = true;
  // Load model.path even when a weight holds NaN / Inf (LlamaLoadOptions::allow_nonfinite), and
  // likewise lora.init_adapter's LoRA weights and the floats of the checkpoint a run resumes from
  // (LoRA masters, AdamW moments; load_sharded_checkpoint); `qshard train --allow-nonfinite` sets it.
  bool allow_nonfinite = false;
};

struct LoraConfig {
  int64_t r = 8;
  double alpha = 16.0;
  double dropout = 0.0;
  bool rslora = false;  // scale alpha / sqrt(r) instead of alpha / r
  std::vector<std::string> target_modules = {"q_proj",    "k_proj", "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};
  // A PEFT adapter folder whose LoRA weights start the job (instead of PEFT's init); its r,
  // lora_alpha, use_rslora and target modules must equal this section's. Empty: PEFT's init.
  std::string init_adapter;
  // LoRA folded into the base GEMMs of q|k|v and gate|up (model/llama_model.h); false: separate
  // LoRA GEMMs per projection (the reference the fold is measured against). How the step computes,
  // not what it trains: a resumed run may change it.
  bool fold = true;
  // With the fold: attention's gradients side by side and q|k|v's backward one GEMM
  // (LlamaModelOptions::fuse_qkv_backward). How the step computes, not what: a resume may change it.
  bool fuse_qkv_backward = false;
};

// torch.optim.AdamW's hyper-parameters (optim/adamw.h) and global-norm clipping.
struct OptimizerConfig {
  double lr = 2e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double grad_clip = 1.0;  // max global L2 norm of the gradients; 0 = no clipping
};

struct ScheduleConfig {
  ScheduleType type = ScheduleType::kWarmupCosine;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;  // final lr = min_lr_ratio * optimizer.lr (cosine and linear)
};

struct DataConfig {
  std::string train;           // token file (text/token_file.h)
  std::string eval;            // optional separate eval token file
  double eval_fraction = 0.0;  // else: hold out the last fraction of the packed sequences
  int64_t max_seq_len = 128;   // T: tokens per training sequence
  std::string packing = "auto";  // wrapped: documents back to back across sequences, attending
                                 // across; padded: one document per sequence, padded; packed:
                                 // padded's pieces several to a sequence, attention and positions
                                 // restarting at each (CUDA: cuDNN's ragged attention). padded and
                                 // packed need a version 3 token file (text/data_loader.h); auto:
                                 // packed for such a file, else wrapped (resolve_packing)
  uint64_t seed = 1234;        // sampler shuffle
};

struct BatchConfig {
  int64_t global_batch_size = 8;  // sequences per optimizer step over all ranks
  int64_t micro_batch_size = 1;   // sequences per forward/backward on one rank; 0: the memory plan
                                  // chooses (GPU: the fastest that fits; CPU: 1; train/memory_plan.h)
};

struct OffloadConfig {
  bool params = false;     // frozen parameter shards (4-bit base, norms, embeddings) in pinned host memory
  bool optimizer = false;  // LoRA master shards and AdamW moments in host memory, AdamW on the host
};

// Resumable checkpoints (checkpoint/sharded_checkpoint.h) go to dir/step-N, the end-of-job
// exports to dir/final (CheckpointConfig below). `qshard train --resume X` sets `resume`.
// The training step's GPU memory plan (train/memory_plan.h). None of it changes the arithmetic:
// a resumed run may change these.
struct MemoryConfig {
  double gpu_budget_gb = 0;      // > 0: plan to stay within this many GB (1e9 bytes) of GPU memory
                                 // (keep layers' activations, offload the base when needed); 0: no plan
  int64_t keep_layers = -1;      // decoder layers whose activations are kept (no recompute); -1: the
                                 // plan's choice (0 without a budget)
  int64_t mlp_chunk_tokens = -1; // rows per MLP chunk; -1: auto (chunks of 8192 past 16384 tokens per
                                 // micro-batch); 0: never chunk
  int64_t host_keep_layers = -1; // more layers whose activations are kept, in pinned host memory (copied
                                 // out in the forward, back before their backward); -1: the plan's
                                 // choice (0 without a budget)
  double host_budget_gb = 0;     // pinned host memory the plan may give host-kept layers (GB); 0: half
                                 // of what the host can still take at start
  std::string host_checkpoints = "auto"; // the layer inputs x_l (activation checkpoints) in pinned host
                                         // memory, three or more on the GPU (LlamaModelOptions::host_checkpoints):
                                         // "true", "false", or "auto": the memory plan's choice (off
                                         // without a budget)
  int64_t checkpoint_every = 0;  // 1: every layer input kept for the backward; 2: every second (the odd
                                 // ones rerun from the one before, half the layers' forward again;
                                 // LlamaModelOptions::checkpoint_every); 0: the plan's choice (2 only
                                 // where no plan with 1 fits; 1 without a budget)
  std::string kept_mlp = "auto";  // kept layers (device and host) keep the MLP's gate / up: "true";
                                  // "false": the backward recomputes those two GEMMs (a third of a
                                  // kept layer's bytes at 8B); "device": the device-kept layers keep
                                  // them, the host-kept ones do not; "auto": the memory plan's choice
                                  // of the three by its cost model (true without a budget, or where
                                  // the kept layers are set by hand; LlamaModelOptions::kept_mlp,
                                  // host_kept_mlp)
  int64_t host_staging_sets = 2;  // the host tier's device staging sets (LlamaModelOptions::host_staging_sets):
                                  // more let its copies run further behind the compute, one host-kept
                                  // layer's set on the GPU each
  int64_t full_kept_layers = -1;  // of the layers kept on the GPU, how many also keep their norms' outputs
                                  // and SwiGLU's (LlamaModelOptions::full_kept_sets: about half a kept
                                  // layer's bytes again at 8B, for the backward's memory-bound reruns);
                                  // -1: the memory plan's choice (once every layer is kept, as many
                                  // as the budget's room left holds; none without a budget)
  int64_t dequantized_layers = -1;  // layers whose base weights stay dequantized on the device from their
                                    // first use on (LlamaModelOptions::dequantized_layers: about a layer's
                                    // bf16 weights each, for the dequant of every later bind); -1: the
                                    // memory plan's choice (once every layer is kept and every kept set
                                    // is full, as many as the budget's room left holds; none without a
                                    // budget or on the CPU)
  std::string base = "auto";      // where the frozen base's shards live with offload.params off: "gpu"
                                  // (never offloaded by the plan), or "auto": the memory plan may move
                                  // them to pinned host memory, to fit the budget or where that is
                                  // faster (offload.params: true puts them there in any case)
  std::string embedding = "auto"; // where the (frozen, untied) embedding table lives: "gpu", "host"
                                  // (pinned host memory, the step's rows read in place by the GPU),
                                  // or "auto": the memory plan's choice (the GPU without a budget)
};

struct CheckpointConfig {
  // The run folder: checkpoints CKPT/step-N, the final exports CKPT/final. In a job file (and
  // --set) the value `none` saves nothing; unset or empty, load_train_config makes it the default
  // run folder (default_run_dir: runs/<the job file's stem>). In the struct "" means nothing is
  // saved (`none`; a folder named none is ./none). One job at a time holds the folder
  // (train/run_lock.h).
  std::string dir;
  int64_t every_steps = 0;  // 0: only at the end (and at stop_after_steps)
  int64_t keep_last = 2;    // complete checkpoints kept; 0: keep all
  std::string resume;       // "": start fresh; "auto": the newest complete checkpoint in dir, if
                            // any; else a checkpoint folder (or a dir holding step-N folders)
  int64_t stop_after_steps = 0;  // > 0: save and stop once this many steps are done (the schedule
                                 // still spans the whole run; resume later); 0: run to the end
  // A resume may change the LR schedule (steps / epochs, optimizer.lr, schedule.*) from the
  // checkpoint's, e.g. to extend a run by more steps; false: such a resume is refused, naming the
  // old and new values (train_checkpoint.h). `qshard train --allow-schedule-change` sets it.
  // Not stored in checkpoints: each resume asks again.
  bool allow_schedule_change = false;
};

struct LoggingConfig {
  int64_t every_steps = 10;
  std::string metrics_jsonl;     // empty: no metrics file
  std::string tensorboard_dir;   // the JSONL's numbers also as TensorBoard scalars, a new event file in
                                 // this folder per job (train/tensorboard_writer.h); empty: none
  int64_t eval_every_steps = 0;  // 0: eval only at the end (when there is eval data)
  bool profile = false;          // time the compute stream's parts (CUDA events) and print the split
                                 // at the end (nothing is timed on the CPU)
  double gemm_tflops = -1;       // MFU's denominator, the GPU's bf16 GEMM rate: -1 = measure it at
                                 // start; 0 = no MFU (e.g. under a sanitizer); > 0 = this many TFLOP/s
};

// Process-wide knobs that were environment variables (runtime/job_settings.h); each variable,
// when set, still wins over its key (an operator's override without editing the job).
struct RuntimeConfig {
  double collective_timeout_s = 1800;  // QSHARD_COLLECTIVE_TIMEOUT_S; 0 = no watchdog
  double host_memory_bytes = 0;        // QSHARD_HOST_MEMORY_BYTES; 0 = what the machine reports
  bool nccl_blocking = false;          // QSHARD_NCCL_BLOCKING
};

struct TrainConfig {
  ModelConfig model;
  LoraConfig lora;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  DataConfig data;
  BatchConfig batch;
  int64_t steps = 100;  // max optimizer steps; 0 when `epochs` is used
  int64_t epochs = 0;
  OffloadConfig offload;
  MemoryConfig memory;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  RuntimeConfig runtime;
  uint64_t seed = 0;  // LoRA init, dropout
  // auto (default): the GPU World gave this rank when this build has the CUDA backend and the
  // machine a usable GPU, else the CPU; cpu: always the CPU; cuda without a GPU is an error
  // (runtime/device_context.h, make_device_context).
  DeviceChoice device = DeviceChoice::kAuto;

  // Where the values came from, for error messages: "configs/tiny.yaml", "<defaults>", "<string>".
  std::string source = "<defaults>";

  // Range and cross-field checks (see the file comment). Throws InputError.
  // REQUIRES: world_size >= 1.
  void validate(int world_size) const;
  // Optimizer steps of the run: `steps`, or epochs x (num_train_sequences / global_batch_size).
  // Throws InputError when that is 0 or below schedule.warmup_steps.
  int64_t max_steps(int64_t num_train_sequences) const;
  // Every input the job reads is there and of the right kind, before anything loads: data.train
  // and data.eval (regular files), model.path (a folder with config.json), lora.init_adapter (a
  // folder with adapter_config.json and adapter_model.safetensors), checkpoint.resume when it
  // names a folder. Throws InputError naming the source, the key and the path.
  void check_inputs() const;
  // Every key, in to_yaml order, as a YAML document that load_train_config reads back.
  std::string to_yaml() const;
  // Every key with its value as one line of YAML text ("lora.r", "16"), in the key table's order:
  // what ranks compare to find out that they were started with different jobs.
  std::vector<std::pair<std::string, std::string>> key_values() const;
  // "resolved config (from configs/tiny.yaml):\n" + to_yaml(), for rank 0's log.
  std::string describe() const;
};

// The run folder of a job file that leaves checkpoint.dir unset: kRunsRoot/<the file's stem>,
// relative to the working directory ("configs/tiny.yaml" -> "runs/tiny").
inline constexpr const char* kRunsRoot = "runs";
std::string default_run_dir(const std::string& config_path);
// The checkpoint.dir value that saves nothing.
inline constexpr const char* kNoCheckpointDir = "none";

// Reads `path` (YAML) over the defaults, then applies each "key=value" override; a checkpoint.dir
// left unset or empty becomes default_run_dir(path), `none` becomes "" (nothing saved).
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same from YAML text; `label` names the source in errors. checkpoint.dir `none` and unset are
// both "" here (no default run folder: the text is not a job file).
TrainConfig parse_train_config(const std::string& yaml_text, const std::string& label,
                               const std::vector<std::string>& overrides = {});
// Applies one "a.b=value" override to `config`. Throws InputError naming "--set a.b=value".
void apply_override(TrainConfig& config, const std::string& assignment);

// Every leaf key ("model.init.vocab_size", ...) in declaration order.
std::vector<std::string> config_keys();
// The value of one leaf key as YAML text (as to_yaml writes it). REQUIRES: a key of config_keys().
std::string config_value(const TrainConfig& config, const std::string& key);
// One leaf key as docs/CONFIG.md lists it (train/config_reference.h renders them): the table the
// parser reads, so the two cannot drift.
struct ConfigKeyInfo {
  std::string key, type, default_value, allowed, doc;
};
std::vector<ConfigKeyInfo> config_key_infos();
// The nearest valid key (or section) to an unknown dotted key: the suggestion of "unknown key"
// errors. Compares leaf with leaf (edit distance; initials: learning_rate ~ lr; words:
// targets ~ target_modules) and prefers the section the user wrote.
std::string nearest_config_key(const std::string& key);
// Levenshtein edit distance (insert, delete, substitute; each costs 1).
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace qshard
