// Module tree, FQN resolution and state dicts: the invariant "every key resolves, to the bytes
// stored under it" for every state dict the runtime can produce, and the bitsandbytes/FSDP cases
// that used to fail with "'Params4bit' object has no attribute 'absmax'".
#include "checkpoint/module_tree.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <random>

#include "checkpoint/bnb_folder.h"
#include "checkpoint/inspect.h"
#include "checkpoint/llama_loader.h"
#include "checkpoint/llama_tree.h"
#include "checkpoint/random_llama.h"
#include "checkpoint/safetensors.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;

const std::string kHf = std::string(QSHARD_TEST_DATA_DIR) + "/hf";

::testing::AssertionResult same_bytes(const Tensor& a, const Tensor& b) {
  Tensor x = a.device() == Device::kCpu ? a : a.to(Device::kCpu);
  Tensor y = b.device() == Device::kCpu ? b : b.to(Device::kCpu);
  if (x.nbytes() != y.nbytes()) return ::testing::AssertionFailure() << x.nbytes() << " vs " << y.nbytes() << " bytes";
  if (x.nbytes() && std::memcmp(x.raw(), y.raw(), x.nbytes()) != 0) return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

Tensor randn(const Shape& s, DType d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 0.02f);
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  for (auto& x : v) x = n(rng);
  return Tensor::from_f32(s, d, v);
}

// Fills every slot of a tree with random values (4-bit slots by quantizing random weights).
void randomize(Module& m, uint32_t& seed) {
  for (const auto& s : m.slots()) {
    auto& slot = const_cast<Module::Slot&>(s);
    if (slot.kind == Module::SlotKind::kParams4bit) {
      const QuantState& st = slot.params4bit->quant_state;
      QuantizeOptions o{st.quant_type, st.blocksize, st.nested()};
      *slot.params4bit = quantize_4bit(randn(st.shape, st.dtype, seed++), o);
    } else {
      slot.tensor.copy_from(randn(slot.tensor.shape(), slot.tensor.dtype(), seed++));
    }
  }
  for (const auto& [n, c] : m.children()) randomize(*c, seed);
}

// The invariant, for one state dict.
void expect_all_keys_resolve(const Module& root, const NamedTensors& sd, const StateDictOptions& o) {
  for (const auto& [key, t] : sd) {
    SCOPED_TRACE(key);
    auto r = try_resolve(root, key);
    ASSERT_TRUE(r.has_value()) << "does not resolve";
    ASSERT_TRUE(r->tensor.defined());
    Tensor expect = r->tensor;
    if (!o.full) {
      auto [begin, count] = shard_range(expect.numel(), o.rank, o.world_size);
      expect = expect.reshape({expect.numel()}).flat_slice(begin, count);
    }
    EXPECT_TRUE(same_bytes(t, expect));
    if (o.cpu_offload) { EXPECT_EQ(t.device(), Device::kCpu); }
  }
}

