// qshard: the command-line entry point. Subcommands:
//   version                         build and backend information
//   quantize IN_DIR OUT_DIR         HF Llama folder -> bitsandbytes 4-bit folder
//   dequantize IN_DIR OUT_DIR       bitsandbytes 4-bit folder -> float folder (each weight in the
//                                   dtype it was quantized from, or --dtype)
//   init-model --out DIR [sizes]    a random tiny Llama as a Hugging Face folder
//   inspect PATH [--check]          keys, dtypes, shapes, bytes and the node each key resolves to
//   tokenize IN... --out FILE       text / jsonl -> token file with the byte-level tokenizer
//   train --config FILE [--set k=v] [--resume auto|PATH]
//                                   the QLoRA training job (run under mpirun for several ranks)
//   export CKPT --format bnb4|peft|merged --out DIR
//                                   a training checkpoint as a Hugging Face / PEFT folder
//   eval --model DIR [--adapter DIR] --data FILE [--dump-logits FILE]   loss and perplexity
//   generate --model DIR [--adapter DIR] --prompt TEXT [--chat] [--max-new-tokens N]
//            [--temperature T --top-k K --top-p P --seed S]   text from a model, streamed
//   bench [--preset 8b] [--batch B --seq T --rank R] [--offload] [--gpu-budget-gb G] [--json F]
//                                   training speed and memory on a random Llama-shaped model
// Exit codes: 0 success, 2 bad input (the message names the file, key or value), 1 other errors.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <optional>
#include <string>

#include "checkpoint/bnb_folder.h"
#include "checkpoint/inspect.h"
#include "checkpoint/random_llama.h"
#include "runtime/failure.h"
#include "runtime/mpi_communicator.h"
#include "runtime/runtime.h"
#include "runtime/world.h"
#include "train/bench.h"
#include "text/byte_tokenizer.h"
#include "infer/evaluate.h"
#include "infer/generate.h"
#include "train/train_checkpoint.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/tensor.h"

#ifndef QSHARD_VERSION
#define QSHARD_VERSION "0.0.0"
#endif

