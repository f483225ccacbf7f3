// Tests for checkpoint/safetensors.h: writer/reader round trips, byte-exact compatibility with
// upstream safetensors, every malformation the reader must reject, and a mutation replay that
// feeds thousands of corrupted files to the parser (only InputError may come out).
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <random>

namespace qshard {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "qshard_st_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }
  size_t count() const { return std::distance(fs::directory_iterator(path_), fs::directory_iterator()); }

 private:
  std::string path_;
};

// 8-byte little-endian length + header text (as given, no padding added) + data.
Bytes make_file_bytes(const std::string& header, const Bytes& data = {}, std::optional<uint64_t> length = {}) {
  Bytes out(8);
  const uint64_t n = length ? *length : header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Header entry {"dtype": .., "shape": .., "data_offsets": [b, e]} as JSON text.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b,
                  uint64_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}

// Asserts that `fn` throws InputError whose message contains every one of `parts`.
void expect_input_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected InputError, nothing thrown";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InputError, got another exception: " << e.what();
  }
}

// Writes a hand-made file and expects open() to reject it naming the path and `parts`.
void expect_rejected(const TempDir& dir, const Bytes& bytes, std::initializer_list<std::string> parts) {
  const std::string path = dir.file("bad.safetensors");
  write_file(path, bytes);
  std::vector<std::string> all(parts);
  all.push_back(path);
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << "expected InputError for a malformed file";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const std::string& p : all) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InputError, got: " << e.what();
  }
}

Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng() | 1u);  // never all zero
  return t;
}

// ---- round trips ---------------------------------------------------------------------------------

TEST(SafetensorsWriter, RoundTripEveryDTypeWithMetadata) {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  uint32_t seed = 1;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kU8, DType::kI32, DType::kI64}) {
    const std::string n = dtype_safetensors_name(t);
    tensors.emplace_back("w." + n, random_tensor({3, 5}, t, seed++));
    tensors.emplace_back("scalar." + n, random_tensor({}, t, seed++));      // 0-d
    tensors.emplace_back("empty." + n, random_tensor({0, 4}, t, seed++));   // zero-size
    tensors.emplace_back("vec." + n, random_tensor({7}, t, seed++));
  }
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"note", "h\xc3\xa9llo \"quoted\""}};
  save_safetensors(path, tensors, meta);

  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.metadata(), meta);
  EXPECT_EQ(f.data_offset() % 8, 0u);
  ASSERT_EQ(f.entries().size(), tensors.size());
  uint64_t prev_end = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    // Entries come back in data-offset order, which is declaration order.
    EXPECT_EQ(f.entries()[i].name, name);
    EXPECT_EQ(f.entries()[i].begin, prev_end);
    prev_end = f.entries()[i].end;
    const SafetensorsEntry* e = f.find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->dtype_name, dtype_safetensors_name(t.dtype()));
    ASSERT_TRUE(e->dtype.has_value());
    EXPECT_EQ(*e->dtype, t.dtype());
    EXPECT_EQ(e->shape, t.shape());
    const Tensor back = f.get(name);
    EXPECT_TRUE(bitwise_equal(back, t)) << name;
    const auto span = f.bytes(name);
    ASSERT_EQ(span.size(), t.nbytes());
    if (!span.empty()) {
      EXPECT_EQ(std::memcmp(span.data(), t.raw(), span.size()), 0);
    }
  }
  EXPECT_EQ(f.file_size(), f.data_offset() + prev_end);
  EXPECT_FALSE(f.contains("nope"));
  EXPECT_EQ(f.find("nope"), nullptr);
  expect_input_error([&] { f.bytes("nope"); }, {path, "nope"});
  expect_input_error([&] { f.get("nope"); }, {path, "nope"});
}