LlamaConfig tiny_config(bool tied) {
  nlohmann::json j = {{"vocab_size", 96},       {"hidden_size", 64}, {"intermediate_size", 96},
                      {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                      {"tie_word_embeddings", tied}};
  return LlamaConfig::from_json(j, "tiny");
}

TEST(ModuleTree, EveryKeyResolvesForEveryStateDict) {
  for (QuantType qt : {QuantType::kNf4, QuantType::kFp4}) {
    for (bool dq : {false, true}) {
      SCOPED_TRACE(std::string(quant_type_name(qt)) + (dq ? " dq" : ""));
      LlamaTreeOptions o;
      o.quant = QuantizeOptions{qt, 64, dq};
      o.lora.r = 4;
      auto tree = build_llama_tree(tiny_config(dq), o);
      uint32_t seed = 1;
      randomize(*tree, seed);
      size_t full_keys = 0;
      for (bool offload : {false, true}) {
        StateDictOptions so;
        so.cpu_offload = offload;
        NamedTensors sd = state_dict(*tree, so);
        full_keys = sd.size();
        expect_all_keys_resolve(*tree, sd, so);
        for (int world : {2, 3}) {
          for (int rank = 0; rank < world; ++rank) {
            StateDictOptions sh = so;
            sh.full = false;
            sh.rank = rank;
            sh.world_size = world;
            NamedTensors shard = state_dict(*tree, sh);
            EXPECT_EQ(shard.size(), sd.size());
            expect_all_keys_resolve(*tree, shard, sh);
          }
        }
      }
      // 2 layers x 7 projections x (4 or 6 four-bit keys + 2 LoRA) + norms/embeddings/head.
      const size_t per_proj = dq ? 6 : 4;
      EXPECT_EQ(full_keys, 2 * 7 * (per_proj + 2) + 2 * 2 + 2 + (dq ? 0 : 1));
      StateDictOptions tr;
      tr.trainable_only = true;
      NamedTensors t = state_dict(*tree, tr);
      EXPECT_EQ(t.size(), 2u * 7 * 2);
      for (const auto& [k, v] : t) EXPECT_NE(k.find(".lora_"), std::string::npos) << k;
    }
  }
}

TEST(ModuleTree, KeyOrderFollowsBitsandbytes) {
  LlamaTreeOptions o;
  o.quant = QuantizeOptions{QuantType::kNf4, 64, true};
  auto tree = build_llama_tree(tiny_config(false), o);
  NamedTensors sd = state_dict(*tree);
  std::vector<std::string> keys;
  for (auto& [k, t] : sd) keys.push_back(k);
  const std::string w = "model.layers.0.self_attn.q_proj.weight";
  auto it = std::find(keys.begin(), keys.end(), w);
  ASSERT_NE(it, keys.end());
  const std::vector<std::string> expect = {w, w + ".absmax", w + ".quant_map", w + ".nested_absmax",
                                           w + ".nested_quant_map", w + ".quant_state.bitsandbytes__nf4",
                                           "model.layers.0.self_attn.k_proj.weight"};
  EXPECT_EQ(std::vector<std::string>(it, it + 7), expect);
  EXPECT_EQ(keys.front(), "model.embed_tokens.weight");
  EXPECT_EQ(keys.back(), "lm_head.weight");
}

// bitsandbytes' own FSDP save test: a Linear4bit base (64x64, default double quant) and a
// trainable adapter; its seven keys must resolve.
TEST(ModuleTree, BitsandbytesFsdpSaveTestKeys) {
  for (QuantType qt : {QuantType::kNf4, QuantType::kFp4}) {
    Module root("SimpleQLoRAModel");
    root.add_child("base", "Linear4bit")
        .add_params4bit("weight", std::make_shared<Params4bit>(quantize_4bit(randn({64, 64}, DType::kF32, 3), {qt, 64, true})));
    root.add_child("adapter", "Linear").add_parameter("weight", randn({64, 64}, DType::kF32, 4), true);
    StateDictOptions o;
    o.cpu_offload = true;
    NamedTensors sd = state_dict(root, o);
    std::vector<std::string> keys;
    for (auto& [k, t] : sd) keys.push_back(k);
    const std::string q = quant_type_name(qt);
    EXPECT_EQ(keys, (std::vector<std::string>{"base.weight", "base.weight.absmax", "base.weight.quant_map",
                                              "base.weight.nested_absmax", "base.weight.nested_quant_map",
                                              "base.weight.quant_state.bitsandbytes__" + q, "adapter.weight"}));
    expect_all_keys_resolve(root, sd, o);
    // The other names PyTorch's walk may touch under a 4-bit weight.
    for (const char* k : {"base.weight.offset", "base.weight.quant_state", "base.weight.quant_state.absmax",
                          "base.weight.quant_state.quant_map", "base.weight.quant_state.state2.absmax",
                          "base.weight.quant_state.blocksize", "base.weight.data"})
      EXPECT_TRUE(try_resolve(root, k).has_value()) << k;
    EXPECT_EQ(resolve(root, "base.weight.quant_state.blocksize").scalar, "64");
    EXPECT_EQ(resolve(root, "base.weight.quant_type").scalar, q);
    EXPECT_EQ(resolve(root, "base.weight.offset").tensor.data<float>()[0],
              std::get<0>(std::make_tuple(resolve(root, "base.weight").params4bit->quant_state.state2->offset)));
  }
}

// Device-resident weights (CUDA builds with a GPU): the full state dict with cpu_offload holds
// host copies, and every key still resolves to the bytes stored under it.
TEST(ModuleTree, CpuOffloadOfDeviceTensors) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Module root("SimpleQLoRAModel");
  root.add_child("base", "Linear4bit")
      .add_params4bit("weight", std::make_shared<Params4bit>(quantize_4bit(randn({64, 64}, DType::kBF16, 3).to(Device::kCuda),
                                                                           {QuantType::kNf4, 64, true})));
  root.add_child("adapter", "Linear").add_parameter("weight", randn({64, 64}, DType::kF32, 4).to(Device::kCuda), true);
  StateDictOptions o;
  o.cpu_offload = true;
  NamedTensors sd = state_dict(root, o);
  EXPECT_EQ(sd.size(), 7u);
  expect_all_keys_resolve(root, sd, o);
  o.full = false;
  o.world_size = 2;
  o.rank = 1;
  expect_all_keys_resolve(root, state_dict(root, o), o);
}

