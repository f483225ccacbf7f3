// The chat-template interpreter against hostile templates and inputs (issue 25; text/chat_template.h):
//  * nesting: each construct nested 100k deep (statements, `not`, signs, parentheses, operator,
//    filter, attribute, call and subscript chains, else-ifs, list/dict literals; JSON input and
//    values the template builds; printing a namespace that holds itself) ends in an InputError
//    naming the template, line and column and "nested deeper than", never a stack overflow;
//  * budgets: runaway loops, doubling strings, exponentially shared values under tojson, huge
//    indents, quadratic appends, huge output each end in an InputError naming the template, line
//    and the budget;
//  * the real templates of tests/data/chat_template stay >= 1000x below every default budget (their
//    measured maxima are printed), and far below the depth bound;
//  * rendering is linear in the messages: the counters for 10k messages are ~10x those for 1k
//    (no timed assertions); render_with_spans refuses a 100k-message conversation at once.
#include "text/chat_template.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"
#include "text/chat_template_ast.h"

namespace qshard {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
const fs::path kDir = QSHARD_CHAT_TEMPLATE_DATA;  // tests/data/chat_template

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  out.reserve(s.size() * n);
  for (int k = 0; k < n; ++k) out += s;
  return out;
}

ojson one_message() { return ojson::array({{{"role", "user"}, {"content", "hi"}}}); }

