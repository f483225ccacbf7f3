// Exports of a sharded model (one process, MpiCommunicator over MPI_COMM_SELF): a tiny Llama with
// NF4 projections and LoRA (random, lora_B non-zero), sharded, exported in the three formats.
//  - bnb4: every tensor's bytes equal the unsharded tree's state dict (same keys, same order);
//    load_llama_folder loads it; split into shards + index past max_shard_bytes; rank 0 held at
//    most one unit's tensors at a time (peak_unit_bytes <= the largest unit < the model);
//  - peft: load_peft_adapter into a fresh tree gives identical tensors; adapter_config.json has
//    the field set of a real PEFT adapter (tests/data/model/nf4_adapter);
//  - merged: every projection equals bf16(dequantize(W) + scaling * B @ A), W dequantized to its
//    original dtype as bitsandbytes does, reference computed here;
//  - an all-zero lora_B fails the self-check naming the key, and leaves no folder;
//  - an existing non-empty out_dir is refused (InputError) and left untouched.
// With QSHARD_EXPORT_KEEP_DIR set, KeepForInterop writes the three folders there for
// scripts/interop/check_export_interop.py.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/test_stream.h"
#include "checkpoint/bnb_folder.h"
#include "checkpoint/export.h"
#include "checkpoint/llama_loader.h"
#include "checkpoint/llama_tree.h"
#include "checkpoint/peft_adapter.h"
#include "checkpoint/safetensors_index.h"
#include "common/random_tree.h"
#include "runtime/mpi_communicator.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;

using testing_util::randn;
using testing_util::randomize;

// hidden 128 / intermediate 256: bitsandbytes' CPU forward needs rows that are multiples of 64.
LlamaConfig tiny_config() {
  const nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", 96},
                            {"hidden_size", 128}, {"intermediate_size", 256}, {"num_hidden_layers", 2},
                            {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 64},
                            {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0}, {"hidden_act", "silu"},
                            {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"}, {"bos_token_id", 1},
                            {"eos_token_id", 2}};
  return LlamaConfig::from_json(j, "tiny");
}

constexpr int64_t kRank = 4;
constexpr double kAlpha = 8;

LlamaTreeOptions tree_options() {
  LlamaTreeOptions o;
  o.dtype = DType::kBF16;
  o.quant = QuantizeOptions{QuantType::kNf4, 64, true};
  o.lora.r = kRank;
  return o;
}

std::unique_ptr<Module> make_tree() {
  auto tree = build_llama_tree(tiny_config(), tree_options());
  uint32_t seed = 11;
  randomize(*tree, seed);
  return tree;
}

ExportOptions options(const std::string& dir, ExportFormat f) {
  ExportOptions o;
  o.out_dir = dir;
  o.format = f;
  o.r = kRank;
  o.lora_alpha = kAlpha;
  o.base_model_name_or_path = "qshard/tiny-bnb4";
  return o;
}

// A tree sharded over one communicator, ready to export.
struct Sharded {
  std::unique_ptr<Module> tree;
  std::unique_ptr<ShardedParameterManager> mgr;
  ShardedTree units;
  Communicator& comm;
  Sharded(Communicator& c, bool offload, std::unique_ptr<Module> t) : tree(std::move(t)), comm(c) {
    ShardOptions so;
    so.offload_params = so.offload_optimizer = offload;
    mgr = std::make_unique<ShardedParameterManager>(comm, qshard_test_compute_stream(), so);
    units = shard_module_tree(*tree, *mgr, "model.layers");
    mgr->finalize();
  }
  ExportReport run(const ExportOptions& o) { return export_model(comm, *tree, tiny_config(), *mgr, units, o); }
};

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor h = t.to(Device::kCpu);
  return {h.bytes().begin(), h.bytes().end()};
}

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("qshard_export_test_" + std::to_string(::getpid()));
    fs::remove_all(base_);
    fs::create_directories(base_);
  }
  void TearDown() override { fs::remove_all(base_); }
  std::string dir(const std::string& name) const { return (base_ / name).string(); }
  fs::path base_;
  MpiCommunicator comm_{MPI_COMM_SELF};
};

