// The native chat-template renderer (text/chat_template.h) against transformers:
//  * golden: for every real template of tests/data/chat_template/templates (llama-cpp-python
//    0.3.36's copies of the models' templates, and SmolLM2-Instruct's) x every conversation of
//    golden.json x add_generation_prompt false/true, the render equals transformers'
//    apply_chat_template(..., tokenize=False) byte for byte (the first differing byte and its
//    context are printed otherwise); where transformers raised, we raise (raise_exception: the same
//    message); render_with_spans gives the spans scripts/golden/make_chat_template_golden.py computed, or
//    raises where it could not. strftime_now() is fixed at the golden's clock on both sides.
//  * the Jinja subset: whitespace control, trim/lstrip blocks, loops, namespace, slicing, filters,
//    tests, methods, undefined; the expected strings are what jinja2 3.1.6 renders in transformers'
//    environment (computed with it, pasted here).
//  * errors: a syntax error names the template, line and column; malformed templates and every
//    truncation of the real templates give InputError, never a crash.
#include "text/chat_template.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"
#include "common/json_mutations.h"
#include "common/test_util.h"

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

const ojson& golden() {
  static const ojson g = ojson::parse(read_text(kDir / "golden.json"));
  return g;
}

const ojson& conversation(const std::string& name) {
  for (const auto& c : golden()["conversations"]) {
    if (c["name"] == name) return c;
  }
  throw std::runtime_error("golden.json: no conversation " + name);
}

// The template's special tokens and variables, then the conversation's.
ojson variables(const ojson& tmpl, const ojson& conv) {
  ojson extra = ojson::object();
  for (const auto* part : {&tmpl["special_tokens"], &tmpl["extra"], &conv["extra"]}) {
    for (auto it = part->begin(); it != part->end(); ++it) extra[it.key()] = it.value();
  }
  return extra;
}

std::string escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20) out += "\\x" + std::string(1, "0123456789abcdef"[c >> 4]) + "0123456789abcdef"[c & 15];
    else out += static_cast<char>(c);
  }
  return out;
}

// "" when equal, else the first differing byte offset and 40 bytes of context from each side.
std::string first_difference(const std::string& want, const std::string& got) {
  if (want == got) return "";
  size_t k = 0;
  while (k < want.size() && k < got.size() && want[k] == got[k]) ++k;
  const size_t from = k > 40 ? k - 40 : 0;
  std::ostringstream ss;
  ss << "first difference at byte " << k << " (want " << want.size() << " bytes, got " << got.size() << ")\n"
     << "  want: ..." << escaped(want.substr(from, k - from)) << "[[" << escaped(want.substr(k, 40)) << "]]\n"
     << "  got:  ..." << escaped(got.substr(from, k - from)) << "[[" << escaped(got.substr(k, 40)) << "]]";
  return ss.str();
}

// The template of a golden entry, with strftime_now() fixed at the golden's clock.
ChatTemplate load(const ojson& tmpl) {
  const std::string file = tmpl["file"].get<std::string>();
  ChatTemplate t = ChatTemplate::parse(read_text(kDir / file), file);
  t.set_fixed_time(golden()["fixed_time_utc"].get<std::time_t>());
  return t;
}

TEST(ChatTemplateGolden, RendersMatchTransformers) {
  ASSERT_GE(golden()["templates"].size(), 10u);
  int texts = 0, raises = 0, errors = 0;
  for (const auto& tmpl : golden()["templates"]) {
    const std::string name = tmpl["name"].get<std::string>();
    SCOPED_TRACE(name);
    const ChatTemplate t = load(tmpl);
    for (const auto& r : tmpl["renders"]) {
      const ojson& conv = conversation(r["conversation"].get<std::string>());
      const bool agp = r["add_generation_prompt"].get<bool>();
      const std::string what = name + " x " + r["conversation"].get<std::string>() + " x add_generation_prompt=" + (agp ? "true" : "false");
      const ojson extra = variables(tmpl, conv);
      if (r.contains("text")) {
        std::string got;
        try {
          got = t.render(conv["messages"], agp, extra);
        } catch (const std::exception& e) {
          ADD_FAILURE() << what << ": threw " << e.what();
          continue;
        }
        const std::string diff = first_difference(r["text"].get<std::string>(), got);
        EXPECT_TRUE(diff.empty()) << what << ": " << diff;
        ++texts;
      } else if (r.contains("raise")) {
        try {
          const std::string got = t.render(conv["messages"], agp, extra);
          ADD_FAILURE() << what << ": expected raise_exception(\"" << r["raise"].get<std::string>() << "\"), rendered "
                        << escaped(got.substr(0, 200));
        } catch (const ChatTemplateRaise& e) {
          EXPECT_EQ(e.message(), r["raise"].get<std::string>()) << what;
          EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
        }
        ++raises;
      } else {
        EXPECT_THROW(t.render(conv["messages"], agp, extra), InputError) << what << " (transformers: " << r["error"] << ")";
        ++errors;
      }
    }
  }
  std::printf("golden renders: %d equal byte for byte, %d raise_exception, %d other errors\n", texts, raises, errors);
  EXPECT_GT(texts, 550);
}

