// The collective watchdog is on by default (runtime/failure.h): with QSHARD_COLLECTIVE_TIMEOUT_S
// unset a stuck peer ends the job after kDefaultCollectiveTimeoutS; the test environment does not
// set it (failure_watchdog_np2 checks a set value ending a job).
#include <gtest/gtest.h>

#include <cstdlib>

#include "runtime/failure.h"

namespace qshard {
namespace {

TEST(CollectiveTimeout, BoundedByDefault) {
  if (std::getenv("QSHARD_COLLECTIVE_TIMEOUT_S")) GTEST_SKIP() << "QSHARD_COLLECTIVE_TIMEOUT_S is set here";
  EXPECT_EQ(collective_timeout_s(), kDefaultCollectiveTimeoutS);
  EXPECT_GT(kDefaultCollectiveTimeoutS, 0.0);
}

}  // namespace
}  // namespace qshard
