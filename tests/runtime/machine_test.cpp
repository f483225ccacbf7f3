// machine.h: what the machine has, and the refusals that name the bytes.
#include "runtime/machine.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "runtime/error.h"

namespace qshard {
namespace {

// Sets an environment variable for one scope.
struct EnvVar {
  std::string name;
  EnvVar(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~EnvVar() { unsetenv(name.c_str()); }
};

TEST(Machine, HostMemoryIsKnownAndCappedByTheEnvironment) {
  const HostMemory m = host_memory_available();
  EXPECT_GT(m.bytes, 0u);
  EXPECT_FALSE(m.limited_by.empty());
  EnvVar cap("QSHARD_HOST_MEMORY_BYTES", "123456789");
  const HostMemory c = host_memory_available();
  EXPECT_EQ(c.bytes, 123456789u);
  EXPECT_EQ(c.limited_by, "QSHARD_HOST_MEMORY_BYTES");
}

TEST(Machine, RefusalsNameWhatAndTheBytes) {
  EnvVar cap("QSHARD_HOST_MEMORY_BYTES", "1000000000");
  EXPECT_NO_THROW(require_host_memory(9e8, "a job", "detail"));
  try {
    require_host_memory(5e9, "the job's model (model.init)", "num_hidden_layers = 80");
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const char* needle : {"the job's model (model.init)", "5.0 GB", "num_hidden_layers = 80",
                               "QSHARD_HOST_MEMORY_BYTES leaves 1.0 GB"})
      EXPECT_NE(msg.find(needle), std::string::npos) << needle << " not in: " << msg;
  }
  const std::string dir = (std::filesystem::temp_directory_path() / "qshard_machine_test_no_such_dir/out").string();
  EXPECT_GT(disk_free_bytes(dir), 0u);  // the nearest existing parent's file system
  try {
    require_disk(1e30, dir, "init-model");
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("init-model writes about"), std::string::npos) << e.what();
  }
}

TEST(Machine, BadCapIsAnInputError) {
  EnvVar cap("QSHARD_HOST_MEMORY_BYTES", "lots");
  EXPECT_THROW(host_memory_available(), InputError);
}

}  // namespace
}  // namespace qshard
