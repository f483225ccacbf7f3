// The TensorBoard event file, byte by byte: CRC-32C on the RFC 3720 vectors, varints, the Event
// messages against bytes derived by hand from event.proto / summary.proto (and equal to what
// tensorboard 2.21's event_pb2 serializes for the same messages), TFRecord framing, and the writer's
// files read back by the tests' own reader (tf_event_reader.h): names, file_version, the START
// record, the scalars of MetricsLogger's JSONL lines, a second writer in the same folder.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "train/crc32c.h"
#include "train/metrics.h"
#include "train/tensorboard_writer.h"
#include "train/tf_event.h"
#include "train/tf_event_reader.h"

namespace qshard {
namespace {

using testing_util::read_bytes;
using testing_util::TempDir;

std::string hex(const std::string& s) {
  std::string out;
  for (const unsigned char c : s) out += fmt::format("{}{:02X}", out.empty() ? "" : " ", c);
  return out;
}

TEST(Crc32c, KnownVectors) {
  // RFC 3720 (iSCSI) B.4 and the common check value of "123456789".
  EXPECT_EQ(crc32c(std::string_view("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string up, down;
  for (int i = 0; i < 32; ++i) up += static_cast<char>(i), down += static_cast<char>(31 - i);
  EXPECT_EQ(crc32c(up), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down), 0x113FDB5Cu);
  EXPECT_EQ(crc32c(std::string_view()), 0u);
  // Not zlib's CRC-32 ("123456789" -> 0xCBF43926 there).
  EXPECT_NE(crc32c(std::string_view("123456789")), 0xCBF43926u);
  // Incremental == whole, and the table agrees with the bit-by-bit reference on random bytes.
  std::mt19937 rng(3);
  std::string r(1000, '\0');
  for (char& c : r) c = static_cast<char>(rng());
  const auto* p = reinterpret_cast<const uint8_t*>(r.data());
  EXPECT_EQ(crc32c_update(crc32c({p, 333}), {p + 333, 667}), crc32c(r));
  EXPECT_EQ(crc32c(r), tb_test::crc32c_bitwise(p, r.size()));
  // Masking: ((c >> 15) | (c << 17)) + 0xA282EAD8, worked by hand for 0xE3069283:
  // 0x0001C60D | 0x25060000 = 0x2507C60D, + 0xA282EAD8 = 0xC78AB0E5.
  EXPECT_EQ(masked_crc32c(0xE3069283u), 0xC78AB0E5u);
  EXPECT_EQ(unmasked_crc32c(masked_crc32c(0xDEADBEEFu)), 0xDEADBEEFu);
}

TEST(TfEvent, Varints) {
  auto v = [](uint64_t x) {
    std::string s;
    put_varint(s, x);
    return hex(s);
  };
  EXPECT_EQ(v(0), "00");
  EXPECT_EQ(v(1), "01");
  EXPECT_EQ(v(127), "7F");
  EXPECT_EQ(v(128), "80 01");
  EXPECT_EQ(v(300), "AC 02");
  EXPECT_EQ(v(uint64_t{1} << 35), "80 80 80 80 80 01");
  EXPECT_EQ(v(static_cast<uint64_t>(int64_t{-1})), "FF FF FF FF FF FF FF FF FF 01");  // 10 bytes
  std::string k;
  put_key(k, 5, WireType::kLengthDelimited);  // 5 << 3 | 2
  put_key(k, 16, WireType::kVarint);          // 16 << 3 = 128: two bytes
  EXPECT_EQ(hex(k), "2A 80 01");
}

// Each vector: fields in number order, key byte = field << 3 | wire type; doubles and floats
// little-endian (1.5 = 0x3FF8000000000000, 2.0 = 0x4000..., 3.0 = 0x4008..., 1.0f = 0x3F800000,
// -2.5f = 0xC0200000). tensorboard 2.21's event_pb2 serializes the same messages to the same bytes.
TEST(TfEvent, EventBytes) {
  EXPECT_EQ(hex(file_version_event(1.5)),
            "09 00 00 00 00 00 00 F8 3F "               // 1 wall_time 1.5
            "1A 0D 62 72 61 69 6E 2E 45 76 65 6E 74 3A 32");  // 3 file_version "brain.Event:2"
  EXPECT_EQ(hex(scalars_event(2.0, 300, {{"loss", 1.0f}})),
            "09 00 00 00 00 00 00 00 40 "  // 1 wall_time 2.0
            "10 AC 02 "                    // 2 step 300
            "2A 0D "                       // 5 summary, 13 bytes
            "0A 0B "                       //   1 value, 11 bytes
            "0A 04 6C 6F 73 73 "           //     1 tag "loss"
            "15 00 00 80 3F");             //     2 simple_value 1.0f
  // Two values; a 0 simple_value is still written (a oneof member).
  EXPECT_EQ(hex(scalars_event(2.0, 300, {{"loss", 1.0f}, {"lr", 0.0f}})),
            "09 00 00 00 00 00 00 00 40 10 AC 02 2A 18 0A 0B 0A 04 6C 6F 73 73 15 00 00 80 3F "
            "0A 09 0A 02 6C 72 15 00 00 00 00");
  EXPECT_EQ(hex(session_start_event(3.0, 11)),
            "09 00 00 00 00 00 00 08 40 "  // 1 wall_time 3.0
            "10 0B "                       // 2 step 11
            "3A 02 08 01");                // 7 session_log { 1 status START }
  // wall_time 0 is left out (proto3); a negative step is a 10-byte varint.
  EXPECT_EQ(hex(scalars_event(0.0, -1, {{"x", -2.5f}})),
            "10 FF FF FF FF FF FF FF FF FF 01 2A 0A 0A 08 0A 01 78 15 00 00 20 C0");
}

TEST(TfEvent, TfRecordFraming) {
  const std::string data = file_version_event(1.5);
  const std::string r = tfrecord(data);
  // The bytes tensorboard 2.21's RecordWriter writes for the same event.
  EXPECT_EQ(hex(r),
            "18 00 00 00 00 00 00 00 "  // length 24, uint64 LE
            "A3 7F 4B 22 "              // masked CRC-32C of those 8 bytes
            "09 00 00 00 00 00 00 F8 3F 1A 0D 62 72 61 69 6E 2E 45 76 65 6E 74 3A 32 "
            "2A 28 64 6C");             // masked CRC-32C of the data
  const auto* p = reinterpret_cast<const uint8_t*>(r.data());
  EXPECT_EQ(tb_test::read_le(r, 8, 4), tb_test::mask(tb_test::crc32c_bitwise(p, 8)));
  EXPECT_EQ(tb_test::read_le(r, 12 + data.size(), 4), tb_test::mask(tb_test::crc32c_bitwise(p + 12, data.size())));
}

TEST(TensorBoardWriter, FileNameRecordsAndScalars) {
  TempDir dir;
  const std::string tb = dir.file("tb/run");  // parents are created
  std::string path;
  {
    TensorBoardWriter w(tb, 1);
    path = w.path();
    w.write_scalars(1, 1700000000.25, {{"loss", 3.5f}, {"lr", 2e-4f}});
    // Flushed at once: a reader sees the record while the writer is still open.
    EXPECT_EQ(tb_test::read_event_file(path).size(), 3u);
    w.write_scalars(2, 1700000001.5, {{"loss", 3.25f}, {"eval_loss", NAN}});
  }
  const std::string name = std::filesystem::path(path).filename().string();
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_NE(name.find(fmt::format(".{}.{}.qshard", host, ::getpid())), std::string::npos) << name;
  const auto ev = tb_test::read_event_file(path);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].file_version, "brain.Event:2");
  EXPECT_GT(ev[0].wall_time, 1.6e9);
  EXPECT_EQ(ev[1].session_status, 1u);
  EXPECT_EQ(ev[1].step, 1);
  EXPECT_EQ(ev[2].step, 1);
  EXPECT_EQ(ev[2].wall_time, 1700000000.25);
  ASSERT_EQ(ev[2].scalars.size(), 2u);
  EXPECT_EQ(ev[2].scalars[0], std::make_pair(std::string("loss"), 3.5f));
  EXPECT_EQ(ev[2].scalars[1], std::make_pair(std::string("lr"), 2e-4f));
  EXPECT_EQ(ev[3].step, 2);
  EXPECT_TRUE(std::isnan(ev[3].scalars[1].second));
  EXPECT_EQ(tensorboard_file_name(17, "h.x", 42), "events.out.tfevents.17.h.x.42.qshard");
}

// A resumed run: a new file after the first in name order (even within the same second), whose
// START drops the first file's steps from the resume point on; nothing is deleted.
TEST(TensorBoardWriter, ResumeWritesANewFileThatSupersedesLaterSteps) {
  TempDir dir;
  const std::string tb = dir.file("tb");
  std::filesystem::create_directories(tb);
  // An earlier file stamped far in the future: the new file's name must still sort after it.
  const std::string future = tb + "/" + tensorboard_file_name(4000000000, "other", 1);
  {
    TensorBoardWriter w(tb, 1);
    for (int s = 1; s <= 6; ++s) w.write_scalars(s, 1e9 + s, {{"loss", static_cast<float>(s)}});
    std::filesystem::rename(w.path(), future);
  }
  std::string second;
  {
    TensorBoardWriter w(tb, 5);  // resumed from the checkpoint of step 4
    second = w.path();
    for (int s = 5; s <= 8; ++s) w.write_scalars(s, 2e9 + s, {{"loss", 10.0f * s}});
  }
  EXPECT_NE(second.find("events.out.tfevents.4000000001."), std::string::npos) << second;
  const auto files = tb_test::event_files(tb);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0], future);
  EXPECT_EQ(files[1], second);
  EXPECT_EQ(tb_test::read_event_file(future).size(), 8u);  // untouched
  const tb_test::DirScalars d = tb_test::read_event_dir(tb);
  EXPECT_EQ(d.duplicates, 0);
  const std::map<int64_t, float> want = {{1, 1.f}, {2, 2.f}, {3, 3.f}, {4, 4.f}, {5, 50.f}, {6, 60.f}, {7, 70.f}, {8, 80.f}};
  EXPECT_EQ(d.series.at("loss"), want);
}

