#include "checkpoint/random_llama.h"

#include <algorithm>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "checkpoint/safetensors.h"
#include "runtime/input_file.h"
#include "runtime/machine.h"
#include "runtime/parallel.h"

namespace qshard {
namespace fs = std::filesystem;

nlohmann::json llama_config_json(const LlamaSizes& o, DType dtype, double init_std) {
  nlohmann::json j;
  static const char* const kArchitectures[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                               "MistralForCausalLM", "Phi3ForCausalLM"};
  j["architectures"] = {kArchitectures[static_cast<int>(o.family)]};
  j["model_type"] = model_family_name(o.family);
  j["vocab_size"] = o.vocab_size;
  j["hidden_size"] = o.hidden_size;
  j["intermediate_size"] = o.intermediate_size;
  j["num_hidden_layers"] = o.num_hidden_layers;
  j["num_attention_heads"] = o.num_attention_heads;
  j["num_key_value_heads"] = o.num_key_value_heads;
  j["max_position_embeddings"] = o.max_position_embeddings;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = 1e-5;
  j["rope_theta"] = 10000.0;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = o.tie_word_embeddings;
  switch (o.family) {
    case ModelFamily::kLlama:
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
      break;
    case ModelFamily::kQwen2:
    case ModelFamily::kQwen3:
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
      if (o.family == ModelFamily::kQwen3) {
        j["attention_bias"] = false;
        if (o.num_attention_heads > 0) j["head_dim"] = o.hidden_size / o.num_attention_heads;
      }
      break;
    case ModelFamily::kMistral:
    case ModelFamily::kPhi3:  // Phi-3: fused qkv_proj / gate_up_proj in the folder (llama_expected_weights)
      j["sliding_window"] = o.sliding_window > 0 ? nlohmann::json(o.sliding_window) : nlohmann::json(nullptr);
      break;
    case ModelFamily::kGemma2:
    case ModelFamily::kGemma3:  // Gemma2Config / Gemma3TextConfig's defaults but the sizes
      j.erase("hidden_act");
      j["hidden_activation"] = "gelu_pytorch_tanh";
      j["attention_bias"] = false;
      if (o.num_attention_heads > 0) {
        j["head_dim"] = o.hidden_size / o.num_attention_heads;
        j["query_pre_attn_scalar"] = o.hidden_size / o.num_attention_heads;
      }
      j["sliding_window"] = o.sliding_window > 0 ? o.sliding_window : 4096;
      if (o.family == ModelFamily::kGemma3) j["rope_theta"] = 1000000.0;
      break;
  }
  j["initializer_range"] = init_std;
  // The special ids of transformers' Llama default, where the vocabulary has them (generate
  // refuses an end token outside it).
  j["bos_token_id"] = o.vocab_size > 1 ? nlohmann::json(1) : nlohmann::json(nullptr);
  j["eos_token_id"] = o.vocab_size > 2 ? nlohmann::json(2) : nlohmann::json(nullptr);
  j["torch_dtype"] = dtype_torch_name(dtype);
  return j;
}

namespace {

// random_normal's stream key: FNV-1a over the name, mixed with the seed.
uint64_t normal_key(uint64_t seed, const std::string& fqn) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : fqn) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The counter-based value i: splitmix64(h + i * golden) as four 16-bit uniforms, summed, centred
// and scaled to unit variance (Irwin-Hall, |z| <= 2 sqrt(3)); scale = std sqrt(3) / 65536.
inline float fast_normal(uint64_t h, int64_t i, double scale) {
  uint64_t z = h + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const int64_t sum = static_cast<int64_t>(z & 0xffff) + static_cast<int64_t>((z >> 16) & 0xffff) +
                      static_cast<int64_t>((z >> 32) & 0xffff) + static_cast<int64_t>(z >> 48);
  return static_cast<float>((static_cast<double>(sum) - 131070.0) * scale);
}

constexpr int64_t kFastChunk = int64_t{1} << 22;  // values per parallel work item

// body(begin, end) over [0, n) in chunks of kFastChunk on up to `threads` threads.
template <class F>
void for_chunks(int64_t n, int threads, F&& body) {
  const int64_t chunks = (n + kFastChunk - 1) / kFastChunk;
  parallel_for(static_cast<size_t>(chunks), threads, [&](size_t c) {
    const int64_t begin = static_cast<int64_t>(c) * kFastChunk;
    body(begin, std::min(n, begin + kFastChunk));
  });
}

}  // namespace

