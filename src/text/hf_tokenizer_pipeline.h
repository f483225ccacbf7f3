// hf_tokenizer_pipeline.h: the internals of the native tokenizer (hf_tokenizer.h), shared by its
// sources (src/text/hf_tokenizer*.cpp) and included by nothing else.
//
// What: the stages of a tokenizer.json pipeline as plain structs (Normalizer, PreTokenizer,
// Decoder), each read from its JSON by a parse_* function, and the helpers they share. The seams:
//   hf_tokenizer_utf8.cpp         UTF-8 (utf8_replace_invalid) and GPT-2's byte <-> character map
//   hf_tokenizer_regex.cpp        PCRE2 regular expressions (with their step limits), tokenizer.json
//                                 patterns and the shape checks of its components (Sequence depth)
//   hf_tokenizer_pretokenize.cpp  splitting a piece on matches, the normalizers, the pre-tokenizers
//   hf_tokenizer_unicode.cpp      the Unicode normalization forms (utf8proc; built only with it)
//   hf_tokenizer_decode.cpp       the decoders
//   hf_tokenizer.cpp              the BPE model, added tokens (a linear-time matcher), the
//                                 post-processor and the public API (load, encode, decode)
// Strings are UTF-8 bytes and offsets byte offsets; text reaching a stage is valid UTF-8
// (encode runs utf8_replace_invalid first).
// Errors: a parse_* function reads its JSON through a JsonField (runtime/json_field.h): a missing
// field or one of the wrong type is an InputError naming the file and the field's path
// ("tokenizer.json: pre_tokenizer.pretokenizers[1].behavior: expected a string, got 3"); a type or
// pattern it cannot use names `where` (the tokenizer.json path), the stage and the value.
// Ownership: a stage owns its children by value and shares its compiled regular expressions through
// shared_ptr, so a copy is cheap.
// Thread safety: stages are immutable after parsing; apply() is const and safe from several threads.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/json_field.h"

namespace qshard::hf_tok {

using json = nlohmann::json;

// ---- UTF-8 and bytes (hf_tokenizer_utf8.cpp) ---------------------------------------------------

// The byte length of the character a lead byte starts (1 for ASCII and continuation bytes).
inline size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

// The code point starting at byte i. REQUIRES a whole character at i.
inline char32_t utf8_decode_at(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  switch (utf8_len(p[0])) {
    case 1: return p[0];
    case 2: return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    case 3: return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    default: return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
  }
}

// GPT-2's byte <-> printable character map (bytes 33-126, 161-172, 174-255 map to themselves,
// the rest to 256 + k in order).
struct ByteMap {
  std::array<std::string, 256> to_char;
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteMap();
};
const ByteMap& byte_map();  // the one instance, built on first use

// ---- regular expressions (hf_tokenizer_regex.cpp) ------------------------------------------------

// Bounds on one pcre2_match call, so that a catastrophic pattern ((a+)+$ on 28 characters) ends as
// an InputError naming the pattern and the byte offset instead of running for ever or overflowing a
// stack. Each thread matches with its own match context and JIT stack (made on first use, remade
// when jit_stack_bytes changes). Real patterns need steps in proportion to the text they scan (a
// whitespace run is one match), so the step limit of a search from byte `at` of s is
//   min(2^32 - 1, match_base + match_per_byte * (s.size() - at)),
// used as pcre2_set_match_limit (JIT and interpreter) and pcre2_set_depth_limit (the interpreter's
// backtracking depth, when JIT is unavailable); exponential backtracking passes it within a few
// dozen bytes. heap_kib: pcre2_set_heap_limit (the interpreter's frames); jit_stack_bytes: the JIT
// stack's maximum. Defaults and the margins measured on the real tokenizers over the golden corpus:
// hf_tokenizer_regex.cpp.
struct RegexLimits {
  uint32_t match_base;
  uint32_t match_per_byte;
  uint32_t heap_kib;
  size_t jit_stack_bytes;
};
RegexLimits default_regex_limits();
RegexLimits regex_limits();               // the limits in force
void set_regex_limits(const RegexLimits&);  // tests and measurement only; not while encoding

// A compiled PCRE2 pattern (UTF + Unicode properties, JIT where available).
class Regex {
 public:
  // Throws InputError naming `where`, the pattern and PCRE2's message when it does not compile.
  Regex(const std::string& pattern, const std::string& where);
  // Byte ranges [start, end) of the non-empty matches, left to right. REQUIRES valid UTF-8.
  // A match that hits a limit of regex_limits() is an InputError naming `where`, the pattern, the
  // limit and the byte offset in s where the failing search started.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;