namespace {

using namespace qshard;

void print_report(const char* verb, const FolderReport& r, const std::string& out) {
  std::printf("%s %lld weights (%lld elements), copied %lld tensors -> %s (%d file%s)\n", verb,
              (long long)r.converted_tensors, (long long)r.converted_elements, (long long)r.copied_tensors, out.c_str(),
              r.files_written, r.files_written == 1 ? "" : "s");
  std::printf("bytes in %.2f MB, bytes out %.2f MB\n", r.bytes_in / 1e6, r.bytes_out / 1e6);
}

int run(int argc, char** argv) {
  CLI::App app{"qshard: distributed QLoRA training runtime (4-bit NF4, FSDP-style sharding)"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");

  auto* version = app.add_subcommand("version", "print version and backends");

  auto* quantize = app.add_subcommand("quantize", "quantize a Hugging Face Llama folder to bitsandbytes 4-bit");
  std::string q_in, q_out, q_type = "nf4", q_compute = "float32";
  int64_t q_blocksize = 64;
  bool q_no_dq = false, q_cpu = false, q_nonfinite = false;
  double q_shard_gb = 5.0;
  int q_threads = 0;
  quantize->add_option("IN_DIR", q_in, "input folder (config.json + safetensors)")->required();
  quantize->add_option("OUT_DIR", q_out, "output folder (must not exist or be empty)")->required();
  quantize->add_option("--quant-type", q_type, "nf4 | fp4");
  quantize->add_option("--blocksize", q_blocksize, "elements per absmax block (power of two, 32..4096)");
  quantize->add_flag("--no-double-quant", q_no_dq, "keep absmax in float32 (no double quantization)");
  quantize->add_option("--compute-dtype", q_compute,
                       "quantization_config.bnb_4bit_compute_dtype: float32 (transformers' default) | bfloat16 | float16");
  quantize->add_flag("--cpu", q_cpu, "quantize on the CPU even when a GPU is present");
  quantize->add_flag("--allow-nonfinite", q_nonfinite, "quantize weights holding NaN/Inf (refused by default)");
  quantize->add_option("--max-shard-size-gb", q_shard_gb, "split the output into files of at most this size");
  quantize->add_option("--threads", q_threads,
                       "host threads quantizing tensors at once on the CPU (default: the host's, at most 16, as "
                       "memory allows); the output is the same for any count")
      ->check(CLI::Range(1, 256));

  auto* dequantize = app.add_subcommand("dequantize", "dequantize a bitsandbytes 4-bit folder");
  std::string d_in, d_out, d_dtype;
  double d_shard_gb = 5.0;
  dequantize->add_option("IN_DIR", d_in, "bitsandbytes 4-bit folder")->required();
  dequantize->add_option("OUT_DIR", d_out, "output folder (must not exist or be empty)")->required();
  dequantize->add_option("--dtype", d_dtype,
                         "bfloat16 | float16 | float32 (default: the dtype each weight was quantized from)");
  dequantize->add_option("--max-shard-size-gb", d_shard_gb, "split the output into files of at most this size");

  auto* init = app.add_subcommand("init-model", "write a randomly initialised Llama as a Hugging Face folder");
  RandomLlamaOptions ro;
  std::string i_out, i_dtype = "bfloat16";
  std::string i_config;
  init->add_option("--out", i_out, "output folder (must not exist or be empty)")->required();
  init->add_option("--config", i_config,
                  "take the sizes and seed from a train YAML's model.init (model.init.dtype unless --dtype): the model it trains");
  init->add_option("--vocab-size", ro.vocab_size);
  init->add_option("--hidden-size", ro.hidden_size);
  init->add_option("--intermediate-size", ro.intermediate_size);
  init->add_option("--layers", ro.num_hidden_layers);
  init->add_option("--heads", ro.num_attention_heads);
  init->add_option("--kv-heads", ro.num_key_value_heads);
  init->add_option("--max-positions", ro.max_position_embeddings);
  init->add_flag("--tie-embeddings", ro.tie_word_embeddings);
  init->add_option("--dtype", i_dtype, "bfloat16 | float16 | float32");
  init->add_option("--seed", ro.seed);

  auto* inspect = app.add_subcommand("inspect", "list a safetensors file or model folder, resolving every key");
  std::string ins_path;
  bool ins_check = false, ins_quiet = false;
  inspect->add_option("PATH", ins_path, "a .safetensors file, a Hugging Face folder or a folder of safetensors")->required();
  inspect->add_flag("--check", ins_check, "exit non-zero if any key does not resolve or any tensor fails validation");
  inspect->add_flag("--quiet", ins_quiet, "print only the summary and problems");

  auto* tokenize = app.add_subcommand("tokenize", "tokenize text or jsonl files (the byte-level tokenizer, or --tokenizer)");
  std::vector<std::string> tok_in;
  std::string tok_out, tok_format = "auto", tok_field = "text", tok_split = "file";
  tokenize->add_option("INPUTS", tok_in, "text or jsonl files")->required();
  tokenize->add_option("--out", tok_out, "output token file")->required();
  tokenize->add_option("--format", tok_format,
                       "auto | text | jsonl | alpaca (instruction/input/output records) | chat (messages records, rendered by --tokenizer's chat template): loss on the responses only");
  tokenize->add_option("--field", tok_field, "jsonl field holding the text");
  tokenize->add_option("--split", tok_split, "text documents: file (one per file) | blank-lines");
  std::string tok_tokenizer;
  tokenize->add_option("--tokenizer", tok_tokenizer,
                       "a model folder (or tokenizer.json): its tokenizer, natively, instead of the byte tokenizer");

  auto* trainc = app.add_subcommand("train", "run a QLoRA training job (mpirun -np N for N ranks)");
  std::string tr_config;
  std::vector<std::string> tr_set;
  bool tr_print = false;
  trainc->add_option("--config", tr_config, "YAML job file")->required();
  trainc->add_option("--set", tr_set, "override a key: --set optimizer.lr=1e-4 (repeatable)");
  trainc->add_flag("--print-config", tr_print, "print the resolved config and exit");
  std::string tr_resume;
  trainc->add_option("--resume", tr_resume,
                     "auto (the newest complete checkpoint in checkpoint.dir, if any) or a checkpoint folder; "
                     "same as --set checkpoint.resume=...");

  auto* exportc = app.add_subcommand("export", "export a training checkpoint (mpirun -np N works too)");
  std::string ex_ckpt, ex_format = "bnb4", ex_out, ex_base;
  double ex_shard_gb = 5.0;
  exportc->add_option("CKPT", ex_ckpt, "a checkpoint folder (step-N) or a checkpoint.dir (its newest)")->required();
  exportc->add_option("--format", ex_format, "bnb4 (4-bit base) | peft (adapter) | merged (bf16 with LoRA merged)");
  exportc->add_option("--out", ex_out, "output folder (must not exist or be empty)")->required();
  exportc->add_option("--max-shard-size", ex_shard_gb, "GB per safetensors file before splitting (bnb4, merged)");
  exportc->add_option("--base-model", ex_base, "peft: base_model_name_or_path (default: the config's model.path)");

  auto* benchc = app.add_subcommand("bench", "tokens/s, MFU, memory and time split of QLoRA steps on a random "
                                               "Llama-shaped NF4 model (mpirun -np N for N ranks)");
  BenchOptions bo;
  std::string bench_device = "auto";
  benchc->add_option("--preset", bo.preset, "tiny | 1b | 8b | 70b (Llama-3.2-1B / 3.1-8B / 3.1-70B shapes)");
  benchc->add_option("--vocab", bo.vocab, "vocab_size (default: the preset's)");
  benchc->add_option("--hidden", bo.hidden, "hidden_size");
  benchc->add_option("--intermediate", bo.intermediate, "intermediate_size");
  benchc->add_option("--layers", bo.layers, "num_hidden_layers");
  benchc->add_option("--heads", bo.heads, "num_attention_heads");
  benchc->add_option("--kv-heads", bo.kv_heads, "num_key_value_heads");
  benchc->add_option("--batch", bo.batch, "sequences per rank per step");
  benchc->add_option("--seq", bo.seq, "tokens per sequence");
  benchc->add_option("--rank", bo.rank, "LoRA rank (all seven projections)");
  benchc->add_option("--steps", bo.steps, "timed steps");
  benchc->add_option("--warmup", bo.warmup, "untimed steps first");
  benchc->add_flag("--offload", bo.offload, "base shards and optimizer state in pinned host memory");
  benchc->add_option("--gpu-budget-gb", bo.gpu_budget_gb, "memory.gpu_budget_gb: the memory plan's budget (GB = 1e9 bytes)");
  benchc->add_option("--keep-layers", bo.keep_layers, "memory.keep_layers (-1: the plan's choice)");
  benchc->add_option("--mlp-chunk-tokens", bo.mlp_chunk_tokens, "memory.mlp_chunk_tokens (-1: auto, 0: never)");
  benchc->add_option("--set", bo.set, "any other config key: --set lora.dropout=0.1 (repeatable)");
  benchc->add_option("--json", bo.json, "write the result as JSON here");
  benchc->add_option("--device", bench_device, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));

  auto* evalc = app.add_subcommand("eval", "loss and perplexity of a model folder (+ PEFT adapter) on token data");
  EvalOptions eo;
  evalc->add_option("--model", eo.model_dir, "HF folder: f32/bf16/f16 or bitsandbytes 4-bit")->required();
  evalc->add_option("--adapter", eo.adapter_dir, "PEFT LoRA adapter folder");
  evalc->add_option("--data", eo.data, "token file, or .json list of token-id lists")->required();
  evalc->add_option("--dump-logits", eo.dump_logits, "write float32 logits [batch, seq, vocab] (key 'logits')");
  evalc->add_option("--seq-len", eo.seq_len, "sequence length for token files (default min(512, max positions))");
  std::string eval_device = "auto";
  evalc->add_option("--device", eval_device, "auto (the GPU when there is one), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));

  auto* genc = app.add_subcommand("generate", "text from a model folder (+ PEFT adapter), streamed as it comes");
  GenerateOptions go;
  std::string gen_device = "auto", gen_ids, gen_json;
  genc->add_option("--model", go.model_dir, "HF folder: f32/bf16/f16 or bitsandbytes 4-bit")->required();
  genc->add_option("--adapter", go.adapter_dir, "PEFT LoRA adapter folder");
  genc->add_option("--tokenizer", go.tokenizer_dir, "folder with tokenizer.json (default: --model; none: bytes)");
  genc->add_option("--prompt", go.prompt, "the prompt text (with --chat: the user's message)");
  genc->add_option("--prompt-ids", gen_ids, "the prompt as token ids, comma-separated (instead of --prompt)");
  genc->add_flag("--chat", go.chat, "render the prompt with the folder's chat template (generation prompt added)");
  genc->add_option("--system", go.system, "with --chat: a system message first");
  genc->add_option("--max-new-tokens", go.max_new_tokens, "tokens to generate at most (default 128)");
  genc->add_option("--temperature", go.sampling.temperature, "0 (default): greedy; else sample from softmax(logits / T)");
  genc->add_option("--top-k", go.sampling.top_k, "sample among the k most likely tokens (0: all)");
  genc->add_option("--top-p", go.sampling.top_p, "sample among the most likely tokens holding this probability (1: all)");
  genc->add_option("--seed", go.sampling.seed, "the sampler's seed (default 0)");
  genc->add_flag("--ignore-eos", go.ignore_eos, "do not stop at an end token");
  genc->add_option("--dump-logits", go.dump_logits, "write the first step's float32 logits [1, vocab] (key 'logits')");
  genc->add_option("--json", gen_json, "write prompt ids, new ids, text and timings as JSON here");
  genc->add_option("--device", gen_device, "auto (the GPU when there is one), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));

  CLI11_PARSE(app, argc, argv);
  set_log_level(log_level);

  if (version->parsed()) {
    std::printf("qshard %s\n", QSHARD_VERSION);
#ifdef QSHARD_WITH_CUDA
    std::printf("backends: cpu, cuda (%s)\n", cuda_available() ? "GPU present" : "no GPU visible");
#else
    std::printf("backends: cpu\n");
#endif
    return 0;
  }
  if (quantize->parsed()) {
    QuantizeFolderOptions o;
    o.quant.quant_type = parse_quant_type(q_type);
    o.quant.blocksize = q_blocksize;
    o.quant.compress_statistics = !q_no_dq;
    o.use_cuda = !q_cpu;
    o.allow_nonfinite = q_nonfinite;
    o.threads = q_threads;
    const auto compute = parse_dtype(q_compute);
    if (!compute || !dtype_is_float(*compute))
      throw InputError("--compute-dtype '" + q_compute + "' is not float32, bfloat16 or float16");
    o.compute_dtype = *compute;
    if (!(q_shard_gb > 0) || !(q_shard_gb <= 1e6))  // NaN fails both
      throw InputError("--max-shard-size-gb " + std::to_string(q_shard_gb) + ": expected a size in (0, 1e6] GB");
    o.max_shard_bytes = static_cast<uint64_t>(q_shard_gb * 1e9);
    FolderReport r = quantize_model_folder(q_in, q_out, o);
    print_report("quantized", r, q_out);
    std::printf("%s blocksize %lld%s: quantization error max |x - q(x)| = %.6g, relative RMS = %.4f%%\n",
                q_type.c_str(), (long long)q_blocksize, q_no_dq ? "" : " double-quant", r.max_abs_err,
                100.0 * r.rel_rms_err());
    if (r.nonfinite_values > 0)
      std::printf("warning: %lld NaN/Inf input values were quantized (--allow-nonfinite); they are not in the "
                  "error figures above\n", (long long)r.nonfinite_values);
    return 0;
  }
  if (evalc->parsed()) {
    eo.device = *parse_device_choice(eval_device);
    if (eo.seq_len < 0) throw InputError("--seq-len " + std::to_string(eo.seq_len) + ": expected a positive length");
    const EvalResult r = evaluate_model(eo);
    std::printf("eval: %lld sequences, %lld tokens: loss %.6f, perplexity %.4f\n", (long long)r.sequences,
                (long long)r.tokens, r.loss, r.perplexity);
    if (!eo.dump_logits.empty()) std::printf("logits written to %s\n", eo.dump_logits.c_str());
    return 0;
  }
  if (genc->parsed()) {
    go.device = *parse_device_choice(gen_device);
    for (size_t at = 0; at < gen_ids.size();) {  // "1,2,3"
      const size_t comma = std::min(gen_ids.find(',', at), gen_ids.size());
      const std::string item = gen_ids.substr(at, comma - at);
      char* end = nullptr;
      const long long v = std::strtoll(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || v < 0)
        throw InputError("--prompt-ids: '" + item + "' is not a token id (expected ids like 1,2,3)");
      go.prompt_ids.push_back(v);
      at = comma + 1;
    }
    const GenerateResult r = generate_text(go, [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n");
    std::fflush(stdout);  // the text before the statistics (stderr) when both go to one file
    const double n = static_cast<double>(r.ids.size());
    std::fprintf(stderr, "generate (%s): %zu prompt tokens in %.3f s (%.1f tokens/s), %zu new tokens in %.3f s (%.1f tokens/s)%s\n",
                 r.device.c_str(), r.prompt_ids.size(), r.prefill_seconds,
                 static_cast<double>(r.prompt_ids.size()) / std::max(r.prefill_seconds, 1e-9), r.ids.size(),
                 r.decode_seconds, n > 1 ? (n - 1) / std::max(r.decode_seconds, 1e-9) : 0.0,
                 r.stopped_at_eos ? ", stopped at an end token" : "");
    if (!gen_json.empty()) {
      nlohmann::json j = {{"prompt_ids", r.prompt_ids}, {"ids", r.ids}, {"text", r.text},
                          {"stopped_at_eos", r.stopped_at_eos}, {"prefill_seconds", r.prefill_seconds},
                          {"decode_seconds", r.decode_seconds}, {"device", r.device}};
      std::ofstream f(gen_json);
      f << j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      if (!f) throw InputError("--json " + gen_json + ": cannot write");
    }
    if (!go.dump_logits.empty()) std::fprintf(stderr, "first-step logits written to %s\n", go.dump_logits.c_str());
    return 0;
  }
  if (tokenize->parsed()) {
    TokenizeOptions to;
    to.format = parse_input_format(tok_format);
    to.jsonl_field = tok_field;
    to.tokenizer = tok_tokenizer;
    if (tok_split == "file") to.text_split = TextSplit::kFile;
    else if (tok_split == "blank-lines") to.text_split = TextSplit::kBlankLines;
    else throw InputError("--split '" + tok_split + "' is not 'file' or 'blank-lines'");
    const TokenizeStats st = tokenize_files(tok_in, to, tok_out);
    std::printf("tokenized %lld files, %lld documents, %lld bytes -> %lld tokens (%lld targets) in %s\n",
                (long long)st.files, (long long)st.documents, (long long)st.bytes, (long long)st.tokens,
                (long long)st.targets, tok_out.c_str());
    return 0;
  }
  if (trainc->parsed()) {
    if (tr_print) {
      std::printf("%s", load_train_config(tr_config, tr_set).to_yaml().c_str());
      return 0;
    }
    // Every rank loads and validates the config (a bad value is reported by every rank and ends
    // the job through run_job's abort path, never a hang).
    if (!tr_resume.empty()) tr_set.push_back("checkpoint.resume=" + tr_resume);
    return run_job(argc, argv, [&](World& world) {
      const TrainConfig cfg = load_train_config(tr_config, tr_set);
      if (world.rank() == 0) std::printf("%s", cfg.describe().c_str());
      JobRuntime job(world, cfg.device, cfg.source + ": device");
      const TrainSummary s = train(cfg, job.get());
      if (world.rank() == 0 && !s.losses.empty())
        std::printf("trained %lld steps: loss %.4f -> %.4f%s\n", (long long)s.steps, s.losses.front(), s.losses.back(),
                    s.eval_losses.empty() ? "" : (", eval loss " + std::to_string(s.eval_losses.back().second)).c_str());
      std::fflush(stdout);  // MPI_Finalize may end the process before stdio's buffers are flushed
      return 0;
    });
  }
  if (benchc->parsed()) {
    bo.device = *parse_device_choice(bench_device);
    return run_job(argc, argv, [&](World& world) {
      run_bench(bo, world);
      std::fflush(stdout);
      return 0;
    });
  }
  if (exportc->parsed()) {
    ExportOptions o;
    if (ex_format == "bnb4") o.format = ExportFormat::kBnb4;
    else if (ex_format == "peft") o.format = ExportFormat::kPeft;
    else if (ex_format == "merged") o.format = ExportFormat::kMerged;
    else throw InputError("--format '" + ex_format + "': expected bnb4, peft or merged");
    if (!(ex_shard_gb > 0) || !(ex_shard_gb <= 1e6))
      throw InputError("--max-shard-size " + std::to_string(ex_shard_gb) + ": expected a size in (0, 1e6] GB");
    o.out_dir = ex_out;
    o.max_shard_bytes = static_cast<uint64_t>(ex_shard_gb * 1e9);
    o.base_model_name_or_path = ex_base;
    return run_job(argc, argv, [&](World& world) {
      // Export is host work: the CPU backend's manager, whatever device trained the checkpoint.
      JobRuntime job(world, DeviceChoice::kCpu, "export");
      const ExportReport r = export_checkpoint(ex_ckpt, o, job.get());
      if (world.rank() == 0)
        std::printf("exported %s as %s: %lld tensors, %.2f MB in %zu files -> %s\n", ex_ckpt.c_str(), ex_format.c_str(),
                    (long long)r.tensors, r.bytes / 1e6, r.files.size(), ex_out.c_str());
      std::fflush(stdout);
      return 0;
    });
  }
  if (inspect->parsed()) {
    const InspectReport r = inspect_path(ins_path);
    std::printf("%s: %s\n", r.path.c_str(), r.kind.empty() ? "unreadable" : r.kind.c_str());
    uint64_t total = 0;
    int resolved = 0;
    for (const auto& row : r.rows) {
      total += row.bytes;
      resolved += row.resolved && row.bytes_match;
      if (!ins_quiet)
        std::printf("  %-64s %-5s %-16s %12llu  %s%s\n", row.key.c_str(), row.dtype.c_str(), shape_str(row.shape).c_str(),
                    (unsigned long long)row.bytes, row.resolved ? "-> " : "UNRESOLVED: ", row.node.c_str());
    }
    std::printf("%zu keys, %.2f MB; %d resolve to the bytes stored under them\n", r.rows.size(), total / 1e6, resolved);
    for (const auto& p : r.problems) std::printf("problem: %s\n", p.c_str());
    if (ins_check && !r.ok()) return 3;
    return 0;
  }
  if (init->parsed()) {
    auto dt = parse_dtype(i_dtype);
    if (!dt || !dtype_is_float(*dt)) throw InputError("--dtype '" + i_dtype + "' is not bfloat16, float16 or float32");
    ro.dtype = *dt;
    if (!i_config.empty()) {
      // The model model.init trains from: its sizes, its seed, and (unless --dtype says
      // otherwise) model.init.dtype, the dtype model.init draws in: the same values as training gets.
      const ModelInitConfig m = load_train_config(i_config).model.init;
      static_cast<LlamaSizes&>(ro) = m;
      if (init->count("--seed") == 0) ro.seed = m.seed;
      if (init->count("--dtype") == 0) ro.dtype = m.dtype;
    }
    const LlamaConfig c = write_random_llama_folder(i_out, ro);
    int64_t params = 0;
    for (const auto& [name, shape] : llama_expected_weights(c)) params += shape_numel(shape);
    std::printf("wrote a random Llama (%lld layers, hidden %lld, %.2f M parameters, %s) to %s\n",
                (long long)c.num_hidden_layers, (long long)c.hidden_size, params / 1e6, dtype_torch_name(ro.dtype), i_out.c_str());
    return 0;
  }
  if (dequantize->parsed()) {
    std::optional<DType> dt;
    if (!d_dtype.empty()) {
      dt = parse_dtype(d_dtype);
      if (!dt || !dtype_is_float(*dt)) throw InputError("--dtype '" + d_dtype + "' is not bfloat16, float16 or float32");
    }
    FolderReport r = dequantize_model_folder(d_in, d_out, dt, static_cast<uint64_t>(d_shard_gb * 1e9));
    print_report("dequantized", r, d_out);
    return 0;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Past a file-size limit (ulimit -f) a write fails with EFBIG, which the writers report and
  // clean up after, instead of SIGXFSZ killing the process and leaving <out>.partial-<pid> behind.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    return run(argc, argv);
  } catch (const qshard::InputError& e) {
    std::fprintf(stderr, "qshard: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qshard: internal error: %s\n", e.what());
    return 1;
  }
}
