#include "checkpoint/hf_config.h"

#include <cmath>

#include <fmt/format.h>

#include "runtime/input_file.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "runtime/error.h"
#include "runtime/machine.h"

namespace qshard {

namespace {
std::string fmt_params(double n) {
  char buf[32];
  if (n >= 1e12) std::snprintf(buf, sizeof buf, "%.3g", n);
  else if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.3gB", n / 1e9);
  else std::snprintf(buf, sizeof buf, "%.3gM", n / 1e6);
  return buf;
}

using json = nlohmann::json;

std::string where(const std::string& label, const std::string& key) { return label + ": key \"" + key + "\""; }

int64_t get_int(const json& j, const std::string& key, const std::string& label, std::optional<int64_t> def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (def) return *def;
    throw InputError(where(label, key) + " is missing (expected a positive integer)");
  }
  if (!it->is_number_integer()) throw InputError(where(label, key) + " must be an integer, got " + it->dump());
  return it->get<int64_t>();
}

double get_num(const json& j, const std::string& key, const std::string& label, double def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_number()) throw InputError(where(label, key) + " must be a number, got " + it->dump());
  return it->get<double>();
}

bool get_bool(const json& j, const std::string& key, const std::string& label, bool def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) throw InputError(where(label, key) + " must be true or false, got " + it->dump());
  return it->get<bool>();
}

void positive(int64_t v, const std::string& key, const std::string& label) {
  if (v <= 0) throw InputError(where(label, key) + " must be positive, got " + std::to_string(v));
}

RopeScaling parse_rope(const json& r, const std::string& key, const std::string& label) {
  RopeScaling s;
  if (!r.is_object()) throw InputError(where(label, key) + " must be an object, got " + r.dump());
  std::string type = "default";
  // rope_type (or the older "type"), a string when given: another type was read as "default".
  for (const char* k : {"type", "rope_type"})
    if (r.contains(k) && !r[k].is_null()) {
      if (!r[k].is_string()) throw InputError(where(label, key) + "." + k + " must be a string, got " + r[k].dump());
      type = r[k].get<std::string>();
    }
  if (type != "default" && type != "llama3" && type != "linear")
    throw InputError(where(label, key) + " has rope_type \"" + type +
                     "\"; qshard supports \"default\", \"llama3\" and \"linear\"");
  s.rope_type = type;
  if (type == "linear") {  // transformers' _compute_linear_scaling_rope_parameters: inv_freq / factor
    if (!r.contains("factor") || r["factor"].is_null())
      throw InputError(where(label, key) + " has rope_type \"linear\" without a factor");
    s.factor = get_num(r, "factor", label + " (" + key + ")", 1.0);
    if (!(s.factor > 0) || !std::isfinite(s.factor))
      throw InputError(where(label, key) + " has a linear factor " + fmt::format("{}", s.factor) +
                       "; expected a positive number");
  }
  if (type == "llama3") {
    const std::string k = key + ".";
    s.factor = get_num(r, "factor", label + " (" + key + ")", 8.0);
    s.low_freq_factor = get_num(r, "low_freq_factor", label + " (" + key + ")", 1.0);
    s.high_freq_factor = get_num(r, "high_freq_factor", label + " (" + key + ")", 4.0);
    s.original_max_position_embeddings = get_int(r, "original_max_position_embeddings", label + " (" + key + ")", 8192);
    // original_max_position_embeddings <= 0 made every wavelength "long": all scaled, in silence.
    if (s.factor <= 0 || s.low_freq_factor <= 0 || s.high_freq_factor <= s.low_freq_factor ||
        s.original_max_position_embeddings <= 0)
      throw InputError(where(label, key) + " has invalid llama3 factors " + r.dump());
  }
  return s;
}

