// chat_template.cpp: ChatTemplate (chat_template.h): loading a model folder's template and special
// tokens, rendering with apply_chat_template's variables and message normalization, and
// render_with_spans. The interpreter itself: chat_template_ast.h and the chat_template_*.cpp files.
#include "text/chat_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <optional>
#include <sstream>

#include "runtime/input_file.h"
#include "runtime/numbers.h"
#include "text/chat_template_ast.h"
#include "text/special_token.h"

namespace qshard {
namespace jinja {
namespace {

// A folder's side file (`what`: its role in messages): a regular file of at most kMaxConfigBytes
// (a FIFO, folder or device is refused by name before it is opened: runtime/input_file.h).
std::string read_file(const std::filesystem::path& path, const std::string& what) {
  return read_input_file(path.string(), what);
}

// Its JSON, nesting bounded (runtime/input_file.h): a syntax error or a document deeper than
// kMaxJsonDepth is an InputError naming the file.
nlohmann::ordered_json read_json(const std::filesystem::path& path, const std::string& what) {
  return parse_ordered_json_input(read_file(path, what), what + " " + path.string());
}


// What apply_chat_template does to each message before rendering: keys whose value is null are
// dropped; reasoning found under reasoning_content, thinking or reasoning (first non-null) is
// given under "thinking" (first) and "reasoning_content" (last) too.
Value prepare_messages(const std::string& label, const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) throw InputError(label + ": messages must be a JSON array of message objects");
  if (messages.empty()) throw InputError(label + ": cannot render an empty conversation (messages is [])");
  ValueList out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.is_object()) throw InputError(fmt::format("{}: messages[{}] is not a JSON object", label, i));
    Dict d;
    try {
      for (auto it = m.begin(); it != m.end(); ++it) {  // keys are unique: no search per key
        if (!it.value().is_null()) d.entries.emplace_back(Value::string(it.key()), from_json(it.value(), 1));
      }
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: messages[{}]: {}", label, i, e.what()));
    }
    for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
      const Value* r = d.find(key);
      if (r == nullptr) continue;
      const Value reasoning = *r;
      Dict aliased;
      aliased.set("thinking", reasoning);
      for (auto& [k, v] : d.entries) aliased.set(k, v);
      aliased.set("reasoning_content", reasoning);
      d = std::move(aliased);
      break;
    }
    out.push_back(Value::make_dict(std::move(d)));
  }
  return Value::make_list(std::move(out));
}

// A render variable from JSON, its depth checked (InputError naming the template and the variable).
Value variable(const std::string& label, const std::string& name, const nlohmann::ordered_json& j) {
  try {
    return from_json(j);
  } catch (const InputError& e) {
    throw InputError(label + ": variable '" + name + "': " + e.what());
  }
}

}  // namespace
}  // namespace jinja

ChatTemplateLimits ChatTemplateLimits::from_env() {
  ChatTemplateLimits l;
  const char* env = std::getenv("QSHARD_TEMPLATE_LIMITS");
  if (env == nullptr || *env == '\0') return l;
  const std::string text = env;
  std::vector<std::string> seen;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    pos = end + 1;
    // Strict: an empty entry (",," or a trailing comma) and a budget given twice (which one counts
    // would be a guess: the last won in silence) are refused, naming the variable and the entry.
    if (item.empty())
      throw InputError("environment variable QSHARD_TEMPLATE_LIMITS='" + text +
                       "': an empty entry (expected NAME=N[,NAME=N...])");
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    uint64_t* slot = key == "instructions" ? &l.max_instructions
                   : key == "iterations"   ? &l.max_iterations
                   : key == "output"       ? &l.max_output_bytes
                   : key == "bytes"        ? &l.max_bytes
                   : key == "spans"        ? &l.max_spans_bytes
                                           : nullptr;
    if (slot == nullptr) {
      throw InputError("QSHARD_TEMPLATE_LIMITS: unknown budget '" + key + "' (expected instructions, iterations, output, bytes or spans)");
    }
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      throw InputError("environment variable QSHARD_TEMPLATE_LIMITS='" + text + "': budget '" + key +
                       "' given twice (entry '" + item + "'); give each once");
    seen.push_back(key);
    const std::string num = eq == std::string::npos ? std::string() : item.substr(eq + 1);
    // At most 2^40 (a budget, not a way around one: a larger one could not be met by the host).
    *slot = static_cast<uint64_t>(parse_int("QSHARD_TEMPLATE_LIMITS " + key, num, 1, kMaxTemplateBudget));
  }
  return l;
}

