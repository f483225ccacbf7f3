#include "text/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <mutex>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace qshard {

// ---- UTF-8 ------------------------------------------------------------------------------------

std::string utf8_replace_invalid(std::string_view s) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    // The lead byte fixes the length and the range of the first continuation byte (Unicode
    // Table 3-7); a maximal ill-formed subsequence is replaced by one U+FFFD.
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    if (need == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    size_t j = i + 1;
    int got = 0;
    while (got < need && j < n) {
      const unsigned char d = p[j];
      const bool ok = got == 0 ? (d >= lo && d <= hi) : (d >= 0x80 && d <= 0xBF);
      if (!ok) break;
      ++got;
      ++j;
    }
    if (got == need) out.append(s.substr(i, j - i));
    else out += kReplacement;
    i = j;
  }
  return out;
}

namespace {

using json = nlohmann::json;

size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

char32_t utf8_decode_at(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  switch (utf8_len(p[0])) {
    case 1: return p[0];
    case 2: return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    case 3: return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    default: return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
  }
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t i = 0;
  for (size_t k; (k = s.find(from, i)) != std::string::npos; i = k + from.size()) {
    out.append(s, i, k - i);
    out += to;
  }
  out.append(s, i, std::string::npos);
  s = std::move(out);
}

// GPT-2's byte <-> printable character map (bytes 33-126, 161-172, 174-255 map to themselves,
// the rest to 256 + k in order).
struct ByteMap {
  std::array<std::string, 256> to_char;
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteMap() {
    int k = 0;
    for (int b = 0; b < 256; ++b) {
      const bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const char32_t c = self ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + k++);
      append_utf8(to_char[static_cast<size_t>(b)], c);
      to_byte[c] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// ---- regular expressions (PCRE2) ----------------------------------------------------------------

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where) {
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
  // Byte ranges [start, end) of the non-empty matches, left to right. REQUIRES valid UTF-8.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
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

 private:
  std::shared_ptr<pcre2_code> code_;
};

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

// ---- pieces and splitting --------------------------------------------------------------------------

struct Piece {
  std::string text;
  bool at_origin = false;  // starts at offset 0 of the input text (Metaspace's prepend_scheme "first")
};

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior behavior_of(const std::string& b, const std::string& where) {
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  throw InputError(where + ": unknown split behavior '" + b + "'");
}

// The tokenizers library's NormalizedString::split: matches (delimiters) and the text between them.
void split_piece(const Piece& p, const Regex& re, Behavior how, bool invert, std::vector<Piece>& out) {
  struct Seg {
    size_t b, e;
    bool match;
  };
  std::vector<Seg> segs;
  size_t at = 0;
  for (auto [b, e] : re.find_all(p.text)) {
    if (b > at) segs.push_back({at, b, false});
    segs.push_back({b, e, true});
    at = e;
  }
  if (at < p.text.size()) segs.push_back({at, p.text.size(), false});
  if (invert)
    for (Seg& s : segs) s.match = !s.match;
  std::vector<Seg> res;
  switch (how) {
    case Behavior::kIsolated: res = segs; break;
    case Behavior::kRemoved:
      for (const Seg& s : segs)
        if (!s.match) res.push_back(s);
      break;
    case Behavior::kContiguous:
      for (const Seg& s : segs) {
        if (!res.empty() && res.back().match && s.match) res.back().e = s.e;
        else res.push_back(s);
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Seg& s : segs) {
        if (s.match && !res.empty() && !res.back().match) res.back().e = s.e, res.back().match = true;
        else res.push_back(s);
      }
      break;
    case Behavior::kMergedWithNext: {
      bool pending = false;
      for (const Seg& s : segs) {
        if (pending) {
          res.back().e = s.e;
          pending = s.match;
        } else {
          res.push_back(s);
          pending = s.match;
        }
      }
      break;
    }
  }
  for (const Seg& s : res)
    if (s.e > s.b) out.push_back({p.text.substr(s.b, s.e - s.b), p.at_origin && s.b == 0});
}

// ---- normalizers and pre-tokenizers ----------------------------------------------------------

struct Normalizer {
  enum Kind { kSequence, kPrepend, kReplace, kStrip } kind = kSequence;
  std::vector<Normalizer> children;
  std::string text, content;
  std::shared_ptr<Regex> re;  // Replace; Strip: leading whitespace
  std::shared_ptr<Regex> trail;  // Strip: trailing whitespace
  bool left = false, right = false;

