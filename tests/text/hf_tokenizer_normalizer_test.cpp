// The native tokenizer's Unicode normalizers (NFC, NFD, NFKC, NFKD; utf8proc): each form on known
// strings, inside a normalizer Sequence, and the order of normalization and added-token matching
// (tokens with "normalized": false in the raw text, then each stretch normalized, then tokens with
// "normalized": true, their contents normalized, in it). The real Qwen tokenizer over the corpus is
// in hf_tokenizer_test.cpp (tests/data/tokenizer/qwen2.tar.xz).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "text/chat_template.h"
#include "text/hf_tokenizer.h"
#include "text/hf_tokenizer_pipeline.h"

namespace qshard {
namespace {

namespace fs = std::filesystem;
using namespace std::string_view_literals;
using hf_tok::NormalForm;

struct TempFile {
  fs::path dir = fs::temp_directory_path() / ("qshard_norm_" + std::to_string(::getpid()));
  fs::path write(const std::string& body) {
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer.json") << body;
    return dir / "tokenizer.json";
  }
  ~TempFile() { fs::remove_all(dir); }
};

// A tokenizer of single characters (no merges, no pre-tokenizer) with three added tokens: <r>
// (normalized false, special), "\uFB01x" (normalized true) and "\uFB01b" (normalized false).
std::string tokenizer_json(const std::string& normalizer) {
  return R"({"added_tokens": [
      {"id": 10, "content": "<r>", "normalized": false, "special": true, "single_word": false, "lstrip": false, "rstrip": false},
      {"id": 11, "content": "\ufb01x", "normalized": true, "special": false, "single_word": false, "lstrip": false, "rstrip": false},
      {"id": 12, "content": "\ufb01b", "normalized": false, "special": false, "single_word": false, "lstrip": false, "rstrip": false}],
    "normalizer": )" + normalizer + R"(, "pre_tokenizer": null,
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "e": 2, "\u0301": 3, "x": 4, " ": 5, "\u00e9": 6, "f": 7,
              "i": 8, "\ufb01": 9}, "merges": []}})";
}

#ifdef QSHARD_WITH_UNICODE_NORMALIZERS

