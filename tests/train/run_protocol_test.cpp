// The checkpoint.dir protocols of a training job (train/run_protocol.h) on folders alone, no model:
//  - resume: which checkpoint "auto", a path or "" picks (fake step-N folders with a minimal valid
//    metadata.json; an incomplete one without it), and when a fresh start is refused (earlier
//    checkpoints, a non-empty final/) or the folder is unusable;
//  - the metrics file of a resumed run: lines after the checkpoint's step dropped, others kept;
//  - the final export: final/, final-step-N, or nothing; after a kill during it, the exports not
//    complete (partial folders of dead processes removed, a live one's kept);
//  - resume config checks: lora.fold may change on resume, lora.r may not; the LR schedule only
//    when asked (checkpoint.allow_schedule_change);
//  - the run folder's lock (train/run_lock.h): a second holder refused naming host and pid, a
//    lock left by a dead process taken over, one naming another host refused;
//  - the end-of-job report: absolute paths of the run folder and exports, the loading commands.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>

#include "checkpoint/sharded_checkpoint.h"
#include "common/test_util.h"
#include "runtime/error.h"
#include "train/run_lock.h"
#include "train/run_protocol.h"
#include "train/train_checkpoint.h"
#include "train/train_config.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;
using testing_util::read_bytes;
using testing_util::error_of;
using testing_util::TempDir;
using testing_util::write_bytes;


// A step-N folder under root; complete: with a metadata.json that read_checkpoint_metadata accepts
// (one rank, no units: the protocols never open the tensor files). Returns its path.
std::string fake_checkpoint(const std::string& root, int64_t step, bool complete = true) {
  const std::string dir = root + "/" + checkpoint_dir_name(step);
  fs::create_directories(dir);
  if (complete)
    write_bytes(dir + "/metadata.json",
                "{\"format\": \"" + std::string(kCheckpointFormat) + "\", \"format_version\": 1, \"step\": " +
                    std::to_string(step) +
                    ", \"world_size\": 1, \"slices\": [], \"units\": [], \"files\": [{\"rank\": 0, \"name\": "
                    "\"rank-00000-of-00001.safetensors\", \"bytes\": 8, \"crc32\": 0}], \"trainer\": {}}");
  return dir;
}

TrainConfig job(const std::string& ckpt_dir, const std::string& resume) {
  TrainConfig c;
  c.checkpoint.dir = ckpt_dir;
  c.checkpoint.resume = resume;
  return c;
}

TEST(RunProtocol, ResumeAutoPicksTheNewestCompleteCheckpoint) {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  // Nothing there yet: a fresh start, and the folder is made.
  EXPECT_EQ(resume_decision(job(root, "auto")), "");
  EXPECT_TRUE(fs::is_directory(root));
  fake_checkpoint(root, 5);
  const std::string ten = fake_checkpoint(root, 10);
  fake_checkpoint(root, 15, /*complete=*/false);  // a save that died: never picked
  fs::create_directories(root + "/" + checkpoint_dir_name(20) + ".partial");
  EXPECT_EQ(resume_decision(job(root, "auto")), ten);
  // The probe file of the writability check is gone.
  EXPECT_FALSE(fs::exists(root + "/.qshard-write-test"));
}

TEST(RunProtocol, ResumeFromAPath) {
  TempDir tmp;
  const std::string root = tmp.file("ckpt"), other = tmp.file("other");
  const std::string five = fake_checkpoint(other, 5);
  const std::string seven = fake_checkpoint(other, 7);
  // A checkpoint folder, or a folder of step-N checkpoints (the newest); checkpoint.dir may be empty.
  EXPECT_EQ(resume_decision(job(root, five)), five);
  EXPECT_EQ(resume_decision(job(root, other)), seven);
  EXPECT_EQ(resume_decision(job("", five)), five);
  // A path without a complete checkpoint is an error naming it.
  EXPECT_NE(error_of([&] { resume_decision(job(root, fake_checkpoint(other, 9, false))); }).find("incomplete"),
            std::string::npos);
  fs::create_directories(tmp.file("empty"));
  EXPECT_NE(error_of([&] { resume_decision(job(root, tmp.file("empty"))); }).find("neither a checkpoint"),
            std::string::npos);
  EXPECT_NE(error_of([&] { resume_decision(job(root, tmp.file("missing"))); }).find("no such file or folder"),
            std::string::npos);
}