// A Qwen2 / Qwen3 config's sliding window: transformers applies one only with use_sliding_window
// true (then on the layers from max_window_layers on); every released model has it false.
void refuse_qwen_sliding_window(const json& j, const std::string& label) {
  if (get_bool(j, "use_sliding_window", label, false))
    throw InputError(where(label, "use_sliding_window") +
                     " is true; qshard runs Qwen2 / Qwen3 models without a sliding window (false, as every released "
                     "model has it)");
}

// Mistral's and Phi-3's sliding_window: null or absent for none, else a positive window.
void read_sliding_window(const json& j, const std::string& label, LlamaConfig& c) {
  if (j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    c.sliding_window = get_int(j, "sliding_window", label, std::nullopt);
    positive(c.sliding_window, "sliding_window", label);
  }
}

// Phi-3 variants that do not map onto the skeleton, refused by key and value: RoPE on part of each
// head (partial_rotary_factor below 1: Phi-4-mini), and dropout in the base model (released Phi-3
// configs have 0.0; qshard's base has no dropout). rope_scaling's longrope / su (the 128k models)
// are refused by parse_rope, naming rope_scaling and the type.
void refuse_phi3_variants(const json& j, const std::string& label) {
  auto factor_of = [&](const json& obj, const std::string& where_label) {
    if (!obj.contains("partial_rotary_factor") || obj["partial_rotary_factor"].is_null()) return;
    const double f = get_num(obj, "partial_rotary_factor", where_label, 1.0);
    if (f != 1.0)
      throw InputError(where(where_label, "partial_rotary_factor") + " is " + fmt::format("{}", f) +
                       "; qshard rotates whole heads (1.0): RoPE on part of each head is not implemented");
  };
  factor_of(j, label);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    factor_of(j["rope_parameters"], label + " (rope_parameters)");
  for (const char* k : {"resid_pdrop", "embd_pdrop", "attention_dropout"}) {
    const double p = get_num(j, k, label, 0.0);
    if (p != 0.0)
      throw InputError(where(label, k) + " is " + fmt::format("{}", p) +
                       "; qshard's base model has no dropout (0.0, as released Phi-3 models have it)");
  }
}

// Gemma's layer_types ("sliding_attention" / "full_attention", one per layer) into c.sliding_layers;
// without it the family's default: Gemma 2 slides on the even layers, Gemma 3 on all but every
// sliding_window_pattern-th (6).
void read_gemma_layer_types(const json& j, const std::string& label, LlamaConfig& c) {
  const int64_t L = c.num_hidden_layers;
  c.sliding_layers.assign(static_cast<size_t>(L), false);
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& t = j["layer_types"];
    if (!t.is_array() || static_cast<int64_t>(t.size()) != L)
      throw InputError(where(label, "layer_types") + " must be a list of num_hidden_layers = " + std::to_string(L) +
                       " strings, got " + t.dump());
    for (int64_t l = 0; l < L; ++l) {
      const json& v = t[static_cast<size_t>(l)];
      if (v == "sliding_attention") c.sliding_layers[static_cast<size_t>(l)] = true;
      else if (v != "full_attention")
        throw InputError(where(label, "layer_types") + "[" + std::to_string(l) + "] is " + v.dump() +
                         "; expected \"sliding_attention\" or \"full_attention\"");
    }
    return;
  }
  if (c.family == ModelFamily::kGemma2) {
    for (int64_t l = 0; l < L; l += 2) c.sliding_layers[static_cast<size_t>(l)] = true;
    return;
  }
  const int64_t pattern = get_int(j, "sliding_window_pattern", label, 6);
  positive(pattern, "sliding_window_pattern", label);
  for (int64_t l = 0; l < L; ++l) c.sliding_layers[static_cast<size_t>(l)] = (l + 1) % pattern != 0;
}

