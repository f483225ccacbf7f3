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

TEST(LedgerCuda, AddsUpToTheMemoryInUse) {
  World& world = World::get();
  if (world.device() < 0) GTEST_SKIP() << "no GPU";
  const std::string data = make_token_file("ledger.tok", 32000, 40000, 0);
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

}  // namespace
}  // namespace qshard
