// json_record_reader.h: the JSON records of one input file (`qshard tokenize`'s JSON formats), read
// one record at a time whatever the file's size, each with the place it came from.
//
// What: JsonRecordReader reads `path` through a RecordReader (text/record_reader.h) and hands out
// its records, JSON objects with their keys in file order:
//   JSON Lines (any name but *.json): one object per non-empty line (a line of only spaces, tabs and
//     '\r' is skipped); where = "<path>:<line>".
//   *.json: the first non-blank byte decides (after a UTF-8 byte order mark, which is skipped).
//     '['  one top-level array of records, read element by element: the bytes are scanned with the
//          string / escape state and the bracket depth to cut each element, which alone is parsed.
//          where = "<path>:<line> (element <i>)": the line the element starts on, i 0-based (as
//          Python's data[i]). An array that ends before its ']' (a truncated file), a ',' with no
//          element after it, or anything but whitespace after the ']' is an InputError.
//     '{'  objects one after another, separated by whitespace: one object (pretty-printed or not) is
//          one record; JSON Lines named .json read the same. where = "<path>:<line>".
//     anything else is an InputError naming the file, the line and the byte.
// Limits: a record (a line, an element, an object) longer than max_record_bytes is an InputError
// (record_limit_error: "<where>: a record longer than ...") raised once that many of its bytes are
// held, so memory stays below max_record_bytes + RecordReader::kChunkBytes: a many-GB array is
// read element by element, and an oversized element is refused before the rest is read.
// A record that is not a JSON object, or not valid JSON (nesting bounded by kMaxJsonDepth:
// runtime/input_file.h), is an InputError naming where.
// Ownership: the reader owns its file. Thread safety: one thread per reader.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "text/record_reader.h"

namespace qshard {

class JsonRecordReader {
 public:
  // `limit_name` names the limit in messages (the tokenize command's flag). REQUIRES: max_record_bytes > 0.
  JsonRecordReader(const std::string& path, int64_t max_record_bytes, const std::string& limit_name);

  // The next record into `record` and its place into `where`; false at the end of the file.
  bool next(nlohmann::ordered_json& record, std::string& where);

  // Bytes of the file scanned so far (a test hook: an oversized element is refused after about
  // max_record_bytes of it, not after reading the whole file).
  int64_t bytes_scanned() const { return scanned_; }

 private:
  enum class Layout : uint8_t { kLines, kUnknown, kArray, kObjects, kEnd };

  int peek();  // the next byte (0..255) or -1 at the end, not consumed
  int get();   // the same, consumed (counting lines)
  void skip_blank();
  // Cuts the next value's bytes into text_ (a container up to its matching bracket, a scalar up to
  // whitespace, ',' or ']'); the value's first line is value_line_.
  void cut_value(const std::string& where);
  bool next_array_element(std::string& where);
  [[noreturn]] void truncated(const std::string& what) const;

  RecordReader reader_;
  std::string path_, limit_name_;
  int64_t max_bytes_;
  Layout layout_;
  std::string_view chunk_;  // the piece of the file being scanned (.json)
  size_t at_ = 0;
  int64_t line_ = 1, value_line_ = 1, index_ = 0, scanned_ = 0;
  std::string text_;  // the current record's bytes
};

}  // namespace qshard
