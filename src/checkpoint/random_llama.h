// random_llama.h: writes a randomly initialised Llama as a Hugging Face folder
// (config.json + model.safetensors), for demos, benchmarks and tests.
//
// Weights: projections and embeddings ~ N(0, init_std) (transformers' initializer_range,
// default 0.02), norm weights 1. One generator for every random Llama qshard makes:
// random_normal(seed, fqn, ...) draws each tensor from its own std::mt19937_64 seeded by the seed
// and an FNV-1a hash of its name, with Box-Muller (large tensors: a counter-based generator, see
// kFastNormalElements) (the same bytes on every platform, in any visiting
// order, on any rank): `qshard init-model --seed s` writes the model that `model.init.seed: s`
// trains from (checkpoint/model_init.h), value for value in the same dtype. Streams one tensor at a
// time. The folder is written as "DIR.partial-<pid>" and renamed; DIR must not exist or be empty.
// LlamaSizes is the one struct of a Llama's sizes (init-model's flags and the train YAML's
// model.init both extend it); llama_config_json() the one place sizes become a config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"
#include "runtime/tensor.h"

namespace qshard {

struct LlamaSizes {
  int64_t vocab_size = 256;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 352;
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t max_position_embeddings = 512;
  bool tie_word_embeddings = false;
  ModelFamily family = ModelFamily::kLlama;  // config.json's model_type and the family's keys
  int64_t sliding_window = 0;                // Mistral: 0 writes null (no window)
};

// config.json of a Llama of these sizes (rms_norm_eps 1e-5, rope_theta 1e4, no rope scaling,
// bos 1 / eos 2), with torch_dtype `dtype` and initializer_range `init_std`; for another family its
// model_type, architectures and keys (qwen2 / qwen3: use_sliding_window false, qwen3
// attention_bias false and head_dim; mistral: sliding_window).
nlohmann::json llama_config_json(const LlamaSizes& sizes, DType dtype, double init_std = 0.02);

// n values ~ N(0, std) for the tensor named `fqn` under `seed` (the one generator, see above).
// Tensors of more than kFastNormalElements values (8B- and 70B-shaped models) draw from a
// counter-based generator instead (an Irwin-Hall sum of four uniforms: ~10x faster, same mean and
// variance, tails cut at 3.46 sigma), so a 70B random base is built in seconds per core, not minutes.
// threads: the counter-based path, value i a pure function of (seed, fqn, i), is split into chunks
// of 2^22 values over up to `threads` host threads (runtime/parallel.h): the same bytes at any
// count. The Box-Muller path is one sequential stream whatever `threads`.
inline constexpr int64_t kFastNormalElements = int64_t{1} << 24;
std::vector<float> random_normal(uint64_t seed, const std::string& fqn, int64_t n, double std, int threads = 1);
// The bytes of Tensor::from_f32(out.shape(), out.dtype(), random_normal(seed, fqn, out.numel(), std))
// written into `out` (f32, bf16 or f16; rounded as from_f32 rounds). A CPU tensor on the
// counter-based path gets each chunk written straight in its dtype (no float32 copy of the tensor);
// a device tensor is drawn on the host and copied. Errors: Error for a non-float or meta `out`.
void random_normal_into(Tensor& out, uint64_t seed, const std::string& fqn, double std, int threads = 1);

struct RandomLlamaOptions : LlamaSizes {
  DType dtype = DType::kBF16;
  double init_std = 0.02;
  uint64_t seed = 0;
};

// Returns the config that was written.
LlamaConfig write_random_llama_folder(const std::string& dir, const RandomLlamaOptions& options);

}  // namespace qshard
