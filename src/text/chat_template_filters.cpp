// chat_template_filters.cpp: jinja2's filters and tests (with the signatures and edge cases of
// jinja2 3.1's filters.py/tests.py), transformers' tojson (json.dumps, ensure_ascii=False), and
// the globals a chat template sees: range (at most 100000 items, as jinja2's sandbox), dict,
// namespace (no '_' names, as transformers' TemplateNamespace), raise_exception, strftime_now.
// A filter or test not in the tables below is an unknown name at parse time.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "text/chat_template_ast.h"

namespace qshard::jinja {
namespace {

// soft_str(): a str stays as it is (a Markup stays Markup), anything else becomes str(value).
Value string_of(const Value& v) { return v.is(Kind::kString) ? v : Value::string(to_str(v)); }
// A filter's str result keeps the subject's Markup-ness (Markup.upper() is Markup, ...).
Value like(const Value& subject, std::string text) {
  Value r = Value::string(std::move(text));
  r.markup = subject.is(Kind::kString) && subject.markup;
  return r;
}

// Attribute path "a.b.0" looked up item-first (jinja2's make_attrgetter uses environment.getitem).
Value lookup_path(Evaluator& ev, const Value& obj, const std::string& path) {
  Value v = obj;
  size_t b = 0;
  while (b <= path.size()) {
    const size_t e = std::min(path.find('.', b), path.size());
    const std::string part = path.substr(b, e - b);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = get_item(ev, v, digits ? Value::integer(std::atoll(part.c_str())) : Value::string(part));
    b = e + 1;
  }
  return v;
}

Value attr_arg(Evaluator& ev, const Value& item, const Value* attribute) {
  if (attribute == nullptr || attribute->is(Kind::kNone)) return item;
  if (attribute->is(Kind::kInt)) return get_item(ev, item, *attribute);
  if (!attribute->is(Kind::kString)) ev.fail("attribute must be a str or an int");
  return lookup_path(ev, item, attribute->str());
}

// Sort key: strings lowered unless case_sensitive (jinja2's ignore_case).
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is(Kind::kString) ? Value::string(py_lower(v.str())) : v;
}

bool less(Evaluator& ev, const Value& a, const Value& b) { return compare(ev, CmpOp::kLt, a, b); }

Value f_abs(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "abs", {});
  if (v.is(Kind::kFloat)) return Value::real(std::fabs(v.f));
  if (v.is(Kind::kInt)) {
    if (v.i == INT64_MIN) ev.fail("integer overflow");
    return Value::integer(v.i < 0 ? -v.i : v.i);
  }
  if (v.is(Kind::kBool)) return Value::integer(v.b);
  ev.fail("bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_attr(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "attr", {"name"});
  const std::string name = p.get_str(0, "");
  if (v.is(Kind::kDict) || v.is(Kind::kNamespace)) {
    // getattr() only: a dict's keys are not attributes.
    if (v.is(Kind::kNamespace)) return get_attr(ev, v, name);
    const Value m = get_attr(ev, v, name);
    return m.is(Kind::kCallable) ? m : Value::undefined("'dict object' has no attribute '" + name + "'");
  }
  return get_attr(ev, v, name);
}

Value f_capitalize(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "capitalize", {});
  return like(v, py_capitalize(to_str(v)));
}

Value f_center(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "center", {"width"});
  CallArgs inner;
  inner.pos.push_back(Value::integer(p.get_int(0, 80)));
  const Value m = get_attr(ev, string_of(v), "center");
  return m.fn->builtin(ev, *m.fn, inner);
}

Value f_default(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "default", {"default_value", "boolean"});
  if (v.is(Kind::kUndefined) || (p.get_bool(1, false) && !truthy(v))) return p.get_or(0, Value::string(""));
  return v;
}

Value f_dictsort(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "dictsort", {"case_sensitive", "by", "reverse"});
  if (!v.is(Kind::kDict)) ev.fail("dictsort: expected a dict, got " + type_name(v));
  const bool cs = p.get_bool(0, false);
  const std::string by = p.get_str(1, "key");
  if (by != "key" && by != "value") ev.fail("dictsort: 'by' must be 'key' or 'value'");
  ValueList pairs;
  for (const auto& [k, x] : v.dict->entries) pairs.push_back(Value::make_list({k, x}, true));
  const size_t pos = by == "key" ? 0 : 1;
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& a, const Value& b) {
    return less(ev, sort_key(a.items()[pos], cs), sort_key(b.items()[pos], cs));
  });
  if (p.get_bool(2, false)) std::reverse(pairs.begin(), pairs.end());
  return Value::make_list(std::move(pairs));
}

