#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "runtime/error.h"

namespace qshard {

ScheduleType parse_schedule_type(std::string_view name) {
  if (name == "warmup_cosine") return ScheduleType::kWarmupCosine;
  if (name == "linear") return ScheduleType::kLinear;
  if (name == "constant") return ScheduleType::kConstant;
  throw InputError("unknown schedule type '" + std::string(name) + "' (expected warmup_cosine, linear or constant)");
}

const char* schedule_type_name(ScheduleType type) {
  switch (type) {
    case ScheduleType::kWarmupCosine: return "warmup_cosine";
    case ScheduleType::kLinear: return "linear";
    case ScheduleType::kConstant: return "constant";
  }
  return "?";
}

double LrSchedule::lr_at(int64_t step) const {
  QS_CHECK(step >= 0, "negative step");
  if (step < warmup_steps) return lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  if (type == ScheduleType::kConstant) return lr;
  const double span = static_cast<double>(std::max<int64_t>(1, max_steps - warmup_steps));
  const double p = std::clamp(static_cast<double>(step - warmup_steps) / span, 0.0, 1.0);
  const double factor = type == ScheduleType::kWarmupCosine ? 0.5 * (1.0 + std::cos(std::numbers::pi * p)) : 1.0 - p;
  return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * factor);
}

}  // namespace qshard
