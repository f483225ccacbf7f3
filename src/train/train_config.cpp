#include "train/train_config.h"

#include "checkpoint/peft_adapter.h"
#include "runtime/input_file.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <tuple>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace qshard {
namespace {

// ---- one table of every leaf key ------------------------------------------------------------
// A field knows its dotted key, how to read a YAML node into the config and how to write its
// value as YAML text. The table drives parsing, unknown-key suggestions and to_yaml().

struct Field {
  std::string key;
  std::function<void(TrainConfig&, const YAML::Node&, const std::string& where)> set;
  std::function<YAML::Node(const TrainConfig&)> get;
  std::string type;     // "integer", "number", "true | false", ... (from the member's C++ type)
  std::string allowed;  // the values validate() accepts, in words (an enum's names when empty)
  std::string doc;      // one line of meaning (docs/CONFIG.md; a key without one fails a test)
};

[[noreturn]] void type_error(const std::string& where, const std::string& expected, const YAML::Node& node) {
  std::string got;
  if (node.IsNull()) got = "null";
  else if (node.IsScalar()) got = "'" + node.Scalar() + "'";
  else if (node.IsSequence()) got = "a list";
  else got = "a mapping";
  throw InputError(fmt::format("{}: expected {}, got {}", where, expected, got));
}

template <class T>
T scalar_as(const YAML::Node& node, const std::string& where, const char* expected) {
  if (!node.IsScalar()) type_error(where, expected, node);
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    type_error(where, expected, node);
  }
}

// A number or a bool is a plain scalar: `lr: "1e-4"` or `fold: !!str false` is a string that
// yaml-cpp would convert in silence, so it is refused naming the key and the value. yaml-cpp tags
// a plain scalar "?" and a quoted one "!"; an explicit tag keeps its name (the core schema's
// !!int, !!float and !!bool are numbers and bools, any other tag is not).
void require_plain(const YAML::Node& node, const std::string& where, const char* expected) {
  if (!node.IsScalar()) return;
  const std::string& tag = node.Tag();
  if (tag == "?" || tag == "tag:yaml.org,2002:int" || tag == "tag:yaml.org,2002:float" ||
      tag == "tag:yaml.org,2002:bool")
    return;
  if (tag == "!")
    throw InputError(fmt::format("{}: expected {}, got the quoted string '{}' (write it without quotes)", where,
                                 expected, node.Scalar()));
  throw InputError(fmt::format("{}: expected {}, got '{}' tagged {}", where, expected, node.Scalar(), tag));
}

template <class T>
T plain_scalar_as(const YAML::Node& node, const std::string& where, const char* expected) {
  require_plain(node, where, expected);
  return scalar_as<T>(node, where, expected);
}

// Integers in base 10 only, the whole scalar (YAML 1.1 would read 010 as 8 and 0x10 as 16; the
// command line's numbers, runtime/numbers.h, take neither either).
template <class I>
I scalar_int(const YAML::Node& node, const std::string& where, const char* expected) {
  require_plain(node, where, expected);
  if (!node.IsScalar()) type_error(where, expected, node);
  const std::string& t = node.Scalar();
  I v{};
  const char* end = t.data() + t.size();
  const auto [at, ec] = std::from_chars(t.data(), end, v, 10);
  if (t.empty() || ec != std::errc() || at != end) type_error(where, expected, node);
  if (t.size() > 1 && (t[0] == '0' || (t[0] == '-' && t[1] == '0')))
    type_error(where, std::string(expected) + " without a leading 0 (YAML reads 010 as octal 8)", node);
  return v;
}

void read_value(int64_t& out, const YAML::Node& n, const std::string& where) {
  out = scalar_int<int64_t>(n, where, "an integer");
}
void read_value(uint64_t& out, const YAML::Node& n, const std::string& where) {
  out = scalar_int<uint64_t>(n, where, "a non-negative integer");
}
void read_value(double& out, const YAML::Node& n, const std::string& where) {
  out = plain_scalar_as<double>(n, where, "a number");
  if (!std::isfinite(out)) type_error(where, "a finite number", n);
}
void read_value(bool& out, const YAML::Node& n, const std::string& where) {
  out = plain_scalar_as<bool>(n, where, "true or false");
}
// A string without NUL: YAML's "\0" escape makes one, and every path or name reaches the system
// as a C string, cut at the NUL ("runs/x.tok\0junk" trained on runs/x.tok in silence).
std::string string_without_nul(const YAML::Node& n, const std::string& where, const char* expected) {
  std::string s = scalar_as<std::string>(n, where, expected);
  if (s.find('\0') != std::string::npos) {
    std::string shown = s;
    for (size_t at; (at = shown.find('\0')) != std::string::npos;) shown.replace(at, 1, "\\0");
    throw InputError(fmt::format("{}: expected {} without a NUL character (\\0), got '{}'", where, expected, shown));
  }
  return s;
}
void read_value(std::string& out, const YAML::Node& n, const std::string& where) {
  out = n.IsNull() ? std::string() : string_without_nul(n, where, "a string");
}
void read_value(std::vector<std::string>& out, const YAML::Node& n, const std::string& where) {
  if (!n.IsSequence()) type_error(where, "a list of strings", n);
  out.clear();
  for (const auto& item : n) out.push_back(string_without_nul(item, where, "a list of strings"));
}
template <class E>
void read_enum(E& out, const YAML::Node& n, const std::string& where, std::initializer_list<std::pair<const char*, E>> names) {
  std::vector<std::string> all;
  for (const auto& [name, value] : names) all.emplace_back(name);
  const std::string expected = "one of " + fmt::format("{}", fmt::join(all, ", "));
  const auto s = scalar_as<std::string>(n, where, expected.c_str());
  for (const auto& [name, value] : names)
    if (s == name) {
      out = value;
      return;
    }
  type_error(where, expected, n);
}
void read_value(QuantType& out, const YAML::Node& n, const std::string& where) {
  read_enum(out, n, where, {{"nf4", QuantType::kNf4}, {"fp4", QuantType::kFp4}});
}
void read_value(ScheduleType& out, const YAML::Node& n, const std::string& where) {
  read_enum(out, n, where,
            {{"warmup_cosine", ScheduleType::kWarmupCosine}, {"linear", ScheduleType::kLinear},
             {"constant", ScheduleType::kConstant}});
}
void read_value(DType& out, const YAML::Node& n, const std::string& where) {
  read_enum(out, n, where, {{"float32", DType::kF32}, {"bfloat16", DType::kBF16}, {"float16", DType::kF16}});
}
void read_value(DeviceChoice& out, const YAML::Node& n, const std::string& where) {
  read_enum(out, n, where, {{"auto", DeviceChoice::kAuto}, {"cpu", DeviceChoice::kCpu}, {"cuda", DeviceChoice::kCuda}});
}

