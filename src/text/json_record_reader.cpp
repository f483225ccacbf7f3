#include "text/json_record_reader.h"

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/input_file.h"

namespace qshard {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_space(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool is_blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

// A byte for a message: printable ASCII as itself, anything else as hex.
std::string show_byte(int c) {
  if (c >= 0x20 && c < 0x7f) return fmt::format("'{}'", static_cast<char>(c));
  return fmt::format("byte 0x{:02x}", c);
}

}  // namespace

JsonRecordReader::JsonRecordReader(const std::string& path, int64_t max_record_bytes, const std::string& limit_name)
    : reader_(path, "input file", max_record_bytes, limit_name),
      path_(path),
      limit_name_(limit_name),
      max_bytes_(max_record_bytes),
      layout_(ends_with(path, ".json") ? Layout::kUnknown : Layout::kLines) {}

int JsonRecordReader::peek() {
  if (at_ == chunk_.size()) {
    if (!reader_.next_chunk(chunk_)) {
      chunk_ = {};
      at_ = 0;
      return -1;
    }
    at_ = 0;
  }
  return static_cast<unsigned char>(chunk_[at_]);
}

int JsonRecordReader::get() {
  const int c = peek();
  if (c < 0) return c;
  ++at_;
  ++scanned_;
  if (c == '\n') ++line_;
  return c;
}

void JsonRecordReader::skip_blank() {
  while (is_space(peek())) get();
}

void JsonRecordReader::truncated(const std::string& what) const {
  throw InputError(fmt::format("{}: the file ends {}: the JSON is truncated (an unfinished download or copy?)", path_,
                               what));
}

void JsonRecordReader::cut_value(const std::string& where) {
  text_.clear();
  value_line_ = line_;
  const int first = peek();
  const bool container = first == '[' || first == '{';
  int64_t depth = 0;
  bool in_string = false, escaped = false;
  for (;;) {
    const int c = peek();
    if (c < 0) {
      if (!container && !in_string && layout_ == Layout::kObjects) return;  // a scalar at the very end
      truncated(fmt::format("inside the record starting at line {}{}", value_line_,
                            layout_ == Layout::kArray ? fmt::format(" (element {})", index_) : std::string()));
    }
    if (!container && !in_string && (is_space(c) || c == ',' || c == ']')) return;
    get();
    if (static_cast<int64_t>(text_.size()) >= max_bytes_)
      throw InputError(record_limit_error(where, max_bytes_, limit_name_));
    text_.push_back(static_cast<char>(c));
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      if (--depth == 0 && container) return;
    }
  }
}

bool JsonRecordReader::next_array_element(std::string& where) {
  skip_blank();
  int c = peek();
  if (index_ > 0) {  // after an element: ',' or the closing ']'
    if (c < 0) truncated(fmt::format("after element {} (line {}), before the array's closing ']'", index_ - 1, line_));
    if (c != ',' && c != ']')
      throw InputError(fmt::format("{}:{}: expected ',' or ']' after element {}, found {}", path_, line_, index_ - 1,
                                   show_byte(c)));
    get();
    if (c == ',') {
      skip_blank();
      c = peek();
      if (c < 0) truncated(fmt::format("after the ',' that follows element {}, before the array's closing ']'", index_ - 1));
      if (c == ']') throw InputError(fmt::format("{}:{}: a ',' with no element after it (element {})", path_, line_, index_));
    }
  } else {  // just after the '['
    if (c < 0) truncated("after the array's opening '['");
    if (c == ']') get();
  }
  if (c == ']') {
    layout_ = Layout::kEnd;
    skip_blank();
    if (peek() >= 0)
      throw InputError(fmt::format("{}:{}: {} after the top-level array's closing ']' (a .json file holds one array)",
                                   path_, line_, show_byte(peek())));
    return false;
  }
  where = fmt::format("{}:{} (element {})", path_, line_, index_);
  cut_value(where);
  ++index_;
  return true;
}

bool JsonRecordReader::next(nlohmann::ordered_json& record, std::string& where) {
  if (layout_ == Layout::kLines) {
    for (;;) {
      if (!reader_.next_line(text_)) return false;
      if (!is_blank(text_)) break;
    }
    where = fmt::format("{}:{}", path_, reader_.line_no());
    record = parse_ordered_json_input(text_, where);
    if (!record.is_object())
      throw InputError(fmt::format("{}: expected a JSON object per line, got {}", where, record.type_name()));
    return true;
  }
  if (layout_ == Layout::kUnknown) {
    if (peek() == 0xEF) {  // a UTF-8 byte order mark (files saved by some Windows tools) is skipped
      get();
      if (get() != 0xBB || get() != 0xBF)
        throw InputError(fmt::format("{}:1: expected a JSON array or object, found bytes that are not UTF-8 text", path_));
    }
    skip_blank();
    const int c = peek();
    if (c < 0) {
      layout_ = Layout::kEnd;
      return false;
    }
    if (c != '[' && c != '{')
      throw InputError(fmt::format("{}:{}: expected a JSON array of records ('[') or JSON objects ('{{'), found {}",
                                   path_, line_, show_byte(c)));
    if (c == '[') get();
    layout_ = c == '[' ? Layout::kArray : Layout::kObjects;
  }
  if (layout_ == Layout::kEnd) return false;
  if (layout_ == Layout::kArray) {
    if (!next_array_element(where)) return false;
    record = parse_ordered_json_input(text_, where);
    if (!record.is_object())
      throw InputError(fmt::format("{}: the element is {}, expected a JSON object (one record)", where, record.type_name()));
    return true;
  }
  skip_blank();  // kObjects
  if (peek() < 0) {
    layout_ = Layout::kEnd;
    return false;
  }
  where = fmt::format("{}:{}", path_, line_);
  cut_value(where);
  record = parse_ordered_json_input(text_, where);
  if (!record.is_object())
    throw InputError(fmt::format("{}: expected a JSON object (one record), got {}", where, record.type_name()));
  return true;
}

}  // namespace qshard
