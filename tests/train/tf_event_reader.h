// tf_event_reader.h (tests): a minimal TensorBoard event-file reader of the tests' own, written
// from the format (tensorboard/compat/proto/event.proto + summary.proto, TFRecord framing) and
// sharing no code with the writer (src/train/tf_event.h): its CRC-32C is bit by bit, its protobuf
// decoder a generic field walker.
//
// read_event_file: every record of one file, each length and data CRC checked (std::runtime_error
// naming the file and the record on a mismatch, a short record or bad protobuf).
// read_event_dir:  the scalars of a folder as TensorBoard sees them: the files whose names hold
// "tfevents", in name order; a SessionLog START at step s drops the scalars read so far at steps
// >= s (TensorBoard's purge for file_version 2); `duplicates` counts a (tag, step) seen again
// without such a purge in between.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace qshard::tb_test {

inline uint32_t crc32c_bitwise(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}
inline uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

inline uint64_t read_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(s[at + i])} << (8 * i);
  return v;
}

// One protobuf field: number, wire type and its payload (varint value, fixed bits, or bytes).
struct PbField {
  uint32_t number = 0;
  int wire = 0;
  uint64_t num = 0;
  std::string bytes;
};

inline std::vector<PbField> parse_message(const std::string& m) {
  std::vector<PbField> out;
  size_t i = 0;
  auto varint = [&]() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (i >= m.size() || shift > 63) throw std::runtime_error("bad varint");
      const uint8_t b = static_cast<uint8_t>(m[i++]);
      v |= uint64_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (i < m.size()) {
    const uint64_t key = varint();
    PbField f;
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire = static_cast<int>(key & 7);
    if (f.wire == 0) {
      f.num = varint();
    } else if (f.wire == 1 || f.wire == 5) {
      const int n = f.wire == 1 ? 8 : 4;
      if (i + n > m.size()) throw std::runtime_error("short fixed field");
      f.num = read_le(m, i, n);
      i += n;
    } else if (f.wire == 2) {
      const uint64_t n = varint();
      if (n > m.size() - i) throw std::runtime_error("short length-delimited field");
      f.bytes = m.substr(i, n);
      i += n;
    } else {
      throw std::runtime_error("unexpected wire type " + std::to_string(f.wire));
    }
    out.push_back(std::move(f));
  }
  return out;
}

struct DecodedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::optional<std::string> file_version;
  std::optional<uint64_t> session_status;  // SessionLog.status (START = 1)
  bool has_summary = false;
  std::vector<std::pair<std::string, float>> scalars;  // Summary.Value tag, simple_value
};

inline DecodedEvent decode_event(const std::string& data) {
  DecodedEvent e;
  for (const PbField& f : parse_message(data)) {
    if (f.number == 1 && f.wire == 1) {
      std::memcpy(&e.wall_time, &f.num, 8);
    } else if (f.number == 2 && f.wire == 0) {
      e.step = static_cast<int64_t>(f.num);
    } else if (f.number == 3 && f.wire == 2) {
      e.file_version = f.bytes;
    } else if (f.number == 5 && f.wire == 2) {
      e.has_summary = true;
      for (const PbField& v : parse_message(f.bytes)) {
        if (v.number != 1 || v.wire != 2) throw std::runtime_error("Summary: unexpected field");
        std::pair<std::string, float> s;
        bool has_value = false;
        for (const PbField& x : parse_message(v.bytes)) {
          if (x.number == 1 && x.wire == 2) s.first = x.bytes;
          else if (x.number == 2 && x.wire == 5) {
            const auto bits = static_cast<uint32_t>(x.num);
            std::memcpy(&s.second, &bits, 4);
            has_value = true;
          } else throw std::runtime_error("Summary.Value: unexpected field " + std::to_string(x.number));
        }
        if (!has_value) throw std::runtime_error("Summary.Value without simple_value");
        e.scalars.push_back(s);
      }
    } else if (f.number == 7 && f.wire == 2) {
      e.session_status = 0;
      for (const PbField& x : parse_message(f.bytes))
        if (x.number == 1 && x.wire == 0) e.session_status = x.num;
    } else {
      throw std::runtime_error("Event: unexpected field " + std::to_string(f.number));
    }
  }
  return e;
}

inline std::vector<DecodedEvent> read_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string s((std::istreambuf_iterator<char>(in)), {});
  std::vector<DecodedEvent> out;
  size_t at = 0;
  while (at < s.size()) {
    const std::string where = path + ": record " + std::to_string(out.size()) + " at byte " + std::to_string(at);
    if (s.size() - at < 12) throw std::runtime_error(where + ": short header");
    const uint64_t n = read_le(s, at, 8);
    const auto* p = reinterpret_cast<const uint8_t*>(s.data());
    if (read_le(s, at + 8, 4) != mask(crc32c_bitwise(p + at, 8))) throw std::runtime_error(where + ": length CRC");
    if (s.size() - at - 12 < n + 4) throw std::runtime_error(where + ": short data");
    if (read_le(s, at + 12 + n, 4) != mask(crc32c_bitwise(p + at + 12, n))) throw std::runtime_error(where + ": data CRC");
    out.push_back(decode_event(s.substr(at + 12, n)));
    at += 12 + n + 4;
  }
  return out;
}

inline std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find("tfevents") != std::string::npos) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

struct DirScalars {
  std::map<std::string, std::map<int64_t, float>> series;  // tag -> step -> value
  int duplicates = 0;
};

inline DirScalars read_event_dir(const std::string& dir) {
  DirScalars d;
  for (const std::string& file : event_files(dir)) {
    for (const DecodedEvent& e : read_event_file(file)) {
      if (e.session_status == 1u)
        for (auto& [tag, points] : d.series) points.erase(points.lower_bound(e.step), points.end());
      for (const auto& [tag, value] : e.scalars)
        if (!d.series[tag].emplace(e.step, value).second) ++d.duplicates;
    }
  }
  return d;
}

}  // namespace qshard::tb_test
