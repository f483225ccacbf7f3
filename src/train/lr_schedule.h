// lr_schedule.h: the learning rate as a function of the optimizer step.
//
// What: step s is 0-based (the lr used by the s-th optimizer step; the trainer's AdamW step count
// is s + 1). With W = warmup_steps, S = max_steps, m = min_lr_ratio, p = (s - W) / max(1, S - W)
// clamped to [0, 1]:
//   s < W:           lr * s / W                          (linear warmup from 0; all types)
//   warmup_cosine:   lr * (m + (1 - m) * 0.5 * (1 + cos(pi * p)))
//   linear:          lr * (m + (1 - m) * (1 - p))
//   constant:        lr
// These are the formulas of transformers' get_cosine_with_min_lr_schedule_with_warmup
// (min_lr_rate = m) and get_linear_schedule_with_warmup (m = 0), so s = 0 has lr 0 when W > 0.
// Steps past S keep the final value (m * lr).
// Thread safety: immutable value type.
#pragma once

#include <cstdint>
#include <string_view>

namespace qshard {

enum class ScheduleType : uint8_t { kWarmupCosine, kLinear, kConstant };

// "warmup_cosine" | "linear" | "constant"; anything else throws InputError naming the value.
ScheduleType parse_schedule_type(std::string_view name);
const char* schedule_type_name(ScheduleType type);

struct LrSchedule {
  ScheduleType type = ScheduleType::kWarmupCosine;
  double lr = 0.0;           // peak lr
  int64_t warmup_steps = 0;  // W
  int64_t max_steps = 1;     // S
  double min_lr_ratio = 0.0;  // m

  // REQUIRES: step >= 0.
  double lr_at(int64_t step) const;
};

}  // namespace qshard
