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
//   jsonl  one JSON object per non-empty line; the document is the string field `jsonl_field`
//          (default "text"), its UTF-8 bytes. A line that is not a JSON object, or lacks the
//          field, or whose field is not a string, is an InputError naming file:line.
//   auto   by extension: ".jsonl" / ".json" -> jsonl, anything else -> text.
//   alpaca instruction data, one JSON object per non-empty line with string fields "instruction",
//          "output" and optionally "input": the prompt is Stanford Alpaca's template (alpaca_prompt())
//          and the response the output. A record becomes BOS + prompt + response + EOS, and only
//          the response and EOS are targets: the token file is version 2 (token_file.h) with BOS and
//          the prompt marked kTokenNoLoss. Prompt and response are tokenized separately. A bad
//          record is an InputError naming file:line and the field.
//   chat   conversations, one JSON object per non-empty line with "messages": a list of
//          {"role", "content"} objects holding at least one assistant message. Needs --tokenizer (a
//          model folder with a chat template: text/chat_template.h). A record is rendered by the
//          template as transformers' apply_chat_template does (no generation prompt); the
//          assistant messages' text (render_with_spans: each reply through its end-of-turn tokens)
//          are the targets, everything else kTokenNoLoss. The pieces are encoded one by one
//          without special tokens added (the template writes BOS and the turn markers), so a
//          reply's tokens are the ones generation produces after its prompt. A template that does
//          not render the conversation prefix-consistently is an InputError naming file:line.
// Every format writes version 4 (token_file.h): each document's first token flagged, and the
// tokenizer's fingerprint (text/tokenizer_fingerprint.h) in the header.
// Records and memory: inputs are read in pieces (text/record_reader.h), one record at a time, never
// a whole file. A record is a line of jsonl / alpaca / chat, a paragraph of text with
// TextSplit::kBlankLines, and a whole text file with TextSplit::kFile. A record longer than
// max_record_bytes is an InputError naming file:line (the record's first line) and the limit,
// raised once that many bytes are read (so a 2 GB line never fills memory). The one exception: a
// whole text file (TextSplit::kFile) with the byte tokenizer is streamed in pieces, whatever its
// size (the byte tokenizer needs no context); with a model's tokenizer it is one record.
// Errors (unreadable input, bad JSONL, output I/O) are InputError naming the file.
// The output is written with TokenFileWriter (token_file.h): complete or absent, never partial.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qshard {

constexpr uint32_t kByteBos = 256;
constexpr uint32_t kByteEos = 257;
constexpr uint32_t kByteVocabSize = 258;

// max_record_bytes: the default (64 MiB: far above any real document or JSONL record) and the
// range `qshard tokenize --max-record-bytes` takes (runtime/numbers.h).
constexpr int64_t kDefaultMaxRecordBytes = int64_t{64} << 20;
constexpr int64_t kMaxRecordBytesCeiling = int64_t{1} << 40;

enum class InputFormat : uint8_t { kAuto, kText, kJsonl, kAlpaca, kChat };
enum class TextSplit : uint8_t { kFile, kBlankLines };

// "auto" | "text" | "jsonl"; anything else throws InputError naming the value.
InputFormat parse_input_format(std::string_view name);

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
};

struct TokenizeStats {
  int64_t files = 0;
  int64_t documents = 0;  // non-empty documents (alpaca: records) written
  int64_t bytes = 0;      // content bytes
  int64_t tokens = 0;
  int64_t targets = 0;    // tokens the loss is taken on (all of them but for alpaca)
  uint64_t tokenizer_fingerprint = 0;  // recorded in the file (text/tokenizer_fingerprint.h)
};

// Stanford Alpaca's prompt for an instruction and an optional input (the text before the response).
std::string alpaca_prompt(std::string_view instruction, std::string_view input);

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

}  // namespace qshard
