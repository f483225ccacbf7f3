// HF config parsing and the bnb 4-bit folder conversion (`qshard quantize` / `dequantize`),
// against folders made by real transformers + bitsandbytes (scripts/golden/make_hf_golden.py).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <tuple>
#include <nlohmann/json.hpp>

#include "checkpoint/bnb_folder.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/random_llama.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_index.h"
#include "common/json_mutations.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;

const std::string kHf = std::string(QSHARD_TEST_DATA_DIR) + "/hf";

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("qshard_hf_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& s) const { return (path_ / s).string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

void expect_input_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

void copy_folder(const std::string& from, const std::string& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) fs::copy_file(e.path(), fs::path(to) / e.path().filename());
}

TEST(HfConfig, ParsesTransformersConfig) {
  const LlamaConfig c = LlamaConfig::load(kHf + "/tiny_llama_f32");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.quantized);
  EXPECT_TRUE(LlamaConfig::load(kHf + "/tiny_llama_bnb4_nf4_dq").quantized);
}

// Every one-node damage of a config.json with every field qshard reads (issue 25): parses, or is an
// InputError naming the file; never a nlohmann exception or its text.
TEST(HfConfig, EveryDamagedFieldIsRefusedByName) {
  for (const char* family : {"llama", "mistral", "qwen3"}) {
    nlohmann::json rich = nlohmann::json::parse(R"({
      "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 128,
      "rms_norm_eps": 1e-5, "hidden_act": "silu", "rope_theta": 500000.0, "tie_word_embeddings": false,
      "attention_bias": false, "mlp_bias": false, "use_sliding_window": false, "sliding_window": 64,
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 64},
      "bos_token_id": 1, "eos_token_id": [2, 3], "torch_dtype": "bfloat16",
      "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
                              "bnb_4bit_use_double_quant": true}})");
    rich["model_type"] = family;
    if (std::string(family) != "llama") rich.erase("rope_scaling");
    ASSERT_NO_THROW(LlamaConfig::from_json(rich, "m/config.json")) << family;
    size_t refused = 0;
    test::for_each_mutation<nlohmann::json>(rich, [&](const nlohmann::json& damaged, const std::string& what) {
      try {
        LlamaConfig::from_json(damaged, "m/config.json");
      } catch (const InputError& e) {
        ++refused;
        const std::string m = e.what();
        EXPECT_EQ(m.rfind("m/config.json", 0), 0u) << family << " " << what << ": " << m;
        EXPECT_EQ(m.find("json.exception"), std::string::npos) << family << " " << what << ": " << m;
      } catch (const std::exception& e) {
        ADD_FAILURE() << family << " " << what << ": not an InputError: " << e.what();
      }
    });
    EXPECT_GT(refused, 100u) << family;
  }
  // Fields of the wrong type that were skipped in silence.
  const nlohmann::json base = nlohmann::json::parse(R"({"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4})");
  for (const auto& [key, value, message] : std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"bos_token_id", "1", R"(key "bos_token_id" must be an integer, got "1")"},
           {"eos_token_id", "2", R"(key "eos_token_id" must be an integer or a list of integers, got "2")"},
           {"eos_token_id", {2, "3"}, R"(key "eos_token_id" must be an integer or a list of integers, got [2,"3"])"},
           {"torch_dtype", 5, R"(key "torch_dtype" must be a string, got 5)"},
           {"quantization_config", "bnb", R"(key "quantization_config" must be an object, got "bnb")"},
           {"rope_scaling", {{"rope_type", 3}}, R"(key "rope_scaling".rope_type must be a string, got 3)"}}) {
    nlohmann::json bad = base;
    bad[key] = value;
    try {
      LlamaConfig::from_json(bad, "m/config.json");
      ADD_FAILURE() << key << " = " << value.dump() << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("m/config.json: " + message), std::string::npos) << e.what();
    }
  }
  nlohmann::json nulls = base;
  for (const char* k : {"bos_token_id", "eos_token_id", "torch_dtype", "quantization_config"}) nulls[k] = nullptr;
  EXPECT_NO_THROW(LlamaConfig::from_json(nulls, "m/config.json"));
}

