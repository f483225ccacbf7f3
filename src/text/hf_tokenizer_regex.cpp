// hf_tokenizer_regex.cpp: the native tokenizer's regular expressions: PCRE2 (UTF + Unicode
// properties, JIT where available) behind Regex, replace-all, and tokenizer.json's pattern objects
// ({"Regex": ...} or a literal {"String": ...}). Contract: hf_tokenizer_pipeline.h.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "runtime/error.h"
#include "text/hf_tokenizer.h"
#include "text/hf_tokenizer_pipeline.h"

namespace qshard::hf_tok {

namespace {

// The defaults (hf_tokenizer_pipeline.h), against what the real tokenizers (tests/data/tokenizer:
// GPT-2, Llama 3, DeepSeek-V3, Mistral 7B twice, Qwen) need on the golden corpus (> 1 MB, 1466 documents;
// tests/text/hf_tokenizer_limits_test.cpp, RealPatternsNeedFarLessThanTheLimits):
//   - the whole corpus encodes with match_base 10,000 and match_per_byte 0 (the most any search
//     needs: Llama 3's and DeepSeek-V3's \s*[\r\n]+ over an 8001-byte whitespace document, between
//     3,000 and 10,000 steps), so the base has 100x margin;
//   - it encodes with match_base 100 and match_per_byte 2 (steps grow with the text a search
//     scans), and a 1 MiB whitespace document encodes with the defaults: 16 a byte is 8x margin;
//   - it encodes with PCRE2's default 32 KiB JIT stack: 8 MiB is 256x that.
// (a+)+$ on 28 characters needs about 2^28 steps: refused after 1,000,000 + 16 * 28.
constexpr uint32_t kRegexMatchBase = 1'000'000;
constexpr uint32_t kRegexMatchPerByte = 16;
constexpr uint32_t kRegexHeapKib = 256 * 1024;         // interpreter frames: 256 MiB
constexpr size_t kRegexJitStackBytes = size_t{8} << 20;  // reserved per thread that matches

std::atomic<uint32_t> g_base{kRegexMatchBase}, g_per_byte{kRegexMatchPerByte}, g_heap{kRegexHeapKib};
std::atomic<size_t> g_jit_stack{kRegexJitStackBytes};

// This thread's match context (the limits) and JIT stack; a JIT stack serves one thread at a time.
struct MatchEnv {
  pcre2_match_context* ctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  size_t stack_bytes = 0;
  ~MatchEnv() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
  }
};

pcre2_match_context* match_context(const RegexLimits& l) {
  thread_local MatchEnv env;
  if (!env.ctx && !(env.ctx = pcre2_match_context_create(nullptr))) throw std::bad_alloc();
  if (env.stack_bytes != l.jit_stack_bytes) {
    pcre2_jit_stack_free(env.stack);
    env.stack = pcre2_jit_stack_create(std::min<size_t>(32 * 1024, l.jit_stack_bytes), l.jit_stack_bytes, nullptr);
    if (!env.stack) throw std::bad_alloc();
    env.stack_bytes = l.jit_stack_bytes;
    pcre2_jit_stack_assign(env.ctx, nullptr, env.stack);
  }
  pcre2_set_heap_limit(env.ctx, l.heap_kib);
  return env.ctx;
}

const char* limit_name(int rc) {
  switch (rc) {
    case PCRE2_ERROR_MATCHLIMIT: return "match limit";
    case PCRE2_ERROR_DEPTHLIMIT: return "depth limit";
    case PCRE2_ERROR_HEAPLIMIT: return "heap limit";
    case PCRE2_ERROR_JIT_STACKLIMIT: return "JIT stack limit";
    case PCRE2_ERROR_NOMEMORY: return "memory limit";
    default: return nullptr;
  }
}

// s cut to about n bytes on a character boundary.
std::string shorten(std::string_view s, size_t n) {
  if (s.size() <= n) return std::string(s);
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "...";
}

}  // namespace

RegexLimits default_regex_limits() {
  return {kRegexMatchBase, kRegexMatchPerByte, kRegexHeapKib, kRegexJitStackBytes};
}

RegexLimits regex_limits() { return {g_base.load(), g_per_byte.load(), g_heap.load(), g_jit_stack.load()}; }

void set_regex_limits(const RegexLimits& l) {
  g_base = l.match_base;
  g_per_byte = l.match_per_byte;
  g_heap = l.heap_kib;
  g_jit_stack = l.jit_stack_bytes;
}

