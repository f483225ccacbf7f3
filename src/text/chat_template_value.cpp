// chat_template_value.cpp: Python's value semantics for the chat-template renderer: UTF-8 strings
// seen as code points, whitespace and case mapping as str does them, str() and repr() (float repr as
// Python's shortest round-trip form: 1.0, 1e+16, 1e-05), json.dumps, truthiness, hashing rules,
// ==/</in, and arithmetic (int vs float, floor division and modulo rounding toward -inf, Markup's
// escaping `+`). Attribute/item access and methods: chat_template_methods.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

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

[[noreturn]] void fail_undefined(Evaluator& ev, const Value& v) {
  ev.fail(v.s ? *v.s : std::string("an undefined value was used"));
}

// Python slice index normalization (PySlice_AdjustIndices); false when an index is not an int.
bool slice_indices(const Value& start, const Value& stop, const Value& step, int64_t len, int64_t& b, int64_t& e, int64_t& st,
                   Evaluator& ev) {
  auto as_int = [](const Value& v, int64_t& out) {
    if (v.is(Kind::kInt)) out = v.i;
    else if (v.is(Kind::kBool)) out = v.b;
    else return v.is(Kind::kNone);
    return true;
  };
  st = 1;
  if (!step.is(Kind::kNone) && !as_int(step, st)) return false;
  if (st == 0) ev.fail("slice step cannot be zero");
  auto adjust = [&](const Value& v, int64_t dflt, int64_t& out) {
    if (v.is(Kind::kNone)) {
      out = dflt;
      return true;
    }
    if (!as_int(v, out)) return false;
    if (out < 0) {
      out += len;
      if (out < 0) out = st < 0 ? -1 : 0;
    } else if (out >= len) {
      out = st < 0 ? len - 1 : len;
    }
    return true;
  };
  return adjust(start, st < 0 ? len - 1 : 0, b) && adjust(stop, st < 0 ? -1 : len, e);
}

namespace {

// Python's repr() treats these as not printable (escapes them); unassigned code points are not listed.
bool py_unprintable(uint32_t c) {
  return c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD || (c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD ||
         c == 0x70F || c == 0x180E || c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
         (c >= 0x205F && c <= 0x206F) || c == 0x3000 || (c >= 0xD800 && c <= 0xF8FF) || c == 0xFEFF ||
         (c >= 0xFFF9 && c <= 0xFFFB) || c == 0xFFFE || c == 0xFFFF || c == 0x110BD || c == 0x110CD ||
         (c >= 0x1BCA0 && c <= 0x1BCA3) || (c >= 0x1D173 && c <= 0x1D17A) || c == 0xE0001 || (c >= 0xE0020 && c <= 0xE007F) ||
         (c >= 0xF0000 && c < 0x110000) || c >= 0x110000;
}

std::string py_str_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  size_t pos = 0;
  uint32_t c = 0;
  while (utf8_next(s, pos, c)) {
    if (c == static_cast<uint32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c >= 0x110000) {
      out += fmt::format("\\x{:02x}", c - 0x110000);
    } else if (py_unprintable(c)) {
      out += c < 0x100 ? fmt::format("\\x{:02x}", c) : c < 0x10000 ? fmt::format("\\u{:04x}", c) : fmt::format("\\U{:08x}", c);
    } else {
      utf8_append(out, c);
    }
  }
  out += q;
  return out;
}

// float.__repr__: the shortest digits that round-trip; fixed notation for 1e-4 <= |x| < 1e16.
std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);
  const bool neg = sci[0] == '-';
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t k = neg ? 1 : 0; k < e; ++k) {
    if (sci[k] != '.') digits += sci[k];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = std::stoi(sci.substr(e + 1)) + 1;  // value = 0.DIGITS * 10^decpt
  std::string out = neg ? "-" : "";
  const int nd = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    else if (decpt >= nd) out += digits + std::string(static_cast<size_t>(decpt - nd), '0') + ".0";
    else out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
  } else {
    out += digits.substr(0, 1);
    if (nd > 1) out += "." + digits.substr(1);
    const int x = decpt - 1;
    out += fmt::format("e{}{:02d}", x < 0 ? '-' : '+', std::abs(x));
  }
  return out;
}

