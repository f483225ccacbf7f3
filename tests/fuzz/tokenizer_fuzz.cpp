// libFuzzer target for the native tokenizer (text/hf_tokenizer.h), two modes by the first byte:
//   text (any first byte but 0x01; the checked-in seeds): the bytes are text for GPT-2's real
//     tokenizer.json (tests/data/tokenizer/gpt2.tar.xz, unpacked by CMake). Properties: every id is
//     in the vocabulary, and decoding gives the text back as Python would read it
//     (bytes.decode("utf-8", errors="replace")): byte-level BPE is lossless.
//   structure (first byte 0x01, issue 25): the bytes choose a tokenizer.json - nested Sequences of
//     normalizers, pre-tokenizers, decoders and post-processors (sometimes past the depth bound,
//     sometimes 300-deep JSON), odd component types, Split patterns (catastrophic ones included),
//     weird ids (-1, 2^32 - 1, 2^22, 1.5, "7", null, duplicates), merges naming unknown tokens,
//     added tokens sharing prefixes - and then text, which the tokenizer encodes and decodes.
//     Properties: loading either succeeds or throws InputError; a loaded tokenizer's encode gives
//     ids below vocab_size() or an InputError (a regex limit), and decode of them returns or throws
//     InputError. Any other exception, a crash or a hang is a finding.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "text/hf_tokenizer.h"
#include "text/hf_tokenizer_pipeline.h"