TEST(HfConfig, BothRopeForms) {
  nlohmann::json j = {{"vocab_size", 10}, {"hidden_size", 8}, {"intermediate_size", 16}, {"num_hidden_layers", 1},
                      {"num_attention_heads", 2}};
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  LlamaConfig a = LlamaConfig::from_json(j, "a");
  EXPECT_EQ(a.rope_scaling.rope_type, "llama3");
  EXPECT_DOUBLE_EQ(a.rope_theta, 500000.0);
  nlohmann::json k = j;
  k.erase("rope_theta");
  k.erase("rope_scaling");
  k["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  LlamaConfig b = LlamaConfig::from_json(k, "b");
  EXPECT_EQ(b.rope_scaling.rope_type, "llama3");
  EXPECT_DOUBLE_EQ(b.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(b.rope_scaling.factor, 8.0);
}

TEST(HfConfig, BadConfigsNameTheKey) {
  nlohmann::json j = {{"vocab_size", 10}, {"hidden_size", 8}, {"intermediate_size", 16}, {"num_hidden_layers", 1},
                      {"num_attention_heads", 2}};
  auto bad = j;
  bad.erase("hidden_size");
  expect_input_error([&] { LlamaConfig::from_json(bad, "cfg.json"); }, {"cfg.json", "\"hidden_size\"", "missing"});
  bad = j;
  bad["num_attention_heads"] = "two";
  expect_input_error([&] { LlamaConfig::from_json(bad, "cfg.json"); }, {"\"num_attention_heads\"", "integer"});
  bad = j;
  bad["num_key_value_heads"] = 3;
  expect_input_error([&] { LlamaConfig::from_json(bad, "cfg.json"); }, {"\"num_key_value_heads\"", "divide"});
  bad = j;
  bad["vocab_size"] = -5;
  expect_input_error([&] { LlamaConfig::from_json(bad, "cfg.json"); }, {"\"vocab_size\"", "positive"});
  bad = j;
  bad["rope_scaling"] = {{"rope_type", "yarn"}};
  expect_input_error([&] { LlamaConfig::from_json(bad, "cfg.json"); }, {"rope_scaling", "yarn"});
  bad = j;  // original_max_position_embeddings 0 scaled every frequency in silence
  bad["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 0}};
  expect_input_error([&] { LlamaConfig::from_json(bad, "cfg.json"); },
                     {"cfg.json", "rope_scaling", "invalid llama3 factors", "\"original_max_position_embeddings\":0"});
  bad = j;
  bad["model_type"] = "mamba";
  expect_input_error([&] { LlamaConfig::from_json(bad, "cfg.json"); }, {"model_type", "mamba"});
  // Numbers that give non-finite logits (eval printed a NaN loss with exit 0) and token ids the
  // vocabulary does not have are refused naming the key and the value.
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"rope_theta", 1e-300}, {"rope_theta", 0.5}, {"rope_theta", 0}, {"rms_norm_eps", 1e308}, {"rms_norm_eps", 1},
           {"rms_norm_eps", -1e-6}, {"bos_token_id", -1}, {"bos_token_id", 10}, {"eos_token_id", 1099511627776LL},
           {"eos_token_id", nlohmann::json::array({2, 10})}}) {
    bad = j;
    bad[key] = value;
    expect_input_error([&] { LlamaConfig::from_json(bad, "cfg.json"); }, {"cfg.json", key});
  }
  bad = j;
  bad["rope_theta"] = 1.0;  // the edges are taken
  bad["rms_norm_eps"] = 0.5;
  bad["bos_token_id"] = 0;
  bad["eos_token_id"] = nlohmann::json::array({9, 1});
  EXPECT_EQ(LlamaConfig::from_json(bad, "cfg.json").eos_token_ids, (std::vector<int64_t>{9, 1}));
  // quantization_config's fields are type-checked (a fuzzer found a boolean quant_method escaping
  // as a nlohmann type_error instead of an InputError).
  const nlohmann::json q = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}};
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"quant_method", true}, {"load_in_4bit", "yes"}, {"bnb_4bit_quant_type", 4}, {"bnb_4bit_quant_type", "int4"},
           {"bnb_4bit_use_double_quant", "true"}}) {
    bad = j;
    bad["quantization_config"] = q;
    bad["quantization_config"][key] = value;
    expect_input_error([&] { LlamaConfig::from_json(bad, "cfg.json"); }, {"cfg.json", "quantization_config"});
  }
  bad = j;
  bad["quantization_config"] = q;
  bad["quantization_config"]["bnb_4bit_quant_type"] = "fp4";
  bad["quantization_config"]["bnb_4bit_use_double_quant"] = true;
  const LlamaConfig fp4 = LlamaConfig::from_json(bad, "cfg.json");
  EXPECT_TRUE(fp4.quantized);
  EXPECT_EQ(fp4.bnb_quant_type, "fp4");
  EXPECT_TRUE(fp4.bnb_double_quant);
}

