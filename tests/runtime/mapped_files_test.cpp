// mapped_files.h: a registered mapping whose file shrinks under it ends the process with exit 2 and
// the file's name on stderr (not a bare SIGBUS); a fault in an unregistered one is passed on.
#include "runtime/mapped_files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace qshard {
namespace {

// In a child: map `path` (1 MiB), register it when asked, truncate the file, read past its new end.
// Returns the child's wait status; its stderr in `err`.
int shrink_and_read(const std::string& path, bool registered, std::string& err) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return -1;
  const pid_t child = ::fork();
  if (child == 0) {
    ::dup2(pipefd[1], 2);
    install_sigbus_report();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::ftruncate(fd, 1 << 20) != 0) ::_exit(10);
    void* p = ::mmap(nullptr, 1 << 20, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) ::_exit(11);
    if (registered) register_mapping(p, 1 << 20, path);
    if (::ftruncate(fd, 0) != 0) ::_exit(12);
    volatile const char* c = static_cast<const char*>(p);
    const char v = c[65536];  // past the end: SIGBUS
    ::_exit(v == 0 ? 13 : 14);
  }
  ::close(pipefd[1]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) err.append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return status;
}

TEST(MappedFiles, AFileThatShrinksWhileReadIsNamed) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("qshard_mapped_" + std::to_string(::getpid()))).string();
  std::string err;
  int status = shrink_and_read(path, true, err);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << ": " << err;
  EXPECT_EQ(WEXITSTATUS(status), 2) << err;
  EXPECT_NE(err.find("qshard: error: " + path + ": the file shrank"), std::string::npos) << err;
  err.clear();
  status = shrink_and_read(path, false, err);  // not ours: passed on (the signal; under ASan its report)
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << "status " << status << ": " << err;
  EXPECT_EQ(err.find("the file shrank"), std::string::npos) << err;
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace qshard