Value f_escape(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "escape", {});
  return v.markup ? v : Value::markup_string(html_escape(to_str(v)));
}
Value f_forceescape(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "forceescape", {});
  return Value::markup_string(html_escape(to_str(v)));
}

Value f_first(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "first", {});
  const ValueList items = iterate(ev, v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "last", {});
  if (v.is(Kind::kList) && v.view == View::kGenerator) ev.fail("last: 'generator' object is not reversible");
  const ValueList items = iterate(ev, v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

// Python's float(str): surrounding whitespace, underscores between digits, inf/nan.
bool parse_float(const std::string& text, double& out) {
  std::string s = py_strip(text, nullptr, true, true);
  std::string t;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '_' && k > 0 && k + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[k - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[k + 1]))) {
      continue;
    }
    t += s[k];
  }
  const std::string low = py_lower(t);
  const std::string body = (!low.empty() && (low[0] == '+' || low[0] == '-')) ? low.substr(1) : low;
  if (body == "inf" || body == "infinity" || body == "nan") {
    out = body == "nan" ? std::nan("") : HUGE_VAL;
    if (low[0] == '-') out = -out;
    return true;
  }
  if (t.empty() || t.find_first_not_of("0123456789+-.eE") != std::string::npos) return false;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size();
}

Value f_float(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "float", {"default"});
  const Value fallback = p.get_or(0, Value::real(0.0));
  if (v.is(Kind::kUndefined)) ev.fail(v.s ? *v.s : "float: an undefined value");  // float(Undefined) raises
  if (v.is(Kind::kFloat)) return v;
  if (v.is(Kind::kInt)) return Value::real(static_cast<double>(v.i));
  if (v.is(Kind::kBool)) return Value::real(v.b ? 1.0 : 0.0);
  double d = 0;
  if (v.is(Kind::kString) && parse_float(v.str(), d)) return Value::real(d);
  return fallback;
}

// Python's int(text, base): whitespace around, a sign, a 0b/0o/0x prefix matching the base (any with
// base 0, where a decimal may not start with 0), underscores between digits.
bool parse_int(const std::string& text, int64_t base, int64_t& out) {
  const std::string t = py_strip(text, nullptr, true, true);
  size_t k = 0;
  bool neg = false;
  if (k < t.size() && (t[k] == '+' || t[k] == '-')) neg = t[k++] == '-';
  const char p = k + 1 < t.size() && t[k] == '0' ? static_cast<char>(t[k + 1] | 0x20) : 0;
  const int prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
  if (prefixed != 0 && (base == 0 || base == prefixed)) {
    base = prefixed;
    k += 2;
    if (k < t.size() && t[k] == '_') ++k;
  } else if (base == 0) {
    base = 10;
    if (k < t.size() && t[k] == '0' && t.find_first_not_of("0_", k) != std::string::npos) return false;
  }
  if (base < 2 || base > 36 || k >= t.size()) return false;
  uint64_t v = 0;
  bool prev_digit = false;
  for (; k < t.size(); ++k) {
    const char c = t[k];
    if (c == '_') {
      if (!prev_digit || k + 1 >= t.size()) return false;
      prev_digit = false;
      continue;
    }
    const int d = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10 : 99;
    if (d >= base) return false;
    if (v > (static_cast<uint64_t>(INT64_MAX) - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base)) return false;
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    prev_digit = true;
  }
  if (!prev_digit) return false;
  out = neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  return true;
}

