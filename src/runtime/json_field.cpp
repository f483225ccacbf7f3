#include "runtime/json_field.h"

#include <cmath>

#include "runtime/error.h"

namespace qshard {
namespace {

bool is_identifier(std::string_view key) {
  if (key.empty() || (key[0] >= '0' && key[0] <= '9')) return false;
  for (char c : key)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

std::string range_text(int64_t min, int64_t max) {
  constexpr int64_t kLow = std::numeric_limits<int64_t>::min(), kHigh = std::numeric_limits<int64_t>::max();
  if (min == kLow && max == kHigh) return "an integer";
  if (max == kHigh) return "an integer >= " + std::to_string(min);
  if (min == kLow) return "an integer <= " + std::to_string(max);
  return "an integer from " + std::to_string(min) + " to " + std::to_string(max);
}

}  // namespace

std::string json_error_text(const std::exception& e) {
  std::string s = e.what();
  if (s.rfind("[json.exception.", 0) == 0) {
    const size_t end = s.find("] ");
    if (end != std::string::npos) s.erase(0, end + 2);
  }
  return s;
}

template <class Json>
std::string json_shown(const Json& v, size_t max_chars) {
  // Parsed values hold valid UTF-8, so the strict dump never throws; replace keeps it so for
  // values a program built.
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() <= max_chars) return s;
  size_t n = max_chars > 3 ? max_chars - 3 : 0;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // a character boundary
  return s.substr(0, n) + "...";
}

template <class Json>
std::string BasicJsonField<Json>::where() const {
  return path_.empty() ? file_ : file_ + ": " + path_;
}

template <class Json>
void BasicJsonField<Json>::fail(const std::string& what) const {
  throw InputError(where() + ": " + what);
}

template <class Json>
void BasicJsonField<Json>::expected(const std::string& what) const {
  fail("expected " + what + ", got " + json_shown(*v_));
}

template <class Json>
std::string BasicJsonField<Json>::child_path(std::string_view key, bool quoted) const {
  if (!quoted && is_identifier(key)) return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  return path_ + "[" + json_shown(Json(std::string(key)), 80) + "]";
}

template <class Json>
bool BasicJsonField<Json>::has(std::string_view key) const {
  return find(key).has_value();
}

template <class Json>
BasicJsonField<Json> BasicJsonField<Json>::at(std::string_view key, const char* what) const {
  std::optional<BasicJsonField> f = find(key);
  if (!f) throw InputError(file_ + ": " + child_path(key) + ": missing (expected " + what + ")");
  return *f;
}

template <class Json>
BasicJsonField<Json> BasicJsonField<Json>::entry(std::string_view key, const char* what) const {
  object();
  auto it = v_->find(key);
  if (it == v_->end() || it->is_null())
    throw InputError(file_ + ": " + child_path(key, true) + ": missing (expected " + what + ")");
  return BasicJsonField(&*it, file_, child_path(key, true));
}

template <class Json>
std::optional<BasicJsonField<Json>> BasicJsonField<Json>::find(std::string_view key) const {
  object();
  auto it = v_->find(key);
  if (it == v_->end() || it->is_null()) return std::nullopt;
  return BasicJsonField(&*it, file_, child_path(key));
}

template <class Json>
std::vector<std::pair<std::string, BasicJsonField<Json>>> BasicJsonField<Json>::members() const {
  object();
  std::vector<std::pair<std::string, BasicJsonField>> out;
  out.reserve(v_->size());
  for (auto it = v_->begin(); it != v_->end(); ++it)
    out.emplace_back(it.key(), BasicJsonField(&it.value(), file_, child_path(it.key())));
  return out;
}

template <class Json>
std::vector<BasicJsonField<Json>> BasicJsonField<Json>::elements() const {
  array();
  std::vector<BasicJsonField> out;
  out.reserve(v_->size());
  for (size_t i = 0; i < v_->size(); ++i)
    out.push_back(BasicJsonField(&(*v_)[i], file_, path_ + "[" + std::to_string(i) + "]"));
  return out;
}

template <class Json>
const BasicJsonField<Json>& BasicJsonField<Json>::object() const {
  if (!v_->is_object()) expected("an object");
  return *this;
}

template <class Json>
const BasicJsonField<Json>& BasicJsonField<Json>::array() const {
  if (!v_->is_array()) expected("an array");
  return *this;
}

template <class Json>
std::string BasicJsonField<Json>::string() const {
  if (!v_->is_string()) expected("a string");
  return v_->template get<std::string>();
}

template <class Json>
bool BasicJsonField<Json>::boolean() const {
  if (!v_->is_boolean()) expected("true or false");
  return v_->template get<bool>();
}

template <class Json>
int64_t BasicJsonField<Json>::integer(int64_t min, int64_t max) const {
  const bool in_int64 = v_->is_number_integer() &&
                        (!v_->is_number_unsigned() ||
                         v_->template get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
  if (!in_int64) expected(range_text(min, max));
  const int64_t v = v_->template get<int64_t>();
  if (v < min || v > max) expected(range_text(min, max));
  return v;
}

template <class Json>
double BasicJsonField<Json>::number() const {
  if (!v_->is_number() || !std::isfinite(v_->template get<double>())) expected("a finite number");
  return v_->template get<double>();
}

template <class Json>
std::string BasicJsonField<Json>::string_or(std::string_view key, const std::string& def) const {
  const auto f = find(key);
  return f ? f->string() : def;
}

template <class Json>
bool BasicJsonField<Json>::bool_or(std::string_view key, bool def) const {
  const auto f = find(key);
  return f ? f->boolean() : def;
}

template <class Json>
int64_t BasicJsonField<Json>::integer_or(std::string_view key, int64_t def, int64_t min, int64_t max) const {
  const auto f = find(key);
  return f ? f->integer(min, max) : def;
}

template <class Json>
double BasicJsonField<Json>::number_or(std::string_view key, double def) const {
  const auto f = find(key);
  return f ? f->number() : def;
}

template class BasicJsonField<nlohmann::json>;
template class BasicJsonField<nlohmann::ordered_json>;
template std::string json_shown(const nlohmann::json&, size_t);
template std::string json_shown(const nlohmann::ordered_json&, size_t);

}  // namespace qshard
