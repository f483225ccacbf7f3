#include "train/run_protocol.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

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
    } catch (const std::exception& e) {
      err = e.what();
    }
    throw_if_any_failed(comm, err);
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

// ---- final export ---------------------------------------------------------------------------

std::string final_export_dir(const std::string& checkpoint_dir, int64_t start_step, int64_t max_steps) {
  if (checkpoint_dir.empty()) return "";
  // A resumed run whose earlier part already exported (a run extended by more steps) keeps
  // that export and writes the new one next to it.
  const std::string fin = checkpoint_dir + "/final";
  if (!non_empty_dir(fin)) return fin;
  const std::string next = fin + "-step-" + std::to_string(max_steps);
  if (start_step == max_steps || non_empty_dir(next)) {
    QS_LOG_INFO("the run is complete (step {}) and its exports exist under {}; nothing to do", max_steps,
                checkpoint_dir);
    return "";
  }
  QS_LOG_WARN("{} exists from an earlier part of this run; exporting to {}", fin, next);
  return next;
}

std::string agree_on_final_export_dir(Communicator& comm, const std::string& checkpoint_dir, int64_t start_step,
                                      int64_t max_steps) {
  if (checkpoint_dir.empty()) return "";  // the same config on every rank: no collective
  // Rank 0 decides (one answer for every rank); "" = already exported, nothing to do.
  std::string fin;
  if (comm.rank() == 0) fin = final_export_dir(checkpoint_dir, start_step, max_steps);
  return broadcast_string(comm, fin, 0);
}

}  // namespace qshard
