// qshard eval / generate: a model folder (+ PEFT adapter) on one process: loss and perplexity on
// token data, or text streamed as it comes (see commands.h).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "commands.h"
#include "number_options.h"
#include "checkpoint/safetensors.h"
#include "infer/evaluate.h"
#include "infer/generate.h"
#include "runtime/device_context.h"
#include "runtime/error.h"
#include "runtime/input_file.h"

namespace qshard::cli {
namespace {

// --- eval ----------------------------------------------------------------------------------------

struct EvalArgs {
  EvalOptions eo;
  std::string device = "auto";
};

void add_eval(CLI::App& sub, EvalArgs& a) {
  EvalOptions& eo = a.eo;
  sub.add_option("--model", eo.model_dir, "HF folder: f32/bf16/f16 or bitsandbytes 4-bit")->required();
  sub.add_option("--adapter", eo.adapter_dir, "PEFT LoRA adapter folder");
  sub.add_option("--data", eo.data, "token file, or .json list of token-id lists")->required();
  sub.add_option("--dump-logits", eo.dump_logits, "write float32 logits [batch, seq, vocab] (key 'logits')");
  add_int_option(sub, "--seq-len", eo.seq_len, 1, int64_t{1} << 30,
                 "sequence length for token files (default min(512, max positions))");
  sub.add_flag("--allow-nonfinite", eo.allow_nonfinite, "load weights holding NaN/Inf (refused by default)");
  sub.add_option("--device", a.device, "auto (the GPU when there is one) | cpu | cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub.footer("Example:\n  qshard eval --model build/runs/tiny/ckpt/final/base_bnb4 --adapter build/runs/tiny/ckpt/final/adapter "
             "--data /tmp/tiny.tok --seq-len 128");
}

int run_eval(EvalArgs& a, int, char**) {
  EvalOptions& eo = a.eo;
  eo.device = *parse_device_choice(a.device);
  if (!eo.dump_logits.empty()) check_output_file(eo.dump_logits, "--dump-logits");
  const EvalResult r = evaluate_model(eo);
  std::printf("eval: %lld sequences, %lld tokens: loss %.6f, perplexity %.4f\n", (long long)r.sequences,
              (long long)r.tokens, r.loss, r.perplexity);
  if (!eo.dump_logits.empty()) std::printf("logits written to %s\n", eo.dump_logits.c_str());
  return 0;
}

// --- generate ------------------------------------------------------------------------------------

struct GenerateArgs {
  GenerateOptions go;
  std::string device = "auto", prompt_ids, json;
};

void add_generate(CLI::App& sub, GenerateArgs& a) {
  GenerateOptions& go = a.go;
  sub.add_option("--model", go.model_dir, "HF folder: f32/bf16/f16 or bitsandbytes 4-bit")->required();
  sub.add_option("--adapter", go.adapter_dir, "PEFT LoRA adapter folder");
  sub.add_option("--tokenizer", go.tokenizer_dir, "folder with tokenizer.json (default: --model; none: bytes)");
  sub.add_option("--prompt", go.prompt, "the prompt text (with --chat: the user's message)");
  sub.add_option("--prompt-ids", a.prompt_ids, "the prompt as token ids, comma-separated (instead of --prompt)");
  sub.add_flag("--chat", go.chat, "render the prompt with the folder's chat template (generation prompt added)");
  sub.add_option("--system", go.system, "with --chat: a system message first");
  add_int_option(sub, "--max-new-tokens", go.max_new_tokens, 0, kMaxNewTokens, "tokens to generate at most (default 128)");
  add_double_option(sub, "--temperature", go.sampling.temperature, 0, kMaxTemperature,
                    "0 (default): greedy; else sample from softmax(logits / T); below 1e-4: greedy");
  add_int_option(sub, "--top-k", go.sampling.top_k, 0, kMaxTopK,
                 "sample among the k most likely tokens (0: all; above the vocab size: all)");
  add_double_option(sub, "--top-p", go.sampling.top_p, 0, 1,
                    "sample among the most likely tokens holding this probability (1: all)", Bound::kOpen);
  add_int_option(sub, "--seed", go.sampling.seed, 0, INT64_MAX, "the sampler's seed (default 0)");
  sub.add_flag("--ignore-eos", go.ignore_eos, "do not stop at an end token");
  sub.add_option("--dump-logits", go.dump_logits, "write the first step's float32 logits [1, vocab] (key 'logits')");
  sub.add_option("--json", a.json, "write prompt ids, new ids, text and timings as JSON here");
  sub.add_flag("--allow-nonfinite", go.allow_nonfinite, "load weights holding NaN/Inf (refused by default)");
  sub.add_option("--device", a.device, "auto (the GPU when there is one) | cpu | cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub.footer("Example:\n  qshard generate --model models/Llama-3.2-1B-Instruct --adapter /tmp/adapter --chat "
             "--prompt \"Hello\" --max-new-tokens 64");
}

int run_generate(GenerateArgs& a, int, char**) {
  GenerateOptions& go = a.go;
  go.device = *parse_device_choice(a.device);
  if (!go.dump_logits.empty()) check_output_file(go.dump_logits, "--dump-logits");
  if (!a.json.empty()) check_output_file(a.json, "--json");
  const std::string& ids = a.prompt_ids;
  for (size_t at = 0; !ids.empty() && at <= ids.size();) {  // "1,2,3"; "1," names its empty last id
    const size_t comma = std::min(ids.find(',', at), ids.size());
    const std::string item = ids.substr(at, comma - at);
    go.prompt_ids.push_back(parse_int("--prompt-ids (ids like 1,2,3)", item, 0, kMaxTopK - 1));
    at = comma + 1;
  }
  const GenerateResult r = generate_text(go, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    // A closed pipe or a full disk: stop generating text no one receives (main names it, exit 2).
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
      throw InputError(std::string("writing the standard output failed: ") + std::strerror(errno) +
                       "; generation stopped");
  });
  std::printf("\n");
  // The text before the statistics (stderr) when both go to one file; lost text is an error
  // before --json is written.
  if (std::fflush(stdout) != 0 || std::ferror(stdout))
    throw InputError(std::string("writing the standard output failed: ") + std::strerror(errno));
  if (r.stopped_at_max_positions)
    std::fprintf(stderr,
                 "generate: stopped after %zu of --max-new-tokens %lld new tokens: the model's max_position_embeddings "
                 "(%lld) is reached (%zu prompt tokens)\n",
                 r.ids.size(), (long long)go.max_new_tokens, (long long)r.max_positions, r.prompt_ids.size());
  const double n = static_cast<double>(r.ids.size());
  std::fprintf(stderr, "generate (%s): %zu prompt tokens in %.3f s (%.1f tokens/s), %zu new tokens in %.3f s (%.1f tokens/s)%s\n",
               r.device.c_str(), r.prompt_ids.size(), r.prefill_seconds,
               static_cast<double>(r.prompt_ids.size()) / std::max(r.prefill_seconds, 1e-9), r.ids.size(),
               r.decode_seconds, n > 1 ? (n - 1) / std::max(r.decode_seconds, 1e-9) : 0.0,
               r.stopped_at_eos ? ", stopped at an end token" : "");
  if (!a.json.empty()) {
    nlohmann::json j = {{"prompt_ids", r.prompt_ids}, {"ids", r.ids}, {"text", r.text},
                        {"stopped_at_eos", r.stopped_at_eos},
                        {"stopped_at_max_positions", r.stopped_at_max_positions},
                        {"prefill_seconds", r.prefill_seconds},
                        {"decode_seconds", r.decode_seconds}, {"device", r.device}};
    write_file_atomic(a.json, j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
  if (!go.dump_logits.empty()) std::fprintf(stderr, "first-step logits written to %s\n", go.dump_logits.c_str());
  return 0;
}

}  // namespace

CommandMain attach_eval(CLI::App& sub) { return attach_with(sub, add_eval, run_eval); }
CommandMain attach_generate(CLI::App& sub) { return attach_with(sub, add_generate, run_generate); }

}  // namespace qshard::cli
