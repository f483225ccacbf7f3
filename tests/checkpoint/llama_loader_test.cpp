// load_llama_folder (checkpoint/llama_loader.h) on the golden folders of tests/data: each option
// gives what it promises, checked against the folder's own tensors:
//  - floats as stored (bf16 stays bf16, bytes as in the file) or all f32 (values widened);
//  - quantize on load: a float folder's projections become Params4bit, equal to quantize_4bit of
//    the stored weight; a bitsandbytes folder's projections load as stored whatever is asked;
//  - strict refuses a tensor config.json does not imply, lenient ignores it; both name a missing one;
//  - a PEFT adapter folder gives r / lora_alpha / use_rslora and fills the LoRA slots; LoRA slots
//    for the caller come zero-filled and only on the targets;
//  - the host check refuses a host too small for the tree, naming the folder and the sizes.
#include "checkpoint/llama_loader.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint/bnb_folder.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_index.h"
#include "common/test_util.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;
using testing_util::error_of;
using testing_util::TempDir;

const std::string kHf = std::string(QSHARD_TEST_DATA_DIR) + "/hf";
const std::string kModel = std::string(QSHARD_TEST_DATA_DIR) + "/model";

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

// The float parameters of a tree (frozen and trainable), by FQN.
void float_params(const Module& m, const std::string& prefix, std::map<std::string, Tensor>& out) {
  for (const auto& s : m.slots())
    if (s.kind == Module::SlotKind::kParameter) out.emplace(prefix + s.name, s.tensor);
  for (const auto& [name, child] : m.children()) float_params(*child, prefix + name + ".", out);
}
std::map<std::string, Tensor> float_params(const Module& root) {
  std::map<std::string, Tensor> out;
  float_params(root, "", out);
  return out;
}

// DIR's config.json and generation_config.json, and `tensors` as its model.safetensors.
void write_folder(const std::string& from, const std::string& dir, const NamedTensors& tensors) {
  for (const char* f : {"config.json", "generation_config.json"}) fs::copy_file(fs::path(from) / f, fs::path(dir) / f);
  save_safetensors((fs::path(dir) / "model.safetensors").string(), tensors);
}

NamedTensors all_tensors(const std::string& dir) {
  const SafetensorsFolder folder = SafetensorsFolder::open(dir);
  NamedTensors out;
  for (const auto& name : folder.names()) out.emplace_back(name, folder.get(name));
  return out;
}

TEST(LlamaLoader, FloatsAsStoredOrAllF32) {
  for (const auto& [name, stored_dtype] : std::vector<std::pair<std::string, DType>>{
           {"tiny_llama_bf16", DType::kBF16}, {"tiny_llama_bf16_sharded", DType::kBF16}, {"tiny_llama_f32", DType::kF32}}) {
    SCOPED_TRACE(name);
    const std::string dir = kHf + "/" + name;
    const SafetensorsFolder file = SafetensorsFolder::open(dir);
    LlamaLoadOptions f32;
    f32.floats = LlamaLoadOptions::Floats::kF32;
    const LoadedLlama as_stored = load_llama_folder(dir), wide = load_llama_folder(dir, f32);
    const auto a = float_params(*as_stored.tree), w = float_params(*wide.tree);
    // 2 layers x (7 projections + 2 norms) + embeddings + final norm + lm_head, all float here.
    ASSERT_EQ(a.size(), 21u);
    ASSERT_EQ(w.size(), a.size());
    for (const auto& [key, t] : a) {
      SCOPED_TRACE(key);
      const Tensor in_file = file.get(key);
      EXPECT_EQ(t.dtype(), stored_dtype);
      EXPECT_TRUE(same_bytes(t, in_file)) << "as stored: the file's bytes";
      const Tensor& f = w.at(key);
      EXPECT_EQ(f.dtype(), DType::kF32);
      EXPECT_EQ(f.to_f32_vector(), in_file.to_f32_vector()) << "f32: the stored values, widened";
    }
    EXPECT_EQ(as_stored.tree_bytes, llama_size(as_stored.config).total() * static_cast<double>(dtype_size(stored_dtype)));
    EXPECT_EQ(wide.tree_bytes, llama_size(wide.config).total() * 4.0);
  }
}

