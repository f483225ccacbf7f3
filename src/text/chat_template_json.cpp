// chat_template_json.cpp: JSON for the chat-template renderer: Python's json.dumps (the tojson
// filter: ensure_ascii, indent, separators, sort_keys; floats as Python prints them, NaN and
// Infinity as Python writes them) and JSON values (the render's variables) as template values.
// Contract: chat_template_ast.h.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "text/chat_template_ast.h"

namespace qshard::jinja {
namespace {

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
  DepthGuard guard("tojson values");
  check_bytes(out.size());  // a value shared many ways serializes exponentially long
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
        std::stable_sort(entries.begin(), entries.end(), [&](auto* a, auto* b) { return compare(ev, CmpOp::kLt, a->first, b->first); });
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

}  // namespace

constexpr int64_t kMaxJsonIndent = 1 << 16;

std::string json_dumps(Evaluator& ev, const Value& v, bool ensure_ascii, const Value& indent, const Value& separators, bool sort_keys) {
  JsonStyle st;
  st.ensure_ascii = ensure_ascii;
  st.sort_keys = sort_keys;
  if (!indent.is(Kind::kNone) && !indent.is(Kind::kUndefined)) {
    st.indented = true;
    if (indent.is(Kind::kString)) st.indent = indent.str();
    else if (indent.is(Kind::kInt) || indent.is(Kind::kBool)) {
      const int64_t n = indent.is(Kind::kInt) ? indent.i : indent.b;
      if (n > kMaxJsonIndent)  // Python builds ' ' * n (a MemoryError past the host's memory)
        ev.fail("tojson: indent " + std::to_string(n) + " is past the " + std::to_string(kMaxJsonIndent) +
                " spaces the sandbox allows");
      st.indent = std::string(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');  // below 0: none, as Python
    }
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

Value from_json(const nlohmann::ordered_json& j, int depth) {
  if ((j.is_array() || j.is_object()) && depth >= kMaxValueDepth) {
    throw InputError(fmt::format("JSON nested deeper than {} levels", kMaxValueDepth));
  }
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
      for (const auto& x : j) items.push_back(from_json(x, depth + 1));
      return Value::make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      d.entries.reserve(j.size());  // a JSON object's keys are unique: no search per key
      for (auto it = j.begin(); it != j.end(); ++it) d.entries.emplace_back(Value::string(it.key()), from_json(it.value(), depth + 1));
      return Value::make_dict(std::move(d));
    }
    default: return Value::none();
  }
}

}  // namespace qshard::jinja