bool less_than(Evaluator& ev, const Value& a, const Value& b, const char* op);

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  size_t pos = 0;
  uint32_t c = 0;
  while (utf8_next(s, pos, c)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else if (ensure_ascii && c >= 0x80) {
          if (c >= 0x110000) c = 0xFFFD;
          if (c >= 0x10000) {
            const uint32_t v = c - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", c);
          }
        } else {
          utf8_append(out, c);
        }
    }
  }
  out += '"';
}

struct JsonStyle {
  bool ensure_ascii = false;
  bool indented = false;
  std::string indent;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};

void json_value(Evaluator& ev, const Value& v, const JsonStyle& st, int level, std::string& out) {
  if (level > 500) ev.fail("tojson: value nested too deeply");
  auto newline = [&](int lv) {
    out += '\n';
    for (int k = 0; k < lv; ++k) out += st.indent;
  };
  switch (v.kind) {
    case Kind::kNone: out += "null"; return;
    case Kind::kBool: out += v.b ? "true" : "false"; return;
    case Kind::kInt: out += std::to_string(v.i); return;
    case Kind::kFloat:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += py_float_repr(v.f);
      return;
    case Kind::kString: json_string(v.str(), st.ensure_ascii, out); return;
    case Kind::kList: {
      if (v.view != View::kPlain) ev.fail("tojson: Object of type " + type_name(v) + " is not JSON serializable");
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.items().size(); ++k) {
        if (k) out += st.item_sep;
        if (st.indented) newline(level + 1);
        json_value(ev, v.items()[k], st, level + 1, out);
      }
      if (st.indented) newline(level);
      out += ']';
      return;
    }
    case Kind::kDict: {
      if (v.dict->entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& kv : v.dict->entries) entries.push_back(&kv);
      if (st.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [&](auto* a, auto* b) { return less_than(ev, a->first, b->first, "<"); });
      }
      out += '{';
      for (size_t k = 0; k < entries.size(); ++k) {
        if (k) out += st.item_sep;
        if (st.indented) newline(level + 1);
        const Value& key = entries[k]->first;
        if (key.is(Kind::kString)) json_string(key.str(), st.ensure_ascii, out);
        else if (key.is(Kind::kInt) || key.is(Kind::kFloat) || key.is(Kind::kBool) || key.is(Kind::kNone)) {
          out += '"';
          json_value(ev, key, st, level, out);
          out += '"';
        }
        else ev.fail("tojson: keys must be str, int, float, bool or None, not " + type_name(key));
        out += st.key_sep;
        json_value(ev, entries[k]->second, st, level + 1, out);
      }
      if (st.indented) newline(level);
      out += '}';
      return;
    }
    default:
      ev.fail("tojson: Object of type " + type_name(v) + " is not JSON serializable");
  }
}


// ---------------------------------------------------------------- numbers

struct Num {
  bool is_float;
  int64_t i;
  double f;
  double as_double() const { return is_float ? f : static_cast<double>(i); }
};
bool num_of(const Value& v, Num& n) {
  if (v.is(Kind::kBool)) n = {false, v.b ? 1 : 0, 0.0};
  else if (v.is(Kind::kInt)) n = {false, v.i, 0.0};
  else if (v.is(Kind::kFloat)) n = {true, 0, v.f};
  else return false;
  return true;
}

// Python's float divmod (Objects/floatobject.c semantics): floor quotient and a remainder with the divisor's sign.
void float_divmod(double vx, double wx, double& floordiv, double& mod) {
  mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
}

Value repeat(Evaluator& ev, const Value& seq, int64_t times) {
  if (times <= 0 && seq.is(Kind::kString)) {
    Value r = Value::string("");
    r.markup = seq.markup;
    return r;
  }
  if (times <= 0) return Value::make_list({}, seq.tuple);
  const size_t unit = seq.is(Kind::kString) ? seq.str().size() : seq.items().size();
  if (unit != 0 && static_cast<uint64_t>(times) > (uint64_t{1} << 28) / unit) ev.fail("sequence repetition result too large");
  if (seq.is(Kind::kString)) {
    std::string out;
    for (int64_t k = 0; k < times; ++k) out += seq.str();
    Value r = Value::string(std::move(out));
    r.markup = seq.markup;
    return r;
  }
  ValueList out;
  for (int64_t k = 0; k < times; ++k) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::make_list(std::move(out), seq.tuple);
}