 private:
  std::shared_ptr<pcre2_code> code_;
  std::string pattern_, where_;
};

// ---- reading tokenizer.json (hf_tokenizer_regex.cpp) ---------------------------------------------

// How deep a Sequence (normalizer, pre_tokenizer, decoder, post_processor) may nest. Real files nest
// at most 2 deep; deeper is an InputError naming the file and the construct, so that no recursion
// (parse or apply) runs without bound. tokenizer.json's JSON itself is bounded by kMaxJsonDepth
// (runtime/input_file.h), which this is well inside.
inline constexpr int kMaxSequenceDepth = 32;
// Throws InputError "`where`: <what> Sequence nested more than kMaxSequenceDepth deep" when depth
// exceeds it.
void check_sequence_depth(int depth, const std::string& where, const char* what);
// A component's "type" (j must be an object; a missing type reads as ""): the JsonField errors.
std::string component_type(const JsonField& j);

// Every match of `re` in s replaced by `content`.
// Every match of `re` in `s` replaced by `content`; past max_bytes of output an InputError
// (throw_text_growth) before more is built.
std::string regex_replace(const std::string& s, const Regex& re, const std::string& content,
                          size_t max_bytes = SIZE_MAX);
// A normalizer may make a text at most kMaxNormalizedGrowth times longer, plus kNormalizedSlack
// bytes (normalized_limit): NFKC's widest expansion is 18 code points for one, Replace of a space
// by "\u2581" 3 bytes for 1. Past it: throw_text_growth, an InputError naming the step.
inline constexpr size_t kMaxNormalizedGrowth = 64;
inline constexpr size_t kNormalizedSlack = 4096;
size_t normalized_limit(size_t input_bytes);
[[noreturn]] void throw_text_growth(size_t from, size_t max_bytes, const char* what);
// Metaspace's prepend_scheme ("always", "first" or "never"), or, in older files, add_prefix_space
// (true: "always", false: "never"); "always" when neither is given. Another value is an InputError
// naming its path.
std::string prepend_scheme_of(const JsonField& j);
// s as a pattern that matches it literally.
std::string regex_escape(std::string_view s);
// A tokenizer.json pattern: {"Regex": "..."} or {"String": "..."} (a literal); anything else is an
// InputError naming p's path.
std::string pattern_of(const JsonField& p);
// Metaspace's "replacement" (default U+2581): one character, as the tokenizers library requires (it
// is a char there). An empty string (which would never advance a decode loop), several characters
// or invalid UTF-8 is an InputError naming the file, the field's path and the value.
std::string metaspace_replacement(const JsonField& j);

// ---- normalizers and pre-tokenizers (hf_tokenizer_pretokenize.cpp) --------------------------------

// A stretch of text the pre-tokenizers cut; each final piece goes through the BPE model alone.
struct Piece {
  std::string text;
  bool at_origin = false;  // starts at offset 0 of the input text (Metaspace's prepend_scheme "first")
};

// How a split treats its matches (the tokenizers library's SplitDelimiterBehavior).
enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// ---- Unicode normalization forms (hf_tokenizer_unicode.cpp, through utf8proc) ---------------------

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// Whether this build has them (utf8proc found by CMake: QSHARD_WITH_UNICODE_NORMALIZERS).
inline constexpr bool kHaveUnicodeNormalizers =
#ifdef QSHARD_WITH_UNICODE_NORMALIZERS
    true;
#else
    false;
#endif
// s in normalization form f (UAX #15), by utf8proc's tables (utf8proc_unicode_version(); the
// tokenizers library's are older: docs/FORMATS_NOTES.md). ASCII text comes back as it is without a
// call. REQUIRES valid UTF-8 (encode runs utf8_replace_invalid first); NUL bytes are characters like
// any other (the length is explicit). Defined only when kHaveUnicodeNormalizers.
std::string unicode_normalize(std::string_view s, NormalForm f);
// The Unicode version of utf8proc's tables ("15.0.0"), or "" without utf8proc.
std::string unicode_normalizer_version();

struct Normalizer {
  enum Kind { kSequence, kPrepend, kReplace, kStrip, kUnicode } kind = kSequence;
  NormalForm form = NormalForm::kNfc;  // kUnicode
  std::vector<Normalizer> children;
  std::string text, content;
  std::shared_ptr<Regex> re;  // Replace; Strip: leading whitespace
  std::shared_ptr<Regex> trail;  // Strip: trailing whitespace
  bool left = false, right = false;

  // The text normalized in place; past max_bytes (normalized_limit of the text given to the
  // outermost call) an InputError.
  void apply(std::string& s, size_t max_bytes = SIZE_MAX) const;
};
Normalizer parse_normalizer(const JsonField& j, const std::string& where, int depth = 0);

struct PreTokenizer {
  enum Kind { kSequence, kByteLevel, kSplit, kMetaspace } kind = kSequence;
  std::vector<PreTokenizer> children;
  std::shared_ptr<Regex> re;  // ByteLevel (use_regex), Split, Metaspace (the replacement, for split)
  Behavior behavior = Behavior::kIsolated;
  bool invert = false, add_prefix_space = false, split = true;
  std::string replacement;
  std::string prepend_scheme = "always";

  void apply(std::vector<Piece>& pieces) const;
};
PreTokenizer parse_pre_tokenizer(const JsonField& j, const std::string& where, int depth = 0);

// ---- decoders (hf_tokenizer_decode.cpp) ------------------------------------------------------------

// Turns the tokens of decode() into text pieces; decode() concatenates what is left.
struct Decoder {
  enum Kind { kSequence, kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip } kind = kSequence;
  std::vector<Decoder> children;
  std::string replacement, content;
  std::string prepend_scheme = "always";
  std::shared_ptr<Regex> re;
  size_t start = 0, stop = 0;

  void apply(std::vector<std::string>& t) const;
};
Decoder parse_decoder(const JsonField& j, const std::string& where, int depth = 0);

}  // namespace qshard::hf_tok