// A weight holding NaN is refused by name (its block's absmax would be NaN and the block lost), and
// nothing is left behind; --allow-nonfinite quantizes it and reports the count.
TEST(HfFolder, NonFiniteWeightsAreRefusedUnlessAllowed) {
  TempDir t;
  fs::create_directories(t / "model");
  fs::copy_file(kHf + "/tiny_llama_bf16/config.json", t / "model/config.json");
  const SafetensorsFile src = SafetensorsFile::open(kHf + "/tiny_llama_bf16/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  const std::string victim = "model.layers.1.mlp.up_proj.weight";
  for (const auto& e : src.entries()) {
    Tensor x = src.get(e.name);
    if (e.name == victim) {
      std::vector<float> v = x.to_f32_vector();
      v[5] = NAN;
      x = Tensor::from_f32(x.shape(), x.dtype(), v);
    }
    tensors.emplace_back(e.name, x);
  }
  save_safetensors(t / "model/model.safetensors", tensors);
  QuantizeFolderOptions o;
  o.use_cuda = false;
  for (int threads : {1, 3, 16}) {  // the failing tensor's error, whichever thread met it; nothing left
    o.threads = threads;
    expect_input_error([&] { quantize_model_folder(t / "model", t / "out", o); }, {victim, "1 NaN/Inf", "index 5"});
    EXPECT_FALSE(fs::exists(t / "out"));
  }
  o.threads = 0;
  o.allow_nonfinite = true;
  const FolderReport r = quantize_model_folder(t / "model", t / "out", o);
  EXPECT_EQ(r.nonfinite_values, 1);
  EXPECT_TRUE(fs::exists(t / "out/config.json"));
}

// Tensors are quantized on several threads, written in order: the folder (every file, the index)
// and the report are the same for any thread count, with the output split over several files.
TEST(HfFolder, QuantizeIsTheSameForAnyThreadCount) {
  TempDir t;
  RandomLlamaOptions ro;
  ro.hidden_size = 64;
  ro.intermediate_size = 192;
  ro.num_hidden_layers = 4;
  ro.vocab_size = 120;
  write_random_llama_folder(t / "r", ro);
  const auto read_all = [](const fs::path& dir) {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::directory_iterator(dir)) {
      std::ifstream in(e.path(), std::ios::binary);
      files[e.path().filename().string()] = std::string(std::istreambuf_iterator<char>(in), {});
    }
    return files;
  };
  QuantizeFolderOptions o;
  o.use_cuda = false;
  o.max_shard_bytes = 40000;  // several files
  std::map<std::string, std::string> want;
  FolderReport first;
  for (int threads : {1, 2, 5, 16}) {
    o.threads = threads;
    const fs::path out = t / ("q" + std::to_string(threads));
    const FolderReport r = quantize_model_folder(t / "r", out, o);
    const auto got = read_all(out);
    if (threads == 1) {
      want = got;
      first = r;
      EXPECT_GT(r.files_written, 2);
      EXPECT_EQ(r.converted_tensors, 4 * 7);
      continue;
    }
    EXPECT_EQ(got, want) << threads << " threads";
    EXPECT_EQ(r.files_written, first.files_written);
    EXPECT_EQ(r.converted_elements, first.converted_elements);
    EXPECT_EQ(r.copied_tensors, first.copied_tensors);
    EXPECT_EQ(r.max_abs_err, first.max_abs_err);
    EXPECT_EQ(r.sum_sq_err, first.sum_sq_err);
    EXPECT_EQ(r.sum_sq_ref, first.sum_sq_ref);
  }
  // And dequantizing it back (also on threads) gives one folder.
  const FolderReport d = dequantize_model_folder(t / "q1", t / "d", DType::kBF16, 40000);
  EXPECT_EQ(d.converted_tensors, 4 * 7);
  EXPECT_EQ(LlamaConfig::load(t / "d").num_hidden_layers, 4);
}