// Shortest decimal that reads back to the same double ("0.002", "1e-08").
std::string number_text(double v) { return fmt::format("{}", v); }

YAML::Node write_value(int64_t v) { return YAML::Node(std::to_string(v)); }
YAML::Node write_value(uint64_t v) { return YAML::Node(std::to_string(v)); }
YAML::Node write_value(double v) { return YAML::Node(number_text(v)); }
YAML::Node write_value(bool v) { return YAML::Node(v ? "true" : "false"); }
YAML::Node write_value(const std::string& v) { return YAML::Node(v); }
YAML::Node write_value(const std::vector<std::string>& v) {
  YAML::Node n(YAML::NodeType::Sequence);
  for (const auto& s : v) n.push_back(s);
  n.SetStyle(YAML::EmitterStyle::Flow);
  return n;
}
YAML::Node write_value(QuantType v) { return YAML::Node(quant_type_name(v)); }
YAML::Node write_value(ScheduleType v) { return YAML::Node(schedule_type_name(v)); }
YAML::Node write_value(DType v) {
  return YAML::Node(v == DType::kBF16 ? "bfloat16" : v == DType::kF16 ? "float16" : "float32");
}
YAML::Node write_value(DeviceChoice v) { return YAML::Node(device_choice_name(v)); }

// The YAML type of a member, in words (docs/CONFIG.md's type column), and an enum's names.
std::string type_text(const int64_t&) { return "integer"; }
std::string type_text(const uint64_t&) { return "integer >= 0"; }
std::string type_text(const double&) { return "number"; }
std::string type_text(const bool&) { return "bool"; }
std::string type_text(const std::string&) { return "string"; }
std::string type_text(const std::vector<std::string>&) { return "list of strings"; }
template <class E>
std::string type_text(const E&) { return "enum"; }
std::string enum_names(const int64_t&) { return ""; }
std::string enum_names(const uint64_t&) { return ""; }
std::string enum_names(const double&) { return ""; }
std::string enum_names(const bool&) { return ""; }
std::string enum_names(const std::string&) { return ""; }
std::string enum_names(const std::vector<std::string>&) { return ""; }
std::string enum_names(const QuantType&) { return "nf4, fp4"; }
std::string enum_names(const ScheduleType&) { return "warmup_cosine, linear, constant"; }
std::string enum_names(const DType&) { return "float32, bfloat16, float16"; }
std::string enum_names(const DeviceChoice&) { return "auto, cpu, cuda"; }

// `allowed` and `doc` may be left out (a key added without them): CONFIG.md's test then fails.
template <class Access>
Field make_field(std::string key, Access access, std::string allowed = "", std::string doc = "") {
  Field f;
  f.key = std::move(key);
  TrainConfig probe;
  f.type = type_text(access(probe));
  f.allowed = allowed.empty() ? enum_names(access(probe)) : std::move(allowed);
  f.doc = std::move(doc);
  f.set = [access](TrainConfig& c, const YAML::Node& n, const std::string& where) { read_value(access(c), n, where); };
  f.get = [access](const TrainConfig& c) { return write_value(access(const_cast<TrainConfig&>(c))); };
  return f;
}

// QS_FIELD(key, member, allowed, doc): one leaf key, the member it reads into, the values it
// accepts in words ("" for an enum: its names) and one line of meaning.
#define QS_FIELD(key, member, ...) make_field(key, [](TrainConfig& c) -> auto& { return c.member; }, ##__VA_ARGS__)

// checkpoint.dir: "" in the struct is written as `none` (nothing saved), so that the YAML reads
// back to the same config through load_train_config too (where unset means the default folder).
Field checkpoint_dir_field() {
  Field f = QS_FIELD("checkpoint.dir", checkpoint.dir, "a folder, or none (unset in a job file: runs/<its stem>)",
                     "the run folder: checkpoints (step-N), the final exports, config.resolved.yaml; none saves nothing");
  f.get = [](const TrainConfig& c) {
    return write_value(c.checkpoint.dir.empty() ? std::string(kNoCheckpointDir) : c.checkpoint.dir);
  };
  return f;
}

