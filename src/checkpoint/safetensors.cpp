#include "checkpoint/safetensors.h"


#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <unordered_set>

#include <fmt/format.h>

#include "runtime/input_file.h"
#include "runtime/json_field.h"
#include "runtime/mapped_files.h"
#include "runtime/log.h"

namespace qshard {

namespace {

using ojson = nlohmann::ordered_json;

// Upstream safetensors 0.8.0 dtypes and their element sizes in bits.
struct DtypeBits {
  const char* name;
  uint32_t bits;
};
constexpr DtypeBits kDtypeBits[] = {
    {"BOOL", 8},     {"F4", 4},           {"F6_E2M3", 6},      {"F6_E3M2", 6}, {"U8", 8},   {"I8", 8},
    {"F8_E5M2", 8},  {"F8_E4M3", 8},      {"F8_E8M0", 8},      {"F8_E4M3FNUZ", 8},         {"F8_E5M2FNUZ", 8},
    {"I16", 16},     {"U16", 16},         {"F16", 16},         {"BF16", 16},   {"I32", 32}, {"U32", 32},
    {"F32", 32},     {"C64", 64},         {"F64", 64},         {"I64", 64},    {"U64", 64},
};
constexpr DType kAllDTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kU8, DType::kI32, DType::kI64};

std::string known_dtypes_list() {
  std::string s;
  for (const auto& d : kDtypeBits) {
    if (!s.empty()) s += ' ';
    s += d.name;
  }
  return s;
}

// Returns the offset of the first byte that does not continue a valid UTF-8 sequence, or
// npos when `s` is valid UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    size_t len;
    unsigned lo = 0x80, hi = 0xbf;  // allowed range of the second byte
    if (c < 0x80) { ++i; continue; }
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;  // no overlongs
      if (c == 0xed) hi = 0x9f;  // no surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;  // <= U+10FFFF
    } else {
      return i;
    }
    if (n - i < len) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xbf) return i;
    i += len;
  }
  return std::string_view::npos;
}

const char* json_type(const ojson& j) { return j.type_name(); }