// Rule 3's spans (no golden to compare): in order and disjoint, one per assistant message, each
// holding the reply's visible text (its content past any "</think>", trimmed) and no other
// message's content.
void check_turn_spans(const ojson& messages, const ChatRender& r, const std::string& what) {
  std::vector<size_t> replies;
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i]["role"] == "assistant") replies.push_back(i);
  ASSERT_EQ(r.assistant_spans.size(), replies.size()) << what;
  size_t last = 0;
  for (size_t k = 0; k < replies.size(); ++k) {
    const auto [b, e] = r.assistant_spans[k];
    ASSERT_LE(last, b) << what;
    ASSERT_LE(b, e) << what;
    ASSERT_LE(e, r.text.size()) << what;
    last = e;
    const std::string span = r.text.substr(b, e - b);
    const ojson& m = messages[replies[k]];
    if (m.contains("content") && m["content"].is_string()) {
      std::string visible = m["content"].get<std::string>();
      if (const size_t p = visible.rfind("</think>"); p != std::string::npos) visible = visible.substr(p + 8);
      while (!visible.empty() && std::isspace(static_cast<unsigned char>(visible.front()))) visible.erase(0, 1);
      while (!visible.empty() && std::isspace(static_cast<unsigned char>(visible.back()))) visible.pop_back();
      EXPECT_NE(span.find(visible), std::string::npos) << what << ": reply " << replies[k] << " not in its span '" << span << "'";
    }
    for (size_t i = 0; i < messages.size(); ++i) {
      if (messages[i]["role"] == "assistant" || !messages[i].contains("content") || !messages[i]["content"].is_string()) continue;
      const std::string other = messages[i]["content"].get<std::string>();
      if (other.size() >= 8) EXPECT_EQ(span.find(other), std::string::npos) << what << ": message " << i << " in reply " << replies[k] << "'s span";
    }
  }
}

TEST(ChatTemplateGolden, SpansMatchTransformers) {
  int sets = 0, turns = 0, errors = 0;
  for (const auto& tmpl : golden()["templates"]) {
    const std::string name = tmpl["name"].get<std::string>();
    const ChatTemplate t = load(tmpl);
    for (const auto& s : tmpl["spans"]) {
      const ojson& conv = conversation(s["conversation"].get<std::string>());
      const std::string what = name + " x " + s["conversation"].get<std::string>();
      if (s.contains("spans")) {
        ChatRender r;
        try {
          r = render_with_spans(t, conv["messages"], variables(tmpl, conv));
        } catch (const std::exception& e) {
          ADD_FAILURE() << what << ": threw " << e.what();
          continue;
        }
        std::vector<std::pair<size_t, size_t>> want;
        for (const auto& p : s["spans"]) want.emplace_back(p[0].get<size_t>(), p[1].get<size_t>());
        EXPECT_EQ(r.assistant_spans, want) << what;
        for (const auto& [b, e] : r.assistant_spans) {
          ASSERT_LE(b, e);
          ASSERT_LE(e, r.text.size());
        }
        ++sets;
        EXPECT_EQ(r.rule, want.empty() ? ChatRender::Rule::kNone : ChatRender::Rule::kPrefixes) << what;
      } else if (s["error"].get<std::string>().find("is not a prefix of") != std::string::npos) {
        // Not prefix-consistent (the golden's rule 2 raised): rule 3 gives the spans where each reply
        // is one loop iteration of its own, else we raise too.
        ChatRender r;
        try {
          r = render_with_spans(t, conv["messages"], variables(tmpl, conv));
        } catch (const InputError& e) {
          EXPECT_NE(std::string(e.what()).find("is not a prefix of"), std::string::npos) << what << ": " << e.what();
          ++errors;
          continue;
        }
        EXPECT_EQ(r.rule, ChatRender::Rule::kTurns) << what;
        check_turn_spans(conv["messages"], r, what);
        ++turns;
      } else {
        EXPECT_THROW(render_with_spans(t, conv["messages"], variables(tmpl, conv)), InputError)
            << what << " (python: " << s["error"] << ")";
        ++errors;
      }
    }
  }
  std::printf("golden spans: %d span sets equal, %d by turns where the template is not prefix-consistent, %d raise\n",
              sets, turns, errors);
  EXPECT_GT(sets, 200);
  EXPECT_GE(turns, 20);
}

// Rule 3 (the template's own turns) forced by a spans budget of 1 byte: on every golden conversation
// where rule 2 gives spans, rule 3 gives the same ones, or refuses (over the budget) when a template
// does not write each reply in a loop iteration of its own.
TEST(ChatTemplateGolden, TurnSpansEqualPrefixSpans) {
  int equal = 0, refused = 0;
  for (const auto& tmpl : golden()["templates"]) {
    ChatTemplate t = load(tmpl);
    ChatTemplateLimits limits = t.limits();
    limits.max_spans_bytes = 1;
    t.set_limits(limits);
    for (const auto& s : tmpl["spans"]) {
      if (!s.contains("spans") || s["spans"].empty()) continue;
      const ojson& conv = conversation(s["conversation"].get<std::string>());
      const std::string what = tmpl["name"].get<std::string>() + " x " + s["conversation"].get<std::string>();
      std::vector<std::pair<size_t, size_t>> want;
      for (const auto& p : s["spans"]) want.emplace_back(p[0].get<size_t>(), p[1].get<size_t>());
      try {
        const ChatRender r = render_with_spans(t, conv["messages"], variables(tmpl, conv));
        EXPECT_EQ(r.rule, ChatRender::Rule::kTurns) << what;
        EXPECT_EQ(r.assistant_spans, want) << what;
        ++equal;
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("over the spans budget"), std::string::npos) << what << ": " << e.what();
        std::printf("REFUSED %s\n", what.c_str());
        ++refused;
      }
    }
  }
  std::printf("rule 3 forced: %d span sets equal to rule 2's, %d refused\n", equal, refused);
  EXPECT_GE(equal, 170);
}