// Each form of known strings. Made with Python 3.11 (Unicode 14.0):
//   unicodedata.normalize(form, s), checked equal to tokenizers 0.23.3's
//   tokenizers.normalizers.<form>().normalize_str(s); printed as UTF-8 bytes.
// Covered: composition and decomposition, canonical reordering of marks, singletons (U+212B, U+2126,
// U+212A), the UAX #15 example U+1E9B U+0323, Hangul syllables and conjoining jamo, compatibility
// characters (ligature, full-width, circled digit, fraction, half-width katakana with its voiced
// mark), a composition exclusion (U+0958), a NUL byte inside the text, empty and ASCII text.
TEST(HfTokenizerNormalizers, EachFormOnKnownStrings) {
  struct Case {
    std::string_view in, nfc, nfd, nfkc, nfkd;
  };
  const Case cases[] = {
      {"e\xCC\x81"sv, "\xC3\xA9"sv, "e\xCC\x81"sv, "\xC3\xA9"sv, "e\xCC\x81"sv},  // e\u0301
      {"\xC3\xA9"sv, "\xC3\xA9"sv, "e\xCC\x81"sv, "\xC3\xA9"sv, "e\xCC\x81"sv},  // \xe9
      {"\xE1\xBA\x9B\xCC\xA3"sv, "\xE1\xBA\x9B\xCC\xA3"sv, "\xC5\xBF\xCC\xA3\xCC\x87"sv, "\xE1\xB9\xA9"sv, "s\xCC\xA3\xCC\x87"sv},  // \u1e9b\u0323
      {"\xE2\x84\xAB"sv, "\xC3\x85"sv, "A\xCC\x8A"sv, "\xC3\x85"sv, "A\xCC\x8A"sv},  // \u212b
      {"e\xCC\x82\xCC\xA3"sv, "\xE1\xBB\x87"sv, "e\xCC\xA3\xCC\x82"sv, "\xE1\xBB\x87"sv, "e\xCC\xA3\xCC\x82"sv},  // e\u0302\u0323
      {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"sv, "\xEA\xB0\x81"sv, "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"sv, "\xEA\xB0\x81"sv, "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"sv},  // \u1100\u1161\u11a8
      {"\xED\x95\x9C\xEA\xB5\xAD"sv, "\xED\x95\x9C\xEA\xB5\xAD"sv, "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB\xE1\x84\x80\xE1\x85\xAE\xE1\x86\xA8"sv, "\xED\x95\x9C\xEA\xB5\xAD"sv, "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB\xE1\x84\x80\xE1\x85\xAE\xE1\x86\xA8"sv},  // \ud55c\uad6d
      {"\xEF\xAC\x81"sv, "\xEF\xAC\x81"sv, "\xEF\xAC\x81"sv, "fi"sv, "fi"sv},  // \ufb01
      {"\xEF\xBC\xA1\xEF\xBC\x91"sv, "\xEF\xBC\xA1\xEF\xBC\x91"sv, "\xEF\xBC\xA1\xEF\xBC\x91"sv, "A1"sv, "A1"sv},  // \uff21\uff11
      {"\xE2\x91\xA0"sv, "\xE2\x91\xA0"sv, "\xE2\x91\xA0"sv, "1"sv, "1"sv},  // \u2460
      {"\xC2\xBD"sv, "\xC2\xBD"sv, "\xC2\xBD"sv, "1\xE2\x81\x84" "2"sv, "1\xE2\x81\x84" "2"sv},  // \xbd
      {"\xEF\xBD\xB6\xEF\xBE\x9E"sv, "\xEF\xBD\xB6\xEF\xBE\x9E"sv, "\xEF\xBD\xB6\xEF\xBE\x9E"sv, "\xE3\x82\xAC"sv, "\xE3\x82\xAB\xE3\x82\x99"sv},  // \uff76\uff9e
      {"\xE0\xA5\x98"sv, "\xE0\xA4\x95\xE0\xA4\xBC"sv, "\xE0\xA4\x95\xE0\xA4\xBC"sv, "\xE0\xA4\x95\xE0\xA4\xBC"sv, "\xE0\xA4\x95\xE0\xA4\xBC"sv},  // \u0958
      {"a\x00" "e\xCC\x81"sv, "a\x00\xC3\xA9"sv, "a\x00" "e\xCC\x81"sv, "a\x00\xC3\xA9"sv, "a\x00" "e\xCC\x81"sv},  // a\0e\u0301
      {""sv, ""sv, ""sv, ""sv, ""sv},  // (empty)
      {"plain ascii"sv, "plain ascii"sv, "plain ascii"sv, "plain ascii"sv, "plain ascii"sv},  // plain ascii
      {"\xC3\x85\xE2\x84\xA6\xE2\x84\xAA"sv, "\xC3\x85\xCE\xA9K"sv, "A\xCC\x8A\xCE\xA9K"sv, "\xC3\x85\xCE\xA9K"sv, "A\xCC\x8A\xCE\xA9K"sv},  // \xc5\u2126\u212a
      {"x\xCC\x81\xCC\xA3y"sv, "x\xCC\xA3\xCC\x81y"sv, "x\xCC\xA3\xCC\x81y"sv, "x\xCC\xA3\xCC\x81y"sv, "x\xCC\xA3\xCC\x81y"sv},  // x\u0301\u0323y
  };
  std::printf("utf8proc's Unicode version: %s\n", hf_tok::unicode_normalizer_version().c_str());
  for (const Case& c : cases) {
    const std::string in(c.in);
    EXPECT_EQ(hf_tok::unicode_normalize(in, NormalForm::kNfc), c.nfc) << "NFC of " << in;
    EXPECT_EQ(hf_tok::unicode_normalize(in, NormalForm::kNfd), c.nfd) << "NFD of " << in;
    EXPECT_EQ(hf_tok::unicode_normalize(in, NormalForm::kNfkc), c.nfkc) << "NFKC of " << in;
    EXPECT_EQ(hf_tok::unicode_normalize(in, NormalForm::kNfkd), c.nfkd) << "NFKD of " << in;
  }
}

// The same through tokenizer.json: each type alone and inside a Sequence reaches the model (ids of
// the characters of the normalized text).
TEST(HfTokenizerNormalizers, TypesInTokenizerJsonAndSequences) {
  TempFile f;
  const std::string text = "e\u0301 \ufb01";  // e + combining acute, space, the fi ligature
  const std::pair<const char*, std::vector<uint32_t>> want[] = {
      {R"({"type": "NFC"})", {6, 5, 9}},
      {R"({"type": "NFD"})", {2, 3, 5, 9}},
      {R"({"type": "NFKC"})", {6, 5, 7, 8}},
      {R"({"type": "NFKD"})", {2, 3, 5, 7, 8}},
      {R"({"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "NFC"}]})", {6, 5, 7, 8}},
      {R"({"type": "Sequence", "normalizers": [{"type": "Sequence", "normalizers": [{"type": "NFD"}]}]})", {2, 3, 5, 9}},
  };
  for (const auto& [normalizer, ids] : want) {
    const HfTokenizer t = HfTokenizer::load(f.write(tokenizer_json(normalizer)).string());
    EXPECT_EQ(t.encode(text), ids) << normalizer;
  }
}

