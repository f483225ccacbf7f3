// chat_template.h: a model's chat template (the Jinja2 text Hugging Face models ship), rendered
// natively as transformers' tokenizer.apply_chat_template(messages, tokenize=False, ...) renders it.
//
// What: a Jinja2 interpreter for the subset chat templates use, with the environment transformers
// builds (utils/chat_template_utils.py, transformers 5.x): jinja2's ImmutableSandboxedEnvironment
// with trim_blocks, lstrip_blocks and the loopcontrols extension; `tojson` as json.dumps
// (ensure_ascii=False, indent, separators, sort_keys); globals raise_exception(msg),
// strftime_now(fmt) (the local clock, or set_fixed_time), namespace(...), dict(...), range(...);
// the {% generation %} block renders its body. The variables: the special tokens from_model_dir
// read (bos_token, eos_token, unk_token, pad_token, ... those the config has), then `extra`, then
// messages, add_generation_prompt, tools and documents (none unless `extra` gives them).
// As apply_chat_template does, keys of a message whose value is null are dropped, and a message
// with reasoning under "reasoning_content", "thinking" or "reasoning" gets it under both
// "thinking" and "reasoning_content".
// Supported Jinja: {{ }}, {% %}, {# #} with `-`/`+` whitespace control and jinja2's exact
// trim_blocks/lstrip_blocks rules; if/elif/else, for (loop.*, else, `if` filter, unpacking), set
// (names, tuples, namespace attributes, block set), macro, with, break/continue, raw, generation;
// Python expression semantics (int vs float printing, str/list/dict methods, slicing, chained
// comparisons, `in`, and/or returning operands, x if c else y, non-str dict keys) with jinja2's
// Undefined, markupsafe's Markup (|safe + str escapes the str) and lazy results (map/select/...
// give generators: truthy, no len, no tojson). Refused with an InputError naming the template, line
// and column: include/extends/import/block, call and filter blocks, recursive loops, *args,
// printf-style `str % x`, unknown filters or tests (unless inside an if, as jinja2 defers those).
// Known differences from Python: case mapping covers ASCII, Latin-1, Latin Extended-A, Greek and
// Cyrillic only; repr() escapes the non-printables we list, not unassigned code points; a
// generator can be iterated more than once; a macro called after the scope it was defined in has
// ended sees the top-level variables; integers are 64-bit (overflow is an error).
// Checked byte for byte against transformers on real templates: tests/text/chat_template_test.cpp,
// scripts/golden/make_chat_template_golden.py.
// Strings are UTF-8; lengths, indexes and slices count code points as Python does. Spans
// (ChatRender) are byte offsets into the UTF-8 text.
// Hostile templates and inputs (issue 25): every recursive part (parser, evaluator, printing,
// tojson, comparison, JSON input) is bounded in depth (chat_template_ast.h: statements and
// expressions nested deeper than 200, values deeper than 200, 600 frames at run time) and a render
// runs under the budgets of ChatTemplateLimits; either ends in an InputError "label:line:col: ..."
// naming the construct or the budget, never a crash, hang or out-of-memory kill.
// Thread safety: render() is const and may run on several threads at once (each call has its own
// state; the parsed template is shared, immutable); set_fixed_time() must not race with render().
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/error.h"

namespace qshard {

namespace jinja {
struct Program;
struct RenderTrace;
}

// The budgets of one render. Measured over the 628 golden renders of tests/data/chat_template
// (tests/text/chat_template_limits_test.cpp prints them): at most 689 instructions, 316 iterations,
// 1948 output bytes, 20 KB of values, run-time depth 28 (of kMaxEvalDepth 600). The defaults leave
// margins of 145000x, 63000x, 138000x and 52000x, and a 100k-message conversation renders under
// them (~0.35 s, linear); a hostile template ends within seconds and under ~2 GB.
// The environment variable QSHARD_TEMPLATE_LIMITS overrides them:
// "instructions=N,iterations=N,output=N,bytes=N,spans=N" (any subset, each name at most once; N a
// positive integer; no empty entry).
inline constexpr int64_t kMaxTemplateBudget = int64_t{1} << 40;  // QSHARD_TEMPLATE_LIMITS' largest value

struct ChatTemplateLimits {
  uint64_t max_instructions = 100'000'000;     // statements + expression nodes evaluated
  uint64_t max_iterations = 20'000'000;        // for-loop iterations + builtin element steps (filters, `in`, ...)
  uint64_t max_output_bytes = 256ull << 20;    // bytes written (the output, macro and block-set bodies)
  uint64_t max_bytes = 1ull << 30;             // bytes of strings, lists and dicts created (cumulative)
  // render_with_spans: bytes of all the prefix renders of its rule 2 together (quadratic in the
  // turns: past it, a conversation of thousands of turns goes to the linear rule 3 at once).
  uint64_t max_spans_bytes = 64ull << 20;

