#include "text/record_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/input_file.h"

namespace qshard {

std::string record_limit_error(const std::string& where, int64_t max_record_bytes, const std::string& limit_name) {
  return fmt::format("{}: a record longer than {} bytes ({}): refused before it is read whole; split it or raise {}",
                     where, max_record_bytes, limit_name, limit_name);
}

RecordReader::RecordReader(std::string path, const std::string& what, int64_t max_record_bytes, std::string limit_name)
    : path_(std::move(path)), limit_name_(std::move(limit_name)), max_record_bytes_(max_record_bytes) {
  QS_CHECK(max_record_bytes_ > 0, "RecordReader: max_record_bytes must be > 0");
  check_input_file(path_, what);
  // O_NONBLOCK and the fstat: a FIFO swapped in after the check is refused, not waited on.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) throw InputError(fmt::format("cannot open {} {}: {}", what, path_, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw InputError(fmt::format("{} {} is not a regular file", what, path_));
  }
}

RecordReader::~RecordReader() {
  if (fd_ >= 0) ::close(fd_);
}

bool RecordReader::fill() {
  buf_.resize(kChunkBytes);
  ssize_t got;
  do {
    got = ::read(fd_, buf_.data(), buf_.size());
  } while (got < 0 && errno == EINTR);
  if (got < 0) throw InputError(fmt::format("{}: read failed: {}", path_, std::strerror(errno)));
  buf_.resize(static_cast<size_t>(got));
  pos_ = 0;
  return got > 0;
}

bool RecordReader::next_line(std::string& line) {
  line.clear();
  bool any = false;  // a byte (or the '\n') of this line was seen
  for (;;) {
    if (pos_ == buf_.size() && !fill()) {
      if (!any) return false;
      break;  // the last line, without '\n'
    }
    any = true;
    const size_t nl = buf_.find('\n', pos_);
    const size_t end = nl == std::string::npos ? buf_.size() : nl;
    if (static_cast<int64_t>(line.size() + (end - pos_)) > max_record_bytes_)
      throw InputError(record_limit_error(fmt::format("{}:{}", path_, line_no_ + 1), max_record_bytes_, limit_name_));
    line.append(buf_, pos_, end - pos_);
    if (nl != std::string::npos) {
      pos_ = nl + 1;
      break;
    }
    pos_ = buf_.size();
  }
  ++line_no_;
  return true;
}

bool RecordReader::next_chunk(std::string_view& piece) {
  if (pos_ == buf_.size() && !fill()) return false;
  piece = std::string_view(buf_).substr(pos_);
  pos_ = buf_.size();
  return true;
}

}  // namespace qshard
