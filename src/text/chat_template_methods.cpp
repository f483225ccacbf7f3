// chat_template_methods.cpp: jinja2's attribute and item lookup for the chat-template renderer
// (obj.x tries the attribute then the item, obj["x"] the item then the attribute; a missing one is
// Undefined, a lookup on Undefined is an error; the sandbox's unsafe attributes, like list.append,
// are Undefined), slicing, the str/dict/list methods templates call (Markup's escaping variants
// included), and Params, the argument binder of every builtin.
#include <fmt/format.h>

#include <algorithm>

#include "text/chat_template_ast.h"

namespace qshard::jinja {
namespace {

bool is_ascii_alpha(uint32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// ---------------------------------------------------------------- methods

bool is_one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

Value method_value(const Value& self, const std::string& name, BuiltinFn fn) {
  auto c = std::make_shared<Callable>();
  c->name = name;
  c->builtin = fn;
  c->self = self;
  Value v;
  v.kind = Kind::kCallable;
  v.fn = std::move(c);
  return v;
}

const std::string& want_str(Evaluator& ev, const Value& v, const std::string& what) {
  if (!v.is(Kind::kString)) ev.fail(what + " must be a str, not " + type_name(v));
  return v.str();
}

// Byte offset of code point `cp_index` in s (clamped to the end).
size_t byte_at(std::string_view s, int64_t cp_index) {
  size_t pos = 0;
  uint32_t cp = 0;
  for (int64_t k = 0; k < cp_index && utf8_next(s, pos, cp); ++k) {
  }
  return pos;
}

// s[start:end] as Python's find/count/startswith see it (start/end optional ints, may be negative).
std::string_view str_window(Evaluator& ev, std::string_view s, const Params& p, size_t i_start, size_t& cp_offset) {
  const int64_t len = static_cast<int64_t>(cp_length(s));
  int64_t b = 0, e = len, st = 1;
  const Value none = Value::none();
  if (!slice_indices(p.get_or(i_start, none), p.get_or(i_start + 1, none), none, len, b, e, st, ev)) {
    ev.fail("slice indices must be integers or None");
  }
  cp_offset = static_cast<size_t>(b);
  if (e <= b) return s.substr(s.size());  // empty
  const size_t bb = byte_at(s, b);
  return s.substr(bb, byte_at(s, e) - bb);
}

Value split_impl(Evaluator& ev, const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  ValueList parts;
  if (sep == nullptr || sep->is(Kind::kNone)) {
    const std::vector<uint32_t> c = to_cps(s);
    const size_t n = c.size();
    if (!from_right) {
      size_t i = 0;
      for (;;) {
        while (i < n && py_isspace(c[i])) ++i;
        if (i == n) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          parts.push_back(Value::string(from_cps(c, i, n)));
          break;
        }
        size_t j = i;
        while (j < n && !py_isspace(c[j])) ++j;
        parts.push_back(Value::string(from_cps(c, i, j)));
        i = j;
      }
    } else {
      size_t i = n;
      for (;;) {
        while (i > 0 && py_isspace(c[i - 1])) --i;
        if (i == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          parts.push_back(Value::string(from_cps(c, 0, i)));
          break;
        }
        size_t j = i;
        while (j > 0 && !py_isspace(c[j - 1])) --j;
        parts.push_back(Value::string(from_cps(c, j, i)));
        i = j;
      }
      std::reverse(parts.begin(), parts.end());
    }
    return Value::make_list(std::move(parts));
  }
  const std::string& d = want_str(ev, *sep, "the separator");
  if (d.empty()) ev.fail("empty separator");
  if (!from_right) {
    size_t i = 0;
    for (;;) {
      const size_t j = s.find(d, i);
      if (j == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
        parts.push_back(Value::string(s.substr(i)));
        break;
      }
      parts.push_back(Value::string(s.substr(i, j - i)));
      i = j + d.size();
    }
  } else {
    size_t end = s.size();
    for (;;) {
      const size_t j = end >= d.size() ? s.rfind(d, end - d.size()) : std::string::npos;
      if (j == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
        parts.push_back(Value::string(s.substr(0, end)));
        break;
      }
      parts.push_back(Value::string(s.substr(j + d.size(), end - j - d.size())));
      end = j;
    }
    std::reverse(parts.begin(), parts.end());
  }
  return Value::make_list(std::move(parts));
}

std::string replace_impl(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  std::string out;
  if (old.empty()) {
    const std::vector<uint32_t> c = to_cps(s);
    int64_t done = 0;
    for (size_t k = 0; k <= c.size(); ++k) {
      if (count < 0 || done < count) out += with, ++done;
      if (k < c.size()) utf8_append(out, c[k]);
      if ((k & 1023) == 0) check_bytes(out.size());
    }
    return out;
  }
  size_t i = 0;
  int64_t done = 0;
  for (;;) {
    const size_t j = (count < 0 || done < count) ? s.find(old, i) : std::string::npos;
    if (j == std::string::npos) {
      out += s.substr(i);
      return out;
    }
    out += s.substr(i, j - i);
    out += with;
    if (with.size() > old.size()) check_bytes(out.size());
    i = j + old.size();
    ++done;
  }
}

bool is_line_break(uint32_t c) { return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 || c == 0x2029; }

Value splitlines_impl(const std::string& s, bool keepends) {
  const std::vector<uint32_t> c = to_cps(s);
  ValueList lines;
  size_t i = 0;
  while (i < c.size()) {
    size_t j = i;
    while (j < c.size() && !is_line_break(c[j])) ++j;
    size_t eol = j;
    if (j < c.size()) eol = (c[j] == '\r' && j + 1 < c.size() && c[j + 1] == '\n') ? j + 2 : j + 1;
    lines.push_back(Value::string(from_cps(c, i, keepends ? eol : j)));
    i = eol;
  }
  return Value::make_list(std::move(lines));
}

// str.format with "{}", "{0}", "{name}", "!r"/"!s" and "{{"/"}}"; format specs are refused.
std::string str_format(Evaluator& ev, const std::string& s, const CallArgs& args) {
  std::string out;
  size_t next_auto = 0;
  for (size_t k = 0; k < s.size(); ++k) {
    const char c = s[k];
    if (c == '}') {
      if (k + 1 < s.size() && s[k + 1] == '}') {
        out += '}';
        ++k;
        continue;
      }
      ev.fail("str.format(): single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (k + 1 < s.size() && s[k + 1] == '{') {
      out += '{';
      ++k;
      continue;
    }
    const size_t close = s.find('}', k);
    if (close == std::string::npos) ev.fail("str.format(): single '{' encountered in format string");
    std::string field = s.substr(k + 1, close - k - 1);
    if (field.find(':') != std::string::npos) ev.fail("str.format(): format specs are not supported: {" + field + "}");
    std::string conv;
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      conv = field.substr(bang + 1);
      field = field.substr(0, bang);
      if (conv != "r" && conv != "s") ev.fail("str.format(): unknown conversion !" + conv);
    }
    const Value* v = nullptr;
    if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      const size_t idx = field.empty() ? next_auto++ : static_cast<size_t>(std::stoul(field));
      if (idx >= args.pos.size()) ev.fail("str.format(): replacement index " + std::to_string(idx) + " out of range");
      v = &args.pos[idx];
    } else {
      for (const auto& [name, x] : args.kw) {
        if (name == field) v = &x;
      }
      if (v == nullptr) ev.fail("str.format(): no argument named '" + field + "'");
    }
    out += conv == "r" ? repr(*v) : to_str(*v);
    k = close;
  }
  return out;
}

Value str_method_impl(Evaluator& ev, const Callable& fn, CallArgs& args);

// Markup's methods return Markup; replace's `new`, the fill characters, join's items and format's
// arguments are escaped first (markupsafe 3).
Value str_method(Evaluator& ev, const Callable& fn, CallArgs& args) {
  if (!fn.self.markup) return str_method_impl(ev, fn, args);
  const std::string& m = fn.name;
  const bool wraps = is_one_of(m, {"capitalize", "title", "lower", "upper", "replace", "ljust", "rjust", "lstrip", "rstrip", "center",
                                   "strip", "swapcase", "zfill", "join", "format", "split", "rsplit", "splitlines", "partition",
                                   "rpartition"});
  if (!wraps) return str_method_impl(ev, fn, args);
  auto escape_arg = [](Value& v) {
    if (v.is(Kind::kString) && !v.markup) v = Value::markup_string(html_escape(v.str()));
  };
  if (m == "format") {
    for (auto& v : args.pos) escape_arg(v);
    for (auto& kv : args.kw) escape_arg(kv.second);
  } else if ((m == "replace" || m == "ljust" || m == "rjust" || m == "center") && args.pos.size() >= 2) {
    escape_arg(args.pos[1]);
  }
  if (m == "join" && !args.pos.empty()) {
    ValueList items = iterate(ev, args.pos[0]);
    for (auto& v : items) escape_arg(v);
    args.pos[0] = Value::make_list(std::move(items));
  }
  Value r = str_method_impl(ev, fn, args);
  if (r.is(Kind::kString)) {
    r.markup = true;
  } else if (r.is(Kind::kList)) {
    ValueList items = r.items();
    for (auto& v : items) v.markup = v.is(Kind::kString);
    r = Value::make_list(std::move(items), r.tuple);
  }
  return r;
}

Value str_method_impl(Evaluator& ev, const Callable& fn, CallArgs& args) {
  const std::string& s = fn.self.str();
  const std::string& m = fn.name;
  const std::string where = "str." + m + "()";
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    Params p(ev, args, where, {"chars"});
    if (p.given(0) && !p.get(0)->is(Kind::kNone)) want_str(ev, *p.get(0), where + " chars");
    return Value::string(py_strip(s, p.get(0), m != "rstrip", m != "lstrip"));
  }
  if (m == "split" || m == "rsplit") {
    Params p(ev, args, where, {"sep", "maxsplit"});
    return split_impl(ev, s, p.get(0), p.get_int(1, -1), m == "rsplit");
  }
  if (m == "splitlines") {
    Params p(ev, args, where, {"keepends"});
    return splitlines_impl(s, p.get_bool(0, false));
  }
  if (m == "startswith" || m == "endswith") {
    Params p(ev, args, where, {"prefix", "start", "end"});
    if (!p.given(0)) ev.fail(where + " takes at least 1 argument");
    size_t off = 0;
    const std::string_view w = str_window(ev, s, p, 1, off);
    ValueList options = p.get(0)->is(Kind::kList) && p.get(0)->tuple ? p.get(0)->items() : ValueList{*p.get(0)};
    for (const auto& o : options) {
      const std::string& x = want_str(ev, o, where + " argument");
      if (w.size() >= x.size() && (m == "startswith" ? w.compare(0, x.size(), x) : w.compare(w.size() - x.size(), x.size(), x)) == 0) {
        return Value::boolean(true);
      }
    }
    return Value::boolean(false);
  }
  if (m == "replace") {
    Params p(ev, args, where, {"old", "new", "count"});
    if (!p.given(1)) ev.fail(where + " takes at least 2 arguments");
    return Value::string(replace_impl(s, want_str(ev, *p.get(0), where + " old"), want_str(ev, *p.get(1), where + " new"), p.get_int(2, -1)));
  }
  if (m == "upper" || m == "lower" || m == "title" || m == "capitalize" || m == "swapcase" || m == "casefold") {
    Params p(ev, args, where, {});
    if (m == "upper") return Value::string(py_upper(s));
    if (m == "lower" || m == "casefold") return Value::string(py_lower(s));
    if (m == "title") return Value::string(py_title(s));
    if (m == "capitalize") return Value::string(py_capitalize(s));
    return Value::string(py_swapcase(s));
  }
  if (m == "find" || m == "rfind" || m == "index" || m == "rindex" || m == "count") {
    Params p(ev, args, where, {"sub", "start", "end"});
    if (!p.given(0)) ev.fail(where + " takes at least 1 argument");
    const std::string& sub = want_str(ev, *p.get(0), where + " argument");
    size_t off = 0;
    const std::string_view w = str_window(ev, s, p, 1, off);
    if (m == "count") {
      if (sub.empty()) return Value::integer(static_cast<int64_t>(cp_length(w) + 1));
      int64_t n = 0;
      for (size_t i = w.find(sub); i != std::string_view::npos; i = w.find(sub, i + sub.size())) ++n;
      return Value::integer(n);
    }
    const size_t j = (m == "find" || m == "index") ? w.find(sub) : w.rfind(sub);
    if (j == std::string_view::npos) {
      if (m == "index" || m == "rindex") ev.fail(where + ": substring not found");
      return Value::integer(-1);
    }
    return Value::integer(static_cast<int64_t>(off + cp_length(w.substr(0, j))));
  }
  if (m == "join") {
    Params p(ev, args, where, {"iterable"});
    if (!p.given(0)) ev.fail(where + " takes exactly one argument");
    std::string out;
    const ValueList items = iterate(ev, *p.get(0));
    for (size_t k = 0; k < items.size(); ++k) {
      if (!items[k].is(Kind::kString)) ev.fail(fmt::format("{}: sequence item {}: expected str instance, {} found", where, k, type_name(items[k])));
      if (k) out += s;
      out += items[k].str();
      check_bytes(out.size());
    }
    return Value::string(std::move(out));
  }
  if (m == "removeprefix" || m == "removesuffix") {
    Params p(ev, args, where, {"affix"});
    if (!p.given(0)) ev.fail(where + " takes exactly one argument");
    const std::string& a = want_str(ev, *p.get(0), where + " argument");
    if (m == "removeprefix") return Value::string(s.compare(0, a.size(), a) == 0 ? s.substr(a.size()) : s);
    return Value::string(s.size() >= a.size() && s.compare(s.size() - a.size(), a.size(), a) == 0 ? s.substr(0, s.size() - a.size()) : s);
  }
  if (m == "partition" || m == "rpartition") {
    Params p(ev, args, where, {"sep"});
    if (!p.given(0)) ev.fail(where + " takes exactly one argument");
    const std::string& sep = want_str(ev, *p.get(0), where + " argument");
    if (sep.empty()) ev.fail("empty separator");
    const size_t j = m == "partition" ? s.find(sep) : s.rfind(sep);
    if (j == std::string::npos) {
      return m == "partition" ? Value::make_list({Value::string(s), Value::string(""), Value::string("")}, true)
                              : Value::make_list({Value::string(""), Value::string(""), Value::string(s)}, true);
    }
    return Value::make_list({Value::string(s.substr(0, j)), Value::string(sep), Value::string(s.substr(j + sep.size()))}, true);
  }
  if (m == "isdigit" || m == "isdecimal" || m == "isnumeric" || m == "isalpha" || m == "isalnum" || m == "isspace" ||
      m == "isupper" || m == "islower") {
    Params p(ev, args, where, {});
    const std::vector<uint32_t> c = to_cps(s);
    if (c.empty()) return Value::boolean(false);
    bool cased = false;
    for (uint32_t x : c) {
      const bool digit = x >= '0' && x <= '9';
      const bool alpha = is_ascii_alpha(x) || (x >= 0x80 && py_cased_cp(x));
      if ((m == "isdigit" || m == "isdecimal" || m == "isnumeric") && !digit) return Value::boolean(false);
      if (m == "isalpha" && !alpha) return Value::boolean(false);
      if (m == "isalnum" && !alpha && !digit) return Value::boolean(false);
      if (m == "isspace" && !py_isspace(x)) return Value::boolean(false);
      if (m == "isupper" && (py_upper_cp(x) != x || x == 0xDF || x == 0x149 || x == 0x390 || x == 0x3B0)) return Value::boolean(false);
      if (m == "islower" && py_lower_cp(x) != x) return Value::boolean(false);
      cased = cased || py_cased_cp(x);
    }
    return Value::boolean((m != "isupper" && m != "islower") || cased);
  }
  if (m == "center" || m == "ljust" || m == "rjust" || m == "zfill") {
    Params p(ev, args, where, {"width", "fillchar"});
    const int64_t width = p.get_int(0, 0);
    const std::string fill = m == "zfill" ? "0" : p.get_str(1, " ");
    if (cp_length(fill) != 1) ev.fail(where + ": the fill character must be exactly one character long");
    const int64_t len = static_cast<int64_t>(cp_length(s));
    if (width <= len) return Value::string(s);
    if (width > (1 << 24)) ev.fail(where + ": width too large");
    const int64_t pad = width - len;
    int64_t left = m == "rjust" || m == "zfill" ? pad : m == "ljust" ? 0 : pad / 2 + (pad & width & 1);
    std::string out;
    std::string body = s;
    if (m == "zfill" && !s.empty() && (s[0] == '+' || s[0] == '-')) out += s[0], body = s.substr(1);
    for (int64_t k = 0; k < left; ++k) out += fill;
    out += body;
    for (int64_t k = left; k < pad; ++k) out += fill;
    return Value::string(out);
  }
  if (m == "format") return Value::string(str_format(ev, s, args));
  ev.fail("unsupported string method '" + m + "'");
}