ChatTemplate ChatTemplate::parse(std::string source, std::string label) {
  ChatTemplate t;
  t.label_ = label;
  t.limits_ = ChatTemplateLimits::from_env();
  t.program_ = jinja::parse_program(std::move(source), std::move(label));
  return t;
}

ChatTemplate ChatTemplate::from_model_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  const fs::path jinja_file = root / "chat_template.jinja";
  const fs::path config_file = root / "tokenizer_config.json";
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (fs::exists(config_file)) config = jinja::read_json(config_file, "tokenizer config");
  if (!config.is_object()) throw InputError(config_file.string() + ": expected a JSON object");

  std::string source;
  std::string label;
  if (fs::exists(jinja_file)) {
    source = jinja::read_file(jinja_file, "chat template");
    label = jinja_file.string();
  } else if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    const auto& ct = config["chat_template"];
    label = config_file.string() + " (chat_template)";
    if (ct.is_string()) {
      source = ct.get<std::string>();
    } else if (ct.is_array()) {
      std::string names;
      bool found = false;
      for (const auto& entry : ct) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
            !entry["template"].is_string()) {
          throw InputError(config_file.string() + ": chat_template: expected a list of {\"name\": ..., \"template\": ...} objects");
        }
        const std::string name = entry["name"].get<std::string>();
        names += (names.empty() ? "" : ", ") + name;
        if (name == "default") {
          source = entry["template"].get<std::string>();
          found = true;
        }
      }
      if (!found) throw InputError(config_file.string() + ": chat_template: no template named \"default\" (have: " + names + ")");
      label = config_file.string() + " (chat_template \"default\")";
    } else {
      throw InputError(config_file.string() + ": chat_template: expected a string or a list of {name, template}");
    }
  } else {
    throw InputError(dir + ": no chat template (neither chat_template.jinja nor a \"chat_template\" in tokenizer_config.json)");
  }

  ChatTemplate t = parse(std::move(source), label);
  static const char* const kSpecial[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"};
  nlohmann::ordered_json legacy = nlohmann::ordered_json::object();
  const fs::path map_file = root / "special_tokens_map.json";
  if (fs::exists(map_file)) legacy = jinja::read_json(map_file, "special tokens map");
  // A token the config sets (null: unset) hides the legacy map's; a value of another type than a
  // string or {"content": ...} is an InputError naming the file and the key (special_token_text).
  const OrderedJsonField config_field(config, config_file.string()), legacy_field(legacy, map_file.string());
  legacy_field.object();
  for (const char* key : kSpecial) {
    std::optional<OrderedJsonField> v = config_field.find(key);
    if (!v && !config.contains(key)) v = legacy_field.find(key);
    if (v) t.special_tokens_[key] = special_token_text(*v);
  }
  return t;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra, ChatTemplateUsage* usage,
                                 jinja::RenderTrace* trace) const {
  if (!program_) throw InputError("render: the chat template was not loaded");
  if (!extra.is_object()) throw InputError(label_ + ": the extra template variables must be a JSON object");
  std::vector<std::pair<std::string, jinja::Value>> vars;
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) vars.emplace_back(it.key(), jinja::variable(label_, it.key(), it.value()));
  jinja::Value tools = jinja::Value::none();
  jinja::Value documents = jinja::Value::none();
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    if (it.key() == "messages" || it.key() == "add_generation_prompt") {
      throw InputError(label_ + ": extra variable '" + it.key() + "' is set by render() itself");
    }
    if (it.key() == "tools") {
      tools = jinja::variable(label_, "tools", it.value());
    } else if (it.key() == "documents") {
      documents = jinja::variable(label_, "documents", it.value());
    } else {
      vars.emplace_back(it.key(), jinja::variable(label_, it.key(), it.value()));
    }
  }
  jinja::Value list = jinja::prepare_messages(label_, messages);
  if (trace != nullptr) {  // the message objects, by identity (slices and loop variables share them)
    trace->messages.clear();
    for (size_t i = 0; i < list.items().size(); ++i) trace->messages.emplace(list.items()[i].dict.get(), i);
  }
  vars.emplace_back("messages", std::move(list));
  vars.emplace_back("tools", std::move(tools));
  vars.emplace_back("documents", std::move(documents));
  vars.emplace_back("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  try {
    return jinja::run_program(*program_, std::move(vars), fixed_time_, limits_, usage, trace);
  } catch (const std::bad_alloc&) {  // a memory budget raised past what this host holds
    throw InputError(label_ + ": rendering needed more memory than the host could give (the memory budget is " +
                     std::to_string(limits_.max_bytes) + " bytes; QSHARD_TEMPLATE_LIMITS=bytes=N lowers it)");
  }
}

