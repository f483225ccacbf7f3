#include "text/byte_tokenizer.h"

#include <cstdint>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/input_file.h"
#include "runtime/numbers.h"
#include "text/chat_template.h"
#include "text/json_record_reader.h"
#include "text/record_reader.h"
#include "text/token_file.h"
#include "text/tokenizer_fingerprint.h"
#if QSHARD_WITH_TOKENIZER
#include "text/hf_tokenizer.h"
#endif

namespace qshard {
namespace {

bool blank_line(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_json_name(const std::string& path) { return ends_with(path, ".jsonl") || ends_with(path, ".json"); }

// The limit's name in messages: the tokenize command's flag (TokenizeOptions::max_record_bytes).
constexpr const char* kRecordLimitName = "--max-record-bytes";

// The id bits of a token as tokenize writes it (the loss and document-start flags cleared).
constexpr uint32_t kIdBits = token_id_bits(/*loss_mask=*/true, /*doc_starts=*/true);

// The lines of an input held in memory, with RecordReader's next_line / line_no (split_documents).
class MemoryLines {
 public:
  explicit MemoryLines(std::string_view contents) : contents_(contents) {}
  bool next_line(std::string& line) {
    if (pos_ >= contents_.size()) return false;
    size_t end = contents_.find('\n', pos_);
    if (end == std::string_view::npos) end = contents_.size();
    line.assign(contents_.substr(pos_, end - pos_));
    pos_ = end + 1;
    ++line_no_;
    return true;
  }
  int64_t line_no() const { return line_no_; }

 private:
  std::string_view contents_;
  size_t pos_ = 0;
  int64_t line_no_ = 0;
};

// Calls emit(document, first line) for each document of a text input split on blank lines, or of a JSON Lines
// input (format jsonl), read from `lines` one line at a time. A paragraph longer than max_bytes is
// refused naming its first line (a line longer than that, by a RecordReader, already while it is read).
template <class Lines, class Emit>
void split_lines(Lines& lines, InputFormat format, const TokenizeOptions& options, const std::string& label,
                 int64_t max_bytes, Emit&& emit) {
  std::string line, paragraph;
  bool in_paragraph = false;
  int64_t first_line = 0;
  while (lines.next_line(line)) {
    const int64_t line_no = lines.line_no();
    if (format == InputFormat::kText) {  // blank-line paragraphs
      if (blank_line(line)) {
        if (in_paragraph) emit(std::move(paragraph), first_line);
        paragraph.clear();
        in_paragraph = false;
      } else {
        if (!in_paragraph) first_line = line_no;
        if (static_cast<int64_t>(paragraph.size() + in_paragraph + line.size()) > max_bytes)
          throw InputError(record_limit_error(fmt::format("{}:{}", label, first_line), max_bytes, kRecordLimitName));
        if (in_paragraph) paragraph.push_back('\n');
        paragraph.append(line);
        in_paragraph = true;
      }
      continue;
    }
    if (blank_line(line)) continue;  // jsonl: blank lines are allowed
    const std::string where = fmt::format("{}:{}", label, line_no);
    nlohmann::ordered_json j = parse_ordered_json_input(line, where);
    if (!j.is_object()) throw InputError(fmt::format("{}: expected a JSON object per line, got {}", where, j.type_name()));
    Sample s = record_sample(InputFormat::kJsonl, j, options.jsonl_field, where);
    if (!s.text.empty()) emit(std::move(s.text), line_no);
  }
  if (in_paragraph) emit(std::move(paragraph), first_line);
}

// The tokenizer of a run (byte-level, or a model folder's with its chat template, loaded when a
// record first needs it) and a Sample's tokens: kTokenNoLoss on the context, kTokenDocStart on the first.
class SampleEncoder {
 public:
  explicit SampleEncoder(const TokenizeOptions& options) : options_(options) {
#if QSHARD_WITH_TOKENIZER
    if (!options.tokenizer.empty()) {
      hf_ = HfTokenizer::load(options.tokenizer);
      bos_ = hf_->bos_id();
      eos_ = hf_->eos_id();
      vocab_ = hf_->vocab_size();
    }
#else
    if (!options.tokenizer.empty())
      throw InputError("--tokenizer " + options.tokenizer + ": this build has no native tokenizer (PCRE2 was not "
                       "found; run scripts/setup.sh and rebuild)");
#endif
    fingerprint_ = options.tokenizer.empty() ? kByteTokenizerFingerprint : tokenizer_fingerprint_of(options.tokenizer);
  }

  uint32_t vocab() const { return vocab_; }
  uint64_t fingerprint() const { return fingerprint_; }

  // The chat template, for `what` (a file and its format, or a record) that needs one.
  const ChatTemplate& chat_template(const std::string& what) {
    if (options_.tokenizer.empty())
      throw InputError(fmt::format("{} is rendered by a chat template: give --tokenizer, a model folder with "
                                   "tokenizer.json and a chat template",
                                   what));
    if (!template_) template_ = ChatTemplate::from_model_dir(options_.tokenizer);
    return *template_;
  }

  // Ids of a text (no BOS / EOS, no special tokens added).
  std::vector<uint32_t> encode(std::string_view text) const {
#if QSHARD_WITH_TOKENIZER
    if (hf_) return hf_->encode(text);
#endif
    return std::vector<uint32_t>(reinterpret_cast<const uint8_t*>(text.data()),
                                 reinterpret_cast<const uint8_t*>(text.data()) + text.size());
  }

  // Text of ids (no flags): the tokenizer's decode, special tokens kept; the byte tokenizer writes
  // BOS and EOS as "<bos>" and "<eos>".
  std::string decode(std::span<const uint32_t> ids) const {
#if QSHARD_WITH_TOKENIZER
    if (hf_) return hf_->decode(ids);
#endif
    std::string s;
    for (uint32_t id : ids) {
      if (id < 256) s.push_back(static_cast<char>(id));
      else if (id == kByteBos) s += "<bos>";
      else if (id == kByteEos) s += "<eos>";
      else s += "\xEF\xBF\xBD";
    }
    return s;
  }

  // The tokens of `s` (empty for an empty text document); `bytes` gets its content bytes.
  std::vector<uint32_t> tokens(const Sample& s, const std::string& where, int64_t& bytes) {
    std::vector<uint32_t> out;
    switch (s.kind) {
      case Sample::Kind::kText:
        bytes = static_cast<int64_t>(s.text.size());
        if (s.text.empty()) return out;
        if (bos_) out.push_back(*bos_);
        for (uint32_t id : encode(s.text)) out.push_back(id);
        if (eos_) out.push_back(*eos_);
        break;
      case Sample::Kind::kPromptResponse:
        bytes = static_cast<int64_t>(s.text.size() + s.response.size());
        if (bos_) out.push_back(*bos_ | kTokenNoLoss);
        for (uint32_t id : encode(s.text)) out.push_back(id | kTokenNoLoss);
        for (uint32_t id : encode(s.response)) out.push_back(id);
        if (eos_) out.push_back(*eos_);
        break;
      case Sample::Kind::kChat: chat(s, where, out, bytes); break;
    }
    if (!out.empty()) out[0] |= kTokenDocStart;
    return out;
  }

 private:
  // The conversation as the template renders it; the trained assistant messages' spans are the
  // targets, the rest context. Each piece is encoded on its own (no special tokens added: the
  // template writes them), as generation sees it: the prompt encoded, the reply generated.
  void chat(const Sample& s, const std::string& where, std::vector<uint32_t>& out, int64_t& bytes) {
    const ChatTemplate& t = chat_template(where + ": this record");
    ChatRender cr;
    try {
      cr = render_with_spans(t, s.messages);
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {}", where, e.what()));
    }
    // Skip the spans of the assistant messages before first_trained (the prompt's): by their count
    // (rules 2 and 3 give one span per assistant message, in order), or, for {% generation %} blocks
    // (spans by block), those inside the render of the prompt's messages alone.
    size_t skip = 0;
    if (s.first_trained > 0 && cr.rule == ChatRender::Rule::kGeneration) {
      nlohmann::ordered_json prompt_messages = nlohmann::ordered_json::array();
      for (size_t i = 0; i < s.first_trained && i < s.messages.size(); ++i) prompt_messages.push_back(s.messages[i]);
      const std::string prompt = t.render(prompt_messages, false);
      if (cr.text.compare(0, prompt.size(), prompt) != 0)
        throw InputError(fmt::format("{}: the template's render of the prompt messages alone is not a prefix of the whole "
                                     "conversation's: its generation blocks cannot be told apart from the completion's",
                                     where));
      while (skip < cr.assistant_spans.size() && cr.assistant_spans[skip].second <= prompt.size()) ++skip;
    } else {
      for (size_t i = 0; i < s.first_trained && i < s.messages.size(); ++i) skip += s.messages[i]["role"] == "assistant";
    }
    size_t at = 0;
    int64_t targets = 0;
    auto piece = [&](size_t end, bool target) {
      if (end <= at) return;
      for (uint32_t id : encode(std::string_view(cr.text).substr(at, end - at))) {
        out.push_back(target ? id : id | kTokenNoLoss);
        targets += target;
      }
      at = end;
    };
    for (size_t k = skip; k < cr.assistant_spans.size(); ++k) {
      piece(cr.assistant_spans[k].first, false);
      piece(cr.assistant_spans[k].second, true);
    }
    piece(cr.text.size(), false);
    if (targets == 0) throw InputError(fmt::format("{}: the assistant messages render to no tokens", where));
    bytes = static_cast<int64_t>(cr.text.size());
  }

  const TokenizeOptions& options_;
  std::optional<uint32_t> bos_ = kByteBos, eos_ = kByteEos;
  uint32_t vocab_ = kByteVocabSize;
  uint64_t fingerprint_ = 0;
#if QSHARD_WITH_TOKENIZER
  std::optional<HfTokenizer> hf_;
#endif
  std::optional<ChatTemplate> template_;
};

// Walks the inputs in order and hands each sample's tokens to a sink.
//   sink(tokens, bytes, where) -> bool: false stops the walk.
// With `stream_to`, a whole text file under the byte tokenizer streams into that writer in pieces
// (the byte tokenizer needs no context), counted in `stats`; without it (preview) it is one record
// under the record limit, like any other.
class SampleWalker {
 public:
  SampleWalker(const TokenizeOptions& options, SampleEncoder& encoder, TokenizeStats& stats, TokenFileWriter* stream_to)
      : o_(options), enc_(encoder), stats_(stats), stream_to_(stream_to) {}

  template <class Sink>
  void run(const std::vector<std::string>& inputs, Sink&& sink) {
    for (const auto& path : inputs) {
      if (!file(path, sink)) return;
      ++stats_.files;
    }
  }

 private:
  void announce(const std::string& path, InputFormat format, const std::string& how) {
    if (o_.on_format) o_.on_format(path, format, how);
    if (is_chat_format(format)) enc_.chat_template(fmt::format("{}: format {}", path, input_format_name(format)));
  }

  // One input; false when the sink stopped the walk.
  template <class Sink>
  bool file(const std::string& path, Sink& sink) {
    const int64_t max_bytes = o_.max_record_bytes;
    InputFormat format = o_.format;
    if (format == InputFormat::kText || (format == InputFormat::kAuto && !is_json_name(path))) {
      announce(path, InputFormat::kText, format == InputFormat::kAuto ? "not .jsonl / .json" : "--format");
      return text_file(path, sink);
    }
    JsonRecordReader reader(path, max_bytes, kRecordLimitName);
    nlohmann::ordered_json record;
    std::string where;
    bool have = false;
    if (format == InputFormat::kAuto) {
      have = reader.next(record, where);
      format = have ? detect_format(record, o_.jsonl_field, where) : InputFormat::kJsonl;
      announce(path, format, have ? "detected from the first record's keys" : "no records");
    } else {
      announce(path, format, "--format");
    }
    while (have || reader.next(record, where)) {
      have = false;
      const Sample s = record_sample(format, record, o_.jsonl_field, where);
      int64_t bytes = 0;
      const std::vector<uint32_t> tokens = enc_.tokens(s, where, bytes);
      if (!tokens.empty() && !sink(tokens, bytes, where)) return false;
    }
    return true;
  }

  template <class Sink>
  bool text_file(const std::string& path, Sink& sink) {
    const int64_t max_bytes = o_.max_record_bytes;
    auto document = [&](std::string doc, const std::string& where) {
      Sample s;
      s.text = std::move(doc);
      int64_t bytes = 0;
      const std::vector<uint32_t> tokens = enc_.tokens(s, where, bytes);
      return tokens.empty() || sink(tokens, bytes, where);
    };
    if (o_.text_split == TextSplit::kBlankLines) {
      RecordReader reader(path, "input file", max_bytes, kRecordLimitName);
      struct Stop {};  // the sink has seen enough: the rest of the file is not read
      try {
        split_lines(reader, InputFormat::kText, o_, path, max_bytes, [&](std::string doc, int64_t line) {
          if (!document(std::move(doc), fmt::format("{}:{}", path, line))) throw Stop{};
        });
      } catch (const Stop&) {
        return false;
      }
      return true;
    }
    if (o_.tokenizer.empty() && stream_to_ != nullptr) {
      // The byte tokenizer needs no context: the file streams through in pieces, whatever its size.
      RecordReader reader(path, "input file", max_bytes, kRecordLimitName);
      std::string_view piece;
      std::vector<uint32_t> tokens;
      int64_t bytes = 0;
      while (reader.next_chunk(piece)) {
        tokens.clear();
        if (bytes == 0) tokens.push_back(kByteBos | kTokenDocStart);
        tokens.insert(tokens.end(), reinterpret_cast<const uint8_t*>(piece.data()),
                      reinterpret_cast<const uint8_t*>(piece.data()) + piece.size());
        stream_to_->append(tokens);
        bytes += static_cast<int64_t>(piece.size());
      }
      if (bytes > 0) {
        stream_to_->append(std::vector<uint32_t>{kByteEos});
        stats_.targets += bytes + 2;
        ++stats_.documents;
        stats_.bytes += bytes;
      }
      return true;
    }
    // A model's tokenizer encodes the document whole: the file is one record.
    const uint64_t size = check_input_file(path, "input file");
    if (size > static_cast<uint64_t>(max_bytes))
      throw InputError(record_limit_error(path + ":1", max_bytes, kRecordLimitName) +
                       fmt::format(" (--split file: the whole file, {} bytes, is one document; --split "
                                   "blank-lines makes each paragraph one)", size));
    return document(read_input_file(path, "input file", static_cast<uint64_t>(max_bytes)), path);
  }

  const TokenizeOptions& o_;
  SampleEncoder& enc_;
  TokenizeStats& stats_;
  TokenFileWriter* stream_to_;
};

// The checks every run makes before reading: inputs given and readable, the record limit in range.
void check_run(const std::vector<std::string>& inputs, const TokenizeOptions& options, const std::string& out_label) {
  if (inputs.empty()) throw InputError(fmt::format("{}: no input files to tokenize", out_label));
  check_int(kRecordLimitName, options.max_record_bytes, 1, kMaxRecordBytesCeiling);
  for (const auto& path : inputs) check_input_file(path, "input file");
}

// One sample's preview (see preview_files): the runs of trained and of context tokens decoded, the
// trained ones between the markers. Each run's text is the growth of the decoded prefix (so a
// decoder that treats the first token specially, as Metaspace does, reads it in context), or the
// run decoded alone where the prefix's text does not grow by appending.
std::string preview_sample(const std::vector<uint32_t>& tokens, const SampleEncoder& enc, const PreviewMarkers& markers) {
  std::vector<uint32_t> ids;
  ids.reserve(tokens.size());
  for (uint32_t t : tokens) ids.push_back(t & kIdBits);
  std::string out, prefix;
  size_t begin = 0;
  while (begin < tokens.size()) {
    const bool trained = !(tokens[begin] & kTokenNoLoss);
    size_t end = begin;
    while (end < tokens.size() && !(tokens[end] & kTokenNoLoss) == trained) ++end;
    std::string grown = enc.decode(std::span<const uint32_t>(ids).first(end));
    std::string run = grown.compare(0, prefix.size(), prefix) == 0
                          ? grown.substr(prefix.size())
                          : enc.decode(std::span<const uint32_t>(ids).subspan(begin, end - begin));
    if (trained) out += markers.open + run + markers.close;
    else out += run;
    prefix = std::move(grown);
    begin = end;
  }
  return out;
}

}  // namespace

std::vector<uint32_t> byte_tokenize(std::string_view doc) {
  std::vector<uint32_t> out;
  out.reserve(doc.size() + 2);
  out.push_back(kByteBos);
  for (char c : doc) out.push_back(static_cast<uint8_t>(c));
  out.push_back(kByteEos);
  return out;
}

std::string byte_detokenize(std::span<const uint32_t> tokens) {
  std::string s;
  s.reserve(tokens.size());
  for (uint32_t t : tokens) {
    if (t < 256) s.push_back(static_cast<char>(t));
    else if (t == kByteEos) s.push_back('\n');
    else if (t != kByteBos) s += "\xEF\xBF\xBD";
  }
  return s;
}

std::vector<std::string> split_documents(std::string_view contents, InputFormat format, const TokenizeOptions& options,
                                         const std::string& label) {
  std::vector<std::string> docs;
  if (format == InputFormat::kAuto) format = is_json_name(label) ? InputFormat::kJsonl : InputFormat::kText;
  if (format != InputFormat::kText && format != InputFormat::kJsonl)
    throw InputError(fmt::format("{}: split_documents reads text and jsonl, not {}", label, input_format_name(format)));
  if (format == InputFormat::kText && options.text_split == TextSplit::kFile) {
    if (!contents.empty()) docs.emplace_back(contents);
    return docs;
  }
  MemoryLines lines(contents);
  split_lines(lines, format, options, label, INT64_MAX, [&](std::string doc, int64_t) { docs.push_back(std::move(doc)); });
  return docs;
}

TokenizeStats tokenize_files(const std::vector<std::string>& inputs, const TokenizeOptions& options,
                             const std::string& out_path) {
  check_run(inputs, options, out_path);
  // The output must not be one of the inputs (checked before it is created).
  for (const auto& path : inputs) {
    std::error_code ec;
    if (std::filesystem::exists(out_path, ec) && std::filesystem::equivalent(path, out_path, ec))
      throw InputError(fmt::format("--out {} is also an input; tokenizing would overwrite it", out_path));
  }
  if (is_chat_format(options.format) && options.tokenizer.empty())
    throw InputError(fmt::format("--format {} needs --tokenizer: a model folder with tokenizer.json and a chat template",
                                 input_format_name(options.format)));
  SampleEncoder enc(options);
  TokenizeStats stats;
  // Version 4: each document's first token flagged (data.packing: padded keeps documents apart) and
  // the tokenizer's fingerprint (train refuses the file for a model with another tokenizer).
  TokenFileWriter writer(out_path, enc.vocab(), /*loss_mask=*/true, /*doc_starts=*/true, enc.fingerprint());
  stats.tokenizer_fingerprint = enc.fingerprint();
  SampleWalker walker(options, enc, stats, &writer);
  walker.run(inputs, [&](const std::vector<uint32_t>& tokens, int64_t bytes, const std::string&) {
    for (uint32_t t : tokens) stats.targets += !(t & kTokenNoLoss);
    writer.append(tokens);
    ++stats.documents;
    stats.bytes += bytes;
    return true;
  });
  writer.finish();
  stats.tokens = writer.num_tokens();
  return stats;
}

std::string preview_files(const std::vector<std::string>& inputs, const TokenizeOptions& options, int64_t samples,
                          const PreviewMarkers& markers) {
  check_run(inputs, options, "--preview");
  check_int("--preview", samples, 1, kMaxPreviewSamples);
  if (is_chat_format(options.format) && options.tokenizer.empty())
    throw InputError(fmt::format("--format {} needs --tokenizer: a model folder with tokenizer.json and a chat template",
                                 input_format_name(options.format)));
  SampleEncoder enc(options);
  TokenizeStats stats;
  SampleWalker walker(options, enc, stats, nullptr);
  std::string out;
  int64_t n = 0;
  walker.run(inputs, [&](const std::vector<uint32_t>& tokens, int64_t, const std::string& where) {
    int64_t trained = 0;
    for (uint32_t t : tokens) trained += !(t & kTokenNoLoss);
    ++n;
    out += fmt::format("--- sample {} ({}): {} tokens, {} trained, {} masked\n", n, where, tokens.size(), trained,
                       static_cast<int64_t>(tokens.size()) - trained);
    out += preview_sample(tokens, enc, markers);
    if (!out.empty() && out.back() != '\n') out.push_back('\n');
    return n < samples;
  });
  if (n == 0) out += "(no samples: the inputs hold no records)\n";
  return out;
}

}  // namespace qshard
