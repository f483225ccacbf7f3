#include "infer/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "checkpoint/safetensors.h"
#include "model/llama_model.h"
#include "runtime/error.h"
#include "runtime/input_file.h"
#include "runtime/machine.h"
#include "runtime/numbers.h"
#include "text/byte_tokenizer.h"
#include "text/chat_template.h"
#include "infer/evaluate.h"
#if QSHARD_WITH_TOKENIZER
#include "text/hf_tokenizer.h"
#endif

namespace qshard {
namespace {

namespace fs = std::filesystem;

// ---- sampling ---------------------------------------------------------------------------------------

int64_t argmax(std::span<const float> logits) {
  int64_t best = 0;
  for (int64_t i = 1; i < static_cast<int64_t>(logits.size()); ++i)
    if (logits[static_cast<size_t>(i)] > logits[static_cast<size_t>(best)]) best = i;
  return best;
}

// ---- text ---------------------------------------------------------------------------------------------

// The prompt's and the output's text: the folder's tokenizer.json, or the byte tokenizer.
struct Codec {
#if QSHARD_WITH_TOKENIZER
  std::optional<HfTokenizer> hf;
#endif
  bool bytes = false;
  std::string label;

  std::vector<int64_t> encode(const std::string& text, bool special) const {
    std::vector<int64_t> out;
#if QSHARD_WITH_TOKENIZER
    if (hf) {
      for (uint32_t id : hf->encode(text, special)) out.push_back(id);
      return out;
    }
#endif
    for (uint32_t id : byte_tokenize(text)) out.push_back(id);  // BOS, the bytes, EOS
    if (out.size() < 2) return {};
    out.pop_back();  // EOS ends a document, not a prompt
    if (!special) out.erase(out.begin());
    return out;
  }
  std::string decode(std::span<const int64_t> ids) const {
#if QSHARD_WITH_TOKENIZER
    if (hf) {
      std::vector<uint32_t> u(ids.begin(), ids.end());
      return hf->decode(u, /*skip_special=*/false);
    }
#endif
    std::string s;
    for (int64_t id : ids)
      if (id >= 0 && id < 256) s.push_back(static_cast<char>(id));
    return s;
  }
  std::optional<int64_t> eos() const {
#if QSHARD_WITH_TOKENIZER
    if (hf) {
      const auto e = hf->eos_id();
      return e ? std::optional<int64_t>(*e) : std::nullopt;
    }
#endif
    return kByteEos;
  }
};

// `chosen`: the user named this tokenizer (--tokenizer): it must load, with no fallback. Else the
// model folder's tokenizer.json when it has one (of any file type: a FIFO or a folder there is an
// error, not a reason to fall back), or the byte tokenizer.
Codec open_codec(const std::string& dir, int64_t vocab, bool chosen) {
  Codec c;
  c.label = dir;
  std::error_code ec;
  const bool has_json = chosen || fs::exists(fs::symlink_status(fs::path(dir) / "tokenizer.json", ec)) ||
                        fs::path(dir).filename() == "tokenizer.json";
  if (has_json) {
#if QSHARD_WITH_TOKENIZER
    c.hf.emplace(HfTokenizer::load(dir));
    c.label = c.hf->path();
    return c;
#else
    throw InputError(dir + " has a tokenizer.json, and this build has no native tokenizer (PCRE2 missing: run "
                     "scripts/setup.sh and rebuild), or pass --prompt-ids");
#endif
  }
  if (vocab < static_cast<int64_t>(kByteVocabSize))
    throw InputError(dir + " has no tokenizer.json, and the model's vocabulary of " + std::to_string(vocab) +
                     " is too small for the byte tokenizer (" + std::to_string(kByteVocabSize) +
                     "); pass --tokenizer DIR or --prompt-ids");
  c.bytes = true;
  c.label = "the byte tokenizer";
  return c;
}

// eos_token_id of a JSON file (an id or a list of ids, each in [0, vocab)) into `out`; false when
// absent or null. Anything else is an InputError naming `label` and the value: an id of the wrong
// type or outside the vocabulary was skipped in silence, and generation ran past the end it meant.
bool read_eos(const nlohmann::json& j, const std::string& label, int64_t vocab, std::set<int64_t>& out) {
  if (!j.is_object()) throw InputError(label + ": expected a JSON object, got " + std::string(j.type_name()));
  if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return false;
  const nlohmann::json& e = j["eos_token_id"];
  auto add = [&](const nlohmann::json& v) {
    const bool ok = v.is_number_unsigned()  ? v.get<uint64_t>() < static_cast<uint64_t>(vocab)
                    : v.is_number_integer() ? v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab
                                            : false;
    if (!ok)
      throw InputError(label + ": key \"eos_token_id\" must be a token id in [0, " + std::to_string(vocab) +
                       ") or a list of them, got " + e.dump());
    out.insert(v.get<int64_t>());
  };
  if (e.is_array())
    for (const auto& v : e) add(v);
  else
    add(e);
  return !out.empty();
}

// Bytes of `s` up to its last complete UTF-8 character and before a trailing U+FFFD (a character
// the next token may complete).
size_t stable_prefix(const std::string& s) {
  size_t n = s.size();
  static const std::string kRepl = "\xEF\xBF\xBD";
  while (n >= 3 && s.compare(n - 3, 3, kRepl) == 0) n -= 3;
  size_t i = n;  // back over an incomplete trailing sequence
  int back = 0;
  while (i > 0 && back < 4 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i, ++back;
  if (i > 0) {
    const unsigned char lead = static_cast<unsigned char>(s[i - 1]);
    const int want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (want > 1 && back + 1 < want) n = i - 1;
  }
  return n;
}

}  // namespace

// ---- Sampler --------------------------------------------------------------------------------------------

Sampler::Sampler(const SamplingOptions& options) : o_(options), rng_(options.seed) {
  check_double("generate --temperature", o_.temperature, 0, kMaxTemperature);
  check_int("generate --top-k", o_.top_k, 0, kMaxTopK);
  check_double("generate --top-p", o_.top_p, 0, 1, Bound::kOpen);
}

int64_t Sampler::next(std::span<const float> logits) {
  QS_CHECK(!logits.empty(), "Sampler::next: no logits");
  if (o_.temperature < kGreedyBelowTemperature) return argmax(logits);  // 1 / T stays <= 1e4: no overflow
  const int64_t V = static_cast<int64_t>(logits.size());
  order_.resize(static_cast<size_t>(V));
  const float inv_t = static_cast<float>(1.0 / o_.temperature);
  for (int64_t i = 0; i < V; ++i) order_[static_cast<size_t>(i)] = {logits[static_cast<size_t>(i)] * inv_t, i};
  // Most likely first (ties: the lower id first, a stable order).
  auto more_likely = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  int64_t keep = V;
  if (o_.top_k > 0 && o_.top_k < V) {
    std::partial_sort(order_.begin(), order_.begin() + o_.top_k, order_.end(), more_likely);
    keep = o_.top_k;
  } else {
    std::sort(order_.begin(), order_.end(), more_likely);
  }
  // Softmax over the kept tokens (in double), then top-p's cut.
  const double top = order_[0].first;
  std::vector<double> p(static_cast<size_t>(keep));
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += p[static_cast<size_t>(i)] = std::exp(order_[static_cast<size_t>(i)].first - top);
  if (o_.top_p < 1.0) {
    double cum = 0;
    int64_t n = 0;
    while (n < keep && cum < o_.top_p) cum += p[static_cast<size_t>(n++)] / sum;  // the token reaching top_p is kept
    keep = std::max<int64_t>(n, 1);
    sum = 0;
    for (int64_t i = 0; i < keep; ++i) sum += p[static_cast<size_t>(i)];
  }
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * sum;
  double cum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += p[static_cast<size_t>(i)];
    if (u < cum) return order_[static_cast<size_t>(i)].second;
  }
  return order_[static_cast<size_t>(keep - 1)].second;
}

// ---- generate ----------------------------------------------------------------------------------------------

GenerateResult generate_text(const GenerateOptions& o, const std::function<void(std::string_view)>& on_text) {
  check_int("generate --max-new-tokens", o.max_new_tokens, 0, kMaxNewTokens);
  if (o.prompt_ids.empty() == o.prompt.empty())
    throw InputError("generate: give exactly one of --prompt and --prompt-ids");
  if (o.chat && o.prompt.empty()) throw InputError("generate --chat needs --prompt (the user's message)");
  if (!o.system.empty() && !o.chat) throw InputError("generate --system needs --chat");
  Sampler sampler(o.sampling);  // validates the sampling flags before anything is loaded

  std::unique_ptr<DeviceContext> ctx_ptr = inference_context(o.device, "generate --device", o.model_dir);
  InferenceModel im = load_inference_model(o.model_dir, o.adapter_dir, o.allow_nonfinite);
  const LlamaConfig& cfg = im.config;
  const int64_t V = cfg.vocab_size;
  const std::string tok_dir = o.tokenizer_dir.empty() ? o.model_dir : o.tokenizer_dir;

  GenerateResult r;
  r.max_positions = cfg.max_position_embeddings;
  std::optional<Codec> codec;
  std::error_code ec;
  if (!o.prompt.empty() || !o.tokenizer_dir.empty() ||
      fs::exists(fs::symlink_status(fs::path(tok_dir) / "tokenizer.json", ec)) ||
      V >= static_cast<int64_t>(kByteVocabSize))
    codec = open_codec(tok_dir, V, /*chosen=*/!o.tokenizer_dir.empty());
  if (o.chat) {
    const ChatTemplate tmpl = ChatTemplate::from_model_dir(tok_dir);
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
    messages.push_back({{"role", "user"}, {"content", o.prompt}});
    r.prompt_ids = codec->encode(tmpl.render(messages, /*add_generation_prompt=*/true), /*special=*/false);
  } else if (!o.prompt.empty()) {
    r.prompt_ids = codec->encode(o.prompt, /*special=*/true);
  } else {
    r.prompt_ids = o.prompt_ids;
  }
  if (r.prompt_ids.empty()) throw InputError("generate: the prompt encodes to no tokens");
  for (size_t i = 0; i < r.prompt_ids.size(); ++i)
    if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= V)
      throw InputError("generate: prompt token " + std::to_string(r.prompt_ids[i]) + " at position " +
                       std::to_string(i) + " is not an id of the model's vocabulary [0, " + std::to_string(V) + ")");
  const int64_t P = static_cast<int64_t>(r.prompt_ids.size());
  if (P >= cfg.max_position_embeddings)
    throw InputError("generate: the prompt's " + std::to_string(P) + " tokens reach the model's maximum of " +
                     std::to_string(cfg.max_position_embeddings) + " positions");
  const int64_t total = std::min<int64_t>(P + std::max<int64_t>(o.max_new_tokens, 1), cfg.max_position_embeddings);

