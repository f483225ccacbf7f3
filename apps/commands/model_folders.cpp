// qshard quantize / dequantize / init-model / inspect: the commands that read or write a model
// folder on the host, no ranks (see commands.h).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

#include "checkpoint/bnb_folder.h"
#include "checkpoint/inspect.h"
#include "checkpoint/random_llama.h"
#include "commands.h"
#include "number_options.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/tensor.h"
#include "text/token_file.h"
#include "text/tokenizer_fingerprint.h"
#include "train/train_config.h"

namespace qshard::cli {
namespace {

void print_report(const char* verb, const FolderReport& r, const std::string& out) {
  std::printf("%s %lld weights (%lld elements), copied %lld tensors -> %s (%d file%s)\n", verb,
              (long long)r.converted_tensors, (long long)r.converted_elements, (long long)r.copied_tensors, out.c_str(),
              r.files_written, r.files_written == 1 ? "" : "s");
  std::printf("bytes in %.2f MB, bytes out %.2f MB\n", r.bytes_in / 1e6, r.bytes_out / 1e6);
}

// --- quantize ------------------------------------------------------------------------------------

struct QuantizeArgs {
  std::string in, out, type = "nf4", compute = "float32", device = "auto";
  int64_t blocksize = 64;
  bool no_double_quant = false, cpu = false, allow_nonfinite = false;
  double shard_gb = 5.0;
  int threads = 0;
};

void add_quantize(CLI::App& sub, QuantizeArgs& a) {
  sub.add_option("IN_DIR", a.in, "input folder (config.json + safetensors)")->required();
  sub.add_option("OUT_DIR", a.out, "output folder (must not exist or be empty)")->required();
  sub.add_option("--quant-type", a.type, "nf4 | fp4");
  add_int_option(sub, "--blocksize", a.blocksize, 32, 4096, "elements per absmax block (a power of two)");
  sub.add_flag("--no-double-quant", a.no_double_quant, "keep absmax in float32 (no double quantization)");
  sub.add_option("--compute-dtype", a.compute,
                 "quantization_config.bnb_4bit_compute_dtype: float32 (transformers' own default) | bfloat16 | float16 "
                 "(default: float32)");
  sub.add_option("--device", a.device, "auto (the GPU when there is one) | cpu | cuda; the output is the same")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub.add_flag("--cpu", a.cpu, "same as --device cpu")->group("");  // the older name, kept working
  sub.add_flag("--allow-nonfinite", a.allow_nonfinite, "quantize weights holding NaN/Inf (refused by default)");
  add_double_option(sub, "--max-shard-size-gb", a.shard_gb, kMinShardGb, kMaxShardGb,
                    "split the output into files of at most this size (a larger tensor: a file of its own)");
  add_int_option(sub, "--threads", a.threads, 1, 256,
                 "host threads quantizing tensors at once on the CPU (default: the host's, at most 16, as "
                 "memory allows); the output is the same for any count");
  sub.footer("Example:\n  qshard quantize models/Llama-3.2-1B models/Llama-3.2-1B-bnb4 --quant-type nf4");
}

int run_quantize(QuantizeArgs& a, int, char**) {
  QuantizeFolderOptions o;
  o.quant.quant_type = parse_quant_type(a.type);
  o.quant.blocksize = a.blocksize;
  o.quant.compress_statistics = !a.no_double_quant;
  if (a.cpu) a.device = "cpu";
  o.use_cuda = a.device != "cpu";
  if (a.device == "cuda" && !cuda_available())
    throw InputError("--device cuda: no GPU is visible to this process (use --device auto or cpu)");
  o.allow_nonfinite = a.allow_nonfinite;
  o.threads = a.threads;
  const auto compute = parse_dtype(a.compute);
  if (!compute || !dtype_is_float(*compute))
    throw InputError("--compute-dtype '" + a.compute + "' is not float32, bfloat16 or float16");
  o.compute_dtype = *compute;
  o.max_shard_bytes = static_cast<uint64_t>(a.shard_gb * 1e9);
  FolderReport r = quantize_model_folder(a.in, a.out, o);
  print_report("quantized", r, a.out);
  std::printf("%s blocksize %lld%s: quantization error max |x - q(x)| = %.6g, relative RMS = %.4f%%\n",
              a.type.c_str(), (long long)a.blocksize, a.no_double_quant ? "" : " double-quant", r.max_abs_err,
              100.0 * r.rel_rms_err());
  if (r.nonfinite_values > 0)
    std::printf("warning: %lld NaN/Inf input values were quantized (--allow-nonfinite); they are not in the "
                "error figures above\n", (long long)r.nonfinite_values);
  return 0;
}

// --- dequantize ----------------------------------------------------------------------------------

struct DequantizeArgs {
  std::string in, out, dtype;
  double shard_gb = 5.0;
  bool allow_nonfinite = false;
};

void add_dequantize(CLI::App& sub, DequantizeArgs& a) {
  sub.add_option("IN_DIR", a.in, "bitsandbytes 4-bit folder")->required();
  sub.add_option("OUT_DIR", a.out, "output folder (must not exist or be empty)")->required();
  sub.add_option("--dtype", a.dtype, "bfloat16 | float16 | float32 (default: the dtype each weight was quantized from)");
  sub.add_flag("--allow-nonfinite", a.allow_nonfinite, "dequantize statistics that decode to NaN/Inf (refused by default)");
  add_double_option(sub, "--max-shard-size-gb", a.shard_gb, kMinShardGb, kMaxShardGb,
                    "split the output into files of at most this size (a larger tensor: a file of its own)");
  sub.footer("Example:\n  qshard dequantize models/Llama-3.2-1B-bnb4 models/Llama-3.2-1B-bf16 --dtype bfloat16");
}

int run_dequantize(DequantizeArgs& a, int, char**) {
  std::optional<DType> dt;
  if (!a.dtype.empty()) {
    dt = parse_dtype(a.dtype);
    if (!dt || !dtype_is_float(*dt)) throw InputError("--dtype '" + a.dtype + "' is not bfloat16, float16 or float32");
  }
  FolderReport r = dequantize_model_folder(a.in, a.out, dt, static_cast<uint64_t>(a.shard_gb * 1e9), a.allow_nonfinite);
  print_report("dequantized", r, a.out);
  return 0;
}

// --- init-model ----------------------------------------------------------------------------------

// init-model's sizes: 1..INT32_MAX; write_random_llama_folder checks how they fit together and
// what they need (host memory, disk: 10^9 layers is refused naming the bytes, probe_suite_check.sh).
constexpr int64_t kMaxModelSize = INT32_MAX;

struct InitModelArgs {
  RandomLlamaOptions ro;
  std::string out, dtype = "bfloat16", config, family = "llama";
  CLI::Option* seed_option = nullptr;   // count() tells --seed given from the default
  CLI::Option* dtype_option = nullptr;  // the same for --dtype
};

void add_init_model(CLI::App& sub, InitModelArgs& a) {
  sub.add_option("--out", a.out, "output folder (must not exist or be empty)")->required();
  sub.add_option("--config", a.config,
                 "take the sizes and seed from a train YAML's model.init (model.init.dtype unless --dtype): the model it trains");
  add_int_option(sub, "--vocab-size", a.ro.vocab_size, 1, kMaxModelSize);
  add_int_option(sub, "--hidden-size", a.ro.hidden_size, 1, kMaxModelSize);
  add_int_option(sub, "--intermediate-size", a.ro.intermediate_size, 1, kMaxModelSize);
  add_int_option(sub, "--layers", a.ro.num_hidden_layers, 1, kMaxModelSize);
  add_int_option(sub, "--heads", a.ro.num_attention_heads, 1, kMaxModelSize);
  add_int_option(sub, "--kv-heads", a.ro.num_key_value_heads, 1, kMaxModelSize);
  add_int_option(sub, "--max-positions", a.ro.max_position_embeddings, 1, kMaxModelSize);
  sub.add_flag("--tie-embeddings", a.ro.tie_word_embeddings);
  sub.add_option("--family", a.family,
                 "llama | qwen2 | qwen3 | mistral | phi3 | gemma2 | gemma3_text (config.json's model_type)");
  add_int_option(sub, "--sliding-window", a.ro.sliding_window, 0, kMaxModelSize);
  a.dtype_option = sub.add_option("--dtype", a.dtype, "bfloat16 | float16 | float32");
  a.seed_option = add_int_option(sub, "--seed", a.ro.seed, 0, INT64_MAX);
  sub.footer("Example:\n  qshard init-model --out /tmp/tiny_llama --config configs/tiny.yaml   (the model tiny.yaml trains)\n"
             "  qshard init-model --out /tmp/small --layers 2 --hidden-size 64 --heads 4 --kv-heads 2");
}

int run_init_model(InitModelArgs& a, int, char**) {
  RandomLlamaOptions& ro = a.ro;
  auto dt = parse_dtype(a.dtype);
  if (!dt || !dtype_is_float(*dt)) throw InputError("--dtype '" + a.dtype + "' is not bfloat16, float16 or float32");
  ro.dtype = *dt;
  if (!a.config.empty()) {
    // The model model.init trains from: its sizes, its seed, and (unless --dtype says
    // otherwise) model.init.dtype, the dtype model.init draws in: the same values as training gets.
    const ModelInitConfig m = load_train_config(a.config).model.init;
    if (m.draw_4bit)
      throw InputError("init-model --config " + a.config + ": model.init.draw_4bit is true: that job's 4-bit base "
                       "is drawn directly in 4-bit, with no float original to write; set it to false for the "
                       "model init-model writes (the base quantized from that folder is then the job's)");
    static_cast<LlamaSizes&>(ro) = m;
    if (a.seed_option->count() == 0) ro.seed = m.seed;
    if (a.dtype_option->count() == 0) ro.dtype = m.dtype;
  }
  bool known = false;
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kQwen2, ModelFamily::kQwen3, ModelFamily::kMistral,
                        ModelFamily::kPhi3, ModelFamily::kGemma2, ModelFamily::kGemma3})
    if (a.family == model_family_name(f)) ro.family = f, known = true;
  if (!known)
    throw InputError("--family '" + a.family + "' is not llama, qwen2, qwen3, mistral, phi3, gemma2 or gemma3_text");
  if (ro.sliding_window > 0 && (ro.family == ModelFamily::kLlama || ro.family == ModelFamily::kQwen2 ||
                                ro.family == ModelFamily::kQwen3))
    throw InputError("--sliding-window " + std::to_string(ro.sliding_window) +
                     " is for --family mistral, phi3, gemma2 or gemma3_text only");
  const LlamaConfig c = write_random_llama_folder(a.out, ro);
  int64_t params = 0;
  for (const auto& [name, shape] : llama_expected_weights(c)) params += shape_numel(shape);
  std::printf("wrote a random %s (%lld layers, hidden %lld, %.2f M parameters, %s) to %s\n",
              model_family_name(c.family), (long long)c.num_hidden_layers, (long long)c.hidden_size, params / 1e6, dtype_torch_name(ro.dtype),
              a.out.c_str());
  return 0;
}