// Added tokens around normalized text. Ids from tokenizers 0.23.3:
//   tokenizers.Tokenizer.from_str(<tokenizer_json(normalizer) as here>).encode(text).ids
TEST(HfTokenizerNormalizers, AddedTokensAreMatchedInTheLibrarysOrder) {
  TempFile f;
  const HfTokenizer nfkc =
      HfTokenizer::load(f.write(tokenizer_json(R"({"type": "Sequence", "normalizers": [{"type": "NFKC"}]})")).string());
  // "\uFB01x" (normalized) matches the ligature and, its content normalized to "fix", plain "fix";
  // "\uFB01b" (not normalized) matches only the raw ligature.
  EXPECT_EQ(nfkc.encode("\ufb01x fix \ufb01b fib"), (std::vector<uint32_t>{11, 5, 11, 5, 12, 5, 7, 8, 1}));
  // A combining mark after an added token stays apart: each stretch is normalized alone.
  EXPECT_EQ(nfkc.encode("e<r>\u0301"), (std::vector<uint32_t>{2, 10, 3}));
  EXPECT_EQ(nfkc.encode("e\u0301<r>e\u0301"), (std::vector<uint32_t>{6, 10, 6}));
  EXPECT_EQ(nfkc.encode("\ufb01<r>\ufb01x"), (std::vector<uint32_t>{7, 8, 10, 11}));
  const HfTokenizer nfd =
      HfTokenizer::load(f.write(tokenizer_json(R"({"type": "Sequence", "normalizers": [{"type": "NFD"}]})")).string());
  EXPECT_EQ(nfd.encode("\ufb01x fix \ufb01b fib"), (std::vector<uint32_t>{11, 5, 7, 8, 4, 5, 12, 5, 7, 8, 1}));
  EXPECT_EQ(nfd.encode("e\u0301<r>\u00e9"), (std::vector<uint32_t>{2, 3, 10, 2, 3}));
  // Invalid UTF-8 is replaced first (U+FFFD is not in this vocabulary: dropped), then normalized.
  EXPECT_EQ(nfkc.encode("\xC3" "e\u0301"), (std::vector<uint32_t>{6}));
}

// The real Qwen folder (tests/data/tokenizer/qwen2.tar.xz: tokenizer.json and tokenizer_config.json
// with its ChatML template): the chat renders and tokenizes as transformers 5.24.0 does it, values from
//   tok = AutoTokenizer.from_pretrained(<the folder>)
//   r = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
//   tok(r, add_special_tokens=False)["input_ids"]
// The user turn holds a composed and a decomposed e-acute (NFC makes them one) and the fi ligature.
TEST(HfTokenizerNormalizers, QwenChatRendersAndTokenizesAsTransformers) {
  const std::string dir = std::string(QSHARD_TOKENIZER_DATA) + "/qwen2";
  const HfTokenizer tok = HfTokenizer::load(dir);
  const ChatTemplate tmpl = ChatTemplate::from_model_dir(dir);
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Caf\u00e9 ou cafe\u0301 ? \ufb01n"}, {"role": "assistant", "content": "Oui."}])");
  const std::string render = tmpl.render(messages, true);
  EXPECT_EQ(render,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nCaf\u00e9 ou cafe\u0301 ? \ufb01n<|im_end|>\n"
            "<|im_start|>assistant\nOui.<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tok.encode(render),
            (std::vector<uint32_t>{151644, 8948, 198, 3430, 9814, 13, 151645, 198, 151644, 872, 198, 34, 2577, 963, 5908,
                                   51950, 937, 32495, 70731, 77, 151645, 198, 151644, 77091, 198, 46, 1963, 13, 151645, 198,
                                   151644, 77091, 198}));
  EXPECT_EQ(tok.eos_id(), std::optional<uint32_t>(151643));  // eos_token <|endoftext|>
}

#else

TEST(HfTokenizerNormalizers, RefusedWithoutUtf8proc) {
  TempFile f;
  try {
    HfTokenizer::load(f.write(tokenizer_json(R"({"type": "NFC"})")).string());
    ADD_FAILURE() << "NFC loaded in a build without utf8proc";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("utf8proc"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
}

#endif

}  // namespace
}  // namespace qshard
