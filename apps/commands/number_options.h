// number_options.h: CLI11 options for numbers, parsed by runtime/numbers.h (strict, range-checked).
//
// What: add_int_option / add_double_option declare `flag` on `sub` as a text option whose callback
// parses the whole text with parse_int / parse_double in [min, max] ((min, max] with Bound::kOpen)
// and stores it in `var`. A bad value throws InputError naming the flag, the value and the range
// while the command line is parsed, before any command runs (so nothing is written): main() turns
// it into exit code 2. The range is appended to the help text. `var` keeps its default when the
// flag is absent (and shown as the default in --help: help_format.h); Option::count() tells
// whether it was given. `flag` may list aliases
// ("--a,--b"); messages name the first.
// Ownership: `var` must outlive the parse (it lives in the command's options struct).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>

#include "runtime/error.h"
#include "runtime/numbers.h"

namespace qshard::cli {

template <class Int>
CLI::Option* add_int_option(CLI::App& sub, const std::string& flag, Int& var, int64_t min, int64_t max,
                            const std::string& help = "") {
  QS_CHECK(min <= max && static_cast<long double>(min) >= static_cast<long double>(std::numeric_limits<Int>::min()) &&
               static_cast<long double>(max) <= static_cast<long double>(std::numeric_limits<Int>::max()),
           flag + ": the range does not fit the option's type");
  return sub
      .add_option_function<std::string>(
          flag,
          [&var, name = flag.substr(0, flag.find(',')), min, max](const std::string& text) {
            var = static_cast<Int>(parse_int(name, text, min, max));
          },
          (help.empty() ? "" : help + " ") + int_range_text(min, max))
      ->type_name("INT")
      ->default_str(std::to_string(var));
}

inline CLI::Option* add_double_option(CLI::App& sub, const std::string& flag, double& var, double min, double max,
                                      const std::string& help = "", Bound lower = Bound::kClosed) {
  return sub
      .add_option_function<std::string>(
          flag,
          [&var, name = flag.substr(0, flag.find(',')), min, max, lower](const std::string& text) {
            var = parse_double(name, text, min, max, lower);
          },
          (help.empty() ? "" : help + " ") + double_range_text(min, max, lower))
      ->type_name("NUMBER")
      ->default_str((std::ostringstream() << var).str());
}

// --max-shard-size-gb and the like: GB (1e9 bytes) per safetensors file. At least 1e-6 GB (1 kB):
// the writers give a tensor larger than the cap a file of its own, so any positive cap works and
// the floor only keeps the byte count (GB x 1e9, truncated) above 0; at most 1e6 GB.
inline constexpr double kMinShardGb = 1e-6, kMaxShardGb = 1e6;

}  // namespace qshard::cli
