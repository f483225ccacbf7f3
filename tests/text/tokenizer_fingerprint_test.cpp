// Token files carry the fingerprint of the tokenizer that made them (text/tokenizer_fingerprint.h,
// token_file.h version 4); a model with another tokenizer refuses them, naming both.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "common/test_util.h"
#include "runtime/error.h"
#include "text/byte_tokenizer.h"
#include "text/tokenizer_fingerprint.h"

namespace qshard {
namespace {

using testing_util::error_of;
using testing_util::read_bytes;
using testing_util::TempDir;
using testing_util::write_bytes;

// A small tokenizer.json (only its bytes matter here: the fingerprint does not load it).
const std::string kTokenizerJson =
    R"({"version": "1.0", "added_tokens": [{"id": 3, "content": "<s>", "special": true}],
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})";

TEST(TokenizerFingerprint, CanonicalJsonIgnoresLayoutButNotContent) {
  const uint64_t a = tokenizer_json_fingerprint(kTokenizerJson, "a");
  // The same JSON with other whitespace and key order: the same fingerprint.
  const std::string reordered =
      R"({"model":{"merges":["a b"],"vocab":{"ab":2,"b":1,"a":0},"type":"BPE"},
          "added_tokens":[{"special":true,"content":"<s>","id":3}],"version":"1.0"})";
  EXPECT_EQ(tokenizer_json_fingerprint(reordered, "b"), a);
  // One id changed: another tokenizer.
  std::string changed = kTokenizerJson;
  changed.replace(changed.find("\"ab\": 2"), 7, "\"ab\": 4");
  EXPECT_NE(tokenizer_json_fingerprint(changed, "c"), a);
  EXPECT_NE(a, kByteTokenizerFingerprint);
  EXPECT_NE(a, kNoTokenizerFingerprint);
  EXPECT_EQ(fingerprint_name(kByteTokenizerFingerprint), "byte");
  EXPECT_EQ(fingerprint_name(kNoTokenizerFingerprint), "none");
  EXPECT_EQ(fingerprint_name(0x0123456789abcdefull), "fnv64:0123456789abcdef");
  EXPECT_NE(error_of([] { tokenizer_json_fingerprint("{\"model\": [", "bad.json"); }).find("bad.json"),
            std::string::npos);
}

TEST(TokenizerFingerprint, TokenizeWritesVersion4WithTheByteTokenizer) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "hello");
  tokenize_files({dir.file("a.txt")}, {}, dir.file("a.tok"));
  const std::string bytes = read_bytes(dir.file("a.tok"));
  ASSERT_EQ(bytes.size(), kTokenFileHeaderBytesV4 + 4 * 7);  // BOS + 5 bytes + EOS after a 64-byte header
  uint32_t version = 0;
  uint64_t fp = 0;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&fp, bytes.data() + 32, 8);
  EXPECT_EQ(version, kTokenFileVersionTokenizer);
  EXPECT_EQ(fp, kByteTokenizerFingerprint);
  const TokenFile f = TokenFile::open(dir.file("a.tok"));
  EXPECT_EQ(f.version(), 4u);
  EXPECT_EQ(f.tokenizer_fingerprint(), kByteTokenizerFingerprint);
  EXPECT_TRUE(f.doc_starts());
  EXPECT_EQ(f[0], kByteBos | kTokenDocStart);
  EXPECT_EQ(f[1], static_cast<uint32_t>('h'));
  // A model built from model.init, or a folder without tokenizer.json, takes the byte tokenizer.
  EXPECT_EQ(check_token_file_tokenizer(f, model_tokenizer("")), "");
  std::filesystem::create_directories(dir.file("plain_model"));
  EXPECT_EQ(check_token_file_tokenizer(f, model_tokenizer(dir.file("plain_model"))), "");
}