// Non-negative JSON integer (nlohmann stores those as number_unsigned).
bool as_u64(const ojson& j, uint64_t* out) {
  if (!j.is_number_unsigned()) {
    // "-0" parses as a signed zero; accept it as 0.
    if (j.is_number_integer() && j.get<int64_t>() == 0) { *out = 0; return true; }
    return false;
  }
  *out = j.get<uint64_t>();
  return true;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

// SAX consumer that builds an ordered_json, rejecting duplicate keys and deep nesting.
class StrictJsonBuilder {
 public:
  using number_integer_t = ojson::number_integer_t;
  using number_unsigned_t = ojson::number_unsigned_t;
  using number_float_t = ojson::number_float_t;
  using string_t = ojson::string_t;
  using binary_t = ojson::binary_t;
  static constexpr size_t kMaxDepth = 64;

  explicit StrictJsonBuilder(std::string_view label) : label_(label) {}

  bool null() { put(nullptr); return true; }
  bool boolean(bool v) { put(v); return true; }
  bool number_integer(number_integer_t v) { put(v); return true; }
  bool number_unsigned(number_unsigned_t v) { put(v); return true; }
  bool number_float(number_float_t v, const string_t&) { put(v); return true; }
  bool string(string_t& v) { put(std::move(v)); return true; }
  bool binary(binary_t& v) { put(ojson::binary(std::move(v))); return true; }
  bool start_object(size_t) { check_depth(); open(ojson::object()); return true; }
  bool start_array(size_t) { check_depth(); open(ojson::array()); return true; }
  void check_depth() const {
    if (stack_.size() + 1 > static_cast<size_t>(kMaxJsonDepth))
      throw InputError(fmt::format("{}: JSON nested more than {} levels deep; refused", label_, kMaxJsonDepth));
  }
  bool end_object() { close(); return true; }
  bool end_array() { close(); return true; }
  bool key(string_t& k) {
    Frame& f = stack_.back();
    if (!f.keys.insert(k).second)
      throw InputError(fmt::format("{}: duplicate key \"{}\" in a JSON object at depth {} (every tensor name "
                                   "and key may appear only once)",
                                   label_, k, stack_.size()));
    // Uniqueness is already established: append without ordered_map's linear search.
    auto& items = static_cast<std::vector<std::pair<const std::string, ojson>>&>(
        f.value->get_ref<ojson::object_t&>());
    items.emplace_back(std::move(k), nullptr);
    slot_ = &items.back().second;
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& ex) {
    throw InputError(fmt::format("{}: not valid JSON: {}", label_, json_error_text(ex)));
  }

  ojson take() { return std::move(root_); }

 private:
  struct Frame {
    ojson* value;
    std::unordered_set<std::string> keys;
  };

  ojson* put(ojson v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    ojson* top = stack_.back().value;
    if (top->is_array()) {
      top->push_back(std::move(v));
      return &top->back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  void open(ojson v) {
    if (stack_.size() >= kMaxDepth)
      throw InputError(fmt::format("{}: JSON nested deeper than {} levels", label_, kMaxDepth));
    ojson* p = put(std::move(v));
    stack_.push_back(Frame{p, {}});
  }
  void close() { stack_.pop_back(); }

  std::string label_;
  ojson root_;
  std::vector<Frame> stack_;
  ojson* slot_ = nullptr;  // value slot of the last key in the innermost object
};

// Looks up `key` in a (small) JSON object; nullptr if absent.
const ojson* member(const ojson& obj, std::string_view key) {
  for (const auto& [k, v] : obj.items())
    if (k == key) return &v;
  return nullptr;
}

SafetensorsEntry parse_entry(std::string_view label, const std::string& name, const ojson& v) {
  auto bad = [&](const std::string& what) {
    return InputError(fmt::format("{}: tensor \"{}\": {}", label, name, what));
  };
  if (!v.is_object())
    throw bad(fmt::format("entry must be an object {{\"dtype\", \"shape\", \"data_offsets\"}}, got {}", json_type(v)));
  SafetensorsEntry e;
  e.name = name;

  const ojson* dtype = member(v, "dtype");
  if (!dtype) throw bad("missing \"dtype\"");
  if (!dtype->is_string()) throw bad(fmt::format("\"dtype\" must be a string, got {}", json_type(*dtype)));
  e.dtype_name = dtype->get<std::string>();
  const std::optional<uint32_t> bits = safetensors_dtype_bits(e.dtype_name);
  if (!bits) throw bad(fmt::format("unknown dtype \"{}\" (expected one of: {})", e.dtype_name, known_dtypes_list()));
  e.dtype = safetensors_to_dtype(e.dtype_name);

  const ojson* shape = member(v, "shape");
  if (!shape) throw bad("missing \"shape\"");
  if (!shape->is_array()) throw bad(fmt::format("\"shape\" must be an array of non-negative integers, got {}", json_type(*shape)));
  uint64_t numel = 1;
  bool numel_overflow = false;
  for (const ojson& d : *shape) {
    uint64_t dim = 0;
    if (!as_u64(d, &dim))
      throw bad(fmt::format("\"shape\" must be an array of non-negative integers, found {} {}", json_type(d), d.dump()));
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw bad(fmt::format("shape dimension {} does not fit in int64", dim));
    e.shape.push_back(static_cast<int64_t>(dim));
    numel_overflow = numel_overflow || mul_overflows(numel, dim, &numel);
  }
  if (numel_overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw bad(fmt::format("element count of shape {} overflows int64", shape_str(e.shape)));

  const ojson* offsets = member(v, "data_offsets");
  if (!offsets) throw bad("missing \"data_offsets\"");
  if (!offsets->is_array() || offsets->size() != 2 || !as_u64((*offsets)[0], &e.begin) ||
      !as_u64((*offsets)[1], &e.end))
    throw bad(fmt::format("\"data_offsets\" must be an array of 2 non-negative integers, got {}", offsets->dump()));
  if (e.begin > e.end) throw bad(fmt::format("data_offsets [{}, {}]: begin > end", e.begin, e.end));

  uint64_t nbits = 0;
  if (mul_overflows(numel, *bits, &nbits))
    throw bad(fmt::format("byte size of shape {} of {} overflows", shape_str(e.shape), e.dtype_name));
  if (nbits % 8 != 0)
    throw bad(fmt::format("shape {} of {} is {} bits, not a whole number of bytes", shape_str(e.shape),
                          e.dtype_name, nbits));
  if (e.end - e.begin != nbits / 8)
    throw bad(fmt::format("data_offsets [{}, {}] span {} bytes but shape {} of {} needs {} bytes", e.begin,
                          e.end, e.end - e.begin, shape_str(e.shape), e.dtype_name, nbits / 8));
  return e;
}

// ---- atomic file writing -------------------------------------------------------------------

std::string temp_path_for(const std::string& path) {
  remove_stale_partials(path, ".tmp.");  // a killed writer's temp file
  return path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
}

[[noreturn]] void throw_io(const std::string& path, const std::string& what, int err) {
  throw InputError(fmt::format("{}: {} failed: {}", path, what, std::strerror(err)));
}

std::FILE* open_temp(const std::string& final_path, const std::string& temp_path) {
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_io(final_path, fmt::format("creating temp file \"{}\"", temp_path), errno);
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    const int err = errno;
    ::close(fd);
    ::unlink(temp_path.c_str());
    throw_io(final_path, "fdopen", err);
  }
  return f;
}

void fsync_parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io(path, fmt::format("opening directory \"{}\" to fsync it", dir), errno);
  // Some filesystems cannot fsync a directory (EINVAL); the rename itself has been done.
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int err = errno;
    ::close(fd);
    throw_io(path, fmt::format("fsync of directory \"{}\"", dir), err);
  }
  ::close(fd);
}

}  // namespace

