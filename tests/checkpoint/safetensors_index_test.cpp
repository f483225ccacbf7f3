// Tests for checkpoint/safetensors_index.h: index JSON round trip and validation, shard planning,
// and SafetensorsFolder over single-file, sharded and broken folders.
#include "checkpoint/safetensors_index.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>

namespace qshard {
namespace {

namespace fs = std::filesystem;

class IndexTempDir {
 public:
  IndexTempDir() {
    std::string tmpl = (fs::temp_directory_path() / "qshard_idx_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~IndexTempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void expect_input_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected InputError, nothing thrown";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InputError, got: " << e.what();
  }
}

Tensor iota_f32(const Shape& shape, float start) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = start + static_cast<float>(i);
  return t;
}

// ---- index JSON ------------------------------------------------------------------------------------

TEST(SafetensorsIndex, RoundTripKeepsOrder) {
  IndexTempDir dir;
  const std::string path = dir.file(kSafetensorsIndexName);
  SafetensorsIndex idx;
  idx.total_size = 123456789012ull;
  idx.weight_map = {{"model.layers.1.w", "model-00002-of-00002.safetensors"},
                    {"lm_head.weight", "model-00001-of-00002.safetensors"},
                    {"model.embed_tokens.weight", "model-00001-of-00002.safetensors"}};
  write_safetensors_index(path, idx);
  const std::string text = read_text(path);
  EXPECT_NE(text.find("{\n  \"metadata\": {\n    \"total_size\": 123456789012\n  },\n  \"weight_map\": {\n    "
                      "\"model.layers.1.w\""),
            std::string::npos)
      << text;
  EXPECT_EQ(text.back(), '\n');
  const SafetensorsIndex back = read_safetensors_index(path);
  EXPECT_EQ(back.total_size, idx.total_size);
  EXPECT_EQ(back.weight_map, idx.weight_map);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);  // no temp left
}

TEST(SafetensorsIndex, AcceptsTransformersExtras) {
  IndexTempDir dir;
  const std::string path = dir.file("i.json");
  write_text(path, R"({"metadata": {"total_parameters": 7, "total_size": 2.8e1}, "weight_map": {"a": "x.safetensors"},
                       "extra": null})");
  const SafetensorsIndex idx = read_safetensors_index(path);
  EXPECT_EQ(idx.total_size, 28u);
  ASSERT_EQ(idx.weight_map.size(), 1u);
  EXPECT_EQ(idx.weight_map[0].second, "x.safetensors");
}

TEST(SafetensorsIndex, RejectsBadIndexes) {
  IndexTempDir dir;
  const std::string path = dir.file("bad.index.json");
  const auto rejected = [&](const std::string& text, std::initializer_list<std::string> parts) {
    write_text(path, text);
    std::vector<std::string> all(parts);
    expect_input_error([&] { read_safetensors_index(path); }, {path});
    for (const std::string& p : all) expect_input_error([&] { read_safetensors_index(path); }, {p});
  };
  rejected("{", {"not valid JSON"});
  rejected("[]", {"expected a JSON object"});
  rejected(R"({"weight_map": {}})", {"\"metadata\"", "missing"});
  rejected(R"({"metadata": {}, "weight_map": {}})", {"total_size"});
  rejected(R"({"metadata": {"total_size": -1}, "weight_map": {}})", {"total_size", "non-negative integer"});
  rejected(R"({"metadata": {"total_size": "12"}, "weight_map": {}})", {"total_size"});
  rejected(R"({"metadata": {"total_size": 1}})", {"missing \"weight_map\""});
  rejected(R"({"metadata": {"total_size": 1}, "weight_map": []})", {"\"weight_map\" must be an object"});
  rejected(R"({"metadata": {"total_size": 1}, "weight_map": {"a.w": 3}})", {"a.w", "file name string"});
  rejected(R"({"metadata": {"total_size": 1}, "weight_map": {"a.w": "../x.safetensors"}})", {"a.w", "../x"});
  rejected(R"({"metadata": {"total_size": 1}, "weight_map": {"a.w": "sub/x.safetensors"}})", {"a.w", "sub/x"});
  rejected(R"({"metadata": {"total_size": 1}, "weight_map": {"a.w": "/abs.safetensors"}})", {"a.w"});
  rejected(R"({"metadata": {"total_size": 1}, "weight_map": {"a.w": ""}})", {"a.w", "plain file name"});
  rejected(R"({"metadata": {"total_size": 1}, "weight_map": {"a.w": "x", "b": "x", "a.w": "y"}})",
           {"duplicate key \"a.w\""});
  expect_input_error([&] { read_safetensors_index(dir.file("missing.json")); }, {dir.file("missing.json")});
}

