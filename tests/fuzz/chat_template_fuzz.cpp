// libFuzzer target for the chat-template interpreter (text/chat_template.h, issue 25).
// Input: bytes starting with 0x01 drive a small generator of nested constructs (statements,
// expressions, filters, macros, namespaces, loops, a wrapper repeated up to 300 times to cross the
// nesting bounds); any other bytes are a template's text (seeded with the real templates of
// tests/data/chat_template/templates, which libFuzzer mutates). Each template is parsed and rendered
// with three messages and a tool under small budgets. Properties: no crash, no hang, no memory
// blow-up; the only error is InputError (incl. ChatTemplateRaise).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/error.h"
#include "text/chat_template.h"

namespace {

// Reads choices from the fuzz bytes (0 once they run out).
class Bytes {
 public:
  Bytes(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  unsigned next(unsigned range) { return k_ < n_ ? d_[k_++] % range : 0; }
  bool done() const { return k_ >= n_; }

 private:
  const uint8_t* d_;
  size_t n_, k_ = 0;
};

const char* const kNames[] = {"messages", "m", "x", "ns", "loop", "tools", "add_generation_prompt", "bos_token", "undefined_name"};
const char* const kFilters[] = {"lower", "upper", "trim", "length", "tojson", "string", "list", "first", "last", "join",
                                "reverse", "sort", "unique", "items", "safe", "indent(4)", "replace('a', 'bb')",
                                "selectattr('role', 'equalto', 'user')", "map(attribute='content')", "default('d')"};

std::string expr(Bytes& b, int depth);

std::string atom(Bytes& b, int depth) {
  switch (b.next(10)) {
    case 0: return std::to_string(b.next(200));
    case 1: return "'s" + std::to_string(b.next(10)) + "\\n'";
    case 2: return kNames[b.next(std::size(kNames))];
    case 3: return "[" + expr(b, depth + 1) + ", " + expr(b, depth + 1) + "]";
    case 4: return "{'role': " + expr(b, depth + 1) + ", 'k': " + expr(b, depth + 1) + "}";
    case 5: return "messages[" + std::to_string(static_cast<int>(b.next(6)) - 3) + "]";
    case 6: return "range(" + std::to_string(b.next(50)) + ")";
    case 7: return "namespace(a=" + expr(b, depth + 1) + ")";
    case 8: return "m.content";
    default: return "(" + expr(b, depth + 1) + ")";
  }
}

std::string expr(Bytes& b, int depth) {
  if (depth > 12 || b.done()) return atom(b, 99);
  const std::string a = atom(b, depth);
  switch (b.next(12)) {
    case 0: return a + " ~ " + expr(b, depth + 1);
    case 1: return a + " + " + expr(b, depth + 1);
    case 2: return a + " * " + std::to_string(b.next(5));
    case 3: return a + "|" + kFilters[b.next(std::size(kFilters))];
    case 4: return "not " + a;
    case 5: return a + " if " + expr(b, depth + 1) + " else " + expr(b, depth + 1);
    case 6: return a + " in " + expr(b, depth + 1);
    case 7: return a + " == " + expr(b, depth + 1);
    case 8: return a + " is " + (b.next(2) ? "defined" : "string");
    case 9: return a + "." + (b.next(2) ? "role" : "a");
    case 10: return "mac(" + a + ")";
    default: return a;
  }
}

std::string body(Bytes& b, int depth);

// One construct wrapped `times` times around an inner body (crosses the nesting bounds when large).
std::string wrap(Bytes& b, int depth, int times) {
  std::string open, close;
  switch (b.next(5)) {
    case 0: open = "{% if " + expr(b, 20) + " %}", close = "{% endif %}"; break;
    case 1: open = "{% for x in " + expr(b, 20) + " %}", close = "{% endfor %}"; break;
    case 2: open = "{% set y %}", close = "{% endset %}"; break;
    case 3: open = "{{ (", close = ") }}"; break;
    default: open = "{% with z = 1 %}", close = "{% endwith %}"; break;
  }
  std::string out;
  for (int k = 0; k < times; ++k) out += open;
  out += open.rfind("{{", 0) == 0 ? "1" : body(b, depth + 1);
  for (int k = 0; k < times; ++k) out += close;
  return out;
}

std::string statement(Bytes& b, int depth) {
  switch (b.next(11)) {
    case 0: return "text " + std::to_string(b.next(100)) + "\n";
    case 1: return "{{ " + expr(b, depth) + " }}";
    case 2: return "{% if " + expr(b, depth) + " %}" + body(b, depth + 1) + "{% else %}" + body(b, depth + 1) + "{% endif %}";
    case 3: return "{% for m in messages %}" + body(b, depth + 1) + "{{ loop.index }}{% endfor %}";
    case 4: return "{% for x in " + expr(b, depth) + " %}" + body(b, depth + 1) + "{% if loop.last %}{% break %}{% endif %}{% endfor %}";
    case 5: return "{% set x = " + expr(b, depth) + " %}";
    case 6: return "{% set ns = namespace(a=" + expr(b, depth) + ") %}{% set ns.a = ns.a ~ " + expr(b, depth) + " %}";
    case 7: return "{% macro mac(v) %}" + body(b, depth + 1) + "{{ v }}{% endmacro %}";
    case 8: return "{% set x %}" + body(b, depth + 1) + "{% endset %}";
    case 9: return "{%- generation -%}" + body(b, depth + 1) + "{%- endgeneration %}";
    default: return wrap(b, depth, static_cast<int>(b.next(4)) * 100);  // 0, 100, 200 or 300 levels
  }
}

std::string body(Bytes& b, int depth) {
  if (depth > 8) return "";
  std::string out;
  const unsigned n = b.next(4);
  for (unsigned k = 0; k < n && !b.done(); ++k) out += statement(b, depth);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string src;
  if (size > 0 && data[0] == 0x01) {
    Bytes b(data + 1, size - 1);
    src = "{% macro mac(v) %}[{{ v }}]{% endmacro %}";
    while (!b.done()) src += statement(b, 0);
  } else {
    src.assign(reinterpret_cast<const char*>(data), size);
  }
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "sys"}, {"role": "user", "content": ["a", {"type": "text", "text": "b"}]},
          {"role": "assistant", "content": "reply", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}])");
  static const nlohmann::ordered_json extra = nlohmann::ordered_json::parse(
      R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "bos_token": "<s>"})");
  qshard::ChatTemplateLimits limits;  // small: each input runs in milliseconds
  limits.max_instructions = 200'000;
  limits.max_iterations = 200'000;
  limits.max_output_bytes = 1 << 20;
  limits.max_bytes = 16 << 20;
  try {
    qshard::ChatTemplate t = qshard::ChatTemplate::parse(src, "fuzz.jinja");
    t.set_limits(limits);
    t.set_fixed_time(0);
    t.render(messages, true, extra);
    // The spans (text/chat_template.h's rules): by prefixes, then with rule 3 forced (a 1-byte budget).
    limits.max_spans_bytes = 1 << 20;
    t.set_limits(limits);
    qshard::render_with_spans(t, messages, extra);
    limits.max_spans_bytes = 1;
    t.set_limits(limits);
    qshard::render_with_spans(t, messages, extra);
  } catch (const qshard::InputError&) {
  }
  return 0;
}