// ---- dtypes ----------------------------------------------------------------------------------

std::optional<uint32_t> safetensors_dtype_bits(std::string_view dtype_name) {
  for (const auto& d : kDtypeBits)
    if (dtype_name == d.name) return d.bits;
  return std::nullopt;
}

std::optional<DType> safetensors_to_dtype(std::string_view dtype_name) {
  for (DType t : kAllDTypes)
    if (dtype_name == dtype_safetensors_name(t)) return t;
  return std::nullopt;
}

// ---- parsing ---------------------------------------------------------------------------------

nlohmann::ordered_json parse_json_strict(std::string_view text, std::string_view label) {
  // nlohmann's lexer takes a NUL byte for the end of input ("{}\0junk" would parse); a raw NUL is
  // never valid JSON (inside strings it must be escaped), so reject it up front.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    throw InputError(fmt::format("{}: not valid JSON: NUL byte at offset {}", label, nul));
  // nlohmann also skips a UTF-8 byte order mark, which JSON (RFC 8259) and upstream reject.
  if (text.starts_with("\xef\xbb\xbf"))
    throw InputError(fmt::format("{}: not valid JSON: starts with a UTF-8 byte order mark", label));
  StrictJsonBuilder builder(label);
  const bool ok = ojson::sax_parse(text.begin(), text.end(), &builder, ojson::input_format_t::json,
                                   /*strict=*/true, /*ignore_comments=*/false);
  if (!ok) throw InputError(fmt::format("{}: not valid JSON", label));
  return builder.take();
}

SafetensorsHeader parse_safetensors_header(std::span<const uint8_t> file_bytes, std::string_view label) {
  const uint64_t size = file_bytes.size();
  if (size < 8)
    throw InputError(fmt::format("{}: file is {} bytes, shorter than the 8-byte header length of a safetensors "
                                 "file", label, size));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file_bytes[i];
  if (n > kSafetensorsMaxHeaderBytes)
    throw InputError(fmt::format("{}: header length {} exceeds the limit of {} bytes", label, n,
                                 kSafetensorsMaxHeaderBytes));
  if (n > size - 8)
    throw InputError(fmt::format("{}: header length {} needs {} bytes but the file has only {}", label, n, 8 + n,
                                 size));
  const std::string_view text(reinterpret_cast<const char*>(file_bytes.data() + 8), n);
  if (const size_t bad = find_invalid_utf8(text); bad != std::string_view::npos)
    throw InputError(fmt::format("{}: header is not valid UTF-8 (byte {} of the header)", label, bad));

  const ojson root = parse_json_strict(text, fmt::format("{}: header", label));
  if (!root.is_object())
    throw InputError(fmt::format("{}: header must be a JSON object, got {}", label, json_type(root)));

  SafetensorsHeader h;
  h.data_offset = 8 + n;
  h.entries.reserve(root.size());
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (value.is_null()) continue;  // upstream reads null as "no metadata"
      if (!value.is_object())
        throw InputError(fmt::format("{}: \"__metadata__\" must be an object of strings, got {}", label,
                                     json_type(value)));
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          throw InputError(fmt::format("{}: \"__metadata__\" value of \"{}\" must be a string, got {}", label, mk,
                                       json_type(mv)));
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    h.entries.push_back(parse_entry(label, key, value));
  }

  std::stable_sort(h.entries.begin(), h.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : h.entries) {
    if (e.begin > covered)
      throw InputError(fmt::format("{}: tensor \"{}\": data_offsets [{}, {}] leave a gap of {} bytes after {} "
                                   "(offsets must be contiguous from 0)",
                                   label, e.name, e.begin, e.end, e.begin - covered,
                                   prev ? "tensor \"" + prev->name + "\"" : std::string("the data start")));
    if (e.begin < covered)
      throw InputError(fmt::format("{}: tensor \"{}\": data_offsets [{}, {}] overlap tensor \"{}\" which ends at "
                                   "{}",
                                   label, e.name, e.begin, e.end, prev->name, covered));
    covered = e.end;
    prev = &e;
  }
  const uint64_t data_len = size - 8 - n;
  if (covered != data_len)
    throw InputError(fmt::format("{}: tensors cover {} data bytes (data end {}) but the file has {} data bytes "
                                 "(file size {}){}",
                                 label, covered, covered <= std::numeric_limits<uint64_t>::max() - 8 - n
                                                     ? std::to_string(8 + n + covered) : std::string("overflows"),
                                 data_len, size, prev ? " after tensor \"" + prev->name + "\"" : std::string()));
  return h;
}

