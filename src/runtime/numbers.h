// numbers.h: every number a user types (a command-line option, an environment variable) parsed
// strictly and range-checked in one place, with one error message.
//
// What: parse_int / parse_double read the WHOLE text as one number (no leading or trailing
// spaces or junk, no empty text; integers in base 10 only, so "1.5", "1e3" and "0x10" are not
// integers; doubles finite, so "nan" and "inf" are refused, as is a value that overflows) and
// require it to lie in the closed range [min, max] (parse_double: (min, max] with Bound::kOpen).
// check_int / check_double apply the same range and message to a value already typed (an option
// struct filled by code). YAML keys are checked separately by TrainConfig::validate.
// Errors: InputError "NAME 'TEXT': expected an integer in [MIN, MAX]" (or "a number"), plus why
// ("not a number", "out of range"); NAME is what the user typed it as: "--top-k",
// "environment variable QSHARD_COLLECTIVE_TIMEOUT_S".
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace qshard {

// Whether a range's lower end belongs to it: [min, max] (kClosed) or (min, max] (kOpen).
enum class Bound { kClosed, kOpen };

int64_t parse_int(std::string_view name, std::string_view text, int64_t min, int64_t max);
double parse_double(std::string_view name, std::string_view text, double min, double max,
                    Bound lower = Bound::kClosed);

// The same range checks for a value that is already a number (NaN is outside every range).
void check_int(std::string_view name, int64_t value, int64_t min, int64_t max);
void check_double(std::string_view name, double value, double min, double max, Bound lower = Bound::kClosed);

// "[1, 100]" / "(0, 1]" as the messages print them (doubles with %g).
std::string int_range_text(int64_t min, int64_t max);
std::string double_range_text(double min, double max, Bound lower = Bound::kClosed);

}  // namespace qshard