  void apply(std::string& s) const {
    switch (kind) {
      case kSequence:
        for (const Normalizer& n : children) n.apply(s);
        break;
      case kPrepend:
        if (!s.empty()) s = text + s;
        break;
      case kReplace:
        s = regex_replace(s, *re, content);
        break;
      case kStrip:
        if (right)
          for (auto [b, e] : trail->find_all(s)) s.erase(b, e - b);
        if (left)
          for (auto [b, e] : re->find_all(s)) s.erase(b, e - b);
        break;
    }
  }
};

Normalizer parse_normalizer(const json& j, const std::string& where) {
  Normalizer n;
  const std::string type = j.value("type", "");
  const std::string w = where + " normalizer " + type;
  if (type == "Sequence") {
    for (const json& c : j.at("normalizers")) n.children.push_back(parse_normalizer(c, where));
  } else if (type == "Prepend") {
    n.kind = Normalizer::kPrepend;
    n.text = j.at("prepend").get<std::string>();
  } else if (type == "Replace") {
    n.kind = Normalizer::kReplace;
    n.re = std::make_shared<Regex>(pattern_of(j.at("pattern"), w), w);
    n.content = j.at("content").get<std::string>();
  } else if (type == "Strip") {
    n.kind = Normalizer::kStrip;
    n.left = j.value("strip_left", false);
    n.right = j.value("strip_right", false);
    n.re = std::make_shared<Regex>("^\\s+", w);
    n.trail = std::make_shared<Regex>("\\s+$", w);
  } else {
    throw InputError(where + ": normalizer type '" + type +
                     "' is not supported (Sequence, Prepend, Replace and Strip are; Unicode normalization forms "
                     "such as NFC are not)");
  }
  return n;
}

constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct PreTokenizer {
  enum Kind { kSequence, kByteLevel, kSplit, kMetaspace } kind = kSequence;
  std::vector<PreTokenizer> children;
  std::shared_ptr<Regex> re;  // ByteLevel (use_regex), Split, Metaspace (the replacement, for split)
  Behavior behavior = Behavior::kIsolated;
  bool invert = false, add_prefix_space = false, split = true;
  std::string replacement;
  std::string prepend_scheme = "always";

  void apply(std::vector<Piece>& pieces) const {
    switch (kind) {
      case kSequence:
        for (const PreTokenizer& p : children) p.apply(pieces);
        return;
      case kSplit: {
        std::vector<Piece> out;
        for (const Piece& p : pieces) split_piece(p, *re, behavior, invert, out);
        pieces = std::move(out);
        return;
      }
      case kByteLevel: {
        std::vector<Piece> out;
        for (Piece p : pieces) {
          if (add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, " ");
          if (re) split_piece(p, *re, Behavior::kIsolated, false, out);
          else out.push_back(std::move(p));
        }
        const ByteMap& m = byte_map();
        for (Piece& p : out) {
          std::string mapped;
          for (unsigned char c : p.text) mapped += m.to_char[c];
          p.text = std::move(mapped);
        }
        pieces = std::move(out);
        return;
      }
      case kMetaspace: {
        std::vector<Piece> out;
        for (Piece p : pieces) {
          replace_all(p.text, " ", replacement);
          const bool starts = p.text.compare(0, replacement.size(), replacement) == 0;
          if (!starts && (prepend_scheme == "always" || (prepend_scheme == "first" && p.at_origin)))
            p.text.insert(0, replacement);
          if (split) split_piece(p, *re, Behavior::kMergedWithNext, false, out);
          else out.push_back(std::move(p));
        }
        pieces = std::move(out);
        return;
      }
    }
  }
};

PreTokenizer parse_pre_tokenizer(const json& j, const std::string& where) {
  PreTokenizer p;
  const std::string type = j.value("type", "");
  const std::string w = where + " pre_tokenizer " + type;
  if (type == "Sequence") {
    for (const json& c : j.at("pretokenizers")) p.children.push_back(parse_pre_tokenizer(c, where));
  } else if (type == "ByteLevel") {
    p.kind = PreTokenizer::kByteLevel;
    p.add_prefix_space = j.value("add_prefix_space", true);
    if (j.value("use_regex", true)) p.re = std::make_shared<Regex>(kGpt2Pattern, w);
  } else if (type == "Split") {
    p.kind = PreTokenizer::kSplit;
    p.re = std::make_shared<Regex>(pattern_of(j.at("pattern"), w), w);
    p.behavior = behavior_of(j.at("behavior").get<std::string>(), w);
    p.invert = j.value("invert", false);
  } else if (type == "Digits") {
    p.kind = PreTokenizer::kSplit;
    const bool individual = j.value("individual_digits", false);
    p.re = std::make_shared<Regex>("\\p{N}", w);
    p.behavior = individual ? Behavior::kIsolated : Behavior::kContiguous;
  } else if (type == "Whitespace") {
    p.kind = PreTokenizer::kSplit;
    p.re = std::make_shared<Regex>("\\w+|[^\\w\\s]+", w);
    p.behavior = Behavior::kRemoved;
    p.invert = true;
  } else if (type == "WhitespaceSplit") {
    p.kind = PreTokenizer::kSplit;
    p.re = std::make_shared<Regex>("\\s+", w);
    p.behavior = Behavior::kRemoved;
  } else if (type == "Metaspace") {
    p.kind = PreTokenizer::kMetaspace;
    p.replacement = j.value("replacement", std::string("\xE2\x96\x81"));
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) p.prepend_scheme = j["prepend_scheme"];
    else if (j.contains("add_prefix_space")) p.prepend_scheme = j.value("add_prefix_space", true) ? "always" : "never";
    p.split = j.value("split", true);
    p.re = std::make_shared<Regex>(regex_escape(p.replacement), w);
  } else {
    throw InputError(where + ": pre_tokenizer type '" + type +
                     "' is not supported (Sequence, ByteLevel, Split, Digits, Metaspace, Whitespace and "
                     "WhitespaceSplit are)");
  }
  return p;
}

// ---- decoders ---------------------------------------------------------------------------------------

struct Decoder {
  enum Kind { kSequence, kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip } kind = kSequence;
  std::vector<Decoder> children;
  std::string replacement, content;
  std::string prepend_scheme = "always";
  std::shared_ptr<Regex> re;
  size_t start = 0, stop = 0;