// quantize / dequantize are linear in the number of tensors (issue 25: the safetensors writer
// searched its ordered JSON header for each key it added, O(n^2): 40k extra tensors took 12 s).
// The tiny Llama plus n, then 4n, one-element extra tensors (copied through both commands): 4x the
// tensors must take less than 8x the time (quadratic: ~16x). n is large enough that the fixed
// costs (the model's own tensors, threads) do not dominate; each size's best of two runs.
TEST(HfFolder, QuantizeAndDequantizeAreLinearInTheTensorCount) {
  TempDir t;
  const SafetensorsFile model = SafetensorsFile::open(kHf + "/tiny_llama_bf16/model.safetensors");
  const auto make_input = [&](int64_t extra) {
    const std::string dir = t / ("in" + std::to_string(extra));
    fs::create_directories(dir);
    fs::copy_file(kHf + "/tiny_llama_bf16/config.json", dir + "/config.json");
    SafetensorsWriter w(dir + "/model.safetensors");
    for (const SafetensorsEntry& e : model.entries()) w.declare(e.name, *e.dtype, e.shape);
    for (int64_t k = 0; k < extra; ++k) w.declare("extra." + std::to_string(k), DType::kBF16, {1});
    w.begin({{"format", "pt"}});
    for (const SafetensorsEntry& e : model.entries()) w.write(e.name, model.bytes(e.name));
    const uint8_t one[2] = {0x80, 0x3f};  // bf16 1.0
    for (int64_t k = 0; k < extra; ++k) w.write("extra." + std::to_string(k), one);
    w.finish();
    return dir;
  };
  QuantizeFolderOptions o;
  o.use_cuda = false;
  const auto best_seconds = [&](const std::string& in) {
    double best = 1e30;
    for (int run = 0; run < 2; ++run) {
      const std::string q = in + "_q" + std::to_string(run), d = in + "_d" + std::to_string(run);
      const auto t0 = std::chrono::steady_clock::now();
      const FolderReport qr = quantize_model_folder(in, q, o);
      const FolderReport dr = dequantize_model_folder(q, d);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      EXPECT_EQ(qr.converted_tensors, 14);
      EXPECT_EQ(dr.converted_tensors, 14);
      fs::remove_all(q);
      fs::remove_all(d);
    }
    return best;
  };
  const int64_t n = 25'000;
  const double small = best_seconds(make_input(n)), large = best_seconds(make_input(4 * n));
  std::printf("quantize + dequantize: %lld extra tensors %.3f s, %lld extra tensors %.3f s: ratio %.2f\n",
              static_cast<long long>(n), small, static_cast<long long>(4 * n), large, large / small);
  EXPECT_LT(large, 8 * small) << "4x the tensors took " << large / small << "x the time: quadratic?";
  // The extra tensors come through both commands, in their order, with their bytes.
  const std::string in = make_input(3);
  quantize_model_folder(in, t / "q3", o);
  dequantize_model_folder(t / "q3", t / "d3");
  const SafetensorsFile back = SafetensorsFile::open(t / "d3/model.safetensors");
  ASSERT_NE(back.find("extra.2"), nullptr);
  EXPECT_EQ(back.get("extra.2").to_f32_vector(), std::vector<float>{1.0f});
}

TEST(HfFolder, MissingConfigJson) {
  TempDir t;
  fs::create_directories(t / "model");
  fs::copy_file(kHf + "/tiny_llama_bf16/model.safetensors", t / "model/model.safetensors");
  expect_input_error([&] { quantize_model_folder(t / "model", t / "out"); }, {"has no config.json", t / "model"});
  expect_input_error([&] { quantize_model_folder(t / "nowhere", t / "out"); }, {"does not exist", "nowhere"});
  EXPECT_FALSE(fs::exists(t / "out"));
}

// config.json nested 100k deep: a clear error naming the file, not a stack overflow.
TEST(HfFolder, DeeplyNestedConfigJson) {
  TempDir t;
  fs::create_directories(t / "model");
  std::ofstream(t / "model/config.json") << std::string(100000, '[') << std::string(100000, ']');
  expect_input_error([&] { LlamaConfig::load(t / "model"); }, {"config.json", "nested more than"});
}

