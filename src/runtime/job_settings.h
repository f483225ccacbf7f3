// job_settings.h: the process-wide knobs a job's config sets (qshard train's runtime.* keys,
// docs/CONFIG.md), which were environment variables only. Each variable, when set, still wins over
// the job's value (an operator's override without editing the job):
//   collective_timeout_s  QSHARD_COLLECTIVE_TIMEOUT_S  failure.h: collective_timeout_s()
//   host_memory_bytes     QSHARD_HOST_MEMORY_BYTES     machine.h: host_memory_available()
//   nccl_blocking         QSHARD_NCCL_BLOCKING         nccl_communicator.cpp: NCCL's blocking mode
// Defaults are the values the variables' absence always meant.
// Thread safety: set_job_settings() from the main thread before the job's communicators exist;
// the getters may be called from any thread (the watchdog reads the timeout).
#pragma once

namespace qshard {

struct JobSettings {
  double collective_timeout_s = 1800.0;  // = failure.h's kDefaultCollectiveTimeoutS; 0 = no watchdog
  double host_memory_bytes = 0;          // 0: no cap beyond what the machine reports
  bool nccl_blocking = false;
};

// REQUIRES: values in the ranges train_config.h's validate() checks.
void set_job_settings(const JobSettings& s);
JobSettings job_settings();

}  // namespace qshard