TEST(TensorBoardWriter, UnwritableFolderNamed) {
  TempDir dir;
  testing_util::write_bytes(dir.file("file"), "x");
  const std::string msg = testing_util::error_of([&] { TensorBoardWriter w(dir.file("file"), 1); });
  EXPECT_NE(msg.find("logging.tensorboard_dir = " + dir.file("file")), std::string::npos) << msg;
}

// MetricsLogger: every JSONL line's numbers (all keys but "step") at the line's step, as floats.
TEST(TensorBoardWriter, MetricsLoggerWritesTheJsonlScalars) {
  TempDir dir;
  std::string tb_path;
  {
    MetricsLogger log(dir.file("m.jsonl"), 10, false, nullptr);
    tb_path = log.open_tensorboard(dir.file("tb"), 1);
    StepMetrics m;
    m.step = 1;
    m.loss = 4.125;
    m.lr = 3e-4;
    m.grad_norm = 1.75;
    m.tokens_per_s = 1234.5;
    m.step_time_s = 0.5;
    m.peak_mem_bytes = 123456789;
    log.log(m);
    m.step = 2;
    m.loss = NAN;  // null in the JSONL, NaN in TensorBoard
    m.eval_loss = 3.5;
    m.mfu = 0.25;
    log.log(m);
  }
  std::ifstream in(dir.file("m.jsonl"));
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 2u);
  const auto ev = tb_test::read_event_file(tb_path);
  ASSERT_EQ(ev.size(), 4u);
  for (size_t i = 0; i < 2; ++i) {
    const auto& e = ev[2 + i];
    EXPECT_EQ(e.step, lines[i]["step"].get<int64_t>());
    ASSERT_EQ(e.scalars.size(), lines[i].size() - 1) << "every key but step";
    for (const auto& [tag, value] : e.scalars) {
      ASSERT_TRUE(lines[i].contains(tag)) << tag;
      if (lines[i][tag].is_null()) {
        EXPECT_TRUE(std::isnan(value)) << tag;
      } else {
        EXPECT_EQ(value, lines[i][tag].get<float>()) << tag;
      }
    }
  }
  EXPECT_EQ(ev[3].scalars[1].first, "eval_loss");
  EXPECT_EQ(ev[3].scalars[1].second, 3.5f);
  EXPECT_EQ(tensorboard_scalars(R"({"step":3,"loss":null,"lr":0.5})").size(), 2u);
}

}  // namespace
}  // namespace qshard
