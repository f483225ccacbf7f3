#include "train/tensorboard_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "runtime/error.h"

namespace qshard {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kPrefix = "events.out.tfevents.";

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// The largest <seconds> of "events.out.tfevents.<seconds>.*" in `dir`; -1 when none.
int64_t newest_event_seconds(const std::string& dir) {
  int64_t newest = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, kPrefix.size(), kPrefix) != 0) continue;
    int64_t s = 0;
    size_t i = kPrefix.size(), digits = 0;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 18; ++i, ++digits) s = s * 10 + (name[i] - '0');
    if (digits > 0 && i < name.size() && name[i] == '.') newest = std::max(newest, s);
  }
  return newest;
}

}  // namespace

double unix_time_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string tensorboard_file_name(int64_t unix_seconds, const std::string& host, int64_t pid) {
  return fmt::format("{}{}.{}.{}.qshard", kPrefix, unix_seconds, host, pid);
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step) {
  QS_CHECK(first_step >= 1, fmt::format("TensorBoardWriter: first_step {}", first_step));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw InputError(fmt::format("logging.tensorboard_dir = {}: cannot create the folder: {}", dir,
                                 ec ? ec.message() : "not a folder"));
  const double now = unix_time_s();
  int64_t seconds = std::max(static_cast<int64_t>(std::floor(now)), newest_event_seconds(dir) + 1);
  const std::string host = host_name();
  for (int attempt = 0; file_ == nullptr; ++attempt, ++seconds) {
    path_ = (fs::path(dir) / tensorboard_file_name(seconds, host, ::getpid())).string();
    file_ = std::fopen(path_.c_str(), "wbx");  // exclusive: never another file's bytes
    if (file_ == nullptr && (errno != EEXIST || attempt >= 100))
      throw InputError(fmt::format("{}: cannot create the TensorBoard event file: {}", path_, std::strerror(errno)));
  }
  write_record(file_version_event(now));
  write_record(session_start_event(now, first_step));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::write_scalars(int64_t step, double wall_time, const std::vector<TfScalar>& scalars) {
  write_record(scalars_event(wall_time, step, scalars));
}

void TensorBoardWriter::write_record(const std::string& event) {
  const std::string r = tfrecord(event);
  if (std::fwrite(r.data(), 1, r.size(), file_) != r.size() || std::fflush(file_) != 0)
    throw InputError(fmt::format("{}: writing TensorBoard events failed: {}", path_, std::strerror(errno)));
}

}  // namespace qshard
