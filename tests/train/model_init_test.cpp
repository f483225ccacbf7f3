// One generator and one size struct: `qshard init-model` (write_random_llama_folder) with the sizes
// and seed of a train YAML's model.init writes the model that model.init trains from: quantized
// on load, the tree is byte for byte the one init_random_base makes.
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/llama_loader.h"
#include "checkpoint/llama_tree.h"
#include "checkpoint/random_llama.h"
#include "checkpoint/model_init.h"
#include "train/qlora_model.h"
#include "train/train_config.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;

class ModelInitDtype : public testing::TestWithParam<DType> {};

TEST_P(ModelInitDtype, InitModelFolderEqualsModelInitBase) {
  const DType dtype = GetParam();
  TrainConfig cfg;
  cfg.model.init.dtype = dtype;
  cfg.model.init.vocab_size = 40;
  cfg.model.init.hidden_size = 32;
  cfg.model.init.intermediate_size = 48;
  cfg.model.init.num_hidden_layers = 2;
  cfg.model.init.seed = 9;
  const LlamaConfig mc = job_llama_config(cfg.model);
  const QuantizeOptions quant{cfg.model.quant_type, cfg.model.blocksize, cfg.model.double_quant};
  EXPECT_EQ(mc.raw.value("torch_dtype", std::string()), dtype == DType::kBF16 ? "bfloat16" : "float32");
  LlamaTreeOptions to;
  to.dtype = dtype;
  to.quant = quant;

  auto from_init = build_llama_tree(mc, to);
  init_random_base(*from_init, cfg.model.init.seed);

  const fs::path dir = fs::temp_directory_path() / ("qshard_init_model_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RandomLlamaOptions ro;
  static_cast<LlamaSizes&>(ro) = cfg.model.init;
  ro.seed = cfg.model.init.seed;
  ro.dtype = cfg.model.init.dtype;
  write_random_llama_folder(dir.string(), ro);
  // As build_qlora_model loads model.path: float tensors as stored, projections quantized on load.
  LlamaLoadOptions lo;
  lo.quantize = quant;
  lo.strict = false;
  auto from_folder = load_llama_folder(dir.string(), lo).tree;
  fs::remove_all(dir);

  const NamedTensors a = state_dict(*from_init), b = state_dict(*from_folder);
  ASSERT_EQ(a.size(), b.size());
  size_t checked = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(bitwise_equal(a[i].second, b[i].second)) << a[i].first;
    ++checked;
  }
  EXPECT_GT(checked, 20u);
  // Another seed gives another model.
  auto other = build_llama_tree(mc, to);
  init_random_base(*other, cfg.model.init.seed + 1);
  EXPECT_FALSE(bitwise_equal(state_dict(*other)[0].second, a[0].second));
  // The frozen float tensors and the 4-bit weights' QuantState are in model.init.dtype.
  EXPECT_EQ(resolve(*from_init, "model.embed_tokens.weight").tensor.dtype(), dtype);
  EXPECT_EQ(resolve(*from_init, "model.layers.0.mlp.up_proj.weight").params4bit->quant_state.dtype, dtype);
}

// model.init.draw_4bit: the projections drawn in 4-bit (quant/random_4bit.h), every other tensor
// exactly as without it; the same bytes each time.
TEST(ModelInit, Draw4bitDrawsOnlyTheProjections) {
  TrainConfig cfg;
  cfg.model.init.vocab_size = 40;
  cfg.model.init.hidden_size = 64;
  cfg.model.init.intermediate_size = 96;
  cfg.model.init.num_hidden_layers = 2;
  const LlamaConfig mc = job_llama_config(cfg.model);
  LlamaTreeOptions to;
  to.dtype = DType::kBF16;
  to.quant = QuantizeOptions{cfg.model.quant_type, cfg.model.blocksize, cfg.model.double_quant};
  auto quantized = build_llama_tree(mc, to), drawn = build_llama_tree(mc, to), again = build_llama_tree(mc, to);
  init_random_base(*quantized, 9);
  init_random_base(*drawn, 9, 0.02, /*draw_4bit=*/true);
  init_random_base(*again, 9, 0.02, /*draw_4bit=*/true);
  const NamedTensors q = state_dict(*quantized), d = state_dict(*drawn), a = state_dict(*again);
  ASSERT_EQ(q.size(), d.size());
  int projections = 0, floats = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    ASSERT_EQ(q[i].first, d[i].first);
    const std::string& k = q[i].first;
    EXPECT_TRUE(bitwise_equal(d[i].second, a[i].second)) << k;
    EXPECT_EQ(q[i].second.dtype(), d[i].second.dtype()) << k;
    if (k.find(".quant_state.bitsandbytes__") == std::string::npos)  // the JSON's length varies with the offset
      EXPECT_EQ(q[i].second.shape(), d[i].second.shape()) << k;
    if (k.size() > 12 && k.compare(k.size() - 12, 12, "_proj.weight") == 0) {  // packed codes
      EXPECT_FALSE(bitwise_equal(q[i].second, d[i].second)) << k;
      ++projections;
    } else if (k.find("_proj.") == std::string::npos) {  // embeddings, norms, LM head
      EXPECT_TRUE(bitwise_equal(q[i].second, d[i].second)) << k;
      ++floats;
    }
  }
  EXPECT_EQ(projections, 14);
  EXPECT_EQ(floats, 2 + 2 * 2 + 1);
  const Params4bit& p = *resolve(*drawn, "model.layers.1.mlp.down_proj.weight").params4bit;
  EXPECT_EQ(p.quant_state.dtype, DType::kBF16);
  EXPECT_TRUE(p.quant_state.nested());
  EXPECT_EQ(dequantize_4bit(p).shape(), Shape({64, 96}));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ModelInitDtype, testing::Values(DType::kF32, DType::kBF16),
                         [](const testing::TestParamInfo<DType>& i) { return std::string(dtype_torch_name(i.param)); });

}  // namespace
}  // namespace qshard
