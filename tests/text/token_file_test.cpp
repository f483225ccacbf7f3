#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "runtime/error.h"
#include "common/test_util.h"
#include "text/token_file.h"

namespace qshard {
namespace {

using testing_util::read_bytes;
using testing_util::error_of;
using testing_util::TempDir;
using testing_util::write_bytes;


std::string header(const char* magic, uint32_t version, uint32_t vocab, uint64_t n, uint32_t dtype, uint32_t reserved) {
  std::string h(32, '\0');
  std::memcpy(h.data(), magic, 8);
  std::memcpy(h.data() + 8, &version, 4);
  std::memcpy(h.data() + 12, &vocab, 4);
  std::memcpy(h.data() + 16, &n, 8);
  std::memcpy(h.data() + 24, &dtype, 4);
  std::memcpy(h.data() + 28, &reserved, 4);
  return h;
}

std::string u32s(std::initializer_list<uint32_t> v) {
  std::string s;
  for (uint32_t x : v) s.append(reinterpret_cast<const char*>(&x), 4);
  return s;
}

TEST(TokenFile, RoundTripAndExactBytes) {
  TempDir dir;
  const std::string path = dir.file("a.tok");
  const std::vector<uint32_t> tokens = {256, 72, 105, 257, 0, 255};
  {
    TokenFileWriter w(path, 258);
    w.append(std::span(tokens).first(2));
    w.append(std::span(tokens).subspan(2));
    EXPECT_EQ(w.num_tokens(), 6);
    w.finish();
  }
  // The documented layout, byte for byte.
  EXPECT_EQ(read_bytes(path), header("QSTOKENS", 1, 258, 6, 4, 0) + u32s({256, 72, 105, 257, 0, 255}));
  const TokenFile f = TokenFile::open(path);
  EXPECT_EQ(f.vocab_size(), 258u);
  ASSERT_EQ(f.size(), 6);
  EXPECT_EQ(std::vector<uint32_t>(f.tokens().begin(), f.tokens().end()), tokens);
  EXPECT_EQ(f[3], 257u);
  EXPECT_NO_THROW(f.validate(258));
  // No temp file left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()), {}), 1);
}

TEST(TokenFile, EmptyTokenStream) {
  TempDir dir;
  write_token_file(dir.file("e.tok"), 10, {});
  const TokenFile f = TokenFile::open(dir.file("e.tok"));
  EXPECT_EQ(f.size(), 0);
}

TEST(TokenFile, ValidateReportsFirstOffendingToken) {
  TempDir dir;
  const std::string path = dir.file("v.tok");
  write_bytes(path, header("QSTOKENS", 1, 258, 4, 4, 0) + u32s({1, 2, 300, 999}));
  const TokenFile f = TokenFile::open(path);  // values are not scanned at open
  EXPECT_EQ(error_of([&] { f.validate(1000); }),
            path + ": token 300 at index 2 is >= the file's vocab_size 258");
  write_token_file(dir.file("w.tok"), 258, std::vector<uint32_t>{5, 200, 7});
  const TokenFile g = TokenFile::open(dir.file("w.tok"));
  EXPECT_EQ(error_of([&] { g.validate(100); }),
            dir.file("w.tok") + ": token 200 at index 1 is >= the model's vocab size 100 (the file says 258)");
}

// A tokenize killed while writing leaves PATH.tmp.PID; the next write of PATH removes it once
// that process no longer runs (a live writer's is left alone).
TEST(TokenFile, AKilledWritersTempFileIsRemovedByTheNext) {
  TempDir dir;
  const std::string p = dir.file("k.tok");
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  const std::string dead = p + ".tmp." + std::to_string(child), live = p + ".tmp.1";
  write_bytes(dead, "partial");
  write_bytes(live, "init's");
  write_token_file(p, 10, std::vector<uint32_t>{1, 2});
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(live));
  EXPECT_EQ(TokenFile::open(p).size(), 2);
}

TEST(TokenFile, EveryBadInputNamesTheFile) {
  TempDir dir;
  const std::string p = dir.file("bad.tok");
  auto open_err = [&](const std::string& bytes) {
    write_bytes(p, bytes);
    return error_of([&] { TokenFile::open(p); });
  };
  EXPECT_EQ(error_of([&] { TokenFile::open(dir.file("missing.tok")); }).rfind(dir.file("missing.tok") + ": cannot open", 0), 0u);
  EXPECT_EQ(open_err(""), p + ": truncated: 0 bytes, shorter than the 32-byte token file header");
  EXPECT_EQ(open_err("QSTOKENS"), p + ": truncated: 8 bytes, shorter than the 32-byte token file header");
  EXPECT_EQ(open_err(header("QSTOKENZ", 1, 258, 0, 4, 0)),
            p + ": bad magic: not a token file (expected the bytes \"QSTOKENS\" at offset 0)");
  EXPECT_EQ(open_err(header("QSTOKENS", 5, 258, 0, 4, 0)), p + ": unsupported token file version 5 (expected 1 to 4)");
  EXPECT_EQ(open_err(header("QSTOKENS", 1, 0, 0, 4, 0)), p + ": vocab_size is 0 in the header (expected > 0)");
  // A masked file's ids leave its flag bits free: a vocabulary past them is a corrupt header.
  EXPECT_EQ(open_err(header("QSTOKENS", 2, 4294967295u, 0, 4, 0)),
            p + ": vocab_size 4294967295 in the header does not fit the 31-bit ids of a version 2 file");
  EXPECT_EQ(open_err(header("QSTOKENS", 3, (1u << 30) + 1, 0, 4, 0)),
            p + ": vocab_size 1073741825 in the header does not fit the 30-bit ids of a version 3 file");
  write_bytes(p, header("QSTOKENS", 3, 1u << 30, 0, 4, 0));
  EXPECT_NO_THROW(TokenFile::open(p));
  EXPECT_EQ(open_err(header("QSTOKENS", 1, 258, 0, 2, 0)), p + ": unsupported token dtype code 2 (expected 4 = uint32)");
  EXPECT_EQ(open_err(header("QSTOKENS", 1, 258, 0, 4, 9)), p + ": reserved header field is 9 (expected 0)");
  EXPECT_EQ(open_err(header("QSTOKENS", 1, 258, 3, 4, 0) + u32s({1, 2})),
            p + ": truncated: header says 3 tokens (12 bytes) but the file has 8 data bytes");
  EXPECT_EQ(open_err(header("QSTOKENS", 1, 258, 1, 4, 0) + u32s({1}) + "xy"),
            p + ": 2 trailing bytes after the 1 tokens the header declares");
  EXPECT_EQ(open_err(header("QSTOKENS", 1, 258, ~uint64_t{0}, 4, 0)).find("truncated: header says"), p.size() + 2);
  EXPECT_NE(error_of([&] { TokenFile::open(dir.file("")); }).find("not a regular file"), std::string::npos);
}

TEST(TokenFileWriter, RejectsOutOfVocabAndLeavesNothing) {
  TempDir dir;
  const std::string path = dir.file("x.tok");
  {
    TokenFileWriter w(path, 258);
    w.append(std::vector<uint32_t>{1, 2});
    EXPECT_EQ(error_of([&] { w.append(std::vector<uint32_t>{3, 258}); }),
              path + ": token 258 (at index 3) is >= vocab_size 258");
  }  // destroyed unfinished
  EXPECT_TRUE(std::filesystem::is_empty(std::filesystem::path(path).parent_path()));
  EXPECT_NE(error_of([&] { TokenFileWriter w(dir.file("no/such/dir/x.tok"), 258); }).find("creating"),
            std::string::npos);
}

TEST(TokenFile, MoveKeepsTheMapping) {
  TempDir dir;
  write_token_file(dir.file("m.tok"), 258, std::vector<uint32_t>{9, 8, 7});
  TokenFile a = TokenFile::open(dir.file("m.tok"));
  TokenFile b = std::move(a);
  EXPECT_EQ(b[2], 7u);
  a = std::move(b);
  EXPECT_EQ(a.size(), 3);
}

}  // namespace
}  // namespace qshard