// ---- SafetensorsFile -------------------------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  // A folder, FIFO or device is refused by name before it is opened (a FIFO would block open() for
  // ever); O_NONBLOCK and the fstat below catch one swapped in after the check.
  check_input_file(path, "safetensors file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw InputError(fmt::format("{}: cannot open safetensors file: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw InputError(fmt::format("{}: fstat failed: {}", path, std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(fmt::format("{}: not a regular file (expected a .safetensors file)", path));
  }
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw InputError(fmt::format("{}: mmap of {} bytes failed: {}", path, f.size_, std::strerror(err)));
    }
    f.map_ = static_cast<const uint8_t*>(p);
    register_mapping(p, f.size_, path);  // a truncation while it is read: named, exit 2
  }
  ::close(fd);  // the mapping keeps the file open
  f.header_ = parse_safetensors_header(std::span<const uint8_t>(f.map_, f.size_), path);
  for (size_t i = 0; i < f.header_.entries.size(); ++i) f.index_.emplace(f.header_.entries[i].name, i);
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      header_(std::move(other.header_)),
      index_(std::move(other.index_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
    header_ = std::move(other.header_);
    index_ = std::move(other.index_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() {
  if (map_) {
    unregister_mapping(map_);
    ::munmap(const_cast<uint8_t*>(map_), size_);
  }
  map_ = nullptr;
  size_ = 0;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.entries[it->second];
}

const SafetensorsEntry& SafetensorsFile::require(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) throw InputError(fmt::format("{}: no tensor named \"{}\" in this file ({} tensors)", path_, name,
                                       header_.entries.size()));
  return *e;
}

void SafetensorsFile::release_pages(std::string_view name) const {
  const SafetensorsEntry& e = require(name);
  if (e.nbytes() == 0 || !map_) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t base = reinterpret_cast<uintptr_t>(map_);
  const uintptr_t begin = base + header_.data_offset + e.begin, end = begin + e.nbytes();
  const uintptr_t lo = begin / page * page, hi = std::min((end + page - 1) / page * page, base + size_);
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);  // advisory: errors ignored
}

std::span<const uint8_t> SafetensorsFile::bytes(std::string_view name) const {
  const SafetensorsEntry& e = require(name);
  if (e.nbytes() == 0) return {};
  return {map_ + header_.data_offset + e.begin, static_cast<size_t>(e.nbytes())};
}

Tensor SafetensorsFile::get(std::string_view name) const {
  const SafetensorsEntry& e = require(name);
  if (!e.dtype)
    throw InputError(fmt::format("{}: tensor \"{}\" has dtype {}, which qshard has no DType for (expected F32, "
                                 "BF16, F16, U8, I32 or I64; read it with bytes())",
                                 path_, e.name, e.dtype_name));
  return Tensor::from_bytes(e.shape, *e.dtype, bytes(name));
}

// ---- SafetensorsWriter -----------------------------------------------------------------------

SafetensorsWriter::SafetensorsWriter(std::string path) : path_(std::move(path)) {}

SafetensorsWriter::~SafetensorsWriter() {
  if (state_ != State::kFinished) discard_temp();
}

void SafetensorsWriter::discard_temp() {
  if (file_) {
    std::fclose(file_);
    file_ = nullptr;
  }
  if (state_ == State::kWriting || state_ == State::kFailed) ::unlink(temp_path_.c_str());
}

void SafetensorsWriter::fail_io(const char* what) {
  const int err = errno;
  discard_temp();
  state_ = State::kFailed;
  throw InputError(fmt::format("{}: {} (temp file \"{}\") failed: {}", path_, what, temp_path_, std::strerror(err)));
}

void SafetensorsWriter::declare(std::string name, DType dtype, Shape shape) {
  declare_checked(std::move(name), dtype_safetensors_name(dtype), std::move(shape));
}

void SafetensorsWriter::declare_raw(std::string name, std::string_view dtype_name, Shape shape) {
  declare_checked(std::move(name), std::string(dtype_name), std::move(shape));
}

void SafetensorsWriter::declare_checked(std::string name, std::string dtype_name, Shape shape) {
  const auto bad = [&](const std::string& what) {
    return Error(fmt::format("SafetensorsWriter({}): tensor \"{}\": {}", path_, name, what));
  };
  if (state_ != State::kDeclaring) throw bad("declare() after begin()");
  if (name == "__metadata__") throw bad("the name \"__metadata__\" is reserved");
  if (find_invalid_utf8(name) != std::string_view::npos) throw bad("name is not valid UTF-8");
  if (index_.count(name)) throw bad("declared twice");
  const std::optional<uint32_t> bits = safetensors_dtype_bits(dtype_name);
  if (!bits) throw bad(fmt::format("unknown safetensors dtype \"{}\"", dtype_name));
  const int64_t numel = shape_numel(shape);  // throws Error on negative dims / overflow
  uint64_t nbits = 0;
  if (mul_overflows(static_cast<uint64_t>(numel), *bits, &nbits)) throw bad("byte size overflows");
  if (nbits % 8 != 0) throw bad(fmt::format("{} elements of {} are not a whole number of bytes", numel, dtype_name));
  Pending p{std::move(name), std::move(dtype_name), std::move(shape), nbits / 8, 0};
  if (__builtin_add_overflow(data_bytes_, p.nbytes, &data_bytes_)) throw bad("total data size overflows");
  index_.emplace(p.name, tensors_.size());
  tensors_.push_back(std::move(p));
}

void SafetensorsWriter::begin(const std::map<std::string, std::string>& metadata) {
  if (state_ != State::kDeclaring)
    throw Error(fmt::format("SafetensorsWriter({}): begin() called twice or after a failure", path_));
  ojson header = ojson::object();
  if (!metadata.empty()) {
    ojson meta = ojson::object();
    for (const auto& [k, v] : metadata) {
      if (find_invalid_utf8(k) != std::string_view::npos || find_invalid_utf8(v) != std::string_view::npos)
        throw Error(fmt::format("SafetensorsWriter({}): metadata key \"{}\" or its value is not valid UTF-8", path_, k));
      meta[k] = v;
    }
    header["__metadata__"] = std::move(meta);
  }
  // Names are unique (declare() checked them): append to the object's item vector directly.
  // ordered_json's push_back searches the items for the key first, which made a header of n
  // tensors cost O(n^2) (40k tensors: 12 s); this is O(n) and writes the same bytes.
  auto& items = static_cast<std::vector<std::pair<const std::string, ojson>>&>(header.get_ref<ojson::object_t&>());
  items.reserve(items.size() + tensors_.size());
  uint64_t offset = 0;
  for (const Pending& p : tensors_) {
    ojson entry = ojson::object();
    entry["dtype"] = p.dtype_name;
    entry["shape"] = p.shape;
    entry["data_offsets"] = {offset, offset + p.nbytes};
    offset += p.nbytes;
    items.emplace_back(p.name, std::move(entry));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kSafetensorsMaxHeaderBytes)
    throw Error(fmt::format("SafetensorsWriter({}): header of {} bytes exceeds the safetensors limit of {}", path_,
                            text.size(), kSafetensorsMaxHeaderBytes));
  header_bytes_ = 8 + text.size();

  check_output_file(path_, "output file");
  temp_path_ = temp_path_for(path_);
  file_ = open_temp(path_, temp_path_);
  state_ = State::kWriting;
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  if (std::fwrite(len, 1, 8, file_) != 8) fail_io("write");
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size()) fail_io("write");
}

