#include "infer/evaluate.h"
#include "runtime/input_file.h"
#include "runtime/machine.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/llama_loader.h"
#include "checkpoint/safetensors.h"
#include "model/eval_loss.h"
#include "model/llama_model.h"
#include "text/data_loader.h"
#include "text/token_file.h"
#include "text/tokenizer_fingerprint.h"
#include "runtime/log.h"

namespace qshard {
namespace {

// A .json data file is for a few hand-made sequences: its tree of numbers takes ~16 bytes a token
// in memory (a GB of it exhausted the host and ended the process by a signal), so it is read up to
// kMaxConfigBytes; a token file (qshard tokenize) has no such limit.
std::vector<std::vector<int64_t>> read_json_ids(const std::string& path, int64_t vocab) {
  if (const uint64_t size = check_input_file(path, "data file"); size > kMaxConfigBytes)
    throw InputError(path + ": a JSON data file of " + std::to_string(size) + " bytes, more than the " +
                     std::to_string(kMaxConfigBytes) + " bytes of token-id lists eval reads from JSON; write a token "
                     "file with `qshard tokenize` for more");
  const nlohmann::json j = parse_json_input(read_input_file(path, "data file"), path);
  if (!j.is_array() || j.empty()) throw InputError(path + ": expected a non-empty JSON list of token-id lists");
  std::vector<std::vector<int64_t>> out;
  for (size_t s = 0; s < j.size(); ++s) {
    if (!j[s].is_array() || j[s].size() < 2)
      throw InputError(path + ": entry " + std::to_string(s) + " must be a list of at least 2 token ids");
    std::vector<int64_t> ids;
    for (size_t t = 0; t < j[s].size(); ++t) {
      const auto& v = j[s][t];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab)
        throw InputError(path + ": entry " + std::to_string(s) + ", position " + std::to_string(t) + ": token " +
                         v.dump() + " is not an id in [0, " + std::to_string(vocab) + ")");
      ids.push_back(v.get<int64_t>());
    }
    out.push_back(std::move(ids));
  }
  return out;
}

}  // namespace

void move_tree_to(Module& m, Device device) {
  for (const Module::Slot& cs : m.slots()) {
    Module::Slot& s = *m.slot(cs.name);
    if (s.tensor.defined() && s.tensor.device() != device) s.tensor = s.tensor.to(device);
    if (s.params4bit) *s.params4bit = s.params4bit->to(device);
  }
  for (const auto& [name, child] : m.children()) move_tree_to(*child, device);
}

InferenceModel load_inference_model(const std::string& model_dir, const std::string& adapter_dir, bool allow_nonfinite) {
  // 4-bit projections as stored, every other weight in f32 (on the host, then on the GPU when the
  // command runs there); the host must hold the tree.
  LlamaLoadOptions lo;
  lo.floats = LlamaLoadOptions::Floats::kF32;
  lo.adapter_dir = adapter_dir;
  lo.strict = false;
  lo.check_host_memory = true;
  lo.allow_nonfinite = allow_nonfinite;
  LoadedLlama loaded = load_llama_folder(model_dir, lo);
  InferenceModel im;
  im.config = std::move(loaded.config);
  im.tree = std::move(loaded.tree);
  im.tree_bytes = loaded.tree_bytes;
  if (loaded.adapter) {
    im.options.lora_alpha = loaded.adapter->lora_alpha;
    im.options.use_rslora = loaded.adapter->use_rslora;
    im.lora_r = loaded.adapter->r;
  }
  return im;
}

std::unique_ptr<DeviceContext> inference_context(DeviceChoice choice, const std::string& setting,
                                                 const std::string& model_dir) {
  const int gpu = cuda_available() ? 0 : -1;
  std::unique_ptr<DeviceContext> ctx = make_device_context(choice, gpu, setting);
  if (ctx->is_cuda() && !ops::has_backend(Backend::kCuda, "attention_fwd"))
    throw InputError(setting + ": this build has no fused attention on CUDA (built without cuDNN); use --device cpu");
  if (ctx->is_cuda())  // before the weights load
    check_attention_shape(LlamaConfig::load(model_dir), ctx->backend(),
                          (std::filesystem::path(model_dir) / "config.json").string() + " (" + setting + " cuda)");
  return ctx;
}

