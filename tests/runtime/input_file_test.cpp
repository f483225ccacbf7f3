// Hostile inputs refused up front (runtime/input_file.h): a folder, a FIFO (without blocking), a
// device (/dev/zero), a file past the size limit, JSON nested past kMaxJsonDepth (without a stack
// overflow), and the ordinary case.
#include "runtime/input_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/error.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;

struct Dir {
  fs::path p = fs::temp_directory_path() / ("qshard_input_file_" + std::to_string(::getpid()));
  Dir() { fs::create_directories(p); }
  ~Dir() { fs::remove_all(p); }
  std::string file(const std::string& name) const { return (p / name).string(); }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

TEST(InputFile, RefusesWhatIsNotARegularFile) {
  Dir d;
  EXPECT_NE(error_of([&] { read_input_file(d.p.string(), "config file"); }).find("is a folder"), std::string::npos);
  const std::string fifo = d.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string e = error_of([&] { read_input_file(fifo, "config file"); });  // returns: never opened
  EXPECT_NE(e.find("config file " + fifo + " is a FIFO"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { read_input_file("/dev/zero", "input file"); }).find("/dev/zero is a character device"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_input_file(d.file("missing"), "config file"); }).find("cannot open config file"),
            std::string::npos);
}

TEST(InputFile, FolderRolesRefuseFilesFifosAndDevices) {
  Dir d;
  EXPECT_NO_THROW(check_input_folder(d.p.string(), "model folder"));
  const std::string f = d.file("config.json");
  std::ofstream(f) << "{}";
  EXPECT_NE(error_of([&] { check_input_folder(f, "model folder"); }).find("model folder " + f + " is a regular file, not a folder"),
            std::string::npos);
  const std::string fifo = d.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(error_of([&] { check_input_folder(fifo, "checkpoint"); }).find("checkpoint " + fifo + " is a FIFO (named pipe), not a folder"),
            std::string::npos);
  const std::string zero = d.file("zero");
  ASSERT_EQ(::symlink("/dev/zero", zero.c_str()), 0);  // a link named like the folder, to a device
  EXPECT_NE(error_of([&] { check_input_folder(zero, "adapter folder"); }).find(zero + " is a character device, not a folder"),
            std::string::npos);
  EXPECT_NE(error_of([&] { check_input_file(zero, "token file"); }).find(zero + " is a character device, not a regular file"),
            std::string::npos);
  EXPECT_NE(error_of([&] { check_input_folder(d.file("missing"), "model folder"); }).find("cannot open model folder"),
            std::string::npos);
}

TEST(InputFile, SizeLimitAndOrdinaryRead) {
  Dir d;
  const std::string f = d.file("x.json");
  std::ofstream(f) << "{\"a\": [1, 2, {\"b\": null}]}";
  EXPECT_EQ(read_input_file(f, "config"), "{\"a\": [1, 2, {\"b\": null}]}");
  EXPECT_NE(error_of([&] { read_input_file(f, "config", 5); }).find("more than the 5 bytes"), std::string::npos);
  EXPECT_EQ(parse_json_input(read_input_file(f, "config"), f)["a"][2].contains("b"), true);
}

TEST(InputFile, DeepJsonIsRefusedByName) {
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  const std::string e = error_of([&] { parse_json_input(deep, "x/config.json"); });
  EXPECT_NE(e.find("x/config.json: JSON nested more than"), std::string::npos) << e;
  // At the limit it parses.
  std::string ok(kMaxJsonDepth - 1, '[');
  ok += std::string(kMaxJsonDepth - 1, ']');
  EXPECT_NO_THROW(parse_json_input(ok, "ok"));
  EXPECT_NE(error_of([&] { parse_json_input("{\"a\": ", "y.json"); }).find("y.json: not valid JSON"), std::string::npos);
}

// A key twice in one object (nlohmann kept the last in silence) is refused by its path, at any
// depth, in both parses; the same key in sibling objects or in nested ones is not a duplicate.
TEST(InputFile, DuplicateJsonKeysAreRefusedByPath) {
  const char* suffix = "\" in a JSON object (which of the two values counts would be a guess)";
  EXPECT_EQ(error_of([] { parse_json_input(R"({"a": 1, "a": 2})", "c.json"); }),
            std::string("c.json: duplicate key \"a") + suffix);
  EXPECT_EQ(error_of([] {
              parse_ordered_json_input(R"({"messages": [{"role": "user", "content": "x"},
                                          {"role": "assistant", "role": "user", "content": "y"}]})", "d.jsonl:3");
            }),
            std::string("d.jsonl:3: duplicate key \"messages[1].role") + suffix);
  EXPECT_EQ(error_of([] { parse_json_input(R"([1, [2, {}], {"x": {"y": [0, 0, {"z": 1, "z": 1}]}}])", "e.json"); }),
            std::string("e.json: duplicate key \"[2].x.y[2].z") + suffix);
  EXPECT_EQ(error_of([] { parse_ordered_json_input(R"({"messages": [], "text": "t", "messages": []})", "f.jsonl:1"); }),
            std::string("f.jsonl:1: duplicate key \"messages") + suffix);
  const nlohmann::json ok = parse_json_input(R"({"a": {"a": 1, "b": {"a": 2}}, "b": [{"a": 3}, {"a": 4}], "c": {}})", "ok");
  EXPECT_EQ(ok["b"][1]["a"], 4);
  EXPECT_EQ(ok["a"]["b"]["a"], 2);
}

}  // namespace
}  // namespace qshard