  void apply(std::vector<std::string>& t) const {
    switch (kind) {
      case kSequence:
        for (const Decoder& d : children) d.apply(t);
        return;
      case kByteLevel: {
        const ByteMap& m = byte_map();
        std::string bytes;
        for (const std::string& tok : t) {
          std::string b;
          bool all = true;
          for (size_t i = 0; i < tok.size(); i += utf8_len(static_cast<unsigned char>(tok[i]))) {
            auto it = m.to_byte.find(utf8_decode_at(tok, i));
            if (it == m.to_byte.end()) {
              all = false;
              break;
            }
            b.push_back(static_cast<char>(it->second));
          }
          bytes += all ? b : tok;
        }
        t = {utf8_replace_invalid(bytes)};
        return;
      }
      case kMetaspace: {
        for (size_t i = 0; i < t.size(); ++i) {
          std::string out;
          const std::string& tok = t[i];
          for (size_t k = 0; k < tok.size();) {
            if (tok.compare(k, replacement.size(), replacement) == 0) {
              if (!(i == 0 && k == 0 && prepend_scheme != "never")) out.push_back(' ');
              k += replacement.size();
            } else {
              out.push_back(tok[k++]);
            }
          }
          t[i] = std::move(out);
        }
        return;
      }
      case kReplace:
        for (std::string& tok : t) tok = regex_replace(tok, *re, content);
        return;
      case kByteFallback: {
        std::vector<std::string> out;
        std::string pending;
        size_t pending_n = 0;
        auto flush = [&] {
          if (pending_n == 0) return;
          if (utf8_replace_invalid(pending) == pending) {
            out.push_back(pending);
          } else {
            for (size_t i = 0; i < pending_n; ++i) out.emplace_back("\xEF\xBF\xBD");
          }
          pending.clear();
          pending_n = 0;
        };
        for (std::string& tok : t) {
          const bool byte = tok.size() == 6 && tok.compare(0, 3, "<0x") == 0 && tok[5] == '>' &&
                            std::isxdigit(static_cast<unsigned char>(tok[3])) &&
                            std::isxdigit(static_cast<unsigned char>(tok[4]));
          if (byte) {
            pending.push_back(static_cast<char>(std::stoi(tok.substr(3, 2), nullptr, 16)));
            ++pending_n;
          } else {
            flush();
            out.push_back(std::move(tok));
          }
        }
        flush();
        t = std::move(out);
        return;
      }
      case kFuse: {
        std::string all;
        for (const std::string& tok : t) all += tok;
        t = {all};
        return;
      }
      case kStrip:
        for (std::string& tok : t) {
          std::vector<size_t> starts;  // character starts
          for (size_t i = 0; i < tok.size(); i += utf8_len(static_cast<unsigned char>(tok[i]))) starts.push_back(i);
          auto char_at = [&](size_t k) {
            const size_t e = k + 1 < starts.size() ? starts[k + 1] : tok.size();
            return tok.substr(starts[k], e - starts[k]);
          };
          size_t b = 0, e = starts.size();
          for (size_t k = 0; k < start && k < starts.size() && char_at(k) == content; ++k) b = k + 1;
          for (size_t k = 0; k < stop && e > b && char_at(e - 1) == content; ++k) --e;
          const size_t bb = b < starts.size() ? starts[b] : tok.size(), ee = e < starts.size() ? starts[e] : tok.size();
          tok = bb < ee ? tok.substr(bb, ee - bb) : std::string();
        }
        return;
    }
  }
};

Decoder parse_decoder(const json& j, const std::string& where) {
  Decoder d;
  const std::string type = j.value("type", "");
  const std::string w = where + " decoder " + type;
  if (type == "Sequence") {
    for (const json& c : j.at("decoders")) d.children.push_back(parse_decoder(c, where));
  } else if (type == "ByteLevel") {
    d.kind = Decoder::kByteLevel;
  } else if (type == "Metaspace") {
    d.kind = Decoder::kMetaspace;
    d.replacement = j.value("replacement", std::string("\xE2\x96\x81"));
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) d.prepend_scheme = j["prepend_scheme"];
    else if (j.contains("add_prefix_space")) d.prepend_scheme = j.value("add_prefix_space", true) ? "always" : "never";
  } else if (type == "Replace") {
    d.kind = Decoder::kReplace;
    d.re = std::make_shared<Regex>(pattern_of(j.at("pattern"), w), w);
    d.content = j.at("content").get<std::string>();
  } else if (type == "ByteFallback") {
    d.kind = Decoder::kByteFallback;
  } else if (type == "Fuse") {
    d.kind = Decoder::kFuse;
  } else if (type == "Strip") {
    d.kind = Decoder::kStrip;
    d.content = j.at("content").get<std::string>();
    d.start = j.value("start", size_t{0});
    d.stop = j.value("stop", size_t{0});
  } else {
    throw InputError(where + ": decoder type '" + type +
                     "' is not supported (Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip are)");
  }
  return d;
}

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false;
};