// --- inspect -------------------------------------------------------------------------------------

struct InspectArgs {
  std::string path;
  bool check = false, quiet = false;
};

void add_inspect(CLI::App& sub, InspectArgs& a) {
  sub.add_option("PATH", a.path, "a .safetensors file, a Hugging Face folder, a folder of safetensors or a token file (.tok)")->required();
  sub.add_flag("--check", a.check, "exit non-zero if any key does not resolve or any tensor fails validation");
  sub.add_flag("--quiet", a.quiet, "print only the summary and problems");
  sub.footer("Example:\n  qshard inspect --check --quiet models/Llama-3.2-1B-bnb4");
}

// A token file (magic "QSTOKENS", or a name ending .tok): its header, its documents and loss
// targets (one scan of the tokens, each id checked against the vocabulary) and the tokenizer that
// made it. A malformed one is an InputError naming the file and what is wrong (exit 2).
bool is_token_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  if (std::filesystem::path(path).extension() == ".tok") return true;
  char magic[sizeof(kTokenFileMagic)] = {};
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  const bool match = std::fread(magic, 1, sizeof(magic), f) == sizeof(magic) &&
                     std::memcmp(magic, kTokenFileMagic, sizeof(magic)) == 0;
  std::fclose(f);
  return match;
}

int inspect_token_file(const std::string& path) {
  const TokenFile f = TokenFile::open(path);
  f.validate(f.vocab_size());
  int64_t documents = 0, targets = 0;
  for (const uint32_t t : f.tokens()) {
    documents += f.doc_starts() && (t & kTokenDocStart) != 0;
    targets += !f.loss_mask() || (t & kTokenNoLoss) == 0;
  }
  std::printf("%s: token file, version %u\n", path.c_str(), f.version());
  std::printf("  tokens      %lld (uint32)\n", (long long)f.size());
  std::printf("  vocab_size  %u\n", f.vocab_size());
  if (f.doc_starts()) std::printf("  documents   %lld\n", (long long)documents);
  else std::printf("  documents   not recorded (version %u)\n", f.version());
  std::printf("  targets     %lld (tokens the loss is taken on)\n", (long long)targets);
  std::printf("  tokenizer   %s\n", f.tokenizer_fingerprint() == kNoTokenizerFingerprint
                                     ? "not recorded (written before version 4)"
                                     : fingerprint_name(f.tokenizer_fingerprint()).c_str());
  return 0;
}