TEST(RunProtocol, FreshStartIntoAnEarlierRunIsRefused) {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  EXPECT_EQ(resume_decision(job(root, "")), "");
  EXPECT_EQ(resume_decision(job("", "")), "");  // no checkpoint.dir: nothing to check
  // Incomplete saves and an empty final/ are no earlier run's results.
  fake_checkpoint(root, 3, /*complete=*/false);
  fs::create_directories(root + "/final");
  EXPECT_NO_THROW(check_checkpoint_dir(root, /*resuming=*/false));
  const std::string four = fake_checkpoint(root, 4);
  const std::string msg = error_of([&] { resume_decision(job(root, "")); });
  EXPECT_NE(msg.find("checkpoint.dir " + root + " holds checkpoints of an earlier run (newest " + four + ")"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("--resume auto"), std::string::npos);
  EXPECT_NO_THROW(check_checkpoint_dir(root, /*resuming=*/true));
  // Exports of an earlier run (a non-empty final/) without checkpoints.
  fs::remove_all(four);
  write_bytes(root + "/final/README", "x");
  EXPECT_NE(error_of([&] { check_checkpoint_dir(root, false); }).find("holds the exports of an earlier run"),
            std::string::npos);
  EXPECT_NO_THROW(check_checkpoint_dir(root, true));
}

TEST(RunProtocol, UnusableCheckpointDir) {
  TempDir tmp;
  write_bytes(tmp.file("file"), "x");
  const std::string under_file = tmp.file("file") + "/ckpt";
  EXPECT_NE(error_of([&] { check_checkpoint_dir(under_file, false); })
                .find("checkpoint.dir " + under_file + ": cannot create it"),
            std::string::npos);
  EXPECT_NE(error_of([&] { resume_decision(job(under_file, "auto")); }).find("cannot create it"), std::string::npos);
  if (::geteuid() != 0) {  // root writes anywhere
    const std::string ro = tmp.file("ro");
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_NE(error_of([&] { check_checkpoint_dir(ro, false); }).find("cannot write there"), std::string::npos);
    fs::permissions(ro, fs::perms::owner_all);
  }
}

TEST(RunProtocol, DropMetricsAfterTheResumedStep) {
  TempDir tmp;
  const std::string path = tmp.file("metrics.jsonl");
  write_bytes(path,
              "{\"step\": 1, \"loss\": 3}\n{\"step\": 2, \"loss\": 2.5}\nnot json\n{\"step\": 3}\n{\"note\": 1}\n"
              "{\"step\": 4}\n{\"step\": \"5\"}\n");
  drop_metrics_after(path, 2);
  EXPECT_EQ(read_bytes(path),
            "{\"step\": 1, \"loss\": 3}\n{\"step\": 2, \"loss\": 2.5}\nnot json\n{\"note\": 1}\n{\"step\": \"5\"}\n");
  const std::string before = read_bytes(path);
  drop_metrics_after(path, 2);  // nothing to drop: untouched
  EXPECT_EQ(read_bytes(path), before);
  drop_metrics_after(tmp.file("missing.jsonl"), 2);  // no file: none made
  EXPECT_FALSE(fs::exists(tmp.file("missing.jsonl")));
}

// A final folder holding the complete exports of `step`: the marker and each export's folder.
void complete_exports(const std::string& dir, int64_t step) {
  fs::create_directories(dir);
  write_bytes(dir + "/" + kFinalExportMarker, "{\"step\": " + std::to_string(step) + "}\n");
  for (const char* name : kFinalExports) {
    fs::create_directories(dir + "/" + name);
    write_bytes(dir + "/" + name + "/config.json", "{}");
  }
}

TEST(RunProtocol, FinalExportDir) {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  EXPECT_EQ(final_export_dir("", 0, 30), "");  // no checkpoint.dir: no export
  // First export: final/ (absent or empty).
  EXPECT_EQ(final_export_dir(root, 0, 30), root + "/final");
  fs::create_directories(root + "/final");
  EXPECT_EQ(final_export_dir(root, 15, 30), root + "/final");
  // final/ holds step 30's complete exports: a run extended to 40 steps exports next to it ...
  complete_exports(root + "/final", 30);
  EXPECT_EQ(final_export_dir(root, 30, 40), root + "/final-step-40");
  // ... and resumed at its last step, nothing is left to do.
  EXPECT_EQ(final_export_dir(root, 30, 30), "");
  // final-step-40 exists (empty or incomplete: still the place to write; complete: done).
  fs::create_directories(root + "/final-step-40");
  EXPECT_EQ(final_export_dir(root, 30, 40), root + "/final-step-40");
  write_bytes(root + "/final-step-40/" + kFinalExportMarker, "{\"step\": 40}");
  EXPECT_EQ(final_export_dir(root, 40, 40), root + "/final-step-40");  // resumed after a kill before any export
  complete_exports(root + "/final-step-40", 40);
  EXPECT_EQ(final_export_dir(root, 30, 40), "");
  std::string done;  // where the complete exports are, for the end-of-job report
  EXPECT_EQ(final_export_dir(root, 30, 40, &done), "");
  EXPECT_EQ(done, root + "/final-step-40");
  EXPECT_EQ(final_export_dir(root, 40, 40), "");
  EXPECT_EQ(final_export_dir(root, 30, 50), root + "/final-step-50");
  // The exports of step 30 complete, resumed at step 40 after a kill between the last save and
  // the export (nothing of step 40 written yet): step 40's exports are still to write.
  fs::remove_all(root + "/final-step-40");
  EXPECT_EQ(final_export_dir(root, 40, 40), root + "/final-step-40");
}

TEST(RunProtocol, FinalExportInterruptedByAKill) {
  TempDir tmp;
  const std::string root = tmp.file("ckpt"), fin = root + "/final";
  // Killed during the 4-bit export of step 30: the marker and a partial folder of a dead process.
  fs::create_directories(fin + "/base_bnb4.partial-999999999");
  write_bytes(fin + "/base_bnb4.partial-999999999/model.safetensors", "half");
  write_bytes(fin + "/" + kFinalExportMarker, "{\"step\": 30}\n");
  EXPECT_EQ(final_export_dir(root, 30, 30), fin);  // not "nothing to do": nothing is complete
  EXPECT_EQ(pending_exports(fin), (std::vector<std::string>{"base_bnb4", "adapter"}));
  EXPECT_FALSE(fs::exists(fin + "/base_bnb4.partial-999999999"));  // the dead process's partial folder
  // The 4-bit export completed, the adapter's was killed; a live process's partial folder (this
  // test's parent, which runs) is never removed.
  fs::create_directories(fin + "/base_bnb4");
  write_bytes(fin + "/base_bnb4/config.json", "{\"kept\": true}");
  fs::create_directories(fin + "/adapter.partial-999999999");
  const std::string live = fin + "/adapter.partial-" + std::to_string(::getppid());
  fs::create_directories(live);
  EXPECT_EQ(final_export_dir(root, 30, 30), fin);
  EXPECT_EQ(pending_exports(fin), (std::vector<std::string>{"adapter"}));
  EXPECT_FALSE(fs::exists(fin + "/adapter.partial-999999999"));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_EQ(read_bytes(fin + "/base_bnb4/config.json"), "{\"kept\": true}");
  fs::remove_all(live);
  // A final/ written before the marker existed, holding only a partial folder: this step's when
  // the run resumed at its last step (finish it), an earlier part's otherwise.
  const std::string root2 = tmp.file("ckpt2"), fin2 = root2 + "/final";
  fs::create_directories(fin2 + "/base_bnb4.partial-999999999");
  EXPECT_EQ(final_export_dir(root2, 30, 30), fin2);
  EXPECT_EQ(final_export_dir(root2, 20, 30), fin2 + "-step-30");
  // A marker naming another step: that step's exports, kept; a bad marker is named.
  write_bytes(fin2 + "/" + kFinalExportMarker, "{\"step\": 20}");
  EXPECT_EQ(final_export_dir(root2, 30, 30), fin2 + "-step-30");
  write_bytes(fin2 + "/" + kFinalExportMarker, "{\"step\": \"x\"}");
  EXPECT_NE(error_of([&] { final_export_dir(root2, 30, 30); }).find(kFinalExportMarker), std::string::npos);
}

TEST(RunProtocol, ResumeConfigMayChangeTheFoldNotTheAdapter) {
  TrainConfig saved;
  saved.data.train = "x.tok";
  TrainConfig now = saved;
  now.lora.fold = false;
  now.lora.fuse_qkv_backward = true;
  now.logging.profile = true;
  now.logging.gemm_tflops = 0;
  now.model.allow_nonfinite = true;  // resuming from a checkpoint holding NaN, on purpose
  EXPECT_NO_THROW(check_resume_config(now, saved, "ckpt/step-00000010"));
  now.lora.r = 16;
  EXPECT_NE(error_of([&] { check_resume_config(now, saved, "ckpt/step-00000010"); }).find("key 'lora.r' is 8"),
            std::string::npos);
}

TEST(RunProtocol, ResumeKeepsTheScheduleUnlessAsked) {
  CheckpointInfo info;
  info.dir = "ckpt/step-00000010";
  info.step = 10;
  info.metadata = nlohmann::json::parse(R"({"trainer": {"scheduler": {"type": "warmup_cosine", "lr": 0.002,
      "warmup_steps": 3, "max_steps": 30, "min_lr_ratio": 0.1, "next_step": 10}}})");
  const LrSchedule same{ScheduleType::kWarmupCosine, 0.002, 3, 30, 0.1};
  EXPECT_EQ(check_resume_schedule(info, same, false), "");
  // A resume without the original --set steps=30 (the file says 40): refused, old and new named.
  LrSchedule longer = same;
  longer.max_steps = 40;
  longer.lr = 0.001;
  const std::string msg = error_of([&] { check_resume_schedule(info, longer, false); });
  EXPECT_NE(msg.find("resume from ckpt/step-00000010: the LR schedule differs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optimizer.lr 0.002 -> 0.001, steps 30 -> 40"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--allow-schedule-change"), std::string::npos) << msg;
  // Asked for (extending the run): the differences come back for the log.
  EXPECT_EQ(check_resume_schedule(info, longer, true), "optimizer.lr 0.002 -> 0.001, steps 30 -> 40");
  LrSchedule other = same;
  other.type = ScheduleType::kLinear;
  other.warmup_steps = 0;
  other.min_lr_ratio = 0;
  EXPECT_NE(error_of([&] { check_resume_schedule(info, other, false); })
                .find("schedule.type warmup_cosine -> linear, schedule.warmup_steps 3 -> 0, schedule.min_lr_ratio 0.1 -> 0"),
            std::string::npos);
  info.metadata["trainer"]["scheduler"]["lr"] = "fast";
  EXPECT_NE(error_of([&] { check_resume_schedule(info, same, true); })
                .find(R"(metadata.json: trainer.scheduler.lr: expected a finite number, got "fast")"),
            std::string::npos);
  info.metadata["trainer"]["scheduler"].erase("lr");
  EXPECT_NE(error_of([&] { check_resume_schedule(info, same, true); })
                .find("metadata.json: trainer.scheduler.lr: missing (expected a number)"),
            std::string::npos);
  info.metadata["trainer"]["scheduler"] = 5;
  EXPECT_NE(error_of([&] { check_resume_schedule(info, same, true); })
                .find("metadata.json: trainer.scheduler: expected an object, got 5"),
            std::string::npos);
}

// trainer.history (the losses a resumed run's log and summary continue): a missing or mistyped
// field is named by its path in metadata.json (nlohmann's text before).
TEST(RunProtocol, MalformedHistoryIsNamedByPath) {
  CheckpointInfo info;
  info.dir = "ckpt/step-00000002";
  info.step = 2;
  info.metadata = nlohmann::json::parse(R"({"trainer": {"history": {"loss": [2.5, null], "eval_loss": [[2, 2.25]]}}})");
  const TrainHistory h = checkpoint_history(info);
  ASSERT_EQ(h.losses.size(), 2u);
  EXPECT_TRUE(std::isnan(h.losses[1]));
  ASSERT_EQ(h.eval_losses.size(), 1u);
  EXPECT_EQ(h.eval_losses[0].first, 2);
  auto error_with = [&](const char* history) {
    CheckpointInfo bad = info;
    bad.metadata["trainer"]["history"] = nlohmann::json::parse(history);
    return error_of([&] { checkpoint_history(bad); });
  };
  EXPECT_NE(error_with(R"({"loss": [1, 2]})").find("metadata.json: trainer.history.eval_loss: missing (expected an array)"),
            std::string::npos);
  EXPECT_NE(error_with(R"({"loss": 5, "eval_loss": []})").find("metadata.json: trainer.history.loss: expected an array, got 5"),
            std::string::npos);
  EXPECT_NE(error_with(R"({"loss": [1, 2], "eval_loss": [[2]]})")
                .find("metadata.json: trainer.history.eval_loss[0]: expected [step, loss], got [2]"),
            std::string::npos);
  EXPECT_NE(error_with(R"({"loss": [1, 2], "eval_loss": [["2", 1.0]]})")
                .find(R"(metadata.json: trainer.history.eval_loss[0][0]: expected an integer >= 0, got "2")"),
            std::string::npos);
}

// The trainer's state beside the tensors (optimizer and RNG kinds, step counters, seeds) must be
// this job's: each difference refused naming metadata.json, the field and both values; AdamW's
// hyper-parameters may change and come back for the warning.
TEST(RunProtocol, ResumeStateIsTheJobs) {
  TrainConfig job;
  job.seed = 3;
  job.data.seed = 4;
  job.model.init.seed = 5;
  CheckpointInfo good;
  good.dir = "ckpt/step-00000010";
  good.step = 10;
  good.metadata = nlohmann::json::parse(R"({"trainer": {"data": {}, "scheduler": {"next_step": 10},
      "optimizer": {"type": "adamw", "step": 10}, "rng": {"kind": "counter", "lora_init_seed": 3,
      "dropout_seed": 3, "data_seed": 4, "base_init_seed": 5, "next_step": 10}}})");
  nlohmann::json& opt = good.metadata["trainer"]["optimizer"];
  opt["beta1"] = job.optimizer.beta1;
  opt["beta2"] = job.optimizer.beta2;
  opt["eps"] = job.optimizer.eps;
  opt["weight_decay"] = job.optimizer.weight_decay;
  opt["grad_clip"] = job.optimizer.grad_clip;
  EXPECT_TRUE(check_resume_state(good, job).empty());
  auto refused = [&](const char* section, const char* key, const nlohmann::json& value) {
    CheckpointInfo bad = good;
    if (value.is_null()) bad.metadata["trainer"][section].erase(key);
    else bad.metadata["trainer"][section][key] = value;
    return error_of([&] { check_resume_state(bad, job); });
  };
  EXPECT_EQ(refused("optimizer", "type", "sgd"),
            "ckpt/step-00000010/metadata.json: trainer.optimizer.type is 'sgd', this job's optimizer is 'adamw' (a "
            "checkpoint of another trainer?); refusing to resume from it");
  EXPECT_NE(refused("rng", "kind", "philox").find("trainer.rng.kind is 'philox', this job's random number scheme is 'counter'"),
            std::string::npos);
  EXPECT_EQ(refused("optimizer", "step", 9),
            "ckpt/step-00000010/metadata.json: trainer.optimizer.step is 9, expected 10 (the checkpoint's step); "
            "refusing to resume from it");
  EXPECT_NE(refused("rng", "next_step", 11).find("trainer.rng.next_step is 11, expected 10"), std::string::npos);
  EXPECT_NE(refused("scheduler", "next_step", 0).find("trainer.scheduler.next_step is 0, expected 10"), std::string::npos);
  EXPECT_NE(refused("rng", "dropout_seed", 7).find("trainer.rng.dropout_seed is 7, expected 3 (this job's seed)"),
            std::string::npos);
  EXPECT_NE(refused("rng", "data_seed", 7).find("expected 4 (this job's data.seed)"), std::string::npos);
  EXPECT_NE(refused("rng", "base_init_seed", 7).find("expected 5 (this job's model.init.seed)"), std::string::npos);
  EXPECT_NE(refused("rng", "kind", nullptr).find("trainer.rng.kind is missing"), std::string::npos);
  EXPECT_NE(refused("optimizer", "step", "10").find("trainer.optimizer.step is \"10\", expected an integer"),
            std::string::npos);
  EXPECT_NE(refused("optimizer", "eps", "x").find("trainer.optimizer.eps is \"x\", expected a number"), std::string::npos);
  // A base read from model.path was not drawn from model.init.seed: not compared.
  TrainConfig from_path = job;
  from_path.model.path = "/models/m";
  CheckpointInfo other_base = good;
  other_base.metadata["trainer"]["rng"]["base_init_seed"] = 7;
  EXPECT_NO_THROW(check_resume_state(other_base, from_path));
  // AdamW's settings may change: listed for the warning.
  TrainConfig new_eps = job;
  new_eps.optimizer.eps = 1e-6;
  new_eps.optimizer.grad_clip = 0.5;
  const std::vector<std::string> changed = check_resume_state(good, new_eps);
  ASSERT_EQ(changed.size(), 2u);
  EXPECT_EQ(changed[0], fmt::format("optimizer.eps {} -> 1e-06", job.optimizer.eps));
  EXPECT_EQ(changed[1], fmt::format("optimizer.grad_clip {} -> 0.5", job.optimizer.grad_clip));
}