TEST(LlamaLoader, QuantizeOnLoadGivesParams4bitFromTheStoredWeights) {
  const std::string dir = kHf + "/tiny_llama_bf16";
  const SafetensorsFolder file = SafetensorsFolder::open(dir);
  LlamaLoadOptions o;
  o.quantize = QuantizeOptions{QuantType::kNf4, 64, true};
  const LoadedLlama m = load_llama_folder(dir, o);
  int projections = 0;
  for (const auto& [key, shape] : llama_expected_weights(m.config)) {
    SCOPED_TRACE(key);
    const Resolved r = resolve(*m.tree, key);
    if (!is_llama_projection_weight(key)) {
      ASSERT_EQ(r.kind, NodeKind::kParameter);
      EXPECT_TRUE(same_bytes(r.tensor, file.get(key))) << "other tensors as stored (bf16)";
      continue;
    }
    ASSERT_EQ(r.kind, NodeKind::kParams4bit);
    ++projections;
    const Params4bit want = quantize_4bit(file.get(key), *o.quantize);
    EXPECT_EQ(r.params4bit->quant_state.dtype, DType::kBF16);
    EXPECT_EQ(r.params4bit->quant_state.quant_type, QuantType::kNf4);
    EXPECT_TRUE(r.params4bit->quant_state.nested());
    const NamedTensors got = params4bit_state_dict(*r.params4bit, key), exp = params4bit_state_dict(want, key);
    ASSERT_EQ(got.size(), exp.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, exp[i].first);
      EXPECT_TRUE(same_bytes(got[i].second, exp[i].second)) << got[i].first;
    }
  }
  EXPECT_EQ(projections, 14);
  EXPECT_EQ(m.tree_bytes, llama_4bit_bytes(m.config, 64, true, 2.0).total());
}

TEST(LlamaLoader, BitsandbytesProjectionsLoadAsStored) {
  for (const std::string name : {"tiny_llama_bnb4_nf4_dq", "tiny_llama_bnb4_fp4"}) {
    SCOPED_TRACE(name);
    const std::string dir = kHf + "/" + name;
    const SafetensorsFolder file = SafetensorsFolder::open(dir);
    // Quantization unlike the folder's, f32 floats, lenient: the 4-bit tensors still come as stored.
    LlamaLoadOptions o;
    o.floats = LlamaLoadOptions::Floats::kF32;
    o.quantize = QuantizeOptions{name.find("nf4") != std::string::npos ? QuantType::kFp4 : QuantType::kNf4, 128,
                                 name.find("_dq") == std::string::npos};
    o.strict = false;
    for (const LlamaLoadOptions& opts : {LlamaLoadOptions{}, o}) {
      const LoadedLlama m = load_llama_folder(dir, opts);
      int four_bit = 0, floats = 0;
      for (const auto& name_in_file : file.names()) {
        SCOPED_TRACE(name_in_file);
        const auto r = try_resolve(*m.tree, name_in_file);
        ASSERT_TRUE(r.has_value());
        if (r->kind == NodeKind::kParameter) {
          ++floats;
          EXPECT_EQ(r->tensor.dtype(), opts.floats == LlamaLoadOptions::Floats::kF32 ? DType::kF32 : DType::kBF16);
          EXPECT_EQ(r->tensor.to_f32_vector(), file.get(name_in_file).to_f32_vector());
        } else {
          ++four_bit;
          EXPECT_TRUE(same_bytes(r->tensor, file.get(name_in_file))) << "4-bit data and statistics as stored";
        }
      }
      EXPECT_EQ(floats, 7);
      EXPECT_GT(four_bit, 14 * 3);
      const Params4bit& q = *resolve(*m.tree, "model.layers.1.mlp.down_proj.weight").params4bit;
      EXPECT_EQ(q.quant_state.quant_type, name.find("nf4") != std::string::npos ? QuantType::kNf4 : QuantType::kFp4);
      EXPECT_EQ(q.quant_state.blocksize, 64);
      EXPECT_EQ(q.quant_state.nested(), name.find("_dq") != std::string::npos);
    }
  }
}

TEST(LlamaLoader, StrictRejectsAnExtraTensorLenientIgnoresIt) {
  const std::string src = kHf + "/tiny_llama_bf16";
  TempDir tmp;
  const std::string dir = tmp.file("model");
  fs::create_directories(dir);
  NamedTensors tensors = all_tensors(src);
  tensors.emplace_back("model.extra.weight", Tensor::from_f32({4}, DType::kF32, std::vector<float>{1, 2, 3, 4}));
  write_folder(src, dir, tensors);

  const std::string msg = error_of([&] { load_llama_folder(dir); });
  EXPECT_NE(msg.find(dir), std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected keys (1): model.extra.weight"), std::string::npos) << msg;

  LlamaLoadOptions lenient;
  lenient.strict = false;
  const LoadedLlama m = load_llama_folder(dir, lenient);
  EXPECT_FALSE(try_resolve(*m.tree, "model.extra.weight").has_value());
  // The rest is the original folder's strict load, key for key and byte for byte.
  const NamedTensors got = state_dict(*m.tree), want = state_dict(*load_llama_folder(src).tree);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_TRUE(same_bytes(got[i].second, want[i].second)) << got[i].first;
  }
}