// Gemma's keys (the family comment in hf_config.h), with transformers' Gemma2Config /
// Gemma3TextConfig defaults where a key is absent.
void read_gemma(const json& j, const std::string& label, LlamaConfig& c) {
  const bool g3 = c.family == ModelFamily::kGemma3;
  c.gemma_norms = true;
  c.gelu_tanh = true;
  c.embed_scale = std::sqrt(static_cast<double>(c.hidden_size));
  c.attention_bias = c.o_proj_bias = get_bool(j, "attention_bias", label, false);
  c.qk_norm = g3;
  for (const char* k : {"hidden_activation", "hidden_act"})
    if (j.contains(k) && !j[k].is_null() && j[k] != "gelu_pytorch_tanh")
      throw InputError(where(label, k) + " is " + j[k].dump() + "; a Gemma model runs \"gelu_pytorch_tanh\" (GeGLU)");
  if (get_bool(j, "use_bidirectional_attention", label, false))
    throw InputError(where(label, "use_bidirectional_attention") +
                     " is true (an encoder-style Gemma); qshard trains causal language models");
  if (get_num(j, "attention_dropout", label, 0.0) != 0.0)
    throw InputError(where(label, "attention_dropout") + " is " + j["attention_dropout"].dump() +
                     "; qshard's base model has no dropout (0.0, as released Gemma models have it)");
  c.query_pre_attn_scalar = get_num(j, "query_pre_attn_scalar", label, 256.0);
  if (!(c.query_pre_attn_scalar > 0) || !std::isfinite(c.query_pre_attn_scalar))
    throw InputError(where(label, "query_pre_attn_scalar") + " is " + fmt::format("{}", c.query_pre_attn_scalar) +
                     "; expected a positive number (the attention scale is its inverse square root)");
  auto cap = [&](const char* key, double def) {  // null: none
    if (j.contains(key) && j[key].is_null()) return 0.0;
    const double v = get_num(j, key, label, def);
    if (v < 0 || !std::isfinite(v))
      throw InputError(where(label, key) + " is " + fmt::format("{}", v) + "; expected a positive number or null");
    return v;
  };
  // Gemma 3's attention reads no attn_logit_softcapping (transformers' Gemma3Attention passes none).
  c.attn_logit_softcapping = g3 ? 0.0 : cap("attn_logit_softcapping", 50.0);
  c.final_logit_softcapping = cap("final_logit_softcapping", g3 ? 0.0 : 30.0);
  c.sliding_window = get_int(j, "sliding_window", label, 4096);
  positive(c.sliding_window, "sliding_window", label);
  read_gemma_layer_types(j, label, c);
  if (!g3) return;
  // Gemma 3's two RoPEs: rope_parameters {"full_attention": {...}, "sliding_attention": {...}}
  // (transformers 5), or rope_theta + rope_scaling for the full layers and rope_local_base_freq.
  c.rope_local_theta = get_num(j, "rope_local_base_freq", label, 10000.0);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].contains("sliding_attention")) {
    const json& rp = j["rope_parameters"];
    const std::string l = label + " (rope_parameters)";
    const json& sl = rp["sliding_attention"];
    const RopeScaling local = parse_rope(sl, "rope_parameters.sliding_attention", label);
    if (local.rope_type != "default")
      throw InputError(where(label, "rope_parameters.sliding_attention") + " has rope_type \"" + local.rope_type +
                       "\"; qshard takes Gemma 3's sliding layers with plain RoPE (\"default\")");
    c.rope_local_theta = get_num(sl, "rope_theta", l, c.rope_local_theta);
    if (!rp.contains("full_attention") || !rp["full_attention"].is_object())
      throw InputError(where(label, "rope_parameters") + " has \"sliding_attention\" but no \"full_attention\" object");
    c.rope_scaling = parse_rope(rp["full_attention"], "rope_parameters.full_attention", label);
    c.rope_theta = get_num(rp["full_attention"], "rope_theta", l, get_num(j, "rope_theta", label, 1000000.0));
  }
  if (!(c.rope_local_theta >= 1 && std::isfinite(c.rope_local_theta)))
    throw InputError(where(label, "rope_local_base_freq") + " is " + fmt::format("{}", c.rope_local_theta) +
                     "; expected a finite number of at least 1");
}

}  // namespace

