// chat_template_lex.cpp: the lexer of the chat-template renderer (chat_template.h), following
// jinja2 3.1's rules with trim_blocks and lstrip_blocks on: the source's newlines normalized and one
// trailing newline dropped (Program::source); `{%-`/`{{-`/`{#-` strip all whitespace before the
// tag, `-%}`/`-}}`/`-#}` all whitespace after; `%}` and `#}` eat one newline after them
// (trim_blocks), `+%}` keeps it; whitespace between a line start and `{%`/`{#` is removed unless the
// tag starts `{%+` (lstrip_blocks); `}}` and `%}` only close a tag when the brackets inside it are
// balanced; {% raw %} bodies are data. Literals: Python's string escapes, ints (0b/0o/0x, `_`),
// floats.
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstring>

#include "text/chat_template_ast.h"
#include "runtime/error.h"

namespace qshard::jinja {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(const Program& p) : p_(p), s_(p.source), n_(p.source.size()) {}

  std::vector<Token> run() {
    while (pos_ < n_) root_step();
    out_.push_back(Token{Tok::kEof, n_, {}, 0, 0.0});
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& msg) const { throw InputError(p_.where(at) + ": " + msg); }
  bool starts(size_t at, std::string_view t) const { return at <= n_ && s_.compare(at, t.size(), t) == 0; }
  size_t skip_space(size_t at) const {
    while (at < n_) {
      size_t q = at;
      uint32_t cp = 0;
      if (!utf8_next(s_, q, cp) || !py_isspace(cp)) break;
      at = q;
    }
    return at;
  }
  // jinja2's OptionalLStrip: the data before a tag, after `-` or lstrip_blocks.
  std::string_view strip_before(std::string_view text, char sign, bool lstrip_ok) const {
    if (sign == '-') return py_rstrip(text);
    if (sign != '+' && lstrip_ok) {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string_view::npos ? 0 : l_pos + 1;
      if ((l_pos > 0 || line_starting_) && text.size() > l_pos && py_rstrip(text.substr(l_pos)).empty()) {
        return text.substr(0, l_pos);
      }
    }
    return text;
  }
  void emit_data(size_t at, std::string_view text) {
    if (!text.empty()) out_.push_back(Token{Tok::kData, at, std::string(text), 0, 0.0});
  }