const std::vector<Field>& fields() {
  static const std::vector<Field> kFields = {
      QS_FIELD("model.path", model.path, "a Hugging Face Llama folder (float or bitsandbytes 4-bit), or empty",
               "the base model; empty: a random Llama made from model.init"),
      QS_FIELD("model.init.vocab_size", model.init.vocab_size, "1 to 2^24",
               "vocab_size of the random Llama (model.path empty; 258 = the byte tokenizer)"),
      QS_FIELD("model.init.hidden_size", model.init.hidden_size,
               "1 to 2^20, a multiple of num_attention_heads giving an even head dimension",
               "hidden_size of the random Llama"),
      QS_FIELD("model.init.intermediate_size", model.init.intermediate_size, "1 to 2^22",
               "intermediate_size (MLP width) of the random Llama"),
      QS_FIELD("model.init.num_hidden_layers", model.init.num_hidden_layers, "1 to 4096",
               "decoder layers of the random Llama"),
      QS_FIELD("model.init.num_attention_heads", model.init.num_attention_heads, "1 to 2^14",
               "attention heads of the random Llama"),
      QS_FIELD("model.init.num_key_value_heads", model.init.num_key_value_heads, "> 0, a divisor of num_attention_heads",
               "key/value heads of the random Llama (grouped-query attention)"),
      QS_FIELD("model.init.max_position_embeddings", model.init.max_position_embeddings,
               "1 to 2^24, >= data.max_seq_len", "positions of the random Llama"),
      QS_FIELD("model.init.seed", model.init.seed, "any",
               "the random weights' seed (qshard init-model --seed writes the same weights)"),
      QS_FIELD("model.init.dtype", model.init.dtype, "",
               "dtype of the random base's float tensors and of its 4-bit weights' quant state"),
      QS_FIELD("model.init.draw_4bit", model.init.draw_4bit, "true, false",
               "draw the 4-bit projections directly in 4-bit (faster, another base; a resume must keep it)"),
      QS_FIELD("model.quant_type", model.quant_type, "", "the 4-bit code of the frozen base (bitsandbytes)"),
      QS_FIELD("model.blocksize", model.blocksize, "a power of two in [32, 4096]",
               "elements per 4-bit absmax block"),
      QS_FIELD("model.double_quant", model.double_quant, "true, false",
               "quantize the absmax statistics too (bitsandbytes double quantization)"),
      QS_FIELD("model.allow_nonfinite", model.allow_nonfinite, "true, false",
               "load weights, adapters and checkpoints holding NaN/Inf (refused by default; --allow-nonfinite)"),
      QS_FIELD("lora.r", lora.r, "1 to 65536", "LoRA rank"),
      QS_FIELD("lora.alpha", lora.alpha, "> 0, at most 1e6", "LoRA alpha: the update is scaled by alpha / r"),
      QS_FIELD("lora.dropout", lora.dropout, "in [0, 1)", "dropout on the LoRA input"),
      QS_FIELD("lora.rslora", lora.rslora, "true, false", "scale by alpha / sqrt(r) instead of alpha / r"),
      QS_FIELD("lora.target_modules", lora.target_modules,
               "a non-empty list of distinct q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj "
               "(Phi-3: qkv_proj, o_proj, gate_up_proj, down_proj; all seven, the default, mean all four)",
               "the projections that get a LoRA adapter, as PEFT names them for the model's family"),
      QS_FIELD("lora.init_adapter", lora.init_adapter, "a PEFT adapter folder with the same r, alpha, rslora, modules, or empty",
               "start from this adapter's LoRA weights instead of PEFT's init"),
      QS_FIELD("lora.fold", lora.fold, "true, false",
               "fold LoRA into the fused q|k|v and gate|up GEMMs (how it computes, not what; a resume may change it)"),
      QS_FIELD("lora.fuse_qkv_backward", lora.fuse_qkv_backward, "true, false",
               "with lora.fold: attention's gradients side by side and q|k|v's input gradient one GEMM (how it "
               "computes, not what; a resume may change it; off until measured on a GPU)"),
      QS_FIELD("optimizer.lr", optimizer.lr, "> 0", "AdamW's peak learning rate (the schedule scales it)"),
      QS_FIELD("optimizer.beta1", optimizer.beta1, "in [0, 1)", "AdamW's first-moment decay"),
      QS_FIELD("optimizer.beta2", optimizer.beta2, "in [0, 1)", "AdamW's second-moment decay"),
      QS_FIELD("optimizer.eps", optimizer.eps, "> 0", "AdamW's epsilon"),
      QS_FIELD("optimizer.weight_decay", optimizer.weight_decay, ">= 0", "AdamW's decoupled weight decay"),
      QS_FIELD("optimizer.grad_clip", optimizer.grad_clip, ">= 0 (0 = no clipping)",
               "the largest global L2 norm of the gradients"),
      QS_FIELD("schedule.type", schedule.type, "", "the learning-rate schedule"),
      QS_FIELD("schedule.warmup_steps", schedule.warmup_steps, "0 to the run's steps",
               "steps of linear warmup from 0 to optimizer.lr"),
      QS_FIELD("schedule.min_lr_ratio", schedule.min_lr_ratio, "in [0, 1]",
               "the final learning rate as a fraction of optimizer.lr (warmup_cosine, linear)"),
      QS_FIELD("data.train", data.train, "a token file (qshard tokenize)", "the training data (required)"),
      QS_FIELD("data.eval", data.eval, "a token file, or empty", "separate evaluation data"),
      QS_FIELD("data.eval_fraction", data.eval_fraction, "in [0, 1); 0 when data.eval is set",
               "hold out this fraction of the packed training sequences for evaluation"),
      QS_FIELD("data.max_seq_len", data.max_seq_len, "1 to 2^24, within the model's positions",
               "tokens per training sequence"),
      QS_FIELD("data.packing", data.packing, "auto, wrapped, padded, packed",
               "packed: several documents per sequence, attention and positions restarting at each (no padding "
               "computed); padded: one document per sequence; wrapped: documents back to back across sequences, "
               "attending across; auto: packed when the token files mark their documents (qshard tokenize's "
               "do), else wrapped"),
      QS_FIELD("data.seed", data.seed, "any", "the data sampler's shuffle seed"),
      QS_FIELD("batch.global_batch_size", batch.global_batch_size,
               "1 to 2^30, a multiple of micro_batch_size x ranks", "sequences per optimizer step over all ranks"),
      QS_FIELD("batch.micro_batch_size", batch.micro_batch_size, "0 to global_batch_size",
               "sequences per forward/backward on one rank; 0: the memory plan chooses"),
      QS_FIELD("steps", steps, "0 to 2^40; exactly one of steps and epochs > 0", "optimizer steps of the run"),
      QS_FIELD("epochs", epochs, "0 to 2^20; exactly one of steps and epochs > 0",
               "passes over the training data (instead of steps)"),
      QS_FIELD("offload.params", offload.params, "true, false",
               "keep the frozen base's shards in pinned host memory"),
      QS_FIELD("offload.optimizer", offload.optimizer, "true, false",
               "keep LoRA masters and AdamW state in host memory and run AdamW on the host"),
      QS_FIELD("memory.gpu_budget_gb", memory.gpu_budget_gb, "in [0, 1e6] (0 = no plan)",
               "plan the step to fit this many GB (1e9 bytes) of GPU memory"),
      QS_FIELD("memory.keep_layers", memory.keep_layers, ">= -1 (-1 = the plan's choice)",
               "decoder layers whose activations are kept instead of recomputed"),
      QS_FIELD("memory.mlp_chunk_tokens", memory.mlp_chunk_tokens, "-1 (auto), 0 (never) or up to 2^28",
               "rows per MLP chunk"),
      QS_FIELD("memory.host_keep_layers", memory.host_keep_layers, ">= -1 (-1 = the plan's choice)",
               "more layers whose activations are kept in pinned host memory instead of recomputed"),
      QS_FIELD("memory.host_budget_gb", memory.host_budget_gb, "in [0, 1e6] (0 = half the host's free memory)",
               "pinned host memory the plan may give host-kept layers, or the layer inputs with memory.host_checkpoints (GB = 1e9 bytes)"),
      QS_FIELD("memory.host_checkpoints", memory.host_checkpoints, "auto, true, false",
               "keep the layer inputs (activation checkpoints) in pinned host memory, three on the GPU, more where "
               "memory.host_budget_gb holds fewer (auto: the memory plan's choice; off without a budget)"),
      QS_FIELD("memory.checkpoint_every", memory.checkpoint_every, "0, 1, 2 (0 = the plan's choice)",
               "keep every layer input for the backward (1) or every second one (2: each odd layer's input is "
               "recomputed from the one before, about half the layers' forward again; needs every layer recomputed)"),
      QS_FIELD("memory.kept_mlp", memory.kept_mlp, "true, false, device, auto",
               "kept layers (device and host) keep the MLP's gate / up projections (true), or their backward "
               "recomputes those two GEMMs, a third of a kept layer's bytes at 8B (false); device: the layers kept on "
               "the GPU keep them, the host-kept ones do not (their copies carry a third of the bytes); auto: the "
               "memory plan's choice of the three by its cost model (true without a budget)"),
      QS_FIELD("memory.host_staging_sets", memory.host_staging_sets, "in [1, 8]",
               "the device staging sets the host-kept layers go through (2: the default): more let their copies "
               "run further behind the compute, each one host-kept layer's set of GPU memory"),
      QS_FIELD("memory.full_kept_layers", memory.full_kept_layers, ">= -1 (-1 = the plan's choice)",
               "of the layers kept on the GPU, how many also keep their RMSNorm outputs and SwiGLU's output, so that "
               "their backward reruns nothing (about half a kept layer's bytes again at 8B; -1: once every layer is "
               "kept, as many as the budget's room left holds; none without a budget)"),
      QS_FIELD("memory.dequantized_layers", memory.dequantized_layers, ">= -1 (-1 = the plan's choice)",
               "how many layers keep their base weights dequantized on the GPU from their first use on (4-bit "
               "projections in bf16, as the GEMMs read them: about a layer's bf16 weights each, 436 MB at 8B), so "
               "that later binds dequantize nothing; -1: once every layer is kept and every kept set is full, as "
               "many as the budget's room left holds; none without a budget or on the CPU"),
      QS_FIELD("memory.base", memory.base, "auto, gpu",
               "where the frozen base lives with offload.params off: the GPU (gpu), or the memory plan's choice "
               "(auto: pinned host memory where the budget needs it or that is faster)"),
      QS_FIELD("memory.embedding", memory.embedding, "auto, gpu, host",
               "where the embedding table lives: the GPU, pinned host memory (the step's rows read in place), or "
               "the memory plan's choice (auto; the GPU without a budget)"),
      checkpoint_dir_field(),
      QS_FIELD("checkpoint.every_steps", checkpoint.every_steps, ">= 0 (0 = only at the end)",
               "save a checkpoint every this many steps"),
      QS_FIELD("checkpoint.keep_last", checkpoint.keep_last, ">= 0 (0 = keep all)", "complete checkpoints kept"),
      QS_FIELD("checkpoint.resume", checkpoint.resume, "empty, auto or a checkpoint folder",
               "resume from a checkpoint (auto: the newest in checkpoint.dir, if any; --resume)"),
      QS_FIELD("checkpoint.stop_after_steps", checkpoint.stop_after_steps, ">= 0 (0 = run to the end)",
               "save and stop after this many steps (the schedule still spans the run; resume later)"),
      QS_FIELD("checkpoint.allow_schedule_change", checkpoint.allow_schedule_change, "true, false",
               "resume under another LR schedule than the checkpoint's (e.g. more steps; refused by default; "
               "--allow-schedule-change); never saved"),
      QS_FIELD("logging.every_steps", logging.every_steps, "> 0", "print a progress line every this many steps"),
      QS_FIELD("logging.metrics_jsonl", logging.metrics_jsonl, "a file path, or empty",
               "write one JSON line of metrics per logged step here"),
      QS_FIELD("logging.tensorboard_dir", logging.tensorboard_dir, "a folder, or empty",
               "also write the metrics as TensorBoard scalars: a new event file in this folder per job"),
      QS_FIELD("logging.eval_every_steps", logging.eval_every_steps, ">= 0 (0 = at the end)",
               "evaluate every this many steps (when there is eval data)"),
      QS_FIELD("logging.profile", logging.profile, "true, false",
               "time the compute stream's parts and print the split at the end (GPU only)"),
      QS_FIELD("logging.gemm_tflops", logging.gemm_tflops, "-1 (measure), 0 (no MFU) or > 0",
               "the GPU's bf16 GEMM rate in TFLOP/s, MFU's denominator"),
      QS_FIELD("runtime.collective_timeout_s", runtime.collective_timeout_s, "0 (off) or in [1, 86400]",
               "end the job when a collective has not returned after this many seconds (env QSHARD_COLLECTIVE_TIMEOUT_S wins)"),
      QS_FIELD("runtime.host_memory_bytes", runtime.host_memory_bytes, "in [0, 1e18] (0 = what the machine reports)",
               "cap the host memory the checks and plans count on (env QSHARD_HOST_MEMORY_BYTES wins)"),
      QS_FIELD("runtime.nccl_blocking", runtime.nccl_blocking, "true, false",
               "NCCL communicators in blocking mode (env QSHARD_NCCL_BLOCKING=0|1 wins)"),
      QS_FIELD("seed", seed, "any", "the LoRA init and dropout seed"),
      QS_FIELD("device", device, "",
               "auto (default): the rank's GPU when the build has the CUDA backend and one is usable, else the CPU; "
               "cuda without a GPU is an error"),
  };
  return kFields;
}

