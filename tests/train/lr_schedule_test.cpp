#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "runtime/error.h"
#include "train/lr_schedule.h"

namespace qshard {
namespace {

TEST(LrSchedule, WarmupCosineKeySteps) {
  const LrSchedule s{ScheduleType::kWarmupCosine, 1e-3, 10, 110, 0.1};
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);       // warmup starts at 0
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.5e-3);    // half way up
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-3);     // peak
  EXPECT_NEAR(s.lr_at(60), 1e-3 * (0.1 + 0.9 * 0.5), 1e-15);  // half way down the cosine
  EXPECT_NEAR(s.lr_at(35), 1e-3 * (0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25))), 1e-15);
  EXPECT_NEAR(s.lr_at(110), 1e-4, 1e-15);  // min_lr_ratio * lr at the end
  EXPECT_NEAR(s.lr_at(500), 1e-4, 1e-15);  // and after it
  for (int64_t i = 10; i < 110; ++i) EXPECT_GE(s.lr_at(i), s.lr_at(i + 1)) << i;  // monotone
}

TEST(LrSchedule, LinearAndConstant) {
  const LrSchedule lin{ScheduleType::kLinear, 2e-3, 4, 104, 0.0};
  EXPECT_DOUBLE_EQ(lin.lr_at(2), 1e-3);
  EXPECT_DOUBLE_EQ(lin.lr_at(4), 2e-3);
  EXPECT_DOUBLE_EQ(lin.lr_at(54), 1e-3);
  EXPECT_DOUBLE_EQ(lin.lr_at(104), 0.0);
  const LrSchedule lin_min{ScheduleType::kLinear, 2e-3, 0, 100, 0.5};
  EXPECT_DOUBLE_EQ(lin_min.lr_at(0), 2e-3);
  EXPECT_DOUBLE_EQ(lin_min.lr_at(50), 1.5e-3);
  EXPECT_DOUBLE_EQ(lin_min.lr_at(100), 1e-3);
  const LrSchedule c{ScheduleType::kConstant, 3e-4, 3, 50, 0.1};
  EXPECT_DOUBLE_EQ(c.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(c.lr_at(1), 1e-4);
  EXPECT_DOUBLE_EQ(c.lr_at(3), 3e-4);
  EXPECT_DOUBLE_EQ(c.lr_at(49), 3e-4);
  EXPECT_DOUBLE_EQ(c.lr_at(1000), 3e-4);
}

TEST(LrSchedule, NoWarmupStartsAtPeak) {
  const LrSchedule s{ScheduleType::kWarmupCosine, 1e-3, 0, 100, 0.0};
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1e-3);
  EXPECT_NEAR(s.lr_at(100), 0.0, 1e-18);
}

TEST(LrSchedule, Names) {
  EXPECT_EQ(parse_schedule_type("linear"), ScheduleType::kLinear);
  EXPECT_STREQ(schedule_type_name(ScheduleType::kWarmupCosine), "warmup_cosine");
  EXPECT_THROW(parse_schedule_type("cosine"), InputError);
}

}  // namespace
}  // namespace qshard
