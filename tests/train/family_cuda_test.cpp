// The model families end to end on the GPU (label cuda, mpirun -np 1; skips without one): a QLoRA
// job on each folder of tests/data/family through the trainer, forward and backward, against the
// CPU reference's job. FamilyGpu.MatchesCpu (tests/infer/family_test.cpp) checks the forward's
// logits; the op harness each op; this checks the backward of a whole model: Gemma's post-attention
// and post-MLP norms, GeGLU, the sliding layers with their own RoPE (Gemma 3), the soft-capped
// scores and logits (Gemma 2: the eager attention); Qwen3's q/k norms; Mistral's window.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "runtime/runtime.h"
#include "train/trainer.h"
#include "train/trainer_fixture.h"

namespace qshard {
namespace {

// 16 steps at lr 1e-2 on each family's folder: the GPU's (bf16) loss curve follows the CPU's (f32)
// within 2% at every step (the tiny job's GPU tolerance, scripts/gpu/gpu_train_check.sh), and the
// GPU's job learns.
TEST(FamilyCuda, LossCurvesFollowTheCpu) {
  if (World::get().device() < 0) GTEST_SKIP() << "no GPU";
  const std::string data = make_token_file("family_cuda.tok", 128, 4000, 0);
  for (const char* family : {"qwen3", "mistral", "gemma2", "gemma3"}) {
    SCOPED_TRACE(family);
    TrainConfig cfg = small_config(data);
    cfg.model.path = std::string(QSHARD_TEST_DATA_DIR) + "/family/" + family;
    cfg.steps = 16;
    cfg.optimizer.lr = 1e-2;
    cfg.logging.eval_every_steps = 0;
    cfg.logging.gemm_tflops = 0;
    const TrainSummary gpu = train_on(DeviceChoice::kCuda, cfg);
    const TrainSummary cpu = train_on(DeviceChoice::kCpu, cfg);
    ASSERT_EQ(gpu.losses.size(), 16u);
    ASSERT_EQ(cpu.losses.size(), 16u);
    double worst = 0;
    for (size_t i = 0; i < gpu.losses.size(); ++i) {
      const double rel = std::fabs(gpu.losses[i] - cpu.losses[i]) / std::fabs(cpu.losses[i]);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, 0.02) << "step " << i + 1;
    }
    std::printf("%s: GPU %.6f -> %.6f, CPU %.6f -> %.6f, worst relative difference %.2e\n", family,
                gpu.losses.front(), gpu.losses.back(), cpu.losses.front(), cpu.losses.back(), worst);
    EXPECT_LT(gpu.losses.back(), 0.9 * gpu.losses.front());
  }
}

}  // namespace
}  // namespace qshard