// A pid that ran on this host and no longer does: a child that exited and was reaped.
long dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return static_cast<long>(child);
}

TEST(RunLock, SecondHolderRefusedStaleTakenOver) {
  TempDir tmp;
  const std::string dir = tmp.file("ck"), file = dir + "/" + kRunLockFile;
  const std::string me = "pid " + std::to_string(::getpid()) + " on host " + this_host_name();
  {
    const RunLock held(dir);  // creates the folder
    EXPECT_NE(read_bytes(file).find("\"pid\":" + std::to_string(::getpid())), std::string::npos) << read_bytes(file);
    // Another job (another open file: the flock refuses it even in this process).
    const std::string msg = error_of([&] { RunLock second(dir); });
    EXPECT_NE(msg.find("checkpoint.dir " + dir + " is in use by another job: " + me + " (lock file " + file + ")"),
              std::string::npos)
        << msg;
  }
  EXPECT_FALSE(fs::exists(file)) << "released: the lock file is removed";
  EXPECT_FALSE(fs::exists(dir)) << "released: the folder the lock made, left empty, is removed";
  fs::create_directories(dir);
  {
    const RunLock held(dir);  // a folder that was there stays
  }
  EXPECT_TRUE(fs::exists(dir));
  // A lock file left by a process that died (kill -9: the kernel dropped its flock): taken over.
  const long dead = dead_pid();
  write_bytes(file, "{\"host\": \"" + this_host_name() + "\", \"pid\": " + std::to_string(dead) + "}\n");
  {
    const RunLock taken(dir);
    EXPECT_EQ(read_bytes(file).find(std::to_string(dead)), std::string::npos) << "the file names the new holder";
  }
  // One naming another host: that job may run there (flock need not reach across hosts): refused.
  write_bytes(file, "{\"host\": \"elsewhere-node-7\", \"pid\": 4242}\n");
  const std::string msg = error_of([&] { RunLock r(dir); });
  EXPECT_NE(msg.find("in use by another job: pid 4242 on host elsewhere-node-7"), std::string::npos) << msg;
  EXPECT_NE(msg.find("if it does not, delete the lock file"), std::string::npos) << msg;
  // A lock of binary bytes is shown printable (a NUL cut the message short).
  write_bytes(file, std::string("\0\x01" "ab", 4));
  EXPECT_NE(error_of([&] { RunLock r(dir); }).find("an unknown job (the lock file reads '\\x00\\x01ab') (lock file"),
            std::string::npos);
  // What is not a regular file there is named, and nothing is written through it: a FIFO, a
  // symbolic link (to a file it would have truncated), a folder.
  fs::remove(file);
  ASSERT_EQ(::mkfifo(file.c_str(), 0644), 0);
  EXPECT_NE(error_of([&] { RunLock r(dir); }).find("its lock file " + file + " is not a regular file"), std::string::npos);
  fs::remove(file);
  write_bytes(tmp.file("precious"), "keep me");
  fs::create_symlink(tmp.file("precious"), file);
  EXPECT_NE(error_of([&] { RunLock r(dir); }).find("its lock file " + file + " is a symbolic link"), std::string::npos);
  EXPECT_EQ(read_bytes(tmp.file("precious")), "keep me");
  fs::remove(file);
  fs::create_directories(file);
  EXPECT_NE(error_of([&] { RunLock r(dir); }).find("its lock file " + file + " cannot be created: Is a directory"),
            std::string::npos);
  fs::remove(file);
  // A folder that cannot be made is named.
  write_bytes(tmp.file("a_file"), "x");
  EXPECT_NE(error_of([&] { RunLock r(tmp.file("a_file") + "/ck"); }).find("cannot create it"), std::string::npos);
}

