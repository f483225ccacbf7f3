// run_protocol.h: the decisions a training job makes about its checkpoint.dir at the start and at
// the end: which checkpoint it resumes from, whether the folder is usable, where the final export
// goes. Kept apart from the job (train/train_job.h) so that they are tested on folders alone.
//
// Resume (at open):
//   resume_decision     rank 0: the checkpoint folder the job continues from, "" for a fresh start.
//                       checkpoint.resume "" = fresh; "auto" = the newest complete step-N under
//                       checkpoint.dir, or fresh when there is none (logged); else a checkpoint
//                       folder or a folder of step-N checkpoints (resolve_resume,
//                       train/train_checkpoint.h: its metadata.json is read and validated). Then
//                       check_checkpoint_dir for that choice.
//   check_checkpoint_dir  checkpoint.dir (when set) is created and a probe file written (found at
//                       the start, not at the first save). A fresh start is refused when the folder
//                       holds complete checkpoints or a non-empty final/ of an earlier run: nothing
//                       written is lost, and runs never mix. InputError naming the folder.
//   agree_on_resume     collective: rank 0 decides, the choice is broadcast, every rank reads its
//                       metadata and checks the job's config against the checkpoint's
//                       (check_resume_config). An error on any rank ends every rank.
//   drop_metrics_after  a resumed run appends to logging.metrics_jsonl: the lines an interrupted run
//                       logged after the checkpoint's step go first (rewritten atomically), so every
//                       step appears once. Lines that are not JSON objects with an integer "step"
//                       are kept. A missing file is left alone.
// Final export (at the end of a complete run):
//   final_export_dir    rank 0: where the exports go: "" = nothing to write (no checkpoint.dir, or the
//                       run is complete and its exports exist: logged); CKPT/final when that is empty
//                       or absent; CKPT/final-step-<max_steps> when final/ holds the export of an
//                       earlier part of this run (a run extended by more steps; logged as a warning).
//   agree_on_final_export_dir  collective: rank 0 decides, every rank gets the answer.
// Thread safety: plain functions; the collective ones follow communicator.h's rules.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "checkpoint/sharded_checkpoint.h"
#include "runtime/communicator.h"
#include "train/train_config.h"

namespace qshard {

// ---- resume ----
std::string resume_decision(const TrainConfig& config);
void check_checkpoint_dir(const std::string& dir, bool resuming);
std::optional<CheckpointInfo> agree_on_resume(const TrainConfig& config, Communicator& comm);
void drop_metrics_after(const std::string& path, int64_t step);

// ---- final export ----
std::string final_export_dir(const std::string& checkpoint_dir, int64_t start_step, int64_t max_steps);
std::string agree_on_final_export_dir(Communicator& comm, const std::string& checkpoint_dir, int64_t start_step,
                                      int64_t max_steps);

}  // namespace qshard