Regex::Regex(const std::string& pattern, const std::string& where) : pattern_(pattern), where_(where) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                &err, &off, nullptr);
  if (!c) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw InputError(where + ": regular expression '" + shorten(pattern, 200) + "' does not compile at offset " +
                     std::to_string(off) + ": " + reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // the interpreter stays when JIT is unavailable
  code_.reset(c, pcre2_code_free);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view s) const {
  std::vector<std::pair<size_t, size_t>> out;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
  if (!md) throw std::bad_alloc();
  const RegexLimits limits = regex_limits();
  pcre2_match_context* ctx = match_context(limits);
  size_t at = 0;
  while (at <= s.size()) {
    const uint64_t steps = std::min<uint64_t>(
        UINT32_MAX, limits.match_base + uint64_t{limits.match_per_byte} * (s.size() - at));
    pcre2_set_match_limit(ctx, static_cast<uint32_t>(steps));
    pcre2_set_depth_limit(ctx, static_cast<uint32_t>(steps));
    const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at, PCRE2_NO_UTF_CHECK,
                               md.get(), ctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (const char* limit = limit_name(rc)) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      throw InputError(where_ + ": regular expression '" + shorten(pattern_, 200) + "' gave up searching from byte " +
                       std::to_string(at) + " of a " + std::to_string(s.size()) + "-byte piece of text (starting '" +
                       shorten(s.substr(at), 40) + "'): PCRE2 " + limit + " (" + std::to_string(steps) +
                       " steps for this search, JIT stack " + std::to_string(limits.jit_stack_bytes) + " bytes): " +
                       reinterpret_cast<const char*>(msg) +
                       " - catastrophic backtracking; refused rather than run without bound");
    }
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      throw Error(where_ + ": regular expression '" + shorten(pattern_, 200) + "': match failed (PCRE2 error " +
                  std::to_string(rc) + ": " + reinterpret_cast<const char*>(msg) + ")");
    }
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
std::string regex_replace(const std::string& s, const Regex& re, const std::string& content, size_t max_bytes) {
  std::string out;
  size_t at = 0;
  for (auto [b, e] : re.find_all(s)) {
    out.append(s, at, b - at);
    out += content;
    at = e;
    if (out.size() > max_bytes) throw_text_growth(s.size(), max_bytes, "a Replace");
  }
  out.append(s, at, std::string::npos);
  if (out.size() > max_bytes) throw_text_growth(s.size(), max_bytes, "a Replace");
  return out;
}

void throw_text_growth(size_t from, size_t max_bytes, const char* what) {
  throw InputError(std::string("the normalizer's ") + what + " would grow a text of " + std::to_string(from) +
                   " bytes past " + std::to_string(max_bytes) + " bytes (" + std::to_string(kMaxNormalizedGrowth) +
                   " times the text it was given, plus " + std::to_string(kNormalizedSlack) +
                   "); refused (real normalizers grow a text at most a few times)");
}

size_t normalized_limit(size_t input_bytes) { return input_bytes * kMaxNormalizedGrowth + kNormalizedSlack; }

std::string regex_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos || c == ' ') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

void check_sequence_depth(int depth, const std::string& where, const char* what) {
  if (depth > kMaxSequenceDepth)
    throw InputError(where + ": " + what + " Sequence nested more than " + std::to_string(kMaxSequenceDepth) +
                     " deep; refused (real tokenizers nest at most 2)");
}

std::string component_type(const JsonField& j) { return j.object().string_or("type", ""); }

std::string metaspace_replacement(const JsonField& j) {
  const auto f = j.find("replacement");
  if (!f) return "\xE2\x96\x81";
  const std::string r = f->string();
  if (r.empty() || utf8_replace_invalid(r) != r || utf8_len(static_cast<unsigned char>(r[0])) != r.size())
    f->expected("exactly one character");
  return r;
}

std::string prepend_scheme_of(const JsonField& j) {
  if (const auto f = j.find("prepend_scheme")) {
    const std::string s = f->string();
    if (s != "always" && s != "first" && s != "never") f->expected("\"always\", \"first\" or \"never\"");
    return s;
  }
  return j.bool_or("add_prefix_space", true) ? "always" : "never";
}

std::string pattern_of(const JsonField& p) {
  const std::optional<JsonField> re = p.object().find("Regex"), str = p.find("String");
  if (re && !str) return re->string();
  if (str && !re) return regex_escape(str->string());
  p.expected("{\"Regex\": ...} or {\"String\": ...}");
}

}  // namespace qshard::hf_tok
