// qshard tokenize: text / JSON record files -> a token file, with the byte-level tokenizer or a
// model folder's own (see commands.h); --preview shows the first samples as they will be trained.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
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
  int64_t preview = 0;
};

void add_tokenize(CLI::App& sub, TokenizeArgs& a) {
  sub.add_option("INPUTS", a.inputs, "text files, or JSON Lines (.jsonl) / JSON (.json: one array of records) files")
      ->required();
  sub.add_option("--out", a.out, "output token file (required unless --preview)");
  sub.add_option("--format", a.format,
                 "auto (JSON files: from the first record's keys; other files: text) | text | jsonl (--field) | "
                 "alpaca (instruction/input/output) | chat (messages) | sharegpt (conversations of from/value) | "
                 "prompt_completion (TRL: prompt + completion, strings or message lists); chat, sharegpt and "
                 "message-list prompt_completion are rendered by --tokenizer's chat template; all but text and "
                 "jsonl take the loss on the responses only");
  sub.add_option("--field", a.field, "jsonl field holding the text");
  sub.add_option("--split", a.split, "text documents: file (one per file) | blank-lines");
  sub.add_option("--tokenizer", a.tokenizer,
                 "a model folder (or tokenizer.json): its tokenizer, natively, instead of the byte tokenizer");
  add_int_option(sub, "--max-record-bytes", a.max_record_bytes, 1, kMaxRecordBytesCeiling,
                 "the longest record read into memory: a JSON record (a line, an array element), a paragraph "
                 "(--split blank-lines), a whole file (--split file with --tokenizer or --preview); a longer one "
                 "is refused naming file:line (default 64 MiB)");
  add_int_option(sub, "--preview", a.preview, 0, kMaxPreviewSamples,
                 "print the first N samples as they will be trained: the tokens decoded, the trained (loss) "
                 "spans between [[ and ]] (in green instead when stdout is a terminal and NO_COLOR is unset: "
                 "markers would be ambiguous in text that holds brackets, colour is not copied), with each "
                 "sample's trained and masked token counts; nothing is written unless --out is given too (then "
                 "the whole file is written after the preview); 0: no preview");
  sub.footer("Example:\n  qshard tokenize data/*.txt --out /tmp/tiny.tok   (the byte tokenizer)\n"
             "  qshard tokenize chats.jsonl --format chat --tokenizer models/Llama-3.2-1B-Instruct --out chats.tok\n"
             "  qshard tokenize sharegpt.json --tokenizer models/Llama-3.2-1B-Instruct --preview 3   (format detected)");
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
  if (a.out.empty() && a.preview == 0) throw InputError("--out is required (or --preview N to only look at the samples)");
  to.on_format = [](const std::string& path, InputFormat format, const std::string& how) {
    std::printf("%s: format %s (%s)\n", path.c_str(), input_format_name(format), how.c_str());
    std::fflush(stdout);
  };
  if (a.preview > 0) {
    PreviewMarkers markers;
    if (::isatty(::fileno(stdout)) == 1 && std::getenv("NO_COLOR") == nullptr) markers = {"\033[32m", "\033[0m"};
    std::fputs(preview_files(a.inputs, to, a.preview, markers).c_str(), stdout);
    if (a.out.empty()) return 0;
    to.on_format = nullptr;  // printed already
  }
  const TokenizeStats st = tokenize_files(a.inputs, to, a.out);
  std::printf("tokenized %lld files, %lld documents, %lld bytes -> %lld tokens (%lld targets) in %s (tokenizer %s)\n",
              (long long)st.files, (long long)st.documents, (long long)st.bytes, (long long)st.tokens,
              (long long)st.targets, a.out.c_str(), fingerprint_name(st.tokenizer_fingerprint).c_str());
  return 0;
}

}  // namespace

CommandMain attach_tokenize(CLI::App& sub) { return attach_with(sub, add_tokenize, run_tokenize); }

}  // namespace qshard::cli
