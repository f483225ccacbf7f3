// safetensors.h: reading (memory-mapped) and streaming writing of .safetensors files.
//
// What: the Hugging Face safetensors format, byte for byte as the upstream Rust library
// (huggingface/safetensors, checked against the Python package 0.8.0) reads and writes it.
//
// Byte layout (all integers little-endian):
//   [0, 8)          u64 N: length of the JSON header in bytes (N <= 100,000,000)
//   [8, 8 + N)      UTF-8 JSON object, padded with spaces (0x20) so that 8 + N is a multiple of 8
//                   (the writer always pads; the reader accepts any N):
//                     {"__metadata__": {"format": "pt", ...},           (optional, string->string)
//                      "<name>": {"dtype": "BF16", "shape": [4096, 4096], "data_offsets": [b, e]},
//                      ...}
//   [8 + N, end)    the data: tensor bytes, row-major, little-endian, packed back to back; b and e
//                   are relative to 8 + N, e exclusive; the offsets of all tensors, sorted, tile
//                   [0, end - 8 - N) exactly (no gaps, no overlaps, nothing after the last one).
// Dtypes (upstream 0.8.0, bits per element): BOOL 8, F4 4, F6_E2M3 6, F6_E3M2 6, U8 8, I8 8,
//   F8_E5M2 8, F8_E4M3 8, F8_E8M0 8, F8_E4M3FNUZ 8, F8_E5M2FNUZ 8, I16 16, U16 16, F16 16,
//   BF16 16, I32 32, U32 32, F32 32, C64 64, F64 64, I64 64, U64 64. For the sub-byte types
//   (F4, F6_*) numel * bits must be a whole number of bytes, as upstream requires.
//   Only F32, BF16, F16, U8, I32 and I64 map to a qshard DType; files holding the others open
//   and can be read as raw bytes, but get() refuses them.
//
// Reader (SafetensorsFile): open() maps the whole file read-only (mmap, PROT_READ, MAP_PRIVATE)
// and validates everything before returning; afterwards no accessor can read out of bounds.
// Any malformation is an InputError naming the file, the tensor where there is one, and what was
// expected. Unknown keys inside a tensor entry are ignored (upstream ignores them too); duplicate
// keys anywhere in the header are an error (upstream's JSON parser would keep one silently).
// "__metadata__": null is read as no metadata (as upstream does).
// Ownership: SafetensorsFile owns the mapping (munmap in the destructor); spans from bytes() point
// into it and die with it. Movable, not copyable. The file must not be truncated or rewritten
// while mapped (a truncated mapping faults with SIGBUS on access; rename a new file over it
// instead, which is what the writer does).
// Thread safety: a SafetensorsFile is immutable after open(); all const methods may be called
// from several threads at once.
//
// Writer (SafetensorsWriter): streaming. declare() every tensor, begin() writes the header,
// write() streams the tensor bytes in declaration order (any chunking), finish() makes the file
// durable and atomically visible: data goes to "<path>.tmp.<pid>", which is fflush'ed, fsync'ed,
// renamed onto <path>, and the directory is fsync'ed. A writer destroyed before finish() removes
// its temp file, so <path> is either the old file or the complete new one, never a partial one.
// Misuse (duplicate names, wrong order, too many bytes, calls out of sequence) throws Error;
// failing I/O (open/write/fsync/rename) throws InputError naming the path and strerror(errno).
// Test hook: with QSHARD_TEST_DISK_FULL=<text> every write() of a writer whose path contains
// <text> fails with ENOSPC, as on a full disk (tests/apps/export_resume_check.sh: one rank's
// file, "rank-00001", or an export's folder).
// Thread safety: a writer is used from one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

namespace qshard {

// Largest header the reader accepts (upstream's MAX_HEADER_SIZE).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Bits per element of a safetensors dtype string ("BF16" -> 16, "F4" -> 4); nullopt if the
// string is not a dtype upstream safetensors knows.
std::optional<uint32_t> safetensors_dtype_bits(std::string_view dtype_name);
// The qshard DType of a safetensors dtype string ("BF16" -> kBF16); nullopt for the others.
std::optional<DType> safetensors_to_dtype(std::string_view dtype_name);

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;      // "BF16", "F8_E4M3", ... as in the file
  std::optional<DType> dtype;  // nullopt for valid safetensors dtypes qshard has no DType for
  Shape shape;                 // dims as in the file; every dim and numel fit in int64
  uint64_t begin = 0, end = 0; // byte offsets relative to the data start, end exclusive
  uint64_t nbytes() const { return end - begin; }
};

