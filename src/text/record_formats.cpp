#include "text/record_formats.h"

#include <array>
#include <utility>

#include <fmt/format.h>

#include "runtime/error.h"

namespace qshard {
namespace {

struct FormatName {
  InputFormat format;
  const char* name;
};
constexpr std::array<FormatName, 7> kFormatNames{{{InputFormat::kAuto, "auto"},
                                                   {InputFormat::kText, "text"},
                                                   {InputFormat::kJsonl, "jsonl"},
                                                   {InputFormat::kAlpaca, "alpaca"},
                                                   {InputFormat::kChat, "chat"},
                                                   {InputFormat::kShareGpt, "sharegpt"},
                                                   {InputFormat::kPromptCompletion, "prompt_completion"}}};

// ShareGPT's `from` values and the chat role each becomes (as axolotl, LLaMA-Factory and Unsloth map them).
constexpr std::array<std::pair<const char*, const char*>, 9> kShareGptRoles{{{"human", "user"},
                                                                              {"user", "user"},
                                                                              {"gpt", "assistant"},
                                                                              {"assistant", "assistant"},
                                                                              {"model", "assistant"},
                                                                              {"system", "system"},
                                                                              {"tool", "tool"},
                                                                              {"function", "tool"},
                                                                              {"observation", "tool"}}};

// A value as a message shows it: strings quoted, anything else as JSON, cut at 80 bytes.
std::string show(const nlohmann::ordered_json& v) {
  std::string s = v.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// record[key] as a string; absent: "" unless required (an InputError naming where and the key).
std::string string_field(const nlohmann::ordered_json& record, const char* key, bool required, const std::string& where,
                         const char* format_note) {
  const auto it = record.find(key);
  if (it == record.end()) {
    if (required) throw InputError(fmt::format("{}: no field \"{}\" ({})", where, key, format_note));
    return {};
  }
  if (!it->is_string())
    throw InputError(fmt::format("{}: field \"{}\" is {} ({}), expected a string", where, key, it->type_name(), show(*it)));
  return it->get<std::string>();
}

// Checks a list of chat messages held in record field `field` (each an object with a string
// "role" and a string or null "content"); returns how many are assistant messages.
size_t check_messages(const nlohmann::ordered_json& list, const std::string& field, const std::string& where) {
  size_t assistants = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& m = list[i];
    if (!m.is_object())
      throw InputError(fmt::format("{}: \"{}\"[{}] is {}, expected a message object {{\"role\", \"content\"}}", where,
                                   field, i, m.type_name()));
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      throw InputError(fmt::format("{}: \"{}\"[{}] has no string \"role\"", where, field, i));
    const auto content = m.find("content");
    if (content == m.end() || !(content->is_string() || content->is_null()))
      throw InputError(fmt::format("{}: \"{}\"[{}] ({}) has no string \"content\"", where, field, i,
                                   role->get<std::string>()));
    assistants += *role == "assistant";
  }
  return assistants;
}

// A conversation's rules beyond its messages' shapes: a reply to train on, and a prompt before the first one.
// `field` names the list of trained messages, `first` the list the conversation opens with.
void check_conversation(const nlohmann::ordered_json& messages, size_t trained_assistants, const std::string& field,
                        const std::string& first, const std::string& where) {
  if (trained_assistants == 0)
    throw InputError(fmt::format("{}: \"{}\" holds no assistant message: nothing to train on", where, field));
  if (messages[0]["role"] == "assistant")
    throw InputError(fmt::format("{}: \"{}\"[0] is an assistant message: a conversation opens with a system or user "
                                 "message (the prompt the reply answers)",
                                 where, first));
}

// `record[key]` as a non-empty list.
const nlohmann::ordered_json& list_field(const nlohmann::ordered_json& record, const char* key, const std::string& where,
                                         const char* what) {
  const auto it = record.find(key);
  if (it == record.end()) throw InputError(fmt::format("{}: no field \"{}\" ({})", where, key, what));
  if (!it->is_array()) throw InputError(fmt::format("{}: field \"{}\" is {}, expected a list of {}", where, key, it->type_name(), what));
  if (it->empty()) throw InputError(fmt::format("{}: field \"{}\" is an empty conversation: nothing to train on", where, key));
  return *it;
}

Sample chat_sample(nlohmann::ordered_json& record, const std::string& where) {
  const auto& list = list_field(record, "messages", where, "messages {\"role\", \"content\"}");
  check_conversation(list, check_messages(list, "messages", where), "messages", "messages", where);
  Sample s;
  s.kind = Sample::Kind::kChat;
  s.messages = std::move(record["messages"]);
  return s;
}

Sample sharegpt_sample(nlohmann::ordered_json& record, const std::string& where) {
  const auto& list = list_field(record, "conversations", where, "messages {\"from\", \"value\"}");
  Sample s;
  s.kind = Sample::Kind::kChat;
  s.messages = nlohmann::ordered_json::array();
  const auto system = record.find("system");
  if (system != record.end() && !system->is_null()) {
    if (!system->is_string())
      throw InputError(fmt::format("{}: field \"system\" is {}, expected a string (the system prompt)", where, system->type_name()));
    if (!system->get_ref<const std::string&>().empty())
      s.messages.push_back({{"role", "system"}, {"content", *system}});
  }
  size_t assistants = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& m = list[i];
    if (!m.is_object())
      throw InputError(fmt::format("{}: \"conversations\"[{}] is {}, expected a message object {{\"from\", \"value\"}}",
                                   where, i, m.type_name()));
    const auto from = m.find("from");
    if (from == m.end() || !from->is_string())
      throw InputError(fmt::format("{}: \"conversations\"[{}] has no string \"from\"", where, i));
    const std::string role = sharegpt_role(from->get_ref<const std::string&>());
    if (role.empty()) {
      std::string known;
      for (const auto& [f, r] : kShareGptRoles) known += fmt::format("{}{}", known.empty() ? "" : ", ", f);
      throw InputError(fmt::format("{}: \"conversations\"[{}]: \"from\" is {}, not a ShareGPT role (known: {})", where, i,
                                   show(*from), known));
    }
    const auto value = m.find("value");
    if (value == m.end() || !value->is_string())
      throw InputError(fmt::format("{}: \"conversations\"[{}] ({}) has no string \"value\"", where, i, from->get<std::string>()));
    if (role == "system" && i == 0 && !s.messages.empty()) s.messages.clear();  // the conversation's own system prompt wins
    assistants += role == "assistant";
    s.messages.push_back({{"role", role}, {"content", *value}});
  }
  check_conversation(s.messages, assistants, "conversations", "conversations", where);
  return s;
}

Sample prompt_completion_sample(nlohmann::ordered_json& record, const std::string& where) {
  const char* note = "prompt_completion records have \"prompt\" and \"completion\"";
  const auto prompt = record.find("prompt"), completion = record.find("completion");
  if (prompt == record.end()) throw InputError(fmt::format("{}: no field \"prompt\" ({})", where, note));
  if (completion == record.end()) throw InputError(fmt::format("{}: no field \"completion\" ({})", where, note));
  Sample s;
  if (prompt->is_string() && completion->is_string()) {
    s.kind = Sample::Kind::kPromptResponse;
    s.text = prompt->get<std::string>();
    s.response = completion->get<std::string>();
    if (s.response.empty()) throw InputError(fmt::format("{}: field \"completion\" is empty: nothing to train on", where));
    return s;
  }
  if (prompt->is_array() && completion->is_array()) {  // conversational: through the chat template
    if (prompt->empty()) throw InputError(fmt::format("{}: field \"prompt\" is an empty list of messages", where));
    if (completion->empty()) throw InputError(fmt::format("{}: field \"completion\" is an empty list: nothing to train on", where));
    check_messages(*prompt, "prompt", where);
    const size_t trained = check_messages(*completion, "completion", where);
    s.kind = Sample::Kind::kChat;
    s.first_trained = prompt->size();
    s.messages = std::move(*prompt);
    for (auto& m : *completion) s.messages.push_back(std::move(m));
    check_conversation(s.messages, trained, "completion", "prompt", where);
    return s;
  }
  auto kind = [](const nlohmann::ordered_json& v) { return v.is_string() ? "a string" : v.is_array() ? "a list" : v.type_name(); };
  throw InputError(fmt::format("{}: \"prompt\" is {} and \"completion\" {}: expected two strings (prompt-completion) or "
                               "two lists of messages (conversational prompt-completion)",
                               where, kind(*prompt), kind(*completion)));
}

}  // namespace

