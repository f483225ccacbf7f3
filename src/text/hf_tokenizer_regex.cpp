// hf_tokenizer_regex.cpp: the native tokenizer's regular expressions: PCRE2 (UTF + Unicode
// properties, JIT where available) behind Regex, replace-all, and tokenizer.json's pattern objects
// ({"Regex": ...} or a literal {"String": ...}). Contract: hf_tokenizer_pipeline.h.
#include <memory>
#include <string>
#include <string_view>

#include "runtime/error.h"
#include "text/hf_tokenizer_pipeline.h"

namespace qshard::hf_tok {

Regex::Regex(const std::string& pattern, const std::string& where) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                &err, &off, nullptr);
  if (!c) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw InputError(where + ": regular expression '" + pattern + "' does not compile at offset " +
                     std::to_string(off) + ": " + reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // the interpreter stays when JIT is unavailable
  code_.reset(c, pcre2_code_free);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view s) const {
  std::vector<std::pair<size_t, size_t>> out;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
  size_t at = 0;
  while (at <= s.size()) {
    const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at, PCRE2_NO_UTF_CHECK,
                               md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw Error("tokenizer: regular expression match failed (PCRE2 error " + std::to_string(rc) + ")");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      at = e;
    } else {  // an empty match: step over one character
      if (b >= s.size()) break;
      at = b + utf8_len(static_cast<unsigned char>(s[b]));
    }
  }
  return out;
}

// Every match of `re` in s replaced by `content`.
std::string regex_replace(const std::string& s, const Regex& re, const std::string& content) {
  std::string out;
  size_t at = 0;
  for (auto [b, e] : re.find_all(s)) {
    out.append(s, at, b - at);
    out += content;
    at = e;
  }
  out.append(s, at, std::string::npos);
  return out;
}

std::string regex_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos || c == ' ') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// A tokenizer.json pattern: {"Regex": "..."} or {"String": "..."} (a literal).
std::string pattern_of(const json& p, const std::string& where) {
  if (p.is_object() && p.contains("Regex") && p["Regex"].is_string()) return p["Regex"].get<std::string>();
  if (p.is_object() && p.contains("String") && p["String"].is_string()) return regex_escape(p["String"].get<std::string>());
  throw InputError(where + ": pattern must be {\"Regex\": ...} or {\"String\": ...}");
}

}  // namespace qshard::hf_tok
