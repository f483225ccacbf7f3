// qshard train / export / bench: the commands that run as a job of ranks (mpirun -np N), each
// through run_job (runtime/failure.h): an error on any rank ends the whole job (see commands.h).
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/export.h"
#include "commands.h"
#include "number_options.h"
#include "runtime/device_context.h"
#include "runtime/error.h"
#include "runtime/failure.h"
#include "runtime/job_settings.h"
#include "runtime/runtime.h"
#include "runtime/world.h"
#include "train/bench.h"
#include "train/config_reference.h"
#include "train/run_protocol.h"
#include "train/train_checkpoint.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace qshard::cli {
namespace {

// --- train ---------------------------------------------------------------------------------------

struct TrainArgs {
  std::string config, resume;
  std::vector<std::string> set;
  bool print_config = false;
  bool describe_config = false;
  bool allow_nonfinite = false;
  bool allow_schedule_change = false;
};

void add_train(CLI::App& sub, TrainArgs& a) {
  sub.add_option("--config", a.config, "YAML job file (every key: docs/CONFIG.md); required")->type_name("FILE");
  sub.add_option("--set", a.set, "override a key: --set optimizer.lr=1e-4 (repeatable)")->type_name("KEY=VALUE");
  sub.add_flag("--print-config", a.print_config,
               "check the values (as for one rank; input files are checked when the job runs), print the resolved "
               "config (file + --set + defaults) and exit; a job with a checkpoint.dir also writes it to "
               "<checkpoint.dir>/config.resolved.yaml");
  sub.add_flag("--describe-config", a.describe_config,
               "print every config key with its type, default, allowed values and meaning (docs/CONFIG.md) and exit");
  sub.add_option("--resume", a.resume,
                 "auto (the newest complete checkpoint in checkpoint.dir, if any) or a checkpoint folder; "
                 "same as --set checkpoint.resume=...")
      ->type_name("auto|DIR");
  sub.add_flag("--allow-nonfinite", a.allow_nonfinite,
               "load model.path, lora.init_adapter and the --resume checkpoint even when they hold NaN/Inf (refused by "
               "default); same as --set model.allow_nonfinite=true");
  sub.add_flag("--allow-schedule-change", a.allow_schedule_change,
               "resume under another LR schedule than the checkpoint's (steps, optimizer.lr, schedule.*; e.g. to extend "
               "a run; refused by default); same as --set checkpoint.allow_schedule_change=true");
  sub.footer(
      "Example:\n"
      "  qshard tokenize data/*.txt --out /tmp/tiny.tok\n"
      "  qshard train --config configs/tiny.yaml --set data.train=/tmp/tiny.tok --set checkpoint.dir=/tmp/run\n"
      "  scripts/launch/single_node.sh 2 train --config configs/tiny.yaml ...   (2 ranks)");
}

// Rank 0's keys and values go to every rank, which compares them with its own: the first key that
// differs is an InputError naming the rank, the key and both values. Collective (every rank).
void check_same_job(const World& world, const TrainConfig& cfg) {
  std::string mine;
  for (const auto& [key, value] : cfg.key_values()) mine += key + ": " + value + "\n";
  long long n = static_cast<long long>(mine.size());
  MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, world.comm());
  std::string first(static_cast<size_t>(n), '\0');
  if (world.rank() == 0) first = mine;
  MPI_Bcast(first.data(), static_cast<int>(n), MPI_CHAR, 0, world.comm());
  if (first == mine) return;
  std::istringstream a(first), b(mine);
  for (std::string x, y; std::getline(a, x) && std::getline(b, y);)
    if (x != y)
      throw InputError(cfg.source + ": rank " + std::to_string(world.rank()) + " was started with another job than rank 0: '" +
                       y + "' against rank 0's '" + x + "'; every rank must run the same job (the same --config and --set)");
  throw InputError(cfg.source + ": rank " + std::to_string(world.rank()) + " was started with another job than rank 0");
}

