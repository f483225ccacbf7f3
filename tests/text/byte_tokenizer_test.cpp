#include <gtest/gtest.h>

#include <filesystem>

#include "runtime/error.h"
#include "common/test_util.h"
#include "model/llama_ops.h"
#include "text/byte_tokenizer.h"
#include "text/data_loader.h"
#include "text/record_reader.h"
#include "text/token_file.h"

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
            (std::vector<uint32_t>{256 | kTokenDocStart, 'a', 'b', '\n', '\n', 'c', 'd', '\n', 257, 256 | kTokenDocStart,
                                   'z', 257}));  // version 3: each document's first token flagged
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
  EXPECT_EQ(read_all(dir.file("o.tok")), (std::vector<uint32_t>{256 | kTokenDocStart, 'h', 'i', 257, 256 | kTokenDocStart, 0xC3, 0xA9, 257}));

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

// --max-record-bytes (TokenizeOptions::max_record_bytes): a record of exactly the limit loads, one
// byte more is refused naming file:line (the record's first line) and the limit, for each format.
std::string tokenize_error(const std::vector<std::string>& inputs, const TokenizeOptions& o, const std::string& out) {
  try {
    tokenize_files(inputs, o, out);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

TEST(ByteTokenizer, RecordLimitJsonlAndAlpaca) {
  TempDir dir;
  TokenizeOptions o;
  o.max_record_bytes = 32;
  const std::string line = "{\"text\": \"" + std::string(32 - 12, 'x') + "\"}";  // 32 bytes
  ASSERT_EQ(line.size(), 32u);
  const std::string f = dir.file("r.jsonl");
  testing_util::write_bytes(f, "{\"text\": \"a\"}\n" + line + "\n");
  EXPECT_EQ(tokenize_files({f}, o, dir.file("ok.tok")).documents, 2);
  testing_util::write_bytes(f, "{\"text\": \"a\"}\n\n" + line + " \n");  // 33 bytes on line 3
  EXPECT_EQ(tokenize_error({f}, o, dir.file("no.tok")),
            f + ":3: a record longer than 32 bytes (--max-record-bytes): refused before it is read whole; split it or "
                "raise --max-record-bytes");
  EXPECT_FALSE(std::filesystem::exists(dir.file("no.tok")));

  o.format = InputFormat::kAlpaca;
  const std::string rec = "{\"instruction\": \"i\", \"output\": \"" + std::string(10, 'o') + "\"}";
  o.max_record_bytes = static_cast<int64_t>(rec.size());
  testing_util::write_bytes(f, rec + "\n" + rec);  // the last line without '\n'
  EXPECT_EQ(tokenize_files({f}, o, dir.file("ok.tok")).documents, 2);
  testing_util::write_bytes(f, rec + "\n" + rec + "x");
  EXPECT_EQ(tokenize_error({f}, o, dir.file("no.tok")).rfind(f + ":2: a record longer than " + std::to_string(rec.size()) + " bytes", 0), 0u);
}

TEST(ByteTokenizer, RecordLimitParagraphsAndWholeFiles) {
  TempDir dir;
  TokenizeOptions o;
  o.max_record_bytes = 9;
  o.text_split = TextSplit::kBlankLines;
  const std::string f = dir.file("p.txt");
  testing_util::write_bytes(f, "abcd\nefgh\n\nxy\n");  // a paragraph of 9 bytes ("abcd\nefgh"), then one of 2
  EXPECT_EQ(tokenize_files({f}, o, dir.file("ok.tok")).documents, 2);
  testing_util::write_bytes(f, "xy\n\nabcd\nefghi\n");  // 10 bytes from line 3
  EXPECT_EQ(tokenize_error({f}, o, dir.file("no.tok")).rfind(f + ":3: a record longer than 9 bytes (--max-record-bytes)", 0), 0u);

  // --split file with the byte tokenizer streams the file: no limit applies, the same tokens.
  o.text_split = TextSplit::kFile;
  const std::string big(3 * RecordReader::kChunkBytes + 17, 'q');  // several pieces
  testing_util::write_bytes(f, big);
  const TokenizeStats st = tokenize_files({f}, o, dir.file("big.tok"));
  EXPECT_EQ(st.documents, 1);
  EXPECT_EQ(st.bytes, static_cast<int64_t>(big.size()));
  const std::vector<uint32_t> t = read_all(dir.file("big.tok"));
  ASSERT_EQ(t.size(), big.size() + 2);
  EXPECT_EQ(t.front(), 256 | kTokenDocStart);
  EXPECT_EQ(t[1 + RecordReader::kChunkBytes], uint32_t{'q'});
  EXPECT_EQ(t.back(), 257u);

  o.max_record_bytes = 0;
  EXPECT_NE(tokenize_error({f}, o, dir.file("no.tok")).find("--max-record-bytes '0': expected an integer in [1, "),
            std::string::npos);
}

// RecordReader: lines across its pieces, a last line without '\n', CR kept, line numbers.
TEST(RecordReader, LinesAcrossPieces) {
  TempDir dir;
  const std::string f = dir.file("l.txt");
  const std::string long_line(RecordReader::kChunkBytes + 5, 'z');
  testing_util::write_bytes(f, "a\r\n\n" + long_line + "\nend");
  RecordReader r(f, "input file", static_cast<int64_t>(long_line.size()), "--max-record-bytes");
  std::string line;
  ASSERT_TRUE(r.next_line(line));
  EXPECT_EQ(line, "a\r");
  ASSERT_TRUE(r.next_line(line));
  EXPECT_EQ(line, "");
  ASSERT_TRUE(r.next_line(line));
  EXPECT_EQ(line, long_line);
  ASSERT_TRUE(r.next_line(line));
  EXPECT_EQ(line, "end");
  EXPECT_EQ(r.line_no(), 4);
  EXPECT_FALSE(r.next_line(line));

  RecordReader tight(f, "input file", static_cast<int64_t>(long_line.size()) - 1, "--max-record-bytes");
  ASSERT_TRUE(tight.next_line(line));
  ASSERT_TRUE(tight.next_line(line));
  try {
    tight.next_line(line);
    ADD_FAILURE() << "a line over the limit was read";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(f + ":3: a record longer than", 0), 0u) << e.what();
  }
  EXPECT_THROW(RecordReader("/dev/zero", "input file", 10, "--max-record-bytes"), InputError);
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

namespace qshard {
namespace {

using testing_util::TempDir;
using testing_util::write_bytes;

// Instruction data (--format alpaca): BOS + the Alpaca prompt (context only) + the output + EOS
// (targets) per record; the file is version 3 (mask and document starts); counted by hand: the targets are the outputs'
// bytes plus one EOS per record, and exactly those reach the data loader as targets.
TEST(ByteTokenizer, AlpacaRecordsTrainOnTheResponseOnly) {
  TempDir dir;
  const std::string in = dir.file("data.jsonl"), out = dir.file("data.tok");
  write_bytes(in,
              "{\"instruction\": \"Say hi\", \"output\": \"hi!\"}\n"
              "\n"
              "{\"instruction\": \"Add\", \"input\": \"2+2\", \"output\": \"4\"}\n");
  TokenizeOptions o;
  o.format = InputFormat::kAlpaca;
  const TokenizeStats st = tokenize_files({in}, o, out);
  EXPECT_EQ(st.documents, 2);
  EXPECT_EQ(st.targets, (3 + 1) + (1 + 1));
  const std::string p1 = alpaca_prompt("Say hi", ""), p2 = alpaca_prompt("Add", "2+2");
  EXPECT_NE(p1.find("### Instruction:\nSay hi\n\n### Response:\n"), std::string::npos);
  EXPECT_NE(p2.find("### Input:\n2+2\n\n### Response:\n"), std::string::npos);
  EXPECT_EQ(st.tokens, static_cast<int64_t>(1 + p1.size() + 3 + 1 + 1 + p2.size() + 1 + 1));

  const TokenFile f = TokenFile::open(out);
  EXPECT_TRUE(f.loss_mask());
  f.validate(kByteVocabSize);
  int64_t masked = 0;
  for (uint32_t t : f.tokens()) masked += (t & kTokenNoLoss) != 0;
  EXPECT_EQ(masked, st.tokens - st.targets);
  EXPECT_TRUE(f.doc_starts());
  EXPECT_EQ(f[0], kByteBos | kTokenNoLoss | kTokenDocStart);
  EXPECT_EQ(f[static_cast<int64_t>(1 + p1.size())], uint32_t{'h'});  // the first target
  // The data loader: one sequence over the whole stream; its non-ignored targets are exactly the
  // response tokens, inputs carry no mask bit.
  const PackedDataset d(f, static_cast<int>(f.size() - 1));
  ASSERT_EQ(d.num_sequences(), 1);
  std::vector<int32_t> inputs(static_cast<size_t>(f.size() - 1)), targets(inputs.size());
  d.get(0, inputs.data(), targets.data());
  std::string trained;
  for (size_t j = 0; j < targets.size(); ++j) {
    EXPECT_LT(inputs[j], static_cast<int32_t>(kByteVocabSize));
    if (targets[j] != kIgnoreIndex) trained.push_back(targets[j] < 256 ? static_cast<char>(targets[j]) : '$');
  }
  EXPECT_EQ(trained, "hi!$4$");  // $ = EOS
}

TEST(ByteTokenizer, AlpacaErrorsNameTheLine) {
  TempDir dir;
  const std::string in = dir.file("bad.jsonl");
  TokenizeOptions o;
  o.format = InputFormat::kAlpaca;
  auto expect = [&](const std::string& body, const std::string& needle) {
    write_bytes(in, body);
    try {
      tokenize_files({in}, o, dir.file("x.tok"));
      ADD_FAILURE() << needle;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(dir.file("x.tok")));
  };
  expect("{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"a\"}\n", "bad.jsonl:2: no field \"output\"");
  expect("{\"instruction\": 3, \"output\": \"b\"}\n", "bad.jsonl:1: field \"instruction\" is number");
  expect("{\"instruction\": \"a\", \"output\": \"\"}\n", "bad.jsonl:1: field \"output\" is empty");
  expect("[1]\n", "bad.jsonl:1: expected a JSON object");
  EXPECT_EQ(parse_input_format("alpaca"), InputFormat::kAlpaca);
}

// Version 1 files still load (every token a target); a version 2 file's ids are checked without
// the mask bit, and a version 1 file with the bit set is an out-of-vocabulary id.
TEST(TokenFile, LossMaskVersions) {
  TempDir dir;
  write_token_file(dir.file("v1.tok"), 10, std::vector<uint32_t>{1, 2, 3});
  EXPECT_FALSE(TokenFile::open(dir.file("v1.tok")).loss_mask());
  {
    TokenFileWriter w(dir.file("v2.tok"), 10, /*loss_mask=*/true);
    w.append(std::vector<uint32_t>{1 | kTokenNoLoss, 2, 9});
    EXPECT_THROW(w.append(std::vector<uint32_t>{10 | kTokenNoLoss}), InputError);
    w.finish();
  }
  const TokenFile f = TokenFile::open(dir.file("v2.tok"));
  EXPECT_TRUE(f.loss_mask());
  EXPECT_NO_THROW(f.validate(10));
  EXPECT_THROW(f.validate(9), InputError);
  EXPECT_THROW(write_token_file(dir.file("bad.tok"), 10, std::vector<uint32_t>{1 | kTokenNoLoss}), InputError);
}

}  // namespace
}  // namespace qshard