bool is_word_char(char32_t c) { return c == '_' || (c < 128 && std::isalnum(static_cast<int>(c))) || c >= 128; }

}  // namespace

// ---- the tokenizer ------------------------------------------------------------------------------------

struct HfTokenizer::Impl {
  std::string path;
  std::unordered_map<std::string, uint32_t> vocab;
  std::vector<std::string> id_to_token;
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges;  // (a, b) -> (rank, merged id)
  std::optional<uint32_t> unk;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::array<std::optional<uint32_t>, 256> byte_ids{};  // "<0xAB>" tokens (byte_fallback)
  std::optional<Normalizer> normalizer;
  std::optional<PreTokenizer> pre_tokenizer;
  std::optional<Decoder> decoder;
  std::vector<AddedToken> added;       // longest first
  std::array<std::vector<const AddedToken*>, 256> added_by_byte;  // by first byte, longest first
  std::vector<bool> special;           // per id
  std::vector<uint32_t> prefix_ids, suffix_ids;  // the post-processor's template around the text
  std::optional<uint32_t> bos, eos;
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<uint32_t>> cache;

  void bpe(const std::string& word, std::vector<uint32_t>& out) const;
  void encode_section(std::string text, bool at_origin, std::vector<uint32_t>& out) const;
};

void HfTokenizer::Impl::bpe(const std::string& word, std::vector<uint32_t>& out) const {
  if (ignore_merges) {
    if (auto it = vocab.find(word); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    if (auto it = cache.find(word); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  // Symbols: the word's characters as vocabulary ids (byte-fallback tokens or unk otherwise).
  struct Sym {
    uint32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Sym> sym;
  bool last_unk = false;
  for (size_t i = 0; i < word.size();) {
    const size_t n = std::min(utf8_len(static_cast<unsigned char>(word[i])), word.size() - i);
    const std::string ch = word.substr(i, n);
    i += n;
    if (auto it = vocab.find(ch); it != vocab.end()) {
      sym.push_back({it->second, 0, 0, true});
      last_unk = false;
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_ids[b].has_value();
      if (all) {
        for (unsigned char b : ch) sym.push_back({*byte_ids[b], 0, 0, true});
        last_unk = false;
        continue;
      }
    }
    if (unk) {
      if (!(fuse_unk && last_unk)) sym.push_back({*unk, 0, 0, true});
      last_unk = true;
    }
  }
  const int n = static_cast<int>(sym.size());
  for (int k = 0; k < n; ++k) sym[k].prev = k - 1, sym[k].next = k + 1 < n ? k + 1 : -1;
  // Merges by rank, then leftmost (the tokenizers library's Word::merge_all without dropout).
  struct Cand {
    uint32_t rank;
    int pos;
    uint32_t new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q;
  auto pair_of = [&](int a, int b) -> const std::pair<uint32_t, uint32_t>* {
    auto it = merges.find((static_cast<uint64_t>(sym[a].id) << 32) | sym[b].id);
    return it == merges.end() ? nullptr : &it->second;
  };
  for (int k = 0; k + 1 < n; ++k)
    if (auto m = pair_of(k, k + 1)) q.push({m->first, k, m->second});
  while (!q.empty()) {
    const Cand c = q.top();
    q.pop();
    Sym& s = sym[c.pos];
    if (!s.alive || s.next < 0) continue;
    const int r = s.next;
    auto m = pair_of(c.pos, r);
    if (!m || m->second != c.new_id) continue;  // an expired entry
    s.id = c.new_id;
    sym[r].alive = false;
    s.next = sym[r].next;
    if (s.next >= 0) sym[s.next].prev = c.pos;
    if (s.prev >= 0)
      if (auto pm = pair_of(s.prev, c.pos)) q.push({pm->first, s.prev, pm->second});
    if (s.next >= 0)
      if (auto nm = pair_of(c.pos, s.next)) q.push({nm->first, c.pos, nm->second});
  }
  std::vector<uint32_t> ids;
  for (int k = 0; k < n; ++k)
    if (sym[k].alive) ids.push_back(sym[k].id);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mu);
  if (cache.size() > 200000) cache.clear();
  cache.emplace(word, std::move(ids));
}

void HfTokenizer::Impl::encode_section(std::string text, bool at_origin, std::vector<uint32_t>& out) const {
  if (normalizer) normalizer->apply(text);
  std::vector<Piece> pieces{{std::move(text), at_origin}};
  if (pre_tokenizer) pre_tokenizer->apply(pieces);
  for (const Piece& p : pieces)
    if (!p.text.empty()) bpe(p.text, out);
}

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;
HfTokenizer::~HfTokenizer() = default;

HfTokenizer HfTokenizer::load(const std::string& path_in) {
  namespace fs = std::filesystem;
  std::string path = path_in;
  std::error_code ec;
  if (fs::is_directory(path, ec)) path = (fs::path(path) / "tokenizer.json").string();
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot read the tokenizer (a tokenizer.json file or a folder holding one)");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    throw InputError(path + ": not JSON: " + e.what());
  }
  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  t.path = path;
  try {
    const json& m = j.at("model");
    const std::string type = m.value("type", "BPE");
    if (type != "BPE")
      throw InputError(path + ": model type '" + type + "' is not supported (BPE is: byte-level and SentencePiece style)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(key) && !m[key].is_null() && m[key] != "")
        throw InputError(path + ": model." + key + " is not supported");
    if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0)
      throw InputError(path + ": model.dropout > 0 (BPE dropout) is not supported for encoding");
    for (auto& [tok, id] : m.at("vocab").items()) {
      const uint32_t i = id.get<uint32_t>();
      t.vocab.emplace(tok, i);
      if (t.id_to_token.size() <= i) t.id_to_token.resize(i + 1);
      t.id_to_token[i] = tok;
    }
    t.fuse_unk = m.value("fuse_unk", false);
    t.byte_fallback = m.value("byte_fallback", false);
    t.ignore_merges = m.value("ignore_merges", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      auto it = t.vocab.find(m["unk_token"].get<std::string>());
      if (it != t.vocab.end()) t.unk = it->second;
    }
    char name[8];
    for (int b = 0; b < 256; ++b) {
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      if (auto it = t.vocab.find(name); it != t.vocab.end()) t.byte_ids[static_cast<size_t>(b)] = it->second;
    }
    uint32_t rank = 0;
    for (const json& mg : m.at("merges")) {
      std::string a, b;
      if (mg.is_string()) {
        const std::string s = mg.get<std::string>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) throw InputError(path + ": merge '" + s + "' is not two tokens");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2) {
        a = mg[0].get<std::string>();
        b = mg[1].get<std::string>();
      } else {
        throw InputError(path + ": merges[" + std::to_string(rank) + "] is neither \"a b\" nor [a, b]");
      }
      auto ia = t.vocab.find(a), ib = t.vocab.find(b), ic = t.vocab.find(a + b);
      if (ia == t.vocab.end() || ib == t.vocab.end() || ic == t.vocab.end())
        throw InputError(path + ": merges[" + std::to_string(rank) + "] ('" + a + "' '" + b +
                         "') names a token missing from the vocabulary");
      t.merges.emplace((static_cast<uint64_t>(ia->second) << 32) | ib->second, std::make_pair(rank, ic->second));
      ++rank;
    }
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
      for (const json& a : j["added_tokens"]) {
        AddedToken at;
        at.content = a.at("content").get<std::string>();
        at.id = a.at("id").get<uint32_t>();
        at.special = a.value("special", false);
        at.lstrip = a.value("lstrip", false);
        at.rstrip = a.value("rstrip", false);
        at.single_word = a.value("single_word", false);
        if (at.content.empty()) continue;
        if (t.id_to_token.size() <= at.id) t.id_to_token.resize(at.id + 1);
        t.id_to_token[at.id] = at.content;
        t.added.push_back(at);
      }
    std::stable_sort(t.added.begin(), t.added.end(),
                     [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
    for (const AddedToken& a : t.added) t.added_by_byte[static_cast<unsigned char>(a.content[0])].push_back(&a);
    t.special.assign(t.id_to_token.size(), false);
    for (const AddedToken& a : t.added) t.special[a.id] = a.special;
    if (j.contains("normalizer") && !j["normalizer"].is_null()) t.normalizer = parse_normalizer(j["normalizer"], path);
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null())
      t.pre_tokenizer = parse_pre_tokenizer(j["pre_tokenizer"], path);
    if (j.contains("decoder") && !j["decoder"].is_null()) t.decoder = parse_decoder(j["decoder"], path);
    // Post-processor: a TemplateProcessing's single template (possibly inside a Sequence).
    std::function<void(const json&)> post = [&](const json& p) {
      const std::string type = p.value("type", "");
      if (type == "Sequence") {
        for (const json& c : p.at("processors")) post(c);
      } else if (type == "TemplateProcessing") {
        bool seen_a = false;
        for (const json& item : p.at("single")) {
          if (item.contains("Sequence")) {
            seen_a = true;
            continue;
          }
          const std::string tok = item.at("SpecialToken").at("id").get<std::string>();
          const json& ids = p.at("special_tokens").at(tok).at("ids");
          for (const json& id : ids) (seen_a ? t.suffix_ids : t.prefix_ids).push_back(id.get<uint32_t>());
        }
      } else if (type != "ByteLevel") {
        throw InputError(path + ": post_processor type '" + type +
                         "' is not supported (TemplateProcessing, ByteLevel and Sequence are)");
      }
    };
    if (j.contains("post_processor") && !j["post_processor"].is_null()) post(j["post_processor"]);
  } catch (const json::exception& e) {
    throw InputError(path + ": " + e.what());
  }
  // bos / eos from tokenizer_config.json (a string, or {"content": ...}).
  const fs::path cfg_path = fs::path(path).parent_path() / "tokenizer_config.json";
  if (std::ifstream cf(cfg_path); cf) {
    json c = json::parse(cf, nullptr, /*allow_exceptions=*/false);
    if (c.is_discarded()) throw InputError(cfg_path.string() + ": not JSON");
    auto named = [&](const char* key) -> std::optional<uint32_t> {
      if (!c.contains(key)) return std::nullopt;
      const json& v = c[key];
      std::string name;
      if (v.is_string()) name = v.get<std::string>();
      else if (v.is_object() && v.contains("content") && v["content"].is_string()) name = v["content"].get<std::string>();
      else return std::nullopt;
      for (const AddedToken& a : t.added)
        if (a.content == name) return a.id;
      if (auto it = t.vocab.find(name); it != t.vocab.end()) return it->second;
      return std::nullopt;
    };
    t.bos = named("bos_token");
    t.eos = named("eos_token");
  }
  return HfTokenizer(std::move(impl));
}

std::vector<uint32_t> HfTokenizer::encode(std::string_view raw, bool add_special_tokens) const {
  const Impl& t = *impl_;
  const std::string text = utf8_replace_invalid(raw);
  std::vector<uint32_t> out;
  if (add_special_tokens) out.insert(out.end(), t.prefix_ids.begin(), t.prefix_ids.end());
  // Added tokens first: leftmost match, longest at that position; the text between them goes
  // through the normalizer, the pre-tokenizer and the model.
  size_t at = 0, section = 0;
  while (at < text.size()) {
    const AddedToken* hit = nullptr;
    for (const AddedToken* a : t.added_by_byte[static_cast<unsigned char>(text[at])]) {
      if (text.compare(at, a->content.size(), a->content) != 0) continue;
      if (a->single_word) {
        size_t k = at;
        while (k > 0 && (static_cast<unsigned char>(text[--k]) & 0xC0) == 0x80) {
        }
        const bool left_ok = at == 0 || !is_word_char(utf8_decode_at(text, k));
        const size_t e = at + a->content.size();
        const bool right_ok = e >= text.size() || !is_word_char(utf8_decode_at(text, e));
        if (!left_ok || !right_ok) continue;
      }
      hit = a;
      break;
    }
    if (!hit) {
      ++at;  // (a token starts on a character boundary: continuation bytes start none)
      continue;
    }
    size_t b = at, e = at + hit->content.size();
    if (hit->lstrip)
      while (b > section && std::isspace(static_cast<unsigned char>(text[b - 1]))) --b;
    if (hit->rstrip)
      while (e < text.size() && std::isspace(static_cast<unsigned char>(text[e]))) ++e;
    if (b > section) t.encode_section(text.substr(section, b - section), section == 0, out);
    out.push_back(hit->id);
    section = at = e;
  }
  if (section < text.size()) t.encode_section(text.substr(section), section == 0, out);
  if (add_special_tokens) out.insert(out.end(), t.suffix_ids.begin(), t.suffix_ids.end());
  return out;
}

std::string HfTokenizer::decode(std::span<const uint32_t> ids, bool skip_special) const {
  const Impl& t = *impl_;
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (uint32_t id : ids) {
    if (id >= t.id_to_token.size() || t.id_to_token[id].empty())
      throw InputError(t.path + ": decode: id " + std::to_string(id) + " is not in the vocabulary");
    if (skip_special && t.special[id]) continue;
    toks.push_back(t.id_to_token[id]);
  }
  if (!t.decoder) {
    std::string s;
    for (size_t i = 0; i < toks.size(); ++i) s += (i ? " " : "") + toks[i];
    return s;
  }
  t.decoder->apply(toks);
  std::string s;
  for (const std::string& x : toks) s += x;
  return s;
}

uint32_t HfTokenizer::vocab_size() const { return static_cast<uint32_t>(impl_->id_to_token.size()); }

std::optional<uint32_t> HfTokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->vocab.find(std::string(token));
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::string HfTokenizer::id_to_token(uint32_t id) const {
  return id < impl_->id_to_token.size() ? impl_->id_to_token[id] : std::string();
}

bool HfTokenizer::is_special(uint32_t id) const { return id < impl_->special.size() && impl_->special[id]; }

const std::string& HfTokenizer::path() const { return impl_->path; }
std::optional<uint32_t> HfTokenizer::bos_id() const { return impl_->bos; }
std::optional<uint32_t> HfTokenizer::eos_id() const { return impl_->eos; }

}  // namespace qshard