// Issue 25: a folder holding more decoder layers than config.json's num_hidden_layers is refused in
// both modes, naming the layer (lenient loads, eval / generate / train, dropped them in silence); so
// do quantize and dequantize (which copied them beside a config that does not describe them).
TEST(LlamaLoader, LayersBeyondTheConfigAreRefusedInBothModes) {
  for (const char* base : {"tiny_llama_bf16", "tiny_llama_bnb4_nf4_dq"}) {
    const std::string src = kHf + "/" + base;
    TempDir tmp;
    const std::string dir = tmp.file("model");
    fs::create_directories(dir);
    write_folder(src, dir, all_tensors(src));
    nlohmann::json config = nlohmann::json::parse(testing_util::read_bytes((fs::path(src) / "config.json").string()));
    config["num_hidden_layers"] = 1;
    std::ofstream((fs::path(dir) / "config.json").string()) << config.dump();
    LlamaLoadOptions lenient;
    lenient.strict = false;
    for (const LlamaLoadOptions& o : {LlamaLoadOptions{}, lenient}) {
      const std::string msg = error_of([&] { load_llama_folder(dir, o); });
      EXPECT_NE(msg.find(dir + ": the weights hold decoder layer 1 ('model.layers.1."), std::string::npos) << msg;
      EXPECT_NE(msg.find("config.json's num_hidden_layers is 1"), std::string::npos) << msg;
    }
    const std::string out = tmp.file("out");
    const std::string msg = error_of([&] {
      if (config.contains("quantization_config")) dequantize_model_folder(dir, out);
      else quantize_model_folder(dir, out, QuantizeFolderOptions{});
    });
    EXPECT_NE(msg.find("the weights hold decoder layer 1"), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(out));
  }
}

TEST(LlamaLoader, BothModesNameAMissingTensorAndAWrongShape) {
  const std::string src = kHf + "/tiny_llama_bf16";
  TempDir tmp;
  const std::string dir = tmp.file("model");
  fs::create_directories(dir);
  NamedTensors tensors;
  for (auto& [k, t] : all_tensors(src)) {
    if (k == "model.norm.weight") continue;
    if (k == "model.layers.0.mlp.up_proj.weight") t = Tensor::zeros({4, 4}, DType::kBF16);
    tensors.emplace_back(k, t);
  }
  write_folder(src, dir, tensors);
  for (bool strict : {true, false}) {
    LlamaLoadOptions o;
    o.strict = strict;
    o.quantize = QuantizeOptions{};  // the wrong shape goes to a Params4bit slot
    const std::string msg = error_of([&] { load_llama_folder(dir, o); });
    EXPECT_NE(msg.find("missing keys (1): model.norm.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.layers.0.mlp.up_proj.weight: expected F32, BF16 or F16 [96, 64] to quantize, got BF16 [4, 4]"),
              std::string::npos)
        << msg;
  }
}