#undef QS_FIELD

const Field* find_field(const std::string& key) {
  for (const auto& f : fields())
    if (f.key == key) return &f;
  return nullptr;
}

bool is_section(const std::string& key) {
  for (const auto& f : fields())
    if (f.key.size() > key.size() && f.key.compare(0, key.size(), key) == 0 && f.key[key.size()] == '.') return true;
  return false;
}

std::string last_component(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

std::string section_of(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? std::string() : key.substr(0, dot);
}

// The words of a leaf ("max_seq_len" -> max, seq, len), a plural's trailing 's' dropped.
std::vector<std::string> leaf_words(const std::string& leaf) {
  std::vector<std::string> words;
  std::stringstream ss(leaf);
  for (std::string w; std::getline(ss, w, '_');) {
    if (w.size() > 3 && w.back() == 's') w.pop_back();
    if (!w.empty()) words.push_back(w);
  }
  return words;
}

std::string initials(const std::vector<std::string>& words) {
  std::string s;
  for (const auto& w : words) s += w[0];
  return s;
}

// How far leaf `a` (the user's) is from leaf `b` (a real key's): the edit distance, or less when
// one is the other's initials (learning_rate ~ lr: 1) or the words of one are all among the
// other's (targets ~ target_modules, seq_len ~ max_seq_len: the words left over).
size_t leaf_distance(const std::string& a, const std::string& b) {
  size_t d = edit_distance(a, b);
  const auto wa = leaf_words(a), wb = leaf_words(b);
  if (wa.size() > 1 && initials(wa) == b) d = std::min<size_t>(d, 1);
  if (wb.size() > 1 && initials(wb) == a) d = std::min<size_t>(d, 1);
  auto all_in = [](const std::vector<std::string>& x, const std::vector<std::string>& y) {
    for (const auto& w : x)
      if (std::find(y.begin(), y.end(), w) == y.end()) return false;
    return true;
  };
  if (!wa.empty() && !wb.empty() && (all_in(wa, wb) || all_in(wb, wa)))
    d = std::min<size_t>(d, std::max(wa.size(), wb.size()) - std::min(wa.size(), wb.size()));
  return d;
}

// The nearest full dotted key (or section) to an unknown `key`, compared part by part: the leaf
// against each key's leaf (leaf_distance), plus 0 for a key in the same section, 1 when `key` is
// top-level or its section does not exist (a misspelt or invented section: the leaf decides) and
// 2 when it names another real section (a key of the section the user chose is preferred); ties
// go to the nearer section, then the nearer full key.
std::string nearest_key(const std::string& key) {
  std::vector<std::string> candidates;
  std::set<std::string> sections;
  for (const auto& f : fields()) {
    candidates.push_back(f.key);
    for (std::string s = section_of(f.key); !s.empty(); s = section_of(s)) sections.insert(s);
  }
  candidates.insert(candidates.end(), sections.begin(), sections.end());
  const std::string section = section_of(key), leaf = last_component(key);
  const bool real_section = sections.count(section) > 0;
  std::string best;
  std::tuple<size_t, size_t, size_t> best_score{SIZE_MAX, SIZE_MAX, SIZE_MAX};
  for (const auto& c : candidates) {
    const std::string cs = section_of(c);
    const size_t section_cost = cs == section ? 0 : real_section ? 2 : 1;
    const std::tuple<size_t, size_t, size_t> score{leaf_distance(leaf, last_component(c)) + section_cost,
                                                   edit_distance(section, cs), edit_distance(key, c)};
    if (score < best_score) best_score = score, best = c;
  }
  return best;
}

[[noreturn]] void unknown_key(const std::string& source, const std::string& key) {
  throw InputError(fmt::format("{}: unknown key '{}' (did you mean '{}'?)", source, key, nearest_key(key)));
}

void apply_node(TrainConfig& c, const YAML::Node& map, const std::string& prefix, const std::string& source) {
  std::set<std::string> seen;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) throw InputError(fmt::format("{}: keys must be plain names (under '{}')", source, prefix));
    const std::string key = prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
    if (!seen.insert(key).second) throw InputError(fmt::format("{}: duplicate key '{}'", source, key));
    if (const Field* f = find_field(key)) {
      f->set(c, kv.second, fmt::format("{}: key '{}'", source, key));
    } else if (is_section(key)) {
      if (kv.second.IsNull()) continue;  // an empty section keeps the defaults
      if (!kv.second.IsMap())
        throw InputError(fmt::format("{}: key '{}' is a section: expected a mapping", source, key));
      apply_node(c, kv.second, key, source);
    } else {
      unknown_key(source, key);
    }
  }
}