// Templates that render earlier turns unlike the last: each reply's span is what the template wrote
// for it (Qwen3: an empty think block on the last reply only; Phi-3.5: eos_token after the last).
TEST(ChatTemplateGolden, TurnSpansOfTemplatesThatAreNotPrefixConsistent) {
  struct Case {
    const char* name;
    std::vector<std::string> spans;
  };
  const Case cases[] = {
      {"Qwen-Qwen3-0.6B", {"7 is a prime number.<|im_end|>\n", "<think>\n\n</think>\n\n2 is the only even prime.<|im_end|>\n"}},
      {"microsoft-Phi-3.5-mini-instruct", {"7 is a prime number.<|end|>\n", "2 is the only even prime.<|end|>\n<|endoftext|>"}},
      {"openai-gpt-oss-120b",
       {"<|channel|>final<|message|>7 is a prime number.<|end|>", "<|channel|>final<|message|>2 is the only even prime.<|return|>"}}};
  for (const Case& c : cases) {
    const ojson* tmpl = nullptr;
    for (const auto& x : golden()["templates"])
      if (x["name"] == c.name) tmpl = &x;
    ASSERT_NE(tmpl, nullptr) << c.name;
    const ChatTemplate t = load(*tmpl);
    const ojson& conv = conversation("multi_turn_end_assistant");
    EXPECT_THROW(render_with_spans_by_prefixes(t, conv["messages"], variables(*tmpl, conv)), InputError) << c.name;
    const ChatRender r = render_with_spans(t, conv["messages"], variables(*tmpl, conv));
    EXPECT_EQ(r.rule, ChatRender::Rule::kTurns) << c.name;
    std::vector<std::string> got;
    for (auto [b, e] : r.assistant_spans) got.push_back(r.text.substr(b, e - b));
    EXPECT_EQ(got, c.spans) << c.name;
  }
}

// {% generation %} blocks decide the spans when a template has them, as transformers'
// return_assistant_tokens_mask: their output, whatever the prefixes do.
TEST(ChatTemplate, GenerationBlocksAreTheSpans) {
  const ChatTemplate t = ChatTemplate::parse(
      "{% for m in messages %}{% if m.role == 'assistant' %}<A>{% generation %}{{ m.content }}!{% endgeneration %}"
      "{% else %}<U>{{ m.content }}{% endif %}{% endfor %}{% if add_generation_prompt %}<A>{% endif %}",
      "gen.jinja");
  const ojson conv = ojson::parse(R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                      {"role": "user", "content": "x"}, {"role": "assistant", "content": "z"}])");
  const ChatRender r = render_with_spans(t, conv);
  EXPECT_EQ(r.text, "<U>hi<A>yo!<U>x<A>z!");
  EXPECT_EQ(r.rule, ChatRender::Rule::kGeneration);
  EXPECT_EQ(r.assistant_spans, (std::vector<std::pair<size_t, size_t>>{{8, 11}, {18, 20}}));
  // A generation block inside a macro or a block set does not write the render's output: no span
  // from it (rule 2 decides this prefix-consistent template).
  const ChatTemplate m = ChatTemplate::parse(
      "{% set x %}{% generation %}no{% endgeneration %}{% endset %}{% for m in messages %}{{ m.content }}{% endfor %}",
      "set.jinja");
  EXPECT_EQ(render_with_spans(m, ojson::parse(R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])")).rule,
            ChatRender::Rule::kPrefixes);
}

// The assistant text itself lies inside its span (ChatML and Llama 3 layouts).
TEST(ChatTemplateGolden, SpansCoverAssistantText) {
  for (const char* name : {"Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct"}) {
    const ChatTemplate t = ChatTemplate::parse(read_text(kDir / "templates" / (std::string(name) + ".jinja")), name);
    const ojson& conv = conversation("multi_turn_end_assistant");
    const ChatRender r = render_with_spans(t, conv["messages"], {{"date_string", "26 Jul 2024"}});
    ASSERT_EQ(r.assistant_spans.size(), 2u);
    EXPECT_EQ(r.text.substr(r.assistant_spans[0].first, 20), "7 is a prime number.") << name;
    EXPECT_EQ(r.text.substr(r.assistant_spans[1].first, 25), "2 is the only even prime.") << name;
  }
}

const ojson* find_render(const std::string& tmpl_name, const std::string& conv, bool agp) {
  for (const auto& tmpl : golden()["templates"]) {
    if (tmpl["name"] != tmpl_name) continue;
    for (const auto& r : tmpl["renders"]) {
      if (r["conversation"] == conv && r["add_generation_prompt"] == agp) return &r;
    }
  }
  return nullptr;
}

// The folder's JSON side files are parsed with the nesting bounded (runtime/input_file.h): a
// tokenizer_config.json or special_tokens_map.json nested 100k deep is an InputError naming the
// file, not a stack overflow.
TEST(ChatTemplateModelDir, DeepSideFilesAreRefusedByName) {
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    testing_util::TempDir dir;
    const fs::path root = fs::path(dir.file("model"));
    fs::create_directories(root);
    testing_util::write_bytes((root / "chat_template.jinja").string(), "{{ messages[0]['content'] }}");
    testing_util::write_bytes((root / name).string(), std::string(100000, '[') + std::string(100000, ']'));
    try {
      ChatTemplate::from_model_dir(root.string());
      ADD_FAILURE() << name << ": expected InputError";
    } catch (const InputError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(name), std::string::npos) << m;
      EXPECT_NE(m.find("nested more than"), std::string::npos) << m;
    }
  }
}