// A 4-bit folder whose weight lacks its quant state (the packed JSON tensor) is named as such in
// both modes, with the file and both key names it may have: not "expected F32 ... to quantize,
// got U8" (lenient) nor an unexpected-statistics list (strict).
TEST(LlamaLoader, AMissingQuantStateIsNamedWithItsFileAndKey) {
  const std::string src = kHf + "/tiny_llama_bnb4_nf4_dq";
  TempDir tmp;
  const std::string dir = tmp.file("model");
  fs::create_directories(dir);
  const std::string w = "model.layers.1.self_attn.q_proj.weight";
  NamedTensors tensors;
  for (auto& [k, t] : all_tensors(src))
    if (k != w + ".quant_state.bitsandbytes__nf4") tensors.emplace_back(k, t);
  write_folder(src, dir, tensors);
  for (bool strict : {true, false}) {
    LlamaLoadOptions o;
    o.strict = strict;
    const std::string msg = error_of([&] { load_llama_folder(dir, o); });
    EXPECT_NE(msg.find(w + ": " + dir + "/model.safetensors: 4-bit weight '" + w + "' (U8 [2048, 1]) has no quant state: "
                       "neither '" + w + ".quant_state.bitsandbytes__nf4' nor '" + w +
                       ".quant_state.bitsandbytes__fp4' is stored"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("to quantize"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("unexpected keys"), std::string::npos) << msg;
  }
}

TEST(LlamaLoader, AdapterFolderGivesItsSettingsAndWeights) {
  TempDir tmp;
  const std::string adapter = tmp.file("adapter");
  fs::create_directories(adapter);
  fs::copy_file(kModel + "/llama3_adapter/adapter_model.safetensors", adapter + "/adapter_model.safetensors");
  nlohmann::json j = nlohmann::json::parse(std::ifstream(kModel + "/llama3_adapter/adapter_config.json"));
  j["lora_alpha"] = 12.5;
  j["use_rslora"] = true;
  std::ofstream(adapter + "/adapter_config.json") << j.dump(2);

  LlamaLoadOptions o;
  o.floats = LlamaLoadOptions::Floats::kF32;
  o.strict = false;
  o.adapter_dir = adapter;
  const LoadedLlama m = load_llama_folder(kModel + "/tiny_llama3_tied", o);
  ASSERT_TRUE(m.adapter.has_value());
  EXPECT_EQ(m.adapter->r, 4);
  EXPECT_EQ(m.adapter->lora_alpha, 12.5);
  EXPECT_TRUE(m.adapter->use_rslora);
  EXPECT_EQ(m.adapter->target_modules.size(), 7u);
  const SafetensorsFile weights = SafetensorsFile::open(adapter + "/adapter_model.safetensors");
  ASSERT_EQ(weights.entries().size(), 2u * 2 * 7);
  for (const auto& e : weights.entries()) {
    SCOPED_TRACE(e.name);
    const Resolved r = resolve(*m.tree, e.name.substr(std::string("base_model.model.").size()));
    EXPECT_EQ(r.tensor.dtype(), DType::kF32);
    EXPECT_EQ(r.tensor.to_f32_vector(), weights.get(e.name).to_f32_vector());
  }
  EXPECT_EQ(resolve(*m.tree, "model.layers.0.self_attn.q_proj.lora_A.weight").tensor.shape(), (Shape{4, 48}));
  // No adapter: no LoRA slots, no settings.
  o.adapter_dir.clear();
  const LoadedLlama bare = load_llama_folder(kModel + "/tiny_llama3_tied", o);
  EXPECT_FALSE(bare.adapter.has_value());
  EXPECT_FALSE(try_resolve(*bare.tree, "model.layers.0.self_attn.q_proj.lora_A.weight").has_value());
}

TEST(LlamaLoader, LoraSlotsForTheCallerAreZeroAndOnlyOnTargets) {
  LlamaLoadOptions o;
  o.lora = LoraSpec{3, {"q_proj", "down_proj"}};
  const LoadedLlama m = load_llama_folder(kHf + "/tiny_llama_bf16", o);  // strict: LoRA is not the folder's
  const Resolved a = resolve(*m.tree, "model.layers.1.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(a.tensor.shape(), (Shape{3, 64}));
  EXPECT_EQ(a.tensor.dtype(), DType::kF32);
  EXPECT_EQ(a.tensor.to_f32_vector(), std::vector<float>(3 * 64, 0.0f));
  EXPECT_EQ(resolve(*m.tree, "model.layers.1.mlp.down_proj.lora_B.weight").tensor.shape(), (Shape{64, 3}));
  EXPECT_FALSE(try_resolve(*m.tree, "model.layers.1.self_attn.k_proj.lora_A.weight").has_value());
  EXPECT_THROW(
      {
        o.adapter_dir = kModel + "/llama3_adapter";
        load_llama_folder(kHf + "/tiny_llama_bf16", o);
      },
      Error);
}

TEST(LlamaLoader, HostCheckRefusesATooSmallHost) {
  const std::string dir = kHf + "/tiny_llama_bnb4_nf4_dq";
  LlamaLoadOptions o;
  o.floats = LlamaLoadOptions::Floats::kF32;
  o.strict = false;
  o.check_host_memory = true;
  EXPECT_NO_THROW(load_llama_folder(dir, o));
  ::setenv("QSHARD_HOST_MEMORY_BYTES", "1000", 1);
  const std::string msg = error_of([&] { load_llama_folder(dir, o); });
  o.check_host_memory = false;
  EXPECT_NO_THROW(load_llama_folder(dir, o)) << "no check asked";
  ::unsetenv("QSHARD_HOST_MEMORY_BYTES");
  EXPECT_NE(msg.find("loading " + dir + " needs at least"), std::string::npos) << msg;
  EXPECT_NE(msg.find("num_hidden_layers = 2"), std::string::npos) << msg;
}

}  // namespace
}  // namespace qshard