  std::set<int64_t> eos;
  if (!o.ignore_eos) {
    const fs::path gen_cfg = fs::path(o.model_dir) / "generation_config.json";
    bool found = false;
    std::error_code gen_ec;  // present of any file type: read (a FIFO or folder there is refused by name)
    if (fs::exists(fs::symlink_status(gen_cfg, gen_ec)))
      found = read_eos(parse_json_input(read_input_file(gen_cfg.string(), "generation config", 1 << 20), gen_cfg.string()),
                       gen_cfg.string(), V, eos);
    if (!found) read_eos(cfg.raw, (fs::path(o.model_dir) / "config.json").string(), V, eos);
    if (codec && codec->eos()) eos.insert(*codec->eos());
  }

  DeviceContext& ctx = *ctx_ptr;
  r.device = ctx.is_cuda() ? "cuda" : "cpu";
  LlamaModelOptions mo = im.options;
  mo.max_batch = 1;
  mo.max_seq = total;
  mo.kv_cache_tokens = total;
  {
    const std::string detail = std::to_string(total) + " positions, " + llama_size_keys(cfg);
    const double step = llama_step_bytes(cfg, mo, ctx.backend(), ctx.activation_dtype(), ctx.activation_dtype(),
                                         im.lora_r).total();
    if (ctx.is_cuda()) require_device_memory(im.tree_bytes + step, "generate on the GPU", detail);
    else require_host_memory(step, "generate", detail);
  }
  move_tree_to(*im.tree, ctx.compute_device());
  LlamaModel model(cfg, *im.tree, ctx, mo);
  model.set_training(false);

  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::vector<float> logits = model.forward_cached(r.prompt_ids, 0);
  const auto t1 = Clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  if (!o.dump_logits.empty())
    save_safetensors(o.dump_logits, {{"logits", Tensor::from_f32({1, V}, DType::kF32, logits)}}, {{"format", "pt"}});