namespace {

bool is_assistant(const nlohmann::ordered_json& m) {
  return m.is_object() && m.contains("role") && m["role"] == "assistant";
}

nlohmann::ordered_json head(const nlohmann::ordered_json& messages, size_t n) {
  nlohmann::ordered_json part = nlohmann::ordered_json::array();
  for (size_t k = 0; k < n; ++k) part.push_back(messages[k]);
  return part;
}

size_t mismatch(std::string_view a, std::string_view b) {
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  return k;
}

// k moved back to the start of the UTF-8 character it is inside of.
size_t char_start(std::string_view s, size_t k) {
  while (k > 0 && k < s.size() && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return k;
}

// Rule 2 for assistant message i of a conversation whose full render is `text`: its span, or the
// reason the template is not prefix-consistent there (span empty). `spent` adds the bytes rendered.
struct PrefixSpan {
  std::optional<std::pair<size_t, size_t>> span;
  std::string error;
};
PrefixSpan prefix_span(const ChatTemplate& t, const nlohmann::ordered_json& messages, size_t i,
                       const nlohmann::ordered_json& extra, const std::string& text, uint64_t* spent) {
  const std::string prompt = t.render(head(messages, i), true, extra);
  const std::string upto = t.render(head(messages, i + 1), false, extra);
  if (spent != nullptr) *spent += prompt.size() + upto.size();
  size_t begin = prompt.size();
  if (upto.compare(0, prompt.size(), prompt) != 0) {
    // A generation prompt the finished turn does not repeat (DeepSeek-R1's "<think>\n"): the
    // reply starts where the two part (at a character boundary), if that is inside the
    // generation prompt, i.e. past the render of the conversation before it.
    const std::string base = t.render(head(messages, i), false, extra);
    const size_t k = char_start(upto, mismatch(prompt, upto));
    if (prompt.compare(0, base.size(), base) == 0 && upto.compare(0, base.size(), base) == 0 && k >= base.size()) {
      begin = k;
    } else {
      return {std::nullopt,
              fmt::format("{}: message {}: the template is not prefix-consistent: render(messages[:{}], "
                          "add_generation_prompt=true) is not a prefix of render(messages[:{}]) (they differ at byte {})",
                          t.label(), i, i, i + 1, mismatch(prompt, upto))};
    }
  }
  if (text.compare(0, upto.size(), upto) != 0) {
    return {std::nullopt, fmt::format("{}: message {}: the template is not prefix-consistent: render(messages[:{}]) is "
                                      "not a prefix of the whole conversation's render (they differ at byte {})",
                                      t.label(), i, i + 1, mismatch(upto, text))};
  }
  return {std::pair{begin, upto.size()}, {}};
}

void check_assistant_not_first(const ChatTemplate& t, const nlohmann::ordered_json& messages) {
  if (messages.is_array() && !messages.empty() && is_assistant(messages[0]))
    throw InputError(t.label() + ": message 0 is an assistant message: there is no prompt before it to render");
}

// Rule 3: the spans from the traced full render, or nullopt when it does not apply.
std::optional<std::vector<std::pair<size_t, size_t>>> spans_by_turns(const ChatTemplate& t,
                                                                    const nlohmann::ordered_json& messages,
                                                                    const nlohmann::ordered_json& extra,
                                                                    const std::string& text,
                                                                    const jinja::RenderTrace& trace) {
  std::vector<std::optional<std::pair<size_t, size_t>>> turn(messages.size());
  for (const auto& it : trace.iterations) {
    if (it.message >= turn.size() || !is_assistant(messages[it.message])) continue;
    if (turn[it.message]) return std::nullopt;  // two iterations wrote for this reply: whose is it?
    turn[it.message] = std::pair{it.begin, it.end};
  }
  std::vector<size_t> replies;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!is_assistant(messages[i])) continue;
    if (!turn[i]) return std::nullopt;  // a reply no loop iteration wrote (or wrote nothing)
    replies.push_back(i);
  }
  if (replies.empty()) return std::vector<std::pair<size_t, size_t>>{};
  // G, the generation prompt, from the conversation before the first reply.
  const size_t j = replies[0];
  // G: what render(messages[:j], true) writes after its last message's loop iteration. (Not merely
  // past render(messages[:j]): a template may end a finished conversation with text of its own
  // where the generation prompt goes otherwise, Phi-3.5's eos_token.) Both renders must agree up to there.
  jinja::RenderTrace prompt_trace;
  const std::string prompt = t.render(head(messages, j), true, extra, nullptr, &prompt_trace);
  const std::string base = t.render(head(messages, j), false, extra);
  size_t loop_end = 0;
  for (const auto& it : prompt_trace.iterations) loop_end = std::max(loop_end, it.end);
  if (prompt_trace.iterations.empty() || base.compare(0, loop_end, prompt, 0, loop_end) != 0) return std::nullopt;
  const std::string_view g = std::string_view(prompt).substr(loop_end);
  std::vector<std::pair<size_t, size_t>> spans;
  size_t last_end = 0;
  for (size_t i : replies) {
    const auto [b, e] = *turn[i];
    if (b < last_end) return std::nullopt;  // nested or overlapping turns
    const std::string_view out = std::string_view(text).substr(b, e - b);
    spans.emplace_back(b + char_start(out, mismatch(out, g)), e);
    last_end = e;
  }
  // Where the template is prefix-consistent at the first reply, rule 2 must agree there. At the last
  // reply it must start where the turn's span starts; its end is taken, since it holds what the
  // template writes after its loop for a finished conversation (Phi-3.5's final eos_token).
  const PrefixSpan first = prefix_span(t, messages, replies[0], extra, text, nullptr);
  if (replies.size() > 1 && first.span && *first.span != spans[0]) return std::nullopt;
  const PrefixSpan last = replies.size() > 1 ? prefix_span(t, messages, replies.back(), extra, text, nullptr) : first;
  if (last.span) {
    if (last.span->first != spans.back().first || last.span->second < spans.back().second) return std::nullopt;
    spans.back().second = last.span->second;
  }
  return spans;
}

}  // namespace