// ---- shard planning --------------------------------------------------------------------------------

TEST(PlanShards, ExactFitAndBoundaries) {
  // 40 + 60 fills the 100-byte cap exactly; the next tensor starts a new file.
  const ShardPlan p = plan_shards({{"a", 40}, {"b", 60}, {"c", 1}, {"d", 99}, {"e", 1}}, 100);
  ASSERT_EQ(p.files.size(), 3u);
  EXPECT_EQ(p.files[0], "model-00001-of-00003.safetensors");
  EXPECT_EQ(p.files[2], "model-00003-of-00003.safetensors");
  EXPECT_EQ(p.file_of_tensor, (std::vector<size_t>{0, 0, 1, 1, 2}));
}

TEST(PlanShards, TensorBiggerThanCapGetsItsOwnFile) {
  const ShardPlan p = plan_shards({{"a", 10}, {"huge", 500}, {"b", 10}, {"c", 10}, {"huge2", 101}}, 100, "w");
  EXPECT_EQ(p.file_of_tensor, (std::vector<size_t>{0, 1, 2, 2, 3}));
  ASSERT_EQ(p.files.size(), 4u);
  EXPECT_EQ(p.files[1], "w-00002-of-00004.safetensors");
  // The first tensor alone too big: still one file of its own, then the next one.
  const ShardPlan q = plan_shards({{"huge", 500}, {"a", 1}}, 100);
  EXPECT_EQ(q.file_of_tensor, (std::vector<size_t>{0, 1}));
  // Overflow-proof near UINT64_MAX.
  const ShardPlan r = plan_shards({{"a", ~uint64_t{0} - 1}, {"b", 5}}, ~uint64_t{0});
  EXPECT_EQ(r.file_of_tensor, (std::vector<size_t>{0, 1}));
}

TEST(PlanShards, SingleFileNaming) {
  const ShardPlan p = plan_shards({{"a", 40}, {"b", 60}}, 100, "adapter_model");
  EXPECT_EQ(p.files, (std::vector<std::string>{"adapter_model.safetensors"}));
  EXPECT_EQ(p.file_of_tensor, (std::vector<size_t>{0, 0}));
  EXPECT_EQ(plan_shards({}, 100).files, (std::vector<std::string>{"model.safetensors"}));
  EXPECT_THROW(plan_shards({{"a", 1}}, 0), Error);
}

// ---- SafetensorsFolder -----------------------------------------------------------------------------

// Writes `tensors` as a sharded checkpoint in `dir` with the given cap; returns the plan.
ShardPlan write_sharded(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                        uint64_t max_bytes) {
  std::vector<std::pair<std::string, uint64_t>> sizes;
  uint64_t total = 0;
  for (const auto& [n, t] : tensors) {
    sizes.emplace_back(n, t.nbytes());
    total += t.nbytes();
  }
  const ShardPlan plan = plan_shards(sizes, max_bytes);
  SafetensorsIndex idx;
  idx.total_size = total;
  for (size_t f = 0; f < plan.files.size(); ++f) {
    std::vector<std::pair<std::string, Tensor>> part;
    for (size_t i = 0; i < tensors.size(); ++i)
      if (plan.file_of_tensor[i] == f) part.push_back(tensors[i]);
    save_safetensors(dir + "/" + plan.files[f], part, {{"format", "pt"}});
  }
  for (size_t i = 0; i < tensors.size(); ++i) idx.weight_map.emplace_back(tensors[i].first, plan.files[plan.file_of_tensor[i]]);
  if (plan.files.size() > 1) write_safetensors_index(dir + "/" + kSafetensorsIndexName, idx);
  return plan;
}

