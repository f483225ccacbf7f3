// json_field.h: checked reads of a JSON document that a user handed qshard (tokenizer.json,
// tokenizer_config.json, adapter_config.json, ...), every error naming the file and the value's path.
//
// What: a JsonField is a view of one value of a parsed document (parse_json_input) with the label of
// the file it came from and its path from the root, written as a reader would look it up:
//   model.vocab["a b"]      added_tokens[3].id      pre_tokenizer.pretokenizers[1].pattern
// (a key that is an identifier joins with '.', any other, and any key read through entry(), is
// quoted in brackets; the root's path is empty). Every accessor checks the type it reads; a mismatch is an InputError
//   "<file>: <path>: expected <what>, got <value, shortened>"   a value of the wrong type
//   "<file>: <path>: missing (expected <what>)"                 a required key absent (or null)
// and fail() raises a reader's own checks in the same form. Readers of user files read through it
// and nothing else, so that no nlohmann out_of_range / type_error (whose text names neither file nor
// key) escapes from them. Optional keys: absent and null are the same (Hugging Face writers put null
// for "unset").
// Numbers: integer() takes JSON integers only (1.0 is refused), within [min, max] (stated in the
// message); number() takes any JSON number and refuses a non-finite one (1e999 parses as inf).
// Ownership: a JsonField points into the document, which must outlive it; copying one copies the
// path. Json is nlohmann::json or nlohmann::ordered_json (both instantiated in json_field.cpp).
// Thread safety: const; no shared state.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qshard {

template <class Json>
class BasicJsonField {
 public:
  // The root of a document read from `file` (the label every message starts with).
  BasicJsonField(const Json& root, std::string file) : v_(&root), file_(std::move(file)) {}

  const Json& json() const { return *v_; }
  const std::string& file() const { return file_; }
  const std::string& path() const { return path_; }  // "" at the root
  // "<file>: <path>" ("<file>" at the root): the prefix of every message about this value.
  std::string where() const;
  [[noreturn]] void fail(const std::string& what) const;  // InputError "where(): what"
  // `what`, got <this value shortened>: the wrong-type message.
  [[noreturn]] void expected(const std::string& what) const;

  // ---- an object's members (this must be an object: else "expected an object") ----
  bool has(std::string_view key) const;  // present and not null
  BasicJsonField at(std::string_view key, const char* what = "a value") const;  // required
  std::optional<BasicJsonField> find(std::string_view key) const;  // absent or null: nullopt
  // at() for an object used as a map (a vocabulary's tokens): the key is shown quoted in brackets
  // even when it is an identifier, model.vocab["b"].
  BasicJsonField entry(std::string_view key, const char* what = "a value") const;
  std::vector<std::pair<std::string, BasicJsonField>> members() const;  // in the document's order

  // ---- an array's elements (this must be an array) ----
  std::vector<BasicJsonField> elements() const;

  // ---- this value, its type checked ----
  const BasicJsonField& object() const;
  const BasicJsonField& array() const;
  std::string string() const;
  bool boolean() const;
  int64_t integer(int64_t min = std::numeric_limits<int64_t>::min(),
                  int64_t max = std::numeric_limits<int64_t>::max()) const;
  double number() const;  // finite

  // ---- an optional member, its type checked; `def` when absent or null ----
  std::string string_or(std::string_view key, const std::string& def) const;
  bool bool_or(std::string_view key, bool def) const;
  int64_t integer_or(std::string_view key, int64_t def, int64_t min = std::numeric_limits<int64_t>::min(),
                     int64_t max = std::numeric_limits<int64_t>::max()) const;
  double number_or(std::string_view key, double def) const;

 private:
  BasicJsonField(const Json* v, std::string file, std::string path)
      : v_(v), file_(std::move(file)), path_(std::move(path)) {}
  std::string child_path(std::string_view key, bool quoted = false) const;

  const Json* v_;
  std::string file_;
  std::string path_;
};

using JsonField = BasicJsonField<nlohmann::json>;
using OrderedJsonField = BasicJsonField<nlohmann::ordered_json>;

// nlohmann's message for a parse error without its tag: "parse error at line 1, column 18: syntax
// error while parsing value - unexpected end of input; ..." (the "[json.exception.parse_error.101] "
// before it is the library's, and means nothing to the user whose file it is).
std::string json_error_text(const std::exception& e);

// A JSON value as a message shows it: its dump, cut to `max_chars` with "..." past them.
template <class Json>
std::string json_shown(const Json& v, size_t max_chars = 60);

}  // namespace qshard