// Parameter counts of the model a config describes: Llama-3.1-8B has 8,030,261,248.
TEST(HfConfig, LlamaSizeCountsParameters) {
  const nlohmann::json j = {{"vocab_size", 128256}, {"hidden_size", 4096}, {"intermediate_size", 14336},
                            {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
                            {"max_position_embeddings", 8192}, {"tie_word_embeddings", false}};
  const LlamaConfig c = LlamaConfig::from_json(j, "8b");
  const LlamaSize s = llama_size(c);
  EXPECT_DOUBLE_EQ(s.total(), 8030261248.0);
  EXPECT_DOUBLE_EQ(s.projection_params, 32.0 * (2 * 4096.0 * 4096 + 2 * 4096.0 * 1024 + 3 * 4096.0 * 14336));
  EXPECT_DOUBLE_EQ(llama_min_weight_bytes(c), s.projection_params * 0.5 + s.other_params * 2);
}

// A config.json that describes far more than its folder's weights hold (num_hidden_layers: 1e9) is
// refused when it is read, naming the keys and both sizes, before any tree is built from it.
TEST(HfFolder, ConfigLargerThanItsWeightsIsRefusedWhenRead) {
  TempDir t;
  copy_folder(kHf + "/tiny_llama_bf16", t / "model");
  std::ifstream in(kHf + "/tiny_llama_bf16/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["num_hidden_layers"] = 1000000000;
  std::ofstream(t / "model/config.json", std::ios::trunc) << j.dump(2);
  expect_input_error([&] { LlamaConfig::load(t / "model"); },
                     {"config.json", "num_hidden_layers = 1000000000", "does not describe these weights"});
  expect_input_error([&] { quantize_model_folder(t / "model", t / "out"); }, {"num_hidden_layers = 1000000000"});
  EXPECT_FALSE(fs::exists(t / "out"));
  j["num_hidden_layers"] = 2;  // the real size loads
  std::ofstream(t / "model/config.json", std::ios::trunc) << j.dump(2);
  EXPECT_EQ(LlamaConfig::load(t / "model").num_hidden_layers, 2);
}

TEST(HfFolder, MissingTensorNamesTheTensor) {
  TempDir t;
  // Rewrite the model without one projection.
  SafetensorsFile f = SafetensorsFile::open(kHf + "/tiny_llama_bf16/model.safetensors");
  NamedTensors kept;
  for (const auto& e : f.entries())
    if (e.name != "model.layers.1.mlp.up_proj.weight") kept.emplace_back(e.name, f.get(e.name));
  fs::create_directories(t / "model");
  save_safetensors(t / "model/model.safetensors", kept);
  fs::copy_file(kHf + "/tiny_llama_bf16/config.json", t / "model/config.json");
  expect_input_error([&] { quantize_model_folder(t / "model", t / "out"); },
                     {"'model.layers.1.mlp.up_proj.weight'", "missing", t / "model"});
  EXPECT_FALSE(fs::exists(t / "out"));
}

TEST(HfFolder, WrongShapeAndAlreadyQuantizedAndNonEmptyOutput) {
  TempDir t;
  copy_folder(kHf + "/tiny_llama_bf16", t / "model");
  std::ifstream in(t / "model/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  in.close();
  cfg["intermediate_size"] = 128;
  std::ofstream(t / "model/config.json") << cfg.dump(2);
  expect_input_error([&] { quantize_model_folder(t / "model", t / "out"); }, {"mlp.gate_proj.weight", "shape [96, 64]", "[128, 64]"});
  expect_input_error([&] { quantize_model_folder(kHf + "/tiny_llama_bnb4_nf4_dq", t / "out"); }, {"already quantized"});
  fs::create_directories(t / "full");
  std::ofstream(t / "full/keep.txt") << "precious";
  expect_input_error([&] { quantize_model_folder(kHf + "/tiny_llama_bf16", t / "full"); }, {"not empty"});
  EXPECT_TRUE(fs::exists(t / "full/keep.txt"));
}

// qshard's quantize of the bf16 / f32 folder vs transformers + bitsandbytes' 4-bit save of the
// same folder (made on the CPU): same keys, dtypes, shapes and config.json (parsed, every key).
// NF4: the bytes are equal except for the rare double-quant absmax codes where bitsandbytes' CPU
// 8-bit encoder or its float32 mean differs (see tests/data/quant/README.md), at most 2 bytes in
// the whole model. FP4: bitsandbytes' CPU path uses other thresholds and zero signs than its CUDA
// kernel (which qshard matches), so only the statistics are compared byte for byte there;
// tests/quant covers the codes. Double quant of the f32 folder: the offset (mean of the block
// absmax) is a float32 sum in bitsandbytes and a correctly rounded one in qshard; bf16 absmax
// values sum exactly either way, f32 ones do not, so there (measured: 6 of 14 weights) the offset in
// the quant-state JSON may differ by 1 ulp and nested_absmax by about as much; those two are
// compared within that, everything else of the JSON exactly.
// tiny_llama_f32_bnb4_nf4_dq was saved with BitsAndBytesConfig's default compute dtype, so
// quantize's default (no compute dtype given) must reproduce its config.json.
TEST(HfFolder, QuantizeMatchesTransformersSave) {
  struct Variant {
    std::string golden, source;
    QuantizeOptions quant;
    std::optional<DType> compute_dtype;  // none: quantize's default
  };
  for (const Variant& v : std::vector<Variant>{
           {"tiny_llama_bnb4_nf4_dq", "tiny_llama_bf16", {QuantType::kNf4, 64, true}, DType::kBF16},
           {"tiny_llama_bnb4_fp4", "tiny_llama_bf16", {QuantType::kFp4, 64, false}, DType::kBF16},
           {"tiny_llama_f32_bnb4_nf4_dq", "tiny_llama_f32", {QuantType::kNf4, 64, true}, std::nullopt},
           {"tiny_llama_f32_bnb4_fp4", "tiny_llama_f32", {QuantType::kFp4, 64, false}, DType::kBF16}}) {
    SCOPED_TRACE(v.golden);
    TempDir t;
    QuantizeFolderOptions o;
    o.quant = v.quant;
    if (v.compute_dtype) o.compute_dtype = *v.compute_dtype;
    FolderReport r = quantize_model_folder(kHf + "/" + v.source, t / "out", o);
    EXPECT_EQ(r.converted_tensors, 14);
    SafetensorsFile mine = SafetensorsFile::open(t / "out/model.safetensors");
    SafetensorsFile theirs = SafetensorsFile::open(kHf + "/" + v.golden + "/model.safetensors");
    ASSERT_EQ(mine.entries().size(), theirs.entries().size());
    const bool exact_mean = v.source == "tiny_llama_bf16";
    int64_t differing_bytes = 0, offsets_1ulp = 0;
    for (const auto& e : theirs.entries()) {
      const SafetensorsEntry* m = mine.find(e.name);
      ASSERT_NE(m, nullptr) << e.name;
      EXPECT_EQ(m->dtype_name, e.dtype_name) << e.name;
      const auto a = mine.bytes(e.name), b = theirs.bytes(e.name);
      if (!exact_mean && e.name.find(".quant_state.bitsandbytes__") != std::string::npos) {  // its length is the JSON's
        nlohmann::json ja = nlohmann::json::parse(a.begin(), a.end()), jb = nlohmann::json::parse(b.begin(), b.end());
        const float oa = ja.value("nested_offset", 0.0f), ob = jb.value("nested_offset", 0.0f);
        EXPECT_TRUE(oa == ob || std::nextafter(oa, ob) == ob) << e.name << ": offset " << oa << " vs " << ob;
        offsets_1ulp += oa != ob;
        ja.erase("nested_offset");
        jb.erase("nested_offset");
        EXPECT_EQ(ja, jb) << e.name;
        continue;
      }
      EXPECT_EQ(m->shape, e.shape) << e.name;
      if (!exact_mean && e.name.ends_with(".nested_absmax")) {
        const auto x = mine.get(e.name).to_f32_vector(), y = theirs.get(e.name).to_f32_vector();
        for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 4e-9) << e.name;  // ~1 ulp of an offset ~0.05
        continue;
      }
      const bool fp4_codes = v.quant.quant_type == QuantType::kFp4 && fs::path(e.name).extension() == ".weight" &&
                             is_llama_projection_weight(e.name);
      if (e.name.find(".absmax") == std::string::npos && !fp4_codes) {
        EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin())) << e.name;
      }
      if (fp4_codes) continue;
      for (size_t i = 0; i < a.size(); ++i) differing_bytes += a[i] != b[i];
    }
    EXPECT_LE(differing_bytes, 2);
    std::printf("%s: %lld differing bytes (double-quant absmax codes), %lld offsets 1 ulp apart\n", v.golden.c_str(),
                (long long)differing_bytes, (long long)offsets_1ulp);
    const LlamaConfig a = LlamaConfig::load(t / "out"), b = LlamaConfig::load(kHf + "/" + v.golden);
    EXPECT_EQ(a.raw, b.raw);
    EXPECT_EQ(a.raw["quantization_config"]["bnb_4bit_compute_dtype"],
              v.compute_dtype ? dtype_torch_name(*v.compute_dtype) : "float32");
    EXPECT_TRUE(fs::exists(t / "out/generation_config.json"));
  }
}