TEST(SafetensorsWriter, HeaderPaddedToMultipleOf8) {
  TempDir dir;
  // Names of lengths 1..9 move the header length through every residue mod 8.
  for (int len = 1; len <= 9; ++len) {
    const std::string path = dir.file("p" + std::to_string(len) + ".safetensors");
    save_safetensors(path, {{std::string(len, 'a'), Tensor::from_vector<float>({2}, DType::kF32, {1.f, 2.f})}});
    const Bytes b = read_file(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
    EXPECT_EQ(n % 8, 0u) << len;
    // Padding is spaces right after the closing brace.
    const std::string text(b.begin() + 8, b.begin() + 8 + n);
    const size_t close = text.find_last_of('}');
    EXPECT_EQ(text.find_first_not_of(' ', close + 1), std::string::npos) << text;
    EXPECT_LT(n - (close + 1), 8u);
    EXPECT_EQ(SafetensorsFile::open(path).get(std::string(len, 'a')).to_f32_vector(), (std::vector<float>{1.f, 2.f}));
  }
}

// The byte layouts below are the ones upstream safetensors' own unit tests expect.
TEST(SafetensorsWriter, ByteIdenticalToUpstreamSerialize) {
  TempDir dir;
  const std::string path = dir.file("attn.safetensors");
  save_safetensors(path, {{"attn.0", Tensor::from_vector<float>({1, 2, 3}, DType::kF32, {0, 1, 2, 3, 4, 5})}});
  const std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(header.size(), 64u);
  Bytes data;
  for (float v : {0.f, 1.f, 2.f, 3.f, 4.f, 5.f}) {
    uint8_t b[4];
    std::memcpy(b, &v, 4);
    data.insert(data.end(), b, b + 4);
  }
  EXPECT_EQ(read_file(path), make_file_bytes(header, data));

  const std::string empty = dir.file("empty.safetensors");
  save_safetensors(empty, {});
  EXPECT_EQ(read_file(empty), make_file_bytes("{}      "));
  save_safetensors(empty, {}, {{"framework", "pt"}});
  EXPECT_EQ(read_file(empty), make_file_bytes(R"({"__metadata__":{"framework":"pt"}}     )"));
  const SafetensorsFile f = SafetensorsFile::open(empty);
  EXPECT_TRUE(f.entries().empty());
  EXPECT_EQ(f.metadata().at("framework"), "pt");
}

TEST(SafetensorsWriter, ChunkedWritesAndZeroSizeSkipping) {
  TempDir dir;
  const std::string path = dir.file("chunks.safetensors");
  const Tensor a = random_tensor({1000}, DType::kF32, 7);
  const Tensor b = random_tensor({33}, DType::kBF16, 8);
  SafetensorsWriter w(path);
  w.declare("a", DType::kF32, {1000});
  w.declare("z", DType::kI64, {0});  // zero-size: never needs a write
  w.declare("b", DType::kBF16, {33});
  w.begin();
  const auto ab = a.bytes();
  for (size_t off = 0; off < ab.size(); off += 7) w.write("a", ab.subspan(off, std::min<size_t>(7, ab.size() - off)));
  w.write("b", b.bytes().first(1));
  w.write("b", {});
  w.write("b", b.bytes().subspan(1));
  EXPECT_FALSE(fs::exists(path));  // nothing under the final name before finish()
  w.finish();
  EXPECT_EQ(w.file_size(), fs::file_size(path));
  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_TRUE(bitwise_equal(f.get("a"), a));
  EXPECT_TRUE(bitwise_equal(f.get("b"), b));
  EXPECT_EQ(f.get("z").numel(), 0);
  EXPECT_EQ(dir.count(), 1u);  // no temp file left
}

TEST(SafetensorsWriter, MisuseThrowsError) {
  TempDir dir;
  SafetensorsWriter w(dir.file("m.safetensors"));
  w.declare("a", DType::kF32, {2});
  EXPECT_THROW(w.declare("a", DType::kF32, {2}), Error);
  EXPECT_THROW(w.declare("__metadata__", DType::kF32, {2}), Error);
  EXPECT_THROW(w.declare("neg", DType::kF32, {-1}), Error);
  EXPECT_THROW(w.declare_raw("odd", "F4", {3}), Error);  // 12 bits
  EXPECT_THROW(w.declare_raw("bad", "F128", {3}), Error);
  EXPECT_THROW(w.write("a", {}), Error);  // before begin()
  EXPECT_THROW(w.finish(), Error);
  w.declare("b", DType::kU8, {3});
  w.begin();
  EXPECT_THROW(w.declare("c", DType::kF32, {2}), Error);
  const uint8_t buf[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  EXPECT_THROW(w.write("b", std::span(buf, 3)), Error);   // wrong order: "a" first
  EXPECT_THROW(w.write("a", std::span(buf, 9)), Error);   // too many bytes
  EXPECT_THROW(w.write("x", std::span(buf, 1)), Error);   // undeclared
  w.write("a", std::span(buf, 8));
  EXPECT_THROW(w.write("a", std::span(buf, 1)), Error);   // already complete
  EXPECT_THROW(w.finish(), Error);                        // "b" incomplete
  w.write("b", std::span(buf, 2));
  try {
    w.finish();
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"b\""), std::string::npos) << e.what();
  }
  w.write("b", std::span(buf + 2, 1));
  w.finish();
  EXPECT_THROW(w.finish(), Error);
  EXPECT_EQ(SafetensorsFile::open(dir.file("m.safetensors")).bytes("b")[2], 3);
}

