// qshard tokenize: text / jsonl files -> a token file, with the byte-level tokenizer or a model
// folder's own (see commands.h).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "number_options.h"
#include "runtime/error.h"
#include "text/byte_tokenizer.h"
#include "text/tokenizer_fingerprint.h"

namespace qshard::cli {
namespace {

struct TokenizeArgs {
  std::vector<std::string> inputs;
  std::string out, format = "auto", field = "text", split = "file", tokenizer;
  int64_t max_record_bytes = kDefaultMaxRecordBytes;
};

void add_tokenize(CLI::App& sub, TokenizeArgs& a) {
  sub.add_option("INPUTS", a.inputs, "text or jsonl files")->required();
  sub.add_option("--out", a.out, "output token file")->required();
  sub.add_option("--format", a.format,
                 "auto | text | jsonl | alpaca (instruction/input/output records) | chat (messages records, rendered by --tokenizer's chat template): loss on the responses only");
  sub.add_option("--field", a.field, "jsonl field holding the text");
  sub.add_option("--split", a.split, "text documents: file (one per file) | blank-lines");
  sub.add_option("--tokenizer", a.tokenizer,
                 "a model folder (or tokenizer.json): its tokenizer, natively, instead of the byte tokenizer");
  add_int_option(sub, "--max-record-bytes", a.max_record_bytes, 1, kMaxRecordBytesCeiling,
                 "the longest record read into memory: a jsonl / alpaca / chat line, a paragraph (--split "
                 "blank-lines), a whole file (--split file with --tokenizer); a longer one is refused naming "
                 "file:line (default 64 MiB)");
  sub.footer("Example:\n  qshard tokenize data/*.txt --out /tmp/tiny.tok   (the byte tokenizer)\n"
             "  qshard tokenize chats.jsonl --format chat --tokenizer models/Llama-3.2-1B-Instruct --out chats.tok");
}

int run_tokenize(TokenizeArgs& a, int, char**) {
  TokenizeOptions to;
  to.format = parse_input_format(a.format);
  to.jsonl_field = a.field;
  to.tokenizer = a.tokenizer;
  to.max_record_bytes = a.max_record_bytes;
  if (a.split == "file") to.text_split = TextSplit::kFile;
  else if (a.split == "blank-lines") to.text_split = TextSplit::kBlankLines;
  else throw InputError("--split '" + a.split + "' is not 'file' or 'blank-lines'");
  const TokenizeStats st = tokenize_files(a.inputs, to, a.out);
  std::printf("tokenized %lld files, %lld documents, %lld bytes -> %lld tokens (%lld targets) in %s (tokenizer %s)\n",
              (long long)st.files, (long long)st.documents, (long long)st.bytes, (long long)st.tokens,
              (long long)st.targets, a.out.c_str(), fingerprint_name(st.tokenizer_fingerprint).c_str());
  return 0;
}

}  // namespace

CommandMain attach_tokenize(CLI::App& sub) { return attach_with(sub, add_tokenize, run_tokenize); }

}  // namespace qshard::cli
