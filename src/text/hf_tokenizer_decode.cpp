// hf_tokenizer_decode.cpp: the native tokenizer's decoders, which turn the tokens of decode() into
// text: Sequence, ByteLevel (GPT-2's byte map back to bytes), Metaspace, Replace, ByteFallback
// ("<0xAB>" tokens to bytes), Fuse and Strip. Contract: hf_tokenizer_pipeline.h.
#include <cctype>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/error.h"
#include "text/hf_tokenizer.h"
#include "text/hf_tokenizer_pipeline.h"

namespace qshard::hf_tok {

void Decoder::apply(std::vector<std::string>& t) const {
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

Decoder parse_decoder(const JsonField& j, const std::string& where, int depth) {
  Decoder d;
  check_sequence_depth(depth, where, "decoder");
  const std::string type = component_type(j);
  const std::string w = where + " decoder " + type;
  if (type == "Sequence") {
    for (const JsonField& c : j.at("decoders", "an array").elements())
      d.children.push_back(parse_decoder(c, where, depth + 1));
  } else if (type == "ByteLevel") {
    d.kind = Decoder::kByteLevel;
  } else if (type == "Metaspace") {
    d.kind = Decoder::kMetaspace;
    d.replacement = metaspace_replacement(j);
    d.prepend_scheme = prepend_scheme_of(j);
  } else if (type == "Replace") {
    d.kind = Decoder::kReplace;
    d.re = std::make_shared<Regex>(pattern_of(j.at("pattern", "a pattern")), w);
    d.content = j.at("content", "a string").string();
  } else if (type == "ByteFallback") {
    d.kind = Decoder::kByteFallback;
  } else if (type == "Fuse") {
    d.kind = Decoder::kFuse;
  } else if (type == "Strip") {
    d.kind = Decoder::kStrip;
    d.content = j.at("content", "a string").string();
    d.start = static_cast<size_t>(j.integer_or("start", 0, 0));
    d.stop = static_cast<size_t>(j.integer_or("stop", 0, 0));
  } else {
    throw InputError(where + ": decoder type '" + type +
                     "' is not supported (Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip are)");
  }
  return d;
}

}  // namespace qshard::hf_tok