TEST(SafetensorsWriter, DestructorWithoutFinishLeavesNoFile) {
  TempDir dir;
  const std::string path = dir.file("abandoned.safetensors");
  std::string temp;
  {
    SafetensorsWriter w(path);
    w.declare("a", DType::kF32, {4});
    w.begin();
    temp = w.temp_path();
    EXPECT_TRUE(fs::exists(temp));
    const float v[2] = {1, 2};
    w.write("a", std::span(reinterpret_cast<const uint8_t*>(v), 8));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(temp));
  EXPECT_EQ(dir.count(), 0u);

  // An existing file under the final name survives an abandoned rewrite untouched.
  save_safetensors(path, {{"old", Tensor::from_vector<int32_t>({1}, DType::kI32, {42})}});
  const Bytes before = read_file(path);
  {
    SafetensorsWriter w(path);
    w.declare("new", DType::kF32, {4});
    w.begin();
  }
  EXPECT_EQ(read_file(path), before);
  EXPECT_EQ(dir.count(), 1u);
}

TEST(SafetensorsWriter, UnwritableDirectoryGivesInputError) {
  TempDir dir;
  const std::string missing = dir.file("no/such/dir/x.safetensors");
  expect_input_error([&] {
    SafetensorsWriter w(missing);
    w.declare("a", DType::kF32, {1});
    w.begin();
  }, {missing, std::strerror(ENOENT)});
  write_file(dir.file("plainfile"), {1});
  const std::string under_file = dir.file("plainfile/x.safetensors");
  expect_input_error([&] { save_safetensors(under_file, {}); }, {under_file, std::strerror(ENOTDIR)});
  if (::geteuid() != 0) {  // root ignores directory permissions
    const std::string ro = dir.file("ro");
    fs::create_directory(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    expect_input_error([&] { save_safetensors(ro + "/x.safetensors", {}); }, {ro, std::strerror(EACCES)});
    fs::permissions(ro, fs::perms::owner_all);
  }
}

// A full disk as seen by write(): RLIMIT_FSIZE makes writes past the limit fail with EFBIG.
TEST(SafetensorsWriter, FailedWriteGivesInputErrorAndRemovesTemp) {
  TempDir dir;
  const std::string path = dir.file("big.safetensors");
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 16 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  const Tensor t = random_tensor({64 * 1024}, DType::kU8, 3);
  expect_input_error([&] { save_safetensors(path, {{"t", t}}); }, {path, std::strerror(EFBIG)});
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(dir.count(), 0u);
}

TEST(SafetensorsWriter, SaveRejectsUndefinedTensor) {
  TempDir dir;
  EXPECT_THROW(save_safetensors(dir.file("u.safetensors"), {{"a", Tensor()}}), Error);
  EXPECT_EQ(dir.count(), 0u);
}

// ---- dtypes qshard has no DType for ----------------------------------------------------------------

TEST(SafetensorsFile, NonQshardDtypeOpensButGetThrows) {
  TempDir dir;
  const std::string path = dir.file("f64.safetensors");
  const double vals[3] = {1.5, -2.25, 1e300};
  SafetensorsWriter w(path);
  w.declare_raw("d", "F64", {3});
  w.declare_raw("fp4", "F4", {2, 2});  // 4 x 4 bits = 2 bytes
  w.declare("ok", DType::kI32, {1});
  w.begin();
  w.write("d", std::span(reinterpret_cast<const uint8_t*>(vals), sizeof(vals)));
  const uint8_t fp4[2] = {0x12, 0x34};
  w.write("fp4", fp4);
  const int32_t one = 1;
  w.write("ok", std::span(reinterpret_cast<const uint8_t*>(&one), 4));
  w.finish();

  const SafetensorsFile f = SafetensorsFile::open(path);
  const SafetensorsEntry* e = f.find("d");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype_name, "F64");
  EXPECT_FALSE(e->dtype.has_value());
  EXPECT_EQ(e->shape, (Shape{3}));
  ASSERT_EQ(f.bytes("d").size(), sizeof(vals));
  EXPECT_EQ(std::memcmp(f.bytes("d").data(), vals, sizeof(vals)), 0);
  EXPECT_EQ(f.find("fp4")->nbytes(), 2u);
  expect_input_error([&] { f.get("d"); }, {path, "\"d\"", "F64"});
  expect_input_error([&] { f.get("fp4"); }, {path, "fp4", "F4"});
  EXPECT_EQ(f.get("ok").data<int32_t>()[0], 1);
}

