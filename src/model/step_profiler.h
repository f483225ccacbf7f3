// step_profiler.h: where the compute stream's time goes in a step (LlamaModelOptions::profile).
//
// What: the model marks the start of each part of its work (StepProfiler::mark) with an event
// recorded on the compute stream; collect() (after a host wait for that stream) attributes the
// stream time between consecutive marks to the part the earlier mark opened and adds it into
// profile(). kWait: from a hook's start to the model's next op (the gather's event waits: exposed
// communication and h2d copies).
// Cost: a pool of timing events made once at construction (events_for: kEvents per 65,536 rows of
// the step); no allocation and no host wait in mark(). Past the pool (a step of hundreds of
// thousands of tokens: its MLP chunks), each mark re-records one more event, and the time from
// the pool's last mark to it is kUntimed: the split then still sums to the stream's time;
// profile().truncated says so.
// A disabled profiler (the CPU backend, or profiling off) marks nothing: every call is a test of
// one pointer.
// Thread safety: none; the model's thread. Stream: the one given at construction.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <source_location>
#include <utility>
#include <vector>

#include "runtime/stream.h"

namespace qshard {

enum class StepPart : int {
  kDequant,
  kGemm,
  kLora,
  kLoraPack,  // the LoRA fold's operands packed beside each bound weight (s B blocks, A stacks)
  kAttention,
  kHead,
  kNorm,      // RMSNorm forward / backward
  kRope,      // RoPE forward / backward
  kSwiglu,    // SwiGLU forward / backward
  kResidual,  // residual adds and copies
  kBind,      // per-layer parameter conversions at bind (norms, biases, LoRA)
  kEmbed,     // the embedding lookup (from pinned host memory where the table lives there)
  kOffload,   // the host tier's / checkpoints' copy hand-offs and the units' release and gradient hooks
  kOther,
  kWait,
  kUntimed,  // past the event pool: not split
  kCount
};
const char* step_part_name(StepPart p);

struct StepProfile {
  std::array<double, static_cast<size_t>(StepPart::kCount)> ms{};
  int64_t intervals = 0;
  bool truncated = false;  // more marks than the event pool holds: the later time is kUntimed
  // The split's split: each part's time by the source line of the mark that opened it ({part, line}
  // -> ms), so a part marked in many places (kOther, kWait) shows which place its time comes from.
  std::map<std::pair<StepPart, uint32_t>, double> sites;
};

class StepProfiler {
 public:
  static constexpr size_t kEvents = 32768;
  // The pool for a step of `rows` tokens: kEvents per 65,536 rows, at most 8 of them (the marks
  // grow with the MLP's and the LM head's row chunks; at 524,288 rows one pool of kEvents covered
  // under a third of the step, the rest kUntimed).
  static size_t events_for(int64_t rows) {
    const int64_t per = 65536;
    return kEvents * static_cast<size_t>(std::clamp<int64_t>((rows + per - 1) / per, 1, 8));
  }
  // enabled: time with events on `stream` (CUDA streams only: callers pass false on the CPU);
  // `events` marks between two collect() calls are split (tests use a small pool).
  StepProfiler(Stream& stream, bool enabled, size_t events = kEvents);
  // The part that starts now on the stream; `line` names the place (StepProfile::sites).
  void mark(StepPart part, uint32_t line = std::source_location::current().line()) {
    if (timing_ && active_) record(part, line);
  }
  // Paused, mark() records nothing (the events stay made): steps timed on the host without the
  // marks' cost (`qshard bench` times its steps paused, then splits profiled ones). Between steps.
  void set_active(bool active) { active_ = active; }
  bool active() const { return timing_ && active_; }
  // Adds the intervals marked since the last collect() into profile(). REQUIRES: the stream's
  // work up to the last mark has finished (the caller waited for it).
  void collect();
  const StepProfile& profile() const { return profile_; }
  void reset() { profile_ = StepProfile{}; }

 private:
  struct Timing {
    std::vector<Event> events;
    std::vector<StepPart> part;  // the part the interval after events[i] belongs to
    std::vector<uint32_t> line;  // the source line of that mark
    size_t used = 0;
    Event tail{true};  // past the pool: the latest mark
    bool tail_recorded = false;
  };
  void record(StepPart part, uint32_t line);
  Stream& stream_;
  std::unique_ptr<Timing> timing_;
  bool active_ = true;
  StepProfile profile_;
};

}  // namespace qshard
