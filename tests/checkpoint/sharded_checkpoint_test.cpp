// Resumable sharded checkpoints (checkpoint/sharded_checkpoint.h) under mpirun -np 1..3:
//  - save at world W, load at W: every slice bitwise equal; metadata.json lists the units,
//    tensors and files; each file's crc32 is zlib's (CRC-32 check value of "123456789");
//  - reshard: save over all ranks, load on one rank (MPI_COMM_SELF) and the other way round:
//    every rank's new shard equals the world-independent full values, zeros in the padding;
//  - keep_last keeps the newest K; a stale *.partial folder is ignored, then removed;
//  - faults, each refused with an InputError on every rank (no hang) that names the file, and
//    the targets untouched (never half-loaded): a truncated file, a flipped byte, a missing
//    metadata.json (an interrupted save), bad JSON, a newer format version, a file of another
//    save, another model;
//  - an unwritable destination (a path under a regular file) and a full one (RLIMIT_FSIZE: every
//    write past the limit fails like ENOSPC) fail the save with a message on every rank, leave no
//    partial folder, and the previous checkpoint still loads.
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/crc32.h"
#include "checkpoint/sharded_checkpoint.h"
#include "runtime/error.h"
#include "runtime/mpi_communicator.h"
#include "runtime/world.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;

// A shared temporary folder (rank 0's pid in the name), fresh for each test.
std::string shared_dir(const std::string& name) {
  int pid = ::getpid();
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string p = (fs::temp_directory_path() / ("qshard_ckpt_test_" + std::to_string(pid) + "_" + name)).string();
  if (World::get().rank() == 0) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return p;
}

// Three units of LoRA-like tensors (one unit without any, like a root unit without LoRA).
struct Model {
  std::vector<FlatLayout> layouts;
  std::vector<std::string> names = {"model.layers.0", "model.layers.1", "root"};
  explicit Model(int world, int64_t r = 4) {
    layouts.resize(3);
    layouts[0].add("model.layers.0.q.lora_A.weight", DType::kF32, {r, 12});
    layouts[0].add("model.layers.0.q.lora_B.weight", DType::kF32, {10, r});
    layouts[1].add("model.layers.1.q.lora_A.weight", DType::kF32, {r, 7});
    layouts[1].add("model.layers.1.q.lora_B.weight", DType::kF32, {5, r});
    for (auto& l : layouts) l.set_world(world);
  }
};

// World-independent full value of element i of (unit, slice); 0 where the layout has no tensor.
float full_value(const FlatLayout& l, int unit, int slice, int64_t i) {
  for (const FlatEntry& e : l.entries())
    if (i * 4 >= e.offset && i * 4 < e.offset + e.nbytes) return 1.0f + unit * 1000.0f + slice * 100.0f + i * 0.5f;
  return 0.0f;
}

const char* kSlices[] = {"master", "exp_avg", "exp_avg_sq"};

// This rank's shards: filled with the full values (fill = true) or with a marker (-7).
std::vector<UnitStateShard> shards(const Model& m, int rank, bool fill) {
  std::vector<UnitStateShard> out;
  for (int u = 0; u < 3; ++u) {
    UnitStateShard s;
    s.unit = m.names[u];
    s.layout = &m.layouts[u];
    const int64_t n = m.layouts[u].shard_bytes() / 4;
    for (int k = 0; k < 3; ++k) {
      Tensor t = Tensor::zeros({n}, DType::kF32);
      for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = fill ? full_value(m.layouts[u], u, k, rank * n + i) : -7.0f;
      s.slices.emplace_back(kSlices[k], t);
    }
    out.push_back(std::move(s));
  }
  return out;
}

// Number of elements of `got` that differ from the expected values of `rank`'s shard.
int64_t mismatches(const Model& m, int rank, const std::vector<UnitStateShard>& got) {
  int64_t bad = 0;
  for (int u = 0; u < 3; ++u) {
    const int64_t n = m.layouts[u].shard_bytes() / 4, numel = m.layouts[u].total_bytes() / 4;
    for (int k = 0; k < 3; ++k)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t g = rank * n + i;
        const float want = g < numel ? full_value(m.layouts[u], u, k, g) : 0.0f;
        bad += got[u].slices[k].second.data<float>()[i] != want;
      }
  }
  return bad;
}

bool all_marker(const std::vector<UnitStateShard>& s) {
  for (const auto& u : s)
    for (const auto& [n, t] : u.slices)
      for (int64_t i = 0; i < t.numel(); ++i)
        if (t.data<float>()[i] != -7.0f) return false;
  return true;
}