// The InputError text of parsing + rendering `src` (as template "hostile.jinja"), or "" if none.
std::string error_of(const std::string& src, const ojson& messages = one_message(), const ChatTemplateLimits* limits = nullptr) {
  try {
    ChatTemplate t = ChatTemplate::parse(src, "hostile.jinja");
    if (limits != nullptr) t.set_limits(*limits);
    t.render(messages, false);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

constexpr int kDeep = 100000;

TEST(ChatTemplateLimits, DeepStatementsAreRefusedAtParse) {
  struct Case {
    const char* name;
    std::string open, close;
  };
  const Case cases[] = {
      {"if", "{% if true %}", "{% endif %}"},
      {"for", "{% for x in [1] %}", "{% endfor %}"},
      {"set block", "{% set x %}", "{% endset %}"},
      {"macro", "{% macro m() %}", "{% endmacro %}"},
      {"with", "{% with a = 1 %}", "{% endwith %}"},
      {"generation", "{% generation %}", "{% endgeneration %}"},
  };
  for (const auto& c : cases) {
    const std::string err = error_of(repeat(c.open, kDeep) + "x" + repeat(c.close, kDeep));
    EXPECT_NE(err.find("hostile.jinja:1:"), std::string::npos) << c.name << ": " << err;
    EXPECT_NE(err.find("statements nested deeper than 200 levels"), std::string::npos) << c.name << ": " << err;
  }
}

TEST(ChatTemplateLimits, DeepExpressionsAreRefusedAtParse) {
  struct Case {
    const char* name;
    std::string src;
  };
  const Case cases[] = {
      {"not", "{{ " + repeat("not ", kDeep) + "x }}"},
      {"minus", "{{ " + repeat("- ", kDeep) + "1 }}"},
      {"parentheses", "{{ " + repeat("(", kDeep) + "1" + repeat(")", kDeep) + " }}"},
      {"lists", "{{ " + repeat("[", kDeep) + repeat("]", kDeep) + " }}"},
      {"dicts", "{{ " + repeat("{'a': ", kDeep) + "1" + repeat("}", kDeep) + " }}"},
      {"plus", "{{ 1" + repeat(" + 1", kDeep) + " }}"},
      {"times", "{{ 1" + repeat(" * 1", kDeep) + " }}"},
      {"and", "{{ x" + repeat(" and x", kDeep) + " }}"},
      {"or", "{{ x" + repeat(" or x", kDeep) + " }}"},
      {"filters", "{{ 'a'" + repeat("|lower", kDeep) + " }}"},
      {"attributes", "{{ a" + repeat(".b", kDeep) + " }}"},
      {"subscripts", "{{ a" + repeat("[0]", kDeep) + " }}"},
      {"calls", "{{ f" + repeat("()", kDeep) + " }}"},
      {"tests", "{{ (x" + repeat(" is defined) is sameas (true", kDeep) + ") }}"},
      {"inline if", "{{ 1" + repeat(" if x else 1", kDeep) + " }}"},
      {"set", "{% set y = " + repeat("not ", kDeep) + "x %}"},
  };
  for (const auto& c : cases) {
    const std::string err = error_of(c.src);
    EXPECT_NE(err.find("hostile.jinja:1:"), std::string::npos) << c.name << ": " << err.substr(0, 300);
    EXPECT_NE(err.find("nested deeper than 200 levels"), std::string::npos) << c.name << ": " << err.substr(0, 300);
  }
  // Flat chains (~ and comparisons are n-ary nodes) are not deep: they render.
  EXPECT_EQ(error_of("{{ 'a'" + repeat(" ~ 'a'", kDeep) + " }}"), "");
  EXPECT_EQ(error_of("{{ 1" + repeat(" < 2", 1000) + " }}"), "");
}

TEST(ChatTemplateLimits, DeepValuesAreRefused) {
  // A message content that is a JSON array nested 100k deep, printed or through tojson.
  // (parsed from text: nlohmann copies recursively but parses and destroys iteratively)
  const ojson messages = ojson::parse("[{\"role\": \"user\", \"content\": " + repeat("[", kDeep) + repeat("]", kDeep) + "}]");
  for (const char* src : {"{{ messages[0].content }}", "{{ messages[0].content|tojson }}"}) {
    const std::string err = error_of(src, messages);
    EXPECT_NE(err.find("hostile.jinja: messages[0]: JSON nested deeper than 200 levels"), std::string::npos) << err;
  }
  // A list the template nests 100k deep, one level per loop iteration.
  std::string err = error_of(
      "{% set ns = namespace(l=[]) %}\n{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}");
  EXPECT_NE(err.find("hostile.jinja:2:"), std::string::npos) << err;
  EXPECT_NE(err.find("a list or dict nested deeper than 200 levels"), std::string::npos) << err;
  // A namespace that holds itself, printed.
  err = error_of("{% set ns = namespace() %}{% set ns.me = ns %}\n  {{ ns }}");
  EXPECT_NE(err.find("hostile.jinja:2:3: printed values nested deeper than 600 levels at run time"), std::string::npos) << err;
  // Deep recursion through macros: each call several frames deep.
  err = error_of("{% macro m(n) %}{{ (((((((((( m(n + 1) )))))))))) }}{% endmacro %}{{ m(0) }}");
  EXPECT_NE(err.find("hostile.jinja:1:"), std::string::npos) << err;
  EXPECT_TRUE(err.find("nested deeper than 600 levels at run time") != std::string::npos ||
              err.find("macro calls nested too deeply") != std::string::npos)
      << err;
}

// A budget error names the template, the line and the budget.
void expect_budget(const std::string& src, const char* budget, int line, const ChatTemplateLimits* limits = nullptr) {
  const std::string err = error_of(src, one_message(), limits);
  EXPECT_NE(err.find("hostile.jinja:" + std::to_string(line) + ":"), std::string::npos) << src.substr(0, 120) << ": " << err;
  EXPECT_NE(err.find(budget), std::string::npos) << src.substr(0, 120) << ": " << err;
}

TEST(ChatTemplateLimits, RunawayTemplatesHitABudget) {
  ChatTemplateLimits small;  // smaller budgets: the same code paths, quicker
  small.max_instructions = 2'000'000;
  small.max_iterations = 1'000'000;
  small.max_output_bytes = 16 << 20;
  small.max_bytes = 64 << 20;
  const char* const mem = "over its memory budget";
  // Loops: nested ranges, and range(10**10) refused up front.
  const std::string nested = "{% set r = range(100000) %}\n{% for i in r %}{% for j in r %}";
  expect_budget(nested + "{% endfor %}{% endfor %}", "iteration budget", 2, &small);
  expect_budget("{{ 1 }}\n{% for i in range(10**10) %}{% endfor %}", "range too big", 2);
  // tojson's indent past 65536 spaces and round's precision past any double's digits: refused or
  // Python's value (was: clamped in silence, NaN).
  EXPECT_NE(error_of("{{ [1] | tojson(indent=10**12) }}").find("indent 1000000000000 is past the 65536"), std::string::npos);
  for (const auto& [src, want] :
       {std::pair<std::string, std::string>{"{{ 1.5 | round(10**9) }}", "1.5"}, {"{{ -1.5 | round(-10**9) }}", "-0.0"},
        {"{{ 1.25 | round(1) }}", "1.2"}, {"{{ 1e308 | round(320) }}", "1e+308"}}) {
    ChatTemplate t = ChatTemplate::parse(src, "round.jinja");
    EXPECT_EQ(t.render(one_message(), false), want) << src;
  }
  EXPECT_NE(error_of("{{ 1.5 | round(10**9, 'ceil') }}").find("out of range for ceil"), std::string::npos);
  // Steps past half the int64 range: the items Python gives, no wrapped loop.
  for (const auto& [args, want] :
       {std::pair<std::string, std::string>{"0, 9223372036854775807, 4611686018427387904", "[0, 4611686018427387904]"},
        {"-9223372036854775807 - 1, 9223372036854775807, 9223372036854775807",
         "[-9223372036854775808, -1, 9223372036854775806]"},
        {"9223372036854775807, -9223372036854775807 - 1, -9223372036854775807 - 1", "[9223372036854775807, -1]"},
        {"5, 1", "[]"}, {"5, 1, -2", "[5, 3]"}, {"3", "[0, 1, 2]"}}) {
    ChatTemplate t = ChatTemplate::parse("{{ range(" + args + ") | list }}", "range.jinja");
    EXPECT_EQ(t.render(one_message(), false), want) << args;
  }
  ChatTemplateLimits few_instructions = small;
  few_instructions.max_iterations = 100'000'000;
  expect_budget(nested + "{% if j %}{% endif %}{% endfor %}{% endfor %}", "instruction budget", 2, &few_instructions);
  // A string doubled 40 times; a list doubled 40 times.
  expect_budget("{% set ns = namespace(s='a') %}{% for i in range(40) %}\n{% set ns.s = ns.s ~ ns.s %}{% endfor %}", mem, 2, &small);
  expect_budget("{% set ns = namespace(s=[1]) %}{% for i in range(40) %}\n{% set ns.s = ns.s + ns.s %}{% endfor %}", mem, 2, &small);
  expect_budget("{% set ns = namespace(s='ab') %}{% for i in range(40) %}\n{% set ns.s = ns.s * 2 %}{% endfor %}", mem, 2, &small);
  // Quadratic appends.
  expect_budget("{% set ns = namespace(s='') %}{% for i in range(100000) %}\n{% set ns.s = ns.s ~ 'xxxxxxxxxxxxxxxx' %}{% endfor %}",
                mem, 2, &small);
  expect_budget("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}\n{% set ns.l = ns.l + [i] %}{% endfor %}", mem, 2, &small);
  // A value shared 2^60 ways: tojson, print, comparison.
  const std::string shared = "{% set ns = namespace(l=['x']) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}\n";
  expect_budget(shared + "{{ ns.l|tojson }}", mem, 2, &small);
  expect_budget(shared + "{{ ns.l }}", mem, 2, &small);
  expect_budget(shared + "{{ ns.l == [ns.l[0], ns.l[1]] }}", "iteration budget", 2, &small);
  expect_budget(shared + "{{ ns.l|string|length }}", mem, 2, &small);
  // indent with a huge width on many lines; join and replace that multiply.
  expect_budget("{% set s = 'a\\n' * 100000 %}\n{{ s|indent(10**12) }}", mem, 2, &small);
  expect_budget("{% set s = 'a' * 100000 %}\n{{ ([s] * 100000)|join }}", mem, 2, &small);
  expect_budget("{% set s = 'a' * 100000 %}\n{{ s.replace('', s) }}", mem, 2, &small);
  // Output: 100k x 10 KB.
  expect_budget("{% for i in range(100000) %}\n{{ 'x' * 10000 }}{% endfor %}", "output budget", 2, &small);
  // The error says how to raise the budget.
  expect_budget(nested + "{% endfor %}{% endfor %}", "QSHARD_TEMPLATE_LIMITS=iterations=N", 2, &small);
}

TEST(ChatTemplateLimits, EnvironmentOverridesTheDefaults) {
  ::setenv("QSHARD_TEMPLATE_LIMITS", "instructions=123,bytes=4567", 1);
  const ChatTemplateLimits l = ChatTemplateLimits::from_env();
  EXPECT_EQ(l.max_instructions, 123u);
  EXPECT_EQ(l.max_bytes, 4567u);
  EXPECT_EQ(l.max_iterations, ChatTemplateLimits{}.max_iterations);
  EXPECT_NE(error_of("{{ 1 + 1 + 1 }}{{ 1 + 1 + 1 }}{{ 1 + 1 + 1 }}" + repeat("{{ 1 }}", 200)).find("instruction budget (123;"),
            std::string::npos);
  // Each refusal names the variable and the entry (or what is wrong with the whole text).
  for (auto [bad, names] : std::initializer_list<std::pair<const char*, const char*>>{
           {"instructions=-1", "instructions"},
           {"instructions=", "instructions"},
           {"instructions", "instructions"},
           {"steps=5", "unknown budget 'steps'"},
           {"=5", "unknown budget ''"},
           {"bytes=12x", "bytes"},
           {"bytes= 12", "bytes"},
           {"output=0", "output"},
           {"bytes=18446744073709551615", "bytes"},
           {"bytes=1099511627777", "bytes"},
           {"bytes=5,bytes=6", "budget 'bytes' given twice (entry 'bytes=6')"},
           {"bytes=5,output=7,bytes=5", "budget 'bytes' given twice"},
           {"bytes=5,", "an empty entry"},
           {",bytes=5", "an empty entry"},
           {"bytes=5,,output=7", "an empty entry"},
           {",", "an empty entry"}}) {
    ::setenv("QSHARD_TEMPLATE_LIMITS", bad, 1);
    try {
      ChatTemplateLimits::from_env();
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("QSHARD_TEMPLATE_LIMITS"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << bad << ": " << e.what();
    }
  }
  ::setenv("QSHARD_TEMPLATE_LIMITS", "instructions=7,iterations=8,output=9,bytes=10,spans=11", 1);
  const ChatTemplateLimits all = ChatTemplateLimits::from_env();
  EXPECT_EQ(all.max_instructions + all.max_iterations + all.max_output_bytes + all.max_bytes + all.max_spans_bytes,
            45u);
  ::unsetenv("QSHARD_TEMPLATE_LIMITS");
}

const ojson& golden() {
  static const ojson g = ojson::parse(read_text(kDir / "golden.json"));
  return g;
}

ojson variables(const ojson& tmpl, const ojson& conv) {
  ojson extra = ojson::object();
  for (const auto* part : {&tmpl["special_tokens"], &tmpl["extra"], &conv["extra"]}) {
    for (auto it = part->begin(); it != part->end(); ++it) extra[it.key()] = it.value();
  }
  return extra;
}

// Every golden render's usage: the maxima, printed, are >= 1000x below the defaults.
TEST(ChatTemplateLimits, RealTemplatesAreFarBelowTheBudgets) {
  ChatTemplateUsage most;
  std::string where[5];
  int renders = 0;
  for (const auto& tmpl : golden()["templates"]) {
    const std::string file = tmpl["file"].get<std::string>();
    ChatTemplate t = ChatTemplate::parse(read_text(kDir / file), file);
    t.set_fixed_time(golden()["fixed_time_utc"].get<std::time_t>());
    for (const auto& r : tmpl["renders"]) {
      if (!r.contains("text")) continue;
      const ojson* conv = nullptr;
      for (const auto& c : golden()["conversations"]) {
        if (c["name"] == r["conversation"]) conv = &c;
      }
      ASSERT_NE(conv, nullptr);
      ChatTemplateUsage u;
      t.render((*conv)["messages"], r["add_generation_prompt"].get<bool>(), variables(tmpl, *conv), &u);
      ++renders;
      const std::string what = file + " x " + r["conversation"].get<std::string>();
      auto keep = [&](uint64_t v, uint64_t& m, std::string& w) {
        if (v > m) m = v, w = what;
      };
      keep(u.instructions, most.instructions, where[0]);
      keep(u.iterations, most.iterations, where[1]);
      keep(u.output_bytes, most.output_bytes, where[2]);
      keep(u.bytes, most.bytes, where[3]);
      if (u.max_depth > most.max_depth) most.max_depth = u.max_depth, where[4] = what;
    }
  }
  const ChatTemplateLimits d;
  std::printf("over %d golden renders, the most used: instructions %llu (%s), iterations %llu (%s), output %llu bytes (%s), "
              "memory %llu bytes (%s), run-time depth %d (%s)\n",
              renders, (unsigned long long)most.instructions, where[0].c_str(), (unsigned long long)most.iterations, where[1].c_str(),
              (unsigned long long)most.output_bytes, where[2].c_str(), (unsigned long long)most.bytes, where[3].c_str(),
              most.max_depth, where[4].c_str());
  EXPECT_GT(renders, 500);
  EXPECT_LE(most.instructions * 1000, d.max_instructions);
  EXPECT_LE(most.iterations * 1000, d.max_iterations);
  EXPECT_LE(most.output_bytes * 1000, d.max_output_bytes);
  EXPECT_LE(most.bytes * 1000, d.max_bytes);
  EXPECT_LE(most.max_depth * 10, jinja::kMaxEvalDepth);
}

ojson chat(int n) {
  ojson m = ojson::array();
  for (int i = 0; i < n; ++i) {
    m.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", "message number " + std::to_string(i)}});
  }
  return m;
}

// Every counter grows at most linearly with the messages (10k messages: <= 12x the counts of 1k), for
// every real template that renders a plain conversation; 100k messages render under the defaults.
TEST(ChatTemplateLimits, RenderingIsLinearInTheMessages) {
  const ojson small = chat(1000), large = chat(10000), huge = chat(100000);
  const ojson extra = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(kDir / "templates")) {
    const std::string name = entry.path().filename().string();
    ChatTemplate t = ChatTemplate::parse(read_text(entry.path()), name);
    t.set_fixed_time(0);
    ChatTemplateUsage a, b;
    try {
      t.render(small, true, extra, &a);
    } catch (const InputError&) {
      continue;  // needs other variables (tools, ...)
    }
    t.render(large, true, extra, &b);
    // Upper bounds: nothing grows faster than the messages (a fixed part makes some ratios < 10).
    const std::pair<const char*, std::pair<uint64_t, uint64_t>> counts[] = {
        {"instructions", {a.instructions, b.instructions}}, {"iterations", {a.iterations, b.iterations}},
        {"output", {a.output_bytes, b.output_bytes}}, {"bytes", {a.bytes, b.bytes}}};
    for (const auto& [what, ab] : counts) {
      EXPECT_LE(ab.second, 12 * std::max<uint64_t>(ab.first, 1)) << name << " " << what;
    }
    EXPECT_GE(b.instructions, 8 * a.instructions) << name;  // the messages are really rendered
    EXPECT_LE(b.max_depth, a.max_depth) << name;
    EXPECT_NO_THROW(t.render(huge, true, extra)) << name;
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

// render_with_spans's rule 2 renders each reply's prefix (quadratic in the turns): a conversation
// whose prefix renders would be over the spans budget goes to rule 3 (the template's own turns, one
// render: linear) at once, or, for a template that does not write each reply in a loop iteration of
// its own, is refused at once, before any prefix render runs.
TEST(ChatTemplateLimits, SpansOfHugeConversationsAreLinearOrRefusedAtOnce) {
  const ChatTemplate t = ChatTemplate::parse(read_text(kDir / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"), "qwen.jinja");
  const ChatRender big = render_with_spans(t, chat(100000));
  EXPECT_EQ(big.rule, ChatRender::Rule::kTurns);
  ASSERT_EQ(big.assistant_spans.size(), 50000u);
  // The same spans as rule 2 where both run (200 messages).
  const ChatRender small = render_with_spans(t, chat(200));
  EXPECT_EQ(small.rule, ChatRender::Rule::kPrefixes);
  ChatTemplate forced = t;
  ChatTemplateLimits limits = t.limits();
  limits.max_spans_bytes = 1;
  forced.set_limits(limits);
  const ChatRender turns = render_with_spans(forced, chat(200));
  EXPECT_EQ(turns.rule, ChatRender::Rule::kTurns);
  EXPECT_EQ(turns.assistant_spans, small.assistant_spans);
  EXPECT_EQ(big.text.substr(big.assistant_spans.back().first), "message number 99999<|im_end|>\n");
  // A template that indexes the messages instead of looping over them: no turns to trace.
  const ChatTemplate indexed = ChatTemplate::parse(
      "{% for i in range(messages | length) %}<{{ messages[i].role }}>{{ messages[i].content }}{% endfor %}", "indexed.jinja");
  try {
    render_with_spans(indexed, chat(100000));
    ADD_FAILURE() << "100k messages: spans rendered";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("indexed.jinja: the per-reply spans of this conversation (100000 messages"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("need about"), std::string::npos) << e.what();  // the estimate, before any render
    EXPECT_NE(std::string(e.what()).find("over the spans budget"), std::string::npos) << e.what();
  }
  EXPECT_EQ(render_with_spans(indexed, chat(200)).assistant_spans.size(), 100u);
}

}  // namespace
}  // namespace qshard
