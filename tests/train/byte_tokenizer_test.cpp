#include <gtest/gtest.h>

#include <filesystem>

#include "runtime/error.h"
#include "test_util.h"
#include "train/byte_tokenizer.h"
#include "train/token_file.h"

namespace qshard {
namespace {

using testing_util::TempDir;
using testing_util::write_bytes;

std::vector<uint32_t> read_all(const std::string& path) {
  const TokenFile f = TokenFile::open(path);
  return {f.tokens().begin(), f.tokens().end()};
}

TEST(ByteTokenizer, DocumentIsBosBytesEos) {
  EXPECT_EQ(byte_tokenize("Hi\n"), (std::vector<uint32_t>{256, 72, 105, 10, 257}));
  EXPECT_EQ(byte_tokenize(""), (std::vector<uint32_t>{256, 257}));
  // UTF-8 is byte by byte: "é" = C3 A9.
  EXPECT_EQ(byte_tokenize("\xC3\xA9"), (std::vector<uint32_t>{256, 0xC3, 0xA9, 257}));
  EXPECT_EQ(byte_detokenize(byte_tokenize("ab")), "ab\n");
  EXPECT_EQ(byte_detokenize(std::vector<uint32_t>{97, 999}), "a\xEF\xBF\xBD");
}

TEST(ByteTokenizer, TextOneDocumentPerFileByDefault) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "ab\n\ncd\n");
  write_bytes(dir.file("empty.txt"), "");
  write_bytes(dir.file("b.txt"), "z");
  const auto stats = tokenize_files({dir.file("a.txt"), dir.file("empty.txt"), dir.file("b.txt")}, {}, dir.file("o.tok"));
  EXPECT_EQ(stats.files, 3);
  EXPECT_EQ(stats.documents, 2);
  EXPECT_EQ(stats.bytes, 8);
  EXPECT_EQ(stats.tokens, 12);
  EXPECT_EQ(read_all(dir.file("o.tok")),
            (std::vector<uint32_t>{256, 'a', 'b', '\n', '\n', 'c', 'd', '\n', 257, 256, 'z', 257}));
  EXPECT_EQ(TokenFile::open(dir.file("o.tok")).vocab_size(), kByteVocabSize);
}

TEST(ByteTokenizer, TextSplitOnBlankLines) {
  TokenizeOptions o;
  o.text_split = TextSplit::kBlankLines;
  const auto docs = split_documents("\n\nfirst line\nsecond\n \t\r\n\nthird\r\n", InputFormat::kText, o, "x.txt");
  EXPECT_EQ(docs, (std::vector<std::string>{"first line\nsecond", "third\r"}));
}

TEST(ByteTokenizer, JsonlFieldAndErrors) {
  TempDir dir;
  write_bytes(dir.file("d.jsonl"), "{\"text\": \"hi\", \"id\": 1}\n\n{\"text\": \"\"}\n{\"text\": \"\\u00e9\"}\n");
  const auto stats = tokenize_files({dir.file("d.jsonl")}, {}, dir.file("o.tok"));  // auto: by extension
  EXPECT_EQ(stats.documents, 2);
  EXPECT_EQ(read_all(dir.file("o.tok")), (std::vector<uint32_t>{256, 'h', 'i', 257, 256, 0xC3, 0xA9, 257}));

  TokenizeOptions o;
  o.format = InputFormat::kJsonl;
  o.jsonl_field = "content";
  write_bytes(dir.file("c.txt"), "{\"content\": \"x\"}\n");
  EXPECT_EQ(tokenize_files({dir.file("c.txt")}, o, dir.file("c.tok")).tokens, 3);

  auto err = [&](const std::string& contents) {
    write_bytes(dir.file("bad.jsonl"), contents);
    try {
      tokenize_files({dir.file("bad.jsonl")}, {}, dir.file("bad.tok"));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string f = dir.file("bad.jsonl");
  EXPECT_EQ(err("{\"text\": \"a\"}\n{\"txt\": \"b\"}\n").rfind(f + ":2: no field \"text\"", 0), 0u);
  EXPECT_EQ(err("{\"text\": 5}\n"), f + ":1: field \"text\" is number, expected a string");
  EXPECT_EQ(err("[1, 2]\n"), f + ":1: expected a JSON object per line, got array");
  EXPECT_EQ(err("{\"text\": \"a\"}\n{oops\n").rfind(f + ":2: not valid JSON", 0), 0u);
  EXPECT_FALSE(std::filesystem::exists(dir.file("bad.tok")));  // failed runs leave no output
}

TEST(ByteTokenizer, InputErrors) {
  TempDir dir;
  EXPECT_THROW(tokenize_files({}, {}, dir.file("o.tok")), InputError);
  EXPECT_THROW(tokenize_files({dir.file("missing.txt")}, {}, dir.file("o.tok")), InputError);
  // The output may not be one of the inputs (it would be overwritten); the input survives.
  const std::string in = dir.file("in.txt");
  testing_util::write_bytes(in, "hello");
  try {
    tokenize_files({in}, {}, in);
    ADD_FAILURE() << "tokenize X --out X was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("is also an input"), std::string::npos) << e.what();
  }
  EXPECT_EQ(testing_util::read_bytes(in), "hello");
  // A folder or a device as input is refused by name.
  EXPECT_THROW(tokenize_files({dir.file("")}, {}, dir.file("o.tok")), InputError);
  try {
    tokenize_files({"/dev/zero"}, {}, dir.file("o.tok"));
    ADD_FAILURE() << "/dev/zero was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/zero is a character device"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_input_format("jsonl"), InputFormat::kJsonl);
  EXPECT_THROW(parse_input_format("csv"), InputError);
}

TEST(ByteTokenizer, ShippedText) {
  TempDir dir;
  const auto stats =
      tokenize_files({std::string(QSHARD_SOURCE_DIR) + "/data/persuasion_vol1.txt"}, {}, dir.file("p.tok"));
  EXPECT_EQ(stats.documents, 1);
  EXPECT_EQ(stats.bytes, 215526);
  const TokenFile f = TokenFile::open(dir.file("p.tok"));
  EXPECT_NO_THROW(f.validate(kByteVocabSize));
  EXPECT_EQ(byte_detokenize(f.tokens().subspan(1, 10)), "Persuasion");
}

}  // namespace
}  // namespace qshard