  void root_step() {
    size_t k = pos_;
    for (;;) {
      k = s_.find('{', k);
      if (k == std::string::npos || k + 1 >= n_) {
        k = std::string::npos;
        break;
      }
      const char c = s_[k + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++k;
    }
    if (k == std::string::npos) {
      emit_data(pos_, std::string_view(s_).substr(pos_));
      pos_ = n_;
      return;
    }
    const char kind = s_[k + 1];
    size_t after = k + 2;
    char sign = 0;
    if (after < n_ && (s_[after] == '-' || s_[after] == '+')) sign = s_[after++];
    // {% raw %} ... {% endraw %}
    size_t raw_end = 0;
    if (kind == '%') {
      size_t q = skip_space(after);
      if (starts(q, "raw")) {
        q = skip_space(q + 3);
        if (starts(q, "-%}")) raw_end = skip_space(q + 3);
        else if (starts(q, "%}")) raw_end = q + 2;
      }
    }
    const std::string_view text = std::string_view(s_).substr(pos_, k - pos_);
    emit_data(pos_, strip_before(text, sign, kind != '{'));
    if (raw_end != 0) {
      line_starting_ = s_[raw_end - 1] == '\n';
      lex_raw(k, raw_end);
      return;
    }
    line_starting_ = false;
    if (kind == '#') {
      lex_comment(k, after);
      return;
    }
    out_.push_back(Token{kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, k, {}, 0, 0.0});
    pos_ = after;
    lex_tag(kind == '%', k);
  }

  void lex_comment(size_t begin, size_t at) {
    for (size_t j = at; j < n_; ++j) {
      if (starts(j, "+#}")) {
        pos_ = j + 3;
      } else if (starts(j, "-#}")) {
        pos_ = skip_space(j + 3);
      } else if (starts(j, "#}")) {
        pos_ = j + 2;
        if (pos_ < n_ && s_[pos_] == '\n') ++pos_;
      } else {
        continue;
      }
      line_starting_ = s_[pos_ - 1] == '\n';
      return;
    }
    fail(begin, "missing end of comment tag '#}'");
  }

  void lex_raw(size_t begin, size_t at) {
    for (size_t j = s_.find("{%", at); j != std::string::npos; j = s_.find("{%", j + 1)) {
      size_t q = j + 2;
      char sign = 0;
      if (q < n_ && (s_[q] == '-' || s_[q] == '+')) sign = s_[q++];
      q = skip_space(q);
      if (!starts(q, "endraw")) continue;
      q = skip_space(q + 6);
      size_t end = 0;
      if (starts(q, "+%}")) {
        end = q + 3;
      } else if (starts(q, "-%}")) {
        end = skip_space(q + 3);
      } else if (starts(q, "%}")) {
        end = q + 2;
        if (end < n_ && s_[end] == '\n') ++end;
      } else {
        continue;
      }
      emit_data(at, strip_before(std::string_view(s_).substr(at, j - at), sign, true));
      pos_ = end;
      line_starting_ = s_[end - 1] == '\n';
      return;
    }
    fail(begin, "missing end of raw directive ({% endraw %})");
  }

  // Tokens inside {{ }} or {% %} up to the closing tag.
  void lex_tag(bool block, size_t begin) {
    std::string balance;
    for (;;) {
      if (pos_ >= n_) fail(begin, block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'");
      if (balance.empty()) {
        const size_t end_at = pos_;
        bool closed = true;
        if (block && starts(pos_, "+%}")) {
          pos_ += 3;
        } else if (block && starts(pos_, "-%}")) {
          pos_ = skip_space(pos_ + 3);
        } else if (block && starts(pos_, "%}")) {
          pos_ += 2;
          if (pos_ < n_ && s_[pos_] == '\n') ++pos_;
        } else if (!block && starts(pos_, "-}}")) {
          pos_ = skip_space(pos_ + 3);
        } else if (!block && starts(pos_, "}}")) {
          pos_ += 2;
        } else {
          closed = false;
        }
        if (closed) {
          out_.push_back(Token{block ? Tok::kBlockEnd : Tok::kVarEnd, end_at, {}, 0, 0.0});
          line_starting_ = s_[pos_ - 1] == '\n';
          return;
        }
      }
      const size_t q = skip_space(pos_);
      if (q > pos_) {
        pos_ = q;
        continue;
      }
      const char c = s_[pos_];
      if (is_digit(c)) {
        lex_number();
      } else if (is_name_start(c)) {
        size_t e = pos_ + 1;
        while (e < n_ && is_name_char(s_[e])) ++e;
        out_.push_back(Token{Tok::kName, pos_, s_.substr(pos_, e - pos_), 0, 0.0});
        pos_ = e;
      } else if (c == '\'' || c == '"') {
        lex_string();
      } else {
        lex_operator(balance);
      }
    }
  }

  // `(\d+_)*\d+` from `at`: the end, or npos.
  size_t digit_run(size_t at) const {
    if (at >= n_ || !is_digit(s_[at])) return std::string::npos;
    size_t e = at;
    for (;;) {
      while (e < n_ && is_digit(s_[e])) ++e;
      if (e + 1 < n_ && s_[e] == '_' && is_digit(s_[e + 1])) {
        ++e;
        continue;
      }
      return e;
    }
  }

  void lex_number() {
    const size_t start = pos_;
    const size_t npos = std::string::npos;
    size_t end = npos;
    if (start == 0 || s_[start - 1] != '.') {  // float_re: (?<!\.)
      const size_t a = digit_run(start);
      const size_t frac = (a < n_ && s_[a] == '.') ? digit_run(a + 1) : npos;
      for (size_t b : {frac, a}) {  // exponent form, with then without the fraction
        if (b == npos || b >= n_ || (s_[b] != 'e' && s_[b] != 'E')) continue;
        size_t c = b + 1;
        if (c < n_ && (s_[c] == '+' || s_[c] == '-')) ++c;
        const size_t d = digit_run(c);
        if (d != npos) {
          end = d;
          break;
        }
      }
      if (end == npos && frac != npos) end = frac;
    }
    if (end != npos) {
      std::string digits;
      for (size_t k = start; k < end; ++k) {
        if (s_[k] != '_') digits += s_[k];
      }
      double v = 0.0;
      const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
      if (r.ec != std::errc() && r.ec != std::errc::result_out_of_range) fail(start, "bad float literal '" + digits + "'");
      if (r.ec == std::errc::result_out_of_range) v = digits.find("e-") != npos || digits.find("E-") != npos ? 0.0 : HUGE_VAL;
      out_.push_back(Token{Tok::kFloat, start, digits, 0, v});
      pos_ = end;
      return;
    }
    // integer_re: 0b.. 0o.. 0x.. [1-9](_?\d)* 0(_?0)*
    int base = 10;
    size_t k = start;
    std::string digits;
    auto run = [&](auto ok) {
      while (k < n_) {
        if (ok(s_[k])) {
          digits += s_[k++];
        } else if (s_[k] == '_' && k + 1 < n_ && ok(s_[k + 1])) {
          ++k;
        } else {
          break;
        }
      }
    };
    const char p1 = start + 1 < n_ ? static_cast<char>(s_[start + 1] | 0x20) : 0;
    auto after_prefix_ok = [&](auto ok) {
      size_t q = start + 2;
      if (q < n_ && s_[q] == '_') ++q;
      return q < n_ && ok(s_[q]);
    };
    auto bin = [](char c) { return c == '0' || c == '1'; };
    auto oct = [](char c) { return c >= '0' && c <= '7'; };
    auto hex = [](char c) { return hex_value(c) >= 0; };
    if (s_[start] == '0' && p1 == 'b' && after_prefix_ok(bin)) {
      base = 2, k = start + 2, run(bin);
    } else if (s_[start] == '0' && p1 == 'o' && after_prefix_ok(oct)) {
      base = 8, k = start + 2, run(oct);
    } else if (s_[start] == '0' && p1 == 'x' && after_prefix_ok(hex)) {
      base = 16, k = start + 2, run(hex);
    } else if (s_[start] == '0') {
      run([](char c) { return c == '0'; });
    } else {
      run(is_digit);
    }
    int64_t v = 0;
    const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
    if (r.ec != std::errc()) fail(start, "integer literal too large: " + s_.substr(start, k - start));
    out_.push_back(Token{Tok::kInt, start, s_.substr(start, k - start), v, 0.0});
    pos_ = k;
  }

  // A quoted literal with Python's escapes (jinja2 decodes with "unicode-escape").
  void lex_string() {
    const size_t start = pos_;
    const char q = s_[pos_];
    size_t e = pos_ + 1;
    while (e < n_ && s_[e] != q) e += s_[e] == '\\' ? 2 : 1;
    if (e >= n_) fail(start, std::string("unterminated string literal (missing ") + q + ")");
    std::string v;
    for (size_t k = start + 1; k < e; ++k) {
      if (s_[k] != '\\') {
        v += s_[k];
        continue;
      }
      const char c = s_[++k];
      auto hex_escape = [&](int digits) {
        uint32_t cp = 0;
        for (int d = 0; d < digits; ++d) {
          const int h = k + 1 < e ? hex_value(s_[k + 1]) : -1;
          if (h < 0) fail(k - 1, fmt::format("truncated \\{}{} escape in a string literal", c, std::string(digits, 'X')));
          cp = cp * 16 + static_cast<uint32_t>(h);
          ++k;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail(k, "escape is not a valid code point");
        utf8_append(v, cp);
      };
      switch (c) {
        case '\n': break;
        case '\\': v += '\\'; break;
        case '\'': v += '\''; break;
        case '"': v += '"'; break;
        case 'a': v += '\a'; break;
        case 'b': v += '\b'; break;
        case 'f': v += '\f'; break;
        case 'n': v += '\n'; break;
        case 'r': v += '\r'; break;
        case 't': v += '\t'; break;
        case 'v': v += '\v'; break;
        case 'x': hex_escape(2); break;
        case 'u': hex_escape(4); break;
        case 'U': hex_escape(8); break;
        case 'N': fail(k - 1, "\\N{...} escapes are not supported");
        default:
          if (c >= '0' && c <= '7') {
            uint32_t cp = static_cast<uint32_t>(c - '0');
            for (int d = 0; d < 2 && k + 1 < e && s_[k + 1] >= '0' && s_[k + 1] <= '7'; ++d) cp = cp * 8 + static_cast<uint32_t>(s_[++k] - '0');
            utf8_append(v, cp);
          } else if (static_cast<unsigned char>(c) >= 0x80) {
            // Python's backslashreplace turns "\é" into "\\xe9", which decodes to the text \xe9.
            size_t at = k;
            uint32_t cp = 0;
            utf8_next(s_, at, cp);
            v += cp < 0x100 ? fmt::format("\\x{:02x}", cp) : cp < 0x10000 ? fmt::format("\\u{:04x}", cp) : fmt::format("\\U{:08x}", cp);
            k = at - 1;
          } else {
            v += '\\';
            v += c;
          }
      }
    }
    out_.push_back(Token{Tok::kString, start, std::move(v), 0, 0.0});
    pos_ = e + 1;
  }

  void lex_operator(std::string& balance) {
    static const char* const kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    std::string op;
    for (const char* t : kTwo) {
      if (starts(pos_, t)) op = t;
    }
    if (op.empty() && std::strchr("+-/*%~[](){}><=.:|,;", s_[pos_]) != nullptr && s_[pos_] != 0) op = std::string(1, s_[pos_]);
    if (op.empty()) {
      size_t at = pos_;
      uint32_t cp = 0;
      utf8_next(s_, at, cp);
      fail(pos_, "unexpected character '" + s_.substr(pos_, at - pos_) + "'");
    }
    const char c = op[0];
    if (op.size() == 1 && (c == '{' || c == '(' || c == '[')) {
      balance += c == '{' ? '}' : c == '(' ? ')' : ']';
    } else if (op.size() == 1 && (c == '}' || c == ')' || c == ']')) {
      if (balance.empty()) fail(pos_, "unexpected '" + op + "'");
      if (balance.back() != c) fail(pos_, fmt::format("unexpected '{}', expected '{}'", c, balance.back()));
      balance.pop_back();
    }
    out_.push_back(Token{Tok::kOp, pos_, op, 0, 0.0});
    pos_ += op.size();
  }

  const Program& p_;
  const std::string& s_;
  const size_t n_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<Token> out_;
};

}  // namespace

std::string normalize_newlines(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t k = 0; k < src.size(); ++k) {
    if (src[k] == '\r') {
      out += '\n';
      if (k + 1 < src.size() && src[k + 1] == '\n') ++k;
    } else {
      out += src[k];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // jinja2: keep_trailing_newline=False
  return out;
}

std::vector<Token> lex(const Program& program) {
  Lexer lexer(program);
  return lexer.run();
}

}  // namespace qshard::jinja