TEST(ModuleTree, FailedWalkNamesKeyNodeAndKind) {
  Module root("Net");
  root.add_child("base", "Linear4bit")
      .add_params4bit("weight", std::make_shared<Params4bit>(quantize_4bit(randn({4, 32}, DType::kF32, 1), {QuantType::kNf4, 64, false})));
  auto msg = [&](const std::string& key) {
    try {
      resolve(root, key);
    } catch (const ResolveError& e) {
      return std::string(e.what());
    }
    return std::string("(resolved)");
  };
  std::string m = msg("base.weight.nested_absmax");  // no double quant: no nested state
  EXPECT_NE(m.find("'base.weight.nested_absmax'"), std::string::npos) << m;
  EXPECT_NE(m.find("stopped at 'base.weight'"), std::string::npos) << m;
  EXPECT_NE(m.find("Params4bit"), std::string::npos) << m;
  m = msg("base.bias");
  EXPECT_NE(m.find("stopped at 'base' (a Module Linear4bit)"), std::string::npos) << m;
  m = msg("base.weight.quant_state.bitsandbytes__fp4");  // the other quant type
  EXPECT_NE(m.find("QuantState"), std::string::npos) << m;
  m = msg("base.weight.absmax.foo");
  EXPECT_NE(m.find("Tensor"), std::string::npos) << m;
  EXPECT_EQ(msg("nothing"), "cannot resolve 'nothing': the walk stopped at the root (a Module Net), which has no child, "
                            "parameter or buffer named 'nothing'");
}

TEST(ModuleTree, LoadStateDictReportsEverythingTogether) {
  auto tree = build_llama_tree(tiny_config(false), {});
  NamedTensors sd = state_dict(*tree);
  NamedTensors bad;
  for (auto& [k, t] : sd) {
    if (k == "model.norm.weight") continue;                                   // missing
    if (k == "lm_head.weight") { bad.emplace_back(k, Tensor::zeros({96, 64}, DType::kF32)); continue; }  // mismatched
    bad.emplace_back(k, t);
  }
  bad.emplace_back("model.extra.weight", Tensor::zeros({2}, DType::kBF16));  // unexpected
  try {
    load_state_dict(*tree, bad, true, "ckpt.safetensors");
    FAIL();
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ckpt.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("missing keys (1): model.norm.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("unexpected keys (1): model.extra.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("lm_head.weight: expected BF16 [96, 64], got F32 [96, 64]"), std::string::npos) << m;
  }
  LoadReport r = load_state_dict(*tree, bad, false, "ckpt");
  EXPECT_EQ(r.missing.size(), 1u);
  EXPECT_EQ(r.unexpected.size(), 1u);
  EXPECT_EQ(r.mismatched.size(), 1u);
}

// A bitsandbytes folder made by transformers + bitsandbytes: loads into the tree, every key of the
// file resolves to the bytes stored under it, the weights dequantize to bitsandbytes' values, and
// saving again gives byte-identical tensors and JSON.
TEST(ModuleTree, TransformersBnbFolderRoundTrip) {
  for (const std::string folder : {"tiny_llama_bnb4_nf4_dq", "tiny_llama_bnb4_fp4"}) {
    SCOPED_TRACE(folder);
    LoadedLlama m = load_llama_folder(kHf + "/" + folder);
    SafetensorsFile file = SafetensorsFile::open(kHf + "/" + folder + "/model.safetensors");
    for (const auto& e : file.entries()) {
      auto r = try_resolve(*m.tree, e.name);
      ASSERT_TRUE(r.has_value()) << e.name;
      EXPECT_TRUE(same_bytes(r->tensor, file.get(e.name))) << e.name;
    }
    SafetensorsFile deq = SafetensorsFile::open(kHf + "/" + folder + ".dequant_f32.safetensors");
    EXPECT_EQ(deq.entries().size(), 14u);
    for (const auto& e : deq.entries()) {
      const Resolved r = resolve(*m.tree, e.name);
      ASSERT_EQ(r.kind, NodeKind::kParams4bit) << e.name;
      // bitsandbytes' CPU FP4 dequant returns -0.0 where its CUDA kernel (and qshard) give +-0 by
      // the code's sign bit: compare values with == (equal for +-0), everything else bitwise.
      const auto mine = dequantize_4bit(*r.params4bit, DType::kF32).to_f32_vector();
      const auto theirs = deq.get(e.name).to_f32_vector();
      ASSERT_EQ(mine.size(), theirs.size());
      int64_t diff = 0;
      for (size_t i = 0; i < mine.size(); ++i) diff += !(mine[i] == theirs[i]);
      EXPECT_EQ(diff, 0) << e.name;
    }
    fs::path out = fs::temp_directory_path() / ("qshard_resave_" + std::to_string(::getpid()) + ".safetensors");
    save_safetensors(out.string(), state_dict(*m.tree));
    SafetensorsFile again = SafetensorsFile::open(out.string());
    EXPECT_EQ(again.entries().size(), file.entries().size());
    for (const auto& e : file.entries()) {
      ASSERT_TRUE(again.contains(e.name)) << e.name;
      const auto a = again.bytes(e.name), b = file.bytes(e.name);
      EXPECT_TRUE(a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin())) << e.name;
    }
    fs::remove(out);
  }
}

