// The model families beside Llama (Qwen2, Qwen3, Mistral, Phi-3, Gemma 2, Gemma 3) against transformers
// (scripts/golden/make_family_golden.py: tiny random-weight models of each family's own config
// class, float32, with random biases and q/k norms; Mistral's sliding window 4 < T = 12, so the
// window masks; scripts/golden/make_phi3_golden.py: Phi-3 with fused qkv_proj / gate_up_proj in two
// shapes, one whose 4-bit blocks straddle the split points, their bnb 4-bit folders written by
// transformers + bitsandbytes, and a PEFT adapter on the fused projections). `qshard eval --dump-logits` on the CPU matches transformers' logits within 1e-5;
// each folder quantized to bnb 4-bit loads and evaluates close to its float original with every
// config.json field kept; generation's KV cache gives the full forward's logits (Mistral's window
// included); unknown variants are refused by name. The GPU case (bf16, cuDNN with the sliding
// window) runs where there is a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "checkpoint/bnb_folder.h"
#include "checkpoint/fused_projections.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/llama_loader.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_index.h"
#include "infer/evaluate.h"
#include "model/llama_model.h"
#include "model/llama_ops.h"
#include "runtime/device_context.h"
#include "runtime/error.h"
#include "common/test_util.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;

const std::string kData = QSHARD_TEST_DATA_DIR;
const std::string kFamily = kData + "/family";
// Both sides float32, differing in summation order only.
constexpr double kLogitTol = 1e-5;
const char* const kFamilies[] = {"qwen2", "qwen3", "mistral", "phi3", "phi3_odd", "gemma2", "gemma3"};

// The golden logits of a family's folder (and of the Phi-3 variants: phi3_bnb4, phi3_peft, ...;
// Gemma's from scripts/golden/make_gemma_golden.py).
std::vector<float> golden_logits(const std::string& name) {
  const bool phi3 = name.rfind("phi3", 0) == 0, gemma = name.rfind("gemma", 0) == 0;
  const char* file = phi3 ? "/phi3_golden.safetensors" : gemma ? "/gemma_golden.safetensors" : "/golden.safetensors";
  return SafetensorsFile::open(kFamily + file).get(name).to_f32_vector();
}

std::vector<float> eval_logits(const std::string& model, DeviceChoice device, EvalResult* result = nullptr,
                               const std::string& adapter = "") {
  EvalOptions o;
  o.device = device;
  o.model_dir = model;
  o.adapter_dir = adapter;
  o.data = kFamily + "/ids.json";
  o.dump_logits = (fs::temp_directory_path() / ("qshard_family_" + std::to_string(::getpid()) + ".safetensors")).string();
  const EvalResult r = evaluate_model(o);
  if (result) *result = r;
  auto logits = SafetensorsFile::open(o.dump_logits).get("logits").to_f32_vector();
  fs::remove(o.dump_logits);
  return logits;
}

using testing_util::max_abs_diff;

TEST(Family, ConfigsParseTheirKeys) {
  const LlamaConfig q2 = LlamaConfig::load(kFamily + "/qwen2");
  EXPECT_EQ(q2.family, ModelFamily::kQwen2);
  EXPECT_TRUE(q2.attention_bias);
  EXPECT_FALSE(q2.o_proj_bias);
  EXPECT_FALSE(q2.mlp_bias);
  EXPECT_TRUE(q2.tie_word_embeddings);
  EXPECT_EQ(q2.rope_theta, 1000000.0);
  const LlamaConfig q3 = LlamaConfig::load(kFamily + "/qwen3");
  EXPECT_EQ(q3.family, ModelFamily::kQwen3);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_EQ(q3.head_dim, 16);  // explicit, not hidden / heads = 8
  EXPECT_TRUE(q3.attention_bias && q3.o_proj_bias);
  const LlamaConfig m = LlamaConfig::load(kFamily + "/mistral");
  EXPECT_EQ(m.family, ModelFamily::kMistral);
  EXPECT_EQ(m.sliding_window, 4);
  EXPECT_FALSE(m.attention_bias || m.o_proj_bias || m.mlp_bias || m.qk_norm);
  // The weights each family implies, as transformers saved them (strict load: no missing, no extra).
  for (const char* f : kFamilies) {
    SCOPED_TRACE(f);
    EXPECT_NO_THROW(load_llama_folder(kFamily + "/" + f));
  }
}