TEST(SafetensorsFile, DtypeTable) {
  EXPECT_EQ(safetensors_dtype_bits("BF16"), 16u);
  EXPECT_EQ(safetensors_dtype_bits("F4"), 4u);
  EXPECT_EQ(safetensors_dtype_bits("F6_E3M2"), 6u);
  EXPECT_EQ(safetensors_dtype_bits("F8_E8M0"), 8u);
  EXPECT_EQ(safetensors_dtype_bits("C64"), 64u);
  EXPECT_EQ(safetensors_dtype_bits("bf16"), std::nullopt);
  EXPECT_EQ(safetensors_to_dtype("I64"), DType::kI64);
  EXPECT_EQ(safetensors_to_dtype("BOOL"), std::nullopt);
  EXPECT_EQ(safetensors_to_dtype("float32"), std::nullopt);  // only safetensors spellings
}

// ---- valid hand-made files -------------------------------------------------------------------------

TEST(SafetensorsFile, AcceptsUnpaddedUnorderedHeadersAndExtraKeys) {
  TempDir dir;
  const std::string path = dir.file("ok.safetensors");
  // Header order differs from data order; an unknown key inside an entry is ignored (as upstream).
  const std::string header = "{" + entry("second", "U8", "[2]", 2, 4) + "," + entry("first", "U8", "[2]", 0, 2) +
                             ",\"zero\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4],\"extra\":[1]}}";
  write_file(path, make_file_bytes(header, {10, 11, 12, 13}));
  const SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.entries().size(), 3u);
  EXPECT_EQ(f.entries()[0].name, "first");
  EXPECT_EQ(f.entries()[1].name, "second");
  EXPECT_EQ(f.bytes("second")[1], 13);
  EXPECT_EQ(f.data_offset(), 8 + header.size());
  EXPECT_TRUE(f.bytes("zero").empty());

  write_file(path, make_file_bytes("{}"));
  EXPECT_TRUE(SafetensorsFile::open(path).entries().empty());
  write_file(path, make_file_bytes("  {\"__metadata__\":{}}  "));
  EXPECT_TRUE(SafetensorsFile::open(path).metadata().empty());
}

TEST(SafetensorsFile, MoveKeepsMapping) {
  TempDir dir;
  const std::string path = dir.file("mv.safetensors");
  save_safetensors(path, {{"a", Tensor::from_vector<int64_t>({2}, DType::kI64, {5, 6})}});
  SafetensorsFile a = SafetensorsFile::open(path);
  SafetensorsFile b = std::move(a);
  EXPECT_EQ(b.get("a").data<int64_t>()[1], 6);
  SafetensorsFile c = SafetensorsFile::open(path);
  c = std::move(b);
  EXPECT_EQ(c.get("a").data<int64_t>()[0], 5);
}

