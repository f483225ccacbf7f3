#include "train/trainer.h"


#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "checkpoint/export.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_checkpoint.h"
#include "runtime/collective_status.h"
#include "model/llama_model.h"
#include "runtime/log.h"
#include "runtime/machine.h"
#include "shard/sharded_parameter_manager.h"
#include "optim/adamw.h"
#include "text/data_loader.h"
#include "train/lr_schedule.h"
#include "train/memory_plan.h"
#include "train/metrics.h"
#include "checkpoint/model_init.h"
#include "train/qlora_model.h"
#include "model/eval_loss.h"
#include "train/flops.h"
#include "train/train_checkpoint.h"
#include "train/train_step.h"
#include "text/token_file.h"

namespace qshard {
namespace {

// A resumed run appends to the metrics file; lines an interrupted run logged after the
// checkpoint it resumes from are dropped first, so every step appears once.
void drop_metrics_after(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() > step) {
      ++dropped;
      continue;
    }
    kept += line + "\n";
  }
  in.close();
  if (dropped == 0) return;
  write_file_atomic(path, kept);
  QS_LOG_INFO("{}: dropped {} lines logged after step {} by the interrupted run", path, dropped, step);
}

// An existing folder with something in it (an earlier export).
bool non_empty_dir(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec) && !std::filesystem::is_empty(path, ec);
}

// Fresh starts must not mix with an earlier run's files (nothing written is lost); rank 0.
void check_checkpoint_dir(const TrainConfig& config, bool resuming) {
  const std::string& dir = config.checkpoint.dir;
  if (dir.empty()) return;
  // Found now, not at the first save: the folder can be created and written.
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError("checkpoint.dir " + dir + ": cannot create it: " + ec.message());
  const std::string probe = dir + "/.qshard-write-test";
  {
    std::FILE* f = std::fopen(probe.c_str(), "wb");
    const bool ok = f && std::fputs("ok", f) >= 0;
    if (f) std::fclose(f);
    std::filesystem::remove(probe, ec);
    if (!ok) throw InputError("checkpoint.dir " + dir + ": cannot write there: " + std::strerror(errno));
  }
  if (resuming) return;
  const auto found = list_checkpoints(dir);
  if (!found.empty())
    throw InputError("checkpoint.dir " + dir + " holds checkpoints of an earlier run (newest " + found.back().second +
                     "): continue it with --resume auto (checkpoint.resume), or choose another checkpoint.dir");
  const std::string fin = dir + "/final";
  if (non_empty_dir(fin))
    throw InputError("checkpoint.dir " + dir + " holds the exports of an earlier run (" + fin +
                     "): choose another checkpoint.dir, or move it away");
}

}  // namespace

TrainSummary train(const TrainConfig& config, Communicator& comm) {
  DeviceContext ctx(Backend::kCpu, -1);
  if (config.device == DeviceChoice::kCuda)
    throw InputError(config.source + ": device 'cuda': train(config, comm) runs the CPU backend; "
                     "use train(config, runtime)");
  Runtime rt{ctx, comm, comm};
  return train(config, rt);
}