Value dict_method(Evaluator& ev, const Callable& fn, CallArgs& args) {
  const Dict& d = *fn.self.dict;
  const std::string& m = fn.name;
  const std::string where = "dict." + m + "()";
  if (m == "get") {
    Params p(ev, args, where, {"key", "default"});
    if (!p.given(0)) ev.fail(where + " takes at least 1 argument");
    if (!hashable(*p.get(0))) ev.fail("unhashable type: '" + type_name(*p.get(0)) + "'");
    const Value* v = d.find(*p.get(0));
    return v ? *v : p.get_or(1, Value::none());
  }
  Params p(ev, args, where, {});
  ValueList out;
  for (const auto& [k, v] : d.entries) {
    if (m == "items") out.push_back(Value::make_list({k, v}, true));
    else if (m == "keys") out.push_back(k);
    else if (m == "values") out.push_back(v);
  }
  if (m == "copy") return fn.self;
  if (m == "items") return Value::make_view(std::move(out), View::kDictItems);
  if (m == "keys") return Value::make_view(std::move(out), View::kDictKeys);
  if (m == "values") return Value::make_view(std::move(out), View::kDictValues);
  ev.fail("unsupported dict method '" + m + "'");
}

Value list_method(Evaluator& ev, const Callable& fn, CallArgs& args) {
  const ValueList& items = fn.self.items();
  const std::string& m = fn.name;
  const std::string where = std::string(fn.self.tuple ? "tuple." : "list.") + m + "()";
  if (m == "copy") return Value::make_list(items, fn.self.tuple);
  Params p(ev, args, where, {"value"});
  if (!p.given(0)) ev.fail(where + " takes exactly one argument");
  int64_t n = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    if (!equal(items[k], *p.get(0))) continue;
    if (m == "index") return Value::integer(static_cast<int64_t>(k));
    ++n;
  }
  if (m == "index") ev.fail(where + ": " + repr(*p.get(0)) + " is not in list");
  return Value::integer(n);
}

}  // namespace