// ---- malformed files: each rejected with the path, the tensor, and what was wrong -----------------

TEST(SafetensorsFileMalformed, ShortFileAndBadLengths) {
  TempDir dir;
  expect_rejected(dir, {}, {"0 bytes", "shorter than the 8-byte"});
  expect_rejected(dir, {1, 0, 0, 0, 0}, {"5 bytes", "shorter than the 8-byte"});
  expect_rejected(dir, make_file_bytes("{}", {}, 100'000'001), {"100000001", "exceeds the limit"});
  expect_rejected(dir, make_file_bytes("{}", {}, ~uint64_t{0}), {"exceeds the limit"});
  expect_rejected(dir, make_file_bytes("{}", {}, 3), {"header length 3 needs 11 bytes", "has only 10"});
}

TEST(SafetensorsFileMalformed, HeaderNotUtf8OrJsonOrObject) {
  TempDir dir;
  expect_rejected(dir, make_file_bytes("{\"a\xff\":1}"), {"not valid UTF-8", "byte 3"});
  expect_rejected(dir, make_file_bytes("{\"\xed\xa0\x80\":1}"), {"not valid UTF-8"});  // surrogate
  expect_rejected(dir, make_file_bytes("{\"\xc0\xaf\":1}"), {"not valid UTF-8"});      // overlong
  expect_rejected(dir, make_file_bytes("{\"a\":"), {"not valid JSON"});
  expect_rejected(dir, make_file_bytes("{} {}"), {"not valid JSON"});
  // nlohmann alone would stop at the NUL and accept this.
  expect_rejected(dir, make_file_bytes(std::string("{}\0\0", 4)), {"not valid JSON", "NUL byte at offset 2"});
  expect_rejected(dir, make_file_bytes(std::string("{}\0{\"a\":1}", 11)), {"not valid JSON", "NUL"});
  expect_rejected(dir, make_file_bytes(""), {"not valid JSON"});
  expect_rejected(dir, make_file_bytes("[]"), {"must be a JSON object", "array"});
  expect_rejected(dir, make_file_bytes("\"x\""), {"must be a JSON object", "string"});
  expect_rejected(dir, make_file_bytes(std::string(100, '[') + std::string(100, ']')), {"nested deeper"});
}

TEST(SafetensorsFileMalformed, BadEntries) {
  TempDir dir;
  expect_rejected(dir, make_file_bytes("{\"w\":5}"), {"\"w\"", "must be an object"});
  expect_rejected(dir, make_file_bytes("{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", {0}),
                  {"\"w\"", "missing \"dtype\""});
  expect_rejected(dir, make_file_bytes("{\"w\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", {0}),
                  {"\"w\"", "\"dtype\" must be a string"});
  expect_rejected(dir, make_file_bytes("{" + entry("w", "F128", "[1]", 0, 16) + "}", Bytes(16)),
                  {"\"w\"", "unknown dtype \"F128\"", "BF16"});
  expect_rejected(dir, make_file_bytes("{" + entry("w", "bf16", "[1]", 0, 2) + "}", Bytes(2)),
                  {"\"w\"", "unknown dtype \"bf16\""});
  expect_rejected(dir, make_file_bytes("{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", {0}),
                  {"\"w\"", "missing \"shape\""});
  expect_rejected(dir, make_file_bytes("{" + entry("w", "U8", "1", 0, 1) + "}", {0}),
                  {"\"w\"", "\"shape\" must be an array"});
  expect_rejected(dir, make_file_bytes("{" + entry("w", "U8", "[-1]", 0, 1) + "}", {0}),
                  {"\"w\"", "non-negative integers", "-1"});
  expect_rejected(dir, make_file_bytes("{" + entry("w", "U8", "[1.0]", 0, 1) + "}", {0}),
                  {"\"w\"", "non-negative integers"});
  expect_rejected(dir, make_file_bytes("{" + entry("w", "U8", "[\"1\"]", 0, 1) + "}", {0}),
                  {"\"w\"", "non-negative integers"});
  expect_rejected(dir, make_file_bytes("{" + entry("w", "U8", "[9223372036854775808,0]", 0, 0) + "}"),
                  {"\"w\"", "does not fit in int64"});
  expect_rejected(dir, make_file_bytes("{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", {0}),
                  {"\"w\"", "missing \"data_offsets\""});
  for (const std::string offs : {"[0]", "[0,1,2]", "[-1,0]", "[0,1.5]", "\"0,1\"", "[0,18446744073709551616]"}) {
    expect_rejected(dir, make_file_bytes("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":" + offs + "}}", {0}),
                    {"\"w\"", "\"data_offsets\" must be an array of 2 non-negative integers"});
  }
}