TEST_F(ExportTest, Bnb4BytesEqualTheUnshardedStateDict) {
  const auto original = make_tree();
  const NamedTensors lora = state_dict(*original, {true, false, true});
  NamedTensors expect;
  for (auto& [k, t] : state_dict(*original))
    if (k.find(".lora_") == std::string::npos) expect.emplace_back(k, t);
  // Largest unit (its exported tensors) and the whole model, for the memory bound.
  uint64_t total = 0, root_bytes = 0;
  std::map<std::string, uint64_t> unit_bytes;
  for (const auto& [k, t] : expect) {
    total += t.nbytes();
    if (k.rfind("model.layers.", 0) == 0) unit_bytes[k.substr(0, k.find('.', 13))] += t.nbytes();
    else root_bytes += t.nbytes();
  }
  uint64_t largest = root_bytes;
  for (const auto& [u, b] : unit_bytes) largest = std::max(largest, b);

  for (const uint64_t max_shard : {uint64_t{5'000'000'000ULL}, uint64_t{60'000}}) {
    for (const bool offload : {false, true}) {
      Sharded s(comm_, offload, make_tree());
      const std::string out = dir("bnb4_" + std::to_string(max_shard) + (offload ? "_off" : "_on"));
      ExportOptions o = options(out, ExportFormat::kBnb4);
      o.max_shard_bytes = max_shard;
      const ExportReport rep = s.run(o);
      const SafetensorsFolder f = SafetensorsFolder::open(out);
      ASSERT_EQ(f.names().size(), expect.size());
      for (size_t i = 0; i < expect.size(); ++i) {
        EXPECT_EQ(f.names()[i], expect[i].first);
        const auto b = f.bytes(expect[i].first);
        EXPECT_EQ(std::vector<uint8_t>(b.begin(), b.end()), bytes_of(expect[i].second)) << expect[i].first;
      }
      EXPECT_EQ(rep.tensors, static_cast<int64_t>(expect.size()));
      EXPECT_EQ(rep.bytes, total);
      EXPECT_GT(rep.peak_unit_bytes, 0u);
      EXPECT_LE(rep.peak_unit_bytes, largest);
      EXPECT_LT(rep.peak_unit_bytes, total / 2);
      std::printf("bnb4 max_shard %llu offload %d: %zu files, %lld tensors, %llu bytes, peak host %llu (largest unit %llu)\n",
                  static_cast<unsigned long long>(max_shard), offload, rep.files.size(), static_cast<long long>(rep.tensors),
                  static_cast<unsigned long long>(rep.bytes), static_cast<unsigned long long>(rep.peak_unit_bytes),
                  static_cast<unsigned long long>(largest));
      if (max_shard < total) {
        EXPECT_TRUE(fs::exists(fs::path(out) / kSafetensorsIndexName));
        EXPECT_GT(f.files().size(), 1u);
      }
      const LoadedLlama loaded = load_llama_folder(out);
      EXPECT_TRUE(loaded.config.quantized);
      const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(fs::path(out) / "config.json"));
      // The config was made in memory (no quantization_config): transformers' defaults for these
      // weights (compute dtype float32); dtype as the config has it.
      EXPECT_EQ(cfg["quantization_config"], bnb_quantization_config({QuantType::kNf4, 64, true}, DType::kF32));
      EXPECT_EQ(cfg["quantization_config"]["bnb_4bit_compute_dtype"], "float32");
      EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
      EXPECT_EQ(cfg["model_type"], "llama");
      for (const auto& [k, t] : state_dict(*loaded.tree)) EXPECT_TRUE(f.contains(k)) << k;
      EXPECT_FALSE(fs::exists(out + ".partial-" + std::to_string(::getpid())));
    }
  }
  (void)lora;
}