const char* op_symbol(BinOp op) {
  switch (op) {
    case BinOp::kAdd: return "+";
    case BinOp::kSub: return "-";
    case BinOp::kMul: return "*";
    case BinOp::kDiv: return "/";
    case BinOp::kFloorDiv: return "//";
    case BinOp::kMod: return "%";
    case BinOp::kPow: return "**";
  }
  return "?";
}

bool less_than(Evaluator& ev, const Value& a, const Value& b, const char* op) {
  Num x, y;
  if (num_of(a, x) && num_of(b, y)) {
    if (!x.is_float && !y.is_float) return x.i < y.i;
    return x.as_double() < y.as_double();
  }
  if (a.is(Kind::kString) && b.is(Kind::kString)) return a.str() < b.str();  // UTF-8 byte order = code point order
  if (a.is(Kind::kList) && b.is(Kind::kList) && a.tuple == b.tuple && a.view == View::kPlain && b.view == View::kPlain) {
    const auto& p = a.items();
    const auto& q = b.items();
    for (size_t k = 0; k < p.size() && k < q.size(); ++k) {
      if (!equal(p[k], q[k])) return less_than(ev, p[k], q[k], op);
    }
    return p.size() < q.size();
  }
  if (a.is(Kind::kUndefined)) fail_undefined(ev, a);
  if (b.is(Kind::kUndefined)) fail_undefined(ev, b);
  ev.fail(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, type_name(a), type_name(b)));
}

bool contains(Evaluator& ev, const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::kString:
      if (!item.is(Kind::kString)) ev.fail("'in <string>' requires string as left operand, not " + type_name(item));
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kList:
      for (const auto& x : container.items()) {
        if (equal(x, item)) return true;
      }
      return false;
    case Kind::kDict:
      if (!hashable(item)) ev.fail("unhashable type: '" + type_name(item) + "'");
      return container.dict->find(item) != nullptr;
    case Kind::kUndefined:
      return false;  // iter(Undefined) is empty
    default:
      ev.fail("argument of type '" + type_name(container) + "' is not iterable");
  }
}

}  // namespace

// ---------------------------------------------------------------- values

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList:
      switch (v.view) {
        case View::kGenerator: return "generator";
        case View::kDictItems: return "dict_items";
        case View::kDictKeys: return "dict_keys";
        case View::kDictValues: return "dict_values";
        default: return v.tuple ? "tuple" : "list";
      }
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return v.b;
    case Kind::kInt: return v.i != 0;
    case Kind::kFloat: return v.f != 0.0;
    case Kind::kString: return !v.str().empty();
    case Kind::kList: return v.view == View::kGenerator || !v.items().empty();
    case Kind::kDict: return !v.dict->entries.empty();
    default: return true;
  }
}

bool hashable(const Value& v) {
  if (v.is(Kind::kDict) || (v.is(Kind::kList) && v.view != View::kGenerator && !v.tuple)) return false;
  if (v.is(Kind::kList) && v.tuple) {
    for (const auto& x : v.items()) {
      if (!hashable(x)) return false;
    }
  }
  return true;
}