TEST(SafetensorsFileMalformed, DuplicateNames) {
  TempDir dir;
  const std::string header = "{" + entry("w", "U8", "[1]", 0, 1) + "," + entry("w", "U8", "[1]", 1, 2) + "}";
  expect_rejected(dir, make_file_bytes(header, {1, 2}), {"duplicate key \"w\""});
  // Duplicate keys inside an entry are rejected too.
  expect_rejected(dir, make_file_bytes("{\"w\":{\"dtype\":\"U8\",\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                                       {1}),
                  {"duplicate key \"dtype\""});
}

TEST(SafetensorsFileMalformed, OffsetsNotContiguous) {
  TempDir dir;
  // Gap at the start.
  expect_rejected(dir, make_file_bytes("{" + entry("w", "U8", "[2]", 1, 3) + "}", Bytes(3)),
                  {"\"w\"", "gap of 1 bytes", "contiguous"});
  // Gap between tensors.
  expect_rejected(dir, make_file_bytes("{" + entry("a", "U8", "[2]", 0, 2) + "," + entry("b", "U8", "[2]", 3, 5) + "}",
                                       Bytes(5)),
                  {"\"b\"", "gap", "\"a\""});
  // Overlap.
  expect_rejected(dir, make_file_bytes("{" + entry("a", "U8", "[2]", 0, 2) + "," + entry("b", "U8", "[2]", 1, 3) + "}",
                                       Bytes(3)),
                  {"\"b\"", "overlap tensor \"a\""});
  // Both tensors at the same place.
  expect_rejected(dir, make_file_bytes("{" + entry("a", "U8", "[2]", 0, 2) + "," + entry("b", "U8", "[2]", 0, 2) + "}",
                                       Bytes(2)),
                  {"overlap"});
  // begin > end.
  expect_rejected(dir, make_file_bytes("{" + entry("w", "U8", "[2]", 3, 1) + "}", Bytes(3)),
                  {"\"w\"", "begin > end"});
}

TEST(SafetensorsFileMalformed, SizeMismatchAndOverflow) {
  TempDir dir;
  expect_rejected(dir, make_file_bytes("{" + entry("w", "F32", "[2,3]", 0, 20) + "}", Bytes(20)),
                  {"\"w\"", "span 20 bytes", "needs 24 bytes"});
  expect_rejected(dir, make_file_bytes("{" + entry("w", "F32", "[4611686018427387904,4]", 0, 0) + "}"),
                  {"\"w\"", "overflows"});
  expect_rejected(dir, make_file_bytes("{" + entry("w", "F64", "[2305843009213693952]", 0, 0) + "}"),
                  {"\"w\"", "overflows"});
  expect_rejected(dir, make_file_bytes("{" + entry("w", "F4", "[3]", 0, 2) + "}", Bytes(2)),
                  {"\"w\"", "not a whole number of bytes"});
  // F4 with an even count is valid (upstream accepts it), and zero dims are fine.
  const std::string ok = dir.file("ok.safetensors");
  write_file(ok, make_file_bytes("{" + entry("w", "F4", "[4]", 0, 2) + "," + entry("z", "BF16", "[5,0]", 2, 2) + "}",
                                 Bytes(2)));
  EXPECT_EQ(SafetensorsFile::open(ok).entries().size(), 2u);
}

TEST(SafetensorsFileMalformed, DataEndNotFileEnd) {
  TempDir dir;
  expect_rejected(dir, make_file_bytes("{" + entry("w", "U8", "[2]", 0, 2) + "}", Bytes(3)),
                  {"cover 2 data bytes", "has 3 data bytes", "\"w\""});
  expect_rejected(dir, make_file_bytes("{" + entry("w", "U8", "[2]", 0, 2) + "}", Bytes(1)),
                  {"cover 2 data bytes", "has 1 data bytes"});
  expect_rejected(dir, make_file_bytes("{}", Bytes(1)), {"cover 0 data bytes"});
  expect_rejected(dir, make_file_bytes("{" + entry("w", "U8", "[18446744073709551615]", 0, 18446744073709551615ull) +
                                       "}"),
                  {"\"w\""});
}

TEST(SafetensorsFileMalformed, BadMetadata) {
  TempDir dir;
  expect_rejected(dir, make_file_bytes("{\"__metadata__\":{\"format\":1}}"),
                  {"\"__metadata__\"", "\"format\"", "must be a string"});
  expect_rejected(dir, make_file_bytes("{\"__metadata__\":[]}"), {"\"__metadata__\" must be an object"});
  // null is "no metadata" upstream, so it is accepted.
  const std::string ok = dir.file("null_meta.safetensors");
  write_file(ok, make_file_bytes("{\"__metadata__\":null}"));
  EXPECT_TRUE(SafetensorsFile::open(ok).metadata().empty());
}

TEST(SafetensorsFileMalformed, NotAFile) {
  TempDir dir;
  expect_input_error([&] { SafetensorsFile::open(dir.file("missing.safetensors")); },
                     {dir.file("missing.safetensors"), std::strerror(ENOENT)});
  expect_input_error([&] { SafetensorsFile::open(dir.path()); }, {dir.path(), "not a regular file"});
}

// ---- mutation replay: corrupted files give InputError, never a crash --------------------------------

TEST(SafetensorsParse, RandomMutationsOnlyThrowInputError) {
  // A valid seed file with metadata, several dtypes and a zero-size tensor.
  TempDir dir;
  const std::string path = dir.file("seed.safetensors");
  save_safetensors(path,
                   {{"a", random_tensor({2, 3}, DType::kF32, 1)},
                    {"b.weight", random_tensor({4}, DType::kBF16, 2)},
                    {"z", random_tensor({0}, DType::kU8, 3)},
                    {"c", random_tensor({3}, DType::kI64, 4)}},
                   {{"format", "pt"}});
  const Bytes seed = read_file(path);
  std::mt19937_64 rng(12345);
  const std::string digits = "0123456789";
  const std::string specials = "{}[]\",:-.e 019\\";
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    Bytes b = seed;
    const int nmut = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < nmut; ++m) {
      if (b.empty()) break;
      const size_t pos = rng() % b.size();
      switch (rng() % 8) {
        case 0: b[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: b[pos] = static_cast<uint8_t>(rng()); break;
        case 2: b.resize(pos); break;
        case 3: b.insert(b.begin() + static_cast<long>(pos), static_cast<uint8_t>(specials[rng() % specials.size()])); break;
        case 4: b.erase(b.begin() + static_cast<long>(pos)); break;
        case 5: if (pos >= 8) b[pos] = static_cast<uint8_t>(digits[rng() % digits.size()]); break;
        case 6: b[rng() % std::min<size_t>(8, b.size())] = static_cast<uint8_t>(rng()); break;  // length prefix
        case 7: b[pos] = static_cast<uint8_t>(specials[rng() % specials.size()]); break;
      }
    }
    try {
      const SafetensorsHeader h = parse_safetensors_header(b, "mutant");
      ++accepted;
      // Whatever is accepted must be in bounds.
      for (const SafetensorsEntry& e : h.entries) {
        ASSERT_LE(e.begin, e.end);
        ASSERT_LE(h.data_offset + e.end, b.size());
      }
    } catch (const InputError& e) {
      ++rejected;
      ASSERT_NE(std::string(e.what()).find("mutant"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": unexpected exception type: " << e.what();
    }
  }
  std::printf("mutations: %d accepted, %d rejected\n", accepted, rejected);
  EXPECT_GT(rejected, 1000);
}

// ---- compatibility with the Python safetensors library ----------------------------------------------

// The tensors of scripts/golden/make_safetensors_golden.py (keep both in sync).
std::vector<std::pair<std::string, Tensor>> golden_tensors() {
  std::vector<std::pair<std::string, Tensor>> t;
  std::vector<float> f32(6), bf16(8), f16(5);
  for (int i = 0; i < 6; ++i) f32[i] = 0.5f * static_cast<float>(i) - 1.0f;
  for (int i = 0; i < 8; ++i) bf16[i] = 0.25f * static_cast<float>(i - 4);
  for (int i = 0; i < 5; ++i) f16[i] = 0.5f * static_cast<float>(i) + 1000.0f;
  std::vector<uint8_t> u8(10);
  for (int i = 0; i < 10; ++i) u8[i] = static_cast<uint8_t>(25 * i);
  std::vector<int32_t> i32(6);
  for (int i = 0; i < 6; ++i) i32[i] = 1000 * (i - 3);
  std::vector<int64_t> i64(4);
  for (int i = 0; i < 4; ++i) i64[i] = (int64_t{1} << 40) * i - 7;
  t.emplace_back("f32", Tensor::from_f32({2, 3}, DType::kF32, f32));
  t.emplace_back("bf16", Tensor::from_f32({2, 4}, DType::kBF16, bf16));
  t.emplace_back("f16", Tensor::from_f32({5}, DType::kF16, f16));
  t.emplace_back("u8", Tensor::from_vector<uint8_t>({10}, DType::kU8, u8));
  t.emplace_back("i32", Tensor::from_vector<int32_t>({3, 2}, DType::kI32, i32));
  t.emplace_back("i64", Tensor::from_vector<int64_t>({4}, DType::kI64, i64));
  t.emplace_back("scalar", Tensor::from_f32({}, DType::kF32, std::vector<float>{3.25f}));
  t.emplace_back("empty", Tensor::zeros({0, 4}, DType::kF32));
  return t;
}

TEST(SafetensorsPython, ReadsPythonWrittenGolden) {
  const std::string path = std::string(QSHARD_TEST_DATA_DIR) + "/safetensors/python_written.safetensors";
  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  const auto expected = golden_tensors();
  ASSERT_EQ(f.entries().size(), expected.size());
  for (const auto& [name, t] : expected) {
    ASSERT_TRUE(f.contains(name)) << name;
    const Tensor got = f.get(name);
    EXPECT_TRUE(bitwise_equal(got, t)) << name << " " << shape_str(got.shape());
  }
  std::printf("f32[5]=%g bf16[0]=%g f16[4]=%g i64[3]=%lld\n", f.get("f32").to_f32_vector()[5],
              f.get("bf16").to_f32_vector()[0], f.get("f16").to_f32_vector()[4],
              static_cast<long long>(f.get("i64").data<int64_t>()[3]));

  // Writing the same tensors in the file's data order reproduces Python's file byte for byte.
  TempDir dir;
  std::vector<std::pair<std::string, Tensor>> in_file_order;
  for (const SafetensorsEntry& e : f.entries()) in_file_order.emplace_back(e.name, f.get(e.name));
  save_safetensors(dir.file("same.safetensors"), in_file_order, f.metadata());
  EXPECT_EQ(read_file(dir.file("same.safetensors")), read_file(path));
}

// Writes the golden tensors with the C++ writer for `make_safetensors_golden.py --check FILE`.
// The file goes to $QSHARD_SAFETENSORS_CHECK_OUT when set (else to a temp dir, checked here only).
TEST(SafetensorsPython, WritesFileForPythonCheck) {
  TempDir dir;
  const char* env = std::getenv("QSHARD_SAFETENSORS_CHECK_OUT");
  const std::string path = env && *env ? std::string(env) : dir.file("cpp_written.safetensors");
  save_safetensors(path, golden_tensors(), {{"format", "pt"}});
  const SafetensorsFile f = SafetensorsFile::open(path);
  for (const auto& [name, t] : golden_tensors()) EXPECT_TRUE(bitwise_equal(f.get(name), t)) << name;
}

}  // namespace
}  // namespace qshard
