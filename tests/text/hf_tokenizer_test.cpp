// The native tokenizer (text/hf_tokenizer.h) against the `tokenizers` library: for every folder
// of tests/data/tokenizer/*.tar.xz holding a tokenizer.json and golden.bin (scripts/golden/make_tokenizer_golden.py:
// real tokenizer files, ids made by the library over the > 1 MB mixed corpus corpus.bin), the ids of
// every document, tokenizers' decode of them, and the ids with special tokens added; plus UTF-8
// repair as Python does it, and errors that name the file and the unsupported type.
#include "text/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/error.h"

namespace qshard {
namespace {

namespace fs = std::filesystem;
const fs::path kDir = QSHARD_TOKENIZER_DATA;  // tests/data/tokenizer/*.tar.xz, unpacked by CMake

struct Reader {
  std::string data;
  size_t at = 0;
  explicit Reader(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    data.assign(std::istreambuf_iterator<char>(f), {});
  }
  uint32_t u32() {
    uint32_t v = 0;
    if (at + 4 > data.size()) throw std::runtime_error("golden file truncated");
    std::memcpy(&v, data.data() + at, 4);
    at += 4;
    return v;
  }
  std::string bytes(size_t n) {
    if (at + n > data.size()) throw std::runtime_error("golden file truncated");
    std::string s = data.substr(at, n);
    at += n;
    return s;
  }
  std::vector<uint32_t> ids() {
    std::vector<uint32_t> v(u32());
    for (auto& x : v) x = u32();
    return v;
  }
};

std::vector<std::string> corpus() {
  Reader r(kDir / "corpus.bin");
  std::vector<std::string> docs(r.u32());
  for (auto& d : docs) d = r.bytes(r.u32());
  return docs;
}

std::string show(const std::vector<uint32_t>& v, size_t from) {
  std::string s;
  for (size_t i = from; i < v.size() && i < from + 12; ++i) s += std::to_string(v[i]) + " ";
  return s;
}

TEST(HfTokenizer, MatchesTheTokenizersLibraryOnRealFiles) {
  const std::vector<std::string> docs = corpus();
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  ASSERT_GT(bytes, size_t{1} << 20) << "the corpus must be over 1 MB";
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(kDir)) {
    if (!entry.is_directory() || !fs::exists(entry.path() / "golden.bin")) continue;
    const std::string name = entry.path().filename().string();
#ifndef QSHARD_WITH_UNICODE_NORMALIZERS
    if (name == "qwen2") {  // an NFC normalizer: refused by a build without utf8proc
      std::printf("%s: skipped (this build has no utf8proc)\n", name.c_str());
      continue;
    }
#endif
    const HfTokenizer tok = HfTokenizer::load(entry.path().string());
    Reader g(entry.path() / "golden.bin");
    ASSERT_EQ(g.u32(), docs.size()) << name;
    int64_t ids_total = 0, bad_docs = 0;
    for (size_t i = 0; i < docs.size(); ++i) {
      const std::vector<uint32_t> want = g.ids();
      const std::string want_text = g.u32() == 0 ? utf8_replace_invalid(docs[i]) : g.bytes(g.u32());
      const std::vector<uint32_t> got = tok.encode(docs[i]);
      ids_total += static_cast<int64_t>(want.size());
      if (got != want) {
        size_t k = 0;
        while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
        if (++bad_docs <= 5)
          ADD_FAILURE() << name << " document " << i << ": ids differ at " << k << " (of " << want.size()
                        << "): got " << show(got, k) << "| want " << show(want, k);
      }
      const std::string text = tok.decode(want);
      if (text != want_text && ++bad_docs <= 5)
        ADD_FAILURE() << name << " document " << i << ": decode differs (" << text.size() << " vs " << want_text.size()
                      << " bytes)";
    }
    const uint32_t n_special = g.u32();
    for (uint32_t i = 0; i < n_special; ++i) EXPECT_EQ(tok.encode(docs[i], true), g.ids()) << name << " document " << i;
    EXPECT_EQ(bad_docs, 0) << name;
    std::printf("%s: %zu documents, %lld ids identical to tokenizers'\n", name.c_str(), docs.size(),
                static_cast<long long>(ids_total));
    ++checked;
  }
#ifdef QSHARD_WITH_UNICODE_NORMALIZERS
  EXPECT_GE(checked, 6) << "golden folders under " << kDir;
#else
  EXPECT_GE(checked, 5) << "golden folders under " << kDir;
#endif
}

// Python's bytes.decode("utf-8", errors="replace") (values taken from CPython 3.11).
TEST(HfTokenizer, InvalidUtf8IsReplacedAsPythonDoes) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_replace_invalid("abc \xC3\xA9"), "abc \xC3\xA9");
  EXPECT_EQ(utf8_replace_invalid("\x80"), r);
  EXPECT_EQ(utf8_replace_invalid("\xE2\x82"), r);               // truncated: one
  EXPECT_EQ(utf8_replace_invalid("\xE2\x82" "a"), r + "a");
  EXPECT_EQ(utf8_replace_invalid("\xC0\xAF"), r + r);           // overlong lead: two
  EXPECT_EQ(utf8_replace_invalid("\xED\xA0\x80"), r + r + r);   // surrogate: three
  EXPECT_EQ(utf8_replace_invalid("\xF0\x9F\x98" "x"), r + "x");
  EXPECT_EQ(utf8_replace_invalid("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(utf8_replace_invalid("\xFE\xFF"), r + r);
  EXPECT_EQ(utf8_replace_invalid("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

void write(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << s;
}

TEST(HfTokenizer, BadFilesAreNamed) {
  const fs::path d = fs::temp_directory_path() / ("qshard_tok_" + std::to_string(::getpid()));
  auto expect = [&](const std::string& body, const std::string& needle) {
    write(d / "tokenizer.json", body);
    try {
      HfTokenizer::load(d.string());
      ADD_FAILURE() << "expected an error containing " << needle;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
    }
  };
  const std::string model = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
  expect("{", "not valid JSON");
  expect(R"({"model": {"type": "Unigram", "vocab": []}})", "model type 'Unigram'");
  expect(R"({"normalizer": {"type": "BertNormalizer"}, )" + model + "}", "normalizer type 'BertNormalizer'");
  expect(R"({"pre_tokenizer": {"type": "BertPreTokenizer"}, )" + model + "}", "'BertPreTokenizer'");
  expect(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a c"]}})", "missing from the vocabulary");
  expect(R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(["}, "behavior": "Isolated"}, )" + model + "}",
         "does not compile");
  try {
    HfTokenizer::load((d / "none").string());
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("none"), std::string::npos);
  }
  // A working minimal file: merges apply, decode without a decoder joins with spaces.
  write(d / "tokenizer.json", "{" + model + "}");
  const HfTokenizer t = HfTokenizer::load(d.string());
  EXPECT_EQ(t.encode("abab"), (std::vector<uint32_t>{2, 2}));
  EXPECT_EQ(t.vocab_size(), 3u);
  EXPECT_THROW(t.decode(std::vector<uint32_t>{7}), InputError);
  fs::remove_all(d);
}

}  // namespace
}  // namespace qshard