namespace {

// Test hook: QSHARD_TEST_DISK_FULL=<text> makes every tensor write of a writer whose path holds
// <text> fail with ENOSPC, as on a full disk (the header is written first: a partial temp file).
bool disk_full_for_test(const std::string& path) {
  static const char* const text = std::getenv("QSHARD_TEST_DISK_FULL");
  return text && *text && path.find(text) != std::string::npos;
}

}  // namespace

void SafetensorsWriter::write(std::string_view name, std::span<const uint8_t> bytes) {
  if (state_ != State::kWriting)
    throw Error(fmt::format("SafetensorsWriter({}): write(\"{}\") outside begin()..finish()", path_, name));
  const auto it = index_.find(name);
  if (it == index_.end())
    throw Error(fmt::format("SafetensorsWriter({}): write to undeclared tensor \"{}\"", path_, name));
  const size_t idx = it->second;
  for (size_t j = current_; j < idx; ++j)
    if (tensors_[j].written != tensors_[j].nbytes)
      throw Error(fmt::format("SafetensorsWriter({}): tensor \"{}\" written before \"{}\" is complete ({} of {} "
                              "bytes); tensors must be written in declaration order",
                              path_, name, tensors_[j].name, tensors_[j].written, tensors_[j].nbytes));
  Pending& p = tensors_[idx];
  if (bytes.size() > p.nbytes - p.written)
    throw Error(fmt::format("SafetensorsWriter({}): tensor \"{}\": {} more bytes would exceed its size of {} "
                            "bytes ({} already written)",
                            path_, name, bytes.size(), p.nbytes, p.written));
  if (idx > current_) current_ = idx;
  if (bytes.empty()) return;
  if (disk_full_for_test(path_)) {
    errno = ENOSPC;
    fail_io("write");
  }
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) fail_io("write");
  p.written += bytes.size();
}