bool equal(const Value& a, const Value& b) {
  Num x, y;
  if (num_of(a, x) && num_of(b, y)) {
    if (!x.is_float && !y.is_float) return x.i == y.i;
    return x.as_double() == y.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.str() == b.str();
    case Kind::kList: {
      if (a.view != View::kPlain || b.view != View::kPlain) return a.list == b.list;
      if (a.tuple != b.tuple || a.items().size() != b.items().size()) return false;
      for (size_t k = 0; k < a.items().size(); ++k) {
        if (!equal(a.items()[k], b.items()[k])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (a.dict->entries.size() != b.dict->entries.size()) return false;
      for (const auto& [k, v] : a.dict->entries) {
        const Value* w = b.dict->find(k);
        if (w == nullptr || !equal(v, *w)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return a.ns == b.ns;
    case Kind::kCallable: return a.fn == b.fn;
    default: return false;
  }
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kString: return v.markup ? "Markup(" + py_str_repr(v.str()) + ")" : py_str_repr(v.str());
    case Kind::kList: {
      if (v.view == View::kGenerator) return "<generator object>";
      if (v.view != View::kPlain) return type_name(v) + "(" + repr(Value::make_list(v.items())) + ")";
      std::string out(1, v.tuple ? '(' : '[');
      for (size_t k = 0; k < v.items().size(); ++k) {
        if (k) out += ", ";
        out += repr(v.items()[k]);
      }
      if (v.tuple && v.items().size() == 1) out += ',';
      out += v.tuple ? ')' : ']';
      return out;
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t k = 0; k < v.dict->entries.size(); ++k) {
        if (k) out += ", ";
        out += repr(v.dict->entries[k].first) + ": " + repr(v.dict->entries[k].second);
      }
      return out + "}";
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return v.b ? "True" : "False";
    case Kind::kInt: return std::to_string(v.i);
    case Kind::kFloat: return py_float_repr(v.f);
    case Kind::kString: return v.str();
    case Kind::kNamespace: return "<Namespace " + repr(Value::make_dict(v.ns->attrs)) + ">";
    case Kind::kCallable: return "<function " + v.fn->name + ">";
    default: return repr(v);
  }
}

std::string json_dumps(Evaluator& ev, const Value& v, bool ensure_ascii, const Value& indent, const Value& separators, bool sort_keys) {
  JsonStyle st;
  st.ensure_ascii = ensure_ascii;
  st.sort_keys = sort_keys;
  if (!indent.is(Kind::kNone) && !indent.is(Kind::kUndefined)) {
    st.indented = true;
    if (indent.is(Kind::kString)) st.indent = indent.str();
    else if (indent.is(Kind::kInt) || indent.is(Kind::kBool)) st.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(indent.is(Kind::kInt) ? indent.i : indent.b, 0, 1 << 16)), ' ');
    else ev.fail("tojson: indent must be an int or a str, not " + type_name(indent));
    st.item_sep = ",";
  }
  if (!separators.is(Kind::kNone) && !separators.is(Kind::kUndefined)) {
    if (!separators.is(Kind::kList) || separators.items().size() != 2 || !separators.items()[0].is(Kind::kString) ||
        !separators.items()[1].is(Kind::kString)) {
      ev.fail("tojson: separators must be a pair of strings");
    }
    st.item_sep = separators.items()[0].str();
    st.key_sep = separators.items()[1].str();
  }
  std::string out;
  json_value(ev, v, st, 0, out);
  return out;
}

Value binary(Evaluator& ev, BinOp op, const Value& a, const Value& b) {
  if (a.is(Kind::kUndefined)) fail_undefined(ev, a);
  if (b.is(Kind::kUndefined)) fail_undefined(ev, b);
  Num x, y;
  if (num_of(a, x) && num_of(b, y)) {
    const bool ints = !x.is_float && !y.is_float;
    int64_t r = 0;
    switch (op) {
      case BinOp::kAdd:
        if (!ints) return Value::real(x.as_double() + y.as_double());
        if (__builtin_add_overflow(x.i, y.i, &r)) ev.fail("integer overflow");
        return Value::integer(r);
      case BinOp::kSub:
        if (!ints) return Value::real(x.as_double() - y.as_double());
        if (__builtin_sub_overflow(x.i, y.i, &r)) ev.fail("integer overflow");
        return Value::integer(r);
      case BinOp::kMul:
        if (!ints) return Value::real(x.as_double() * y.as_double());
        if (__builtin_mul_overflow(x.i, y.i, &r)) ev.fail("integer overflow");
        return Value::integer(r);
      case BinOp::kDiv:
        if (y.as_double() == 0.0) ev.fail("division by zero");
        return Value::real(x.as_double() / y.as_double());
      case BinOp::kFloorDiv:
      case BinOp::kMod: {
        if (ints) {
          if (y.i == 0) ev.fail("integer division or modulo by zero");
          if (x.i == INT64_MIN && y.i == -1) ev.fail("integer overflow");
          int64_t q = x.i / y.i;
          int64_t m = x.i % y.i;
          if (m != 0 && ((m < 0) != (y.i < 0))) --q, m += y.i;
          return Value::integer(op == BinOp::kFloorDiv ? q : m);
        }
        if (y.as_double() == 0.0) ev.fail("float division by zero");
        double q = 0, m = 0;
        float_divmod(x.as_double(), y.as_double(), q, m);
        return Value::real(op == BinOp::kFloorDiv ? q : m);
      }
      case BinOp::kPow: {
        if (ints && y.i >= 0) {
          int64_t result = 1, base = x.i, e = y.i;
          while (e > 0) {
            if ((e & 1) && __builtin_mul_overflow(result, base, &result)) ev.fail("integer overflow");
            e >>= 1;
            if (e > 0 && __builtin_mul_overflow(base, base, &base)) ev.fail("integer overflow");
          }
          return Value::integer(result);
        }
        if (x.as_double() == 0.0 && y.as_double() < 0) ev.fail("0.0 cannot be raised to a negative power");
        return Value::real(std::pow(x.as_double(), y.as_double()));
      }
    }
  }
  if (op == BinOp::kAdd) {
    if (a.is(Kind::kString) && b.is(Kind::kString)) {
      if (a.markup || b.markup) {  // Markup + str escapes the str (and str + Markup)
        return Value::markup_string((a.markup ? a.str() : html_escape(a.str())) + (b.markup ? b.str() : html_escape(b.str())));
      }
      return Value::string(a.str() + b.str());
    }
    if (a.is(Kind::kList) && b.is(Kind::kList) && a.tuple == b.tuple && a.view == View::kPlain && b.view == View::kPlain) {
      ValueList out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return Value::make_list(std::move(out), a.tuple);
    }
    if (a.is(Kind::kString)) ev.fail("can only concatenate str (not \"" + type_name(b) + "\") to str");
  }
  if (op == BinOp::kMul) {
    auto seq = [](const Value& v) { return v.is(Kind::kString) || (v.is(Kind::kList) && v.view == View::kPlain); };
    if (seq(a) && num_of(b, y) && !y.is_float) return repeat(ev, a, y.i);
    if (seq(b) && num_of(a, x) && !x.is_float) return repeat(ev, b, x.i);
  }
  if (op == BinOp::kMod && a.is(Kind::kString)) ev.fail("printf-style string formatting (str % ...) is not supported");
  ev.fail(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op_symbol(op), type_name(a), type_name(b)));
}

bool compare(Evaluator& ev, CmpOp op, const Value& a, const Value& b) {
  switch (op) {
    case CmpOp::kEq: return equal(a, b);
    case CmpOp::kNe: return !equal(a, b);
    case CmpOp::kLt: return less_than(ev, a, b, "<");
    case CmpOp::kGt: return less_than(ev, b, a, ">");
    case CmpOp::kLe: return equal(a, b) ? (less_than(ev, a, b, "<="), true) : less_than(ev, a, b, "<=");
    case CmpOp::kGe: return equal(a, b) ? (less_than(ev, b, a, ">="), true) : less_than(ev, b, a, ">=");
    case CmpOp::kIn: return contains(ev, b, a);
    case CmpOp::kNotIn: return !contains(ev, b, a);
  }
  return false;
}

ValueList iterate(Evaluator& ev, const Value& v) {
  switch (v.kind) {
    case Kind::kList: return v.items();
    case Kind::kUndefined: return {};
    case Kind::kDict: {
      ValueList keys;
      for (const auto& kv : v.dict->entries) keys.push_back(kv.first);
      return keys;
    }
    case Kind::kString: {
      ValueList chars;
      size_t pos = 0, prev = 0;
      uint32_t cp = 0;
      while (utf8_next(v.str(), pos, cp)) {
        chars.push_back(Value::string(v.str().substr(prev, pos - prev)));
        prev = pos;
      }
      return chars;
    }
    default:
      ev.fail("'" + type_name(v) + "' object is not iterable");
  }
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u <= static_cast<uint64_t>(INT64_MAX) ? Value::integer(static_cast<int64_t>(u)) : Value::real(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      for (const auto& x : j) items.push_back(from_json(x));
      return Value::make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.set(it.key(), from_json(it.value()));
      return Value::make_dict(std::move(d));
    }
    default: return Value::none();
  }
}

}  // namespace qshard::jinja
