// data.packing packed on the GPU (label cuda, mpirun -np 1; skips without one): RoPE by each
// token's position in its piece and cuDNN's attention over the pieces as ragged sequences
// (model/attention_cudnn.cpp), end to end through the trainer. The attention's masking itself is
// checked against a double oracle by OpHarness.Attention; this checks what the trainer gives it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "runtime/runtime.h"
#include "train/trainer.h"
#include "train/trainer_fixture.h"

namespace qshard {
namespace {

// With a learning rate too small to move the model, the GPU's packed eval loss over a separate
// file is the GPU's padded one within bf16 rounding (2e-3 relative) and the CPU reference's
// packed one within 1%; 20 steps at lr 2e-2 follow the CPU's packed loss curve within 2% (the
// tiny job's GPU tolerance, scripts/gpu/gpu_train_check.sh) and learn.
TEST(PackedCuda, FollowsThePaddedRunAndTheCpu) {
  if (World::get().device() < 0) GTEST_SKIP() << "no GPU";
  TrainConfig cfg = eval_only_instruction_config("packed_cuda");
  cfg.logging.gemm_tflops = 0;
  cfg.batch.micro_batch_size = 4;
  cfg.data.packing = "padded";
  const TrainSummary padded = train_on(DeviceChoice::kCuda, cfg);
  cfg.data.packing = "packed";
  const TrainSummary packed = train_on(DeviceChoice::kCuda, cfg);
  const TrainSummary packed_cpu = train_on(DeviceChoice::kCpu, cfg);
  ASSERT_EQ(padded.eval_losses.size(), 1u);
  ASSERT_EQ(packed.eval_losses.size(), 1u);
  ASSERT_EQ(packed_cpu.eval_losses.size(), 1u);
  const double lp = packed.eval_losses[0].second, ld = padded.eval_losses[0].second,
               lc = packed_cpu.eval_losses[0].second;
  std::printf("eval loss: GPU packed %.6f, GPU padded %.6f, CPU packed %.6f\n", lp, ld, lc);
  EXPECT_NEAR(lp, ld, 2e-3 * ld);
  EXPECT_NEAR(lp, lc, 1e-2 * lc);

  cfg.optimizer.lr = 2e-2;
  cfg.steps = 20;
  cfg.logging.eval_every_steps = 0;
  const TrainSummary gpu = train_on(DeviceChoice::kCuda, cfg);
  const TrainSummary cpu = train_on(DeviceChoice::kCpu, cfg);
  ASSERT_EQ(gpu.losses.size(), 20u);
  ASSERT_EQ(cpu.losses.size(), 20u);
  double worst = 0;
  for (size_t i = 0; i < gpu.losses.size(); ++i) {
    const double rel = std::fabs(gpu.losses[i] - cpu.losses[i]) / std::fabs(cpu.losses[i]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 0.02) << "step " << i + 1;
  }
  std::printf("20 steps packed: GPU %.6f -> %.6f, CPU %.6f -> %.6f, worst relative difference %.2e\n",
              gpu.losses.front(), gpu.losses.back(), cpu.losses.front(), cpu.losses.back(), worst);
  EXPECT_LT(gpu.losses.back(), gpu.losses.front() - 0.15);
}

// q|k|v's backward fused with packed data (lora.fuse_qkv_backward: the ragged layout's fifth
// offsets array places dq|dk|dv's rows side by side): the first loss the unfused run's bit for bit,
// the next five within bf16 rounding of the gradients.
TEST(PackedCuda, FusedQkvBackwardFollowsTheUnfused) {
  if (World::get().device() < 0) GTEST_SKIP() << "no GPU";
  TrainConfig cfg = eval_only_instruction_config("packed_cuda_fused");
  cfg.logging.gemm_tflops = 0;
  cfg.batch.micro_batch_size = 4;
  cfg.data.packing = "packed";
  cfg.optimizer.lr = 2e-2;
  cfg.steps = 6;
  cfg.logging.eval_every_steps = 0;
  const TrainSummary ref = train_on(DeviceChoice::kCuda, cfg);
  cfg.lora.fuse_qkv_backward = true;
  const TrainSummary fused = train_on(DeviceChoice::kCuda, cfg);
  ASSERT_EQ(ref.losses.size(), 6u);
  ASSERT_EQ(fused.losses.size(), 6u);
  EXPECT_TRUE(fused.perf.qkv_backward_fused);
  EXPECT_EQ(fused.losses[0], ref.losses[0]);
  for (size_t i = 1; i < ref.losses.size(); ++i)
    EXPECT_NEAR(fused.losses[i], ref.losses[i], 2e-3 * std::fabs(ref.losses[i])) << "step " << i + 1;
  std::printf("6 steps packed, fused: %.6f -> %.6f, unfused %.6f -> %.6f\n", fused.losses.front(), fused.losses.back(),
              ref.losses.front(), ref.losses.back());
}

}  // namespace
}  // namespace qshard
