// qshard version: the version and the backends this build has (see commands.h).
#include <cstdio>

#include "commands.h"
#include "runtime/device_context.h"
#include "runtime/tensor.h"

#ifndef QSHARD_VERSION
#define QSHARD_VERSION "0.0.0"
#endif

namespace qshard::cli {
namespace {

struct VersionArgs {};

void add_version(CLI::App& sub, VersionArgs&) { sub.footer("Example:\n  qshard version"); }

int run_version(VersionArgs&, int, char**) {
  std::printf("qshard %s\n", QSHARD_VERSION);
  if (cuda_backend_built())
    std::printf("backends: cpu, cuda (%s)\n", cuda_available() ? "GPU present" : "no GPU visible");
  else
    std::printf("backends: cpu\n");
  return 0;
}

}  // namespace

CommandMain attach_version(CLI::App& sub) { return attach_with(sub, add_version, run_version); }

}  // namespace qshard::cli
