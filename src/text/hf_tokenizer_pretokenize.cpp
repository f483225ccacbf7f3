// hf_tokenizer_pretokenize.cpp: the native tokenizer's text stages before the BPE model: splitting
// a piece on a pattern's matches (the tokenizers library's NormalizedString::split), the
// normalizers (Sequence, Prepend, Replace, Strip, and NFC / NFD / NFKC / NFKD through
// hf_tokenizer_unicode.cpp) and the pre-tokenizers (Sequence, ByteLevel,
// Split, Digits, Metaspace, Whitespace, WhitespaceSplit). Contract: hf_tokenizer_pipeline.h.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/error.h"
#include "text/hf_tokenizer_pipeline.h"

namespace qshard::hf_tok {
namespace {

// ---- pieces and splitting --------------------------------------------------------------------------

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

constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

}  // namespace

// ---- normalizers and pre-tokenizers ----------------------------------------------------------

void Normalizer::apply(std::string& s, size_t max_bytes) const {
  const size_t given = s.size();
  switch (kind) {
    case kSequence:
      for (const Normalizer& n : children) n.apply(s, max_bytes);
      break;
    case kPrepend:
      if (!s.empty()) s = text + s;
      break;
    case kReplace:
      s = regex_replace(s, *re, content, max_bytes);
      break;
    case kStrip:
      if (right)
        for (auto [b, e] : trail->find_all(s)) s.erase(b, e - b);
      if (left)
        for (auto [b, e] : re->find_all(s)) s.erase(b, e - b);
      break;
    case kUnicode:
      if constexpr (kHaveUnicodeNormalizers) s = unicode_normalize(s, form);
      break;
  }
  if (s.size() > max_bytes) throw_text_growth(given, max_bytes, kind == kPrepend ? "a Prepend" : "a Unicode normalization");
}

#ifndef QSHARD_WITH_UNICODE_NORMALIZERS
std::string unicode_normalize(std::string_view, NormalForm) {
  throw InputError("Unicode normalization: this build has no utf8proc (libutf8proc-dev, scripts/setup.sh)");
}
std::string unicode_normalizer_version() { return ""; }
#endif

Normalizer parse_normalizer(const JsonField& j, const std::string& where, int depth) {
  Normalizer n;
  check_sequence_depth(depth, where, "normalizer");
  const std::string type = component_type(j);
  const std::string w = where + " normalizer " + type;
  if (type == "Sequence") {
    for (const JsonField& c : j.at("normalizers", "an array").elements())
      n.children.push_back(parse_normalizer(c, where, depth + 1));
  } else if (type == "Prepend") {
    n.kind = Normalizer::kPrepend;
    n.text = j.at("prepend", "a string").string();
  } else if (type == "Replace") {
    n.kind = Normalizer::kReplace;
    n.re = std::make_shared<Regex>(pattern_of(j.at("pattern", "a pattern")), w);
    n.content = j.at("content", "a string").string();
  } else if (type == "Strip") {
    n.kind = Normalizer::kStrip;
    n.left = j.bool_or("strip_left", false);
    n.right = j.bool_or("strip_right", false);
    n.re = std::make_shared<Regex>("^\\s+", w);
    n.trail = std::make_shared<Regex>("\\s+$", w);
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    if (!kHaveUnicodeNormalizers)
      throw InputError(where + ": normalizer type '" + type +
                       "' needs Unicode normalization, and this build has no utf8proc (install libutf8proc-dev: "
                       "scripts/setup.sh, and rebuild)");
    n.kind = Normalizer::kUnicode;
    n.form = type == "NFC"    ? NormalForm::kNfc
             : type == "NFD"  ? NormalForm::kNfd
             : type == "NFKC" ? NormalForm::kNfkc
                              : NormalForm::kNfkd;
  } else {
    throw InputError(where + ": normalizer type '" + type +
                     "' is not supported (Sequence, Prepend, Replace, Strip, NFC, NFD, NFKC and NFKD are)");
  }
  return n;
}

void PreTokenizer::apply(std::vector<Piece>& pieces) const {
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

PreTokenizer parse_pre_tokenizer(const JsonField& j, const std::string& where, int depth) {
  PreTokenizer p;
  check_sequence_depth(depth, where, "pre_tokenizer");
  const std::string type = component_type(j);
  const std::string w = where + " pre_tokenizer " + type;
  if (type == "Sequence") {
    for (const JsonField& c : j.at("pretokenizers", "an array").elements())
      p.children.push_back(parse_pre_tokenizer(c, where, depth + 1));
  } else if (type == "ByteLevel") {
    p.kind = PreTokenizer::kByteLevel;
    p.add_prefix_space = j.bool_or("add_prefix_space", true);
    if (j.bool_or("use_regex", true)) p.re = std::make_shared<Regex>(kGpt2Pattern, w);
  } else if (type == "Split") {
    p.kind = PreTokenizer::kSplit;
    p.re = std::make_shared<Regex>(pattern_of(j.at("pattern", "a pattern")), w);
    p.behavior = behavior_of(j.at("behavior", "a split behavior").string(), w);
    p.invert = j.bool_or("invert", false);
  } else if (type == "Digits") {
    p.kind = PreTokenizer::kSplit;
    const bool individual = j.bool_or("individual_digits", false);
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
    p.replacement = metaspace_replacement(j);
    p.prepend_scheme = prepend_scheme_of(j);
    p.split = j.bool_or("split", true);
    p.re = std::make_shared<Regex>(regex_escape(p.replacement), w);
  } else {
    throw InputError(where + ": pre_tokenizer type '" + type +
                     "' is not supported (Sequence, ByteLevel, Split, Digits, Metaspace, Whitespace and "
                     "WhitespaceSplit are)");
  }
  return p;
}

}  // namespace qshard::hf_tok
