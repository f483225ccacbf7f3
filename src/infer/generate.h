// generate.h: `qshard generate`: text from a model folder (f32/bf16/f16 or bitsandbytes 4-bit)
// with an optional PEFT adapter, one sequence at a time, with a KV cache, on the GPU or the CPU.
//
// The prompt: text encoded by the folder's tokenizer.json (text/hf_tokenizer.h) with its special
// tokens (BOS where the tokenizer adds one); with `chat`, the prompt (and `system`) as messages
// rendered by the folder's chat template with the generation prompt (text/chat_template.h), then
// encoded without special tokens, as transformers' apply_chat_template does. A folder without
// tokenizer.json uses the byte tokenizer (text/byte_tokenizer.h: BOS, the prompt's bytes), the
// one the demo's jobs train with. prompt_ids: the prompt as ids instead (no tokenizer read).
// Steps: the prompt in one forward (LlamaModel::forward_cached at position 0: the logits of its
// last position are `qshard eval`'s), then one token per step reading the cache.
// Sampling, in transformers' order: temperature < kGreedyBelowTemperature (1e-4; 0 included) is
// greedy (the first largest logit: a smaller temperature would scale the logits past float's
// range, and the draw is already greedy in effect well above it); else
// logits / temperature, then top-k (the k largest kept), then top-p (the smallest set of the most
// likely tokens whose probability reaches top_p, at least one), then a draw from the softmax with
// a std::mt19937_64 seeded by `seed` (the same seed and logits give the same tokens).
// Ranges (Sampler and generate_text throw InputError outside them; the CLI checks the same ones
// while parsing): temperature in [0, kMaxTemperature]; top_k in [0, kMaxTopK], 0 = off and a
// top_k at or above the vocab size keeps every token; top_p in (0, 1], 1 = off; max_new_tokens in
// [0, kMaxNewTokens] (generation stops at max_position_embeddings in any case).
// Stops at an end token (generation_config.json's eos_token_id, else config.json's, and the
// tokenizer's EOS; the byte tokenizer's EOS) unless ignore_eos, at max_new_tokens, or at the
// model's max_position_embeddings (GenerateResult says which). An eos_token_id that is not an id
// in [0, vocab_size) or a list of them is an InputError naming the file and the value.
// Streaming: on_text receives the text of each new token as it comes (bytes of an incomplete
// UTF-8 character are held until it completes); the end token is not part of the text.
// Errors: InputError naming the folder, flag or value.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/device_context.h"

namespace qshard {

inline constexpr double kGreedyBelowTemperature = 1e-4;
inline constexpr double kMaxTemperature = 100;
inline constexpr int64_t kMaxTopK = int64_t{1} << 24;       // model.init.vocab_size's cap
inline constexpr int64_t kMaxNewTokens = int64_t{1} << 30;  // keeps prompt + new tokens far from overflow

struct SamplingOptions {
  double temperature = 0.0;  // < kGreedyBelowTemperature: greedy
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off
  uint64_t seed = 0;
};

struct GenerateOptions {
  std::string model_dir;
  std::string adapter_dir;      // optional PEFT adapter
  std::string tokenizer_dir;    // default: model_dir
  std::string prompt;
  std::string system;           // chat only: a system message first
  bool chat = false;
  std::vector<int64_t> prompt_ids;  // instead of prompt (no tokenizer read unless text is wanted)
  int64_t max_new_tokens = 128;
  bool ignore_eos = false;
  SamplingOptions sampling;
  DeviceChoice device = DeviceChoice::kAuto;
  std::string dump_logits;      // optional: the first step's logits [1, V] f32 as safetensors ("logits")
  bool allow_nonfinite = false; // load weights holding NaN / Inf (--allow-nonfinite)
};

struct GenerateResult {
  std::vector<int64_t> prompt_ids;
  std::vector<int64_t> ids;     // the new tokens (an end token that stopped it included)
  std::string text;             // their text (the end token left out)
  bool stopped_at_eos = false;
  // Stopped before max_new_tokens because the next token would need a position past the model's
  // max_position_embeddings (`max_positions`): the caller says so, it is not a normal end.
  bool stopped_at_max_positions = false;
  int64_t max_positions = 0;    // config.json's max_position_embeddings
  double prefill_seconds = 0;   // the prompt's forward
  double decode_seconds = 0;    // every later step (sampling included)
  std::string device;           // "cpu" or "cuda"
};

// Picks the next token from logits [V] (REQUIRES: V >= 1); the generator carries on between
// calls. Throws InputError for a temperature, top_k or top_p outside the ranges above.
class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  int64_t next(std::span<const float> logits);

 private:
  SamplingOptions o_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int64_t>> order_;  // scratch: (score, id)
};

GenerateResult generate_text(const GenerateOptions& options,
                             const std::function<void(std::string_view)>& on_text = nullptr);

}  // namespace qshard