// ---- validation helpers ---------------------------------------------------------------------

struct Checker {
  const std::string& source;
  template <class V>
  void require(bool ok, const char* key, const V& value, const std::string& expected) const {
    if (!ok) throw InputError(fmt::format("{}: {} = {}: expected {}", source, key, value, expected));
  }
};

const std::vector<std::string>& lora_module_names() {
  // Phi-3's fused qkv_proj / gate_up_proj too; which names the model's family has is checked when
  // the model is known (tree_lora_targets).
  static const std::vector<std::string> k = {"q_proj",  "k_proj",    "v_proj",       "o_proj",  "gate_proj",
                                             "up_proj", "down_proj", "qkv_proj", "gate_up_proj"};
  return k;
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::vector<ConfigKeyInfo> config_key_infos() {
  const TrainConfig defaults;
  std::vector<ConfigKeyInfo> out;
  for (const auto& f : fields()) {
    YAML::Emitter e;
    e << f.get(defaults);
    out.push_back({f.key, f.type, e.c_str(), f.allowed, f.doc});
  }
  return out;
}

std::string nearest_config_key(const std::string& key) { return nearest_key(key); }

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  for (const auto& f : fields()) keys.push_back(f.key);
  return keys;
}

std::string config_value(const TrainConfig& config, const std::string& key) {
  const Field* f = find_field(key);
  QS_CHECK(f != nullptr, "unknown config key " + key);
  return YAML::Dump(f->get(config));
}

void apply_override(TrainConfig& c, const std::string& assignment) {
  const std::string source = "--set " + assignment;
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw InputError(fmt::format("{}: expected key=value (e.g. --set optimizer.lr=1e-4)", source));
  const std::string key = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  const Field* f = find_field(key);
  if (f == nullptr) {
    if (is_section(key)) throw InputError(fmt::format("{}: '{}' is a section; set one of its keys", source, key));
    unknown_key(source, key);
  }
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}: value is not valid YAML: {}", source, e.msg));
  }
  f->set(c, value, fmt::format("{}: key '{}'", source, key));
  c.source += " + --set " + key;
}

// The number of YAML documents in `text`: a `---` line (at column 0, alone or followed by a blank)
// starts one; content before the first marker is a document of its own; a `...` line ends one.
static int yaml_documents(const std::string& text) {
  int docs = 0;
  bool open = false;  // inside a document that has content or an explicit start
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string_view line(text.data() + pos, end - pos);
    const bool marker = line.substr(0, 3) == "---" && (line.size() == 3 || line[3] == ' ' || line[3] == '\t' ||
                                                       line[3] == '\r');
    const bool ender = line.substr(0, 3) == "..." && (line.size() == 3 || line[3] == ' ' || line[3] == '\r');
    const size_t first = line.find_first_not_of(" \t\r");
    const bool content = first != std::string_view::npos && line[first] != '#' && line[0] != '%';  // not a directive
    if (marker) {
      ++docs;
      open = true;
    } else if (ender) {
      open = false;
    } else if (content && !open) {
      ++docs;
      open = true;
    }
    pos = end + 1;
  }
  return docs;
}