int64_t layer_window(const LlamaConfig& c, int64_t layer) {
  if (c.sliding_layers.empty()) return c.sliding_window;
  return c.sliding_layers.at(static_cast<size_t>(layer)) ? c.sliding_window : 0;
}

bool layer_local_rope(const LlamaConfig& c, int64_t layer) {
  return c.rope_local_theta > 0 && !c.sliding_layers.empty() && c.sliding_layers.at(static_cast<size_t>(layer));
}

const char* mlp_norm_name(const LlamaConfig& c) {
  return c.gemma_norms ? "pre_feedforward_layernorm" : "post_attention_layernorm";
}

std::vector<std::string> layer_norm_names(const LlamaConfig& c) {
  if (c.gemma_norms)
    return {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"};
  return {"input_layernorm", "post_attention_layernorm"};
}

const char* model_family_name(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama: return "llama";
    case ModelFamily::kQwen2: return "qwen2";
    case ModelFamily::kQwen3: return "qwen3";
    case ModelFamily::kMistral: return "mistral";
    case ModelFamily::kPhi3: return "phi3";
    case ModelFamily::kGemma2: return "gemma2";
    case ModelFamily::kGemma3: return "gemma3_text";
  }
  return "?";
}

LlamaConfig LlamaConfig::from_json(const json& j, const std::string& label) {
  if (!j.is_object()) throw InputError(label + ": config is not a JSON object");
  LlamaConfig c;
  c.raw = j;
  if (j.contains("model_type") && !j["model_type"].is_null()) {
    if (!j["model_type"].is_string())
      throw InputError(where(label, "model_type") + " must be a string, got " + j["model_type"].dump());
    const std::string type = j["model_type"].get<std::string>();
    bool known = false;
    for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kQwen2, ModelFamily::kQwen3, ModelFamily::kMistral,
                          ModelFamily::kPhi3, ModelFamily::kGemma2, ModelFamily::kGemma3})
      if (type == model_family_name(f)) c.family = f, known = true;
    if (type == "gemma3")
      throw InputError(where(label, "model_type") +
                       " is \"gemma3\", Gemma 3's image-and-text model (Gemma3ForConditionalGeneration); qshard runs "
                       "the text model, model_type \"gemma3_text\" (Gemma3ForCausalLM: gemma-3-270m, gemma-3-1b)");
    if (!known)
      throw InputError(where(label, "model_type") + " is \"" + type +
                       "\"; qshard supports \"llama\", \"qwen2\", \"qwen3\", \"mistral\", \"phi3\", \"gemma2\" and "
                       "\"gemma3_text\"");
  }
  const bool gemma = c.family == ModelFamily::kGemma2 || c.family == ModelFamily::kGemma3;
  c.vocab_size = get_int(j, "vocab_size", label, std::nullopt);
  c.hidden_size = get_int(j, "hidden_size", label, std::nullopt);
  c.intermediate_size = get_int(j, "intermediate_size", label, std::nullopt);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", label, std::nullopt);
  c.num_attention_heads = get_int(j, "num_attention_heads", label, std::nullopt);
  for (auto [v, k] : {std::pair{c.vocab_size, "vocab_size"}, {c.hidden_size, "hidden_size"},
                      {c.intermediate_size, "intermediate_size"}, {c.num_hidden_layers, "num_hidden_layers"},
                      {c.num_attention_heads, "num_attention_heads"}})
    positive(v, k, label);
  c.num_key_value_heads = get_int(j, "num_key_value_heads", label, c.num_attention_heads);
  positive(c.num_key_value_heads, "num_key_value_heads", label);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    throw InputError(where(label, "num_key_value_heads") + " = " + std::to_string(c.num_key_value_heads) +
                     " does not divide num_attention_heads = " + std::to_string(c.num_attention_heads));
  if (gemma && (!j.contains("head_dim") || j["head_dim"].is_null())) {
    c.head_dim = 256;  // Gemma2Config / Gemma3TextConfig's default, apart from hidden / heads
  } else if (!j.contains("head_dim") || j["head_dim"].is_null()) {
    if (c.hidden_size % c.num_attention_heads != 0)
      throw InputError(where(label, "hidden_size") + " = " + std::to_string(c.hidden_size) +
                       " is not divisible by num_attention_heads and no head_dim is given");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  } else {
    c.head_dim = get_int(j, "head_dim", label, std::nullopt);
    positive(c.head_dim, "head_dim", label);
  }
  if (c.head_dim % 2 != 0) throw InputError(where(label, "head_dim") + " must be even for RoPE");
  c.max_position_embeddings = get_int(j, "max_position_embeddings", label, 2048);
  positive(c.max_position_embeddings, "max_position_embeddings", label);
  c.rms_norm_eps = get_num(j, "rms_norm_eps", label, 1e-6);
  // A stabilizer far below the mean square (1e-6 to 1e-5 in every family): at 1 or more it replaces
  // the normalization, and 1e308 is infinite in f32 (eval printed a NaN loss with exit 0).
  if (!(c.rms_norm_eps > 0 && c.rms_norm_eps < 1))
    throw InputError(where(label, "rms_norm_eps") + " is " + fmt::format("{}", c.rms_norm_eps) +
                     "; expected a small positive number below 1 (1e-6 or 1e-5 in Llama-style models)");
  if (!gemma && j.contains("hidden_act") && j["hidden_act"] != "silu")
    throw InputError(where(label, "hidden_act") + " is " + j["hidden_act"].dump() + "; qshard's families use \"silu\"");
  // RoPE: the newer single rope_parameters field, or rope_theta + rope_scaling (Gemma 3's per
  // layer type: read_gemma).
  const bool per_type = j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
                        (j["rope_parameters"].contains("full_attention") || j["rope_parameters"].contains("sliding_attention"));
  if (per_type && c.family != ModelFamily::kGemma3) {
    throw InputError(where(label, "rope_parameters") + " is per layer type (" + j["rope_parameters"].dump() +
                     "); only a gemma3_text model takes that form");
  } else if (per_type) {
    c.rope_theta = get_num(j, "rope_theta", label, 1000000.0);  // read_gemma reads the two
  } else if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    const json& rp = j["rope_parameters"];
    c.rope_scaling = parse_rope(rp, "rope_parameters", label);
    c.rope_theta = get_num(rp, "rope_theta", label + " (rope_parameters)", get_num(j, "rope_theta", label, 10000.0));
  } else {
    c.rope_theta = get_num(j, "rope_theta", label, c.family == ModelFamily::kGemma3 ? 1000000.0 : 10000.0);
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
      c.rope_scaling = parse_rope(j["rope_scaling"], "rope_scaling", label);
  }
  // RoPE's base: the frequencies are theta^(-2i/d), so a base below 1 turns them into powers of
  // 1/theta that overflow f32 (1e-300 gave NaN logits); real models use 1e4 to 1e6 and more.
  if (!(c.rope_theta >= 1 && std::isfinite(c.rope_theta)))
    throw InputError(where(label, "rope_theta") + " is " + fmt::format("{}", c.rope_theta) +
                     "; expected a finite number of at least 1 (10000 to 1000000 in practice)");
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", label, gemma);  // Gemma's default: tied
  // Biases by family (transformers' *Attention / *MLP): Llama reads attention_bias (all four
  // attention projections) and mlp_bias; Qwen2 has q/k/v biases and none else (no such keys);
  // Qwen3 reads attention_bias (all four), no MLP bias; Mistral has none.
  switch (c.family) {
    case ModelFamily::kLlama:
      c.attention_bias = c.o_proj_bias = get_bool(j, "attention_bias", label, false);
      c.mlp_bias = get_bool(j, "mlp_bias", label, false);
      break;
    case ModelFamily::kQwen2:
      c.attention_bias = true;
      refuse_qwen_sliding_window(j, label);
      break;
    case ModelFamily::kQwen3:
      c.attention_bias = c.o_proj_bias = get_bool(j, "attention_bias", label, false);
      c.qk_norm = true;
      refuse_qwen_sliding_window(j, label);
      break;
    case ModelFamily::kMistral:
      read_sliding_window(j, label, c);
      break;
    case ModelFamily::kPhi3:
      // transformers' Phi3Attention / Phi3MLP: no biases (qkv_proj, o_proj, gate_up_proj and
      // down_proj are bias=False whatever attention_bias says); the sliding window as Mistral's.
      read_sliding_window(j, label, c);
      refuse_phi3_variants(j, label);
      // transformers' Phi3Config takes "default" and "longrope" only (longrope refused above).
      if (c.rope_scaling.rope_type != "default")
        throw InputError(where(label, j.contains("rope_parameters") ? "rope_parameters" : "rope_scaling") +
                         " has rope_type \"" + c.rope_scaling.rope_type + "\"; a phi3 model takes \"default\" (plain RoPE)");
      break;
    case ModelFamily::kGemma2:
    case ModelFamily::kGemma3:
      read_gemma(j, label, c);
      if (c.family == ModelFamily::kGemma2 && c.rope_scaling.rope_type != "default")
        throw InputError(where(label, j.contains("rope_parameters") ? "rope_parameters" : "rope_scaling") +
                         " has rope_type \"" + c.rope_scaling.rope_type + "\"; a gemma2 model takes \"default\"");
      break;
  }
  // Token ids, dtype and quantization_config of another type than the one transformers writes are
  // refused by key (they were skipped in silence: a quantization_config of the wrong type left a
  // 4-bit folder read as a plain one).
  if (j.contains("bos_token_id") && !j["bos_token_id"].is_null())
    c.bos_token_id = get_int(j, "bos_token_id", label, std::nullopt);
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const json& e = j["eos_token_id"];
    if (e.is_number_integer()) c.eos_token_ids.push_back(e.get<int64_t>());
    else if (e.is_array())
      for (const auto& v : e) {
        if (!v.is_number_integer())
          throw InputError(where(label, "eos_token_id") + " must be an integer or a list of integers, got " + e.dump());
        c.eos_token_ids.push_back(v.get<int64_t>());
      }
    else throw InputError(where(label, "eos_token_id") + " must be an integer or a list of integers, got " + e.dump());
  }
  // Ids the vocabulary does not have: generation would wait for an end it cannot emit, training
  // data would carry a token the embedding cannot look up.
  if (c.bos_token_id && (*c.bos_token_id < 0 || *c.bos_token_id >= c.vocab_size))
    throw InputError(where(label, "bos_token_id") + " is " + std::to_string(*c.bos_token_id) +
                     ", outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  for (int64_t e : c.eos_token_ids)
    if (e < 0 || e >= c.vocab_size)
      throw InputError(where(label, "eos_token_id") + " holds " + std::to_string(e) + ", outside the vocabulary [0, " +
                       std::to_string(c.vocab_size) + ")");
  for (const char* k : {"torch_dtype", "dtype"}) {
    if (j.contains(k) && !j[k].is_null() && !j[k].is_string())
      throw InputError(where(label, k) + " must be a string, got " + j[k].dump());
    if (j.contains(k) && j[k].is_string()) {
      auto d = parse_dtype(j[k].get<std::string>());
      if (!d || !dtype_is_float(*d))
        throw InputError(where(label, k) + " is \"" + j[k].get<std::string>() + "\" (expected float32, bfloat16 or float16)");
      c.dtype = d;
    }
  }
  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    const json& q = j["quantization_config"];
    if (!q.is_object()) throw InputError(where(label, "quantization_config") + " must be an object, got " + q.dump());
    const std::string ql = label + " (quantization_config)";
    if (json_string(q, "quant_method", ql, "") != "bitsandbytes" || !json_bool(q, "load_in_4bit", ql, false))
      throw InputError(where(label, "quantization_config") + " is not a bitsandbytes 4-bit config: " + q.dump());
    c.quantized = true;
    c.bnb_quant_type = json_string(q, "bnb_4bit_quant_type", ql, "nf4");
    if (c.bnb_quant_type != "nf4" && c.bnb_quant_type != "fp4")
      throw InputError(ql + ": key \"bnb_4bit_quant_type\" is \"" + c.bnb_quant_type + "\" (expected \"nf4\" or \"fp4\")");
    c.bnb_double_quant = json_bool(q, "bnb_4bit_use_double_quant", ql, false);
  }
  return c;
}

