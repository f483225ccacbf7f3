// token_file.h: the token file (".tok") that training reads, its streaming writer and mmap reader.
//
// Byte layout (all integers little-endian; qshard requires a little-endian host):
//   [0, 8)    magic, the 8 ASCII bytes "QSTOKENS"
//   [8, 12)   u32 version = 1
//   [12, 16)  u32 vocab_size: every token id is < vocab_size (258 for the byte tokenizer)
//   [16, 24)  u64 num_tokens: N
//   [24, 28)  u32 dtype code: 4 = uint32 (the only one in version 1)
//   [28, 32)  u32 reserved = 0
//   [32, 32 + 4N)  the tokens, u32 each, one stream: documents back to back, each normally
//                  BOS + content + EOS (the tokenizer's choice; the format does not care)
// The file is exactly 32 + 4N bytes (version 4: 64 + 4N, below). scripts/tools/tokenize_hf.py writes the same format.
// Version 2 (a loss mask; `qshard tokenize --format alpaca` writes it): the same layout, and bit 31
// of a token (kTokenNoLoss) marks it as context only: it is read as an input but is never a
// target (no loss on predicting it: BOS and the prompt of instruction data). Ids stay < 2^31.
// Version 3 (`qshard tokenize` writes it): version 2's mask, and bit 30 of a token (kTokenDocStart)
// marks the first token of a document, so a reader can keep documents apart (data.packing:
// padded). Ids stay < 2^30.
// Version 4 (`qshard tokenize` writes it): version 3's tokens after a 64-byte header whose first 32
// bytes are as above, then
//   [32, 40)  u64 tokenizer fingerprint: which tokenizer made the ids (text/tokenizer_fingerprint.h:
//             FNV-1a 64 of the canonical tokenizer.json, or the byte tokenizer's constant); never 0
//   [40, 64)  reserved = 0
//   [64, 64 + 4N)  the tokens
// so the file is exactly 64 + 4N bytes. Versions 1-3 record no tokenizer (fingerprint 0).
// Version 1 files read as before: every token a target.
//
// Reader (TokenFile): open() maps the file read-only and checks the header and the size; every
// malformation is an InputError naming the file and what was expected (bad magic, unsupported
// version or dtype, reserved != 0, vocab_size 0, truncated / trailing bytes). Token values are
// not scanned at open (a large file opens in O(1)); validate(max_vocab) scans them and reports
// the first id >= min(vocab_size, max_vocab) with its index.
// Ownership: TokenFile owns the mapping; tokens() points into it. Movable, not copyable. The file
// must not be rewritten in place while mapped (the writer renames a new file over it instead).
// Thread safety: immutable after open(); const methods may be called concurrently.
//
// Writer (TokenFileWriter): append() tokens in any chunks, finish() writes the count into the
// header, fsyncs, and renames "<path>.tmp.<pid>" onto path; destroyed unfinished, it removes the
// temp file. append() rejects ids >= vocab_size with an InputError naming the path and the id.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace qshard {

constexpr char kTokenFileMagic[8] = {'Q', 'S', 'T', 'O', 'K', 'E', 'N', 'S'};
constexpr uint32_t kTokenFileVersion = 1;
constexpr uint32_t kTokenFileVersionMasked = 2;
constexpr uint32_t kTokenFileVersionDocs = 3;
constexpr uint32_t kTokenFileVersionTokenizer = 4;
constexpr uint32_t kTokenNoLoss = 0x80000000u;  // version 2: this token is never a target
constexpr uint32_t kTokenDocStart = 0x40000000u;  // version 3: this token begins a document
// The bits of a token that are its id, given which flag bits the file's version carries.
constexpr uint32_t token_id_bits(bool loss_mask, bool doc_starts) {
  return ~((loss_mask ? kTokenNoLoss : 0u) | (doc_starts ? kTokenDocStart : 0u));
}
constexpr uint32_t kTokenDtypeU32 = 4;
constexpr size_t kTokenFileHeaderBytes = 32;
constexpr size_t kTokenFileHeaderBytesV4 = 64;
constexpr uint64_t kNoTokenizerFingerprint = 0;  // versions 1-3: which tokenizer made the ids is not recorded

class TokenFile {
 public:
  // Maps and checks `path`. Throws InputError naming the path.
  static TokenFile open(const std::string& path);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  uint32_t vocab_size() const { return vocab_size_; }
  int64_t size() const { return static_cast<int64_t>(num_tokens_); }
  std::span<const uint32_t> tokens() const { return {tokens_, num_tokens_}; }
  uint32_t operator[](int64_t i) const { return tokens_[i]; }
  // Version 2 and 3: tokens carry the kTokenNoLoss bit.
  bool loss_mask() const { return loss_mask_; }
  // Version 3: tokens carry the kTokenDocStart bit.
  bool doc_starts() const { return doc_starts_; }
  uint32_t version() const { return version_; }
  // Version 4: the fingerprint of the tokenizer that made the ids; kNoTokenizerFingerprint before.
  uint64_t tokenizer_fingerprint() const { return tokenizer_fingerprint_; }
  // The bits of a token that are its id.
  uint32_t id_bits() const { return token_id_bits(loss_mask_, doc_starts_); }

  // Scans every token; throws InputError "<path>: token 1234 at index 56 is >= <limit> (...)"
  // for the first id >= min(vocab_size(), max_vocab).
  void validate(uint32_t max_vocab) const;

 private:
  TokenFile() = default;
  void unmap();

  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  const uint32_t* tokens_ = nullptr;
  size_t num_tokens_ = 0;
  uint32_t vocab_size_ = 0;
  uint32_t version_ = 0;
  uint64_t tokenizer_fingerprint_ = kNoTokenizerFingerprint;
  bool loss_mask_ = false;
  bool doc_starts_ = false;
};

class TokenFileWriter {
 public:
  // Creates "<path>.tmp.<pid>" (the parent directory must exist). REQUIRES: vocab_size > 0.
  // loss_mask: a version 2 file; append() then takes ids with the kTokenNoLoss bit.
  // doc_starts: a version 3 file; append() takes ids with the kTokenNoLoss and kTokenDocStart bits.
  // tokenizer_fingerprint != kNoTokenizerFingerprint: a version 4 file recording it (REQUIRES doc_starts).
  TokenFileWriter(std::string path, uint32_t vocab_size, bool loss_mask = false, bool doc_starts = false,
                  uint64_t tokenizer_fingerprint = kNoTokenizerFingerprint);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  void append(std::span<const uint32_t> tokens);
  // Completes the file (header count, fsync, rename). No append() after it.
  void finish();
  int64_t num_tokens() const { return static_cast<int64_t>(count_); }

 private:
  std::string path_, temp_path_;
  uint32_t vocab_size_;
  bool loss_mask_ = false;
  bool doc_starts_ = false;
  uint64_t tokenizer_fingerprint_ = kNoTokenizerFingerprint;
  std::FILE* f_ = nullptr;
  uint64_t count_ = 0;
};

// Writes a whole token file at once (writer + finish).
void write_token_file(const std::string& path, uint32_t vocab_size, std::span<const uint32_t> tokens);

}  // namespace qshard