int run_train(TrainArgs& a, int argc, char** argv) {
  if (a.describe_config) {
    std::printf("%s", config_reference_markdown().c_str());
    return 0;
  }
  if (a.config.empty()) throw InputError("train: --config is required (a YAML job file; e.g. configs/tiny.yaml)");
  if (a.allow_nonfinite) a.set.push_back("model.allow_nonfinite=true");
  if (a.allow_schedule_change) a.set.push_back("checkpoint.allow_schedule_change=true");
  if (!a.resume.empty()) a.set.push_back("checkpoint.resume=" + a.resume);
  if (a.print_config) {
    // The values are checked before they are shown (a job printed as if valid would only fail
    // when run): as for one rank, the most permissive world size (a multiple of micro x N is a
    // multiple of micro x 1); input files are checked when the job runs.
    const TrainConfig cfg = load_train_config(a.config, a.set);
    cfg.validate(1);
    std::printf("%s", cfg.to_yaml().c_str());
    return 0;
  }
  return run_job(argc, argv, [&](World& world) {
    // Every rank loads the job, checks its values and its input files, and the ranks agree: a bad
    // input ends the job with one line from rank 0 and exit code 2 on every rank, before
    // anything loads (failure.h: agree_on_input).
    TrainConfig cfg;
    agree_on_input(world, [&] {
      cfg = load_train_config(a.config, a.set);
      cfg.validate(world.size());
      cfg.check_inputs();
    });
    // Every rank runs rank 0's job: another --set on one rank (another lora.r, batch, data file...)
    // would corrupt memory, hang a collective or train shards under other settings in silence.
    agree_on_input(world, [&] { check_same_job(world, cfg); });
    set_job_settings({cfg.runtime.collective_timeout_s, cfg.runtime.host_memory_bytes, cfg.runtime.nccl_blocking});
    JobRuntime job(world, cfg.device, cfg.source + ": device");
    const TrainSummary s = train(cfg, job.get());
    if (world.rank() == 0 && !s.losses.empty())
      std::printf("trained %lld steps: loss %.4f -> %.4f%s\n", (long long)s.steps, s.losses.front(), s.losses.back(),
                  s.eval_losses.empty() ? "" : (", eval loss " + std::to_string(s.eval_losses.back().second)).c_str());
    if (world.rank() == 0) std::printf("%s", end_of_job_report(cfg, s).c_str());  // where the work is, how to load it
    std::fflush(stdout);  // MPI_Finalize may end the process before stdio's buffers are flushed
    return 0;
  });
}

// --- export --------------------------------------------------------------------------------------

struct ExportArgs {
  std::string ckpt, format = "bnb4", out, base_model;
  double shard_gb = 5.0;
};

void add_export(CLI::App& sub, ExportArgs& a) {
  sub.add_option("CKPT", a.ckpt, "a checkpoint folder (step-N) or a checkpoint.dir (its newest)")->required();
  sub.add_option("--format", a.format, "bnb4 (4-bit base) | peft (adapter) | merged (bf16 with LoRA merged)");
  sub.add_option("--out", a.out, "output folder (must not exist or be empty)")->required();
  add_double_option(sub, "--max-shard-size-gb,--max-shard-size", a.shard_gb, kMinShardGb, kMaxShardGb,
                    "GB per safetensors file before splitting (bnb4, merged; a larger tensor: a file of its own)");
  sub.add_option("--base-model", a.base_model, "peft: base_model_name_or_path (default: the config's model.path)");
  sub.footer("Example:\n  qshard export build/runs/tiny/ckpt --format peft --out /tmp/adapter   (the newest checkpoint)\n"
             "  qshard export build/runs/tiny/ckpt/step-00000100 --format merged --out /tmp/merged");
}

int run_export(ExportArgs& a, int argc, char** argv) {
  ExportOptions o;
  if (a.format == "bnb4") o.format = ExportFormat::kBnb4;
  else if (a.format == "peft") o.format = ExportFormat::kPeft;
  else if (a.format == "merged") o.format = ExportFormat::kMerged;
  else throw InputError("--format '" + a.format + "': expected bnb4, peft or merged");
  o.out_dir = a.out;
  o.max_shard_bytes = static_cast<uint64_t>(a.shard_gb * 1e9);
  o.base_model_name_or_path = a.base_model;
  return run_job(argc, argv, [&](World& world) {
    // Export is host work: the CPU backend's manager, whatever device trained the checkpoint.
    JobRuntime job(world, DeviceChoice::kCpu, "export");
    const ExportReport r = export_checkpoint(a.ckpt, o, job.get());
    if (world.rank() == 0)
      std::printf("exported %s as %s: %lld tensors, %.2f MB in %zu files -> %s\n", a.ckpt.c_str(), a.format.c_str(),
                  (long long)r.tensors, r.bytes / 1e6, r.files.size(), a.out.c_str());
    std::fflush(stdout);
    return 0;
  });
}

// --- bench ---------------------------------------------------------------------------------------

struct BenchArgs {
  BenchOptions bo;
  std::string device = "auto";
};