LlamaConfig LlamaConfig::load(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  if (std::filesystem::exists(dir)) check_input_folder(dir, "model folder");  // a file, FIFO or device: named
  if (!std::filesystem::is_directory(dir)) throw InputError("model folder " + dir + " does not exist or is not a directory");
  if (!std::filesystem::exists(path))
    throw InputError("model folder " + dir + " has no config.json (expected " + path + ")");
  const json j = parse_json_input(read_input_file(path, "model config"), path);
  LlamaConfig c = from_json(j, path);
  c.source_dir = dir;
  // The weights must be able to hold the model the config describes (sizes only: no header read).
  double file_bytes = 0;
  int files = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors" && e.is_regular_file(ec)) {
      file_bytes += static_cast<double>(e.file_size(ec));
      ++files;
    }
  const double need = llama_min_weight_bytes(c);
  if (files > 0 && need > file_bytes * 1.01 + 65536.0)
    throw InputError(path + " describes a Llama of " + fmt_params(llama_size(c).total()) + " parameters (" +
                     llama_size_keys(c) + "): at least " + human_bytes(need) +
                     " of weights even with 4-bit projections, but the folder's " + std::to_string(files) +
                     " .safetensors file(s) hold " + human_bytes(file_bytes) +
                     "; config.json does not describe these weights");
  return c;
}

