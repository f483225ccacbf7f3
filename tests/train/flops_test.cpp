// The useful-work count behind MFU (train/flops.h), checked by hand on Llama-3.1-8B's shape:
// base projections 32 x 218.1 M + LM head 525.3 M weights -> 4 FLOPs each = 30.02 GFLOP; attention
// 12 x 32 x 4096 x 2048 = 3.22 GFLOP; LoRA r=16 on all seven projections, 41.9 M parameters x 6 =
// 0.25 GFLOP: 33.49 GFLOP per token (the "about 34").
#include "train/flops.h"

#include <gtest/gtest.h>

#include "checkpoint/random_llama.h"

namespace qshard {
namespace {

TEST(Flops, Llama31_8bAt2048) {
  LlamaSizes s;
  s.vocab_size = 128256;
  s.hidden_size = 4096;
  s.intermediate_size = 14336;
  s.num_hidden_layers = 32;
  s.num_attention_heads = 32;
  s.num_key_value_heads = 8;
  s.max_position_embeddings = 8192;
  const LlamaConfig c = LlamaConfig::from_json(llama_config_json(s, DType::kBF16), "8b");
  const uint64_t lora = 32ull * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336));
  EXPECT_EQ(lora, 41943040ull);
  const double f = useful_flops_per_token(c, 2048, lora);
  EXPECT_NEAR(f / 1e9, 33.49, 0.01);
  // Attention grows with the sequence; the rest does not.
  EXPECT_NEAR(useful_flops_per_token(c, 4096, lora) - f, 12.0 * 32 * 4096 * 2048, 1.0);
}

TEST(Flops, NoGemmRateOnTheCpu) {
  DeviceContext cpu(Backend::kCpu, -1);
  EXPECT_EQ(measure_gemm_flops(cpu), 0.0);
}

// The data sheets' dense bf16 rates by the names CUDA reports (the H100 and H200 the device tool
// lends report "NVIDIA H100 80GB HBM3" and "NVIDIA H200"); a variant's own rate before its family's.
TEST(Flops, DenseBf16SpecByName) {
  EXPECT_DOUBLE_EQ(dense_bf16_spec_flops("NVIDIA H100 80GB HBM3"), 989.4e12);
  EXPECT_DOUBLE_EQ(dense_bf16_spec_flops("NVIDIA H200"), 989.4e12);
  EXPECT_DOUBLE_EQ(dense_bf16_spec_flops("NVIDIA GH200 480GB"), 989.4e12);
  EXPECT_DOUBLE_EQ(dense_bf16_spec_flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_DOUBLE_EQ(dense_bf16_spec_flops("NVIDIA H100 NVL"), 835e12);
  EXPECT_DOUBLE_EQ(dense_bf16_spec_flops("NVIDIA H200 NVL"), 835e12);
  EXPECT_DOUBLE_EQ(dense_bf16_spec_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_DOUBLE_EQ(dense_bf16_spec_flops("NVIDIA L40S"), 362e12);
  EXPECT_DOUBLE_EQ(dense_bf16_spec_flops("NVIDIA GeForce RTX 4090"), 165.2e12);
  EXPECT_DOUBLE_EQ(dense_bf16_spec_flops("NVIDIA B200"), 2250e12);
  EXPECT_EQ(dense_bf16_spec_flops("Tesla T4"), 0.0);  // none known: no MFU of the spec
  EXPECT_EQ(dense_bf16_spec_flops(""), 0.0);           // the CPU
}

}  // namespace
}  // namespace qshard