TEST(RunProtocol, EndOfJobReport) {
  TrainConfig c;
  TrainSummary s;
  s.steps = s.max_steps = 30;
  EXPECT_EQ(end_of_job_report(c, s), "nothing was saved (checkpoint.dir: none): no checkpoint, no adapter\n");
  c.checkpoint.dir = "runs/my job";
  s.last_checkpoint = "runs/my job/step-00000030";
  s.exported_base = "runs/my job/final/base_bnb4";
  s.exported_adapter = "runs/my job/final/adapter";
  const std::string cwd = fs::current_path().string();
  const std::string r = end_of_job_report(c, s);
  EXPECT_NE(r.find("run folder: " + cwd + "/runs/my job\n"), std::string::npos) << r;
  EXPECT_NE(r.find("last checkpoint: " + cwd + "/runs/my job/step-00000030"), std::string::npos) << r;
  EXPECT_NE(r.find(" generate --model '" + cwd + "/runs/my job/final/base_bnb4' --adapter '" + cwd +
                   "/runs/my job/final/adapter' --prompt"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(\"" + cwd +
                   "/runs/my job/final/base_bnb4\"), \"" + cwd + "/runs/my job/final/adapter\")"),
            std::string::npos)
      << r;
  // Stopped early: no exports, how to continue.
  s.steps = 15;
  s.exported_base.clear();
  s.exported_adapter.clear();
  const std::string stopped = end_of_job_report(c, s);
  EXPECT_NE(stopped.find("stopped after step 15 of 30: continue with the same command and --resume auto"),
            std::string::npos)
      << stopped;
  EXPECT_EQ(stopped.find("generate"), std::string::npos);
}

}  // namespace
}  // namespace qshard