// A config read from a 4-bit folder is exported as read, so its quantization_config must describe
// the tree's weights; a mismatch names the key and both values, and leaves no folder.
TEST_F(ExportTest, Bnb4ConfigMustDescribeTheWeights) {
  Sharded s(comm_, false, make_tree());  // NF4 with double quant
  nlohmann::json j = tiny_config().raw;
  j["quantization_config"] = bnb_quantization_config({QuantType::kFp4, 64, true});
  const std::string out = dir("bnb4_mismatch");
  try {
    export_model(comm_, *s.tree, LlamaConfig::from_json(j, "mismatch"), *s.mgr, s.units, options(out, ExportFormat::kBnb4));
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const char* needle : {"bnb_4bit_quant_type", "\"fp4\"", "is nf4", out.c_str()})
      EXPECT_NE(msg.find(needle), std::string::npos) << needle << " not in: " << msg;
  }
  EXPECT_FALSE(fs::exists(out));
  j["quantization_config"] = bnb_quantization_config({QuantType::kNf4, 64, false});
  EXPECT_THROW(export_model(comm_, *s.tree, LlamaConfig::from_json(j, "mismatch"), *s.mgr, s.units, options(out, ExportFormat::kBnb4)),
               InputError);
  // Matching: written as read, compute dtype included.
  j["quantization_config"] = bnb_quantization_config({QuantType::kNf4, 64, true}, DType::kF16);
  export_model(comm_, *s.tree, LlamaConfig::from_json(j, "match"), *s.mgr, s.units, options(out, ExportFormat::kBnb4));
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(fs::path(out) / "config.json")), j);
}

