#include "model/step_profiler.h"

namespace qshard {

const char* step_part_name(StepPart p) {
  switch (p) {
    case StepPart::kDequant: return "dequant";
    case StepPart::kGemm: return "base GEMM";
    case StepPart::kLora: return "LoRA";
    case StepPart::kLoraPack: return "LoRA fold packing";
    case StepPart::kAttention: return "attention";
    case StepPart::kHead: return "LM head + loss";
    case StepPart::kNorm: return "RMSNorm";
    case StepPart::kRope: return "RoPE";
    case StepPart::kSwiglu: return "SwiGLU";
    case StepPart::kResidual: return "residual add / copy";
    case StepPart::kBind: return "bind (conversions)";
    case StepPart::kEmbed: return "embedding lookup";
    case StepPart::kOffload: return "offload hand-offs and hooks";
    case StepPart::kOther: return "other kernels";
    case StepPart::kWait: return "waits (gather / h2d)";
    case StepPart::kUntimed: return "past the event pool (not split)";
    default: return "?";
  }
}

StepProfiler::StepProfiler(Stream& stream, bool enabled, size_t events) : stream_(stream) {
  if (!enabled) return;
  timing_ = std::make_unique<Timing>();
  timing_->events.reserve(events);
  for (size_t i = 0; i < events; ++i) timing_->events.emplace_back(true);
  timing_->part.resize(events);
  timing_->line.resize(events);
}

void StepProfiler::record(StepPart part, uint32_t line) {
  Timing& t = *timing_;
  if (t.used == t.events.size()) {
    stream_.record(t.tail);
    t.tail_recorded = true;
    profile_.truncated = true;
    return;
  }
  stream_.record(t.events[t.used]);
  t.line[t.used] = line;
  t.part[t.used++] = part;
}

void StepProfiler::collect() {
  if (!timing_) return;
  Timing& t = *timing_;
  for (size_t i = 1; i < t.used; ++i) {
    const double ms = t.events[i].elapsed_ms_since(t.events[i - 1]);
    profile_.ms[static_cast<size_t>(t.part[i - 1])] += ms;
    profile_.sites[{t.part[i - 1], t.line[i - 1]}] += ms;
    ++profile_.intervals;
  }
  if (t.tail_recorded && t.used > 0)
    profile_.ms[static_cast<size_t>(StepPart::kUntimed)] += t.tail.elapsed_ms_since(t.events[t.used - 1]);
  t.tail_recorded = false;
  t.used = 0;
}

}  // namespace qshard