// The parsed, validated header of a safetensors file.
struct SafetensorsHeader {
  uint64_t data_offset = 0;                   // 8 + N
  std::vector<SafetensorsEntry> entries;      // sorted by data offset
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Parses and validates a whole file held in `file_bytes` (header and data; the data bytes are
// not read, only its length is used). `label` names the file in error messages.
// Throws InputError on any malformation; never reads outside `file_bytes`.
SafetensorsHeader parse_safetensors_header(std::span<const uint8_t> file_bytes, std::string_view label);

// JSON parse that rejects duplicate object keys at any depth (nlohmann's parser keeps the last
// one silently) and nesting deeper than 64. Object keys keep their file order.
// Throws InputError "<label>: ..." naming the duplicate key or the parse error position.
nlohmann::ordered_json parse_json_strict(std::string_view text, std::string_view label);

// Writes `contents` to "<path>.tmp.<pid>", fsyncs it, renames it onto `path` and fsyncs the
// directory. Throws InputError naming the path and strerror(errno); leaves no temp file behind.
void write_file_atomic(const std::string& path, std::string_view contents);

// The folder a command writes `out_dir` into before renaming it into place: "<out_dir>.partial-<pid>".
// First removes stale ones, "<out_dir>.partial-<P>" whose process P no longer runs on this host
// (a run killed by a signal or a file-size limit), so they do not pile up. Does not create it.
std::string partial_dir_for(const std::string& out_dir);

class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws InputError (naming the path) if it cannot be opened or is
  // not a valid safetensors file.
  static SafetensorsFile open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // All tensors, sorted by data offset.
  const std::vector<SafetensorsEntry>& entries() const { return header_.entries; }
  // nullptr if absent.
  const SafetensorsEntry* find(std::string_view name) const;
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  // Zero-copy view of a tensor's bytes inside the mapping. InputError naming file and tensor if
  // absent.
  std::span<const uint8_t> bytes(std::string_view name) const;
  // CPU copy of a tensor, with the file's shape. InputError if absent or if its dtype has no
  // qshard DType.
  Tensor get(std::string_view name) const;
  // Drops this process's mapped pages of tensor `name` (madvise MADV_DONTNEED over the pages it
  // touches): a later access reads them again from the file. Keeps the resident size flat when a
  // large file is scanned once, tensor by tensor. No effect for a zero-size tensor.
  void release_pages(std::string_view name) const;
  // "__metadata__" (empty if the file has none).
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // Where the data starts: 8 + N.
  uint64_t data_offset() const { return header_.data_offset; }
  uint64_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  const SafetensorsEntry& require(std::string_view name) const;
  void unmap();

  std::string path_;
  const uint8_t* map_ = nullptr;  // whole file, PROT_READ
  uint64_t size_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in header_.entries
};

class SafetensorsWriter {
 public:
  explicit SafetensorsWriter(std::string path);
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  // If finish() did not complete: closes and removes the temp file.
  ~SafetensorsWriter();

  // REQUIRES: before begin(). Duplicate names, "__metadata__", names that are not UTF-8 and
  // negative dims throw Error.
  void declare(std::string name, DType dtype, Shape shape);
  // Same for a dtype qshard has no DType for ("F64", "F8_E4M3", "F4", ...); the element count
  // times the dtype's bits must be a whole number of bytes.
  void declare_raw(std::string name, std::string_view dtype_name, Shape shape);
  // Opens the temp file and writes the 8-byte header length and the JSON header (metadata first
  // if non-empty, then the tensors in declaration order), padded with spaces to a multiple of 8.
  void begin(const std::map<std::string, std::string>& metadata = {});
  // Appends `bytes` to tensor `name`. Tensors are written in declaration order (zero-size ones
  // may be skipped); one tensor may take several calls until its size is reached. Writing a
  // tensor before an earlier one is complete, or past its size, throws Error.
  void write(std::string_view name, std::span<const uint8_t> bytes);
  // REQUIRES: every tensor complete (else Error naming the first incomplete one).
  // fflush + fsync, rename onto path(), fsync the directory.
  void finish();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  // Total file size once finished (known after begin()).
  uint64_t file_size() const { return header_bytes_ + data_bytes_; }

 private:
  struct Pending {
    std::string name;
    std::string dtype_name;
    Shape shape;
    uint64_t nbytes = 0;
    uint64_t written = 0;
  };
  enum class State { kDeclaring, kWriting, kFinished, kFailed };

  void declare_checked(std::string name, std::string dtype_name, Shape shape);
  [[noreturn]] void fail_io(const char* what);
  void discard_temp();

  std::string path_;
  std::string temp_path_;
  State state_ = State::kDeclaring;
  std::vector<Pending> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  size_t current_ = 0;          // first tensor that may still be incomplete
  uint64_t header_bytes_ = 0;   // 8 + N
  uint64_t data_bytes_ = 0;     // sum of tensor sizes
  std::FILE* file_ = nullptr;
};

// Writes `tensors` (CPU tensors; Error otherwise) in the given order with `metadata`, through
// SafetensorsWriter (same atomicity and errors).
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace qshard