namespace {

// The file's keys and overrides over the defaults; checkpoint.dir as written (`none` kept).
TrainConfig parse_as_written(const std::string& yaml_text, const std::string& label,
                             const std::vector<std::string>& overrides) {
  TrainConfig c;
  c.source = label;
  // One document: a second one (after a `---` line) would otherwise be dropped without a word.
  // Found from the text (a `---` at column 0 always marks a document in YAML), not with
  // YAML::LoadAll, which loops for ever on some malformed input in yaml-cpp 0.7 (found by fuzzing).
  if (const int docs = yaml_documents(yaml_text); docs > 1)
    throw InputError(fmt::format("{}: holds {} YAML documents (separated by ---); a job is one document", label, docs));
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::DeepRecursion& e) {  // yaml-cpp's depth guard (its message is a bare "bad file")
    throw InputError(fmt::format("{}: YAML nested more than {} levels deep (line {}, column {}); refused (a job nests "
                                 "3 levels)",
                                 label, e.depth(), e.mark.line + 1, e.mark.column + 1));
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}: not valid YAML (line {}, column {}): {}", label, e.mark.line + 1,
                                 e.mark.column + 1, e.msg));
  }
  if (!root.IsNull()) {
    if (!root.IsMap()) throw InputError(fmt::format("{}: the top level must be a mapping of sections", label));
    apply_node(c, root, "", label);
  }
  for (const auto& o : overrides) apply_override(c, o);
  return c;
}

}  // namespace

TrainConfig parse_train_config(const std::string& yaml_text, const std::string& label,
                               const std::vector<std::string>& overrides) {
  TrainConfig c = parse_as_written(yaml_text, label, overrides);
  if (c.checkpoint.dir == kNoCheckpointDir) c.checkpoint.dir.clear();
  return c;
}

std::string default_run_dir(const std::string& config_path) {
  std::string stem = std::filesystem::path(config_path).stem().string();
  if (stem.empty() || stem == "." || stem == "..") stem = "job";
  return (std::filesystem::path(kRunsRoot) / stem).string();
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  // A regular file of at most 64 MiB: a folder, a FIFO or /dev/zero is refused by name.
  TrainConfig c = parse_as_written(read_input_file(path, "config file"), path, overrides);
  if (c.checkpoint.dir == kNoCheckpointDir) c.checkpoint.dir.clear();   // saving nothing, asked for
  else if (c.checkpoint.dir.empty()) c.checkpoint.dir = default_run_dir(path);  // never lose the work
  return c;
}