  std::string emitted;
  auto stream = [&](bool final) {
    if (!codec) return;
    const std::string text = codec->decode(r.ids);
    const size_t upto = final ? text.size() : stable_prefix(text);
    if (upto > emitted.size() && text.compare(0, emitted.size(), emitted) == 0) {
      if (on_text) on_text(std::string_view(text).substr(emitted.size(), upto - emitted.size()));
      emitted = text.substr(0, upto);
    }
  };
  int64_t pos = P;
  for (int64_t n = 0; n < o.max_new_tokens; ++n) {
    const int64_t tok = sampler.next(logits);
    r.ids.push_back(tok);
    if (eos.count(tok)) {
      r.stopped_at_eos = true;
      r.ids.pop_back();  // the text leaves the end token out ...
      stream(true);
      r.ids.push_back(tok);  // ... the ids keep it
      break;
    }
    stream(false);
    if (n + 1 == o.max_new_tokens) break;
    if (pos + 1 > total) {  // the next step would write position pos, past the model's last
      r.stopped_at_max_positions = true;
      break;
    }
    const int64_t one[1] = {tok};
    logits = model.forward_cached(one, pos);
    ++pos;
  }
  if (!r.stopped_at_eos) stream(true);
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  if (codec) {
    std::vector<int64_t> text_ids = r.ids;
    if (r.stopped_at_eos) text_ids.pop_back();
    r.text = codec->decode(text_ids);
  }
  return r;
}

}  // namespace qshard