InputFormat parse_input_format(std::string_view name) {
  for (const auto& f : kFormatNames)
    if (name == f.name) return f.format;
  std::string known;
  for (const auto& f : kFormatNames) known += fmt::format("{}{}", known.empty() ? "" : ", ", f.name);
  throw InputError(fmt::format("unknown input format '{}' (expected one of {})", name, known));
}

const char* input_format_name(InputFormat format) {
  for (const auto& f : kFormatNames)
    if (format == f.format) return f.name;
  return "?";
}

bool is_chat_format(InputFormat format) { return format == InputFormat::kChat || format == InputFormat::kShareGpt; }

std::string alpaca_prompt(std::string_view instruction, std::string_view input) {
  if (input.empty())
    return fmt::format("Below is an instruction that describes a task. Write a response that appropriately completes "
                       "the request.\n\n### Instruction:\n{}\n\n### Response:\n",
                       instruction);
  return fmt::format("Below is an instruction that describes a task, paired with an input that provides further "
                     "context. Write a response that appropriately completes the request.\n\n### Instruction:\n{}"
                     "\n\n### Input:\n{}\n\n### Response:\n",
                     instruction, input);
}

InputFormat detect_format(const nlohmann::ordered_json& record, const std::string& jsonl_field, const std::string& where) {
  if (record.contains("messages")) return InputFormat::kChat;
  if (record.contains("conversations")) return InputFormat::kShareGpt;
  if (record.contains("instruction") && record.contains("output")) return InputFormat::kAlpaca;
  if (record.contains("prompt") && record.contains("completion")) return InputFormat::kPromptCompletion;
  if (record.contains(jsonl_field)) return InputFormat::kJsonl;
  std::string keys;
  for (auto it = record.begin(); it != record.end(); ++it) keys += fmt::format("{}\"{}\"", keys.empty() ? "" : ", ", it.key());
  throw InputError(fmt::format(
      "{}: cannot tell the format from the first record's keys ({}): known are chat (\"messages\"), sharegpt "
      "(\"conversations\"), alpaca (\"instruction\" + \"output\"), prompt_completion (\"prompt\" + \"completion\") and "
      "jsonl (\"{}\", set by --field); name one with --format",
      where, keys.empty() ? "none" : keys, jsonl_field));
}

