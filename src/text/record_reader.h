// record_reader.h: a user's text / JSONL file read in bounded pieces, line by line or chunk by chunk
// (the records of `qshard tokenize`), so that no record longer than a limit is ever held whole.
//
// What: RecordReader opens `path` through check_input_file (runtime/input_file.h: a folder, FIFO,
// socket or device is refused by name before it is opened) and reads it kChunkBytes at a time.
//   next_line: the next line, without its '\n' ('\r' kept; a last line without '\n' counts). A
//     line longer than max_record_bytes is an InputError "<path>:<line>: a record longer than
//     <max> bytes (<limit_name>) ..." raised once max_record_bytes + 1 of its bytes are held, so
//     memory stays below max_record_bytes + kChunkBytes whatever the file holds (a 2 GB line is
//     refused after reading the limit, never read whole).
//   next_chunk: the next piece of at most kChunkBytes of the file as it is, for a reader that
//     streams (the byte tokenizer's whole-file documents); no limit applies.
// Do not mix the two on one reader.
// record_limit_error: the message both use, for a record of several lines (a paragraph) too.
// Ownership: the reader owns its descriptor. Thread safety: one thread per reader.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace qshard {

class RecordReader {
 public:
  static constexpr size_t kChunkBytes = size_t{1} << 20;

  // `what` names the file's role in messages ("input file"); `limit_name` the limit's key or flag.
  // REQUIRES: max_record_bytes > 0.
  RecordReader(std::string path, const std::string& what, int64_t max_record_bytes, std::string limit_name);
  ~RecordReader();
  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;

  // The next line into `line` (replacing it); false at the end of the file.
  bool next_line(std::string& line);
  // The next piece of the file (valid until the next call); false at the end of the file.
  bool next_chunk(std::string_view& piece);

  // 1-based number of the line next_line() last returned.
  int64_t line_no() const { return line_no_; }
  const std::string& path() const { return path_; }

 private:
  bool fill();  // reads the next piece into buf_; false at the end of the file

  std::string path_, limit_name_;
  int64_t max_record_bytes_;
  int fd_ = -1;
  std::string buf_;  // the piece read last; [pos_, size) not yet handed out
  size_t pos_ = 0;
  int64_t line_no_ = 0;
};

// "<where>: a record longer than <max> bytes (<limit_name>): refused before it is read whole;
// split it or raise <limit_name>".
std::string record_limit_error(const std::string& where, int64_t max_record_bytes, const std::string& limit_name);

}  // namespace qshard
