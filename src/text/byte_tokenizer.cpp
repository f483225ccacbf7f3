#include "text/byte_tokenizer.h"
#include "text/tokenizer_fingerprint.h"
#include "text/chat_template.h"

#include <optional>
#if QSHARD_WITH_TOKENIZER
#include "text/hf_tokenizer.h"
#endif
#include "runtime/input_file.h"

#include <filesystem>
#include <cstdint>
#include <functional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/numbers.h"
#include "text/record_reader.h"
#include "text/token_file.h"

namespace qshard {
namespace {

bool is_blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The limit's name in messages: the tokenize command's flag (TokenizeOptions::max_record_bytes).
constexpr const char* kRecordLimitName = "--max-record-bytes";

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

}  // namespace

InputFormat parse_input_format(std::string_view name) {
  if (name == "auto") return InputFormat::kAuto;
  if (name == "text") return InputFormat::kText;
  if (name == "jsonl") return InputFormat::kJsonl;
  if (name == "alpaca") return InputFormat::kAlpaca;
  if (name == "chat") return InputFormat::kChat;
  throw InputError(fmt::format("unknown input format '{}' (expected auto, text, jsonl, alpaca or chat)", name));
}

std::string alpaca_prompt(std::string_view instruction, std::string_view input) {
  if (input.empty())
    return fmt::format("Below is an instruction that describes a task. Write a response that appropriately completes "
                       "the request.\n\n### Instruction:\n{}\n\n### Response:\n",
                       instruction);
  return fmt::format("Below is an instruction that describes a task, paired with an input that provides further "
                     "context. Write a response that appropriately completes the request.\n\n### Instruction:\n{}"
                     "\n\n### Input:\n{}\n\n### Response:\n",
                     instruction, input);
}

namespace {

struct Instruction {
  std::string prompt, response;
};

// Calls fn(record, "file:line") for each JSON object of a JSONL input (blank lines skipped), one
// line in memory at a time (`lines`: a RecordReader or MemoryLines).
template <class Lines, class Fn>
void for_each_record(Lines& lines, const std::string& label, Fn&& fn) {
  std::string line;
  while (lines.next_line(line)) {
    if (is_blank(line)) continue;
    const std::string where = fmt::format("{}:{}", label, lines.line_no());
    nlohmann::ordered_json j = parse_json_input(line, where);
    if (!j.is_object()) throw InputError(fmt::format("{}: expected a JSON object per line, got {}", where, j.type_name()));
    fn(j, where);
  }
}

// Calls fn(instruction) for each alpaca record of `lines`.
template <class Lines, class Fn>
void for_each_alpaca(Lines& lines, const std::string& label, Fn&& fn) {
  for_each_record(lines, label, [&](const nlohmann::ordered_json& j, const std::string& where) {
    auto field = [&](const char* key, bool required) -> std::string {
      const auto it = j.find(key);
      if (it == j.end()) {
        if (required) throw InputError(fmt::format("{}: no field \"{}\" (alpaca records have instruction, input, output)", where, key));
        return {};
      }
      if (!it->is_string()) throw InputError(fmt::format("{}: field \"{}\" is {}, expected a string", where, key, it->type_name()));
      return it->get<std::string>();
    };
    Instruction r;
    r.prompt = alpaca_prompt(field("instruction", true), field("input", false));
    r.response = field("output", true);
    if (r.response.empty()) throw InputError(fmt::format("{}: field \"output\" is empty: nothing to train on", where));
    fn(r);
  });
}

// A chat record: {"messages": [{"role": "...", "content": "..."}, ...]} with at least one
// assistant message; each message an object with string role and content (other keys kept).
struct ChatRecord {
  nlohmann::ordered_json messages;
  std::string where;
};

// Calls fn(record) for each chat record of `lines`.
template <class Lines, class Fn>
void for_each_chat(Lines& lines, const std::string& label, Fn&& fn) {
  for_each_record(lines, label, [&](nlohmann::ordered_json& j, const std::string& where) {
    const auto it = j.find("messages");
    if (it == j.end() || !it->is_array() || it->empty())
      throw InputError(fmt::format("{}: expected a field \"messages\" holding a non-empty list of messages", where));
    bool assistant = false;
    for (size_t i = 0; i < it->size(); ++i) {
      const auto& m = (*it)[i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        throw InputError(fmt::format("{}: message {} has no string \"role\"", where, i));
      if (!m.contains("content") || !(m["content"].is_string() || m["content"].is_null()))
        throw InputError(fmt::format("{}: message {} ({}) has no string \"content\"", where, i, m["role"].get<std::string>()));
      assistant = assistant || m["role"] == "assistant";
    }
    if (!assistant) throw InputError(fmt::format("{}: no assistant message: nothing to train on", where));
    fn(ChatRecord{std::move(*it), where});
  });
}

InputFormat resolve_format(InputFormat format, const std::string& label) {
  if (format != InputFormat::kAuto) return format;
  return ends_with(label, ".jsonl") || ends_with(label, ".json") ? InputFormat::kJsonl : InputFormat::kText;
}

// Calls emit(document) for each document of a text input split on blank lines, or of a jsonl
// input, read from `lines` one line at a time. A paragraph longer than max_bytes is refused
// naming its first line (a line longer than that, by a RecordReader, already while it is read).
template <class Lines, class Emit>
void split_lines(Lines& lines, InputFormat format, const TokenizeOptions& options, const std::string& label,
                 int64_t max_bytes, Emit&& emit) {
  std::string line, paragraph;
  bool in_paragraph = false;
  int64_t first_line = 0;
  while (lines.next_line(line)) {
    const int64_t line_no = lines.line_no();
    if (format == InputFormat::kText) {  // blank-line paragraphs
      if (is_blank(line)) {
        if (in_paragraph) emit(std::move(paragraph));
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
    if (is_blank(line)) continue;  // jsonl: blank lines are allowed
    const nlohmann::json j = parse_json_input(line, fmt::format("{}:{}", label, line_no));
    if (!j.is_object()) throw InputError(fmt::format("{}:{}: expected a JSON object per line, got {}", label, line_no, j.type_name()));
    const auto it = j.find(options.jsonl_field);
    if (it == j.end())
      throw InputError(fmt::format("{}:{}: no field \"{}\" (set the field name with the jsonl field option)", label,
                                   line_no, options.jsonl_field));
    if (!it->is_string())
      throw InputError(fmt::format("{}:{}: field \"{}\" is {}, expected a string", label, line_no, options.jsonl_field,
                                   it->type_name()));
    auto doc = it->get<std::string>();
    if (!doc.empty()) emit(std::move(doc));
  }
  if (in_paragraph) emit(std::move(paragraph));
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
  format = resolve_format(format, label);
  if (format == InputFormat::kText && options.text_split == TextSplit::kFile) {
    if (!contents.empty()) docs.emplace_back(contents);
    return docs;
  }
  MemoryLines lines(contents);
  split_lines(lines, format, options, label, INT64_MAX, [&](std::string doc) { docs.push_back(std::move(doc)); });
  return docs;
}

TokenizeStats tokenize_files(const std::vector<std::string>& inputs, const TokenizeOptions& options,
                             const std::string& out_path) {
  if (inputs.empty()) throw InputError(fmt::format("{}: no input files to tokenize", out_path));
  const int64_t max_bytes = options.max_record_bytes;
  check_int(kRecordLimitName, max_bytes, 1, kMaxRecordBytesCeiling);
  // Every input is checked before the output is created; the output must not be one of them.
  for (const auto& path : inputs) {
    check_input_file(path, "input file");
    std::error_code ec;
    if (std::filesystem::exists(out_path, ec) && std::filesystem::equivalent(path, out_path, ec))
      throw InputError(fmt::format("--out {} is also an input; tokenizing would overwrite it", out_path));
  }
  TokenizeStats stats;
  const bool alpaca = options.format == InputFormat::kAlpaca;
  const bool chat = options.format == InputFormat::kChat;
  if (chat && options.tokenizer.empty())
    throw InputError("--format chat needs --tokenizer: a model folder with tokenizer.json and a chat template");
  // The tokenizer: ids of a text (no BOS/EOS) and the BOS / EOS ids, byte-level or the model's.
  std::function<std::vector<uint32_t>(std::string_view)> encode = [](std::string_view text) {
    return std::vector<uint32_t>(reinterpret_cast<const uint8_t*>(text.data()),
                                 reinterpret_cast<const uint8_t*>(text.data()) + text.size());
  };
  std::optional<uint32_t> bos = kByteBos, eos = kByteEos;
  uint32_t vocab = kByteVocabSize;
#if QSHARD_WITH_TOKENIZER
  std::optional<HfTokenizer> hf;
  if (!options.tokenizer.empty()) {
    hf = HfTokenizer::load(options.tokenizer);
    encode = [&hf](std::string_view text) { return hf->encode(text); };
    bos = hf->bos_id();
    eos = hf->eos_id();
    vocab = hf->vocab_size();
  }
#else
  if (!options.tokenizer.empty())
    throw InputError("--tokenizer " + options.tokenizer + ": this build has no native tokenizer (PCRE2 was not found; "
                     "run scripts/setup.sh and rebuild)");
#endif
  // Version 4: each document's first token flagged (data.packing: padded keeps documents apart) and
  // the tokenizer's fingerprint (train refuses the file for a model with another tokenizer).
  const uint64_t fingerprint =
      options.tokenizer.empty() ? kByteTokenizerFingerprint : tokenizer_fingerprint_of(options.tokenizer);
  TokenFileWriter writer(out_path, vocab, /*loss_mask=*/true, /*doc_starts=*/true, fingerprint);
  stats.tokenizer_fingerprint = fingerprint;
  std::optional<ChatTemplate> chat_template;
  if (chat) chat_template = ChatTemplate::from_model_dir(options.tokenizer);
  // One document: BOS, its ids, EOS, the first token flagged.
  auto write_document = [&](std::string_view doc) {
    std::vector<uint32_t> tokens;
    if (bos) tokens.push_back(*bos);
    const std::vector<uint32_t> ids = encode(doc);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    if (eos) tokens.push_back(*eos);
    if (!tokens.empty()) tokens[0] |= kTokenDocStart;
    stats.targets += static_cast<int64_t>(tokens.size());
    writer.append(tokens);
    ++stats.documents;
    stats.bytes += static_cast<int64_t>(doc.size());
  };
  for (const auto& path : inputs) {
    const InputFormat format = resolve_format(options.format, path);
    if (format == InputFormat::kText && options.text_split == TextSplit::kFile) {
      if (options.tokenizer.empty()) {
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
          writer.append(tokens);
          bytes += static_cast<int64_t>(piece.size());
        }
        if (bytes > 0) {
          writer.append(std::vector<uint32_t>{kByteEos});
          stats.targets += bytes + 2;
          ++stats.documents;
          stats.bytes += bytes;
        }
      } else {
        // A model's tokenizer encodes the document whole: the file is one record.
        const uint64_t size = check_input_file(path, "input file");
        if (size > static_cast<uint64_t>(max_bytes))
          throw InputError(record_limit_error(path + ":1", max_bytes, kRecordLimitName) +
                           fmt::format(" (--split file: the whole file, {} bytes, is one document; --split "
                                       "blank-lines makes each paragraph one)", size));
        const std::string contents = read_input_file(path, "input file", static_cast<uint64_t>(max_bytes));
        if (!contents.empty()) write_document(contents);
      }
      ++stats.files;
      continue;
    }
    RecordReader reader(path, "input file", max_bytes, kRecordLimitName);
    if (chat) {
      // The conversation as the template renders it; the assistant messages' spans are the
      // targets, the rest context. Each piece is encoded on its own (no special tokens added: the
      // template writes them), as generation sees it: the prompt encoded, the reply generated.
      for_each_chat(reader, path, [&](const ChatRecord& r) {
        ChatRender cr;
        try {
          cr = render_with_spans(*chat_template, r.messages);
        } catch (const InputError& e) {
          throw InputError(fmt::format("{}: {}", r.where, e.what()));
        }
        std::vector<uint32_t> tokens;
        size_t at = 0;
        int64_t targets = 0;
        auto piece = [&](size_t end, bool target) {
          if (end <= at) return;
          for (uint32_t id : encode(std::string_view(cr.text).substr(at, end - at))) {
            tokens.push_back(target ? id : id | kTokenNoLoss);
            targets += target;
          }
          at = end;
        };
        for (const auto& [b, e] : cr.assistant_spans) {
          piece(b, false);
          piece(e, true);
        }
        piece(cr.text.size(), false);
        if (targets == 0) throw InputError(fmt::format("{}: the assistant messages render to no tokens", r.where));
        tokens[0] |= kTokenDocStart;
        stats.targets += targets;
        writer.append(tokens);
        ++stats.documents;
        stats.bytes += static_cast<int64_t>(cr.text.size());
      });
      ++stats.files;
      continue;
    }
    if (alpaca) {
      for_each_alpaca(reader, path, [&](const Instruction& r) {
        std::vector<uint32_t> tokens;
        if (bos) tokens.push_back(*bos | kTokenNoLoss);
        for (uint32_t id : encode(r.prompt)) tokens.push_back(id | kTokenNoLoss);
        const size_t first_target = tokens.size();
        for (uint32_t id : encode(r.response)) tokens.push_back(id);
        if (eos) tokens.push_back(*eos);
        if (!tokens.empty()) tokens[0] |= kTokenDocStart;
        stats.targets += static_cast<int64_t>(tokens.size() - first_target);
        writer.append(tokens);
        ++stats.documents;
        stats.bytes += static_cast<int64_t>(r.prompt.size() + r.response.size());
      });
      ++stats.files;
      continue;
    }
    split_lines(reader, format, options, path, max_bytes, [&](const std::string& doc) { write_document(doc); });
    ++stats.files;
  }
  writer.finish();
  stats.tokens = writer.num_tokens();
  return stats;
}

}  // namespace qshard