std::vector<std::pair<std::string, Tensor>> sample_tensors() {
  return {{"embed", iota_f32({4, 4}, 0)},     {"layers.0.w", iota_f32({4, 2}, 100)},
          {"layers.0.b", iota_f32({4}, 200)}, {"layers.1.w", iota_f32({4, 2}, 300)},
          {"head", iota_f32({8, 4}, 400)}};
}

TEST(SafetensorsFolder, ShardedFolder) {
  IndexTempDir dir;
  const auto tensors = sample_tensors();
  const ShardPlan plan = write_sharded(dir.path(), tensors, 64);
  ASSERT_GT(plan.files.size(), 2u);
  const SafetensorsFolder f = SafetensorsFolder::open(dir.path());
  EXPECT_EQ(f.dir(), dir.path());
  EXPECT_EQ(f.files().size(), plan.files.size());
  std::vector<std::string> names;
  for (const auto& [n, t] : tensors) {
    names.push_back(n);
    ASSERT_TRUE(f.contains(n)) << n;
    EXPECT_TRUE(bitwise_equal(f.get(n), t)) << n;
    EXPECT_EQ(f.bytes(n).size(), t.nbytes());
    EXPECT_EQ(f.find(n)->shape, t.shape());
  }
  EXPECT_EQ(f.names(), names);
  EXPECT_FALSE(f.contains("missing"));
  expect_input_error([&] { f.get("missing"); }, {dir.path(), "missing"});
}

TEST(SafetensorsFolder, SingleFileAndOpenFile) {
  IndexTempDir dir;
  const auto tensors = sample_tensors();
  const ShardPlan plan = write_sharded(dir.path(), tensors, 1 << 20);
  ASSERT_EQ(plan.files, (std::vector<std::string>{"model.safetensors"}));
  const SafetensorsFolder f = SafetensorsFolder::open(dir.path());
  EXPECT_EQ(f.names().size(), tensors.size());
  EXPECT_TRUE(bitwise_equal(f.get("head"), tensors[4].second));

  IndexTempDir adapter;
  save_safetensors(adapter.file("adapter_model.safetensors"), {{"lora_A", iota_f32({2, 4}, 1)}});
  expect_input_error([&] { SafetensorsFolder::open(adapter.path()); },
                     {adapter.path(), "model.safetensors.index.json", "adapter_model.safetensors", "open_file"});
  const SafetensorsFolder a = SafetensorsFolder::open_file(adapter.file("adapter_model.safetensors"));
  EXPECT_EQ(a.dir(), adapter.path());
  EXPECT_EQ(a.get("lora_A").to_f32_vector()[7], 8.f);
}

TEST(SafetensorsFolder, MissingShardOrTensor) {
  IndexTempDir dir;
  const ShardPlan plan = write_sharded(dir.path(), sample_tensors(), 64);
  const std::string index = dir.file(kSafetensorsIndexName);
  // A tensor listed in the index but absent from its shard.
  SafetensorsIndex idx = read_safetensors_index(index);
  idx.weight_map.emplace_back("ghost", plan.files[0]);
  write_safetensors_index(index, idx);
  expect_input_error([&] { SafetensorsFolder::open(dir.path()); }, {index, "\"ghost\"", plan.files[0]});
  // A shard file missing altogether.
  idx.weight_map.pop_back();
  write_safetensors_index(index, idx);
  fs::remove(dir.file(plan.files[1]));
  expect_input_error([&] { SafetensorsFolder::open(dir.path()); }, {index, plan.files[1], "missing"});
  // Neither file.
  IndexTempDir empty;
  expect_input_error([&] { SafetensorsFolder::open(empty.path()); }, {empty.path(), "neither"});
  expect_input_error([&] { SafetensorsFolder::open(empty.file("nodir")); }, {empty.file("nodir"), "not a directory"});
}

}  // namespace
}  // namespace qshard