  // The defaults with QSHARD_TEMPLATE_LIMITS applied; InputError naming the variable when malformed.
  static ChatTemplateLimits from_env();
};

// What one render used of each budget (render()'s `usage`): for tests and for measuring templates.
struct ChatTemplateUsage {
  uint64_t instructions = 0;
  uint64_t iterations = 0;
  uint64_t output_bytes = 0;
  uint64_t bytes = 0;
  int max_depth = 0;  // the deepest run-time nesting reached (of kMaxEvalDepth)
};

// Thrown when the template calls raise_exception(message); message() is the template's text.
class ChatTemplateRaise : public InputError {
 public:
  ChatTemplateRaise(const std::string& what, std::string message)
      : InputError(what), message_(std::move(message)) {}
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

// A chat template compiled once; render() is const and thread-compatible.
class ChatTemplate {
 public:
  // source: the Jinja text; label: where it came from (a file name) for error messages.
  // Throws InputError "label:line:col: ..." on a syntax error or an unsupported construct.
  static ChatTemplate parse(std::string source, std::string label);
  // Reads DIR/chat_template.jinja, else tokenizer_config.json's "chat_template" (a string, or the
  // entry named "default" of a list of {name, template}), and the special tokens (bos_token,
  // eos_token, ...: strings or AddedToken objects) from tokenizer_config.json, then
  // special_tokens_map.json for those it lacks. Throws InputError naming the folder when there
  // is no template.
  static ChatTemplate from_model_dir(const std::string& dir);

  // messages: a JSON array of {"role": ..., "content": ...} objects (other keys passed through;
  // pass an ordered_json to keep key order where the template iterates over a dict: a
  // nlohmann::json converts implicitly but with its keys sorted). extra: more variables
  // (e.g. tools, date_string, enable_thinking). Throws InputError naming the template, line and
  // column on a runtime error, ChatTemplateRaise when the template raises.
  // usage: when not null, receives what the render used of its budgets (when it succeeds).
  // trace: when not null, receives what the render wrote for each message and each {% generation %}
  // block (chat_template_ast.h; render_with_spans uses it).
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
                     ChatTemplateUsage* usage = nullptr, jinja::RenderTrace* trace = nullptr) const;

  // strftime_now() formats this time (seconds since the epoch, as UTC) instead of reading the local
  // clock: renders that do not change with the day (tests, reproducible data). nullopt: the clock.
  void set_fixed_time(std::optional<std::time_t> utc_seconds) { fixed_time_ = utc_seconds; }

  // The budgets render() runs under (parse() and from_model_dir() start from
  // ChatTemplateLimits::from_env()).
  void set_limits(const ChatTemplateLimits& limits) { limits_ = limits; }
  const ChatTemplateLimits& limits() const { return limits_; }

  const std::string& label() const { return label_; }
  // The special tokens given to the template ({"bos_token": "<s>", ...}; empty after parse()).
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  std::shared_ptr<const jinja::Program> program_;
  std::string label_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  std::optional<std::time_t> fixed_time_;
  ChatTemplateLimits limits_;
};

// The text of render(messages, false) and the byte spans that carry loss in it.
struct ChatRender {
  enum class Rule : uint8_t { kNone, kGeneration, kTurns, kPrefixes };
  std::string text;
  std::vector<std::pair<size_t, size_t>> assistant_spans;  // [begin, end), in order, disjoint
  Rule rule = Rule::kNone;  // how the spans were found (below); kNone: no assistant message
};

// The spans, by the first rule that applies:
// 1. kGeneration: the template has {% generation %} blocks (transformers'
//    return_assistant_tokens_mask): each outermost block's output is a span.
// 2. kPrefixes: for each assistant message i, render(messages[:i], add_generation_prompt=true) is
//    a prefix of render(messages[:i+1]), itself a prefix of the full render; the span is
//    [len(prefix_i), len(render(messages[:i+1]))), starting where the two part when the finished
//    turn does not repeat the whole generation prompt (DeepSeek-R1's "<think>\n"), if that is past
//    render(messages[:i]). Exact, and quadratic in the turns: tried while the prefix renders stay
//    within ChatTemplateLimits::max_spans_bytes (estimated before any runs, counted as they run).
// 3. kTurns, the template's own output per reply, from the one full render: each assistant
//    message is written by exactly one loop iteration over it (the loop variable is that message
//    object); its span is that iteration's output less the generation prompt's text it starts with
//    (G = render(messages[:j], true) past render(messages[:j]), j the first reply; where the turn
//    repeats only part of G the span starts where the two part). Linear: a few more renders. It
//    must agree with rule 2 at the first and the last reply wherever the template is
//    prefix-consistent there. Used when rule 2 finds the template not prefix-consistent (Qwen3
//    drops earlier turns' reasoning, gpt-oss their analysis channel: each reply is then trained as
//    the template renders it in this conversation) or when rule 2 would pass the budget.
// Throws InputError naming the template: an assistant message first (rules 2 and 3); not
// prefix-consistent (rule 2's message, naming the message index) or over the spans budget, when
// rule 3 does not apply either.
ChatRender render_with_spans(const ChatTemplate& t, const nlohmann::ordered_json& messages,
                             const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());
// Rule 2 alone, without the budget (for tests that compare the rules).
ChatRender render_with_spans_by_prefixes(const ChatTemplate& t, const nlohmann::ordered_json& messages,
                                         const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());

}  // namespace qshard