// ---------------------------------------------------------------- Params

Params::Params(Evaluator& ev, CallArgs& args, std::string_view fn, std::initializer_list<const char*> names)
    : ev_(ev), fn_(fn), names_(names), slots_(names.size(), nullptr) {
  if (args.pos.size() > names_.size()) {
    ev.fail(fmt::format("{} takes at most {} argument(s) ({} given)", fn_, names_.size(), args.pos.size()));
  }
  for (size_t k = 0; k < args.pos.size(); ++k) slots_[k] = &args.pos[k];
  for (const auto& [name, v] : args.kw) {
    size_t k = 0;
    while (k < names_.size() && name != names_[k]) ++k;
    if (k == names_.size()) ev.fail(fn_ + " got an unexpected keyword argument '" + name + "'");
    if (slots_[k] != nullptr) ev.fail(fn_ + " got multiple values for argument '" + name + "'");
    slots_[k] = &v;
  }
}
int64_t Params::get_int(size_t i, int64_t fallback) const {
  if (!slots_[i] || slots_[i]->is(Kind::kNone)) return fallback;
  if (slots_[i]->is(Kind::kInt)) return slots_[i]->i;
  if (slots_[i]->is(Kind::kBool)) return slots_[i]->b;
  ev_.fail(fmt::format("{}: argument '{}' must be an int, not {}", fn_, names_[i], type_name(*slots_[i])));
}
bool Params::get_bool(size_t i, bool fallback) const { return slots_[i] ? truthy(*slots_[i]) : fallback; }
std::string Params::get_str(size_t i, const std::string& fallback) const {
  if (!slots_[i]) return fallback;
  if (!slots_[i]->is(Kind::kString)) ev_.fail(fmt::format("{}: argument '{}' must be a str, not {}", fn_, names_[i], type_name(*slots_[i])));
  return slots_[i]->str();
}

