// logging.tensorboard_dir through the trainer, under mpirun -np 2 (CPU backend): configs/tiny.yaml
// (global batch 4) for 4 steps with a checkpoint every 2, then a resume from step 2 into the same
// JSONL and event folder. The folder is read back with the tests' own decoder (tf_event_reader.h):
//  - exactly one event file per job (rank 0 writes; rank 1 writes nothing), each record's length
//    and data CRC-32C checked, record 1 file_version "brain.Event:2", record 2 SessionLog START
//    at the job's first step (1, then 3);
//  - merged as TensorBoard merges them (the resume's START supersedes steps 3-4 of the first
//    file), each step once, and for every JSONL line (after the resume dropped and rewrote steps
//    3-4) every key but "step" is a scalar with that tag at that step equal to the JSON value as a
//    float, and no other scalar exists; wall times are seconds since 1970 in write order.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "runtime/mpi_communicator.h"
#include "runtime/world.h"
#include "train/tf_event_reader.h"
#include "train/trainer.h"
#include "train/trainer_fixture.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const std::string p = tmp_path(name);
  if (World::get().rank() == 0) fs::remove_all(p);
  MPI_Barrier(MPI_COMM_WORLD);
  return p;
}

TEST(TensorBoard, TrainerEventsEqualTheJsonlAcrossAResume) {
  const std::string work = fresh_dir("tb_work");
  if (World::get().rank() == 0) fs::create_directories(work);
  // 40 packed sequences of tiny.yaml's 128 tokens (byte vocabulary 258): 38 train, 2 eval.
  const std::string data = make_token_file("tb.tok", 258, 128 * 40, 0);
  const std::string jsonl = work + "/metrics.jsonl", tb = work + "/tb";
  std::vector<std::string> sets = {"data.train=" + data, "steps=4", "batch.global_batch_size=4", "schedule.warmup_steps=1",
                                   "logging.every_steps=1", "logging.eval_every_steps=2",
                                   "logging.metrics_jsonl=" + jsonl, "logging.tensorboard_dir=" + tb,
                                   "checkpoint.every_steps=2", "checkpoint.keep_last=0", "device=cpu",
                                   "checkpoint.dir=" + work + "/ck1"};
  const TrainConfig first = load_train_config(std::string(QSHARD_SOURCE_DIR) + "/configs/tiny.yaml", sets);
  MpiCommunicator all(World::get().comm());
  const double t0 = static_cast<double>(std::time(nullptr)) - 1;
  train(first, all);
  sets.push_back("checkpoint.dir=" + work + "/ck2");
  sets.push_back("checkpoint.resume=" + work + "/ck1/step-00000002");
  const TrainSummary resumed = train(load_train_config(std::string(QSHARD_SOURCE_DIR) + "/configs/tiny.yaml", sets), all);
  EXPECT_EQ(resumed.losses.size(), 4u);
  if (World::get().rank() != 0) return;

  const auto files = tb_test::event_files(tb);
  ASSERT_EQ(files.size(), 2u) << "one event file per job, from rank 0 only";
  const int64_t first_steps[] = {1, 3};
  double last_wall = t0;
  for (size_t f = 0; f < files.size(); ++f) {
    std::vector<tb_test::DecodedEvent> ev;
    ASSERT_NO_THROW(ev = tb_test::read_event_file(files[f])) << files[f];  // every CRC checked
    ASSERT_GE(ev.size(), 3u) << files[f];
    EXPECT_EQ(ev[0].file_version, "brain.Event:2") << files[f];
    EXPECT_EQ(ev[1].session_status, 1u) << files[f];
    EXPECT_EQ(ev[1].step, first_steps[f]) << files[f];
    EXPECT_EQ(ev.size() - 2, f == 0 ? 4u : 2u) << files[f] << ": one event per logged step";
    for (const auto& e : ev) {
      EXPECT_GE(e.wall_time, last_wall) << files[f] << " step " << e.step;
      last_wall = e.wall_time;
    }
  }
  EXPECT_LE(last_wall, static_cast<double>(std::time(nullptr)) + 1);

  const tb_test::DirScalars got = tb_test::read_event_dir(tb);
  EXPECT_EQ(got.duplicates, 0);
  std::ifstream in(jsonl);
  std::map<std::string, std::map<int64_t, float>> want;
  int64_t lines = 0;
  for (std::string l; std::getline(in, l); ++lines) {
    const auto j = nlohmann::json::parse(l);
    for (const auto& [key, value] : j.items())
      if (key != "step") want[key][j["step"].get<int64_t>()] = value.is_null() ? NAN : value.get<float>();
  }
  EXPECT_EQ(lines, 4);
  ASSERT_TRUE(want.count("eval_loss"));
  EXPECT_EQ(want["eval_loss"].size(), 2u);  // steps 2 and 4
  ASSERT_EQ(got.series.size(), want.size());
  size_t compared = 0;
  for (const auto& [tag, points] : want) {
    ASSERT_TRUE(got.series.count(tag)) << tag;
    const auto& g = got.series.at(tag);
    EXPECT_EQ(g.size(), points.size()) << tag;
    for (const auto& [step, value] : points) {
      ASSERT_TRUE(g.count(step)) << tag << " step " << step;
      EXPECT_EQ(g.at(step), value) << tag << " step " << step;
      ++compared;
    }
  }
  std::printf("%zu scalars in %zu series over 2 event files equal the JSONL (loss at step 4: %.6f)\n", compared,
              want.size(), static_cast<double>(got.series.at("loss").at(4)));
  if (!::testing::Test::HasFailure()) fs::remove_all(work), fs::remove(data);  // kept for a look when failed
}

}  // namespace
}  // namespace qshard