std::string sharegpt_role(std::string_view from) {
  for (const auto& [f, role] : kShareGptRoles)
    if (from == f) return role;
  return {};
}

Sample record_sample(InputFormat format, nlohmann::ordered_json& record, const std::string& jsonl_field,
                     const std::string& where) {
  switch (format) {
    case InputFormat::kJsonl: {
      Sample s;
      const auto it = record.find(jsonl_field);
      if (it == record.end())
        throw InputError(fmt::format("{}: no field \"{}\" (set the field name with --field)", where, jsonl_field));
      if (!it->is_string())
        throw InputError(fmt::format("{}: field \"{}\" is {}, expected a string", where, jsonl_field, it->type_name()));
      s.text = it->get<std::string>();
      return s;
    }
    case InputFormat::kAlpaca: {
      const char* note = "alpaca records have instruction, input, output";
      Sample s;
      s.kind = Sample::Kind::kPromptResponse;
      const std::string instruction = string_field(record, "instruction", true, where, note);
      s.text = alpaca_prompt(instruction, string_field(record, "input", false, where, note));
      s.response = string_field(record, "output", true, where, note);
      if (s.response.empty()) throw InputError(fmt::format("{}: field \"output\" is empty: nothing to train on", where));
      return s;
    }
    case InputFormat::kChat: return chat_sample(record, where);
    case InputFormat::kShareGpt: return sharegpt_sample(record, where);
    case InputFormat::kPromptCompletion: return prompt_completion_sample(record, where);
    case InputFormat::kAuto:
    case InputFormat::kText: break;
  }
  throw InputError(fmt::format("{}: format {} has no JSON records", where, input_format_name(format)));
}

}  // namespace qshard