std::string save(Communicator& comm, const std::string& root, int64_t step, int64_t keep_last = 0) {
  const Model m(comm.size());
  CheckpointSaveOptions o;
  o.root = root;
  o.step = step;
  o.keep_last = keep_last;
  o.trainer = {{"note", "test"}, {"step", step}};
  return save_sharded_checkpoint(comm, shards(m, comm.rank(), true), o);
}

// Loads `dir` at comm's world size into marker-filled shards; returns the error ("" if none)
// and whether the targets stayed untouched.
std::pair<std::string, bool> try_load(Communicator& comm, const std::string& dir, int64_t lora_r = 4) {
  const Model m(comm.size(), lora_r);
  auto s = shards(m, comm.rank(), false);
  try {
    load_sharded_checkpoint(comm, read_checkpoint_metadata(dir), s);
  } catch (const InputError& e) {
    return {e.what(), all_marker(s)};
  }
  EXPECT_EQ(mismatches(m, comm.rank(), s), 0) << dir;
  return {"", false};
}

TEST(Crc32, MatchesZlib) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32({reinterpret_cast<const uint8_t*>(s.data()), s.size()}), 0xCBF43926u);
  EXPECT_EQ(crc32({}), 0u);
  std::vector<uint8_t> big(100003);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7 + (i >> 8));
  // chunked == one pass (the slicing-by-8 loop and the byte tail agree)
  uint32_t c = 0;
  for (size_t i = 0; i < big.size(); i += 4099) c = crc32_update(c, {big.data() + i, std::min<size_t>(4099, big.size() - i)});
  EXPECT_EQ(c, crc32(big));
}

TEST(ShardedCheckpoint, SaveLoadSameWorldAndMetadata) {
  MpiCommunicator comm(World::get().comm());
  const std::string root = shared_dir("same");
  const std::string dir = save(comm, root, 15);
  EXPECT_EQ(dir, root + "/step-00000015");
  const CheckpointInfo info = read_checkpoint_metadata(root);  // a root: the newest
  EXPECT_EQ(info.dir, dir);
  EXPECT_EQ(info.step, 15);
  EXPECT_EQ(info.world_size, comm.size());
  EXPECT_EQ(info.metadata.at("trainer").at("note"), "test");
  EXPECT_EQ(info.metadata.at("units").size(), 3u);
  EXPECT_EQ(info.metadata.at("units")[0].at("tensors")[1].at("name"), "model.layers.0.q.lora_B.weight");
  EXPECT_EQ(info.metadata.at("units")[0].at("tensors")[1].at("offset"), 48);  // 4 x 12
  for (const auto& f : info.metadata.at("files"))
    EXPECT_EQ(crc32_file(dir + "/" + f.at("name").get<std::string>()), f.at("crc32").get<uint32_t>());
  EXPECT_EQ(try_load(comm, dir).first, "");
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) fs::remove_all(root);
}

TEST(ShardedCheckpoint, ReshardAcrossWorldSizes) {
  MpiCommunicator all(World::get().comm()), self(MPI_COMM_SELF);
  // saved by every rank, loaded by each rank alone (world 1)
  const std::string a = shared_dir("reshard_a");
  const std::string dir_a = save(all, a, 3);
  EXPECT_EQ(try_load(self, dir_a).first, "");
  // saved by rank 0 alone, loaded by every rank
  const std::string b = shared_dir("reshard_b");
  if (all.rank() == 0) save(self, b, 4);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(try_load(all, b + "/step-00000004").first, "");
  MPI_Barrier(MPI_COMM_WORLD);
  if (all.rank() == 0) fs::remove_all(a), fs::remove_all(b);
}