LlamaSize llama_size(const LlamaConfig& c) {
  LlamaSize s;
  const double C = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  const double q = static_cast<double>(c.num_attention_heads) * static_cast<double>(c.head_dim);
  const double kv = static_cast<double>(c.num_key_value_heads) * static_cast<double>(c.head_dim);
  const double L = static_cast<double>(c.num_hidden_layers), V = static_cast<double>(c.vocab_size);
  s.projection_params = L * (C * q + 2 * C * kv + q * C + 3 * C * I);
  s.other_params = V * C * (c.tie_word_embeddings ? 1 : 2) + C + L * static_cast<double>(layer_norm_names(c).size()) * C;
  if (c.attention_bias) s.other_params += L * (q + 2 * kv);
  if (c.o_proj_bias) s.other_params += L * C;
  if (c.mlp_bias) s.other_params += L * (2 * I + C);
  if (c.qk_norm) s.other_params += L * 2 * static_cast<double>(c.head_dim);
  return s;
}

Llama4bitBytes llama_4bit_bytes(const LlamaConfig& c, int64_t blocksize, bool double_quant, double other_bytes) {
  const LlamaSize s = llama_size(c);
  const double blocks = s.projection_params / static_cast<double>(blocksize);
  const double absmax = double_quant ? blocks * (1.0 + 4.0 / 256.0) : blocks * 4.0;
  return {s.projection_params * 0.5 + absmax, s.other_params * other_bytes};
}

