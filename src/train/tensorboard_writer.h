// tensorboard_writer.h: training scalars as a TensorBoard event file (logging.tensorboard_dir).
//
// What: rank 0's MetricsLogger (train/metrics.h) hands each logged step's scalars here; they go to
// `dir/events.out.tfevents.<unix seconds>.<hostname>.<pid>.qshard` as TFRecords of
// tensorboard.Event messages (the bytes: train/tf_event.h). TensorBoard reads every file whose name
// holds "tfevents" in a folder, in name order, as one run: `tensorboard --logdir DIR`.
//
// File layout, record by record:
//   1. Event{wall_time, file_version: "brain.Event:2"}
//   2. Event{wall_time, step: first_step, session_log: START}
//   3... one Event{wall_time, step, summary} per logged step, one Summary.Value per scalar.
// The START record is what a resumed (or restarted) run says about the steps before it: earlier
// files' events at or after `first_step` are superseded (TensorBoard's event accumulator drops
// them, and its data server drops a series' points once a smaller step comes), as
// drop_metrics_after (train/run_protocol.h) drops them from the JSONL. Nothing is deleted on disk.
//
// Every open makes a new file (a resumed run never appends to an earlier file): the seconds in its
// name are one past the newest "events.out.tfevents.<seconds>." file already in `dir` when that
// is not before now, so name order stays write order; the file is created exclusively (never
// overwrites). Each record is flushed as it is written: a running job shows up live, and a killed
// one keeps every finished record.
// Errors: InputError naming the folder or file when it cannot be created or written.
// Thread safety: one thread (the trainer's rank 0).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "train/tf_event.h"

namespace qshard {

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) and the new event file; writes records 1 and 2.
  // REQUIRES: first_step >= 1 (the first step this job will log; a resumed run's: checkpoint + 1).
  TensorBoardWriter(const std::string& dir, int64_t first_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends one Event with `scalars` at `step` and `wall_time` (seconds since 1970) and flushes.
  void write_scalars(int64_t step, double wall_time, const std::vector<TfScalar>& scalars);
  // The event file's path.
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

// "events.out.tfevents.<seconds>.<host>.<pid>.qshard".
std::string tensorboard_file_name(int64_t unix_seconds, const std::string& host, int64_t pid);
// Seconds since 1970 (system clock), the Event wall_time.
double unix_time_s();

}  // namespace qshard