TEST(ShardedCheckpoint, KeepLastAndPartialFolders) {
  MpiCommunicator comm(World::get().comm());
  const std::string root = shared_dir("keep");
  save(comm, root, 1, 2);
  save(comm, root, 2, 2);
  // an interrupted save of step 3: a partial folder with a file and no metadata.json
  if (comm.rank() == 0) {
    fs::create_directories(root + "/step-00000003.partial");
    std::ofstream(root + "/step-00000003.partial/rank-00000-of-00001.safetensors") << "half";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const auto listed = list_checkpoints(root);
  EXPECT_EQ(listed.size(), 2u);
  if (!listed.empty()) {
    EXPECT_EQ(listed.back().first, 2);
  }
  EXPECT_EQ(read_checkpoint_metadata(root).step, 2);
  try {
    read_checkpoint_metadata(root + "/step-00000003.partial");
    ADD_FAILURE() << "a partial checkpoint was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("incomplete"), std::string::npos) << e.what();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  save(comm, root, 4, 2);
  const auto after = list_checkpoints(root);
  EXPECT_EQ(after.size(), 2u);
  if (after.size() == 2) {
    EXPECT_EQ(after[0].first, 2);
    EXPECT_EQ(after[1].first, 4);
  }
  EXPECT_FALSE(fs::exists(root + "/step-00000003.partial"));
  EXPECT_FALSE(fs::exists(root + "/step-00000001"));
  // saving a step that exists replaces it
  save(comm, root, 4, 2);
  EXPECT_EQ(try_load(comm, root + "/step-00000004").first, "");
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) fs::remove_all(root);
}

// Applies `damage` (rank 0) to a fresh copy of a good checkpoint and expects the load to fail on
// every rank with a message containing `expect`, the targets untouched.
void expect_refused(Communicator& comm, const std::string& good, const std::string& name,
                    const std::function<void(const std::string&)>& damage, const std::string& expect,
                    int64_t lora_r = 4) {
  const std::string copy = fs::path(good).parent_path().parent_path().string() + "/" + name + "/step-00000005";
  if (comm.rank() == 0) {
    fs::remove_all(fs::path(copy).parent_path());
    fs::create_directories(fs::path(copy).parent_path());
    fs::copy(good, copy, fs::copy_options::recursive);
    damage(copy);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::string err;
  bool untouched = false;
  try {
    std::tie(err, untouched) = try_load(comm, copy, lora_r);
  } catch (const InputError& e) {  // read_checkpoint_metadata refuses before any collective
    err = e.what();
    untouched = true;
  }
  EXPECT_NE(err.find(expect), std::string::npos) << name << ": '" << err << "' lacks '" << expect << "'";
  EXPECT_TRUE(untouched) << name << ": targets were written by a refused load";
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(ShardedCheckpoint, CorruptedCheckpointsAreRefused) {
  MpiCommunicator comm(World::get().comm());
  const std::string root = shared_dir("faults");
  const std::string good = save(comm, root + "/good", 5);
  const int W = comm.size();
  const std::string last = "rank-" + std::string(5 - std::to_string(W - 1).size(), '0') + std::to_string(W - 1) +
                           "-of-" + std::string(5 - std::to_string(W).size(), '0') + std::to_string(W) + ".safetensors";
  expect_refused(comm, good, "truncated", [&](const std::string& d) {
    fs::resize_file(d + "/" + last, fs::file_size(d + "/" + last) - 10);
  }, "truncated");
  expect_refused(comm, good, "flipped", [&](const std::string& d) {
    std::fstream f(d + "/" + last, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(d + "/" + last) - 5));
    f.put('\x5a');
  }, "corrupted");
  expect_refused(comm, good, "no_metadata", [&](const std::string& d) { fs::remove(d + "/metadata.json"); },
                 "incomplete");
  expect_refused(comm, good, "bad_json", [&](const std::string& d) {
    std::ofstream(d + "/metadata.json") << "{\"format\": \"qshard.train_checkpoint\", ";
  }, "metadata.json");
  expect_refused(comm, good, "newer", [&](const std::string& d) {
    std::ifstream in(d + "/metadata.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["format_version"] = 99;
    std::ofstream(d + "/metadata.json") << j.dump();
  }, "newer");
  expect_refused(comm, good, "missing_file", [&](const std::string& d) { fs::remove(d + "/" + last); }, last);
  // a rank file of another save (step 6) with consistent metadata sizes and checksums
  const std::string other = save(comm, root + "/other", 6);
  expect_refused(comm, good, "other_save", [&](const std::string& d) {
    fs::copy_file(other + "/" + last, d + "/" + last, fs::copy_options::overwrite_existing);
    std::ifstream in(d + "/metadata.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["files"][W - 1]["bytes"] = fs::file_size(d + "/" + last);
    j["files"][W - 1]["crc32"] = crc32_file(d + "/" + last);
    std::ofstream(d + "/metadata.json") << j.dump();
  }, "another save");
  // another model: LoRA rank 8 instead of 4
  expect_refused(comm, good, "other_model", [](const std::string&) {}, "does not match this model", 8);
  // metadata that lies about where a tensor starts: named by field, also when offset x 4 wraps to
  // the true byte offset (2^62 x 4 = 0 mod 2^64 for the first tensor)
  auto set_offset = [](int64_t v) {
    return [v](const std::string& d) {
      std::ifstream in(d + "/metadata.json");
      nlohmann::json j = nlohmann::json::parse(in);
      j["units"][0]["tensors"][0]["offset"] = v;
      std::ofstream(d + "/metadata.json") << j.dump();
    };
  };
  expect_refused(comm, good, "offset", set_offset(16), "tensors[0] ('model.layers.0.q.lora_A.weight') offset 16 differs from this model's 0");
  expect_refused(comm, good, "offset_wraps", set_offset(int64_t{1} << 62), "offset 4611686018427387904 differs");
  // a shard size whose product with the world size wraps: named, not read
  expect_refused(comm, good, "shard_wraps", [](const std::string& d) {
    std::ifstream in(d + "/metadata.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["units"][0]["shard_numel"] = INT64_MAX;
    std::ofstream(d + "/metadata.json") << j.dump();
  }, "shard_numel");
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) fs::remove_all(root);
}

TEST(ShardedCheckpoint, UnwritableAndFullDestinations) {
  MpiCommunicator comm(World::get().comm());
  const std::string root = shared_dir("dest");
  // a checkpoint.dir below a regular file cannot be created (root can write anywhere else)
  if (comm.rank() == 0) std::ofstream(root + "/a_file") << "x";
  MPI_Barrier(MPI_COMM_WORLD);
  try {
    save(comm, root + "/a_file/ckpt", 1);
    ADD_FAILURE() << "saving below a regular file succeeded";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a_file/ckpt"), std::string::npos) << e.what();
  }
  // a full destination: a good checkpoint, then a save where every rank's writes hit the limit
  save(comm, root + "/ckpt", 1);
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead
  rlimit tiny = old;
  tiny.rlim_cur = 200;  // bytes: less than one rank file
  setrlimit(RLIMIT_FSIZE, &tiny);
  std::string err;
  try {
    save(comm, root + "/ckpt", 2);
  } catch (const InputError& e) {
    err = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(err.find("saving checkpoint step 2"), std::string::npos) << err;
  EXPECT_NE(err.find("too large"), std::string::npos) << err;  // strerror(EFBIG), as ENOSPC would be named
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_FALSE(fs::exists(root + "/ckpt/step-00000002.partial"));
  EXPECT_FALSE(fs::exists(root + "/ckpt/step-00000002"));
  EXPECT_EQ(read_checkpoint_metadata(root + "/ckpt").step, 1);
  EXPECT_EQ(try_load(comm, root + "/ckpt").first, "");
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) fs::remove_all(root);
}

// A NaN in a saved optimizer moment: refused on load, naming the file, the slice, the tensor and
// the index in it, on every rank and before any target is written; loaded with allow_nonfinite.
TEST(ShardedCheckpoint, NonFiniteStateIsRefused) {
  MpiCommunicator comm(World::get().comm());
  const std::string root = shared_dir("nonfinite");
  const Model m(comm.size());
  auto saved = shards(m, comm.rank(), true);
  // exp_avg of model.layers.1.q.lora_B.weight, its element 3, on the rank whose shard holds it
  const FlatEntry& e = m.layouts[1].entries()[1];
  ASSERT_EQ(e.name, "model.layers.1.q.lora_B.weight");
  const int64_t g = e.offset / 4 + 3, n = m.layouts[1].shard_bytes() / 4;
  if (g / n == comm.rank()) saved[1].slices[1].second.data<float>()[g % n] = std::nanf("");
  CheckpointSaveOptions o;
  o.root = root;
  o.step = 1;
  o.trainer = {{"note", "test"}};
  const std::string dir = save_sharded_checkpoint(comm, saved, o);
  auto got = shards(m, comm.rank(), false);
  std::string err;
  try {
    load_sharded_checkpoint(comm, read_checkpoint_metadata(dir), got);
  } catch (const InputError& x) {
    err = x.what();
  }
  EXPECT_NE(err.find("slice 'exp_avg' of 'model.layers.1.q.lora_B.weight' holds NaN/Inf (the first at flat index 3"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("rank-0000" + std::to_string(g / n) + "-of-"), std::string::npos) << err;  // the file
  EXPECT_TRUE(all_marker(got));
  load_sharded_checkpoint(comm, read_checkpoint_metadata(dir), got, /*allow_nonfinite=*/true);
  if (g / n == comm.rank()) EXPECT_TRUE(std::isnan(got[1].slices[1].second.data<float>()[g % n]));
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == 0) fs::remove_all(root);
}

}  // namespace
}  // namespace qshard
