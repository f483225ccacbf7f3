// StepProfiler on the GPU: the split of the stream's time between marks sums to the time from the
// first mark to the last, also past the event pool (a step of 409,600 tokens made more marks than
// the pool held, and its split covered 214 s of a 403 s step before the tail was kept as kUntimed).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <set>

#include "model/llama_ops.h"
#include "model/step_profiler.h"
#include "runtime/device_context.h"
#include "runtime/tensor.h"

namespace qshard {
namespace {

TEST(StepProfilerCuda, SplitSumsToTheStreamTimePastThePool) {
  if (!cuda_available() || !ops::has_backend(Backend::kCuda)) GTEST_SKIP() << "no GPU";
  DeviceContext ctx(Backend::kCuda, 0);
  const int64_t n = int64_t{1} << 26;  // 128 MB of bf16 a fill: tens of microseconds each
  Tensor buf = Tensor::zeros({n}, DType::kBF16, ctx.compute_device());
  for (size_t pool : {size_t{64}, size_t{5}}) {
    StepProfiler prof(ctx.compute(), true, pool);
    Event first(true), last(true);
    ctx.compute().record(first);
    const StepPart parts[] = {StepPart::kGemm, StepPart::kNorm, StepPart::kAttention, StepPart::kLora};
    for (int i = 0; i < 20; ++i) {
      prof.mark(parts[i % 4]);
      for (int k = 0; k <= i % 3; ++k) ops::zero(buf.raw(), n, ctx);
    }
    prof.mark(StepPart::kOther);
    ctx.compute().record(last);
    ctx.compute().synchronize();
    prof.collect();
    double sum = 0;
    for (double v : prof.profile().ms) sum += v;
    const double whole = last.elapsed_ms_since(first);
    std::printf("pool %zu: split %.3f ms of %.3f ms, untimed %.3f ms, truncated %d\n", pool, sum, whole,
                prof.profile().ms[static_cast<size_t>(StepPart::kUntimed)], prof.profile().truncated);
    EXPECT_EQ(prof.profile().truncated, pool < 21);
    EXPECT_NEAR(sum, whole, 0.02 * whole + 0.05) << "pool " << pool;
    if (pool < 21) EXPECT_GT(prof.profile().ms[static_cast<size_t>(StepPart::kUntimed)], 0.5 * whole);
    else EXPECT_EQ(prof.profile().ms[static_cast<size_t>(StepPart::kUntimed)], 0.0);
    // By place: the loop's one mark line holds the four parts' time, each part's sites sum to it.
    std::array<double, static_cast<size_t>(StepPart::kCount)> by_part{};
    std::set<uint32_t> lines;
    for (const auto& [key, ms] : prof.profile().sites) {
      by_part[static_cast<size_t>(key.first)] += ms;
      lines.insert(key.second);
    }
    EXPECT_EQ(lines.size(), 1u);
    for (size_t i = 0; i < by_part.size(); ++i)
      if (static_cast<StepPart>(i) != StepPart::kUntimed) EXPECT_NEAR(by_part[i], prof.profile().ms[i], 1e-9);
  }
}

// Paused (set_active(false), as `qshard bench` times its steps), marks record nothing: the
// profile after a paused stretch is what was marked before and after it.
TEST(StepProfilerCuda, PausedMarksRecordNothing) {
  if (!cuda_available() || !ops::has_backend(Backend::kCuda)) GTEST_SKIP() << "no GPU";
  DeviceContext ctx(Backend::kCuda, 0);
  const int64_t n = int64_t{1} << 24;
  Tensor buf = Tensor::zeros({n}, DType::kBF16, ctx.compute_device());
  StepProfiler prof(ctx.compute(), true, 64);
  EXPECT_TRUE(prof.active());
  prof.set_active(false);
  EXPECT_FALSE(prof.active());
  for (int i = 0; i < 10; ++i) {
    prof.mark(StepPart::kGemm);
    ops::zero(buf.raw(), n, ctx);
  }
  ctx.compute().synchronize();
  prof.collect();
  EXPECT_EQ(prof.profile().intervals, 0);
  EXPECT_EQ(prof.profile().ms[static_cast<size_t>(StepPart::kGemm)], 0.0);
  prof.set_active(true);
  prof.mark(StepPart::kNorm);
  ops::zero(buf.raw(), n, ctx);
  prof.mark(StepPart::kOther);
  ctx.compute().synchronize();
  prof.collect();
  EXPECT_EQ(prof.profile().intervals, 1);
  EXPECT_GT(prof.profile().ms[static_cast<size_t>(StepPart::kNorm)], 0.0);
  EXPECT_EQ(prof.profile().ms[static_cast<size_t>(StepPart::kGemm)], 0.0);
  StepProfiler off(ctx.compute(), false);  // never enabled: never active
  off.set_active(true);
  EXPECT_FALSE(off.active());
}

}  // namespace
}  // namespace qshard
