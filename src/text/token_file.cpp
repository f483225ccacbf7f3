#include "text/token_file.h"
#include "runtime/input_file.h"
#include "runtime/mapped_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "runtime/error.h"

namespace qshard {

static_assert(std::endian::native == std::endian::little, "the token file format assumes a little-endian host");

namespace {

template <class T>
T read_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

[[noreturn]] void io_error(const std::string& path, const std::string& what, int err) {
  throw InputError(fmt::format("{}: {} failed: {}", path, what, std::strerror(err)));
}

}  // namespace

// ---- reader ---------------------------------------------------------------------------------

TokenFile TokenFile::open(const std::string& path) {
  TokenFile t;
  t.path_ = path;
  // Not opened when it is a FIFO or a device (open would block, or read for ever); O_NONBLOCK and
  // the fstat below catch one swapped in after the check. A missing file: open's message below.
  if (struct stat pre {}; ::stat(path.c_str(), &pre) == 0) check_input_file(path, "token file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw InputError(fmt::format("{}: cannot open token file: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    io_error(path, "fstat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(fmt::format("{}: not a regular file (expected a token file)", path));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < kTokenFileHeaderBytes) {
    ::close(fd);
    throw InputError(fmt::format("{}: truncated: {} bytes, shorter than the {}-byte token file header", path, size,
                                 kTokenFileHeaderBytes));
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) io_error(path, fmt::format("mmap of {} bytes", size), err);
  t.map_ = static_cast<const uint8_t*>(p);
  t.map_size_ = size;
  register_mapping(p, size, path);  // a truncation while it is read: named, exit 2 (not a bare SIGBUS)

  const uint8_t* h = t.map_;
  if (std::memcmp(h, kTokenFileMagic, 8) != 0)
    throw InputError(fmt::format("{}: bad magic: not a token file (expected the bytes \"QSTOKENS\" at offset 0)", path));
  const auto version = read_le<uint32_t>(h + 8);
  if (version < kTokenFileVersion || version > kTokenFileVersionTokenizer)
    throw InputError(fmt::format("{}: unsupported token file version {} (expected {} to {})", path, version,
                                 kTokenFileVersion, kTokenFileVersionTokenizer));
  t.version_ = version;
  t.loss_mask_ = version >= kTokenFileVersionMasked;
  t.doc_starts_ = version >= kTokenFileVersionDocs;
  const size_t header_bytes = version >= kTokenFileVersionTokenizer ? kTokenFileHeaderBytesV4 : kTokenFileHeaderBytes;
  if (size < header_bytes)
    throw InputError(fmt::format("{}: truncated: {} bytes, shorter than the {}-byte header of a version {} token file",
                                 path, size, header_bytes, version));
  if (version >= kTokenFileVersionTokenizer) {
    t.tokenizer_fingerprint_ = read_le<uint64_t>(h + 32);
    if (t.tokenizer_fingerprint_ == kNoTokenizerFingerprint)
      throw InputError(fmt::format("{}: tokenizer fingerprint is 0 in a version 4 header (expected the tokenizer's)", path));
    for (size_t i = 40; i < kTokenFileHeaderBytesV4; ++i)
      if (h[i] != 0)
        throw InputError(fmt::format("{}: reserved header byte {} is {} (expected 0)", path, i, static_cast<int>(h[i])));
  }
  t.vocab_size_ = read_le<uint32_t>(h + 12);
  const auto n = read_le<uint64_t>(h + 16);
  const auto dtype = read_le<uint32_t>(h + 24);
  const auto reserved = read_le<uint32_t>(h + 28);
  if (t.vocab_size_ == 0) throw InputError(fmt::format("{}: vocab_size is 0 in the header (expected > 0)", path));
  if (t.vocab_size_ - 1 > t.id_bits())  // a masked file's ids leave the flag bits free (the writer's rule)
    throw InputError(fmt::format("{}: vocab_size {} in the header does not fit the {}-bit ids of a version {} file", path,
                                 t.vocab_size_, std::bit_width(t.id_bits()), t.version()));
  if (dtype != kTokenDtypeU32)
    throw InputError(fmt::format("{}: unsupported token dtype code {} (expected {} = uint32)", path, dtype, kTokenDtypeU32));
  if (reserved != 0) throw InputError(fmt::format("{}: reserved header field is {} (expected 0)", path, reserved));
  const uint64_t data = size - header_bytes;
  if (n > data / 4)
    throw InputError(fmt::format("{}: truncated: header says {} tokens ({} bytes) but the file has {} data bytes", path,
                                 n, n * 4, data));
  if (data != n * 4)
    throw InputError(fmt::format("{}: {} trailing bytes after the {} tokens the header declares", path, data - n * 4, n));
  t.num_tokens_ = static_cast<size_t>(n);
  t.tokens_ = reinterpret_cast<const uint32_t*>(t.map_ + header_bytes);  // page + 32 or 64: aligned
  return t;
}

TokenFile::TokenFile(TokenFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      map_size_(std::exchange(o.map_size_, 0)),
      tokens_(std::exchange(o.tokens_, nullptr)),
      num_tokens_(std::exchange(o.num_tokens_, 0)),
      vocab_size_(o.vocab_size_),
      version_(o.version_),
      tokenizer_fingerprint_(o.tokenizer_fingerprint_),
      loss_mask_(o.loss_mask_),
      doc_starts_(o.doc_starts_) {}

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    tokens_ = std::exchange(o.tokens_, nullptr);
    num_tokens_ = std::exchange(o.num_tokens_, 0);
    vocab_size_ = o.vocab_size_;
    version_ = o.version_;
    tokenizer_fingerprint_ = o.tokenizer_fingerprint_;
    loss_mask_ = o.loss_mask_;
    doc_starts_ = o.doc_starts_;
  }
  return *this;
}

TokenFile::~TokenFile() { unmap(); }

void TokenFile::unmap() {
  if (map_ != nullptr) {
    unregister_mapping(map_);
    ::munmap(const_cast<uint8_t*>(map_), map_size_);
  }
  map_ = nullptr;
}

void TokenFile::validate(uint32_t max_vocab) const {
  const uint32_t limit = std::min(vocab_size_, max_vocab);
  const uint32_t ids = id_bits();
  for (size_t i = 0; i < num_tokens_; ++i) {
    if ((tokens_[i] & ids) >= limit) {
      const std::string why = limit == vocab_size_
                                  ? fmt::format("the file's vocab_size {}", vocab_size_)
                                  : fmt::format("the model's vocab size {} (the file says {})", max_vocab, vocab_size_);
      throw InputError(fmt::format("{}: token {} at index {} is >= {}", path_, tokens_[i] & ids, i, why));
    }
  }
}

// ---- writer ---------------------------------------------------------------------------------

TokenFileWriter::TokenFileWriter(std::string path, uint32_t vocab_size, bool loss_mask, bool doc_starts,
                                 uint64_t tokenizer_fingerprint)
    : path_(std::move(path)), temp_path_(path_ + ".tmp." + std::to_string(static_cast<long>(::getpid()))),
      vocab_size_(vocab_size), loss_mask_(loss_mask || doc_starts), doc_starts_(doc_starts),
      tokenizer_fingerprint_(tokenizer_fingerprint) {
  QS_CHECK(tokenizer_fingerprint_ == kNoTokenizerFingerprint || doc_starts_,
           "TokenFileWriter: a tokenizer fingerprint (version 4) needs doc_starts");
  if (loss_mask_ && vocab_size_ > kTokenNoLoss)
    throw InputError(fmt::format("{}: vocab_size {} does not leave bit 31 for the loss mask", path_, vocab_size_));
  if (doc_starts_ && vocab_size_ > kTokenDocStart)
    throw InputError(fmt::format("{}: vocab_size {} does not leave bit 30 for document starts", path_, vocab_size_));
  if (vocab_size_ == 0) throw InputError(fmt::format("{}: vocab_size must be > 0", path_));
  check_output_file(path_, "token file");
  remove_stale_partials(path_, ".tmp.");  // a killed tokenize's temp file
  f_ = std::fopen(temp_path_.c_str(), "wb");
  if (f_ == nullptr) io_error(path_, fmt::format("creating \"{}\"", temp_path_), errno);
  const bool v4 = tokenizer_fingerprint_ != kNoTokenizerFingerprint;
  uint8_t header[kTokenFileHeaderBytesV4] = {};  // count written by finish()
  std::memcpy(header, kTokenFileMagic, 8);
  std::memcpy(header + 8,
              v4 ? &kTokenFileVersionTokenizer
                 : doc_starts_ ? &kTokenFileVersionDocs : loss_mask_ ? &kTokenFileVersionMasked : &kTokenFileVersion,
              4);
  std::memcpy(header + 12, &vocab_size_, 4);
  std::memcpy(header + 24, &kTokenDtypeU32, 4);
  if (v4) std::memcpy(header + 32, &tokenizer_fingerprint_, 8);
  const size_t header_bytes = v4 ? kTokenFileHeaderBytesV4 : kTokenFileHeaderBytes;
  if (std::fwrite(header, 1, header_bytes, f_) != header_bytes) io_error(path_, "writing the header", errno);
}

TokenFileWriter::~TokenFileWriter() {
  if (f_ != nullptr) {
    std::fclose(f_);
    std::remove(temp_path_.c_str());
  }
}

void TokenFileWriter::append(std::span<const uint32_t> tokens) {
  QS_CHECK(f_ != nullptr, "TokenFileWriter::append after finish");
  const uint32_t id_bits = token_id_bits(loss_mask_, doc_starts_);
  for (size_t i = 0; i < tokens.size(); ++i)
    if ((tokens[i] & id_bits) >= vocab_size_)
      throw InputError(fmt::format("{}: token {} (at index {}) is >= vocab_size {}", path_, tokens[i] & id_bits,
                                   count_ + i, vocab_size_));
  if (tokens.empty()) return;  // fwrite(nullptr, ...) is undefined even for zero items
  if (std::fwrite(tokens.data(), 4, tokens.size(), f_) != tokens.size()) io_error(path_, "writing tokens", errno);
  count_ += tokens.size();
}

void TokenFileWriter::finish() {
  QS_CHECK(f_ != nullptr, "TokenFileWriter::finish called twice");
  if (std::fseek(f_, 16, SEEK_SET) != 0) io_error(path_, "seek", errno);
  if (std::fwrite(&count_, 8, 1, f_) != 1) io_error(path_, "writing the token count", errno);
  if (std::fflush(f_) != 0) io_error(path_, "flush", errno);
  if (::fsync(::fileno(f_)) != 0) io_error(path_, "fsync", errno);
  std::FILE* f = std::exchange(f_, nullptr);
  if (std::fclose(f) != 0) {
    const int err = errno;
    std::remove(temp_path_.c_str());
    io_error(path_, "close", err);
  }
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    std::remove(temp_path_.c_str());
    io_error(path_, fmt::format("renaming \"{}\"", temp_path_), err);
  }
}

void write_token_file(const std::string& path, uint32_t vocab_size, std::span<const uint32_t> tokens) {
  TokenFileWriter w(path, vocab_size);
  w.append(tokens);
  w.finish();
}

}  // namespace qshard
