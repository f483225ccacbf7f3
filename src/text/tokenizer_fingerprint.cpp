#include "text/tokenizer_fingerprint.h"

#include <filesystem>

#include <fmt/format.h>

#include "runtime/error.h"
#include "runtime/input_file.h"
#include "text/hf_tokenizer.h"  // kMaxTokenizerFileBytes (a constant: no PCRE2 needed)

namespace qshard {

namespace fs = std::filesystem;

std::string fingerprint_name(uint64_t fingerprint) {
  if (fingerprint == kNoTokenizerFingerprint) return "none";
  if (fingerprint == kByteTokenizerFingerprint) return "byte";
  return fmt::format("fnv64:{:016x}", fingerprint);
}

uint64_t tokenizer_json_fingerprint(std::string_view json_text, const std::string& label) {
  // dump(): compact, object keys sorted (nlohmann::json keeps them in a std::map), UTF-8 as is.
  const uint64_t h = fnv1a64(parse_json_input(json_text, label).dump());
  // 0 and the byte tokenizer's value mean something else; a tokenizer.json hashing to either
  // (odds 2^-63) takes a neighbour.
  return h == kNoTokenizerFingerprint || h == kByteTokenizerFingerprint ? h + 2 : h;
}

uint64_t tokenizer_fingerprint_of(const std::string& path) {
  std::error_code ec;
  const std::string file = fs::is_directory(path, ec) ? (fs::path(path) / "tokenizer.json").string() : path;
  return tokenizer_json_fingerprint(read_input_file(file, "tokenizer file", kMaxTokenizerFileBytes), file);
}

ModelTokenizer model_tokenizer(const std::string& model_dir) {
  ModelTokenizer m;
  if (model_dir.empty()) {
    m.source = "the byte tokenizer (a model built from model.init)";
    return m;
  }
  const std::string file = (fs::path(model_dir) / "tokenizer.json").string();
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    m.source = fmt::format("the byte tokenizer ({} has no tokenizer.json)", model_dir);
    return m;
  }
  m.fingerprint = tokenizer_fingerprint_of(file);
  m.source = file;
  return m;
}

std::string check_token_file_tokenizer(const TokenFile& file, const ModelTokenizer& model) {
  const uint64_t fp = file.tokenizer_fingerprint();
  if (fp == kNoTokenizerFingerprint)
    return fmt::format("{}: a version {} token file records no tokenizer: not checked against the model's, {} "
                       "(`qshard tokenize` writes version 4, which does)",
                       file.path(), file.version(), model.source);
  if (fp != model.fingerprint)
    throw InputError(fmt::format("{}: made by another tokenizer ({}) than the model's, {} ({}); tokenize the data "
                                 "with the model's tokenizer (qshard tokenize --tokenizer MODEL_DIR, or without "
                                 "--tokenizer for the byte tokenizer)",
                                 file.path(), fingerprint_name(fp), model.source, fingerprint_name(model.fingerprint)));
  return {};
}

}  // namespace qshard
