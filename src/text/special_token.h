// special_token.h: a special token (bos_token, eos_token, ...) as tokenizer_config.json and
// special_tokens_map.json give it, read the way transformers reads it: a string, or an AddedToken
// object whose "content" is the string ({"__type": "AddedToken", "content": "<s>", ...}).
// Another type is an InputError naming the file and the key (runtime/json_field.h): read as unset,
// a config's {"eos_token": 5} left generation without its end token, in silence.
// Used by the native tokenizer (hf_tokenizer.cpp) and the chat template (chat_template.cpp);
// header only, so that a build without the tokenizer (no PCRE2) has it too.
#pragma once

#include <string>

#include "runtime/json_field.h"

namespace qshard {

// Json: nlohmann::json or nlohmann::ordered_json. REQUIRES f not null (JsonField::find skips null).
template <class Json>
std::string special_token_text(const BasicJsonField<Json>& f) {
  if (f.json().is_object()) return f.at("content", "a string").string();
  if (!f.json().is_string()) f.expected("a token: a string or {\"content\": \"...\"}");
  return f.string();
}

}  // namespace qshard