ChatRender render_with_spans_by_prefixes(const ChatTemplate& t, const nlohmann::ordered_json& messages,
                                         const nlohmann::ordered_json& extra) {
  ChatRender r;
  r.text = t.render(messages, false, extra);
  check_assistant_not_first(t, messages);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!is_assistant(messages[i])) continue;
    const PrefixSpan p = prefix_span(t, messages, i, extra, r.text, nullptr);
    if (!p.span) throw InputError(p.error);
    r.assistant_spans.push_back(*p.span);
  }
  if (!r.assistant_spans.empty()) r.rule = ChatRender::Rule::kPrefixes;
  return r;
}

ChatRender render_with_spans(const ChatTemplate& t, const nlohmann::ordered_json& messages, const nlohmann::ordered_json& extra) {
  ChatRender r;
  jinja::RenderTrace trace;
  r.text = t.render(messages, false, extra, nullptr, &trace);
  if (!trace.generation.empty()) {  // rule 1
    r.assistant_spans = std::move(trace.generation);
    r.rule = ChatRender::Rule::kGeneration;
    return r;
  }
  check_assistant_not_first(t, messages);
  auto by_turns = [&]() -> bool {  // rule 3
    auto spans = spans_by_turns(t, messages, extra, r.text, trace);
    if (!spans) return false;
    r.assistant_spans = std::move(*spans);
    r.rule = r.assistant_spans.empty() ? ChatRender::Rule::kNone : ChatRender::Rule::kTurns;
    return true;
  };
  // Rule 2's prefix renders cost about 2 x (the share of the conversation up to each reply) x the
  // whole text per assistant message: quadratic in the turns. Past the spans budget (estimated
  // before any of them runs, and counted as they run) the turns decide.
  const uint64_t budget = t.limits().max_spans_bytes;
  double estimate = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (is_assistant(messages[i]))
      estimate += 2.0 * static_cast<double>(r.text.size()) * static_cast<double>(i + 1) / static_cast<double>(messages.size());
  }
  auto over = [&](double bytes, bool estimated) {
    return InputError(fmt::format(
        "{}: the per-reply spans of this conversation ({} messages, {} bytes rendered) {} {:.0f} bytes of prefix "
        "renders, over the spans budget ({}; QSHARD_TEMPLATE_LIMITS=spans=N sets it), and the template does not "
        "render each reply in a loop iteration of its own that agrees with them: split the conversation",
        t.label(), messages.size(), r.text.size(), estimated ? "need about" : "wrote", bytes, budget));
  };
  if (estimate > static_cast<double>(budget)) {
    if (by_turns()) return r;
    throw over(estimate, true);
  }
  uint64_t spent = 0;
  for (size_t i = 0; i < messages.size(); ++i) {  // rule 2
    if (!is_assistant(messages[i])) continue;
    const PrefixSpan p = prefix_span(t, messages, i, extra, r.text, &spent);
    if (!p.span) {
      if (by_turns()) return r;
      throw InputError(p.error);
    }
    if (spent > budget) {
      if (by_turns()) return r;
      throw over(static_cast<double>(spent), false);
    }
    r.assistant_spans.push_back(*p.span);
  }
  if (!r.assistant_spans.empty()) r.rule = ChatRender::Rule::kPrefixes;
  return r;
}

}  // namespace qshard
