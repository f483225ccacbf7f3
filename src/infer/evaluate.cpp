#include "infer/evaluate.h"
#include "runtime/input_file.h"
#include "runtime/machine.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
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

std::vector<std::vector<int64_t>> read_json_ids(const std::string& path, int64_t vocab) {
  const nlohmann::json j = parse_json_input(read_input_file(path, "data file", uint64_t{1} << 30), path);
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

  // Sequences and their aligned targets.
  std::vector<std::vector<int64_t>> seqs, targets;
  const bool json = o.data.size() >= 5 && o.data.compare(o.data.size() - 5, 5, ".json") == 0;
  if (json) {
    seqs = read_json_ids(o.data, cfg.vocab_size);
    for (const auto& s : seqs) {
      std::vector<int64_t> t(s.begin() + 1, s.end());
      t.push_back(kIgnoreIndex);
      targets.push_back(std::move(t));
    }
  } else {
    const TokenFile f = TokenFile::open(o.data);
    // Ids made by another tokenizer than the model folder's are refused, naming both.
    if (const std::string w = check_token_file_tokenizer(f, model_tokenizer(o.model_dir)); !w.empty())
      QS_LOG_WARN("{}", w);
    f.validate(static_cast<uint32_t>(cfg.vocab_size));
    const int64_t T = o.seq_len > 0 ? o.seq_len : std::min<int64_t>(512, cfg.max_position_embeddings);
    const PackedDataset d(f, static_cast<int>(T));
    if (d.num_sequences() == 0) throw InputError(o.data + ": fewer than " + std::to_string(T + 1) + " tokens");
    std::vector<int32_t> in(static_cast<size_t>(T)), tg(static_cast<size_t>(T));
    for (int64_t i = 0; i < d.num_sequences(); ++i) {
      d.get(i, in.data(), tg.data());
      seqs.emplace_back(in.begin(), in.end());
      targets.emplace_back(tg.begin(), tg.end());
    }
  }
  for (const auto& s : seqs)
    if (static_cast<int64_t>(s.size()) > cfg.max_position_embeddings)
      throw InputError(o.data + ": a sequence of " + std::to_string(s.size()) + " tokens is past the model's maximum of " +
                       std::to_string(cfg.max_position_embeddings));
  if (!o.dump_logits.empty())
    for (const auto& s : seqs)
      if (s.size() != seqs[0].size())
        throw InputError("--dump-logits needs sequences of one length; " + o.data + " has lengths " +
                         std::to_string(seqs[0].size()) + " and " + std::to_string(s.size()));

  DeviceContext& ctx = *ctx_ptr;
  if (ctx.is_cuda()) require_device_memory(tree_bytes, "eval of " + o.model_dir + " on the GPU", llama_size_keys(cfg));
  move_tree_to(*tree, ctx.compute_device());
  int64_t max_len = 0;
  for (const auto& sq : seqs) max_len = std::max<int64_t>(max_len, static_cast<int64_t>(sq.size()));
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
  const LossTotals t = sequence_losses(model, static_cast<int64_t>(seqs.size()),
                                       [&](int64_t k, EvalSequence& s) {
                                         s.ids = seqs[static_cast<size_t>(k)];
                                         s.targets = targets[static_cast<size_t>(k)];
                                         return true;
                                       });
  const double loss_sum = t.loss_sum;
  r.tokens = t.tokens;
  std::vector<float> all_logits;
  if (!o.dump_logits.empty()) {
    model.set_training(false);
    for (const auto& sq : seqs) {
      const std::vector<float> logits = model.forward_logits(sq, 1, static_cast<int64_t>(sq.size()));
      all_logits.insert(all_logits.end(), logits.begin(), logits.end());
    }
  }
  r.sequences = static_cast<int64_t>(seqs.size());
  r.loss = r.tokens > 0 ? loss_sum / static_cast<double>(r.tokens) : NAN;
  r.perplexity = std::exp(r.loss);
  if (!o.dump_logits.empty()) {
    const int64_t B = r.sequences, T = static_cast<int64_t>(seqs[0].size());
    save_safetensors(o.dump_logits, {{"logits", Tensor::from_f32({B, T, cfg.vocab_size}, DType::kF32, all_logits)}},
                     {{"format", "pt"}});
  }
  return r;
}

}  // namespace qshard
