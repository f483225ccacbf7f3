#include "runtime/numbers.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <system_error>

#include "runtime/error.h"

namespace qshard {
namespace {

std::string g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

[[noreturn]] void refuse(std::string_view name, std::string_view text, const std::string& expected,
                         const char* why) {
  std::string msg = std::string(name) + " '" + std::string(text) + "': " + why;
  msg += (*why ? "; expected " : "expected ") + expected;
  throw InputError(msg);
}

bool in_range(double v, double min, double max, Bound lower) {
  return (lower == Bound::kOpen ? v > min : v >= min) && v <= max;  // NaN fails both
}

}  // namespace

std::string int_range_text(int64_t min, int64_t max) {
  return "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
}

std::string double_range_text(double min, double max, Bound lower) {
  return (lower == Bound::kOpen ? "(" : "[") + g(min) + ", " + g(max) + "]";
}

int64_t parse_int(std::string_view name, std::string_view text, int64_t min, int64_t max) {
  const std::string expected = "an integer in " + int_range_text(min, max);
  if (text.empty()) refuse(name, text, expected, "empty");
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [at, ec] = std::from_chars(text.data(), end, v, 10);
  if (ec == std::errc::result_out_of_range) refuse(name, text, expected, "out of range");
  if (ec != std::errc() || at != end) refuse(name, text, expected, "not an integer");
  if (v < min || v > max) refuse(name, text, expected, "");
  return v;
}

double parse_double(std::string_view name, std::string_view text, double min, double max, Bound lower) {
  const std::string expected = "a number in " + double_range_text(min, max, lower);
  if (text.empty()) refuse(name, text, expected, "empty");
  double v = 0;
  const char* end = text.data() + text.size();
  const auto [at, ec] = std::from_chars(text.data(), end, v, std::chars_format::general);
  if (ec == std::errc::result_out_of_range) refuse(name, text, expected, "out of range");
  if (ec != std::errc() || at != end) refuse(name, text, expected, "not a number");
  if (!std::isfinite(v)) refuse(name, text, expected, "not a finite number");
  if (!in_range(v, min, max, lower)) refuse(name, text, expected, "");
  return v;
}

void check_int(std::string_view name, int64_t value, int64_t min, int64_t max) {
  if (value < min || value > max) refuse(name, std::to_string(value), "an integer in " + int_range_text(min, max), "");
}

void check_double(std::string_view name, double value, double min, double max, Bound lower) {
  if (!in_range(value, min, max, lower)) refuse(name, g(value), "a number in " + double_range_text(min, max, lower), "");
}

}  // namespace qshard