void TrainConfig::validate(int world_size) const {
  QS_CHECK(world_size >= 1, "world_size must be >= 1");
  const Checker ck{source};
  // model
  if (model.path.empty()) {
    const auto& m = model.init;
    for (const auto& [key, v, cap] : {std::tuple{"model.init.vocab_size", m.vocab_size, int64_t{1} << 24},
                                      std::tuple{"model.init.hidden_size", m.hidden_size, int64_t{1} << 20},
                                      std::tuple{"model.init.intermediate_size", m.intermediate_size, int64_t{1} << 22},
                                      std::tuple{"model.init.num_hidden_layers", m.num_hidden_layers, int64_t{4096}},
                                      std::tuple{"model.init.num_attention_heads", m.num_attention_heads, int64_t{1} << 14},
                                      std::tuple{"model.init.max_position_embeddings", m.max_position_embeddings,
                                                 kMaxSeqLen}})
      ck.require(v <= cap, key, v, fmt::format("<= {}", cap));
    ck.require(m.vocab_size > 0, "model.init.vocab_size", m.vocab_size, "> 0");
    ck.require(m.hidden_size > 0, "model.init.hidden_size", m.hidden_size, "> 0");
    ck.require(m.intermediate_size > 0, "model.init.intermediate_size", m.intermediate_size, "> 0");
    ck.require(m.num_hidden_layers > 0, "model.init.num_hidden_layers", m.num_hidden_layers, "> 0");
    ck.require(m.num_attention_heads > 0, "model.init.num_attention_heads", m.num_attention_heads, "> 0");
    ck.require(m.num_key_value_heads > 0, "model.init.num_key_value_heads", m.num_key_value_heads, "> 0");
    ck.require(m.max_position_embeddings > 0, "model.init.max_position_embeddings", m.max_position_embeddings, "> 0");
    ck.require(m.hidden_size % m.num_attention_heads == 0, "model.init.hidden_size", m.hidden_size,
               fmt::format("a multiple of model.init.num_attention_heads ({})", m.num_attention_heads));
    ck.require((m.hidden_size / m.num_attention_heads) % 2 == 0, "model.init.hidden_size", m.hidden_size,
               "an even head dimension (hidden_size / num_attention_heads) for RoPE");
    ck.require(m.num_attention_heads % m.num_key_value_heads == 0, "model.init.num_key_value_heads",
               m.num_key_value_heads,
               fmt::format("a divisor of model.init.num_attention_heads ({})", m.num_attention_heads));
    ck.require(data.max_seq_len <= m.max_position_embeddings, "data.max_seq_len", data.max_seq_len,
               fmt::format("<= model.init.max_position_embeddings ({})", m.max_position_embeddings));
  }
  const bool pow2 = model.blocksize > 0 && (model.blocksize & (model.blocksize - 1)) == 0;
  ck.require(pow2 && model.blocksize >= 32 && model.blocksize <= 4096, "model.blocksize", model.blocksize,
             "a power of two in [32, 4096]");
  // lora
  ck.require(lora.r > 0 && lora.r <= kMaxLoraRank, "lora.r", lora.r, fmt::format("in [1, {}]", kMaxLoraRank));
  ck.require(lora.alpha > 0 && lora.alpha <= kMaxLoraAlpha, "lora.alpha", lora.alpha, fmt::format("in (0, {:g}]", kMaxLoraAlpha));
  ck.require(lora.dropout >= 0 && lora.dropout < 1, "lora.dropout", lora.dropout, "in [0, 1)");
  ck.require(!lora.target_modules.empty(), "lora.target_modules", "[]", "at least one module");
  std::set<std::string> seen;
  for (const auto& m : lora.target_modules) {
    const auto& names = lora_module_names();
    ck.require(std::find(names.begin(), names.end(), m) != names.end(), "lora.target_modules", m,
               fmt::format("one of {}", fmt::join(names, ", ")));
    ck.require(seen.insert(m).second, "lora.target_modules", m, "each module once");
  }
  // optimizer
  ck.require(optimizer.lr > 0, "optimizer.lr", optimizer.lr, "> 0");
  ck.require(optimizer.beta1 >= 0 && optimizer.beta1 < 1, "optimizer.beta1", optimizer.beta1, "in [0, 1)");
  ck.require(optimizer.beta2 >= 0 && optimizer.beta2 < 1, "optimizer.beta2", optimizer.beta2, "in [0, 1)");
  ck.require(optimizer.eps > 0, "optimizer.eps", optimizer.eps, "> 0");
  ck.require(optimizer.weight_decay >= 0, "optimizer.weight_decay", optimizer.weight_decay, ">= 0");
  ck.require(optimizer.grad_clip >= 0, "optimizer.grad_clip", optimizer.grad_clip, ">= 0 (0 = no clipping)");
  // schedule
  ck.require(schedule.warmup_steps >= 0, "schedule.warmup_steps", schedule.warmup_steps, ">= 0");
  ck.require(schedule.min_lr_ratio >= 0 && schedule.min_lr_ratio <= 1, "schedule.min_lr_ratio",
             schedule.min_lr_ratio, "in [0, 1]");
  // steps / epochs
  ck.require(steps >= 0 && steps <= kMaxSteps, "steps", steps, fmt::format("in [0, {}]", kMaxSteps));
  ck.require(epochs >= 0 && epochs <= kMaxEpochs, "epochs", epochs, fmt::format("in [0, {}]", kMaxEpochs));
  ck.require((steps > 0) != (epochs > 0), "steps", steps,
             fmt::format("exactly one of steps and epochs > 0 (epochs = {}; set the other to 0)", epochs));
  if (steps > 0)
    ck.require(schedule.warmup_steps <= steps, "schedule.warmup_steps", schedule.warmup_steps,
               fmt::format("<= steps ({})", steps));
  // data
  ck.require(!data.train.empty(), "data.train", "''", "a token file path");
  ck.require(data.max_seq_len > 0, "data.max_seq_len", data.max_seq_len, "> 0");
  ck.require(data.packing == "auto" || data.packing == "wrapped" || data.packing == "padded" ||
                 data.packing == "packed",
             "data.packing", data.packing, "auto, wrapped, padded or packed");
  ck.require(data.eval_fraction >= 0 && data.eval_fraction < 1, "data.eval_fraction", data.eval_fraction, "in [0, 1)");
  ck.require(data.eval.empty() || data.eval_fraction == 0, "data.eval_fraction", data.eval_fraction,
             fmt::format("0 when data.eval is set ('{}'): use one or the other", data.eval));
  // batch
  ck.require(batch.global_batch_size > 0, "batch.global_batch_size", batch.global_batch_size, "> 0");
  ck.require(batch.micro_batch_size >= 0, "batch.micro_batch_size", batch.micro_batch_size,
             "> 0, or 0 (the memory plan chooses)");
  // Upper bounds keep every product below (micro x world, micro x seq_len x hidden x layers, epochs x
  // batches) inside int64: a value past them is a typo or an attack, never a job.
  ck.require(batch.global_batch_size <= kMaxBatch, "batch.global_batch_size", batch.global_batch_size,
             fmt::format("<= {}", kMaxBatch));
  ck.require(batch.micro_batch_size <= batch.global_batch_size, "batch.micro_batch_size", batch.micro_batch_size,
             fmt::format("<= batch.global_batch_size ({})", batch.global_batch_size));
  ck.require(data.max_seq_len <= kMaxSeqLen, "data.max_seq_len", data.max_seq_len, fmt::format("<= {}", kMaxSeqLen));
  ck.require(batch.micro_batch_size * data.max_seq_len <= kMaxMicroTokens, "batch.micro_batch_size",
             batch.micro_batch_size,
             fmt::format("x data.max_seq_len ({}) <= {} tokens per micro-batch", data.max_seq_len, kMaxMicroTokens));
  const int64_t per_step = std::max<int64_t>(batch.micro_batch_size, 1) * world_size;  // both <= 2^30 here
  ck.require(batch.global_batch_size % per_step == 0, "batch.global_batch_size", batch.global_batch_size,
             fmt::format("a multiple of batch.micro_batch_size x world size = {} x {} = {}", batch.micro_batch_size,
                         world_size, per_step));
  // memory
  ck.require(memory.embedding == "auto" || memory.embedding == "gpu" || memory.embedding == "host", "memory.embedding",
             memory.embedding, "auto, gpu or host");
  ck.require(memory.base == "auto" || memory.base == "gpu", "memory.base", memory.base, "auto or gpu");
  ck.require(memory.base != "gpu" || !offload.params, "memory.base", memory.base,
             "auto with offload.params: true (the base goes to pinned host memory), or set offload.params: false");
  ck.require(memory.host_checkpoints == "auto" || memory.host_checkpoints == "true" ||
                 memory.host_checkpoints == "false",
             "memory.host_checkpoints", memory.host_checkpoints, "auto, true or false");
  ck.require(memory.kept_mlp == "auto" || memory.kept_mlp == "true" || memory.kept_mlp == "false" ||
                 memory.kept_mlp == "device",
             "memory.kept_mlp", memory.kept_mlp, "auto, true, false or device");
  ck.require(memory.gpu_budget_gb >= 0 && memory.gpu_budget_gb <= 1e6, "memory.gpu_budget_gb", memory.gpu_budget_gb,
             "a number of GB in [0, 1e6] (0 = no plan)");
  ck.require(memory.keep_layers >= -1, "memory.keep_layers", memory.keep_layers, ">= -1 (-1 = the plan's choice)");
  ck.require(memory.host_staging_sets >= 1 && memory.host_staging_sets <= 8, "memory.host_staging_sets",
             memory.host_staging_sets, "in [1, 8]");
  ck.require(memory.full_kept_layers >= -1, "memory.full_kept_layers", memory.full_kept_layers,
             ">= -1 (-1 = the plan's choice)");
  ck.require(memory.dequantized_layers >= -1, "memory.dequantized_layers", memory.dequantized_layers,
             ">= -1 (-1 = the plan's choice)");
  ck.require(memory.mlp_chunk_tokens >= -1 && memory.mlp_chunk_tokens <= kMaxMicroTokens, "memory.mlp_chunk_tokens",
             memory.mlp_chunk_tokens, fmt::format("in [-1, {}] (-1 = auto, 0 = never)", kMaxMicroTokens));
  ck.require(memory.host_keep_layers >= -1, "memory.host_keep_layers", memory.host_keep_layers,
             ">= -1 (-1 = the plan's choice)");
  ck.require(memory.host_budget_gb >= 0 && memory.host_budget_gb <= 1e6, "memory.host_budget_gb",
             memory.host_budget_gb, "a number of GB in [0, 1e6] (0 = half the host's free memory)");
  ck.require(memory.checkpoint_every >= 0 && memory.checkpoint_every <= 2, "memory.checkpoint_every",
             memory.checkpoint_every, "0, 1 or 2 (0 = the plan's choice)");
  ck.require(memory.checkpoint_every != 2 || memory.keep_layers <= 1, "memory.checkpoint_every",
             memory.checkpoint_every,
             fmt::format("1 or 0 with memory.keep_layers = {} (every second checkpoint reruns layers' forward: "
                         "every layer but the last must be recomputed, memory.keep_layers <= 1)",
                         memory.keep_layers));
  ck.require(memory.checkpoint_every != 2 || memory.host_keep_layers <= 0, "memory.checkpoint_every",
             memory.checkpoint_every,
             fmt::format("1 or 0 with memory.host_keep_layers = {} (every second checkpoint needs no host-kept "
                         "layers)",
                         memory.host_keep_layers));
  // checkpoint, logging
  ck.require(checkpoint.every_steps >= 0, "checkpoint.every_steps", checkpoint.every_steps, ">= 0 (0 = at the end)");
  ck.require(checkpoint.keep_last >= 0, "checkpoint.keep_last", checkpoint.keep_last, ">= 0 (0 = keep all)");
  ck.require(checkpoint.stop_after_steps >= 0, "checkpoint.stop_after_steps", checkpoint.stop_after_steps,
             ">= 0 (0 = run to the end)");
  ck.require(checkpoint.stop_after_steps == 0 || !checkpoint.dir.empty(), "checkpoint.stop_after_steps",
             checkpoint.stop_after_steps, "0 when checkpoint.dir is none (stopping early needs a checkpoint to resume)");
  ck.require(checkpoint.resume != "auto" || !checkpoint.dir.empty(), "checkpoint.resume", checkpoint.resume,
             "a checkpoint path when checkpoint.dir is none ('auto' looks in checkpoint.dir)");
  ck.require(logging.every_steps > 0, "logging.every_steps", logging.every_steps, "> 0");
  ck.require(logging.eval_every_steps >= 0, "logging.eval_every_steps", logging.eval_every_steps, ">= 0");
  ck.require(logging.gemm_tflops == -1 || logging.gemm_tflops >= 0, "logging.gemm_tflops", logging.gemm_tflops,
             "-1 (measure at start), 0 (no MFU) or a bf16 GEMM rate in TFLOP/s (> 0)");
  // runtime (the same ranges as the environment variables: runtime/failure.h, runtime/machine.h)
  ck.require(runtime.collective_timeout_s == 0 ||
                 (runtime.collective_timeout_s >= 1 && runtime.collective_timeout_s <= 86400),
             "runtime.collective_timeout_s", runtime.collective_timeout_s, "0 (off) or a number of seconds in [1, 86400]");
  ck.require(runtime.host_memory_bytes >= 0 && runtime.host_memory_bytes <= 1e18, "runtime.host_memory_bytes",
             runtime.host_memory_bytes, "in [0, 1e18] (0 = what the machine reports)");
}

