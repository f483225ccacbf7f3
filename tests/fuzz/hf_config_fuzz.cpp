// libFuzzer target for config.json (checkpoint/hf_config.h): parse_json_input (nesting bounded)
// then LlamaConfig::from_json and the tensor list it implies. Property: an InputError or a
// config; no crash, no stack overflow, nothing else.
#include <cstdint>
#include <string_view>

#include "checkpoint/hf_config.h"
#include "runtime/error.h"
#include "runtime/input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const qshard::LlamaConfig c = qshard::LlamaConfig::from_json(qshard::parse_json_input(text, "fuzz"), "fuzz");
    if (c.num_hidden_layers <= 64 && c.hidden_size <= 1 << 16) (void)qshard::llama_expected_weights(c);
  } catch (const qshard::InputError&) {
  }
  return 0;
}