// Every one-node damage of tokenizer_config.json (the template list, the special tokens) and of
// special_tokens_map.json: loads, or is an InputError naming the file; a special token of another
// type than a string or {"content": ...} was taken as unset in silence.
TEST(ChatTemplateModelDir, DamagedSideFilesAreRefusedByName) {
  const ojson config = ojson::parse(R"({"chat_template": [{"name": "default", "template": "{{ bos_token }}"},
      {"name": "rag", "template": "x"}], "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>"})");
  const ojson map = ojson::parse(R"({"unk_token": {"content": "<unk>"}, "pad_token": "<pad>"})");
  size_t refused = 0;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    test::for_each_mutation<ojson>(name[0] == 't' ? config : map, [&](const ojson& damaged, const std::string& what) {
      testing_util::TempDir dir;
      const fs::path root = fs::path(dir.file("model"));
      fs::create_directories(root);
      testing_util::write_bytes((root / "tokenizer_config.json").string(), (name[0] == 't' ? damaged : config).dump());
      testing_util::write_bytes((root / "special_tokens_map.json").string(), (name[0] == 't' ? map : damaged).dump());
      try {
        ChatTemplate::from_model_dir(root.string());
      } catch (const InputError& e) {
        ++refused;
        const std::string m = e.what();
        EXPECT_NE(m.find(name), std::string::npos) << what << ": " << m;  // no template at all: the folder
      } catch (const std::exception& e) {
        ADD_FAILURE() << name << " " << what << ": not an InputError: " << e.what();
      }
    });
  }
  EXPECT_GT(refused, 50u);
  testing_util::TempDir dir;
  testing_util::write_bytes(dir.file("tokenizer_config.json"), R"({"chat_template": "x", "eos_token": 5})");
  try {
    ChatTemplate::from_model_dir(dir.file(""));
    ADD_FAILURE() << "eos_token 5 was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(R"(tokenizer_config.json: eos_token: expected a token: a string or {"content": "..."}, got 5)"),
              std::string::npos) << e.what();
  }
}