Value f_int(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "int", {"default", "base"});
  const Value fallback = p.get_or(0, Value::integer(0));
  const int64_t base = p.get_int(1, 10);
  if (v.is(Kind::kUndefined)) ev.fail(v.s ? *v.s : "int: an undefined value");  // int(Undefined) raises
  if (v.is(Kind::kInt)) return v;
  if (v.is(Kind::kBool)) return Value::integer(v.b);
  if (v.is(Kind::kFloat)) {
    if (!std::isfinite(v.f)) ev.fail("int: cannot convert " + to_str(v) + " to an integer");
    if (std::fabs(v.f) >= 9.2e18) ev.fail("integer overflow");
    return Value::integer(static_cast<int64_t>(v.f));
  }
  if (v.is(Kind::kString)) {
    int64_t r = 0;
    if (parse_int(v.str(), base, r)) return Value::integer(r);
    double d = 0;  // jinja2: "42.23"|int is 42
    if (parse_float(v.str(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(static_cast<int64_t>(d));
  }
  return fallback;
}

Value f_indent(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "indent", {"width", "first", "blank"});
  if (!v.is(Kind::kString)) ev.fail("indent: expected a str, got " + type_name(v));
  std::string ind;
  const Value width = p.get_or(0, Value::integer(4));
  if (width.is(Kind::kString)) ind = width.str();
  else ind = std::string(static_cast<size_t>(std::clamp<int64_t>(p.get_int(0, 4), 0, 1 << 16)), ' ');
  CallArgs none;
  const Value lines_v = get_attr(ev, Value::string(to_str(v) + "\n"), "splitlines");
  const ValueList lines = lines_v.fn->builtin(ev, *lines_v.fn, none).items();
  check_bytes(v.str().size() + (lines.size() + 1) * ind.size());  // before building: width x lines may be huge
  std::string out;
  if (p.get_bool(2, false)) {
    for (size_t k = 0; k < lines.size(); ++k) out += (k ? "\n" + ind : "") + lines[k].str();
  } else {
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) out += "\n" + (lines[k].str().empty() ? std::string() : ind);
      out += lines[k].str();
    }
  }
  if (p.get_bool(1, false)) out = ind + out;
  return like(v, out);
}

Value f_items(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "items", {});
  if (v.is(Kind::kUndefined)) return Value::make_view({}, View::kGenerator);
  if (!v.is(Kind::kDict)) ev.fail("items: can only get item pairs from a mapping, not " + type_name(v));
  ValueList out;
  for (const auto& [k, x] : v.dict->entries) out.push_back(Value::make_list({k, x}, true));
  return Value::make_view(std::move(out), View::kGenerator);
}

Value f_join(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "join", {"d", "attribute"});
  const std::string sep = to_str(p.get_or(0, Value::string("")));
  std::string out;
  const ValueList items = iterate(ev, v);
  for (size_t k = 0; k < items.size(); ++k) {
    if (k) out += sep;
    out += to_str(attr_arg(ev, items[k], p.get(1)));
    check_bytes(out.size());
  }
  return Value::string(out);
}

Value f_length(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "length", {});
  switch (v.kind) {
    case Kind::kUndefined: return Value::integer(0);
    case Kind::kString: return Value::integer(static_cast<int64_t>(cp_length(v.str())));
    case Kind::kList:
      if (v.view == View::kGenerator) ev.fail("object of type 'generator' has no len()");
      return Value::integer(static_cast<int64_t>(v.items().size()));
    case Kind::kDict: return Value::integer(static_cast<int64_t>(v.dict->entries.size()));
    default: ev.fail("object of type '" + type_name(v) + "' has no len()");
  }
}

Value f_list(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "list", {});
  return Value::make_list(iterate(ev, v));
}

Value f_lower(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "lower", {});
  return like(v, py_lower(to_str(v)));
}
Value f_upper(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "upper", {});
  return like(v, py_upper(to_str(v)));
}

Value f_map(Evaluator& ev, const Value& v, CallArgs& args) {
  const ValueList items = truthy(v) ? iterate(ev, v) : ValueList{};  // jinja2: `if value:` first
  ValueList out;
  if (args.pos.empty()) {
    Params p(ev, args, "map", {"attribute", "default"});
    if (!p.given(0)) ev.fail("map: needs a filter name or attribute=");
    for (const auto& x : items) {
      Value r = attr_arg(ev, x, p.get(0));
      if (r.is(Kind::kUndefined) && p.given(1)) r = *p.get(1);
      out.push_back(std::move(r));
    }
    return Value::make_view(std::move(out), View::kGenerator);
  }
  if (!args.pos[0].is(Kind::kString)) ev.fail("map: the filter name must be a str");
  const std::string name = args.pos[0].str();
  const FilterFn fn = find_filter(name);
  if (fn == nullptr) ev.fail("map: unknown filter '" + name + "'");
  CallArgs rest;
  rest.pos.assign(args.pos.begin() + 1, args.pos.end());
  rest.kw = args.kw;
  for (const auto& x : items) {
    CallArgs a = rest;
    out.push_back(fn(ev, x, a));
  }
  return Value::make_view(std::move(out), View::kGenerator);
}