TEST_F(ExportTest, PeftAdapterLoadsBackIdentically) {
  const auto original = make_tree();
  Sharded s(comm_, true, make_tree());
  const std::string out = dir("peft");
  const ExportReport rep = s.run(options(out, ExportFormat::kPeft));
  EXPECT_EQ(rep.tensors, 2 * 7 * 2);
  auto fresh = build_llama_tree(tiny_config(), tree_options());
  load_peft_adapter(*fresh, out);
  const NamedTensors want = state_dict(*original, {true, false, true});
  const NamedTensors got = state_dict(*fresh, {true, false, true});
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_EQ(bytes_of(got[i].second), bytes_of(want[i].second)) << want[i].first;
  }
  const PeftLoraConfig c = read_peft_config(out);
  EXPECT_EQ(c.r, kRank);
  EXPECT_EQ(c.lora_alpha, kAlpha);
  {  // PEFT features qshard does not implement are refused by key, never ignored.
    const std::string cfg_path = (fs::path(out) / "adapter_config.json").string();
    std::ifstream cin(cfg_path);
    const nlohmann::json orig = nlohmann::json::parse(cin);
    cin.close();
    for (const auto& [key, value] :
         std::vector<std::pair<std::string, nlohmann::json>>{{"alpha_pattern", {{"q_proj", 32}}},
                                                             {"rank_pattern", {{"q_proj", 8}}},
                                                             {"use_dora", true},
                                                             {"bias", "lora_only"},
                                                             {"fan_in_fan_out", true},
                                                             {"modules_to_save", {"lm_head"}},
                                                             {"peft_type", true},
                                                             {"use_rslora", "no"},
                                                             {"lora_dropout", "0.1"},
                                                             {"target_modules", {"q_proj", 7}},
                                                             {"target_modules", "all-linear"},  // PEFT's regex form
                                                             {"target_modules", ".*q_proj"},
                                                             {"target_modules", nullptr},  // left out
                                                             // past the ranges qshard takes (shapes overflow,
                                                             // the scaling makes every value Inf)
                                                             {"r", int64_t{1} << 40},
                                                             {"lora_alpha", 1e308},
                                                             // issue 25: a scaling that silences or
                                                             // flips the adapter, a rank that is none
                                                             {"lora_alpha", 0},
                                                             {"lora_alpha", -16},
                                                             {"lora_alpha", "16"},
                                                             {"r", 0},
                                                             {"r", -4},
                                                             {"r", 4.0},
                                                             {"r", "4"},
                                                             {"lora_dropout", 1.5},
                                                             {"lora_dropout", -0.1},
                                                             {"peft_type", nullptr}}) {
      nlohmann::json bad = orig;
      if (value.is_null()) bad.erase(key);  // a key left out
      else bad[key] = value;
      std::ofstream(cfg_path) << bad.dump(2);
      try {
        read_peft_config(out);
        ADD_FAILURE() << key << " was accepted";
      } catch (const InputError& e) {
        // Named by file and key: `adapter_config.json: key "bias" ...` or `adapter_config.json: r: ...`.
        const std::string m = e.what();
        EXPECT_TRUE(m.find("adapter_config.json: key \"" + key + "\"") != std::string::npos ||
                    m.find("adapter_config.json: " + key + ":") != std::string::npos ||
                    m.find("adapter_config.json: " + key + "[") != std::string::npos)
            << m;
        if (key == "lora_alpha" || key == "r") {
          EXPECT_NE(m.find(", got " + value.dump()), std::string::npos) << m;  // and the value
        }
      }
    }
    std::ofstream(cfg_path) << orig.dump(2);
    EXPECT_EQ(read_peft_config(out).r, kRank);
  }
  {  // LoRA weights stored as integers of the right byte size: refused by name (an internal error before).
    const std::string st_path = (fs::path(out) / "adapter_model.safetensors").string();
    const SafetensorsFile orig = SafetensorsFile::open(st_path);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& e : orig.entries()) {
      const Tensor t = orig.get(e.name);
      Shape u8 = t.shape();
      u8.back() *= static_cast<int64_t>(dtype_size(t.dtype()));
      tensors.emplace_back(e.name, t.dtype() == DType::kF32 ? Tensor::from_bytes(t.shape(), DType::kI32, t.bytes())
                                                            : Tensor::from_bytes(u8, DType::kU8, t.bytes()));
    }
    const std::string bad_dir = dir("peft_int");
    fs::create_directories(bad_dir);
    fs::copy_file(fs::path(out) / "adapter_config.json", fs::path(bad_dir) / "adapter_config.json");
    save_safetensors((fs::path(bad_dir) / "adapter_model.safetensors").string(), tensors);
    auto tree = build_llama_tree(tiny_config(), tree_options());
    try {
      load_peft_adapter(*tree, bad_dir);
      ADD_FAILURE() << "an I32 LoRA weight was loaded";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("; LoRA weights are floating point"), std::string::npos) << e.what();
    }
  }
  const auto keys = [](const nlohmann::json& j) {
    std::vector<std::string> k;
    for (auto it = j.begin(); it != j.end(); ++it) k.push_back(it.key());
    return k;
  };
  const nlohmann::json mine = nlohmann::json::parse(std::ifstream(fs::path(out) / "adapter_config.json"));
  const nlohmann::json peft = nlohmann::json::parse(
      std::ifstream(fs::path(QSHARD_TEST_DATA_DIR) / "model" / "nf4_adapter" / "adapter_config.json"));
  EXPECT_EQ(keys(mine), keys(peft));
  EXPECT_EQ(mine["base_model_name_or_path"], "qshard/tiny-bnb4");
  EXPECT_EQ(mine["inference_mode"], true);
  const SafetensorsFile f = SafetensorsFile::open((fs::path(out) / "adapter_model.safetensors").string());
  const SafetensorsEntry* a = f.find("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype_name, "F32");
  EXPECT_EQ(a->shape, (Shape{kRank, 256}));
}

