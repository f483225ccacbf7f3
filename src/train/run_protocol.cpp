#include "train/run_protocol.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "checkpoint/export.h"
#include "checkpoint/safetensors.h"
#include "runtime/collective_status.h"
#include "runtime/input_file.h"
#include "runtime/log.h"
#include "train/train_checkpoint.h"

namespace qshard {
namespace {

// An existing folder with something in it (an earlier export).
bool non_empty_dir(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec) && !std::filesystem::is_empty(path, ec);
}

}  // namespace

std::string absolute_dir(const std::string& dir) {
  if (dir.empty()) return dir;
  std::error_code ec;
  const std::filesystem::path a = std::filesystem::absolute(dir, ec);
  return ec ? dir : a.lexically_normal().string();
}

// ---- the run folder -------------------------------------------------------------------------

std::unique_ptr<RunLock> agree_on_run_lock(const TrainConfig& config, Communicator& comm) {
  const std::string& dir = config.checkpoint.dir;
  if (dir.empty()) {
    if (comm.rank() == 0)
      QS_LOG_WARN("checkpoint.dir: none: this job saves nothing (no checkpoint, no exported adapter)");
    return nullptr;
  }
  std::unique_ptr<RunLock> lock;
  std::string err;
  if (comm.rank() == 0) {
    try {
      lock = std::make_unique<RunLock>(dir);
      QS_LOG_INFO("run folder {} (checkpoint.dir): checkpoints and the final exports go there", absolute_dir(dir));
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  throw_if_any_failed(comm, err);
  return lock;
}

// ---- resume ---------------------------------------------------------------------------------

std::string resume_decision(const TrainConfig& config) {
  std::string dir;
  if (auto r = resolve_resume(config)) dir = r->dir;
  check_checkpoint_dir(config.checkpoint.dir, !dir.empty());
  return dir;
}

void check_checkpoint_dir(const std::string& dir, bool resuming) {
  if (dir.empty()) return;
  // Found now, not at the first save: the folder can be created and written.
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError("checkpoint.dir " + dir + ": cannot create it: " + ec.message());
  const std::string probe = dir + "/.qshard-write-test";
  {
    std::FILE* f = std::fopen(probe.c_str(), "wb");
    const bool ok = f && std::fputs("ok", f) >= 0;
    if (f) std::fclose(f);
    std::filesystem::remove(probe, ec);
    if (!ok) throw InputError("checkpoint.dir " + dir + ": cannot write there: " + std::strerror(errno));
  }
  if (resuming) return;
  const auto found = list_checkpoints(dir);
  if (!found.empty())
    throw InputError("checkpoint.dir " + dir + " holds checkpoints of an earlier run (newest " + found.back().second +
                     "): continue it with --resume auto (checkpoint.resume), or choose another checkpoint.dir");
  const std::string fin = dir + "/final";
  if (non_empty_dir(fin))
    throw InputError("checkpoint.dir " + dir + " holds the exports of an earlier run (" + fin +
                     "): choose another checkpoint.dir, or move it away");
}

std::optional<CheckpointInfo> agree_on_resume(const TrainConfig& config, Communicator& comm) {
  std::optional<CheckpointInfo> resume;
  std::string err, dir;
  std::vector<std::string> changed;
  if (comm.rank() == 0) {
    try {
      dir = resume_decision(config);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  throw_if_any_failed(comm, err);
  dir = broadcast_string(comm, dir, 0);
  if (!dir.empty()) {
    try {
      resume = read_checkpoint_metadata(dir);
      check_resume_config(config, checkpoint_train_config(*resume), resume->dir);
      changed = check_resume_state(*resume, config);
    } catch (const std::exception& e) {
      err = e.what();
    }
    throw_if_any_failed(comm, err);
    if (comm.rank() == 0 && !changed.empty())
      QS_LOG_WARN("resume from {}: AdamW's settings change (checkpoint -> this job): {}", resume->dir,
                  fmt::format("{}", fmt::join(changed, ", ")));
  }
  return resume;
}

void drop_metrics_after(const std::string& path, int64_t step) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return;
  check_input_file(path, "metrics log (logging.metrics_jsonl)");  // a FIFO would block the read for ever
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() > step) {
      ++dropped;
      continue;
    }
    kept += line + "\n";
  }
  in.close();
  if (dropped == 0) return;
  write_file_atomic(path, kept);
  QS_LOG_INFO("{}: dropped {} lines logged after step {} by the interrupted run", path, dropped, step);
}

// ---- final export ----

namespace {

// The step the marker of a final folder names; nullopt when it has none.
std::optional<int64_t> export_marker_step(const std::string& dir) {
  const std::string path = dir + "/" + kFinalExportMarker;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!in || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
    throw InputError(path + ": expected {\"step\": N}, the step whose exports " + dir +
                     " holds (written by qshard before the final export); move the folder away to export again");
  return j["step"].get<int64_t>();
}

bool every_export_complete(const std::string& dir) {
  for (const char* name : kFinalExports)
    if (!export_complete(dir + "/" + name)) return false;
  return true;
}

}  // namespace

std::string final_export_dir(const std::string& checkpoint_dir, int64_t start_step, int64_t max_steps,
                             std::string* complete) {
  if (complete) complete->clear();
  if (checkpoint_dir.empty()) return "";
  const std::string fin = checkpoint_dir + "/final";
  std::string dir = fin;
  if (non_empty_dir(fin)) {
    // Whose exports final/ holds: its marker says; without one (a folder written before the
    // marker existed) this step's when the run resumed at its last step, as before.
    const std::optional<int64_t> step = export_marker_step(fin);
    if (step ? *step != max_steps : start_step != max_steps) dir = fin + "-step-" + std::to_string(max_steps);
  }
  if (non_empty_dir(dir) && every_export_complete(dir)) {
    QS_LOG_INFO("the run is complete (step {}) and its exports under {} are complete; nothing to do", max_steps, dir);
    if (complete) *complete = dir;
    return "";
  }
  if (dir != fin) QS_LOG_WARN("{} holds the exports of an earlier part of this run; exporting to {}", fin, dir);
  return dir;
}

std::vector<std::string> pending_exports(const std::string& dir) {
  std::vector<std::string> pending;
  for (const char* name : kFinalExports) {
    const std::string out = dir + "/" + name;
    (void)partial_dir_for(out);  // removes <out>.partial-<pid> of processes that no longer run
    if (!export_complete(out)) pending.emplace_back(name);
  }
  return pending;
}

FinalExportPlan agree_on_final_export(Communicator& comm, const std::string& checkpoint_dir, int64_t start_step,
                                      int64_t max_steps) {
  if (checkpoint_dir.empty()) return {};  // the same config on every rank: no collective
  // Rank 0 decides (one answer for every rank) and marks the folder as this step's.
  FinalExportPlan plan;
  std::string err, pending;
  if (comm.rank() == 0) {
    try {
      plan.dir = final_export_dir(checkpoint_dir, start_step, max_steps, &plan.done);
      if (!plan.dir.empty()) plan.pending = pending_exports(plan.dir);
      if (plan.pending.empty()) plan.dir.clear();
      if (!plan.dir.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(plan.dir, ec);
        if (ec) throw InputError("checkpoint.dir: cannot create " + plan.dir + ": " + ec.message());
        if (!export_marker_step(plan.dir))
          write_file_atomic(plan.dir + "/" + kFinalExportMarker, nlohmann::json{{"step", max_steps}}.dump() + "\n");
        for (const char* name : kFinalExports)
          if (std::find(plan.pending.begin(), plan.pending.end(), name) == plan.pending.end())
            QS_LOG_INFO("{}/{} is complete from an interrupted run; kept", plan.dir, name);
      }
      for (const std::string& p : plan.pending) pending += (pending.empty() ? "" : "\n") + p;
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  throw_if_any_failed(comm, err);
  plan.dir = broadcast_string(comm, plan.dir, 0);
  plan.done = broadcast_string(comm, plan.done, 0);
  pending = broadcast_string(comm, pending, 0);
  plan.pending.clear();
  for (size_t at = 0; !pending.empty() && at <= pending.size();) {
    const size_t nl = std::min(pending.find('\n', at), pending.size());
    plan.pending.push_back(pending.substr(at, nl - at));
    at = nl + 1;
  }
  return plan;
}

// ---- the end of a job ----

namespace {

// `s` as one shell word: bare when it is made of safe characters, else in single quotes.
std::string shell_word(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./=:,+@%") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The running qshard binary, so that the printed command runs as printed; "qshard" when unknown.
std::string this_binary() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return !ec && exe.filename() == "qshard" ? exe.string() : "qshard";
}

}  // namespace

std::string end_of_job_report(const TrainConfig& config, const TrainSummary& s) {
  if (config.checkpoint.dir.empty())
    return "nothing was saved (checkpoint.dir: none): no checkpoint, no adapter\n";
  std::string r = "run folder: " + absolute_dir(config.checkpoint.dir) + "\n";
  if (!s.last_checkpoint.empty()) r += "  last checkpoint: " + absolute_dir(s.last_checkpoint) + "\n";
  if (s.steps < s.max_steps)
    r += fmt::format("  stopped after step {} of {}: continue with the same command and --resume auto\n", s.steps,
                     s.max_steps);
  if (s.exported_adapter.empty()) return r;
  const std::string base = absolute_dir(s.exported_base), adapter = absolute_dir(s.exported_adapter);
  r += "  exported base model (bitsandbytes 4-bit): " + base + "\n";
  r += "  exported LoRA adapter (PEFT):             " + adapter + "\n";
  r += "load them:\n";
  r += "  " + shell_word(this_binary()) + " generate --model " + shell_word(base) + " --adapter " + shell_word(adapter) +
       " --prompt 'Hello'\n";
  const std::string py = "from transformers import AutoModelForCausalLM; from peft import PeftModel; "
                         "model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(" +
                         nlohmann::json(base).dump() + "), " + nlohmann::json(adapter).dump() + ")";
  r += "  python3 -c " + shell_word(py) + "\n";
  return r;
}

}  // namespace qshard
