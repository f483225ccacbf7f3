// hf_tokenizer.h: a model folder's tokenizer.json (the Hugging Face `tokenizers` format), natively:
// encode text to ids and decode ids to text, with no Python at run time.
//
// What is read (anything else is refused at load with an InputError naming the file and the type):
//   model          BPE: vocab, merges ("a b" strings or [a, b] pairs; rank = position), unk_token,
//                  fuse_unk, byte_fallback ("<0xAB>" tokens for characters outside the vocab),
//                  ignore_merges (a whole pre-token found in the vocab is one token: Llama 3).
//   normalizer     null, Sequence, Prepend, Replace (String or Regex pattern), Strip, and the
//                  Unicode normalization forms NFC, NFD, NFKC, NFKD (through utf8proc; a build
//                  without it refuses them at load). utf8proc's Unicode tables are newer than the
//                  tokenizers library's: characters assigned since Unicode 12 may normalize
//                  differently (docs/FORMATS_NOTES.md).
//   pre_tokenizer  null, Sequence, ByteLevel (add_prefix_space, use_regex: GPT-2's pattern), Split
//                  (Regex or String pattern; Isolated, Removed, MergedWithPrevious, MergedWithNext,
//                  Contiguous; invert), Digits (individual_digits), Metaspace (replacement,
//                  prepend_scheme always|first|never, split), Whitespace, WhitespaceSplit.
//   added_tokens   matched before the pre-tokenizer (leftmost, then longest, each pass linear in
//                  its text), with lstrip, rstrip and single_word (a match not standing alone is
//                  dropped), in the tokenizers library's order: those with "normalized": false in the
//                  raw text; then each stretch between them is normalized and those with
//                  "normalized": true (their contents normalized too) are matched in it. Special
//                  ones are skipped by decode(skip_special = true).
//   post_processor TemplateProcessing (single sequence), ByteLevel, Sequence: applied by
//                  encode(add_special_tokens = true) only.
//   decoder        ByteLevel, Metaspace, Sequence, Replace, ByteFallback, Fuse, Strip.
// Regular expressions run through PCRE2 (UTF + Unicode properties, JIT where available).
// Text that is not valid UTF-8 is read as Python's bytes.decode("utf-8", errors="replace") reads it
// (each maximal ill-formed subsequence becomes U+FFFD), so ids match the library fed that string.
// Checked against the `tokenizers` library on real tokenizer files over a mixed corpus
// (tests/text/hf_tokenizer_test.cpp, scripts/golden/make_tokenizer_golden.py).
// Thread safety: encode/decode are const and safe from several threads (the word cache is locked).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qshard {

// Bounds on hostile tokenizer files (each an InputError naming the file, the key and the value).
// Also bounded: JSON nesting (kMaxJsonDepth, runtime/input_file.h), Sequence nesting
// (kMaxSequenceDepth = 32) and each regular-expression match (PCRE2 match and depth limits and a
// bounded JIT stack: hf_tokenizer_pipeline.h); added-token matching is linear in the text.
inline constexpr uint64_t kMaxTokenizerFileBytes = uint64_t{256} << 20;  // 7x Gemma 3's 33 MB tokenizer.json
inline constexpr uint32_t kMaxVocabSize = uint32_t{1} << 22;  // ids < 4,194,304: 16x Gemma's 262,144
inline constexpr uint64_t kMaxAddedTokenBytes = uint64_t{16} << 20;  // all added tokens' contents

class HfTokenizer {
 public:
  // `path`: a tokenizer.json file, or a folder holding one (with tokenizer_config.json beside it
  // read when present). Throws InputError naming the file and the key or type it cannot read; a
  // missing path, a folder without tokenizer.json and special files (a FIFO, a device) are refused
  // before anything is opened.
  static HfTokenizer load(const std::string& path);
  // The same from tokenizer.json's text; `path` names it in errors, and tokenizer_config.json
  // beside it is read when present.
  static HfTokenizer from_json(std::string_view text, const std::string& path);
  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;
  ~HfTokenizer();

  // Ids of `text`; with add_special_tokens the post-processor's template (e.g. <|begin_of_text|>).
  std::vector<uint32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Text of `ids` (the decoder's chain); skip_special drops special added tokens. Ids past the
  // vocabulary are an InputError.
  std::string decode(std::span<const uint32_t> ids, bool skip_special = false) const;

  uint32_t vocab_size() const;  // largest id + 1 (the vocabulary and the added tokens)
  std::optional<uint32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(uint32_t id) const;  // "" for an id with no token
  bool is_special(uint32_t id) const;
  // bos_token / eos_token of the tokenizer_config.json beside tokenizer.json (as transformers reads
  // them), when it names tokens of this vocabulary.
  std::optional<uint32_t> bos_id() const;
  std::optional<uint32_t> eos_id() const;
  const std::string& path() const;
  // Steps the added-token matchers have taken over all encode() calls (at most 2 per byte of the
  // text each pass reads): a test hook showing the matching is linear.
  uint64_t added_token_match_steps() const;

 private:
  struct Impl;
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Python's bytes.decode("utf-8", errors="replace"): every maximal ill-formed subsequence becomes
// U+FFFD; valid text comes back unchanged.
std::string utf8_replace_invalid(std::string_view bytes);

}  // namespace qshard
