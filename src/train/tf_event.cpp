#include "train/tf_event.h"

#include <bit>
#include <cstring>

#include "train/crc32c.h"

namespace qshard {
namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// Event field numbers (event.proto).
constexpr uint32_t kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5, kSessionLog = 7;
// Summary.value = 1; Summary.Value.tag = 1, simple_value = 2; SessionLog.status = 1 (START = 1).
constexpr uint32_t kSummaryValue = 1, kValueTag = 1, kValueSimple = 2, kSessionStatus = 1;
constexpr uint64_t kSessionStart = 1;

// wall_time and step, each left out when 0 (proto3: a double when all its bits are 0).
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  if (std::bit_cast<uint64_t>(wall_time) != 0) put_double_field(e, kWallTime, wall_time);
  if (step != 0) put_varint_field(e, kStep, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (uint64_t{field} << 3) | static_cast<uint64_t>(type));
}

void put_double_field(std::string& out, uint32_t field, double v) {
  put_key(out, field, WireType::kFixed64);
  put_le(out, std::bit_cast<uint64_t>(v), 8);
}

void put_float_field(std::string& out, uint32_t field, float v) {
  put_key(out, field, WireType::kFixed32);
  put_le(out, std::bit_cast<uint32_t>(v), 4);
}

void put_varint_field(std::string& out, uint32_t field, uint64_t v) {
  put_key(out, field, WireType::kVarint);
  put_varint(out, v);
}

void put_bytes_field(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, WireType::kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

std::string file_version_event(double wall_time, std::string_view version) {
  std::string e = event_head(wall_time, 0);
  put_bytes_field(e, kFileVersion, version);
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<TfScalar>& scalars) {
  std::string summary;
  for (const TfScalar& s : scalars) {
    std::string value;
    if (!s.tag.empty()) put_bytes_field(value, kValueTag, s.tag);
    put_float_field(value, kValueSimple, s.value);
    put_bytes_field(summary, kSummaryValue, value);
  }
  std::string e = event_head(wall_time, step);
  put_bytes_field(e, kSummary, summary);
  return e;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string log;
  put_varint_field(log, kSessionStatus, kSessionStart);
  std::string e = event_head(wall_time, step);
  put_bytes_field(e, kSessionLog, log);
  return e;
}

std::string tfrecord(std::string_view data) {
  std::string r;
  r.reserve(data.size() + 16);
  put_le(r, data.size(), 8);
  put_le(r, masked_crc32c(crc32c(std::string_view(r.data(), 8))), 4);
  r.append(data);
  put_le(r, masked_crc32c(crc32c(data)), 4);
  return r;
}

}  // namespace qshard
