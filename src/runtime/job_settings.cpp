#include "runtime/job_settings.h"

#include <mutex>

namespace qshard {
namespace {
std::mutex g_mu;
JobSettings g_settings;
}  // namespace

void set_job_settings(const JobSettings& s) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_settings = s;
}

JobSettings job_settings() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_settings;
}

}  // namespace qshard