Value min_max(Evaluator& ev, const Value& v, CallArgs& args, bool want_max) {
  Params p(ev, args, want_max ? "max" : "min", {"case_sensitive", "attribute"});
  const ValueList items = iterate(ev, v);
  if (items.empty()) return Value::undefined(want_max ? "No largest item, sequence was empty." : "No smallest item, sequence was empty.");
  const bool cs = p.get_bool(0, false);
  size_t best = 0;
  for (size_t k = 1; k < items.size(); ++k) {
    const Value a = sort_key(attr_arg(ev, items[k], p.get(1)), cs);
    const Value b = sort_key(attr_arg(ev, items[best], p.get(1)), cs);
    if (want_max ? less(ev, b, a) : less(ev, a, b)) best = k;
  }
  return items[best];
}
Value f_max(Evaluator& ev, const Value& v, CallArgs& args) { return min_max(ev, v, args, true); }
Value f_min(Evaluator& ev, const Value& v, CallArgs& args) { return min_max(ev, v, args, false); }

// select/reject/selectattr/rejectattr: args = [attribute (attr forms)], test name, test args...
Value select_impl(Evaluator& ev, const Value& v, CallArgs& args, bool keep, bool by_attr) {
  const char* name = by_attr ? (keep ? "selectattr" : "rejectattr") : (keep ? "select" : "reject");
  size_t k = 0;
  Value attribute;
  if (by_attr) {
    if (args.pos.empty() || !args.pos[0].is(Kind::kString)) ev.fail(std::string(name) + ": needs an attribute name");
    attribute = args.pos[k++];
  }
  TestFn test = nullptr;
  if (k < args.pos.size()) {
    if (!args.pos[k].is(Kind::kString)) ev.fail(std::string(name) + ": the test name must be a str");
    test = find_test(args.pos[k].str());
    if (test == nullptr) ev.fail(std::string(name) + ": unknown test '" + args.pos[k].str() + "'");
    ++k;
  }
  CallArgs test_args;
  test_args.pos.assign(args.pos.begin() + static_cast<std::ptrdiff_t>(std::min(k, args.pos.size())), args.pos.end());
  test_args.kw = args.kw;
  ValueList out;
  for (const auto& x : truthy(v) ? iterate(ev, v) : ValueList{}) {  // jinja2: `if value:` first
    const Value subject = by_attr ? lookup_path(ev, x, attribute.str()) : x;
    CallArgs a = test_args;
    const bool ok = test ? test(ev, subject, a) : truthy(subject);
    if (ok == keep) out.push_back(x);
  }
  return Value::make_view(std::move(out), View::kGenerator);
}
Value f_select(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, true, false); }
Value f_reject(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, false, false); }
Value f_selectattr(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, true, true); }
Value f_rejectattr(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, false, true); }

Value f_replace(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "replace", {"old", "new", "count"});
  if (!p.given(1)) ev.fail("replace: needs old and new");
  CallArgs inner;
  inner.pos = {string_of(*p.get(0)), string_of(*p.get(1))};
  if (p.given(2) && !p.get(2)->is(Kind::kNone)) inner.pos.push_back(*p.get(2));
  const Value m = get_attr(ev, Value::string(to_str(v)), "replace");
  return m.fn->builtin(ev, *m.fn, inner);
}

Value f_reverse(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "reverse", {});
  if (v.is(Kind::kString)) {
    std::vector<uint32_t> c = to_cps(v.str());
    std::reverse(c.begin(), c.end());
    return Value::string(from_cps(c, 0, c.size()));
  }
  const bool reversible = !v.is(Kind::kList) || v.view != View::kGenerator;
  ValueList items = iterate(ev, v);
  std::reverse(items.begin(), items.end());
  // reversed(seq) is an iterator; a generator is listed first (a plain list).
  return reversible ? Value::make_view(std::move(items), View::kGenerator) : Value::make_list(std::move(items));
}