EvalResult evaluate_model(const EvalOptions& o) {
  if (o.seq_len < 0) throw InputError("eval --seq-len " + std::to_string(o.seq_len) + ": expected a positive length");
  // `qshard eval` runs in one process: on the first GPU (bf16 activations) or the CPU reference.
  std::unique_ptr<DeviceContext> ctx_ptr = inference_context(o.device, "eval --device", o.model_dir);
  InferenceModel im = load_inference_model(o.model_dir, o.adapter_dir, o.allow_nonfinite);
  const LlamaConfig& cfg = im.config;
  LlamaModelOptions mo = im.options;
  const double tree_bytes = im.tree_bytes;
  auto& tree = im.tree;

  // Sequences and their aligned targets: a JSON file's lists held in memory; a token file's
  // sequences read one at a time as the loss takes them (a GB file is never copied whole: 16 bytes
  // a token as ids and targets exhausted the host).
  std::vector<std::vector<int64_t>> json_seqs;
  std::optional<TokenFile> file;
  std::optional<PackedDataset> packed;
  int64_t count = 0, max_len = 0;
  const bool json = o.data.size() >= 5 && o.data.compare(o.data.size() - 5, 5, ".json") == 0;
  if (json) {
    json_seqs = read_json_ids(o.data, cfg.vocab_size);
    count = static_cast<int64_t>(json_seqs.size());
    for (const auto& s : json_seqs) {
      if (!o.dump_logits.empty() && s.size() != json_seqs[0].size())
        throw InputError("--dump-logits needs sequences of one length; " + o.data + " has lengths " +
                         std::to_string(json_seqs[0].size()) + " and " + std::to_string(s.size()));
      max_len = std::max<int64_t>(max_len, static_cast<int64_t>(s.size()));
    }
  } else {
    file.emplace(TokenFile::open(o.data));
    // Ids made by another tokenizer than the model folder's are refused, naming both.
    if (const std::string w = check_token_file_tokenizer(*file, model_tokenizer(o.model_dir)); !w.empty())
      QS_LOG_WARN("{}", w);
    file->validate(static_cast<uint32_t>(cfg.vocab_size));
    const int64_t T = o.seq_len > 0 ? o.seq_len : std::min<int64_t>(512, cfg.max_position_embeddings);
    if (T > cfg.max_position_embeddings)  // before the dataset: T is an int there
      throw InputError("eval --seq-len " + std::to_string(T) + " is past the model's maximum of " +
                       std::to_string(cfg.max_position_embeddings) + " positions");
    packed.emplace(*file, static_cast<int>(T));
    if (packed->num_sequences() == 0) throw InputError(o.data + ": fewer than " + std::to_string(T + 1) + " tokens");
    count = packed->num_sequences();
    max_len = T;
  }
  if (max_len > cfg.max_position_embeddings)
    throw InputError(o.data + ": a sequence of " + std::to_string(max_len) + " tokens is past the model's maximum of " +
                     std::to_string(cfg.max_position_embeddings));
  // Sequence k's ids and targets (the next id; the last one ignored in a JSON list).
  auto sequence = [&](int64_t k, std::vector<int64_t>& ids, std::vector<int64_t>& targets) {
    if (json) {
      ids = json_seqs[static_cast<size_t>(k)];
      targets.assign(ids.begin() + 1, ids.end());
      targets.push_back(kIgnoreIndex);
      return;
    }
    std::vector<int32_t> in(static_cast<size_t>(max_len)), tg(static_cast<size_t>(max_len));
    packed->get(k, in.data(), tg.data());
    ids.assign(in.begin(), in.end());
    targets.assign(tg.begin(), tg.end());
  };
  if (!o.dump_logits.empty())  // every sequence's logits, held and then copied into the tensor written
    require_host_memory(2.0 * static_cast<double>(count) * static_cast<double>(max_len) *
                            static_cast<double>(cfg.vocab_size) * 4.0,
                        "eval --dump-logits",
                        std::to_string(count) + " sequences x " + std::to_string(max_len) + " tokens x vocab_size " +
                            std::to_string(cfg.vocab_size) + " float32 logits");

  DeviceContext& ctx = *ctx_ptr;
  if (ctx.is_cuda()) require_device_memory(tree_bytes, "eval of " + o.model_dir + " on the GPU", llama_size_keys(cfg));
  move_tree_to(*tree, ctx.compute_device());
  mo.max_seq = max_len;
  {  // the step's buffers (the CPU keeps attention probabilities: B H T^2 floats)
    const double step = llama_step_bytes(cfg, mo, ctx.backend(), ctx.activation_dtype(), ctx.activation_dtype(),
                                         im.lora_r).total();
    const std::string detail = "activations for sequences of " + std::to_string(max_len) + " tokens, " + llama_size_keys(cfg);
    if (ctx.is_cuda()) require_device_memory(step, "eval on the GPU", detail);
    else require_host_memory(step, "eval", detail);
  }
  LlamaModel model(cfg, *tree, ctx, mo);
  EvalResult r;
  const LossTotals t = sequence_losses(model, count, [&](int64_t k, EvalSequence& s) {
    sequence(k, s.ids, s.targets);
    return true;
  });
  const double loss_sum = t.loss_sum;
  r.tokens = t.tokens;
  std::vector<float> all_logits;
  if (!o.dump_logits.empty()) {
    model.set_training(false);
    std::vector<int64_t> ids, targets;
    for (int64_t k = 0; k < count; ++k) {
      sequence(k, ids, targets);
      const std::vector<float> logits = model.forward_logits(ids, 1, static_cast<int64_t>(ids.size()));
      all_logits.insert(all_logits.end(), logits.begin(), logits.end());
    }
  }
  r.sequences = count;
  r.loss = r.tokens > 0 ? loss_sum / static_cast<double>(r.tokens) : NAN;
  r.perplexity = std::exp(r.loss);
  // The weights were checked finite on load: a non-finite loss comes from the model's numbers
  // (its config, or weights so large the logits overflow), never a result to print with exit 0.
  // With --allow-nonfinite the user asked for NaN / Inf weights: their loss is printed as it is.
  if (r.tokens > 0 && !std::isfinite(r.loss) && !o.allow_nonfinite)
    throw InputError(fmt::format("{}: the evaluation loss over {} tokens of {} is {}: this model gives non-finite "
                                 "logits (its config.json's values or its weights' magnitudes)",
                                 o.model_dir, r.tokens, o.data, r.loss));
  if (!o.dump_logits.empty()) {
    const int64_t B = r.sequences, T = max_len;
    save_safetensors(o.dump_logits, {{"logits", Tensor::from_f32({B, T, cfg.vocab_size}, DType::kF32, all_logits)}},
                     {{"format", "pt"}});
  }
  return r;
}

}  // namespace qshard
