// run_protocol.h: the decisions a training job makes about its checkpoint.dir at the start and at
// the end: which checkpoint it resumes from, whether the folder is usable, where the final export
// goes. Kept apart from the job (train/train_job.h) so that they are tested on folders alone.
//
// The run folder (at open, before anything else touches it):
//   agree_on_run_lock   collective: with checkpoint.dir set, rank 0 takes its lock (train/run_lock.h)
//                       and logs where the run folder is; an error (the folder is another job's,
//                       or cannot be made) ends every rank alike. With checkpoint.dir none: a
//                       warning that the job saves nothing, no lock.
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
//                       (check_resume_config) and the trainer's state (check_resume_state: a
//                       change of AdamW's settings is a warning). An error on any rank ends
//                       every rank.
//   drop_metrics_after  a resumed run appends to logging.metrics_jsonl: the lines an interrupted run
//                       logged after the checkpoint's step go first (rewritten atomically), so every
//                       step appears once. Lines that are not JSON objects with an integer "step"
//                       are kept. A missing file is left alone.
// Final export (at the end of a complete run): the exports kFinalExports (the 4-bit base, then
// the PEFT adapter), each in its own subfolder of the run's final folder. An export is complete
// when its subfolder exists: export_model (checkpoint/export.h) writes <name>.partial-<pid> and
// renames it into place only after its self-check, so the rename is the completion marker.
// The final folder holds kFinalExportMarker, {"step": N}, written (atomically) before the first
// export starts: the folder holds the exports of step N, complete or not.
//   final_export_dir    rank 0: the folder of this run's exports (at step max_steps), "" = nothing
//                       to write (no checkpoint.dir, or every export there is complete: logged).
//                       CKPT/final when it is empty or absent, or its marker names max_steps (an
//                       export that was interrupted: finish it); CKPT/final-step-<max_steps> when
//                       final/ holds the exports of another step (a run extended by more steps;
//                       logged as a warning). A final/ without the marker (written before it
//                       existed) is taken for this step's when the run resumed at its last step.
//   pending_exports     rank 0: the kFinalExports not complete in `dir`, in order; first removes
//                       every <dir>/<export>.partial-<pid> whose process no longer runs on this host
//                       (a job killed during the export; a live process's is never touched).
//   agree_on_final_export  collective: rank 0 decides the folder and what is pending, writes the
//                       marker, every rank gets the answer (an error on rank 0 ends every rank);
//                       with nothing to write, the folder of the complete exports (`done`).
//                       A complete export is never removed or rewritten.
// Thread safety: plain functions; the collective ones follow communicator.h's rules.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/sharded_checkpoint.h"
#include "runtime/communicator.h"
#include "train/run_lock.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace qshard {

// ---- the run folder ----
// `dir` made absolute (lexically normal); "" stays "".
std::string absolute_dir(const std::string& dir);
std::unique_ptr<RunLock> agree_on_run_lock(const TrainConfig& config, Communicator& comm);

// ---- resume ----
std::string resume_decision(const TrainConfig& config);
void check_checkpoint_dir(const std::string& dir, bool resuming);
std::optional<CheckpointInfo> agree_on_resume(const TrainConfig& config, Communicator& comm);
void drop_metrics_after(const std::string& path, int64_t step);

// ---- final export ----
// The exports of a complete run, in the order they are written: subfolders of its final folder.
inline constexpr const char* kFinalExports[] = {"base_bnb4", "adapter"};
// In the final folder: {"step": N}, the step whose exports the folder holds.
inline constexpr const char* kFinalExportMarker = "final_export.json";

struct FinalExportPlan {
  std::string dir;                  // "" = nothing to write
  std::vector<std::string> pending; // names from kFinalExports still to write, in order
  std::string done;                 // with dir "": the folder holding this step's complete exports, if any
};

// `complete`, when given, receives the folder whose exports are all complete when that is why the
// answer is "" (else it is cleared).
std::string final_export_dir(const std::string& checkpoint_dir, int64_t start_step, int64_t max_steps,
                             std::string* complete = nullptr);
std::vector<std::string> pending_exports(const std::string& dir);
FinalExportPlan agree_on_final_export(Communicator& comm, const std::string& checkpoint_dir, int64_t start_step,
                                      int64_t max_steps);

// ---- the end of a job ----
// What rank 0 prints when train() returns: the run folder, the newest checkpoint, the exports and
// the commands that load them (`qshard generate`, and transformers + PEFT in Python); a run
// stopped early says how to continue it; checkpoint.dir none says nothing was saved. Paths absolute.
std::string end_of_job_report(const TrainConfig& config, const TrainSummary& summary);

}  // namespace qshard
