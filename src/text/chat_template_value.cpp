// chat_template_value.cpp: Python's value semantics for the chat-template renderer: str() and repr()
// (float repr as Python's shortest round-trip form: 1.0, 1e+16, 1e-05), truthiness, hashing rules,
// ==/</in, iteration, slice indices and arithmetic (int vs float, floor division and modulo rounding
// toward -inf, Markup's escaping `+`). Strings as Python sees them: chat_template_strings.cpp;
// json.dumps: chat_template_json.cpp; attribute/item access and methods: chat_template_methods.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "text/chat_template_ast.h"

namespace qshard::jinja {

// ---------------------------------------------------------------- errors and slices

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

// ---------------------------------------------------------------- str() and repr()

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
  check_bytes(static_cast<uint64_t>(times) * unit * (seq.is(Kind::kString) ? 1 : sizeof(Value)));
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
    DepthGuard guard("comparisons");
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
      charge_work(container.items().size());
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
    DepthGuard guard("values");
    charge_work(v.items().size());
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
      DepthGuard guard("comparisons");
      charge_work(a.items().size());
      for (size_t k = 0; k < a.items().size(); ++k) {
        if (!equal(a.items()[k], b.items()[k])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (a.dict->entries.size() != b.dict->entries.size()) return false;
      DepthGuard guard("comparisons");
      charge_work(a.dict->entries.size());
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
      DepthGuard guard("printed values");
      std::string out(1, v.tuple ? '(' : '[');
      for (size_t k = 0; k < v.items().size(); ++k) {
        if (k) out += ", ";
        out += repr(v.items()[k]);
        check_bytes(out.size());  // a value shared many ways prints exponentially long
      }
      if (v.tuple && v.items().size() == 1) out += ',';
      out += v.tuple ? ')' : ']';
      return out;
    }
    case Kind::kDict: {
      DepthGuard guard("printed values");
      std::string out = "{";
      for (size_t k = 0; k < v.dict->entries.size(); ++k) {
        if (k) out += ", ";
        out += repr(v.dict->entries[k].first) + ": " + repr(v.dict->entries[k].second);
        check_bytes(out.size());
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
    case Kind::kNamespace: {
      DepthGuard guard("printed values");  // a namespace may hold itself
      return "<Namespace " + repr(Value::make_dict(v.ns->attrs)) + ">";
    }
    case Kind::kCallable: return "<function " + v.fn->name + ">";
    default: return repr(v);
  }
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
    case Kind::kList:
      charge_work(v.items().size());  // a transient copy: paid for as work, not memory
      return v.items();
    case Kind::kUndefined: return {};
    case Kind::kDict: {
      charge_work(v.dict->entries.size());
      ValueList keys;
      for (const auto& kv : v.dict->entries) keys.push_back(kv.first);
      return keys;
    }
    case Kind::kString: {
      charge_work(v.str().size());
      check_bytes(v.str().size() * (sizeof(Value) + 32));
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

}  // namespace qshard::jinja