// `qshard dequantize` writes each 4-bit weight in the dtype it was quantized from (the quant
// state's "dtype", as bitsandbytes' dequantize_4bit does) unless told otherwise; config.json's
// dtype follows; the other tensors and files are copied as they are. Values: the bf16 folder's
// weights are bitsandbytes' float32 dequantization (tiny_llama_bnb4_nf4_dq.dequant_f32, made by
// bitsandbytes) rounded to bf16; elsewhere qshard's own float32 dequantization (checked against
// bitsandbytes' in module_tree_test) in the expected dtype.
TEST(HfFolder, DequantizeWritesTheQuantStateDtype) {
  struct Variant {
    std::string folder;
    std::optional<DType> requested;
    DType expect;
  };
  for (const Variant& v : std::vector<Variant>{{"tiny_llama_bnb4_nf4_dq", std::nullopt, DType::kBF16},
                                               {"tiny_llama_bnb4_fp4", std::nullopt, DType::kBF16},
                                               {"tiny_llama_f32_bnb4_nf4_dq", std::nullopt, DType::kF32},
                                               {"tiny_llama_f32_bnb4_fp4", std::nullopt, DType::kF32},
                                               {"tiny_llama_f32_bnb4_nf4_dq", DType::kBF16, DType::kBF16},
                                               {"tiny_llama_bnb4_nf4_dq", DType::kF32, DType::kF32}}) {
    SCOPED_TRACE(v.folder + (v.requested ? std::string(" --dtype ") + dtype_torch_name(*v.requested) : ""));
    TempDir t;
    const FolderReport r = dequantize_model_folder(kHf + "/" + v.folder, t / "d", v.requested);
    EXPECT_EQ(r.converted_tensors, 14);
    const SafetensorsFolder in = SafetensorsFolder::open(kHf + "/" + v.folder);
    const SafetensorsFolder out = SafetensorsFolder::open(t / "d");
    const TensorLookup lookup = [&in](const std::string& k) -> std::optional<Tensor> {
      if (!in.contains(k)) return std::nullopt;
      return in.get(k);
    };
    std::optional<SafetensorsFile> bnb_f32;
    if (v.folder == "tiny_llama_bnb4_nf4_dq") bnb_f32 = SafetensorsFile::open(kHf + "/" + v.folder + ".dequant_f32.safetensors");
    int64_t weights = 0;
    for (const std::string& name : out.names()) {
      const SafetensorsEntry* e = out.find(name);
      if (!is_llama_projection_weight(name)) {
        EXPECT_EQ(e->dtype_name, in.find(name)->dtype_name) << name;
        EXPECT_TRUE(bitwise_equal(out.get(name), in.get(name))) << name;
        continue;
      }
      ++weights;
      ASSERT_TRUE(e->dtype.has_value());
      EXPECT_EQ(*e->dtype, v.expect) << name;
      const Params4bit p = params4bit_from_state_dict(name, lookup, v.folder);
      const std::vector<float> f32 =
          bnb_f32 ? bnb_f32->get(name).to_f32_vector() : dequantize_4bit(p, DType::kF32).to_f32_vector();
      const Tensor want = Tensor::from_f32(p.quant_state.shape, v.expect, f32);
      EXPECT_TRUE(bitwise_equal(out.get(name), want)) << name;
    }
    EXPECT_EQ(weights, 14);
    const LlamaConfig c = LlamaConfig::load(t / "d");
    EXPECT_FALSE(c.quantized);
    EXPECT_FALSE(c.raw.contains("quantization_config"));
    EXPECT_EQ(c.raw["dtype"], dtype_torch_name(v.expect));
    EXPECT_TRUE(fs::exists(t / "d/generation_config.json"));
  }
}