void add_bench(CLI::App& sub, BenchArgs& a) {
  BenchOptions& bo = a.bo;
  sub.add_option("--preset", bo.preset, "tiny | 1b | 8b | 70b (Llama-3.2-1B / 3.1-8B / 3.1-70B shapes)");
  // The sizes are named as init-model names them; the older short names stay as aliases that
  // --help does not list (help_format.h).
  add_int_option(sub, "--vocab-size,--vocab", bo.vocab, 0, kMaxBenchSize, "vocab_size (0: the preset's)");
  add_int_option(sub, "--hidden-size,--hidden", bo.hidden, 0, kMaxBenchSize, "hidden_size (0: the preset's)");
  add_int_option(sub, "--intermediate-size,--intermediate", bo.intermediate, 0, kMaxBenchSize,
                 "intermediate_size (0: the preset's)");
  add_int_option(sub, "--layers", bo.layers, 0, kMaxBenchSize, "num_hidden_layers (0: the preset's)");
  add_int_option(sub, "--heads", bo.heads, 0, kMaxBenchSize, "num_attention_heads (0: the preset's)");
  add_int_option(sub, "--kv-heads", bo.kv_heads, 0, kMaxBenchSize, "num_key_value_heads (0: the preset's)");
  add_int_option(sub, "--batch", bo.batch, 1, kMaxBenchCount, "sequences per rank per step");
  add_int_option(sub, "--micro-batch", bo.micro_batch, -1, kMaxBenchCount,
                 "sequences per micro-batch (batch.micro_batch_size): -1 = --batch, 0 = the memory plan's choice");
  add_int_option(sub, "--seq-len,--seq", bo.seq, 1, kMaxBenchCount, "tokens per sequence");  // eval's name
  add_int_option(sub, "--rank", bo.rank, 1, kMaxBenchCount, "LoRA rank (all seven projections)");
  add_int_option(sub, "--steps", bo.steps, 1, kMaxBenchCount, "timed steps");
  add_int_option(sub, "--warmup", bo.warmup, 0, kMaxBenchCount, "untimed steps first");
  add_int_option(sub, "--profile-steps", bo.profile_steps, 0, kMaxBenchCount,
                 "steps after the timed ones with the profiler on, for the time split (0: none); the timed "
                 "steps run without its events");
  sub.add_flag("--offload", bo.offload, "base shards in pinned host memory (offload.params)");
  sub.add_flag("--offload-optimizer", bo.offload_optimizer,
               "LoRA masters and AdamW state in host memory, AdamW on the host (offload.optimizer)");
  add_double_option(sub, "--gpu-budget-gb", bo.gpu_budget_gb, 0, kMaxBenchGb, "memory.gpu_budget_gb: the memory plan's budget (GB = 1e9 bytes)");
  add_int_option(sub, "--keep-layers", bo.keep_layers, -1, kMaxBenchSize, "memory.keep_layers (-1: the plan's choice)");
  add_int_option(sub, "--host-keep-layers", bo.host_keep_layers, -1, kMaxBenchSize,
                 "memory.host_keep_layers: more layers kept in pinned host memory (-1: the plan's choice)");
  add_int_option(sub, "--mlp-chunk-tokens", bo.mlp_chunk_tokens, -1, kMaxBenchCount, "memory.mlp_chunk_tokens (-1: auto, 0: never)");
  sub.add_option("--set", bo.set, "any other config key: --set lora.dropout=0.1 (repeatable)");
  sub.add_option("--json", bo.json, "write the result as JSON here");
  add_int_option(sub, "--list-plans", bo.list_plans, 0, 1000,
                 "list the memory plan's this many fastest plans for the job on a GPU (estimates at an H200's "
                 "rates, within --gpu-budget-gb) and exit without building anything (0: run the bench)");
  add_int_option(sub, "--try-plans", bo.try_plans, 0, 1000,
                 "run the memory plan's this many fastest plans within --gpu-budget-gb one after another "
                 "(--warmup + --steps steps each) and name the fastest as measured, with the --set overrides "
                 "that pin it (0: run the bench once)");
  sub.add_option("--device", a.device, "auto (the GPU when there is one) | cpu | cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub.footer("Example:\n  qshard bench --preset tiny --device cpu --steps 3\n"
             "  qshard bench --preset 8b --batch 4 --seq-len 2048 --gpu-budget-gb 70 --json /tmp/bench.json");
}

int run_bench_command(BenchArgs& a, int argc, char** argv) {
  a.bo.device = *parse_device_choice(a.device);
  return run_job(argc, argv, [&](World& world) {
    run_bench(a.bo, world);
    std::fflush(stdout);
    return 0;
  });
}

}  // namespace

CommandMain attach_train(CLI::App& sub) { return attach_with(sub, add_train, run_train); }
CommandMain attach_export(CLI::App& sub) { return attach_with(sub, add_export, run_export); }
CommandMain attach_bench(CLI::App& sub) { return attach_with(sub, add_bench, run_bench_command); }

}  // namespace qshard::cli
