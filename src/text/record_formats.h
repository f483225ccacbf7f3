// record_formats.h: the record formats of `qshard tokenize`: their names, detection from a record's
// keys (--format auto), and each JSON record turned into what is trained on (a Sample) with the
// record's errors named by file:line and field.
//
// Formats (JSON records come from text/json_record_reader.h: JSON Lines, or a .json file's array):
//   text               not JSON: whole files or blank-line paragraphs (byte_tokenizer.h).
//   jsonl              {"<field>": "..."} (field "text" unless --field): the string, all of it trained.
//   alpaca             {"instruction", "input"?, "output"}: Stanford Alpaca's prompt (alpaca_prompt())
//                      as context, the output trained.
//   chat               {"messages": [{"role", "content"}, ...]} with at least one assistant message:
//                      rendered by the model's chat template, the assistant messages trained.
//   sharegpt           {"conversations": [{"from", "value"}, ...]} (axolotl / LLaMA-Factory / Unsloth's
//                      "sharegpt"): each message becomes {"role", "content"} with `from` mapped as
//                      those tools map it (sharegpt_role()), then as chat. A string "system" key
//                      beside "conversations" (LLaMA-Factory's system column) becomes a first system
//                      message unless the conversation opens with one.
//   prompt_completion  TRL's prompt-completion: {"prompt": "...", "completion": "..."} trained like
//                      alpaca (the prompt context, the completion trained); or conversational,
//                      {"prompt": [messages], "completion": [messages]}: the two lists rendered as
//                      one conversation by the chat template, the completion's assistant messages
//                      trained (assistant messages inside the prompt are context).
// Checks (each an InputError "<where>: ..." naming the field, the message index and the value where
// there is one): a missing field or one of the wrong type; an empty conversation; a message without
// a string role / content (from / value); an unknown ShareGPT `from`; no assistant message (nothing
// to train on); an assistant message first (no prompt before it); an empty response.
// Thread safety: free functions, no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace qshard {

enum class InputFormat : uint8_t { kAuto, kText, kJsonl, kAlpaca, kChat, kShareGpt, kPromptCompletion };

// "auto" | "text" | "jsonl" | "alpaca" | "chat" | "sharegpt" | "prompt_completion"; anything else
// throws InputError naming the value and the names known.
InputFormat parse_input_format(std::string_view name);
const char* input_format_name(InputFormat format);
// The formats rendered by a chat template (they need --tokenizer with one).
bool is_chat_format(InputFormat format);

// --format auto for a JSON input, from its first record's keys: "messages" -> chat, "conversations"
// -> sharegpt, "instruction" + "output" -> alpaca, "prompt" + "completion" -> prompt_completion,
// `jsonl_field` -> jsonl (first match in that order). Anything else is an InputError naming `where`,
// the keys found and the formats known.
InputFormat detect_format(const nlohmann::ordered_json& record, const std::string& jsonl_field, const std::string& where);

// Stanford Alpaca's prompt for an instruction and an optional input (the text before the response).
std::string alpaca_prompt(std::string_view instruction, std::string_view input);

// A ShareGPT `from` as a chat role: human / user -> user; gpt / assistant / model -> assistant;
// system -> system; tool / function / observation -> tool. Empty for any other value.
std::string sharegpt_role(std::string_view from);

// What one record trains on.
struct Sample {
  enum class Kind : uint8_t {
    kText,            // `text`, all of it trained (BOS + text + EOS)
    kPromptResponse,  // BOS + prompt (context) + response + EOS (trained)
    kChat,            // `messages` rendered by the chat template; assistant messages from
                      // `first_trained` on are trained, everything else context
  };
  Kind kind = Kind::kText;
  std::string text;  // kText: the document; kPromptResponse: the prompt
  std::string response;
  nlohmann::ordered_json messages;  // kChat: {"role", "content"} objects
  size_t first_trained = 0;         // kChat: the first message whose assistant turns are trained
};

// The sample of `record` (a JSON object) read as `format` (not kAuto / kText). `where` names the
// record in errors ("file:line"). jsonl: an empty string gives an empty kText sample (skipped by
// the caller). `record` may be moved from.
Sample record_sample(InputFormat format, nlohmann::ordered_json& record, const std::string& jsonl_field,
                     const std::string& where);

}  // namespace qshard