TEST(HfFolder, ShardedInputAndShardedOutputRoundTrip) {
  TempDir t;
  QuantizeFolderOptions o;
  o.max_shard_bytes = 40'000;  // force several output files
  FolderReport q = quantize_model_folder(kHf + "/tiny_llama_bf16_sharded", t / "q", o);
  EXPECT_GT(q.files_written, 1);
  EXPECT_TRUE(fs::exists(t / "q/model.safetensors.index.json"));
  // Relative RMS quantization error of NF4 with double quant on normal weights is ~9-10%.
  EXPECT_LT(q.rel_rms_err(), 0.12);
  EXPECT_GT(q.rel_rms_err(), 0.0);
  FolderReport d = dequantize_model_folder(t / "q", t / "d");
  EXPECT_EQ(d.converted_tensors, 14);
  SafetensorsFolder orig = SafetensorsFolder::open(kHf + "/tiny_llama_bf16");
  SafetensorsFolder back = SafetensorsFolder::open(t / "d");
  for (const auto& name : orig.names()) {
    ASSERT_TRUE(back.contains(name)) << name;
    EXPECT_EQ(back.find(name)->shape, orig.find(name)->shape) << name;
    EXPECT_EQ(back.find(name)->dtype_name, "BF16") << name;
    if (!is_llama_projection_weight(name)) { EXPECT_TRUE(bitwise_equal(back.get(name), orig.get(name))) << name; }
  }
  const LlamaConfig c = LlamaConfig::load(t / "d");
  EXPECT_FALSE(c.quantized);
}

