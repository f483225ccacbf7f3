// hf_tokenizer_utf8.cpp: UTF-8 for the native tokenizer: Python's bytes.decode("utf-8",
// errors="replace") (utf8_replace_invalid, hf_tokenizer.h) and GPT-2's byte <-> character map
// (hf_tokenizer_pipeline.h) that ByteLevel pre-tokenizers and decoders use.
#include <string>
#include <string_view>

#include "text/hf_tokenizer.h"
#include "text/hf_tokenizer_pipeline.h"

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

namespace hf_tok {
namespace {

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

}  // namespace

ByteMap::ByteMap() {
  int k = 0;
  for (int b = 0; b < 256; ++b) {
    const bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const char32_t c = self ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + k++);
    append_utf8(to_char[static_cast<size_t>(b)], c);
    to_byte[c] = static_cast<uint8_t>(b);
  }
}

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace hf_tok
}  // namespace qshard
