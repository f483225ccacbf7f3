// tokenizer_fingerprint.h: which tokenizer made a token file's ids, and which one a model takes, so
// that training never reads ids made by another tokenizer (a file whose ids happen to be in range).
//
// A fingerprint is a u64, recorded in a version 4 token file's header (text/token_file.h):
//   byte tokenizer  kByteTokenizerFingerprint, a constant (FNV-1a 64 of "qshard byte tokenizer").
//   tokenizer.json  FNV-1a 64 of its canonical content: the JSON parsed and written back compactly
//                   with object keys sorted (nlohmann's dump()), so whitespace and key order do not
//                   matter, every token, merge and setting does. tokenizer_config.json is not part
//                   of it (a changed chat template or model_max_length keeps the fingerprint).
//   none            kNoTokenizerFingerprint (0): a version 1-3 file, which records none.
// The tokenizer a model takes (model_tokenizer): its folder's tokenizer.json, else the byte
// tokenizer (as `qshard generate` and `qshard tokenize` default); a model built from
// model.init (no folder) takes the byte tokenizer.
// check_token_file_tokenizer: a file made with another tokenizer is an InputError naming the file,
// both fingerprints and the model's tokenizer; a file recording none gives back a one-line warning
// (it is still read: files written before version 4).
// Thread safety: free functions, no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "text/token_file.h"

namespace qshard {

constexpr uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

constexpr uint64_t kByteTokenizerFingerprint = fnv1a64("qshard byte tokenizer");

// "byte", "none" or "fnv64:<16 hex digits>".
std::string fingerprint_name(uint64_t fingerprint);

// The fingerprint of tokenizer.json's text; `label` names it in errors (bad JSON is an InputError).
uint64_t tokenizer_json_fingerprint(std::string_view json_text, const std::string& label);
// The same for a tokenizer.json file or a folder holding one; InputError when there is none.
uint64_t tokenizer_fingerprint_of(const std::string& path);

struct ModelTokenizer {
  uint64_t fingerprint = kByteTokenizerFingerprint;
  std::string source;  // "DIR/tokenizer.json", or why it is the byte tokenizer
};
// The tokenizer of a model folder (empty: a model built from model.init).
ModelTokenizer model_tokenizer(const std::string& model_dir);

// Throws InputError when `file` was made by another tokenizer than `model`'s; returns a warning
// ("" when none) when the file records no tokenizer.
std::string check_token_file_tokenizer(const TokenFile& file, const ModelTokenizer& model);

}  // namespace qshard