Value f_round(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "round", {"precision", "method"});
  const int64_t precision = p.get_int(0, 0);
  const std::string method = p.get_str(1, "common");
  if (method != "common" && method != "ceil" && method != "floor") ev.fail("round: method must be common, ceil or floor");
  if (!v.is_number()) ev.fail("round: expected a number, got " + type_name(v));
  if (method == "common" && !v.is(Kind::kFloat)) return Value::integer(v.is(Kind::kInt) ? v.i : v.b);
  const double x = v.is(Kind::kFloat) ? v.f : static_cast<double>(v.is(Kind::kInt) ? v.i : v.b);
  // Past 10^+-330 no double has digits left to round: Python's round gives x (or a signed 0);
  // Jinja2's ceil / floor multiply by 10**precision and fail (an overflow, a division by 0).
  if (precision >= 330 || precision <= -330) {
    if (method != "common") ev.fail("round: precision " + std::to_string(precision) + " is out of range for " + method);
    return Value::real(precision > 0 || !std::isfinite(x) ? x : std::copysign(0.0, x));
  }
  if (method == "common" && precision >= 0 && std::isfinite(x)) {
    // Python's round(x, n): the decimal rounding of the exact binary value, ties to even (as printf).
    char buf[1024];  // at most 309 digits, the point and 329 decimals
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), x);
    return Value::real(std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double y = x * scale;
  const double r = method == "ceil" ? std::ceil(y) : method == "floor" ? std::floor(y) : std::nearbyint(y);
  return Value::real(r / scale);
}

Value f_safe(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "safe", {});
  return v.is(Kind::kString) && v.markup ? v : Value::markup_string(to_str(v));
}

Value f_sort(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "sort", {"reverse", "case_sensitive", "attribute"});
  ValueList items = iterate(ev, v);
  const bool cs = p.get_bool(1, false);
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return less(ev, sort_key(attr_arg(ev, a, p.get(2)), cs), sort_key(attr_arg(ev, b, p.get(2)), cs));
  });
  if (p.get_bool(0, false)) {
    // sorted(reverse=True) is stable: equal items keep their order.
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      return less(ev, sort_key(attr_arg(ev, b, p.get(2)), cs), sort_key(attr_arg(ev, a, p.get(2)), cs));
    });
  }
  return Value::make_list(std::move(items));
}

Value f_string(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "string", {});
  return string_of(v);
}

Value f_sum(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "sum", {"attribute", "start"});
  Value total = p.get_or(1, Value::integer(0));
  for (const auto& x : iterate(ev, v)) total = binary(ev, BinOp::kAdd, total, attr_arg(ev, x, p.get(0)));
  return total;
}

Value f_title(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "title", {});
  // jinja2: each run between [-\s({\[<]+ separators becomes run[0].upper() + run[1:].lower().
  const std::vector<uint32_t> c = to_cps(to_str(v));
  std::string out;
  size_t k = 0;
  while (k < c.size()) {
    auto sep = [](uint32_t x) { return x == '-' || x == '(' || x == '{' || x == '[' || x == '<' || py_isspace(x); };
    const bool is_sep = sep(c[k]);
    size_t e = k;
    while (e < c.size() && sep(c[e]) == is_sep) ++e;
    out += py_upper(from_cps(c, k, k + 1)) + py_lower(from_cps(c, k + 1, e));
    k = e;
  }
  return Value::string(out);
}

Value f_tojson(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  return Value::string(json_dumps(ev, v, p.get_bool(0, false), p.get_or(1, Value::none()), p.get_or(2, Value::none()), p.get_bool(3, false)));
}

Value f_trim(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "trim", {"chars"});
  const Value* chars = p.get(0);
  if (chars != nullptr && !chars->is(Kind::kNone) && !chars->is(Kind::kString)) ev.fail("trim: chars must be a str");
  return like(v, py_strip(to_str(v), chars, true, true));
}

Value f_unique(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "unique", {"case_sensitive", "attribute"});
  const bool cs = p.get_bool(0, false);
  ValueList out, seen;
  for (const auto& x : iterate(ev, v)) {
    const Value key = sort_key(attr_arg(ev, x, p.get(1)), cs);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) continue;
    seen.push_back(key);
    out.push_back(x);
  }
  return Value::make_view(std::move(out), View::kGenerator);
}

