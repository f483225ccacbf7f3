#include "model/step_profiler.h"

namespace qshard {

const char* step_part_name(StepPart p) {
  switch (p) {
    case StepPart::kDequant: return "dequant";
    case StepPart::kGemm: return "base GEMM";
    case StepPart::kLora: return "LoRA";
    case StepPart::kAttention: return "attention";
    case StepPart::kHead: return "LM head + loss";
    case StepPart::kNorm: return "RMSNorm";
    case StepPart::kRope: return "RoPE";
    case StepPart::kSwiglu: return "SwiGLU";
    case StepPart::kResidual: return "residual add / copy";
    case StepPart::kBind: return "bind (conversions)";
    case StepPart::kOther: return "other kernels";
    case StepPart::kWait: return "waits (gather / h2d)";
    default: return "?";
  }
}

StepProfiler::StepProfiler(Stream& stream, bool enabled) : stream_(stream) {
  if (!enabled) return;
  timing_ = std::make_unique<Timing>();
  timing_->events.reserve(kEvents);
  for (size_t i = 0; i < kEvents; ++i) timing_->events.emplace_back(true);
  timing_->part.resize(kEvents);
}

void StepProfiler::record(StepPart part) {
  Timing& t = *timing_;
  if (t.used == t.events.size()) {
    profile_.truncated = true;
    return;
  }
  stream_.record(t.events[t.used]);
  t.part[t.used++] = part;
}

void StepProfiler::collect() {
  if (!timing_) return;
  Timing& t = *timing_;
  for (size_t i = 1; i < t.used; ++i) {
    profile_.ms[static_cast<size_t>(t.part[i - 1])] += t.events[i].elapsed_ms_since(t.events[i - 1]);
    ++profile_.intervals;
  }
  t.used = 0;
}

}  // namespace qshard
