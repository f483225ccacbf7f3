#include "train/train_config.h"

#include "runtime/input_file.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
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

void read_value(int64_t& out, const YAML::Node& n, const std::string& where) {
  out = scalar_as<int64_t>(n, where, "an integer");
}
void read_value(uint64_t& out, const YAML::Node& n, const std::string& where) {
  out = scalar_as<uint64_t>(n, where, "a non-negative integer");
}
void read_value(double& out, const YAML::Node& n, const std::string& where) {
  out = scalar_as<double>(n, where, "a number");
  if (!std::isfinite(out)) type_error(where, "a finite number", n);
}
void read_value(bool& out, const YAML::Node& n, const std::string& where) {
  out = scalar_as<bool>(n, where, "true or false");
}
void read_value(std::string& out, const YAML::Node& n, const std::string& where) {
  out = n.IsNull() ? std::string() : scalar_as<std::string>(n, where, "a string");
}
void read_value(std::vector<std::string>& out, const YAML::Node& n, const std::string& where) {
  if (!n.IsSequence()) type_error(where, "a list of strings", n);
  out.clear();
  for (const auto& item : n) out.push_back(scalar_as<std::string>(item, where, "a list of strings"));
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

template <class Access>
Field make_field(std::string key, Access access) {
  Field f;
  f.key = std::move(key);
  f.set = [access](TrainConfig& c, const YAML::Node& n, const std::string& where) { read_value(access(c), n, where); };
  f.get = [access](const TrainConfig& c) { return write_value(access(const_cast<TrainConfig&>(c))); };
  return f;
}

#define QS_FIELD(key, member) make_field(key, [](TrainConfig& c) -> auto& { return c.member; })

// checkpoint.dir: "" in the struct is written as `none` (nothing saved), so that the YAML reads
// back to the same config through load_train_config too (where unset means the default folder).
Field checkpoint_dir_field() {
  Field f = QS_FIELD("checkpoint.dir", checkpoint.dir);
  f.get = [](const TrainConfig& c) {
    return write_value(c.checkpoint.dir.empty() ? std::string(kNoCheckpointDir) : c.checkpoint.dir);
  };
  return f;
}

const std::vector<Field>& fields() {
  static const std::vector<Field> kFields = {
      QS_FIELD("model.path", model.path),
      QS_FIELD("model.init.vocab_size", model.init.vocab_size),
      QS_FIELD("model.init.hidden_size", model.init.hidden_size),
      QS_FIELD("model.init.intermediate_size", model.init.intermediate_size),
      QS_FIELD("model.init.num_hidden_layers", model.init.num_hidden_layers),
      QS_FIELD("model.init.num_attention_heads", model.init.num_attention_heads),
      QS_FIELD("model.init.num_key_value_heads", model.init.num_key_value_heads),
      QS_FIELD("model.init.max_position_embeddings", model.init.max_position_embeddings),
      QS_FIELD("model.init.seed", model.init.seed),
      QS_FIELD("model.init.dtype", model.init.dtype),
      QS_FIELD("model.init.draw_4bit", model.init.draw_4bit),
      QS_FIELD("model.quant_type", model.quant_type),
      QS_FIELD("model.blocksize", model.blocksize),
      QS_FIELD("model.double_quant", model.double_quant),
      QS_FIELD("model.allow_nonfinite", model.allow_nonfinite),
      QS_FIELD("lora.r", lora.r),
      QS_FIELD("lora.alpha", lora.alpha),
      QS_FIELD("lora.dropout", lora.dropout),
      QS_FIELD("lora.rslora", lora.rslora),
      QS_FIELD("lora.target_modules", lora.target_modules),
      QS_FIELD("lora.init_adapter", lora.init_adapter),
      QS_FIELD("lora.fold", lora.fold),
      QS_FIELD("optimizer.lr", optimizer.lr),
      QS_FIELD("optimizer.beta1", optimizer.beta1),
      QS_FIELD("optimizer.beta2", optimizer.beta2),
      QS_FIELD("optimizer.eps", optimizer.eps),
      QS_FIELD("optimizer.weight_decay", optimizer.weight_decay),
      QS_FIELD("optimizer.grad_clip", optimizer.grad_clip),
      QS_FIELD("schedule.type", schedule.type),
      QS_FIELD("schedule.warmup_steps", schedule.warmup_steps),
      QS_FIELD("schedule.min_lr_ratio", schedule.min_lr_ratio),
      QS_FIELD("data.train", data.train),
      QS_FIELD("data.eval", data.eval),
      QS_FIELD("data.eval_fraction", data.eval_fraction),
      QS_FIELD("data.max_seq_len", data.max_seq_len),
      QS_FIELD("data.packing", data.packing),
      QS_FIELD("data.seed", data.seed),
      QS_FIELD("batch.global_batch_size", batch.global_batch_size),
      QS_FIELD("batch.micro_batch_size", batch.micro_batch_size),
      QS_FIELD("steps", steps),
      QS_FIELD("epochs", epochs),
      QS_FIELD("offload.params", offload.params),
      QS_FIELD("offload.optimizer", offload.optimizer),
      QS_FIELD("memory.gpu_budget_gb", memory.gpu_budget_gb),
      QS_FIELD("memory.keep_layers", memory.keep_layers),
      QS_FIELD("memory.mlp_chunk_tokens", memory.mlp_chunk_tokens),
      checkpoint_dir_field(),
      QS_FIELD("checkpoint.every_steps", checkpoint.every_steps),
      QS_FIELD("checkpoint.keep_last", checkpoint.keep_last),
      QS_FIELD("checkpoint.resume", checkpoint.resume),
      QS_FIELD("checkpoint.stop_after_steps", checkpoint.stop_after_steps),
      QS_FIELD("checkpoint.allow_schedule_change", checkpoint.allow_schedule_change),
      QS_FIELD("logging.every_steps", logging.every_steps),
      QS_FIELD("logging.metrics_jsonl", logging.metrics_jsonl),
      QS_FIELD("logging.tensorboard_dir", logging.tensorboard_dir),
      QS_FIELD("logging.eval_every_steps", logging.eval_every_steps),
      QS_FIELD("logging.profile", logging.profile),
      QS_FIELD("logging.gemm_tflops", logging.gemm_tflops),
      QS_FIELD("seed", seed),
      QS_FIELD("device", device),
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

std::string nearest_key(const std::string& key) {
  std::string best;
  size_t best_d = SIZE_MAX;
  const std::string leaf = last_component(key);
  for (const auto& f : fields()) {
    const size_t d = std::min(edit_distance(key, f.key), edit_distance(leaf, last_component(f.key)) + 1);
    if (d < best_d) best_d = d, best = f.key;
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
  static const std::vector<std::string> k = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
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
  ck.require(lora.r > 0, "lora.r", lora.r, "> 0");
  ck.require(lora.alpha > 0, "lora.alpha", lora.alpha, "> 0");
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
  ck.require(data.packing == "packed" || data.packing == "padded", "data.packing", data.packing, "packed or padded");
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
  ck.require(memory.gpu_budget_gb >= 0 && memory.gpu_budget_gb <= 1e6, "memory.gpu_budget_gb", memory.gpu_budget_gb,
             "a number of GB in [0, 1e6] (0 = no plan)");
  ck.require(memory.keep_layers >= -1, "memory.keep_layers", memory.keep_layers, ">= -1 (-1 = the plan's choice)");
  ck.require(memory.mlp_chunk_tokens >= -1 && memory.mlp_chunk_tokens <= kMaxMicroTokens, "memory.mlp_chunk_tokens",
             memory.mlp_chunk_tokens, fmt::format("in [-1, {}] (-1 = auto, 0 = never)", kMaxMicroTokens));
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