Value get_attr(Evaluator& ev, const Value& obj, const std::string& name) {
  if (obj.is(Kind::kUndefined)) fail_undefined(ev, obj);
  auto missing = [&] { return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'"); };
  auto unsafe = [&] { return Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe"); };
  if (!name.empty() && name[0] == '_') return unsafe();
  switch (obj.kind) {
    case Kind::kDict: {
      if (is_one_of(name, {"get", "items", "keys", "values", "copy"})) return method_value(obj, name, &dict_method);
      if (is_one_of(name, {"clear", "pop", "popitem", "setdefault", "update", "fromkeys"})) return unsafe();
      const Value* v = obj.dict->find(name);
      return v ? *v : missing();
    }
    case Kind::kString:
      if (is_one_of(name, {"strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "replace", "upper",
                           "lower", "title", "capitalize", "swapcase", "casefold", "find", "rfind", "index", "rindex", "count", "join",
                           "removeprefix", "removesuffix", "partition", "rpartition", "isdigit", "isdecimal", "isnumeric", "isalpha",
                           "isalnum", "isspace", "isupper", "islower", "center", "ljust", "rjust", "zfill", "format", "format_map",
                           "encode", "expandtabs", "isascii", "isidentifier", "isprintable", "istitle", "maketrans", "translate"})) {
        return method_value(obj, name, &str_method);
      }
      return missing();
    case Kind::kList:
      if (obj.view != View::kPlain) return missing();
      if (is_one_of(name, {"index", "count", "copy"})) return method_value(obj, name, &list_method);
      if (is_one_of(name, {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"})) return unsafe();
      return missing();
    case Kind::kNamespace: {
      const Value* v = obj.ns->attrs.find(name);
      return v ? *v : missing();
    }
    default:
      return missing();
  }
}

Value get_item(Evaluator& ev, const Value& obj, const Value& key) {
  if (obj.is(Kind::kUndefined)) fail_undefined(ev, obj);
  int64_t index = 0;
  const bool int_key = key.is(Kind::kInt) || key.is(Kind::kBool);
  if (int_key) index = key.is(Kind::kInt) ? key.i : key.b;
  switch (obj.kind) {
    case Kind::kDict:
      if (hashable(key)) {
        const Value* v = obj.dict->find(key);
        if (v) return *v;
      }
      break;
    case Kind::kList:
      if (int_key && obj.view == View::kPlain) {
        const int64_t n = static_cast<int64_t>(obj.items().size());
        if (index < 0) index += n;
        if (index >= 0 && index < n) return obj.items()[static_cast<size_t>(index)];
        return Value::undefined(fmt::format("'{} object' has no element {}", type_name(obj), key.is(Kind::kInt) ? key.i : key.b));
      }
      break;
    case Kind::kString:
      if (int_key) {
        const std::vector<uint32_t> c = to_cps(obj.str());
        const int64_t n = static_cast<int64_t>(c.size());
        if (index < 0) index += n;
        if (index >= 0 && index < n) {
          Value r = Value::string(from_cps(c, static_cast<size_t>(index), static_cast<size_t>(index) + 1));
          r.markup = obj.markup;
          return r;
        }
        return Value::undefined(fmt::format("'str object' has no element {}", key.is(Kind::kInt) ? key.i : key.b));
      }
      break;
    default:
      break;
  }
  if (key.is(Kind::kString)) return get_attr(ev, obj, key.str());
  return Value::undefined("'" + type_name(obj) + " object' has no element " + repr(key));
}

Value get_slice(Evaluator& ev, const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is(Kind::kUndefined)) fail_undefined(ev, obj);
  if ((!obj.is(Kind::kList) || obj.view != View::kPlain) && !obj.is(Kind::kString)) {
    return Value::undefined("'" + type_name(obj) + " object' cannot be sliced");
  }
  std::vector<uint32_t> c;
  if (obj.is(Kind::kString)) c = to_cps(obj.str());
  const int64_t len = static_cast<int64_t>(obj.is(Kind::kString) ? c.size() : obj.items().size());
  int64_t b = 0, e = 0, st = 1;
  if (!slice_indices(start, stop, step, len, b, e, st, ev)) return Value::undefined("slice indices must be integers or None");
  std::vector<size_t> picks;
  for (int64_t k = b; st > 0 ? k < e : k > e; k += st) picks.push_back(static_cast<size_t>(k));
  if (obj.is(Kind::kString)) {
    std::string out;
    for (size_t k : picks) utf8_append(out, c[k]);
    Value r = Value::string(std::move(out));
    r.markup = obj.markup;
    return r;
  }
  ValueList out;
  for (size_t k : picks) out.push_back(obj.items()[k]);
  return Value::make_list(std::move(out), obj.tuple);
}

}  // namespace qshard::jinja