std::vector<float> random_normal(uint64_t seed, const std::string& fqn, int64_t n, double std, int threads) {
  const uint64_t h = normal_key(seed, fqn);
  if (n > kFastNormalElements) {
    std::vector<float> v(static_cast<size_t>(n));
    const double scale = std * std::sqrt(3.0) / 65536.0;  // (sum of 4 u16 - 4 * 32767.5) -> N(0, std)
    float* out = v.data();
    for_chunks(n, threads, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = fast_normal(h, i, scale);
    });
    return v;
  }
  std::mt19937_64 g(h);
  auto uniform = [&g] { return (static_cast<double>(g() >> 11) + 0.5) * (1.0 / 9007199254740992.0); };
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i += 2) {  // Box-Muller: two normals from two uniforms
    const double r = std::sqrt(-2.0 * std::log(uniform())), t = 2.0 * M_PI * uniform();
    v[i] = static_cast<float>(std * r * std::cos(t));
    if (i + 1 < n) v[i + 1] = static_cast<float>(std * r * std::sin(t));
  }
  return v;
}

void random_normal_into(Tensor& out, uint64_t seed, const std::string& fqn, double std, int threads) {
  if (!dtype_is_float(out.dtype()) || (out.numel() > 0 && !out.raw()))
    throw Error("random_normal_into: " + fqn + " needs a float tensor with storage, got " +
                dtype_torch_name(out.dtype()) + shape_str(out.shape()));
  const int64_t n = out.numel();
  if (n <= kFastNormalElements || out.device() != Device::kCpu) {  // device memory: drawn on the host, copied
    out.copy_from(Tensor::from_f32(out.shape(), out.dtype(), random_normal(seed, fqn, n, std, threads)));
    return;
  }
  const uint64_t h = normal_key(seed, fqn);
  const double scale = std * std::sqrt(3.0) / 65536.0;
  const DType dt = out.dtype();
  void* raw = out.raw();
  for_chunks(n, threads, [&](int64_t begin, int64_t end) {
    if (dt == DType::kF32) {
      float* p = static_cast<float*>(raw);
      for (int64_t i = begin; i < end; ++i) p[i] = fast_normal(h, i, scale);
    } else if (dt == DType::kBF16) {
      uint16_t* p = static_cast<uint16_t*>(raw);
      for (int64_t i = begin; i < end; ++i) p[i] = f32_to_bf16(fast_normal(h, i, scale));
    } else {
      uint16_t* p = static_cast<uint16_t*>(raw);
      for (int64_t i = begin; i < end; ++i) p[i] = f32_to_f16(fast_normal(h, i, scale));
    }
  });
}

LlamaConfig write_random_llama_folder(const std::string& dir, const RandomLlamaOptions& o) {
  const nlohmann::json j = llama_config_json(o, o.dtype, o.init_std);
  const LlamaConfig cfg = LlamaConfig::from_json(j, "random llama config");

  check_output_folder(dir, "output folder");
  // Before anything is built or written: the disk for the whole model, the host memory for its
  // largest tensor (drawn in f32, then converted).
  const double dsize = static_cast<double>(dtype_size(o.dtype));
  require_disk(llama_size(cfg).total() * dsize, dir, "init-model (" + llama_size_keys(cfg) + ")");
  const double largest = std::max({static_cast<double>(cfg.vocab_size) * static_cast<double>(cfg.hidden_size),
                                   static_cast<double>(cfg.intermediate_size) * static_cast<double>(cfg.hidden_size),
                                   static_cast<double>(cfg.num_attention_heads * cfg.head_dim) *
                                       static_cast<double>(cfg.hidden_size)});
  require_host_memory(largest * (4.0 + dsize), "init-model", "its largest tensor, " + llama_size_keys(cfg));
  const fs::path partial = partial_dir_for(dir);
  fs::remove_all(partial);
  fs::create_directories(partial);
  try {
    const auto weights = llama_expected_weights(cfg);
    SafetensorsWriter w((partial / "model.safetensors").string());
    for (const auto& [name, shape] : weights) w.declare(name, o.dtype, shape);
    w.begin({{"format", "pt"}});
    for (const auto& [name, shape] : weights) {
      const int64_t n = shape_numel(shape);
      const bool norm = name.find("norm.weight") != std::string::npos;  // q_norm / k_norm too
      // The identity norm: weight 1, or 0 where the norm multiplies by 1 + weight (Gemma).
      const float unit = cfg.gemma_norms ? 0.0f : 1.0f;
      const std::vector<float> v = norm ? std::vector<float>(static_cast<size_t>(n), unit)
                                        : random_normal(o.seed, name, n, o.init_std, host_threads(32));
      w.write(name, Tensor::from_f32(shape, o.dtype, v).bytes());
    }
    w.finish();
    write_file_atomic((partial / "config.json").string(), j.dump(2) + "\n");
    if (fs::exists(dir)) fs::remove(dir);
    fs::rename(partial, dir);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(partial, ec);
    throw;
  }
  return cfg;
}

}  // namespace qshard