TEST(TokenizerFingerprint, AModelWithAnotherTokenizerRefusesTheFileNamingBoth) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("model"));
  write_bytes(dir.file("model/tokenizer.json"), kTokenizerJson);
  const ModelTokenizer m = model_tokenizer(dir.file("model"));
  EXPECT_EQ(m.fingerprint, tokenizer_json_fingerprint(kTokenizerJson, "x"));
  EXPECT_EQ(m.source, dir.file("model") + "/tokenizer.json");
  // Made with the byte tokenizer, read for a model with a tokenizer.json: refused, naming the file,
  // both fingerprints and the model's tokenizer.json.
  write_bytes(dir.file("a.txt"), "hello");
  tokenize_files({dir.file("a.txt")}, {}, dir.file("byte.tok"));
  const std::string err = error_of([&] { check_token_file_tokenizer(TokenFile::open(dir.file("byte.tok")), m); });
  std::printf("%s\n", err.c_str());
  EXPECT_NE(err.find(dir.file("byte.tok") + ": made by another tokenizer (byte)"), std::string::npos) << err;
  EXPECT_NE(err.find(m.source), std::string::npos) << err;
  EXPECT_NE(err.find(fingerprint_name(m.fingerprint)), std::string::npos) << err;
  // A file recording that tokenizer is taken; the byte model refuses it.
  {
    TokenFileWriter w(dir.file("hf.tok"), 4, true, true, m.fingerprint);
    w.append(std::vector<uint32_t>{3 | kTokenDocStart, 2, 0});
    w.finish();
  }
  const TokenFile hf = TokenFile::open(dir.file("hf.tok"));
  EXPECT_EQ(check_token_file_tokenizer(hf, m), "");
  EXPECT_NE(error_of([&] { check_token_file_tokenizer(hf, model_tokenizer("")); }).find("the byte tokenizer (a model built from model.init) (byte)"),
            std::string::npos);
}

TEST(TokenizerFingerprint, AnOldFileRecordsNoneAndIsTakenWithAWarning) {
  TempDir dir;
  {
    TokenFileWriter w(dir.file("v3.tok"), kByteVocabSize, true, true);  // version 3: no fingerprint
    w.append(std::vector<uint32_t>{kByteBos | kTokenDocStart, 'x', kByteEos});
    w.finish();
  }
  const TokenFile f = TokenFile::open(dir.file("v3.tok"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.tokenizer_fingerprint(), kNoTokenizerFingerprint);
  const std::string warning = check_token_file_tokenizer(f, model_tokenizer(""));
  EXPECT_NE(warning.find("records no tokenizer"), std::string::npos) << warning;
  EXPECT_EQ(warning.find('\n'), std::string::npos);  // one line
}

TEST(TokenizerFingerprint, MalformedVersion4HeadersAreNamed) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "hi");
  tokenize_files({dir.file("a.txt")}, {}, dir.file("a.tok"));
  const std::string good = read_bytes(dir.file("a.tok"));
  auto error_with = [&](size_t at, std::string patch) {
    std::string b = good;
    b.replace(at, patch.size(), patch);
    write_bytes(dir.file("b.tok"), b);
    return error_of([&] { TokenFile::open(dir.file("b.tok")); });
  };
  EXPECT_NE(error_with(32, std::string(8, '\0')).find("tokenizer fingerprint is 0"), std::string::npos);
  EXPECT_NE(error_with(50, "\x01").find("reserved header byte 50 is 1"), std::string::npos);
  // A version 4 file cut inside its 64-byte header.
  write_bytes(dir.file("c.tok"), good.substr(0, 48));
  EXPECT_NE(error_of([&] { TokenFile::open(dir.file("c.tok")); }).find("shorter than the 64-byte header"),
            std::string::npos);
  // Version 5 does not exist.
  EXPECT_NE(error_with(8, std::string("\x05\0\0\0", 4)).find("unsupported token file version 5 (expected 1 to 4)"),
            std::string::npos);
}

}  // namespace
}  // namespace qshard