TrainSummary train(const TrainConfig& config, Runtime& rt, const TrainCallbacks* callbacks) {
  Communicator& comm = rt.host;
  const int rank = comm.rank(), world = comm.size();
  config.validate(world);
  if (rt.ctx.is_cuda() && !ops::has_backend(Backend::kCuda, "attention_fwd"))
    throw InputError(config.source + ": device '" + device_choice_name(config.device) + "' chose the GPU (" +
                     rt.ctx.describe() + "), but this build has no fused attention (it was built without cuDNN "
                     "or the cudnn-frontend headers: rerun scripts/setup.sh); set device: cpu");

  // ---- resume or fresh start: rank 0 picks the checkpoint, every rank reads its metadata ----
  std::optional<CheckpointInfo> resume;
  {
    std::string err, dir;
    if (rank == 0) {
      try {
        if (auto r = resolve_resume(config)) dir = r->dir;
        check_checkpoint_dir(config, !dir.empty());
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    throw_if_any_failed(comm, err);
    dir = broadcast_string(comm, dir, 0);
    if (!dir.empty()) {
      try {
        resume = read_checkpoint_metadata(dir);
        check_resume_config(config, checkpoint_train_config(*resume), resume->dir);
      } catch (const std::exception& e) {
        err = e.what();
      }
      throw_if_any_failed(comm, err);
    }
  }

  // ---- memory plan (offload, MLP chunks), then the model, sharded ----
  MemoryPlan plan = plan_memory(config, job_llama_config(config.model), rt.ctx.backend(), rt.ctx.activation_dtype(),
                                rt.data.size());
  if (rank == 0 && plan.offload_params && !config.offload.params)
    QS_LOG_INFO("memory.gpu_budget_gb = {}: the base and its optimizer state go to pinned host memory "
                "(offload.params and offload.optimizer on)", config.memory.gpu_budget_gb);
  std::unique_ptr<QloraModel> qm = build_qlora_model(config, rt, &plan);
  const LlamaConfig& mc = qm->config;
  Module* tree = qm->tree.get();
  ShardedParameterManager& mgr = *qm->mgr;
  const ShardedTree& sharded = qm->units;
  const uint64_t trainable = qm->trainable_parameters;

  const int64_t L = mc.num_hidden_layers;
  const int T = static_cast<int>(config.data.max_seq_len);
  if (T > mc.max_position_embeddings)
    throw InputError(config.source + ": data.max_seq_len " + std::to_string(T) + " is past the model's maximum of " +
                     std::to_string(mc.max_position_embeddings) + " positions");
  LlamaModelOptions mo;
  mo.lora_alpha = config.lora.alpha;
  mo.use_rslora = config.lora.rslora;
  mo.lora_dropout = static_cast<float>(config.lora.dropout);
  mo.dropout_seed = config.seed;
  mo.max_batch = config.batch.micro_batch_size;
  mo.max_seq = T;
  // QSHARD_PROFILE=1: time the compute stream's parts (CUDA events) and print the split at the end.
  const char* prof_env = std::getenv("QSHARD_PROFILE");
  mo.profile = (prof_env && *prof_env && std::string(prof_env) != "0") || (callbacks && callbacks->profile);
  // QSHARD_LORA_FOLD=0: separate LoRA GEMMs per projection instead of the fold (for measuring it).
  const char* fold_env = std::getenv("QSHARD_LORA_FOLD");
  mo.fold_lora = !(fold_env && std::string(fold_env) == "0");

  // ---- optimizer state: this rank's shards, where the master shards live ----
  OptimizerState opt = make_optimizer_state(*qm);
  const std::vector<UnitStateShard> state = state_shards(*qm, opt.exp_avg, opt.exp_avg_sq);

  // ---- kept layers: what the budget holds once the model and its state are built ----
  plan_kept_layers(plan, config, rt.ctx.is_cuda() ? static_cast<double>(device_memory_in_use()) : 0.0, 0.0);
  mo.keep_layers = plan.keep_layers;
  mo.mlp_chunk_rows = plan.mlp_chunk_rows;
  if (rank == 0) QS_LOG_INFO("{}", plan.describe());
  LlamaModel model(mc, *tree, rt.ctx, mo);
  FsdpDriver fsdp(model, *qm);

  // ---- data ----
  if (config.data.train.empty()) throw InputError(config.source + ": data.train (a token file) is required");
  const TokenFile train_file = TokenFile::open(config.data.train);
  train_file.validate(static_cast<uint32_t>(mc.vocab_size));
  const Packing packing = parse_packing(config.data.packing);
  PackedDataset all(train_file, T, /*pad_last=*/false, packing);
  PackedDataset train_data = all;
  std::optional<PackedDataset> eval_data;
  std::optional<TokenFile> eval_file;
  if (!config.data.eval.empty()) {
    eval_file = TokenFile::open(config.data.eval);
    eval_file->validate(static_cast<uint32_t>(mc.vocab_size));
    eval_data = PackedDataset(*eval_file, T, /*pad_last=*/false, packing);
  } else if (config.data.eval_fraction > 0) {
    auto [tr, ev] = split_eval(all, config.data.eval_fraction);
    train_data = tr;
    eval_data = ev;
  }
  const int64_t G = config.batch.global_batch_size, micro = config.batch.micro_batch_size;
  if (train_data.num_sequences() < G)
    throw InputError(config.data.train + ": " + std::to_string(train_data.num_sequences()) +
                     " training sequences of " + std::to_string(T) + " tokens, fewer than one global batch (" +
                     std::to_string(G) + ")");
  DataLoader loader(train_data, G, config.data.seed, rank, world);
  const int64_t max_steps = config.max_steps(train_data.num_sequences());
  LrSchedule sched{config.schedule.type, config.optimizer.lr, config.schedule.warmup_steps, max_steps,
                   config.schedule.min_lr_ratio};
  const int64_t micro_steps = G / (micro * world);

  // ---- resume: sharded state (resharded to this world size), data position, history ----
  TrainHistory history;
  int64_t start_step = 0;
  if (resume) {
    load_sharded_checkpoint(comm, *resume, state);
    std::string err;
    try {
      history = checkpoint_history(*resume);
      loader.restore(resume->metadata.at("trainer").at("data"));
    } catch (const std::exception& e) {
      err = resume->dir + ": " + e.what();
    }
    throw_if_any_failed(comm, err);
    start_step = resume->step;
    if (rank == 0)
      QS_LOG_INFO("resumed from {} (step {}, saved by {} ranks, now {} ranks)", resume->dir, start_step,
                  resume->world_size, world);
  }
  const int64_t stop_step = config.checkpoint.stop_after_steps > 0
                                ? std::min(max_steps, std::max(start_step, config.checkpoint.stop_after_steps))
                                : max_steps;

  std::unique_ptr<MetricsLogger> logger;
  if (rank == 0 && resume && !config.logging.metrics_jsonl.empty())
    drop_metrics_after(config.logging.metrics_jsonl, start_step);
  if (rank == 0) logger = std::make_unique<MetricsLogger>(config.logging.metrics_jsonl, max_steps, resume.has_value());
  if (rank == 0)
    QS_LOG_INFO("model: {} layers, hidden {}, vocab {}; {} trainable LoRA parameters; {} units over {} ranks; {} steps "
                "on {}",
                L, mc.hidden_size, mc.vocab_size, trainable, mgr.num_units(), world, max_steps, rt.ctx.describe());
  // MFU's denominator: this GPU's bf16 GEMM rate, measured now (0 on the CPU: no MFU reported).
  // QSHARD_GEMM_RATE=<TFLOP/s> uses that figure instead; 0 skips MFU (e.g. under a sanitizer).
  double gemm_flops = 0;
  if (const char* r = std::getenv("QSHARD_GEMM_RATE"); r && *r) {
    char* end = nullptr;
    const double v = std::strtod(r, &end);
    if (end == r || *end != '\0' || !(v >= 0))
      throw InputError(std::string("QSHARD_GEMM_RATE='") + r + "': expected TFLOP/s as a number >= 0");
    gemm_flops = rt.ctx.is_cuda() ? v * 1e12 : 0.0;
  } else {
    gemm_flops = measure_gemm_flops(rt.ctx);
  }
  const double flops_per_token = useful_flops_per_token(mc, T, trainable);
  if (rank == 0 && gemm_flops > 0)
    QS_LOG_INFO("bf16 GEMM rate on {}: {:.0f} TFLOP/s; useful work {:.2f} GFLOP per token", rt.ctx.describe(),
                gemm_flops * 1e-12, flops_per_token * 1e-9);

  auto evaluate = [&]() -> double {
    if (!eval_data) return NAN;
    const auto [first, end] = eval_range(eval_data->num_sequences(), rank, world);  // [first, end)
    // Every forward gathers units (collectives), so every rank runs the same number of them:
    // ranks with a shorter slice repeat a sequence and do not count it.
    const int64_t rounds = (eval_data->num_sequences() + world - 1) / world;
    std::vector<int32_t> in(static_cast<size_t>(T)), tg(static_cast<size_t>(T));
    const LossTotals t = sequence_losses(model, rounds, [&](int64_t k, std::vector<int64_t>& ids,
                                                            std::vector<int64_t>& targets) {
      const int64_t i = first + k;
      const bool counted = i < end;
      eval_data->get(counted ? i : std::min<int64_t>(first, eval_data->num_sequences() - 1), in.data(), tg.data());
      ids.assign(in.begin(), in.end());
      targets.assign(tg.begin(), tg.end());
      return counted;
    });
    const double total_loss = sum_over_ranks(comm, t.loss_sum);
    const int64_t total_tokens = sum_over_ranks(comm, t.tokens);
    return total_tokens > 0 ? total_loss / static_cast<double>(total_tokens) : NAN;
  };

  TrainSummary summary;
  summary.trainable_parameters = trainable;
  summary.perf.gemm_flops = gemm_flops;
  summary.perf.flops_per_token = flops_per_token;
  summary.perf.plan = plan.describe();
  summary.perf.keep_layers = plan.keep_layers;
  summary.perf.mlp_chunk_rows = plan.mlp_chunk_rows;
  summary.perf.offload_params = plan.offload_params;
  summary.perf.offload_optimizer = plan.offload_optimizer;
  summary.losses = history.losses;
  summary.eval_losses = history.eval_losses;
  summary.steps = start_step;
  summary.resumed_from = resume ? resume->dir : std::string();
  auto save = [&](int64_t done) {
    CheckpointSaveOptions so;
    so.root = config.checkpoint.dir;
    so.step = done;
    so.keep_last = config.checkpoint.keep_last;
    so.trainer = trainer_state_json(config, done, max_steps, loader, sched, {summary.losses, summary.eval_losses});
    const auto t0 = std::chrono::steady_clock::now();
    summary.last_checkpoint = save_sharded_checkpoint(comm, state, so);
    if (rank == 0)
      QS_LOG_INFO("saved checkpoint {} ({:.2f} s)", summary.last_checkpoint,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  for (int64_t step = start_step; step < stop_step; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Batch> batches;
    for (int64_t k = 0; k < micro_steps; ++k) batches.push_back(loader.next_batch(static_cast<int>(micro)));
    StepOptions so;
    so.step = step;
    so.adamw.lr = sched.lr_at(step);
    so.adamw.beta1 = config.optimizer.beta1;
    so.adamw.beta2 = config.optimizer.beta2;
    so.adamw.eps = config.optimizer.eps;
    so.adamw.weight_decay = config.optimizer.weight_decay;
    so.grad_clip = config.optimizer.grad_clip;
    so.rank_row_offset = rank * (G / world);
    so.seq_len = T;
    const StepStats st = train_step(rt, *qm, model, fsdp, opt, batches, so);
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double loss = st.loss, grad_norm = st.grad_norm;
    const double global_tokens = static_cast<double>(st.tokens);
    summary.perf.step_seconds.push_back(step_s);
    summary.perf.step_tokens.push_back(st.tokens);
    if (rt.ctx.is_cuda()) summary.perf.peak_gpu_bytes = std::max(summary.perf.peak_gpu_bytes, device_memory_in_use());
    if (callbacks && callbacks->after_step) callbacks->after_step(step + 1, model);
    const AdamWParams& ap = so.adamw;
    summary.losses.push_back(loss);
    summary.steps = step + 1;
    const bool last = step + 1 == max_steps;
    std::optional<double> eval_loss;
    if (eval_data && ((config.logging.eval_every_steps > 0 && (step + 1) % config.logging.eval_every_steps == 0) || last)) {
      eval_loss = evaluate();
      summary.eval_losses.emplace_back(step + 1, *eval_loss);
    }
    if (rank == 0 && ((step + 1) % std::max<int64_t>(config.logging.every_steps, 1) == 0 || last || step == 0 ||
                      eval_loss)) {
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      StepMetrics m;
      m.step = step + 1;
      m.loss = loss;
      m.eval_loss = eval_loss;
      m.lr = ap.lr;
      m.grad_norm = grad_norm;
      m.tokens_per_s = dt > 0 ? global_tokens / dt : 0.0;
      m.step_time_s = step_s;
      m.peak_mem_bytes = peak_rss_bytes();
      if (rt.ctx.is_cuda()) {
        m.peak_gpu_mem_bytes = device_memory_in_use();
        // Every rank's tokens over the step time, over every rank's GPU rate.
        if (gemm_flops > 0 && step_s > 0)
          m.mfu = flops_per_token * global_tokens / step_s / (gemm_flops * world);
      }
      logger->log(m);
    }
    const bool stopping = step + 1 == stop_step;
    if (!config.checkpoint.dir.empty() &&
        (stopping || (config.checkpoint.every_steps > 0 && (step + 1) % config.checkpoint.every_steps == 0)))
      save(step + 1);
  }
  summary.profile = model.profile();
  if (mo.profile && !callbacks && rank == 0 && rt.ctx.is_cuda()) {
    // The first step builds plans and warms caches: the split covers every step run here.
    const StepProfile& p = model.profile();
    double total = 0;
    for (double v : p.ms) total += v;
    const int64_t steps_run = std::max<int64_t>(summary.steps - start_step, 1);
    QS_LOG_INFO("compute-stream time split over {} steps ({:.1f} ms per step{}):", steps_run, total / steps_run,
                p.truncated ? "; event pool full, later marks untimed" : "");
    for (size_t i = 0; i < p.ms.size(); ++i)
      QS_LOG_INFO("  {:<22} {:9.2f} ms/step  {:5.1f}%", step_part_name(static_cast<StepPart>(i)), p.ms[i] / steps_run,
                  total > 0 ? 100.0 * p.ms[i] / total : 0.0);
  }
  if (summary.steps < max_steps) {
    if (rank == 0) QS_LOG_INFO("stopped after step {} of {} (checkpoint.stop_after_steps); resume with --resume auto",
                               summary.steps, max_steps);
    return summary;
  }
  // The trained job's exports (every rank takes part; rank 0 writes): the base model as the
  // bitsandbytes 4-bit folder transformers loads, and the PEFT adapter, under checkpoint.dir.
  if (!config.checkpoint.dir.empty()) {
    // A resumed run whose earlier part already exported (a run extended by more steps) keeps
    // that export and writes the new one next to it.
    // Rank 0 decides (one answer for every rank); "" = already exported, nothing to do.
    std::string fin;
    if (rank == 0) {
      fin = config.checkpoint.dir + "/final";
      if (non_empty_dir(fin)) {
        const std::string next = fin + "-step-" + std::to_string(max_steps);
        if (start_step == max_steps || non_empty_dir(next)) {
          QS_LOG_INFO("the run is complete (step {}) and its exports exist under {}; nothing to do", max_steps,
                      config.checkpoint.dir);
          fin.clear();
        } else {
          QS_LOG_WARN("{} exists from an earlier part of this run; exporting to {}", fin, next);
          fin = next;
        }
      }
    }
    fin = broadcast_string(comm, fin, 0);
    if (fin.empty()) return summary;
    const std::string base = fin + "/base_bnb4", adapter = fin + "/adapter";
    ExportOptions eo;
    eo.format = ExportFormat::kBnb4;
    eo.out_dir = base;
    export_model(comm, *tree, mc, mgr, sharded, eo);
    eo.format = ExportFormat::kPeft;
    eo.out_dir = adapter;
    eo.base_model_name_or_path = config.model.path.empty() ? base : config.model.path;
    eo.r = config.lora.r;
    eo.lora_alpha = config.lora.alpha;
    eo.use_rslora = config.lora.rslora;
    eo.lora_dropout = config.lora.dropout;
    eo.target_modules = config.lora.target_modules;
    export_model(comm, *tree, mc, mgr, sharded, eo);
    summary.exported_base = base;
    summary.exported_adapter = adapter;
    if (rank == 0) QS_LOG_INFO("exported the base model to {} and the LoRA adapter to {}", base, adapter);
  }
  return summary;
}

}  // namespace qshard