Value f_wordcount(Evaluator& ev, const Value& v, CallArgs& args) {
  Params p(ev, args, "wordcount", {});
  int64_t n = 0;
  bool in_word = false;
  for (uint32_t c : to_cps(to_str(v))) {
    // \w: letters, digits, underscore; non-ASCII counts unless it is a space, punctuation or a symbol block.
    const bool w = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                   (c >= 0x80 && !py_isspace(c) && !(c >= 0xA0 && c <= 0xBF && c != 0xAA && c != 0xB2 && c != 0xB3 && c != 0xB5 && c != 0xB9 && c != 0xBA && c != 0xBC && c != 0xBD && c != 0xBE) && c != 0xD7 &&
                    c != 0xF7 && c != 0x387 && !(c >= 0x482 && c <= 0x489) && !(c >= 0x2000 && c <= 0x2BFF) && !(c >= 0x3000 && c <= 0x303F) && !(c >= 0xFE00 && c <= 0xFE0F) &&
                    !(c >= 0x1F000 && c <= 0x1FAFF));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

// ---------------------------------------------------------------- tests

bool t_defined(Evaluator&, const Value& v, CallArgs&) { return !v.is(Kind::kUndefined); }
bool t_undefined(Evaluator&, const Value& v, CallArgs&) { return v.is(Kind::kUndefined); }
bool t_none(Evaluator&, const Value& v, CallArgs&) { return v.is(Kind::kNone); }
bool t_boolean(Evaluator&, const Value& v, CallArgs&) { return v.is(Kind::kBool); }
bool t_true(Evaluator&, const Value& v, CallArgs&) { return v.is(Kind::kBool) && v.b; }
bool t_false(Evaluator&, const Value& v, CallArgs&) { return v.is(Kind::kBool) && !v.b; }
bool t_integer(Evaluator&, const Value& v, CallArgs&) { return v.is(Kind::kInt); }
bool t_float(Evaluator&, const Value& v, CallArgs&) { return v.is(Kind::kFloat); }
bool t_number(Evaluator&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_string(Evaluator&, const Value& v, CallArgs&) { return v.is(Kind::kString); }
bool t_mapping(Evaluator&, const Value& v, CallArgs&) { return v.is(Kind::kDict); }
bool t_iterable(Evaluator&, const Value& v, CallArgs&) {
  return v.is(Kind::kString) || v.is(Kind::kList) || v.is(Kind::kDict) || v.is(Kind::kUndefined);
}
bool t_sequence(Evaluator& ev, const Value& v, CallArgs& a) {
  return t_iterable(ev, v, a) && !(v.is(Kind::kList) && v.view != View::kPlain);
}
bool t_callable(Evaluator&, const Value& v, CallArgs&) { return v.is(Kind::kCallable) || v.is(Kind::kUndefined); }
bool t_escaped(Evaluator&, const Value&, CallArgs&) { return false; }
const Value& one_arg(Evaluator& ev, CallArgs& args, const char* test) {
  if (args.pos.size() + args.kw.size() != 1) ev.fail(std::string("test '") + test + "' takes exactly one argument");
  return args.pos.empty() ? args.kw[0].second : args.pos[0];
}
bool t_sameas(Evaluator& ev, const Value& v, CallArgs& args) {
  const Value& o = one_arg(ev, args, "sameas");
  if (v.kind != o.kind) return false;
  switch (v.kind) {
    case Kind::kNone:
    case Kind::kUndefined: return v.kind == Kind::kNone;
    case Kind::kBool: return v.b == o.b;
    case Kind::kInt: return v.i == o.i && v.i >= -5 && v.i <= 256;  // CPython's small-int cache
    case Kind::kString: return v.s == o.s;
    case Kind::kList: return v.list == o.list;
    case Kind::kDict: return v.dict == o.dict;
    case Kind::kNamespace: return v.ns == o.ns;
    case Kind::kCallable: return v.fn == o.fn;
    default: return false;
  }
}
bool t_odd(Evaluator& ev, const Value& v, CallArgs&) { return equal(binary(ev, BinOp::kMod, v, Value::integer(2)), Value::integer(1)); }
bool t_even(Evaluator& ev, const Value& v, CallArgs&) { return equal(binary(ev, BinOp::kMod, v, Value::integer(2)), Value::integer(0)); }
bool t_divisibleby(Evaluator& ev, const Value& v, CallArgs& args) {
  return equal(binary(ev, BinOp::kMod, v, one_arg(ev, args, "divisibleby")), Value::integer(0));
}
bool t_eq(Evaluator& ev, const Value& v, CallArgs& a) { return equal(v, one_arg(ev, a, "eq")); }
bool t_ne(Evaluator& ev, const Value& v, CallArgs& a) { return !equal(v, one_arg(ev, a, "ne")); }
bool t_lt(Evaluator& ev, const Value& v, CallArgs& a) { return compare(ev, CmpOp::kLt, v, one_arg(ev, a, "lt")); }
bool t_le(Evaluator& ev, const Value& v, CallArgs& a) { return compare(ev, CmpOp::kLe, v, one_arg(ev, a, "le")); }
bool t_gt(Evaluator& ev, const Value& v, CallArgs& a) { return compare(ev, CmpOp::kGt, v, one_arg(ev, a, "gt")); }
bool t_ge(Evaluator& ev, const Value& v, CallArgs& a) { return compare(ev, CmpOp::kGe, v, one_arg(ev, a, "ge")); }
bool t_in(Evaluator& ev, const Value& v, CallArgs& a) { return compare(ev, CmpOp::kIn, v, one_arg(ev, a, "in")); }
bool str_predicate(Evaluator& ev, const Value& v, const char* method) {
  const Value m = get_attr(ev, Value::string(to_str(v)), method);
  CallArgs none;
  return truthy(m.fn->builtin(ev, *m.fn, none));
}
bool t_lower(Evaluator& ev, const Value& v, CallArgs&) { return str_predicate(ev, v, "islower"); }
bool t_upper(Evaluator& ev, const Value& v, CallArgs&) { return str_predicate(ev, v, "isupper"); }
bool t_filter(Evaluator& ev, const Value& v, CallArgs&) {
  (void)ev;
  return v.is(Kind::kString) && find_filter(v.str()) != nullptr;
}
bool t_test(Evaluator& ev, const Value& v, CallArgs&) {
  (void)ev;
  return v.is(Kind::kString) && find_test(v.str()) != nullptr;
}

// ---------------------------------------------------------------- globals

Value g_range(Evaluator& ev, const Callable&, CallArgs& args) {
  if (!args.kw.empty() || args.pos.empty() || args.pos.size() > 3) ev.fail("range() takes 1 to 3 positional arguments");
  int64_t v[3] = {0, 0, 1};
  for (size_t k = 0; k < args.pos.size(); ++k) {
    const Value& a = args.pos[k];
    if (!a.is(Kind::kInt) && !a.is(Kind::kBool)) ev.fail("range(): '" + type_name(a) + "' object cannot be interpreted as an integer");
    v[args.pos.size() == 1 ? 1 : k] = a.is(Kind::kInt) ? a.i : a.b;
  }
  if (v[2] == 0) ev.fail("range() arg 3 must not be zero");
  // The item count exactly, in 128 bits (a step past half the int64 range must not wrap the loop).
  const __int128 span = static_cast<__int128>(v[1]) - v[0], step = v[2];
  const __int128 count = step > 0 ? (span > 0 ? (span + step - 1) / step : 0) : (span < 0 ? (-span - step - 1) / -step : 0);
  if (count > 100000) ev.fail("range too big: the sandbox allows at most 100000 items");
  ValueList out;
  for (__int128 k = 0; k < count; ++k) out.push_back(Value::integer(static_cast<int64_t>(v[0] + k * step)));
  return Value::make_list(std::move(out));
}

void dict_args(Evaluator& ev, CallArgs& args, Dict& d, const char* fn) {
  if (args.pos.size() > 1) ev.fail(std::string(fn) + "() takes at most 1 positional argument");
  if (!args.pos.empty()) {
    const Value& a = args.pos[0];
    if (a.is(Kind::kDict)) {
      for (const auto& [k, x] : a.dict->entries) d.set(k, x);
    } else {
      for (const auto& pair : iterate(ev, a)) {
        if (!pair.is(Kind::kList) || pair.items().size() != 2 || !pair.items()[0].is(Kind::kString)) {
          ev.fail(std::string(fn) + "(): expected a dict or a list of (str, value) pairs");
        }
        d.set(pair.items()[0].str(), pair.items()[1]);
      }
    }
  }
  for (auto& [k, x] : args.kw) d.set(k, x);
}

Value g_dict(Evaluator& ev, const Callable&, CallArgs& args) {
  Dict d;
  dict_args(ev, args, d, "dict");
  return Value::make_dict(std::move(d));
}

Value g_namespace(Evaluator& ev, const Callable&, CallArgs& args) {
  auto ns = std::make_shared<Namespace>();
  dict_args(ev, args, ns->attrs, "namespace");
  for (const auto& [k, x] : ns->attrs.entries) {
    if (k.is(Kind::kString) && !k.str().empty() && k.str()[0] == '_') ev.fail("namespace attributes cannot start with '_': '" + k.str() + "'");
  }
  ev.own(ns);
  Value v;
  v.kind = Kind::kNamespace;
  v.ns = std::move(ns);
  return v;
}

Value g_raise_exception(Evaluator& ev, const Callable&, CallArgs& args) {
  if (args.pos.size() != 1 || !args.kw.empty()) ev.fail("raise_exception() takes exactly one argument");
  ev.raise(to_str(args.pos[0]));
}

Value g_strftime_now(Evaluator& ev, const Callable&, CallArgs& args) {
  if (args.pos.size() != 1 || !args.pos[0].is(Kind::kString) || !args.kw.empty()) ev.fail("strftime_now() takes one format string");
  const std::time_t now = ev.fixed_time().value_or(std::time(nullptr));
  std::tm tm{};
  if (ev.fixed_time()) gmtime_r(&now, &tm);
  else localtime_r(&now, &tm);
  const std::string fmt = args.pos[0].str();
  if (fmt.empty()) return Value::string("");
  std::string buf(256 + fmt.size() * 8, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  if (n == 0) ev.fail("strftime_now(): the format gives no text or too much");
  buf.resize(n);
  return Value::string(buf);
}

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};
constexpr FilterEntry kFilters[] = {
    {"abs", f_abs},         {"attr", f_attr},           {"capitalize", f_capitalize}, {"center", f_center},
    {"count", f_length},    {"d", f_default},           {"default", f_default},       {"dictsort", f_dictsort},
    {"e", f_escape},        {"escape", f_escape},       {"first", f_first},           {"float", f_float},
    {"forceescape", f_forceescape}, {"indent", f_indent},    {"int", f_int},               {"items", f_items},
    {"join", f_join},       {"last", f_last},           {"length", f_length},         {"list", f_list},
    {"lower", f_lower},     {"map", f_map},             {"max", f_max},               {"min", f_min},
    {"reject", f_reject},   {"rejectattr", f_rejectattr}, {"replace", f_replace},     {"reverse", f_reverse},
    {"round", f_round},     {"safe", f_safe},           {"select", f_select},         {"selectattr", f_selectattr},
    {"sort", f_sort},       {"string", f_string},       {"sum", f_sum},               {"title", f_title},
    {"tojson", f_tojson},   {"trim", f_trim},           {"unique", f_unique},         {"upper", f_upper},
    {"wordcount", f_wordcount},
};

struct TestEntry {
  std::string_view name;
  TestFn fn;
};
constexpr TestEntry kTests[] = {
    {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined}, {"divisibleby", t_divisibleby},
    {"eq", t_eq},           {"equalto", t_eq},        {"==", t_eq},           {"escaped", t_escaped},
    {"even", t_even},       {"false", t_false},       {"filter", t_filter},   {"float", t_float},
    {"ge", t_ge},           {">=", t_ge},             {"gt", t_gt},           {"greaterthan", t_gt},
    {">", t_gt},            {"in", t_in},             {"integer", t_integer}, {"iterable", t_iterable},
    {"le", t_le},           {"<=", t_le},             {"lower", t_lower},     {"lt", t_lt},
    {"lessthan", t_lt},     {"<", t_lt},              {"mapping", t_mapping}, {"ne", t_ne},
    {"!=", t_ne},           {"none", t_none},         {"number", t_number},   {"odd", t_odd},
    {"sameas", t_sameas},   {"sequence", t_sequence}, {"string", t_string},   {"test", t_test},
    {"true", t_true},       {"undefined", t_undefined}, {"upper", t_upper},
};

Value global(const char* name, BuiltinFn fn) {
  auto c = std::make_shared<Callable>();
  c->name = name;
  c->builtin = fn;
  Value v;
  v.kind = Kind::kCallable;
  v.fn = std::move(c);
  return v;
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  for (const auto& f : kFilters) {
    if (f.name == name) return f.fn;
  }
  return nullptr;
}

TestFn find_test(std::string_view name) {
  for (const auto& t : kTests) {
    if (t.name == name) return t.fn;
  }
  return nullptr;
}

void add_globals(Scope& scope) {
  scope.set("range", global("range", &g_range));
  scope.set("dict", global("dict", &g_dict));
  scope.set("namespace", global("namespace", &g_namespace));
  scope.set("raise_exception", global("raise_exception", &g_raise_exception));
  scope.set("strftime_now", global("strftime_now", &g_strftime_now));
}

}  // namespace qshard::jinja