TEST_F(ExportTest, MergedEqualsDequantPlusScaledDelta) {
  const auto original = make_tree();
  Sharded s(comm_, false, make_tree());
  const std::string out = dir("merged");
  s.run(options(out, ExportFormat::kMerged));
  const SafetensorsFolder f = SafetensorsFolder::open(out);
  const float scaling = static_cast<float>(kAlpha / kRank);
  const LlamaConfig cfg = tiny_config();
  size_t checked = 0;
  double max_delta = 0;
  for (const auto& [name, shape] : llama_expected_weights(cfg)) {
    const Resolved r = resolve(*original, name);
    std::vector<float> w;
    if (r.kind == NodeKind::kParams4bit) {
      w = dequantize_4bit(*r.params4bit).to_f32_vector();  // original dtype (bf16), as bitsandbytes
      const std::string path = name.substr(0, name.rfind('.'));
      const std::vector<float> A = resolve(*original, path + ".lora_A.weight").tensor.to_f32_vector();
      const std::vector<float> B = resolve(*original, path + ".lora_B.weight").tensor.to_f32_vector();
      const int64_t out_f = shape[0], in_f = shape[1];
      for (int64_t i = 0; i < out_f; ++i)
        for (int64_t j = 0; j < in_f; ++j) {
          float acc = 0.0f;
          for (int64_t k = 0; k < kRank; ++k) acc += B[i * kRank + k] * A[k * in_f + j];
          max_delta = std::max(max_delta, std::fabs(static_cast<double>(scaling * acc)));
          w[i * in_f + j] += scaling * acc;
        }
    } else {
      w = r.tensor.to_f32_vector();
    }
    const Tensor want = Tensor::from_f32(shape, DType::kBF16, w);
    ASSERT_TRUE(f.contains(name)) << name;
    EXPECT_EQ(f.find(name)->dtype_name, "BF16");
    const auto b = f.bytes(name);
    EXPECT_EQ(std::vector<uint8_t>(b.begin(), b.end()), bytes_of(want)) << name;
    ++checked;
  }
  EXPECT_EQ(f.names().size(), checked);
  EXPECT_GT(max_delta, 1e-3);  // the LoRA delta is really there
  const LoadedLlama loaded = load_llama_folder(out);
  EXPECT_FALSE(loaded.config.quantized);
  const nlohmann::json c = nlohmann::json::parse(std::ifstream(fs::path(out) / "config.json"));
  EXPECT_FALSE(c.contains("quantization_config"));
  EXPECT_EQ(c["torch_dtype"], "bfloat16");
}

TEST_F(ExportTest, AllZeroLoraBFailsTheSelfCheck) {
  auto tree = make_tree();
  const std::string key = "model.layers.1.self_attn.v_proj.lora_B.weight";
  Tensor b = resolve(*tree, key).tensor;
  b.copy_from(Tensor::zeros(b.shape(), b.dtype()));
  Sharded s(comm_, false, std::move(tree));
  const std::string out = dir("peft_zero");
  try {
    s.run(options(out, ExportFormat::kPeft));
    ADD_FAILURE() << "an all-zero lora_B was exported";
  } catch (const InputError& e) {
    std::printf("refused: %s\n", e.what());
    EXPECT_NE(std::string(e.what()).find("base_model.model." + key), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("all zero"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".partial-" + std::to_string(::getpid())));
  ExportOptions o = options(out, ExportFormat::kPeft);
  o.allow_zero_lora_b = true;
  s.run(o);
  EXPECT_TRUE(fs::exists(fs::path(out) / "adapter_model.safetensors"));
}

TEST_F(ExportTest, ExistingNonEmptyOutDirIsRefused) {
  Sharded s(comm_, false, make_tree());
  const std::string out = dir("taken");
  fs::create_directories(out);
  { std::ofstream(fs::path(out) / "keep.txt") << "mine"; }
  for (ExportFormat f : {ExportFormat::kBnb4, ExportFormat::kPeft, ExportFormat::kMerged}) {
    try {
      s.run(options(out, f));
      ADD_FAILURE() << "exported into a non-empty folder";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("not empty"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 1);
  // An empty existing folder is fine.
  const std::string empty = dir("empty");
  fs::create_directories(empty);
  s.run(options(empty, ExportFormat::kBnb4));
  EXPECT_TRUE(fs::exists(fs::path(empty) / "model.safetensors"));
}

TEST_F(ExportTest, KeepForInterop) {
  const char* keep = std::getenv("QSHARD_EXPORT_KEEP_DIR");
  if (!keep || !*keep) GTEST_SKIP() << "set QSHARD_EXPORT_KEEP_DIR to keep the exports";
  Sharded s(comm_, true, make_tree());
  for (ExportFormat f : {ExportFormat::kBnb4, ExportFormat::kPeft, ExportFormat::kMerged}) {
    const std::string out = (fs::path(keep) / export_format_name(f)).string();
    fs::remove_all(out);
    s.run(options(out, f));
    std::printf("kept %s\n", out.c_str());
  }
}

}  // namespace
}  // namespace qshard
