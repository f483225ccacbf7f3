// The memory ledger against the GPU (label cuda, mpirun -np 1; skips without a GPU): a real job's
// ledger (every allocation of the build, line by line: runtime/memory_ledger.h) adds up to the
// device memory measured in use (cudaMemGetInfo, the whole GPU: the test runs alone, RUN_SERIAL) within 64 MB + 3%: what the ledger cannot see is
// the caching pool's rounding of each block (runtime/allocator.h), the libraries' own handles and
// the attention workspace, of which the ledger carries cuDNN's estimate. At world size 1 the base
// and the root unit are read in place: no gathered copy of either.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "runtime/runtime.h"
#include "train/trainer.h"
#include "train/trainer_fixture.h"

namespace qshard {
namespace {

TrainConfig ledger_job(const std::string& data) {
  TrainConfig c = small_config(data);
  c.model.init.vocab_size = 32000;
  c.model.init.hidden_size = 1024;
  c.model.init.intermediate_size = 2816;
  c.model.init.num_hidden_layers = 4;
  c.model.init.num_attention_heads = 8;
  c.model.init.num_key_value_heads = 4;
  c.model.init.max_position_embeddings = 512;
  c.model.init.dtype = DType::kBF16;
  c.data.max_seq_len = 512;
  c.batch.global_batch_size = 2;
  c.batch.micro_batch_size = 2;
  c.steps = 2;
  c.schedule.warmup_steps = 0;
  c.data.eval_fraction = 0;
  c.checkpoint.dir.clear();  // no checkpoints, no export: the ledger is made at start-up
  c.logging.gemm_tflops = 0;
  return c;
}

TEST(LedgerCuda, AddsUpToTheMemoryInUse) {
  World& world = World::get();
  if (world.device() < 0) GTEST_SKIP() << "no GPU";
  const TrainConfig c = ledger_job(make_token_file("ledger.tok", 32000, 40000, 0));
  JobRuntime jr(world, DeviceChoice::kCuda, "device");
  const TrainSummary s = train(c, jr.get());
  const MemoryLedger& l = s.perf.ledger;
  std::printf("%s\n", l.describe().c_str());
  ASSERT_TRUE(l.measured().has_value());
  const double measured = static_cast<double>(*l.measured());
  const double margin = 64e6 + 0.03 * measured;
  EXPECT_LE(std::abs(static_cast<double>(*l.unaccounted())), margin) << l.describe();
  for (const LedgerLine& line : l.lines())
    EXPECT_NE(line.name.rfind("gathered slots", 0), 0u) << "world size 1 keeps no gathered copy: " << line.name;
}

// memory.embedding: host: the table (32000 x 1024 bf16, 65.5 MB) lives whole in pinned host memory
// and the lookup reads its rows there in place: the same losses, bit for bit; the ledger has the
// table as pinned host memory and that much less in the root unit's device shards (the two runs'
// totals differ by what the first left in the caching pool).
TEST(LedgerCuda, EmbeddingInHostMemoryKeepsTheLosses) {
  World& world = World::get();
  if (world.device() < 0) GTEST_SKIP() << "no GPU";
  TrainConfig c = ledger_job(make_token_file("ledger_embed.tok", 32000, 40000, 0));
  c.steps = 3;
  c.memory.embedding = "gpu";
  JobRuntime jr(world, DeviceChoice::kCuda, "device");
  const TrainSummary on_gpu = train(c, jr.get());
  c.memory.embedding = "host";
  const TrainSummary on_host = train(c, jr.get());
  EXPECT_FALSE(on_gpu.perf.embedding_on_host);
  EXPECT_TRUE(on_host.perf.embedding_on_host);
  ASSERT_EQ(on_host.losses.size(), 3u);
  EXPECT_EQ(on_host.losses, on_gpu.losses) << "the table's place must not change the numbers";
  const double table = 32000.0 * 1024 * 2;
  const MemoryLedger& g = on_gpu.perf.ledger;
  const MemoryLedger& h = on_host.perf.ledger;
  std::printf("%s\n", h.describe().c_str());
  // (Every unit has a kFrozenHost buffer, 16 bytes when empty: the line sums them.)
  auto line = [](const MemoryLedger& l, const std::string& name, MemoryPlace place) {
    double bytes = 0;
    for (const LedgerLine& x : l.lines())
      if (x.name == name && x.place == place) bytes += static_cast<double>(x.bytes);
    return bytes;
  };
  const std::string host_line = "host-read tensors (whole) (read in place)", root = "root unit shards (read in place)";
  EXPECT_NEAR(line(h, host_line, MemoryPlace::kPinnedHost) - line(g, host_line, MemoryPlace::kPinnedHost), table, 1024);
  EXPECT_NEAR(line(g, root, MemoryPlace::kDevice) - line(h, root, MemoryPlace::kDevice), table, 1024);
  EXPECT_NE(on_host.perf.plan.find("embedding table in pinned host memory"), std::string::npos) << on_host.perf.plan;
}

// offload.optimizer on the GPU: the gradient shards go to pinned memory on the compute stream and
// AdamW runs on the host optimizer's own thread while the next forward starts (train/host_adamw.h).
// The losses follow the GPU optimizer's (CPU and CUDA AdamW round alike: 1e-6 allowed); the step
// makes no more host synchronizations than with the optimizer on the GPU; the staging is a pinned
// ledger line.
TEST(LedgerCuda, HostOptimizerKeepsTheLosses) {
  World& world = World::get();
  if (world.device() < 0) GTEST_SKIP() << "no GPU";
  TrainConfig c = ledger_job(make_token_file("ledger_hostopt.tok", 32000, 40000, 0));
  c.steps = 4;
  JobRuntime jr(world, DeviceChoice::kCuda, "device");
  const TrainSummary on_gpu = train(c, jr.get());
  c.offload.optimizer = true;
  const TrainSummary on_host = train(c, jr.get());
  EXPECT_TRUE(on_host.perf.offload_optimizer);
  ASSERT_EQ(on_host.losses.size(), on_gpu.losses.size());
  for (size_t i = 0; i < on_gpu.losses.size(); ++i)
    EXPECT_NEAR(on_host.losses[i], on_gpu.losses[i], 1e-6 * std::fabs(on_gpu.losses[i])) << "step " << i + 1;
  EXPECT_LE(on_host.perf.inside.host_syncs, on_gpu.perf.inside.host_syncs);
  EXPECT_EQ(on_host.perf.inside.device_allocs, 0u);
  bool staged = false;
  for (const LedgerLine& x : on_host.perf.ledger.lines())
    staged |= x.name == "gradient shards staged for the host AdamW" && x.place == MemoryPlace::kPinnedHost;
  EXPECT_TRUE(staged) << on_host.perf.ledger.describe();
}

// memory.dequantized_layers on the GPU: every layer's base dequantized once into a slot of its own
// (bf16, the fold's widened weights and the row-folded A rows), then only the LoRA's columns and
// rows packed at each bind, over steps whose optimizer moves the LoRA weights: full recompute's
// every-layer-kept losses bit for bit; then two of four beside an offloaded base. Nothing is
// allocated inside the step; the slots are the ledger's "dequantized base layers" line.
TEST(LedgerCuda, DequantizedLayersKeepTheLosses) {
  World& world = World::get();
  if (world.device() < 0) GTEST_SKIP() << "no GPU";
  TrainConfig c = ledger_job(make_token_file("ledger_dequant.tok", 32000, 40000, 0));
  c.steps = 3;
  c.memory.keep_layers = 4;
  c.memory.dequantized_layers = 0;
  JobRuntime jr(world, DeviceChoice::kCuda, "device");
  const TrainSummary ref = train(c, jr.get());
  ASSERT_EQ(ref.losses.size(), 3u);
  c.memory.dequantized_layers = 4;
  const TrainSummary all = train(c, jr.get());
  EXPECT_EQ(all.perf.dequantized_layers, 4) << all.perf.plan;
  EXPECT_EQ(all.losses, ref.losses) << all.perf.plan;
  EXPECT_EQ(all.perf.inside.device_allocs, 0u) << all.perf.plan;
  double slots = 0;
  for (const LedgerLine& x : all.perf.ledger.lines())
    if (x.name == "dequantized base layers" && x.place == MemoryPlace::kDevice) slots += static_cast<double>(x.bytes);
  // four layers of 1024 x (3 x 1024 + 3 x 2816) weights (with r 8 fold columns and A rows), bf16
  EXPECT_GT(slots, 4 * 2.0 * 1024 * (3 * 1024 + 3 * 2816)) << all.perf.ledger.describe();
  EXPECT_LT(slots, 4 * 2.0 * 1024 * (3 * 1024 + 3 * 2816) * 1.05) << all.perf.ledger.describe();
  c.memory.dequantized_layers = 2;
  c.offload.params = true;
  const TrainSummary half = train(c, jr.get());
  EXPECT_EQ(half.perf.dequantized_layers, 2) << half.perf.plan;
  EXPECT_EQ(half.losses, ref.losses) << half.perf.plan;
  EXPECT_EQ(half.perf.inside.device_allocs, 0u) << half.perf.plan;
}

// q|k|v's backward fused on the GPU (lora.fuse_qkv_backward: cuDNN writes dq|dk|dv side by side,
// one input-gradient GEMM over them): the first step's loss is the unfused one's bit for bit (the
// forward is the same), the later ones follow within bf16 rounding of the gradients; the step
// allocates nothing. (Packed data: PackedCuda.FusedQkvBackwardFollowsTheUnfused.)
TEST(LedgerCuda, FusedQkvBackwardFollowsTheLosses) {
  World& world = World::get();
  if (world.device() < 0) GTEST_SKIP() << "no GPU";
  TrainConfig c = ledger_job(make_token_file("ledger_fused_qkv.tok", 32000, 40000, 0));
  c.steps = 4;
  c.memory.keep_layers = 2;
  JobRuntime jr(world, DeviceChoice::kCuda, "device");
  const TrainSummary ref = train(c, jr.get());
  c.lora.fuse_qkv_backward = true;
  const TrainSummary fused = train(c, jr.get());
  ASSERT_EQ(ref.losses.size(), 4u);
  ASSERT_EQ(fused.losses.size(), 4u);
  EXPECT_EQ(fused.losses[0], ref.losses[0]);
  for (size_t i = 1; i < ref.losses.size(); ++i)
    EXPECT_NEAR(fused.losses[i], ref.losses[i], 2e-3 * std::fabs(ref.losses[i])) << "step " << i + 1;
  EXPECT_EQ(fused.perf.inside.device_allocs, 0u) << fused.perf.plan;
  EXPECT_TRUE(fused.perf.qkv_backward_fused);
  EXPECT_FALSE(ref.perf.qkv_backward_fused);
  std::printf("fused: losses %.6f %.6f %.6f %.6f, unfused %.6f %.6f %.6f %.6f\n", fused.losses[0], fused.losses[1],
              fused.losses[2], fused.losses[3], ref.losses[0], ref.losses[1], ref.losses[2], ref.losses[3]);
}

// The checkpoint plans on the GPU: the layer inputs through the ring of device slots to pinned
// memory (three slots, and five: more on the device where the host holds fewer), and every second
// layer input with the odd ones rerun in the backward, with the MLP in chunks: full recompute's
// losses, bit for bit; the step allocates nothing and the plan says what it chose.
TEST(LedgerCuda, CheckpointPlansKeepTheLosses) {
  World& world = World::get();
  if (world.device() < 0) GTEST_SKIP() << "no GPU";
  TrainConfig c = ledger_job(make_token_file("ledger_ckpt.tok", 32000, 40000, 0));
  c.steps = 3;
  c.memory.keep_layers = 0;
  c.memory.host_checkpoints = "false";
  c.memory.checkpoint_every = 1;
  c.memory.mlp_chunk_tokens = 384;  // 1024 rows a micro-batch: chunks of 384, 384, 256
  JobRuntime jr(world, DeviceChoice::kCuda, "device");
  const TrainSummary ref = train(c, jr.get());
  ASSERT_EQ(ref.losses.size(), 3u);
  c.memory.host_checkpoints = "true";
  const TrainSummary ring = train(c, jr.get());
  EXPECT_NE(ring.perf.plan.find("the layer inputs in pinned host memory, 3 on the GPU"), std::string::npos)
      << ring.perf.plan;
  c.memory.checkpoint_every = 2;
  const TrainSummary second_ring = train(c, jr.get());
  c.memory.host_checkpoints = "false";
  const TrainSummary second = train(c, jr.get());
  EXPECT_NE(second.perf.plan.find("every second layer input kept"), std::string::npos) << second.perf.plan;
  for (const TrainSummary* s : {&ring, &second_ring, &second}) {
    EXPECT_EQ(s->losses, ref.losses) << s->perf.plan;
    EXPECT_EQ(s->perf.inside.device_allocs, 0u) << s->perf.plan;
  }
}

// Every tier at once, as the plans at the tightest budgets take them (memory_plan_test's
// TightBudgetsTakeEveryTierAtOnce): the base offloaded, the embedding table, the layer inputs and
// the kept layers' sets (without gate / up) in pinned host memory, the rings' copies out and back on
// the offload stream beside the base's host-to-device copies: full recompute's losses, bit for bit,
// and nothing allocated inside the step. Six layers: five host-kept through two staging sets (three
// copied out and back), seven layer inputs through three slots (four copied); then whole device sets
// beside lean host ones; then a full device set beside a host tier of three staging sets.
TEST(LedgerCuda, EveryTierAtOnceKeepsTheLosses) {
  World& world = World::get();
  if (world.device() < 0) GTEST_SKIP() << "no GPU";
  TrainConfig c = ledger_job(make_token_file("ledger_tiers.tok", 32000, 40000, 0));
  c.model.init.num_hidden_layers = 6;
  c.steps = 3;
  c.memory.keep_layers = 0;
  c.memory.host_checkpoints = "false";
  JobRuntime jr(world, DeviceChoice::kCuda, "device");
  const TrainSummary ref = train(c, jr.get());
  ASSERT_EQ(ref.losses.size(), 3u);
  c.offload.params = true;
  c.memory.embedding = "host";
  c.memory.host_checkpoints = "true";
  c.memory.keep_layers = 1;
  c.memory.host_keep_layers = 5;
  c.memory.kept_mlp = "false";
  const TrainSummary all = train(c, jr.get());
  for (const char* part : {"base offloaded to pinned host memory", "the layer inputs in pinned host memory",
                           "the embedding table in pinned host memory", "5 more keep theirs in pinned host memory"})
    EXPECT_NE(all.perf.plan.find(part), std::string::npos) << part << " in: " << all.perf.plan;
  EXPECT_EQ(all.losses, ref.losses) << all.perf.plan;
  EXPECT_EQ(all.perf.inside.device_allocs, 0u) << all.perf.plan;
  // Each tier its own shape (memory.kept_mlp: device): two whole device-kept sets beside three lean
  // host-kept layers (two staging sets of the lean size after the whole ones, one copied out and back).
  c.memory.keep_layers = 3;
  c.memory.host_keep_layers = 3;
  c.memory.kept_mlp = "device";
  const TrainSummary mixed = train(c, jr.get());
  EXPECT_TRUE(mixed.perf.kept_mlp && !mixed.perf.host_kept_mlp) << mixed.perf.plan;
  EXPECT_NE(mixed.perf.plan.find("3 more keep theirs in pinned host memory (without gate / up"), std::string::npos)
      << mixed.perf.plan;
  EXPECT_EQ(mixed.losses, ref.losses) << mixed.perf.plan;
  EXPECT_EQ(mixed.perf.inside.device_allocs, 0u) << mixed.perf.plan;
  // A full kept set (memory.full_kept_layers: h1, h2 and m kept, the backward reruns nothing) beside
  // the host tier through three staging sets (memory.host_staging_sets; four host-kept layers, one
  // copied out and back), whole on both tiers.
  c.memory.keep_layers = 2;
  c.memory.host_keep_layers = 4;
  c.memory.kept_mlp = "true";
  c.memory.full_kept_layers = 1;
  c.memory.host_staging_sets = 3;
  const TrainSummary full = train(c, jr.get());
  EXPECT_EQ(full.perf.full_kept, 1) << full.perf.plan;
  EXPECT_NE(full.perf.plan.find("1 of them their norms' outputs and SwiGLU's too"), std::string::npos) << full.perf.plan;
  EXPECT_NE(full.perf.plan.find("through 3 staging sets"), std::string::npos) << full.perf.plan;
  EXPECT_EQ(full.losses, ref.losses) << full.perf.plan;
  EXPECT_EQ(full.perf.inside.device_allocs, 0u) << full.perf.plan;
}

}  // namespace
}  // namespace qshard