TEST(HfFolder, RandomLlamaIsValidAndQuantizes) {
  TempDir t;
  RandomLlamaOptions ro;
  ro.hidden_size = 64;
  ro.intermediate_size = 128;
  ro.vocab_size = 100;
  ro.tie_word_embeddings = true;
  write_random_llama_folder(t / "r", ro);
  const LlamaConfig c = LlamaConfig::load(t / "r");
  EXPECT_TRUE(c.tie_word_embeddings);
  SafetensorsFolder f = SafetensorsFolder::open(t / "r");
  EXPECT_FALSE(f.contains("lm_head.weight"));
  const auto w = f.get("model.layers.0.mlp.up_proj.weight").to_f32_vector();
  double s = 0;
  for (float v : w) s += double(v) * v;
  EXPECT_NEAR(std::sqrt(s / w.size()), 0.02, 0.002);  // init_std
  EXPECT_EQ(quantize_model_folder(t / "r", t / "q").converted_tensors, 14);
  expect_input_error([&] { write_random_llama_folder(t / "q", ro); }, {"not empty"});
}

}  // namespace
}  // namespace qshard

namespace qshard {
namespace {

// Large tensors (8B / 70B shapes) draw from the counter-based generator: deterministic per seed and
// name, N(0, std) in mean and variance (Irwin-Hall: bounded at 2 sqrt(3) sigma, kurtosis 2.7).
TEST(RandomNormal, LargeTensorsAreFastAndNormalEnough) {
  const int64_t n = kFastNormalElements + 7;
  const std::vector<float> a = random_normal(3, "model.layers.0.mlp.up_proj.weight", n, 0.02);
  const std::vector<float> b = random_normal(3, "model.layers.0.mlp.up_proj.weight", n, 0.02);
  const std::vector<float> c = random_normal(3, "model.layers.1.mlp.up_proj.weight", n, 0.02);
  ASSERT_EQ(static_cast<int64_t>(a.size()), n);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double sum = 0, sq = 0, quad = 0, big = 0;
  for (float x : a) {
    sum += x;
    sq += double(x) * x;
    quad += double(x) * x * x * x;
    big = std::max(big, std::fabs(double(x)));
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 2e-5);
  EXPECT_NEAR(std::sqrt(var), 0.02, 2e-5);
  EXPECT_NEAR(quad / n / (var * var), 2.7, 0.02);  // Irwin-Hall n=4 (a normal's is 3)
  EXPECT_LE(big, 0.02 * 2 * std::sqrt(3.0) + 1e-6);
  // Small tensors keep Box-Muller over mt19937_64 (the values tests and golden folders were made with).
  const std::vector<float> s = random_normal(3, "x", 1000, 1.0);
  double ss = 0;
  for (float x : s) ss += double(x) * x;
  EXPECT_NEAR(std::sqrt(ss / 1000), 1.0, 0.1);
}

}  // namespace
}  // namespace qshard