TEST(Family, UnknownVariantsAreRefusedByName) {
  auto refused = [](nlohmann::json j, const std::string& want) {
    try {
      LlamaConfig::from_json(j, "family/config.json");
      ADD_FAILURE() << "accepted " << j.dump();
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  const nlohmann::json base = {{"vocab_size", 64}, {"hidden_size", 32}, {"intermediate_size", 64},
                               {"num_hidden_layers", 1}, {"num_attention_heads", 4}};
  nlohmann::json j = base;
  j["model_type"] = "gemma";
  refused(j, "\"gemma\"");
  for (const char* f : {"qwen2", "qwen3"}) {
    j = base;
    j["model_type"] = f;
    j["use_sliding_window"] = true;
    refused(j, "use_sliding_window");
  }
  j = base;
  j["model_type"] = "mistral";
  j["sliding_window"] = 0;
  refused(j, "sliding_window");
  j["sliding_window"] = nullptr;  // v0.2+: no window
  EXPECT_EQ(LlamaConfig::from_json(j, "x").sliding_window, 0);
}

// Gemma's keys as transformers writes them (the golden folders) and in the older form (rope_theta,
// rope_scaling, rope_local_base_freq, no layer_types), each family's defaults, and what qshard
// refuses by key: the multimodal gemma3, another activation, bidirectional attention, layer_types
// of the wrong length or kind, per-layer-type RoPE outside Gemma 3.
TEST(Family, GemmaConfigs) {
  const LlamaConfig g2 = LlamaConfig::load(kFamily + "/gemma2");
  EXPECT_EQ(g2.family, ModelFamily::kGemma2);
  EXPECT_TRUE(g2.gemma_norms && g2.gelu_tanh && g2.tie_word_embeddings);
  EXPECT_FALSE(g2.qk_norm);
  EXPECT_EQ(g2.query_pre_attn_scalar, 24.0);
  EXPECT_EQ(g2.attn_logit_softcapping, 1.5);
  EXPECT_EQ(g2.final_logit_softcapping, 2.0);
  EXPECT_DOUBLE_EQ(g2.embed_scale, std::sqrt(32.0));
  EXPECT_EQ(g2.sliding_layers, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(layer_window(g2, 0), 4);
  EXPECT_EQ(layer_window(g2, 1), 0);
  EXPECT_EQ(g2.rope_local_theta, 0.0);
  const LlamaConfig g3 = LlamaConfig::load(kFamily + "/gemma3");
  EXPECT_EQ(g3.family, ModelFamily::kGemma3);
  EXPECT_TRUE(g3.gemma_norms && g3.qk_norm && !g3.tie_word_embeddings);
  EXPECT_EQ(g3.attn_logit_softcapping, 0.0);
  EXPECT_EQ(g3.final_logit_softcapping, 0.0);
  EXPECT_EQ(g3.sliding_layers, (std::vector<bool>{true, true, false, true}));
  EXPECT_EQ(g3.rope_theta, 1000000.0);
  EXPECT_EQ(g3.rope_scaling.rope_type, "linear");
  EXPECT_EQ(g3.rope_scaling.factor, 2.0);
  EXPECT_EQ(g3.rope_local_theta, 10000.0);
  EXPECT_TRUE(layer_local_rope(g3, 0));
  EXPECT_FALSE(layer_local_rope(g3, 2));

  const nlohmann::json base = {{"vocab_size", 64}, {"hidden_size", 32}, {"intermediate_size", 64},
                               {"num_hidden_layers", 12}, {"num_attention_heads", 4}, {"num_key_value_heads", 1}};
  nlohmann::json j = base;
  j["model_type"] = "gemma3_text";  // the older keys, the family's defaults
  j["rope_theta"] = 1000000.0;
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  j["rope_local_base_freq"] = 10000.0;
  const LlamaConfig old3 = LlamaConfig::from_json(j, "x");
  EXPECT_EQ(old3.head_dim, 256);
  EXPECT_EQ(old3.query_pre_attn_scalar, 256.0);
  EXPECT_EQ(old3.sliding_window, 4096);
  EXPECT_TRUE(old3.tie_word_embeddings);
  EXPECT_EQ(old3.rope_scaling.factor, 8.0);
  EXPECT_EQ(old3.rope_local_theta, 10000.0);
  for (int64_t l = 0; l < 12; ++l) EXPECT_EQ(old3.sliding_layers[static_cast<size_t>(l)], l != 5 && l != 11) << l;
  j = base;
  j["model_type"] = "gemma2";
  const LlamaConfig old2 = LlamaConfig::from_json(j, "x");
  EXPECT_EQ(old2.attn_logit_softcapping, 50.0);
  EXPECT_EQ(old2.final_logit_softcapping, 30.0);
  for (int64_t l = 0; l < 12; ++l) EXPECT_EQ(old2.sliding_layers[static_cast<size_t>(l)], l % 2 == 0) << l;
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = nullptr;
  EXPECT_EQ(LlamaConfig::from_json(j, "x").attn_logit_softcapping, 0.0);
  EXPECT_EQ(LlamaConfig::from_json(j, "x").final_logit_softcapping, 0.0);

  auto refused = [](nlohmann::json bad, const std::string& want) {
    const std::string m = testing_util::error_of([&] { LlamaConfig::from_json(bad, "gemma/config.json"); });
    EXPECT_NE(m.find(want), std::string::npos) << m;
  };
  j = base;
  j["model_type"] = "gemma3";
  refused(j, "gemma3_text");
  j["model_type"] = "gemma2";
  j["hidden_activation"] = "gelu";
  refused(j, "hidden_activation");
  j = base;
  j["model_type"] = "gemma3_text";
  j["use_bidirectional_attention"] = true;
  refused(j, "use_bidirectional_attention");
  j = base;
  j["model_type"] = "gemma2";
  j["layer_types"] = {"sliding_attention", "full_attention"};
  refused(j, "layer_types");
  j["layer_types"] = nlohmann::json::array();
  for (int i = 0; i < 12; ++i) j["layer_types"].push_back(i == 3 ? "chunked_attention" : "full_attention");
  refused(j, "layer_types\"[3]");
  j = base;
  j["model_type"] = "llama";
  j["rope_parameters"] = {{"full_attention", {{"rope_theta", 10000.0}}}, {"sliding_attention", {{"rope_theta", 10.0}}}};
  refused(j, "rope_parameters");
  j = base;
  j["model_type"] = "gemma2";
  j["query_pre_attn_scalar"] = 0;
  refused(j, "query_pre_attn_scalar");
}

TEST(Family, LogitsMatchTransformers) {
  for (const char* f : kFamilies) {
    SCOPED_TRACE(f);
    EvalResult r;
    const auto mine = eval_logits(kFamily + "/" + f, DeviceChoice::kCpu, &r);
    EXPECT_EQ(r.sequences, 2);
    const double worst = max_abs_diff(mine, golden_logits(f));
    std::printf("%s: max |logit - transformers| = %.2e (tolerance %.0e)\n", f, worst, kLogitTol);
    EXPECT_LE(worst, kLogitTol);
  }
}

// Mistral without its window differs from transformers (the window is not a no-op here), and the
// same folder with the window as wide as the sequence is plain causal attention.
TEST(Family, MistralWindowMatters) {
  const fs::path dir = fs::temp_directory_path() / ("qshard_family_nowindow_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kFamily + "/mistral/model.safetensors", dir / "model.safetensors");
  nlohmann::json j = nlohmann::json::parse(std::ifstream(kFamily + "/mistral/config.json"));
  std::vector<float> by_window[2];
  for (int i = 0; i < 2; ++i) {
    j["sliding_window"] = i == 0 ? nlohmann::json(nullptr) : nlohmann::json(12);  // T = 12
    std::ofstream(dir / "config.json") << j.dump();
    by_window[i] = eval_logits(dir.string(), DeviceChoice::kCpu);
  }
  EXPECT_EQ(max_abs_diff(by_window[0], by_window[1]), 0.0);
  EXPECT_GT(max_abs_diff(by_window[0], golden_logits("mistral")), 1e-2);
  fs::remove_all(dir);
}

// Each family's folder quantized by qshard: a bnb 4-bit folder that loads (strict), its config.json
// the input's with quantization_config added (model_type and every other field kept), whose
// logits are those of its own dequantized weights (qshard dequantize: the 4-bit weights dequantize
// as stored, the biases and q/k norms pass through) and differ from the float model's (4-bit error).
TEST(Family, Bnb4FoldersRoundTrip) {
  for (const char* f : kFamilies) {
    SCOPED_TRACE(f);
    const std::string tag = std::string(f) + "_" + std::to_string(::getpid());
    const fs::path out = fs::temp_directory_path() / ("qshard_family_bnb4_" + tag);
    const fs::path deq = fs::temp_directory_path() / ("qshard_family_deq_" + tag);
    fs::remove_all(out);
    fs::remove_all(deq);
    quantize_model_folder(kFamily + "/" + f, out.string(), QuantizeFolderOptions{});
    const nlohmann::json in = nlohmann::json::parse(std::ifstream(kFamily + "/" + f + "/config.json"));
    nlohmann::json got = nlohmann::json::parse(std::ifstream(out / "config.json"));
    EXPECT_TRUE(got.contains("quantization_config"));
    for (const auto& [k, v] : in.items()) EXPECT_EQ(got[k], v) << k;
    const LoadedLlama m = load_llama_folder(out.string());
    EXPECT_EQ(m.config.family, LlamaConfig::load(kFamily + "/" + f).family);
    dequantize_model_folder(out.string(), deq.string(), DType::kF32);
    EXPECT_EQ(nlohmann::json::parse(std::ifstream(deq / "config.json"))["model_type"], in["model_type"]);
    const auto q = eval_logits(out.string(), DeviceChoice::kCpu);
    const auto dq = eval_logits(deq.string(), DeviceChoice::kCpu);
    const auto ref = eval_logits(kFamily + "/" + f, DeviceChoice::kCpu);
    const double vs_deq = max_abs_diff(q, dq), vs_f32 = max_abs_diff(q, ref);
    std::printf("%s bnb4: max |logit - dequantized folder| = %.2e, max |logit - f32 model| = %.3f\n", f, vs_deq, vs_f32);
    EXPECT_LE(vs_deq, kLogitTol);
    EXPECT_GT(vs_f32, 1e-2);  // the 4-bit weights were used, not the float ones
    fs::remove_all(out);
    fs::remove_all(deq);
  }
}

// Generation: the prompt then one token at a time through the KV cache gives the full forward's
// logits at every position (Mistral: queries past the window read only the window's keys).
TEST(Family, KvCacheMatchesFullForward) {
  for (const char* f : kFamilies) {
    SCOPED_TRACE(f);
    LlamaLoadOptions lo;
    lo.floats = LlamaLoadOptions::Floats::kF32;
    LoadedLlama m = load_llama_folder(kFamily + "/" + f, lo);
    DeviceContext ctx(Backend::kCpu, -1);
    LlamaModelOptions mo;
    mo.max_seq = 12;
    mo.kv_cache_tokens = 12;
    LlamaModel model(m.config, *m.tree, ctx, mo);
    const std::vector<int64_t> ids = {5, 17, 99, 3, 42, 8, 77, 64, 12, 100, 31, 9};
    const std::vector<float> full = model.forward_logits(ids, 1, 12);
    const int64_t V = m.config.vocab_size;
    std::vector<float> last = model.forward_cached(std::span(ids).subspan(0, 3), 0);
    for (int64_t t = 3; t <= 12; ++t) {
      const std::vector<float> want(full.begin() + (t - 1) * V, full.begin() + t * V);
      EXPECT_LE(max_abs_diff(last, want), 1e-5) << "position " << t - 1;
      if (t < 12) last = model.forward_cached(std::span(ids).subspan(static_cast<size_t>(t), 1), t);
    }
  }
}

// ---- Phi-3: fused qkv_proj / gate_up_proj in the files, split on load ----

TEST(Phi3, ConfigAndFoldersLoadSplit) {
  const LlamaConfig c = LlamaConfig::load(kFamily + "/phi3");
  EXPECT_EQ(c.family, ModelFamily::kPhi3);
  EXPECT_EQ(c.sliding_window, 5);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_FALSE(c.attention_bias || c.o_proj_bias || c.mlp_bias || c.qk_norm);
  EXPECT_EQ(LlamaConfig::load(kFamily + "/phi3_odd").sliding_window, 0);
  const auto stored = stored_projection_names(c);
  EXPECT_EQ(stored, (std::vector<std::string>{"self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"}));
  // Strict loads: the folders hold exactly the fused tensors the config implies, 4-bit ones with
  // their statistics; the tree holds q/k/v and gate/up apart, the rows of the fused weights.
  for (const char* f : {"phi3", "phi3_odd", "phi3_bnb4", "phi3_odd_bnb4"}) {
    SCOPED_TRACE(f);
    const LoadedLlama m = load_llama_folder(kFamily + "/" + f);
    const LlamaConfig& mc = m.config;
    const SafetensorsFolder folder = SafetensorsFolder::open(kFamily + "/" + f);
    for (const FusedProjection& fp : fused_projections(mc)) {
      const std::string fused_key = "model.layers.1." + fp.fused + ".weight";
      Tensor whole;  // the fused weight as values (f32), from the file: float, or dequantized by qshard
      if (mc.quantized) {
        const TensorLookup lookup = [&](const std::string& k) -> std::optional<Tensor> {
          if (!folder.contains(k)) return std::nullopt;
          return folder.get(k);
        };
        whole = dequantize_4bit(params4bit_from_state_dict(fused_key, lookup, f), DType::kF32);
      } else {
        whole = Tensor::from_f32(folder.get(fused_key).shape(), DType::kF32, folder.get(fused_key).to_f32_vector());
      }
      int64_t row0 = 0;
      for (size_t i = 0; i < fp.parts.size(); row0 += fp.rows[i], ++i) {
        const Resolved r = resolve(*m.tree, "model.layers.1." + fp.parts[i] + ".weight");
        const Tensor part = mc.quantized ? dequantize_4bit(*r.params4bit, DType::kF32)
                                         : Tensor::from_f32(r.tensor.shape(), DType::kF32, r.tensor.to_f32_vector());
        const Tensor want = take_rows(whole, row0, fp.rows[i]);
        ASSERT_EQ(part.shape(), want.shape()) << fp.parts[i];
        EXPECT_EQ(std::memcmp(part.raw(), want.raw(), want.nbytes()), 0) << fp.parts[i] << ": not the fused rows bit for bit";
      }
    }
  }
}

TEST(Phi3, VariantsAreRefusedByKeyAndValue) {
  auto refused = [](nlohmann::json j, const std::string& key, const std::string& value) {
    try {
      LlamaConfig::from_json(j, "phi3/config.json");
      ADD_FAILURE() << "accepted " << j.dump();
    } catch (const InputError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(key), std::string::npos) << m;
      EXPECT_NE(m.find(value), std::string::npos) << m;
    }
  };
  const nlohmann::json base = nlohmann::json::parse(std::ifstream(kFamily + "/phi3/config.json"));
  EXPECT_NO_THROW(LlamaConfig::from_json(base, "x"));
  nlohmann::json j = base;  // the 128k models: LongRoPE, in the older rope_scaling form
  j.erase("rope_parameters");
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}};
  refused(j, "rope_scaling", "longrope");
  j["rope_scaling"] = {{"type", "su"}};
  refused(j, "rope_scaling", "su");
  j = base;
  j["rope_parameters"]["rope_type"] = "longrope";
  refused(j, "rope_parameters", "longrope");
  j["rope_parameters"]["rope_type"] = "llama3";  // not a Phi-3 RoPE (transformers refuses it too)
  refused(j, "rope_parameters", "llama3");
  j = base;
  j["rope_parameters"]["partial_rotary_factor"] = 0.75;  // Phi-4-mini
  refused(j, "partial_rotary_factor", "0.75");
  j = base;
  j.erase("rope_parameters");
  j["partial_rotary_factor"] = 0.5;
  refused(j, "partial_rotary_factor", "0.5");
  for (const char* k : {"resid_pdrop", "embd_pdrop", "attention_dropout"}) {
    j = base;
    j[k] = 0.1;
    refused(j, k, "0.1");
  }
  j = base;
  j["sliding_window"] = 0;
  refused(j, "sliding_window", "0");
  j["sliding_window"] = nullptr;
  EXPECT_EQ(LlamaConfig::from_json(j, "x").sliding_window, 0);
  // LoRA targets are PEFT's names for the family.
  const LlamaConfig phi3 = LlamaConfig::from_json(base, "x");
  EXPECT_EQ(tree_lora_targets(phi3, {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}, "job"),
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  // The default, all seven by Llama's names: every projection of the Phi-3 model too (a job names
  // no targets and trains all four fused and plain modules).
  const std::vector<std::string> seven = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  EXPECT_EQ(tree_lora_targets(phi3, seven, "job"), seven);
  for (const char* t : {"q_proj", "v_proj", "up_proj"}) {
    const std::string m = testing_util::error_of([&] { tree_lora_targets(phi3, {t}, "job.yaml: lora.target_modules"); });
    EXPECT_NE(m.find(std::string("'") + t + "'"), std::string::npos) << m;
    EXPECT_NE(m.find("qkv_proj, o_proj, gate_up_proj, down_proj"), std::string::npos) << m;
  }
  const LlamaConfig llama = LlamaConfig::load(kFamily + "/mistral");
  const std::string m = testing_util::error_of([&] { tree_lora_targets(llama, {"qkv_proj"}, "job.yaml"); });
  EXPECT_NE(m.find("'qkv_proj'"), std::string::npos) << m;
}

// The 4-bit folders transformers + bitsandbytes wrote (bf16 originals, NF4, double quant) evaluate
// as bitsandbytes' forward computes them (make_phi3_golden.py), with the fused weights split.
TEST(Phi3, Bnb4FoldersMatchBitsandbytes) {
  for (const char* f : {"phi3_bnb4", "phi3_odd_bnb4"}) {
    SCOPED_TRACE(f);
    const double worst = max_abs_diff(eval_logits(kFamily + "/" + f, DeviceChoice::kCpu), golden_logits(f));
    std::printf("%s: max |logit - transformers + bitsandbytes| = %.2e (tolerance %.0e)\n", f, worst, kLogitTol);
    EXPECT_LE(worst, kLogitTol);
  }
}

// PEFT's adapter on qkv_proj / gate_up_proj (one lora_A shared by the parts) gives PEFT's logits.
TEST(Phi3, PeftAdapterMatchesPeft) {
  const auto mine = eval_logits(kFamily + "/phi3", DeviceChoice::kCpu, nullptr, kFamily + "/phi3_adapter");
  const double worst = max_abs_diff(mine, golden_logits("phi3_peft"));
  std::printf("phi3 + PEFT adapter: max |logit - PEFT| = %.2e (tolerance %.0e)\n", worst, kLogitTol);
  EXPECT_LE(worst, kLogitTol);
  EXPECT_GT(max_abs_diff(mine, golden_logits("phi3")), 1e-1) << "the adapter was applied";
}

// The GPU (bf16, cuBLASLt, cuDNN attention with the sliding window as a diagonal band; Gemma 2's
// soft-capped scores through the eager attention) against the CPU's f32 reference: logits within
// 3% of the largest, as EvalGpu for Llama.
TEST(FamilyGpu, MatchesCpu) {
  if (!cuda_available() || !ops::has_backend(Backend::kCuda, "attention_fwd")) GTEST_SKIP() << "no GPU / CUDA attention";
  std::vector<std::string> folders(std::begin(kFamilies), std::end(kFamilies));
  folders.push_back("phi3_bnb4");  // 4-bit parts split from qkv_proj / gate_up_proj (nested blocks straddled)
  for (const std::string& f : folders) {
    SCOPED_TRACE(f);
    if (LlamaConfig::load(kFamily + "/" + f).head_dim % 8 != 0) {  // refused up front on the GPU, by name
      const std::string m = testing_util::error_of([&] { eval_logits(kFamily + "/" + f, DeviceChoice::kCuda); });
      EXPECT_NE(m.find("is not a multiple of 8"), std::string::npos) << m;
      continue;
    }
    const auto cpu = eval_logits(kFamily + "/" + f, DeviceChoice::kCpu);
    const auto gpu = eval_logits(kFamily + "/" + f, DeviceChoice::kCuda);
    double scale = 0;
    for (float x : cpu) scale = std::max(scale, static_cast<double>(std::fabs(x)));
    const double worst = max_abs_diff(cpu, gpu);
    std::printf("%s: GPU vs CPU max |logit diff| %.3e (largest logit %.3f)\n", f.c_str(), worst, scale);
    EXPECT_LE(worst, 0.03 * scale);
  }
}

}  // namespace
}  // namespace qshard