double llama_min_weight_bytes(const LlamaConfig& c) {
  const LlamaSize s = llama_size(c);
  return s.projection_params * 0.5 + s.other_params * 2.0;
}

std::string llama_size_keys(const LlamaConfig& c) {
  return "num_hidden_layers = " + std::to_string(c.num_hidden_layers) + ", hidden_size = " +
         std::to_string(c.hidden_size) + ", intermediate_size = " + std::to_string(c.intermediate_size) +
         ", vocab_size = " + std::to_string(c.vocab_size);
}

bool llama_projection_has_bias(const LlamaConfig& c, const std::string& projection) {
  if (projection == "self_attn.o_proj") return c.o_proj_bias;
  return projection.rfind("self_attn.", 0) == 0 ? c.attention_bias : c.mlp_bias;
}

const std::vector<std::string>& llama_projection_names() {
  static const std::vector<std::string> names = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                 "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                 "mlp.down_proj"};
  return names;
}

std::vector<int64_t> llama_projection_shape(const LlamaConfig& c, const std::string& p) {
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  if (p == "self_attn.q_proj") return {q, c.hidden_size};
  if (p == "self_attn.k_proj" || p == "self_attn.v_proj") return {kv, c.hidden_size};
  if (p == "self_attn.o_proj") return {c.hidden_size, q};
  if (p == "mlp.gate_proj" || p == "mlp.up_proj") return {c.intermediate_size, c.hidden_size};
  if (p == "mlp.down_proj") return {c.hidden_size, c.intermediate_size};
  if (p == "self_attn.qkv_proj") return {q + 2 * kv, c.hidden_size};
  if (p == "mlp.gate_up_proj") return {2 * c.intermediate_size, c.hidden_size};
  throw Error("unknown projection " + p);
}