TEST(ChatTemplateModelDir, ReadsTokenizerConfigAndJinjaFile) {
  testing_util::TempDir dir;
  const fs::path root = fs::path(dir.file("model"));
  fs::create_directories(root);
  // A list of named templates (take "default") and AddedToken-style special tokens.
  ojson config = {{"bos_token", {{"__type", "AddedToken"}, {"content", "<bos>"}, {"lstrip", false}}},
                  {"eos_token", "<eos>"},
                  {"pad_token", nullptr},
                  {"chat_template", ojson::array({{{"name", "tool_use"}, {"template", "TOOLS"}},
                                                  {{"name", "default"}, {"template", read_text(kDir / "templates/google-gemma-2-2b-it.jinja")}}})}};
  testing_util::write_bytes((root / "tokenizer_config.json").string(), config.dump());
  const ChatTemplate t = ChatTemplate::from_model_dir(root.string());
  EXPECT_EQ(t.special_tokens(), ojson({{"bos_token", "<bos>"}, {"eos_token", "<eos>"}}));
  const ojson* want = find_render("google-gemma-2-2b-it", "multi_turn_end_user", true);
  ASSERT_NE(want, nullptr);
  EXPECT_EQ(t.render(conversation("multi_turn_end_user")["messages"], true), (*want)["text"].get<std::string>());

  // chat_template.jinja wins over the config's template.
  testing_util::write_bytes((root / "chat_template.jinja").string(), read_text(kDir / "templates/microsoft-Phi-3.5-mini-instruct.jinja"));
  const ChatTemplate phi = ChatTemplate::from_model_dir(root.string());
  EXPECT_NE(phi.label().find("chat_template.jinja"), std::string::npos);
  EXPECT_EQ(phi.render(ojson::array({{{"role", "user"}, {"content", "hi"}}}), false), "<|user|>\nhi<|end|>\n<eos>");

  // No template at all: the error names the folder.
  testing_util::TempDir empty;
  try {
    ChatTemplate::from_model_dir(empty.file(""));
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no chat template"), std::string::npos) << e.what();
  }
  // A list without "default" names what it has.
  ojson no_default = {{"chat_template", ojson::array({{{"name", "rag"}, {"template", "x"}}})}};
  testing_util::write_bytes(empty.file("tokenizer_config.json"), no_default.dump());
  try {
    ChatTemplate::from_model_dir(empty.file(""));
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rag"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- the Jinja subset

struct UnitCase {
  const char* name;
  const char* source;
  const char* want;
};

// Expected strings: jinja2 3.1.6 in transformers' environment with kVars (see kVars).
const UnitCase kCases[] = {
    {"ws_minus", "a  {%- if true -%}  b  {%- endif -%}  c",
     "abc"},
    {"ws_var_minus", "a \n {{- 'x' -}} \n b",
     "axb"},
    {"trim_blocks", "{% if true %}\nline\n{% endif %}\nafter",
     "line\nafter"},
    {"lstrip_blocks", "  {% if true %}\n    yes\n  {% endif %}\ndone",
     "    yes\ndone"},
    {"lstrip_not_after_text", "x {% if true %}y{% endif %}",
     "x y"},
    {"plus_disables", "  {%+ if true %}\n    yes\n  {%- endif +%}\ndone",
     "      yes\ndone"},
    {"comment_trim", "{# c #}\n  {# indented #}\ntext {# inline #} more\n",
     "text  more"},
    {"var_no_lstrip", "  {{ 'v' }}\n  {% if true %}w{% endif %}",
     "  v\nw"},
    {"raw", "{% raw %}{{ not rendered }} {% if %}{% endraw %}",
     "{{ not rendered }} {% if %}"},
    {"crlf_and_trailing_newline", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n",
     "a\nb\n"},
    {"unicode_space_lstrip", "　{% if true %}x{% endif %}",
     "x"},
    {"loop_vars", "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
     "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;"},
    {"loop_prev_next", "{% for x in l %}{{ loop.previtem }}>{{ x }}>{{ loop.nextitem }};{% endfor %}",
     ">3>1;3>1>2;1>2>;"},
    {"loop_filter_else", "{% for x in l if x > 1 %}{{ loop.index }}:{{ x }} {% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}",
     "1:3 2:2 |empty"},
    {"loop_break_continue", "{% for i in range(6) %}{% if i == 4 %}{% break %}{% endif %}{% if i is odd %}{% continue %}{% endif %}{{ i }}{% endfor %}",
     "02"},
    {"loop_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
     "b=1;a=[1, 2.5, None, True];items=X;"},
    {"loop_dict_keys", "{% for k in d %}{{ k }},{% endfor %}",
     "b,a,items,"},
    {"loop_string", "{% for c in 'héy' %}[{{ c }}]{% endfor %}",
     "[h][é][y]"},
    {"loop_cycle", "{% for i in range(3) %}{{ loop.cycle('a', 'b') }}{% endfor %}",
     "aba"},
    {"loop_scope", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}",
     "12121"},
    {"if_scope", "{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
     "5"},
    {"nested_loops", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{% endfor %}",
     "1x1 1y2 2x1 2y2 "},
    {"namespace", "{% set ns = namespace(total=0, seen=false) %}{% for i in l %}{% set ns.total = ns.total + i %}{% set ns.seen = true %}{% endfor %}{{ ns.total }} {{ ns.seen }}",
     "6 True"},
    {"namespace_empty", "{% set ns = namespace() %}{% set ns.a = 'v' %}{{ ns.a }}{{ ns.b is defined }}",
     "vFalse"},
    {"set_tuple", "{% set a, b = 1, 'two' %}{{ a }}{{ b }}{% set t = (1, 2) %}{{ t }}{{ (1,) }}",
     "1two(1, 2)(1,)"},
    {"set_block", "{% set blk %}inner {{ n }}{% endset %}[{{ blk }}]",
     "[inner 7]"},
    {"with", "{% with q = n * 2 %}{{ q }}{% endwith %}{{ q is defined }}",
     "14False"},
    {"macro", "{% macro greet(name, greeting='Hi') %}{{ greeting }} {{ name }}!{% endmacro %}{{ greet('bob') }} {{ greet('al', greeting='Yo') }}",
     "Hi bob! Yo al!"},
    {"generation", "a{% generation %}b{{ n }}{% endgeneration %}c",
     "ab7c"},
    {"slices", "{{ l[1:] }}{{ l[:-1] }}{{ l[::-1] }}{{ l[::2] }}{{ 'hello'[-3:] }}{{ u[1:4] }}{{ u[::-1] }}{{ l[-1] }}{{ u[-1] }}",
     "[1, 2][3, 1][2, 1, 3][3, 2]lloéll👋 dlröw olléh2👋"},
    {"index_missing", "{{ l[7] is defined }}{{ d.nope is defined }}{{ d['nope'] is defined }}{{ messages[0].role }}{{ messages[0]['content'] }}",
     "FalseFalseFalseuserhi"},
    {"print_values", "{{ 1.0 }} {{ 1e16 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ none }} {{ true }} {{ [1, 'a', \"b'c\", none, 2.5] }} {{ d }}",
     "1.0 1e+16 1e-05 0.30000000000000004 3.5 2.0 None True [1, 'a', \"b'c\", None, 2.5] {'b': 1, 'a': [1, 2.5, None, True], 'items': 'X'}"},
    {"string_escapes", "{{ '\\t|\\x41|\\u00e9|\\U0001F600|\\101|\\\\|\\q' }}{{ 'it\\'s' }}{{ \"multi\" 'ple' }}",
     "\t|A|é|😀|A|\\|\\qit'smultiple"},
    {"numbers", "{{ 1_000 }} {{ 0x1F }} {{ 0b101 }} {{ 0o17 }} {{ 1.5e-7 }} {{ 123456789012345678.0 }} {{ 1e22 }} {{ 2.50 }}",
     "1000 31 5 15 1.5e-07 1.2345678901234568e+17 1e+22 2.5"},
    {"arith", "{{ n // 2 }} {{ n % 3 }} {{ -n // 2 }} {{ -n % 3 }} {{ f * 2 }} {{ f // 1 }} {{ -f % 1 }} {{ n ** 2 }} {{ 2 ** -1 }} {{ 'ab' * 3 }} {{ [0] * 2 }} {{ 1 + 2 * 3 - 4 }}",
     "3 1 -4 2 5.0 2.0 0.5 49 0.5 ababab [0, 0] 3"},
    {"concat", "{{ 'a' ~ 1 ~ none ~ true ~ nope ~ 2.0 }}|{{ 'x' + 'y' }}|{{ l + [4] }}",
     "a1NoneTrue2.0|xy|[3, 1, 2, 4]"},
    {"compare", "{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ 1 in l }}{{ 'b' not in 'abc' }}{{ 'a' in d }}{{ true == 1 }}{{ 1 == 1.0 }}{{ '1' == 1 }}",
     "TrueFalseTrueTrueTrueFalseTrueTrueTrueFalse"},
    {"logic", "{{ not n }}{{ n and f }}{{ e or 'fallback' }}{{ z or e }}{{ (n > 1) and (f < 1) }}{{ 'a' if n > 5 else 'b' }}{{ 'c' if n < 5 }}",
     "False2.5fallbackFalsea"},
    {"tests", "{{ 'a' is string }}{{ 1 is string }}{{ d is mapping }}{{ l is mapping }}{{ l is sequence }}{{ 1 is iterable }}{{ z is none }}{{ true is boolean }}{{ 1 is boolean }}{{ 1.0 is float }}{{ f is number }}{{ true is number }}{{ true is integer }}",
     "TrueFalseTrueFalseTrueFalseTrueTrueFalseTrueTrueTrueFalse"},
    {"tests_args", "{{ n is divisibleby 7 }}{{ n is divisibleby(2) }}{{ n is even }}{{ n is odd }}{{ 3 is eq 3 }}{{ 3 is gt(2) }}{{ 'a' is in 'abc' }}{{ nope is false }}{{ false is false }}{{ nope is not defined }}",
     "TrueFalseFalseTrueTrueTrueTrueFalseTrueTrue"},
    {"f_trim_length", "{{ s|trim }}|{{ s|length }}|{{ u|length }}|{{ 'xxaxx'|trim('x') }}|{{ '　a '|trim }}",
     "Hello World|15|13|a|a"},
    {"f_case", "{{ s|upper }}|{{ s|lower }}|{{ s|title }}|{{ 'hELLO wORLD'|capitalize }}|{{ s.title() }}|{{ \"o'neil mc-x\"|title }}",
     "  HELLO WORLD  |  hello world  |  Hello World  |Hello world|  Hello World  |O'neil Mc-X"},
    {"f_seq", "{{ l|first }}{{ l|last }}{{ l|join(',') }}{{ l|sum }}{{ l|max }}{{ l|min }}{{ l|reverse|list }}{{ l|sort }}{{ l|sort(reverse=true) }}{{ [1, 1, 2]|unique|list }}{{ 'abc'|list }}",
     "323,1,2631[2, 1, 3][1, 2, 3][3, 2, 1][1, 2]['a', 'b', 'c']"},
    {"f_attr_filters", "{{ messages|selectattr('role', 'equalto', 'user')|list|length }}{{ messages|map(attribute='role')|join(',') }}{{ ['a', 'b']|map('upper')|list }}{{ [1, 0, 2]|select|list }}{{ [1, 2, 3, 4]|reject('odd')|list }}{{ messages|rejectattr('role', 'equalto', 'user')|list }}",
     "1user['A', 'B'][1, 2][2, 4][]"},
    {"f_default", "{{ e|default('dflt') }}|{{ e|default('dflt', true) }}|{{ nope|default('dflt') }}|{{ nope|d('x') }}|{{ z|default('y') }}",
     "|dflt|dflt|x|None"},
    {"f_tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ 'é\\n\"<'|tojson }}|{{ 1.0|tojson }}|{{ []|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ u|tojson(ensure_ascii=true) }}|{{ [1, 2]|tojson(separators=(',', ':')) }}",
     "{\"b\": 1, \"a\": [1, 2.5, null, true], \"items\": \"X\"}|{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"items\": \"X\"\n}|\"é\\n\\\"<\"|1.0|[]|{\"a\": [1, 2.5, null, true], \"b\": 1, \"items\": \"X\"}|\"h\\u00e9llo w\\u00f6rld \\ud83d\\udc4b\"|[1,2]"},
    {"f_convert", "{{ 10|string }}{{ '42'|int + 1 }}{{ '4.5'|float }}{{ 'x'|int }}{{ 3.7|int }}{{ '  12 '|int }}{{ 2.5|round }}{{ 3.5|round }}{{ 1.2345|round(2) }}{{ -3|abs }}",
     "10434.503122.04.01.233"},
    {"f_items_dictsort", "{{ d|items|list }}{{ d|dictsort }}{{ d|length }}",
     "[('b', 1), ('a', [1, 2.5, None, True]), ('items', 'X')][('a', [1, 2.5, None, True]), ('b', 1), ('items', 'X')]3"},
    {"f_indent", "{{ 'a\\nb\\n'|indent(2) }}|{{ 'a\\n\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x'|indent('>>', first=true) }}",
     "a\n  b\n|  a\n\n  b|a\n  \n  b|>>x"},
    {"f_misc", "{{ s|wordcount }}|{{ s|replace('l', 'L') }}|{{ '<a>'|e }}|{{ 'x'|safe }}|{{ 'ab'|center(6) }}|",
     "2|  HeLLo WorLd  |&lt;a&gt;|x|  ab  |"},
    {"str_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ 'x\\ny'.splitlines() }}",
     "Hello World|Hello World  |  Hello World|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a b', 'c']|['x', 'y']"},
    {"str_methods2", "{{ s.startswith('  He') }}{{ s.endswith('d  ') }}{{ s.startswith(('x', '  ')) }}{{ s.find('o') }}{{ u.find('w') }}{{ s.rfind('o') }}{{ s.count('l') }}{{ s.replace('l', 'L', 1) }}{{ '-'.join(['a', 'b']) }}{{ 'abc'.upper() }}{{ 'ABC'.lower() }}",
     "TrueTrueTrue6693  HeLlo World  a-bABCabc"},
    {"dict_methods", "{{ d.get('b') }}{{ d.get('zz', 'def') }}{{ d.get('zz') }}{{ d.keys()|list }}{{ d.values()|list|length }}{{ d['items'] }}",
     "1defNone['b', 'a', 'items']3X"},
    {"markup", "{{ \"Use '\"|safe + \"<b>\" + \"'\"|safe }}|{{ '<x>'|e + '<y>' }}|{{ '<'|safe ~ '<' }}|{{ ('<p>'|safe).replace('p', '&') }}|{{ ['a'|safe] }}",
     "Use '&lt;b&gt;'|&lt;x&gt;&lt;y&gt;|<<|<&amp;>|[Markup('a')]"},
    {"generators", "{{ l|map('string')|join(',') }}|{{ (l|select) is sequence }}|{{ z|map('upper')|list }}|{% if [] | select %}always{% endif %}|{{ d.items() }}|{{ d.keys()|list }}|{{ l|reverse|list }}",
     "3,1,2|False|[]|always|dict_items([('b', 1), ('a', [1, 2.5, None, True]), ('items', 'X')])|['b', 'a', 'items']|[2, 1, 3]"},
    {"dict_keys", "{% set m = {16384: 4, 512: 1, 0: 0} %}{{ m[512] }}{{ m[0.0] }}{{ m[false] }}{% for k, v in m|dictsort %}{{ k }}={{ v }} {% endfor %}{{ m|tojson }}{{ m }}{{ {(1, 2): 't'}[(1, 2)] }}",
     "1000=0 512=1 16384=4 {\"16384\": 4, \"512\": 1, \"0\": 0}{16384: 4, 512: 1, 0: 0}t"},
    {"str_format", "{{ '{} and {}'.format(n, s) }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{x}-{y!r}'.format(x=1, y='q') }}|{{ '{{lit}}'.format() }}",
     "7 and   Hello World  |aba|1-'q'|{lit}"},
    {"soft_unknown_filter", "{% if false %}{{ x | from_json }}{% endif %}{{ 'a' if true else (x | from_json) }}ok",
     "aok"},
    {"unicode_case", "{{ 'ärger über straße'|upper }}|{{ 'ÄRGER ΣΟΦΟΣ'|lower }}|{{ 'ärger über'|title }}|{{ 'привет мир'.title() }}|{{ 'ǅ'|upper if false else 'x' }}",
     "ÄRGER ÜBER STRASSE|ärger σοφος|Ärger Über|Привет Мир|x"},
    {"tuple_subscript", "{{ {(1, 2): 'pair'}[1, 2] }}{{ 'x' if false else l[1] }}",
     "pair1"},
    {"undefined_ok", "[{{ nope }}][{{ nope|length }}][{{ nope is iterable }}][{{ 'x' in nope }}][{{ nope ~ 'a' }}][{% for x in nope %}x{% endfor %}][{{ nope is defined }}][{{ not nope }}]",
     "[][0][True][False][a][][False][True]"},
};
const UnitCase kErrorCases[] = {
    {"undefined_attr", "{{ nope.x }}", ""},
    {"undefined_add", "{{ 'a' + nope }}", ""},
    {"undefined_call", "{{ nope() }}", ""},
    {"type_error", "{{ 'a' + 1 }}", ""},
    {"not_iterable", "{% for x in 5 %}{% endfor %}", ""},
    {"div_zero", "{{ 1 / 0 }}", ""},
    {"unsafe_append", "{% set x = [1] %}{{ x.append(2) }}", ""},
    {"compare_types", "{{ 'a' < 1 }}", ""},
    {"generator_length", "{{ l|map('string')|length }}", ""},
    {"generator_tojson", "{{ l|select|tojson }}", ""},
    {"unknown_filter_reached", "{% if true %}{{ x | from_json }}{% endif %}", ""},
    {"int_of_undefined", "{{ nope|int }}", ""},
    {"unhashable_key", "{{ {[1]: 2} }}", ""},
};
const char* const kVars =
    R"({"d": {"b": 1, "a": [1, 2.5, null, true], "items": "X"}, "s": "  Hello World  ", "n": 7, "f": 2.5,)"
    R"( "l": [3, 1, 2], "e": "", "z": null, "u": "héllo wörld 👋"})";

std::string render_unit(const std::string& source, const std::string& label = "unit.jinja") {
  const ChatTemplate t = ChatTemplate::parse(source, label);
  return t.render(ojson::array({{{"role", "user"}, {"content", "hi"}}}), false, ojson::parse(kVars));
}

TEST(ChatTemplateSubset, MatchesJinja2) {
  for (const auto& c : kCases) {
    std::string got;
    try {
      got = render_unit(c.source);
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.name << ": threw " << e.what();
      continue;
    }
    EXPECT_EQ(got, c.want) << c.name << ": " << first_difference(c.want, got);
  }
}

TEST(ChatTemplateSubset, RuntimeErrorsAreInputErrors) {
  for (const auto& c : kErrorCases) {
    EXPECT_THROW(render_unit(c.source), InputError) << c.name;
  }
}

TEST(ChatTemplateSubset, ErrorsNameLineAndColumn) {
  auto message = [](const std::string& src) -> std::string {
    try {
      render_unit(src, "my.jinja");
    } catch (const InputError& e) {
      return e.what();
    }
    return "(no error)";
  };
  // Syntax: line 3, column of the offending token.
  EXPECT_NE(message("line one\n{% if true %}\n  {{ 1 + }}\n{% endif %}").find("my.jinja:3:10: expected an expression"), std::string::npos)
      << message("line one\n{% if true %}\n  {{ 1 + }}\n{% endif %}");
  EXPECT_NE(message("{{ foo( }}").find("my.jinja:1:9: unexpected '}', expected ')'"), std::string::npos) << message("{{ foo( }}");
  EXPECT_NE(message("{% if x %}\nno end").find("my.jinja:2:"), std::string::npos);
  EXPECT_NE(message("{% if x %}\nno end").find("endif"), std::string::npos);
  EXPECT_NE(message("\n\n   {{ x | nosuchfilter }}").find("my.jinja:3:11: unknown filter 'nosuchfilter'"), std::string::npos)
      << message("\n\n   {{ x | nosuchfilter }}");
  EXPECT_NE(message("{{ x is nosuchtest }}").find("unknown test 'nosuchtest'"), std::string::npos);
  EXPECT_NE(message("{% include 'other.jinja' %}").find("unsupported statement 'include'"), std::string::npos);
  EXPECT_NE(message("{% frobnicate %}").find("unknown statement 'frobnicate'"), std::string::npos);
  EXPECT_NE(message("{% endfor %}").find("my.jinja:1:4: unexpected 'endfor'"), std::string::npos) << message("{% endfor %}");
  // Runtime: where it happened and jinja2's wording.
  EXPECT_NE(message("ok\n{{ nope.attr }}").find("my.jinja:2:8: 'nope' is undefined"), std::string::npos) << message("ok\n{{ nope.attr }}");
  // raise_exception carries the template's message.
  try {
    render_unit("{% if true %}{{ raise_exception('Roles must alternate (' ~ n ~ ')') }}{% endif %}", "r.jinja");
    ADD_FAILURE() << "expected a raise";
  } catch (const ChatTemplateRaise& e) {
    EXPECT_EQ(e.message(), "Roles must alternate (7)");
    EXPECT_NE(std::string(e.what()).find("r.jinja:1:"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplateSubset, MalformedTemplatesGiveInputError) {
  const char* const bad[] = {
      "{% if %}", "{{", "{{ x", "{%", "{% for %}", "{% for x in %}{% endfor %}", "{% endfor %}", "{{ 'abc }}",
      "{# unclosed", "{{ (1, }}", "{{ [1, 2 }}", "{{ } }}", "{{ ) }}", "{% set %}", "{% set x %}", "{% macro m( %}{% endmacro %}",
      "{{ 1 +* 2 }}", "{% raw %}unterminated", "{{ '\\x4' }}", "{% break %}", "{% if x %}{% else %}{% else %}{% endif %}",
      "{{ x is }}", "{{ x | }}", "{{ x. }}", "{{ x[] }}", "{% for x in y recursive %}{% endfor %}", "{{ 99999999999999999999 }}",
      "{{ a = 1 }}", "{% set 1 = 2 %}", "{% set none = 2 %}", "{{ x(1, y=2, 3) }}", "{{ x(*a) }}", "{{ \"\\N{DASH}\" }}",
      "{{ x if }}", "{{ {[1]: 2} }}", "{{ @ }}", "{% with %}{% endwith %}{% with x %}{% endwith %}", "{{ [][1:2:0] }}",
      "{% for a, b in [1] %}{% endfor %}", "{% set ns = 1 %}{% set ns.x = 2 %}", "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
      "{{ range(1000000) }}", "{{ 'x' * 999999999999 }}", "{{ 2 ** 99 }}", "{{ (1)(2) }}", "{{ namespace(_x=1) }}",
  };
  for (const char* src : bad) {
    EXPECT_THROW(render_unit(src), InputError) << src;
  }
}

// Every prefix of every real template (cut at every 9th byte), and the template with one byte
// removed (every 13th), parses or fails with InputError; so does rendering what parses.
TEST(ChatTemplateSubset, DamagedRealTemplatesNeverCrash) {
  size_t parsed = 0, refused = 0;
  for (const auto& entry : fs::directory_iterator(kDir / "templates")) {
    const std::string text = read_text(entry.path());
    std::vector<std::string> variants;
    for (size_t cut = 0; cut < text.size(); cut += 9) variants.push_back(text.substr(0, cut));
    for (size_t cut = 0; cut < text.size(); cut += 13) variants.push_back(text.substr(0, cut) + text.substr(cut + 1));
    for (const std::string& variant : variants) {
      try {
        const ChatTemplate t = ChatTemplate::parse(variant, "damaged");
        ++parsed;
        try {
          t.render(conversation("tool_call")["messages"], true, {{"tools", conversation("tool_call")["extra"]["tools"]}});
        } catch (const InputError&) {
        }
      } catch (const InputError&) {
        ++refused;
      }
    }
  }
  std::printf("damaged templates: %zu parsed, %zu refused with InputError\n", parsed, refused);
  EXPECT_GT(parsed + refused, 1000u);
}

TEST(ChatTemplateSubset, MessagesAreNormalizedAsTransformersDoes) {
  const ChatTemplate t = ChatTemplate::parse("{% for m in messages %}{{ m }}{% endfor %}|{{ tools }}|{{ documents }}", "n.jinja");
  ojson msgs = ojson::array({{{"role", "user"}, {"content", "hi"}, {"name", nullptr}, {"reasoning", "r"}}});
  EXPECT_EQ(t.render(msgs, false),
            "{'thinking': 'r', 'role': 'user', 'content': 'hi', 'reasoning': 'r', 'reasoning_content': 'r'}|None|None");
  EXPECT_THROW(t.render(ojson::array(), false), InputError);
  EXPECT_THROW(t.render(ojson::array({"not an object"}), false), InputError);
  EXPECT_THROW(t.render(msgs, false, {{"messages", 1}}), InputError);
}

}  // namespace
}  // namespace qshard
