// help_format.h: how `qshard <command> --help` shows an option: its names, its type, REQUIRED,
// and its description followed by "(default: X)" - the value the option holds when it is not
// given (CLI11's captured default; number_options.h sets it for numbers). No default is shown for
// a flag (off unless given), an empty string or list, or when the description already says what
// the default is ("default ..."). Every command's help ends with an "Example:" footer (set in
// the command's add function; tests/apps/help_check.sh checks both).
// An option is listed under its first long name (with its short one): further names are older
// aliases that keep scripts working ("--seq-len,--seq") and are not listed.
// Installed on the top-level app before the subcommands are added (CLI11 copies the formatter
// and the option defaults, always_capture_default, to each subcommand).
#pragma once

#include <CLI/CLI.hpp>
#include <sstream>
#include <string>

namespace qshard::cli {

class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_name(const CLI::Option* opt, bool is_positional) const override {
    if (is_positional || opt->get_lnames().empty()) return CLI::Formatter::make_option_name(opt, is_positional);
    std::string name;
    for (const std::string& s : opt->get_snames()) name += "-" + s + ",";
    return name + "--" + opt->get_lnames().front();
  }
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::stringstream out;
    if (!opt->get_option_text().empty()) return " " + opt->get_option_text();
    if (opt->get_type_size() != 0) {
      if (!opt->get_type_name().empty()) out << " " << get_label(opt->get_type_name());
      if (opt->get_expected_max() == CLI::detail::expected_max_vector_size) out << " ...";
      if (opt->get_required()) out << " " << get_label("REQUIRED");
    }
    return out.str();
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string desc = opt->get_description();
    const std::string& def = opt->get_default_str();
    const bool shown = opt->get_type_size() != 0 && !def.empty() && def != "[]" && def != "\"\"" &&
                       desc.find("default") == std::string::npos;
    if (shown) desc += (desc.empty() ? "" : " ") + std::string("(default: ") + def + ")";
    return desc;
  }
};

}  // namespace qshard::cli
