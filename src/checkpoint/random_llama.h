// random_llama.h: writes a randomly initialised Llama as a Hugging Face folder
// (config.json + model.safetensors), for demos, benchmarks and tests.
//
// Weights: projections and embeddings ~ N(0, init_std) (transformers' initializer_range,
// default 0.02), norm weights 1. Deterministic for a seed (std::mt19937_64 + Box-Muller, so
// the bytes are the same on every platform). Streams one tensor at a time. The folder is
// written as "DIR.partial-<pid>" and renamed; DIR must not exist or be empty.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/hf_config.h"

namespace qshard {

struct RandomLlamaOptions {
  int64_t vocab_size = 256;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 352;
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t max_position_embeddings = 512;
  bool tie_word_embeddings = false;
  DType dtype = DType::kBF16;
  double init_std = 0.02;
  uint64_t seed = 0;
};

// Returns the config that was written.
LlamaConfig write_random_llama_folder(const std::string& dir, const RandomLlamaOptions& options);

}  // namespace qshard