namespace {

using json = nlohmann::json;

// The fuzzer's bytes as a stream of choices (0 once they run out).
struct Choices {
  const uint8_t* p;
  size_t n, at = 0;
  uint8_t next() { return at < n ? p[at++] : 0; }
  uint32_t below(uint32_t k) { return next() % k; }
  bool one_in(uint32_t k) { return below(k) == 0; }
  std::string str(size_t max_len) {
    std::string s;
    const size_t len = below(static_cast<uint32_t>(max_len + 1));
    static const char kAlphabet[] = "ab <>|_\n\xc3\xa9" "0x41";
    for (size_t i = 0; i < len; ++i) {
      const uint8_t c = next();
      s.push_back(c < 200 ? kAlphabet[c % (sizeof(kAlphabet) - 1)] : static_cast<char>(c));
    }
    return s;
  }
};

json odd_id(Choices& c, uint32_t normal) {
  switch (c.below(24)) {
    case 0: return -1;
    case 1: return 4294967295u;
    case 2: return 4194304;
    case 3: return 1.5;
    case 4: return "7";
    case 5: return nullptr;
    case 6: return 0;  // a duplicate, mostly
    default: return normal;
  }
}

json pattern(Choices& c) {
  static const char* kPatterns[] = {"\\s+", "(a+)+$", "\\p{N}", "(?:a|ab)*b", "", "[", "(?=a)", ".", "a|",
                                    "\\b", "(\\s*)*x", "'s|'t| ?\\p{L}+| ?\\p{N}+|\\s+(?!\\S)|\\s+"};
  const uint32_t k = c.below(sizeof(kPatterns) / sizeof(kPatterns[0]) + 1);
  const std::string p = k < sizeof(kPatterns) / sizeof(kPatterns[0]) ? kPatterns[k] : c.str(6);
  return c.one_in(3) ? json{{"String", p}} : json{{"Regex", p}};
}

json odd_value(Choices& c) {
  switch (c.below(5)) {
    case 0: return 5;
    case 1: return json::array();
    case 2: return nullptr;
    case 3: return json{{"type", 3}};
    default: return json{{"type", "Bogus"}};
  }
}

enum Kind { kNormalizer, kPreTokenizer, kDecoder, kPostProcessor };

json leaf(Choices& c, Kind kind) {
  switch (kind) {
    case kNormalizer:
      switch (c.below(5)) {
        case 0: return {{"type", "Prepend"}, {"prepend", c.str(3)}};
        case 1: return {{"type", "Replace"}, {"pattern", pattern(c)}, {"content", c.str(3)}};
        case 2: return {{"type", "Strip"}, {"strip_left", c.one_in(2)}, {"strip_right", c.one_in(2)}};
        case 3: return {{"type", "NFC"}};
        default: return {{"type", "Prepend"}, {"prepend", 7}};
      }
    case kPreTokenizer:
      switch (c.below(7)) {
        case 0: return {{"type", "ByteLevel"}, {"add_prefix_space", c.one_in(2)}, {"use_regex", c.one_in(2)}};
        case 1: {
          static const char* kBehaviors[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                             "Contiguous", "Bogus"};
          return {{"type", "Split"}, {"pattern", pattern(c)}, {"behavior", kBehaviors[c.below(6)]},
                  {"invert", c.one_in(2)}};
        }
        case 2: return {{"type", "Digits"}, {"individual_digits", c.one_in(2)}};
        case 3: return {{"type", "Whitespace"}};
        case 4: return {{"type", "WhitespaceSplit"}};
        default: {
          static const char* kSchemes[] = {"always", "first", "never"};
          return {{"type", "Metaspace"}, {"replacement", c.one_in(4) ? c.str(2) : "\xE2\x96\x81"},
                  {"prepend_scheme", kSchemes[c.below(3)]}, {"split", c.one_in(2)}};
        }
      }
    case kDecoder:
      switch (c.below(7)) {
        case 0: return {{"type", "ByteLevel"}};
        case 1: return {{"type", "Metaspace"}, {"replacement", c.one_in(4) ? c.str(2) : "\xE2\x96\x81"}};
        case 2: return {{"type", "Replace"}, {"pattern", pattern(c)}, {"content", c.str(3)}};
        case 3: return {{"type", "ByteFallback"}};
        case 4: return {{"type", "Fuse"}};
        case 5: return {{"type", "Strip"}, {"content", c.str(1)}, {"start", odd_id(c, c.below(3))}, {"stop", c.below(3)}};
        default: return {{"type", "Strip"}, {"content", c.str(1)}, {"start", -1}};
      }
    case kPostProcessor:
      if (c.one_in(3)) return {{"type", "ByteLevel"}};
      return {{"type", "TemplateProcessing"},
              {"single", json::array({json{{"SpecialToken", {{"id", "<s>"}}}}, json{{"Sequence", {{"id", "A"}}}},
                                      json{{"SpecialToken", {{"id", c.one_in(4) ? "<none>" : "<s>"}}}}})},
              {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", json::array({odd_id(c, c.below(6))})}}}}}};
  }
  return nullptr;
}

// A component of `kind`: a leaf, an odd value, or a Sequence (a chain past the depth bound at times).
json component(Choices& c, Kind kind, int depth) {
  static const char* kList[] = {"normalizers", "pretokenizers", "decoders", "processors"};
  const uint32_t pick = c.below(12);
  if (pick == 0 && depth == 0) {  // a chain 28-40 deep around one leaf
    json j = leaf(c, kind);
    for (int i = 28 + static_cast<int>(c.below(13)); i > 0; --i) j = json{{"type", "Sequence"}, {kList[kind], {j}}};
    return j;
  }
  if (pick < 3 && depth < 6) {
    json list = json::array();
    for (uint32_t i = c.below(4); i > 0; --i) list.push_back(component(c, kind, depth + 1));
    return {{"type", "Sequence"}, {kList[kind], c.one_in(16) ? odd_value(c) : list}};
  }
  if (pick == 3) return odd_value(c);
  return leaf(c, kind);
}

std::string structured_tokenizer(Choices& c) {
  json vocab = {{"a", 0}, {"b", 1}, {"ab", 2}, {"<0x41>", 3}, {"<unk>", 4}, {" ", 5}, {"\xE2\x96\x81", 6}};
  for (uint32_t i = c.below(6); i > 0; --i) vocab[c.str(3)] = odd_id(c, 7 + c.below(20));
  json merges = json::array({"a b"});
  for (uint32_t i = c.below(3); i > 0; --i)
    merges.push_back(c.one_in(3) ? json(json::array({c.str(2), 5})) : json(c.str(2) + " " + c.str(2)));
  json model = {{"type", c.one_in(32) ? "Unigram" : "BPE"}, {"vocab", vocab}, {"merges", merges},
                {"byte_fallback", c.one_in(2)}, {"fuse_unk", c.one_in(2)}, {"ignore_merges", c.one_in(2)}};
  if (c.one_in(2)) model["unk_token"] = "<unk>";
  json j = {{"model", model}};
  json added = json::array();
  const std::string prefix = c.str(2);
  for (uint32_t i = c.below(8); i > 0; --i)
    added.push_back({{"content", c.one_in(2) ? prefix + c.str(3) : c.str(4)},
                     {"id", odd_id(c, 30 + c.below(10))},
                     {"special", c.one_in(2)},
                     {"lstrip", c.one_in(3)},
                     {"rstrip", c.one_in(3)},
                     {"single_word", c.one_in(3)}});
  j["added_tokens"] = c.one_in(32) ? odd_value(c) : added;
  if (!c.one_in(3)) j["normalizer"] = component(c, kNormalizer, 0);
  if (!c.one_in(3)) j["pre_tokenizer"] = component(c, kPreTokenizer, 0);
  if (!c.one_in(3)) j["decoder"] = component(c, kDecoder, 0);
  if (!c.one_in(3)) j["post_processor"] = component(c, kPostProcessor, 0);
  std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (c.one_in(32)) {  // JSON past kMaxJsonDepth where a component goes
    const std::string deep = std::string(300, '[') + std::string(300, ']');
    text = "{\"decoder\": " + deep + ", " + text.substr(1);
  }
  return text;
}

void fuzz_structure(const uint8_t* data, size_t size) {
  Choices c{data, size};
  const std::string file = structured_tokenizer(c);
  const std::string_view text(reinterpret_cast<const char*>(data + c.at), size - c.at);
  try {
    // (no tokenizer_config.json beside a path that does not exist)
    const qshard::HfTokenizer tok = qshard::HfTokenizer::from_json(file, "/nonexistent/fuzz/tokenizer.json");
    for (bool special : {false, true}) {
      std::vector<uint32_t> ids;
      try {
        ids = tok.encode(text, special);
      } catch (const qshard::InputError&) {
        continue;  // a regex limit
      }
      for (uint32_t id : ids)
        if (id >= tok.vocab_size()) std::abort();
      try {
        (void)tok.decode(ids, special);
      } catch (const qshard::InputError&) {
      }
    }
  } catch (const qshard::InputError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Regex step limits far below the defaults: a generated catastrophic pattern fails fast at every
  // position of the text (the defaults' million steps a search, times every position, under the
  // fuzzer's sanitizers, is minutes for one input); the refusal path is the same.
  static const bool limited = [] {
    qshard::hf_tok::RegexLimits l = qshard::hf_tok::default_regex_limits();
    l.match_base = 20000;
    qshard::hf_tok::set_regex_limits(l);
    return true;
  }();
  (void)limited;
  if (size > 0 && data[0] == 0x01) {
    fuzz_structure(data + 1, size - 1);
    return 0;
  }
  static const qshard::HfTokenizer tok = qshard::HfTokenizer::load(QSHARD_FUZZ_TOKENIZER);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<uint32_t> ids = tok.encode(text);
  for (uint32_t id : ids)
    if (id >= tok.vocab_size()) std::abort();
  if (tok.decode(ids) != qshard::utf8_replace_invalid(text)) std::abort();
  return 0;
}
