// chat_template_strings.cpp: Python's strings for the chat-template renderer: UTF-8 seen as code
// points (an invalid byte b is 0x110000 + b and encodes back to b), str's whitespace and strip,
// markupsafe's escape, and case mapping as str does it (lower, upper, capitalize, title, swapcase).
// Contract: chat_template_ast.h.
#include <algorithm>

#include "text/chat_template_ast.h"

namespace qshard::jinja {

// ---------------------------------------------------------------- UTF-8 and Python strings

bool utf8_next(std::string_view s, size_t& pos, uint32_t& cp) {
  if (pos >= s.size()) return false;
  const auto c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) {
    cp = c;
    ++pos;
    return true;
  }
  int len = 0;
  uint32_t v = 0;
  uint32_t min = 0;
  if ((c & 0xE0) == 0xC0) len = 2, v = c & 0x1F, min = 0x80;
  else if ((c & 0xF0) == 0xE0) len = 3, v = c & 0x0F, min = 0x800;
  else if ((c & 0xF8) == 0xF0) len = 4, v = c & 0x07, min = 0x10000;
  bool ok = len != 0 && pos + len <= s.size();
  for (int k = 1; ok && k < len; ++k) {
    const auto d = static_cast<unsigned char>(s[pos + k]);
    ok = (d & 0xC0) == 0x80;
    v = (v << 6) | (d & 0x3F);
  }
  if (!ok || v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
    cp = 0x110000 + c;
    ++pos;
    return true;
  }
  cp = v;
  pos += len;
  return true;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp >= 0x110000) {
    out += static_cast<char>(cp - 0x110000);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::vector<uint32_t> to_cps(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t pos = 0;
  uint32_t cp = 0;
  while (utf8_next(s, pos, cp)) out.push_back(cp);
  return out;
}

std::string from_cps(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t k = begin; k < end; ++k) utf8_append(out, cps[k]);
  return out;
}

size_t cp_length(std::string_view s) {
  size_t n = 0;
  size_t pos = 0;
  uint32_t cp = 0;
  while (utf8_next(s, pos, cp)) ++n;
  return n;
}

bool py_isspace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string_view py_rstrip(std::string_view s) {
  size_t pos = 0;
  size_t keep = 0;
  uint32_t cp = 0;
  while (utf8_next(s, pos, cp)) {
    if (!py_isspace(cp)) keep = pos;
  }
  return s.substr(0, keep);
}

std::string py_strip(std::string_view s, const Value* chars, bool left, bool right) {
  const std::vector<uint32_t> cps = to_cps(s);
  std::vector<uint32_t> set;
  const bool ws = chars == nullptr || chars->is(Kind::kNone);
  if (!ws) set = to_cps(chars->str());
  auto strip_it = [&](uint32_t cp) { return ws ? py_isspace(cp) : std::find(set.begin(), set.end(), cp) != set.end(); };
  size_t b = 0;
  size_t e = cps.size();
  if (left) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  return from_cps(cps, b, e);
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Case mapping as Python's for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (simple 1:1
// pairs, plus ß -> SS, ŉ -> ʼN, ΐ/ΰ -> 3 code points, İ -> i̇ and the final sigma); other scripts are
// left as they are.
uint32_t py_upper_cp(uint32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z' ? c - 32 : c;
  if (c == 0xB5) return 0x39C;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c == 0x131) return 'I';
  if (c == 0x17F) return 'S';
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return (c & 1) ? c - 1 : c;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c : c - 1;
  if (c >= 0x3B1 && c <= 0x3CB) return c == 0x3C2 ? 0x3A3 : c - 32;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || (c >= 0x4D0 && c <= 0x52F)) return (c & 1) ? c - 1 : c;
  if (c >= 0x4C1 && c <= 0x4CE) return (c & 1) ? c : c - 1;
  if (c == 0x4CF) return 0x4C0;
  return c;
}
uint32_t py_lower_cp(uint32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return (c & 1) ? c : c + 1;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c + 1 : c;
  if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || (c >= 0x4D0 && c <= 0x52F)) return (c & 1) ? c : c + 1;
  if (c >= 0x4C1 && c <= 0x4CE) return (c & 1) ? c + 1 : c;
  if (c == 0x4C0) return 0x4CF;
  return c;
}
bool py_cased_cp(uint32_t c) {
  return py_upper_cp(c) != c || py_lower_cp(c) != c || c == 0xDF || c == 0x149 || c == 0x130 || c == 0x390 || c == 0x3B0;
}

namespace {
void append_upper(std::string& out, uint32_t c, bool title) {
  if (c == 0xDF) out += title ? "Ss" : "SS";
  else if (c == 0x149) out += "\u02bcN";
  else if (c == 0x390) out += "\u0399\u0308\u0301";
  else if (c == 0x3B0) out += "\u03a5\u0308\u0301";
  else utf8_append(out, py_upper_cp(c));
}
// Lowercase of c[k]; a capital sigma after a cased letter and not before one is final (ς).
void append_lower(std::string& out, const std::vector<uint32_t>& c, size_t k) {
  if (c[k] == 0x130) {
    out += "i\u0307";
  } else if (c[k] == 0x3A3 && k > 0 && py_cased_cp(c[k - 1]) && !(k + 1 < c.size() && py_cased_cp(c[k + 1]))) {
    utf8_append(out, 0x3C2);
  } else {
    utf8_append(out, py_lower_cp(c[k]));
  }
}
}  // namespace

std::string py_lower(std::string_view s) {
  const std::vector<uint32_t> c = to_cps(s);
  std::string out;
  for (size_t k = 0; k < c.size(); ++k) append_lower(out, c, k);
  return out;
}
std::string py_upper(std::string_view s) {
  std::string out;
  for (uint32_t c : to_cps(s)) append_upper(out, c, false);
  return out;
}
std::string py_capitalize(std::string_view s) {
  const std::vector<uint32_t> c = to_cps(s);
  std::string out;
  for (size_t k = 0; k < c.size(); ++k) {
    if (k == 0) append_upper(out, c[0], true);
    else append_lower(out, c, k);
  }
  return out;
}
// str.title(): a cased character after a cased one is lowered, after an uncased one title-cased.
std::string py_title(std::string_view s) {
  const std::vector<uint32_t> c = to_cps(s);
  std::string out;
  bool prev_cased = false;
  for (size_t k = 0; k < c.size(); ++k) {
    const bool cased = py_cased_cp(c[k]);
    if (cased && prev_cased) append_lower(out, c, k);
    else if (cased) append_upper(out, c[k], true);
    else utf8_append(out, c[k]);
    prev_cased = cased;
  }
  return out;
}

std::string py_swapcase(std::string_view s) {
  const std::vector<uint32_t> c = to_cps(s);
  std::string out;
  for (size_t k = 0; k < c.size(); ++k) {
    if (py_lower_cp(c[k]) != c[k] || c[k] == 0x130) append_lower(out, c, k);
    else append_upper(out, c[k], false);
  }
  return out;
}

}  // namespace qshard::jinja