void SafetensorsWriter::finish() {
  if (state_ != State::kWriting)
    throw Error(fmt::format("SafetensorsWriter({}): finish() without begin(), twice, or after a failure", path_));
  for (const Pending& p : tensors_)
    if (p.written != p.nbytes)
      throw Error(fmt::format("SafetensorsWriter({}): finish() with tensor \"{}\" incomplete ({} of {} bytes)", path_,
                              p.name, p.written, p.nbytes));
  if (std::fflush(file_) != 0) fail_io("fflush");
  if (::fsync(::fileno(file_)) != 0) fail_io("fsync");
  std::FILE* f = std::exchange(file_, nullptr);
  if (std::fclose(f) != 0) fail_io("close");
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) fail_io("rename onto the final path");
  state_ = State::kFinished;
  fsync_parent_dir(path_);
}

// ---- helpers ---------------------------------------------------------------------------------

std::string partial_dir_for(const std::string& out_dir) {
  remove_stale_partials(out_dir, ".partial-");
  return out_dir + ".partial-" + std::to_string(::getpid());
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  check_output_file(path, "output file");
  const std::string temp = temp_path_for(path);
  std::FILE* f = open_temp(path, temp);
  const auto fail = [&](const char* what) {
    const int err = errno;
    if (f) std::fclose(f);
    ::unlink(temp.c_str());
    throw_io(path, fmt::format("{} (temp file \"{}\")", what, temp), err);
  };
  if (std::fwrite(contents.data(), 1, contents.size(), f) != contents.size()) fail("write");
  if (std::fflush(f) != 0) fail("fflush");
  if (::fsync(::fileno(f)) != 0) fail("fsync");
  const int rc = std::fclose(std::exchange(f, nullptr));
  if (rc != 0) fail("close");
  if (::rename(temp.c_str(), path.c_str()) != 0) fail("rename onto the final path");
  fsync_parent_dir(path);
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter w(path);
  for (const auto& [name, t] : tensors) {
    if (!t.defined() || t.device() != Device::kCpu)
      throw Error(fmt::format("save_safetensors({}): tensor \"{}\" must be a defined CPU tensor", path, name));
    w.declare(name, t.dtype(), t.shape());
  }
  w.begin(metadata);
  for (const auto& [name, t] : tensors) w.write(name, t.bytes());
  w.finish();
}

}  // namespace qshard
