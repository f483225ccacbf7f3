// The memory plan (train/memory_plan.h) on the Llama-3.1-8B shape: no budget keeps the config's
// choices; a budget turns into kept layers after the measured build; a budget below the resident
// base offloads it; long sequences chunk the MLP; kept layers with a chunked MLP are refused.
#include "train/memory_plan.h"

#include <gtest/gtest.h>

#include "model/llama_model.h"
#include "runtime/error.h"
#include "train/qlora_model.h"

namespace qshard {
namespace {

TrainConfig job_8b(int64_t micro, int64_t seq) {
  TrainConfig c;
  ModelInitConfig& m = c.model.init;
  m.vocab_size = 128256;
  m.hidden_size = 4096;
  m.intermediate_size = 14336;
  m.num_hidden_layers = 32;
  m.num_attention_heads = 32;
  m.num_key_value_heads = 8;
  m.max_position_embeddings = 131072;
  m.dtype = DType::kBF16;
  c.lora.r = 16;
  c.batch.micro_batch_size = micro;
  c.batch.global_batch_size = micro;
  c.data.max_seq_len = seq;
  c.data.train = "x.tok";
  return c;
}

LlamaConfig llama(const TrainConfig& c) { return job_llama_config(c.model); }

TEST(MemoryPlan, NoBudgetKeepsTheConfig) {
  TrainConfig c = job_8b(4, 2048);
  MemoryPlan p = plan_memory(c, llama(c), Backend::kCuda, DType::kBF16, 1);
  plan_kept_layers(p, c, 10e9, 0);
  EXPECT_FALSE(p.offload_params);
  EXPECT_EQ(p.keep_layers, 0);
  EXPECT_EQ(p.mlp_chunk_rows, 0);
  c.memory.keep_layers = 5;
  p = plan_memory(c, llama(c), Backend::kCuda, DType::kBF16, 1);
  plan_kept_layers(p, c, 10e9, 0);
  EXPECT_EQ(p.keep_layers, 5);
  c.memory.keep_layers = 99;
  EXPECT_EQ(plan_memory(c, llama(c), Backend::kCuda, DType::kBF16, 1).keep_layers, 32);
}

TEST(MemoryPlan, BudgetBecomesKeptLayers) {
  TrainConfig c = job_8b(4, 2048);
  LlamaModelOptions mo;
  mo.max_batch = 4;
  mo.max_seq = 2048;
  const double per = llama_kept_layer_bytes(llama(c), mo, Backend::kCuda, DType::kBF16, 16);
  EXPECT_GT(per, 0.8e9);  // ~1 GB per kept layer at 4 x 2048 (h1, q, k, v, a, x2, h2, gate, up)
  EXPECT_LT(per, 1.2e9);
  c.memory.gpu_budget_gb = 40;
  MemoryPlan p = plan_memory(c, llama(c), Backend::kCuda, DType::kBF16, 1);
  EXPECT_FALSE(p.offload_params);
  const double in_use = 8e9;
  plan_kept_layers(p, c, in_use, 0);
  EXPECT_TRUE(p.measured);
  EXPECT_GT(p.keep_layers, 1);
  EXPECT_LT(p.keep_layers, 32);
  EXPECT_LE(p.total(), 40e9);                 // the plan stays within the budget
  EXPECT_GT(p.total() + p.per_kept, 40e9);    // and one more kept layer would not
  c.memory.gpu_budget_gb = 1000;              // everything fits: every layer kept
  p = plan_memory(c, llama(c), Backend::kCuda, DType::kBF16, 1);
  plan_kept_layers(p, c, in_use, 0);
  EXPECT_EQ(p.keep_layers, 32);
  EXPECT_NE(p.describe().find("layers 0-31 of 32 keep"), std::string::npos) << p.describe();
}

TEST(MemoryPlan, SmallBudgetOffloadsTheBase) {
  TrainConfig c = job_8b(1, 2048);
  c.memory.gpu_budget_gb = 6;
  const MemoryPlan p = plan_memory(c, llama(c), Backend::kCuda, DType::kBF16, 1);
  EXPECT_TRUE(p.offload_params);
  EXPECT_TRUE(p.offload_optimizer);
  EXPECT_NE(p.describe().find("offloaded to pinned host memory"), std::string::npos);
  c.memory.gpu_budget_gb = 30;
  EXPECT_FALSE(plan_memory(c, llama(c), Backend::kCuda, DType::kBF16, 1).offload_params);
  // Between the two, a budget where the offloaded base makes room for the LoRA optimizer on the
  // GPU (a host AdamW leaves the GPU idle): the optimizer goes to the host only when it must.
  bool optimizer_stays = false;
  for (double gb = 4; gb <= 30; gb += 0.25) {
    c.memory.gpu_budget_gb = gb;
    const MemoryPlan q = plan_memory(c, llama(c), Backend::kCuda, DType::kBF16, 1);
    EXPECT_TRUE(!q.offload_optimizer || q.offload_params) << gb;
    if (q.offload_params && !q.offload_optimizer) {
      optimizer_stays = true;
      EXPECT_LE(q.resident + q.step, gb * 1e9) << gb;
    }
  }
  EXPECT_TRUE(optimizer_stays);
  // Over 8 ranks each keeps an eighth of the base: 12 GB holds it with the step.
  c.memory.gpu_budget_gb = 12;
  EXPECT_FALSE(plan_memory(c, llama(c), Backend::kCuda, DType::kBF16, 8).offload_params);
}

TEST(MemoryPlan, LongSequencesChunkTheMlp) {
  TrainConfig c = job_8b(1, 65536);
  MemoryPlan p = plan_memory(c, llama(c), Backend::kCuda, DType::kBF16, 1);
  EXPECT_EQ(p.mlp_chunk_rows, kAutoChunkRows);
  TrainConfig whole = c;
  whole.memory.mlp_chunk_tokens = 0;
  const MemoryPlan w = plan_memory(whole, llama(whole), Backend::kCuda, DType::kBF16, 1);
  EXPECT_GT(w.step - p.step, 6 * 65536.0 * 14336 * 2 * 0.8);  // six [N, I] bf16 buffers fewer
  c.memory.gpu_budget_gb = 1000;  // a budget does not keep layers while the MLP is chunked
  p = plan_memory(c, llama(c), Backend::kCuda, DType::kBF16, 1);
  plan_kept_layers(p, c, 8e9, 0);
  EXPECT_EQ(p.keep_layers, 0);
  c.memory.keep_layers = 2;
  try {
    plan_memory(c, llama(c), Backend::kCuda, DType::kBF16, 1);
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("memory.keep_layers = 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("memory.mlp_chunk_tokens"), std::string::npos) << e.what();
  }
  c.memory.keep_layers = -1;
  c.memory.mlp_chunk_tokens = 100000;  // at least the micro-batch's tokens: whole
  EXPECT_EQ(plan_memory(c, llama(c), Backend::kCuda, DType::kBF16, 1).mlp_chunk_rows, 0);
}

}  // namespace
}  // namespace qshard