int64_t TrainConfig::max_steps(int64_t num_train_sequences) const {
  int64_t s = steps;
  if (s <= 0) {
    // epochs <= 2^20 and batches <= 2^62 / ... : checked, not wrapped.
    if (__builtin_mul_overflow(epochs, num_train_sequences / batch.global_batch_size, &s) || s > kMaxSteps)
      throw InputError(fmt::format("{}: epochs = {} x {} batches per epoch is more than {} optimizer steps", source,
                                   epochs, num_train_sequences / batch.global_batch_size, kMaxSteps));
    if (s <= 0)
      throw InputError(fmt::format("{}: epochs = {} gives no optimizer step: {} training sequences of "
                                   "data.max_seq_len {} make fewer than one global batch of {}",
                                   source, epochs, num_train_sequences, data.max_seq_len, batch.global_batch_size));
  }
  if (schedule.warmup_steps > s)
    throw InputError(fmt::format("{}: schedule.warmup_steps = {}: expected <= the run's {} steps", source,
                                 schedule.warmup_steps, s));
  return s;
}

void TrainConfig::check_inputs() const {
  // Each check names the source and the key; check_input_* add the path and what it is instead.
  auto named = [this](const char* key, const std::function<void()>& check) {
    try {
      check();
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {}: {}", source, key, e.what()));
    }
  };
  named("data.train", [&] {
    if (!data.train.empty()) check_input_file(data.train, "token file");
  });
  named("data.eval", [&] {
    if (!data.eval.empty()) check_input_file(data.eval, "token file");
  });
  named("model.path", [&] {
    if (model.path.empty()) return;
    check_input_folder(model.path, "model folder");
    check_input_file(model.path + "/config.json", "model config");
  });
  named("lora.init_adapter", [&] {
    if (lora.init_adapter.empty()) return;
    check_input_folder(lora.init_adapter, "adapter folder");
    check_input_file(lora.init_adapter + "/adapter_config.json", "adapter config");
    check_input_file(lora.init_adapter + "/adapter_model.safetensors", "safetensors file");
  });
  named("checkpoint.resume", [&] {
    if (!checkpoint.resume.empty() && checkpoint.resume != "auto") check_input_folder(checkpoint.resume, "checkpoint");
  });
  named("logging.metrics_jsonl", [&] {  // written: a FIFO would block the job, a device be replaced
    if (!logging.metrics_jsonl.empty()) check_output_file(logging.metrics_jsonl, "metrics log");
  });
}

std::vector<std::pair<std::string, std::string>> TrainConfig::key_values() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : fields()) {
    YAML::Emitter e;
    e << YAML::Flow << f.get(*this);
    out.emplace_back(f.key, e.c_str());
  }
  return out;
}

std::string TrainConfig::to_yaml() const {
  YAML::Node root(YAML::NodeType::Map);
  for (const auto& f : fields()) {
    // Walk/create the section maps of the dotted key, then set the leaf.
    std::vector<std::string> parts;
    std::stringstream ss(f.key);
    for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
    std::vector<YAML::Node> chain{root};
    for (size_t i = 0; i + 1 < parts.size(); ++i) chain.push_back(chain.back()[parts[i]]);
    chain.back()[parts.back()] = f.get(*this);
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

std::string TrainConfig::describe() const { return fmt::format("resolved config (from {}):\n{}", source, to_yaml()); }

}  // namespace qshard