std::vector<std::string> stored_projection_names(const LlamaConfig& c) {
  if (c.family != ModelFamily::kPhi3) return llama_projection_names();
  return {"self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"};
}

bool is_llama_projection_weight(const std::string& name) {
  static const std::regex re(
      R"(model\.layers\.\d+\.(self_attn\.(q|k|v|o|qkv)_proj|mlp\.(gate|up|down|gate_up)_proj)\.weight)");
  return std::regex_match(name, re);
}

void check_stored_layers(const LlamaConfig& c, const std::vector<std::string>& names, const std::string& dir) {
  static constexpr std::string_view kPrefix = "model.layers.";
  int64_t top = -1;
  std::string example;
  for (const std::string& name : names) {
    if (name.compare(0, kPrefix.size(), kPrefix) != 0) continue;
    int64_t layer = 0;
    size_t i = kPrefix.size();
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && layer < (int64_t{1} << 40); ++i)
      layer = layer * 10 + (name[i] - '0');
    if (i == kPrefix.size() || i >= name.size() || name[i] != '.') continue;  // not a layer's tensor
    if (layer > top) top = layer, example = name;
  }
  if (top >= c.num_hidden_layers)
    throw InputError(dir + ": the weights hold decoder layer " + std::to_string(top) + " ('" + example +
                     "'), but config.json's num_hidden_layers is " + std::to_string(c.num_hidden_layers) +
                     ": config.json does not describe these weights (layers " + std::to_string(c.num_hidden_layers) + " to " +
                     std::to_string(top) + " would be dropped in silence)");
}

std::vector<std::pair<std::string, std::vector<int64_t>>> llama_expected_weights(const LlamaConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> w;
  w.push_back({"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.push_back({p + "input_layernorm.weight", {c.hidden_size}});
    for (const auto& proj : stored_projection_names(c)) {
      w.push_back({p + proj + ".weight", llama_projection_shape(c, proj)});
      if (llama_projection_has_bias(c, proj)) w.push_back({p + proj + ".bias", {llama_projection_shape(c, proj)[0]}});
      if (proj == "mlp.down_proj" && c.gemma_norms) w.push_back({p + "post_feedforward_layernorm.weight", {c.hidden_size}});
      if (proj == "self_attn.o_proj") {
        if (c.qk_norm) {
          w.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
          w.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
        }
        w.push_back({p + "post_attention_layernorm.weight", {c.hidden_size}});
        if (c.gemma_norms) w.push_back({p + "pre_feedforward_layernorm.weight", {c.hidden_size}});
      }
    }
  }
  w.push_back({"model.norm.weight", {c.hidden_size}});
  if (!c.tie_word_embeddings) w.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}});
  return w;
}

}  // namespace qshard
