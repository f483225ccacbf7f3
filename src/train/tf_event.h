// tf_event.h: the bytes of a TensorBoard event file, encoded by hand (no protobuf library): the
// few `tensorboard.Event` messages qshard writes, each framed as one TFRecord.
//
// Messages (field numbers of tensorboard/compat/proto/event.proto and summary.proto, the same as
// TensorFlow's tensorflow/core/util/event.proto and core/framework/summary.proto):
//   Event          1 wall_time    double  (wire type 1: 8 bytes little-endian)  seconds since 1970
//                  2 step         int64   (wire type 0: varint)
//                  oneof: 3 file_version  string (wire type 2)  "brain.Event:2" in the first record
//                         5 summary       Summary (wire type 2)
//                         7 session_log   SessionLog (wire type 2)
//   Summary        1 value        repeated Summary.Value
//   Summary.Value  1 tag          string
//                  2 simple_value float   (wire type 5: 4 bytes little-endian)  a scalar
//   SessionLog     1 status       enum (varint): START = 1
// As a proto3 serializer does, a zero wall_time or step is left out (it reads back as 0); a
// simple_value is in a oneof, so it is always written, 0 included. Fields are written in field
// number order. A negative int64 is a 10-byte varint (two's complement), as protobuf writes it.
//
// TFRecord framing (one record per Event):
//   uint64 length (little-endian) | uint32 masked_crc32c(the 8 length bytes) | data[length] |
//   uint32 masked_crc32c(data)
// with masked_crc32c from train/crc32c.h. A file is a sequence of records with nothing between.
//
// Example: the file_version event at wall_time 1.5, step 0 is 24 bytes:
//   09 00 00 00 00 00 00 F8 3F   field 1 (wall_time), fixed64 1.5
//   1A 0D "brain.Event:2"        field 3 (file_version), 13 bytes
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qshard {

inline constexpr std::string_view kTfEventFileVersion = "brain.Event:2";

// One scalar of a Summary: `tag` (a series in TensorBoard) and its value at the event's step.
struct TfScalar {
  std::string tag;
  float value = 0;
};

// ---- protobuf wire format ----
enum class WireType : uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };
// Base-128 varint, low 7 bits first, the high bit set on every byte but the last.
void put_varint(std::string& out, uint64_t v);
// The field key: varint (field << 3 | wire type).
void put_key(std::string& out, uint32_t field, WireType type);
void put_double_field(std::string& out, uint32_t field, double v);                 // key + 8 bytes LE
void put_float_field(std::string& out, uint32_t field, float v);                   // key + 4 bytes LE
void put_varint_field(std::string& out, uint32_t field, uint64_t v);               // key + varint
void put_bytes_field(std::string& out, uint32_t field, std::string_view bytes);    // key + length + bytes

// ---- Event messages (serialized, without framing) ----
std::string file_version_event(double wall_time, std::string_view version = kTfEventFileVersion);
std::string scalars_event(double wall_time, int64_t step, const std::vector<TfScalar>& scalars);
// SessionLog START at `step`: TensorBoard (its event accumulator, for files of version 2) drops the
// events it read earlier whose step is >= `step`: those of a run that went on past the checkpoint
// a resumed run restarts from.
std::string session_start_event(double wall_time, int64_t step);

// ---- TFRecord ----
// `data` framed as one record (length, masked CRCs), ready to append to the file.
std::string tfrecord(std::string_view data);

}  // namespace qshard