int run_inspect(InspectArgs& a, int, char**) {
  if (is_token_file(a.path)) return inspect_token_file(a.path);
  const InspectReport r = inspect_path(a.path);
  std::printf("%s: %s\n", r.path.c_str(), r.kind.empty() ? "unreadable" : r.kind.c_str());
  uint64_t total = 0;
  int resolved = 0;
  for (const auto& row : r.rows) {
    total += row.bytes;
    resolved += row.resolved && row.bytes_match;
    if (!a.quiet)
      std::printf("  %-64s %-5s %-16s %12llu  %s%s\n", row.key.c_str(), row.dtype.c_str(), shape_str(row.shape).c_str(),
                  (unsigned long long)row.bytes, row.resolved ? "-> " : "UNRESOLVED: ", row.node.c_str());
  }
  std::printf("%zu keys, %.2f MB; %d resolve to the bytes stored under them\n", r.rows.size(), total / 1e6, resolved);
  for (const auto& p : r.problems) std::printf("problem: %s\n", p.c_str());
  if (a.check && !r.ok()) return 3;
  return 0;
}

}  // namespace

CommandMain attach_quantize(CLI::App& sub) { return attach_with(sub, add_quantize, run_quantize); }
CommandMain attach_dequantize(CLI::App& sub) { return attach_with(sub, add_dequantize, run_dequantize); }
CommandMain attach_init_model(CLI::App& sub) { return attach_with(sub, add_init_model, run_init_model); }
CommandMain attach_inspect(CLI::App& sub) { return attach_with(sub, add_inspect, run_inspect); }

}  // namespace qshard::cli
