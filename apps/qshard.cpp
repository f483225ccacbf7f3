// qshard: the command-line entry point. Its subcommands are the table in commands/commands.h
// (one file of apps/commands/ per group: the options, their declaration and the run step).
// run() declares --log-level and every command of the table as a CLI11 subcommand, parses, sets
// the log level and runs the one subcommand parsed (exactly one is required).
// Exit codes: 0 success, 2 bad input (the message names the file, key or value; also a failing
// write, e.g. a full disk: it names the file and strerror), 1 other errors;
// also 2 for a bad command line (CLI11's message, then "Run with --help for more information.").
// A number an option takes is parsed while the command line is (commands/number_options.h): the
// whole text, in the option's range, else exit 2 naming the flag, the value and the range.
// train / export / bench run under run_job (runtime/failure.h): a failure on any rank ends the
// whole job with these codes there; main()'s catch clauses serve the host commands and the checks
// made before a job starts.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "commands/commands.h"
#include "commands/help_format.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/mapped_files.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"qshard: distributed QLoRA training runtime (4-bit NF4, FSDP-style sharding)"};
  app.require_subcommand(1);
  // Defaults shown, an example each (commands/help_format.h); the subcommands inherit both.
  app.formatter(std::make_shared<qshard::cli::HelpFormatter>());
  app.option_defaults()->always_capture_default();
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");
  app.footer("Example:\n  qshard tokenize data/*.txt --out /tmp/tiny.tok\n"
             "  qshard train --config configs/tiny.yaml --set data.train=/tmp/tiny.tok\n"
             "Run `qshard <command> --help` for a command's options, defaults and an example.");

  // Each run step owns the options its subcommand parses into: they live here until it has run.
  std::vector<std::pair<CLI::App*, qshard::cli::CommandMain>> commands;
  for (const qshard::cli::Command& c : qshard::cli::kCommands) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    commands.emplace_back(sub, c.attach(*sub));
  }

  // The command is the first word that is not an option (nor --log-level's value): an unknown one
  // is named (CLI11 would say only "A subcommand is required").
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--log-level") {
      ++i;
      continue;
    }
    if (a.starts_with("-")) continue;
    bool known = false;
    std::string names;
    for (const qshard::cli::Command& c : qshard::cli::kCommands) {
      known = known || a == c.name;
      names += std::string(names.empty() ? "" : ", ") + c.name;
    }
    if (!known) {
      std::fprintf(stderr, "qshard: error: unknown command '%s' (one of %s)\nRun with --help for more information.\n",
                   argv[i], names.c_str());
      return 2;
    }
    break;
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help (and the like) exit 0 with CLI11's text; a bad command line (an unknown flag, a
    // missing value or required option, a value no validator accepts) is bad input: exit 2,
    // after CLI11's message and its hint "Run with --help for more information.".
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  qshard::set_log_level(log_level);

  for (auto& [sub, command_main] : commands)
    if (sub->parsed()) return command_main(argc, argv);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Past a file-size limit (ulimit -f) a write fails with EFBIG, which the writers report and
  // clean up after, instead of SIGXFSZ killing the process and leaving <out>.partial-<pid> behind.
  std::signal(SIGXFSZ, SIG_IGN);
  // Output to a pipe whose reader has gone (qshard ... | head) fails with EPIPE, reported below as
  // an error (exit 2), instead of SIGPIPE ending the process by a signal (exit 141).
  std::signal(SIGPIPE, SIG_IGN);
  // A token file or safetensors file truncated while it is read: its name and exit 2, not a bare SIGBUS.
  qshard::install_sigbus_report();
  try {
    const int rc = run(argc, argv);
    // Results printed to a full disk or a closed pipe are lost: say so instead of exiting 0.
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      std::fprintf(stderr, "qshard: error: writing the standard output failed: %s\n", std::strerror(errno));
      return 2;
    }
    return rc;
  } catch (const qshard::InputError& e) {
    std::fprintf(stderr, "qshard: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qshard: internal error: %s\n", e.what());
    return 1;
  }
}
