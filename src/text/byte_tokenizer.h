// byte_tokenizer.h: the byte-level tokenizer and `tokenize_files` (for `qshard tokenize`).
//
// Vocabulary (kByteVocabSize = 258):
//   0..255  the byte of that value (UTF-8 text is tokenized byte by byte; any byte is valid)
//   256     BOS (kByteBos), begins every document
//   257     EOS (kByteEos), ends every document
// A document of k bytes becomes k + 2 tokens: BOS, its bytes in order, EOS. Empty documents are
// skipped. Documents follow each other in input order (files in the given order) in one stream.
//
// Inputs:
//   text   by default one document per file: the whole file, bytes as they are (newlines and
//          blank lines kept, so paragraph structure stays in the training text).
//          With TextSplit::kBlankLines, a document is each run of non-blank lines (a line of only
//          spaces, tabs or '\r' is blank), joined with "\n", without a final newline.
//   jsonl  JSON records; the document is the string field `jsonl_field` (default "text"), its
//          UTF-8 bytes. A record that is not a JSON object, or lacks the field, or whose field is
//          not a string, is an InputError naming file:line.
//   alpaca, chat, sharegpt, prompt_completion: JSON records of instruction data and conversations
//          (text/record_formats.h: their fields, checks and what is trained). alpaca and string
//          prompt_completion records become BOS + prompt + response + EOS with only the response and
//          EOS targets (BOS and the prompt kTokenNoLoss); prompt and response are tokenized
//          separately. chat, sharegpt and conversational prompt_completion records need --tokenizer
//          (a model folder with a chat template: text/chat_template.h): a record is rendered by the
//          template as transformers' apply_chat_template does (no generation prompt); the trained
//          assistant messages' text (render_with_spans: each reply through its end-of-turn tokens)
//          are the targets, everything else kTokenNoLoss. The pieces are encoded one by one
//          without special tokens added (the template writes BOS and the turn markers), so a
//          reply's tokens are the ones generation produces after its prompt. The spans follow
//          render_with_spans's rules (text/chat_template.h): {% generation %} blocks where the
//          template has them, else each reply through its end-of-turn text as the template renders
//          it; a conversation it cannot mask is an InputError naming file:line.
//   auto   per file: a name not ending in .jsonl / .json is text; a JSON file's format is detected
//          from its first record's keys (detect_format: messages -> chat, conversations -> sharegpt,
//          instruction + output -> alpaca, prompt + completion -> prompt_completion, the jsonl field
//          -> jsonl; anything else refused listing the keys). options.on_format hears the choice.
// JSON records (every format but text) come from text/json_record_reader.h: JSON Lines, or a .json
// file holding one top-level array of records (streamed element by element; errors name
// "file:line (element i)") or top-level objects (one object: one record).
// Every format writes version 4 (token_file.h): each document's first token flagged, and the
// tokenizer's fingerprint (text/tokenizer_fingerprint.h) in the header.
// Records and memory: inputs are read in pieces (text/record_reader.h), one record at a time, never
// a whole file. A record is a JSON record (a line, an array element, an object), a paragraph of text with
// TextSplit::kBlankLines, and a whole text file with TextSplit::kFile. A record longer than
// max_record_bytes is an InputError naming file:line (the record's first line) and the limit,
// raised once that many bytes are read (so a 2 GB line never fills memory). The one exception: a
// whole text file (TextSplit::kFile) with the byte tokenizer is streamed in pieces, whatever its
// size (the byte tokenizer needs no context); with a model's tokenizer it is one record.
// Errors (unreadable input, bad JSONL, output I/O) are InputError naming the file.
// The output is written with TokenFileWriter (token_file.h): complete or absent, never partial.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/record_formats.h"

namespace qshard {

constexpr uint32_t kByteBos = 256;
constexpr uint32_t kByteEos = 257;
constexpr uint32_t kByteVocabSize = 258;

// max_record_bytes: the default (64 MiB: far above any real document or JSONL record) and the
// range `qshard tokenize --max-record-bytes` takes (runtime/numbers.h).
constexpr int64_t kDefaultMaxRecordBytes = int64_t{64} << 20;
constexpr int64_t kMaxRecordBytesCeiling = int64_t{1} << 40;

enum class TextSplit : uint8_t { kFile, kBlankLines };

struct TokenizeOptions {
  InputFormat format = InputFormat::kAuto;
  std::string jsonl_field = "text";
  TextSplit text_split = TextSplit::kFile;
  // A model folder (or tokenizer.json): its tokenizer instead of the byte tokenizer. A document
  // becomes BOS + its ids (no special tokens added) + EOS with the bos/eos tokens of the folder's
  // tokenizer_config.json where it names them (as scripts/tools/tokenize_hf.py writes it); the token
  // file's vocab_size is the tokenizer's (vocabulary and added tokens).
  std::string tokenizer;
  // The longest record held in memory (see "Records and memory" above); in [1, kMaxRecordBytesCeiling].
  int64_t max_record_bytes = kDefaultMaxRecordBytes;
  // When set, called once per input before it is read with the format it is read as and how that
  // was chosen ("--format", "detected from the first record's keys", ...): the CLI prints it.
  std::function<void(const std::string& path, InputFormat format, const std::string& how)> on_format;
};

struct TokenizeStats {
  int64_t files = 0;
  int64_t documents = 0;  // non-empty documents (alpaca: records) written
  int64_t bytes = 0;      // content bytes
  int64_t tokens = 0;
  int64_t targets = 0;    // tokens the loss is taken on (all of them for text and jsonl)
  uint64_t tokenizer_fingerprint = 0;  // recorded in the file (text/tokenizer_fingerprint.h)
};

// BOS + the bytes of `doc` + EOS.
std::vector<uint32_t> byte_tokenize(std::string_view doc);
// Inverse for content: bytes 0..255 back to a string; BOS dropped, EOS written as "\n".
// Ids >= 258 are written as U+FFFD (the 3 UTF-8 bytes).
std::string byte_detokenize(std::span<const uint32_t> tokens);

// Splits one input's contents, held in memory, into documents (the rules above; no record limit).
// `label` names it in errors.
std::vector<std::string> split_documents(std::string_view contents, InputFormat format, const TokenizeOptions& options,
                                         const std::string& label);

// Tokenizes `inputs` in order into one token file at `out_path` (vocab 258, or the tokenizer's),
// one record in memory at a time. Throws InputError (no inputs, a bad input or record, a
// max_record_bytes outside its range).
TokenizeStats tokenize_files(const std::vector<std::string>& inputs, const TokenizeOptions& options,
                             const std::string& out_path);

// The markers preview_files wraps the trained tokens' text in.
struct PreviewMarkers {
  std::string open = "[[", close = "]]";
};
constexpr int64_t kMaxPreviewSamples = 1'000'000;

// The first `samples` samples of `inputs` (in [1, kMaxPreviewSamples]) as they will be trained,
// read exactly as tokenize_files reads them (the same records, tokens and masks) but written
// nowhere; the walk stops after the last one shown. Per sample, a line
//   "--- sample <k> (<file:line>): <n> tokens, <t> trained, <n - t> masked"
// then the sample's token ids decoded (the tokenizer's decode with special tokens kept; the byte
// tokenizer shows BOS and EOS as "<bos>" and "<eos>"), each run of trained tokens between
// markers.open and markers.close, and a newline if the text does not end with one. A whole text
// file (--split file) is one record under max_record_bytes here, also with the byte tokenizer.
std::string preview_files(const std::vector<std::string>& inputs, const TokenizeOptions& options, int64_t samples,
                          const PreviewMarkers& markers = {});

}  // namespace qshard