TEST(ModuleTree, LoadFolderRejectsMissingAndWrongShapes) {
  fs::path dir = fs::temp_directory_path() / ("qshard_tree_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RandomLlamaOptions ro;
  ro.hidden_size = 64;
  ro.intermediate_size = 128;
  write_random_llama_folder(dir.string(), ro);
  EXPECT_NO_THROW(load_llama_folder(dir.string()));
  // Drop a tensor: the strict load names it.
  SafetensorsFile f = SafetensorsFile::open((dir / "model.safetensors").string());
  NamedTensors kept;
  for (const auto& e : f.entries())
    if (e.name != "model.layers.1.post_attention_layernorm.weight") kept.emplace_back(e.name, f.get(e.name));
  kept.emplace_back("model.layers.1.mlp.up_proj.weight", Tensor::zeros({64, 64}, DType::kBF16));  // wrong shape
  std::vector<std::pair<std::string, Tensor>> dedup;
  for (auto& kv : kept)
    if (std::none_of(dedup.begin(), dedup.end(), [&](auto& d) { return d.first == kv.first; })) dedup.push_back(kv);
  save_safetensors((dir / "model.safetensors").string(), dedup);
  try {
    load_llama_folder(dir.string());
    FAIL();
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.layers.1.post_attention_layernorm.weight"), std::string::npos) << m;
  }
  fs::remove_all(dir);
}

TEST(ModuleTree, TreeFromKeysOfABareFile) {
  SafetensorsFile f = SafetensorsFile::open(kHf + "/tiny_llama_bnb4_nf4_dq/model.safetensors");
  std::vector<std::string> keys;
  for (const auto& e : f.entries()) keys.push_back(e.name);
  auto lookup = [&](const std::string& k) -> std::optional<Tensor> {
    if (!f.contains(k)) return std::nullopt;
    return f.get(k);
  };
  auto tree = tree_from_keys(keys, lookup, f.path());
  for (const auto& k : keys) {
    auto r = try_resolve(*tree, k);
    ASSERT_TRUE(r.has_value()) << k;
    EXPECT_TRUE(same_bytes(r->tensor, f.get(k))) << k;
  }
  EXPECT_EQ(resolve(*tree, "model.layers.0.mlp.down_proj.weight").kind, NodeKind::kParams4bit);
}

}  // namespace
}  // namespace qshard

namespace qshard {
namespace {

// Valid but odd state-dict keys ("", ".", "x.", "a..b") are reported by `inspect` as problems
// naming the key, not an internal error; the ordinary keys beside them still resolve.
TEST(ModuleTree, OddKeysAreProblemsNotInternalErrors) {
  EXPECT_TRUE(is_valid_fqn("a.b"));
  for (const char* k : {"", ".", "x.", ".x", "a..b"}) EXPECT_FALSE(is_valid_fqn(k)) << k;
  const auto dir = std::filesystem::temp_directory_path() / ("qshard_odd_keys_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "odd.safetensors").string();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const char* k : {"", "a..b", ".", "x.", "good.weight"})
    tensors.emplace_back(k, Tensor::from_f32({2}, DType::kF32, std::vector<float>{1.0f, 2.0f}));
  save_safetensors(file, tensors);
  const InspectReport r = inspect_path(file);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(r.rows.size(), 5u);
  int resolved = 0;
  for (const auto& row : r.rows) resolved += row.resolved;
  EXPECT_EQ(resolved, 1);
  ASSERT_EQ(r.problems.size(), 4u);
  EXPECT_NE(r.problems[0].find("key '' has an empty name part"), std::string::npos) << r.problems[0];
}

}  // namespace
}  // namespace qshard
