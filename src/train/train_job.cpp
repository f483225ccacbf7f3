#include "train/train_job.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "checkpoint/export.h"
#include "checkpoint/safetensors.h"
#include "model/eval_loss.h"
#include "model/llama_ops.h"
#include "runtime/collective_status.h"
#include "runtime/failure.h"
#include "runtime/log.h"
#include "runtime/machine.h"
#include "text/tokenizer_fingerprint.h"
#include "train/flops.h"
#include "train/run_protocol.h"
#include "train/train_checkpoint.h"

namespace qshard {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TrainJob::TrainJob(const TrainConfig& config, Runtime& rt, const TrainCallbacks* callbacks)
    : config_(config), rt_(rt), comm_(rt.host), callbacks_(callbacks), rank_(rt.host.rank()), world_(rt.host.size()) {}

TrainJob::~TrainJob() {
  if (saved_) return;
  logger_.reset();  // closes the metrics log
  std::error_code ec;
  if (!fresh_resolved_.empty()) std::filesystem::remove(fresh_resolved_, ec);
  if (!fresh_metrics_.empty() && std::filesystem::is_regular_file(fresh_metrics_, ec) &&
      std::filesystem::file_size(fresh_metrics_, ec) == 0)
    std::filesystem::remove(fresh_metrics_, ec);
}

// ---- open -----------------------------------------------------------------------------------

void TrainJob::open() {
  config_.validate(world_);
  config_.check_inputs();  // every file the job reads is there, before anything loads
  // Which backend computes is decided; this build may lack what the CUDA one needs.
  if (rt_.ctx.is_cuda() && !ops::has_backend(Backend::kCuda, "attention_fwd"))
    throw InputError(config_.source + ": device '" + device_choice_name(config_.device) + "' chose the GPU (" +
                     rt_.ctx.describe() + "), but this build has no fused attention (it was built without cuDNN "
                     "or the cudnn-frontend headers: rerun scripts/setup.sh); set device: cpu");
  if (rt_.ctx.is_cuda())  // before anything loads
    check_attention_shape(job_llama_config(config_.model), Backend::kCuda,
                          config_.source + ": " +
                              (config_.model.path.empty() ? std::string("model.init")
                                                          : "model.path " + config_.model.path + "/config.json"));
  lock_ = agree_on_run_lock(config_, comm_);  // rank 0 holds checkpoint.dir; a second job there refuses
  resume_ = agree_on_resume(config_, comm_);  // rank 0 picks the checkpoint, every rank reads its metadata
  if (rank_ == 0) write_resolved_config();
  build_model();
  restore_resumed();
  open_logger();
}

// The job as resolved (the file, the --set overrides, the defaults) beside its checkpoints, where a
// later look (or `--config <dir>/config.resolved.yaml`) finds it; the screen shows it only with
// `qshard train --print-config`.
void TrainJob::write_resolved_config() {
  if (config_.checkpoint.dir.empty()) return;
  const std::string path = config_.checkpoint.dir + "/config.resolved.yaml";
  std::error_code ec;
  std::filesystem::create_directories(config_.checkpoint.dir, ec);
  if (ec) throw InputError("checkpoint.dir " + config_.checkpoint.dir + ": cannot create the folder: " + ec.message());
  const bool fresh = !std::filesystem::exists(path, ec);
  write_file_atomic(path, "# resolved from " + config_.source + "\n" + config_.to_yaml());
  if (fresh) fresh_resolved_ = path;
  QS_LOG_INFO("resolved config written to {}", path);
}

void TrainJob::build_model() {
  // The runtime's own device memory (CUDA context, communicators), before anything of the model.
  const std::optional<int64_t> runtime_bytes = rt_.ctx.memory_in_use();
  // ---- memory plan (offload, MLP chunks), then the model, sharded ----
  // The cost model's rates, measured now when the plan has a choice to make on the GPU.
  const bool choosing = config_.memory.gpu_budget_gb > 0 || config_.batch.micro_batch_size == 0;
  if (rt_.ctx.is_cuda() && choosing) {
    rates_.gemm_flops = measure_gemm_flops(rt_.ctx);
    rates_.h2d_bytes_per_second = measure_h2d_bandwidth(rt_.ctx);
    rates_.host_available_bytes = static_cast<double>(host_memory_available().bytes);
  }
  const LlamaConfig lc = job_llama_config(config_.model);
  plan_ = plan_memory(config_, lc, rt_.ctx.backend(), rt_.ctx.activation_dtype(), rt_.data.size(), rates_);
  if (config_.batch.micro_batch_size == 0) {
    config_.batch.micro_batch_size = plan_.micro_batch;  // everything below reads the chosen one
    if (rank_ == 0)
      QS_LOG_INFO("batch.micro_batch_size = 0: the memory plan chose micro-batches of {} ({} per step on each rank)",
                  plan_.micro_batch, config_.batch.global_batch_size / (plan_.micro_batch * world_));
  }
  if (rank_ == 0 && plan_.offload_params && !config_.offload.params)
    QS_LOG_INFO("memory.gpu_budget_gb = {}: the base goes to pinned host memory (offload.params on)",
                config_.memory.gpu_budget_gb);
  if (rank_ == 0 && plan_.offload_optimizer && !config_.offload.optimizer)
    QS_LOG_INFO("memory.gpu_budget_gb = {}: the LoRA optimizer state goes to host memory, AdamW on the host "
                "(offload.optimizer on)", config_.memory.gpu_budget_gb);
  if (rank_ == 0 && plan_.embedding_on_host && config_.memory.embedding == "auto")
    QS_LOG_INFO("memory.gpu_budget_gb = {}: the embedding table goes to pinned host memory, its rows read in place "
                "(memory.embedding: host)", config_.memory.gpu_budget_gb);
  qm_ = build_qlora_model(config_, rt_, &plan_);  // the plan, made once, decides offload
  if (rank_ == 0) {
    std::string split;
    for (const auto& [name, secs] : qm_->build_seconds) split += fmt::format("{}{} {:.1f} s", split.empty() ? "" : ", ", name, secs);
    QS_LOG_INFO("model build: {}", split);
  }
  const LlamaConfig& mc = qm_->config;

  T_ = static_cast<int>(config_.data.max_seq_len);
  if (T_ > mc.max_position_embeddings)
    throw InputError(config_.source + ": data.max_seq_len " + std::to_string(T_) + " is past the model's maximum of " +
                     std::to_string(mc.max_position_embeddings) + " positions");
  mo_.lora_alpha = config_.lora.alpha;
  mo_.use_rslora = config_.lora.rslora;
  mo_.lora_dropout = static_cast<float>(config_.lora.dropout);
  mo_.dropout_seed = config_.seed;
  mo_.max_batch = config_.batch.micro_batch_size;
  mo_.max_seq = T_;
  mo_.profile = config_.logging.profile || (callbacks_ && callbacks_->profile);
  mo_.fold_lora = config_.lora.fold;
  mo_.fuse_qkv_backward = config_.lora.fuse_qkv_backward;

  // ---- optimizer state: this rank's shards, where the master shards live ----
  opt_ = make_optimizer_state(*qm_);
  state_ = state_shards(*qm_, opt_.exp_avg, opt_.exp_avg_sq);

  // ---- kept layers: what the budget holds once the model and its state are built ----
  plan_kept_layers(plan_, config_, static_cast<double>(rt_.ctx.memory_in_use().value_or(0)), 0.0);
  if (rt_.ctx.is_cuda()) plan_.est_step_s = plan_step_estimate(plan_, config_, mc, world_, rates_);
  mo_.keep_layers = plan_.keep_layers;
  mo_.host_keep_layers = plan_.host_keep_layers;
  mo_.host_staging_sets = plan_.host_staging;
  mo_.kept_mlp = plan_.kept_mlp;
  mo_.host_kept_mlp = plan_.host_kept_mlp;
  mo_.full_kept_sets = plan_.full_kept;
  mo_.dequantized_layers = plan_.dequantized;
  mo_.host_checkpoints = plan_.host_checkpoints;
  mo_.checkpoint_slots = plan_.checkpoint_slots;
  mo_.checkpoint_every = plan_.checkpoint_every;
  mo_.mlp_chunk_rows = plan_.mlp_chunk_rows;
  mo_.attention_lean_workspace = config_.memory.gpu_budget_gb > 0;  // memory_plan.cpp's library_bytes
  if (rank_ == 0) QS_LOG_INFO("{}", plan_.describe());
  open_data();
  build_step_model(runtime_bytes);
}

void TrainJob::build_step_model(std::optional<int64_t> runtime_bytes) {
  mo_.packed_positions = packing_ == Packing::kPacked;
  if (mo_.packed_positions)  // the most pieces a micro-batch can hold: the CUDA attention graphs' size
    mo_.packed_max_pieces = config_.batch.micro_batch_size *
                            std::max(train_data_->max_pieces(), eval_data_ ? eval_data_->max_pieces() : int64_t{1});
  model_ = std::make_unique<LlamaModel>(qm_->config, *qm_->tree, rt_.ctx, mo_);
  if (callbacks_ && callbacks_->profile && callbacks_->profile_paused) model_->set_profiling(false);
  if (rank_ == 0) QS_LOG_INFO("step buffers: {}", model_->buffer_plan().ledger());
  fsdp_ = std::make_unique<FsdpDriver>(*model_, *qm_);
  account_memory(runtime_bytes);
}

// The memory ledger: every allocation of the build, line by line, against the memory in use.
void TrainJob::account_memory(std::optional<int64_t> runtime_bytes) {
  MemoryLedger l(rt_.ctx.is_cuda() ? "GPU" : "host (CPU backend)");
  if (runtime_bytes)
    l.add("CUDA context, communicators (before the build)", static_cast<uint64_t>(*runtime_bytes), MemoryPlace::kDevice);
  qm_->mgr->account(l);
  auto place = [&](const Tensor& t) {  // optimizer state on the host is plain host memory: not a ledger line
    return t.device() == rt_.ctx.compute_device() ? std::optional<MemoryPlace>(MemoryPlace::kDevice) : std::nullopt;
  };
  for (size_t u = 0; u < opt_.exp_avg.size(); ++u)
    if (const auto p = place(opt_.exp_avg[u]))
      l.add("AdamW moments", opt_.exp_avg[u].nbytes() + opt_.exp_avg_sq[u].nbytes(), *p);
  if (const auto p = place(opt_.norm_scratch))
    l.add("gradient-norm scratch", opt_.norm_scratch.nbytes() + opt_.clip_scale.nbytes(), *p);
  if (opt_.host && rt_.ctx.is_cuda())
    l.add("gradient shards staged for the host AdamW", opt_.host->staging_bytes(), MemoryPlace::kPinnedHost);
  const BufferPlan& bp = model_->buffer_plan();
  l.add("step activations", static_cast<uint64_t>(bp.total(BufferLife::kRun)), MemoryPlace::kDevice);
  l.add("kept layers' activations", static_cast<uint64_t>(bp.total(BufferLife::kKept)), MemoryPlace::kDevice);
  l.add("dequantized base layers", static_cast<uint64_t>(bp.total(BufferLife::kWeights)), MemoryPlace::kDevice);
  l.add("host-kept layers' activations and checkpoints", static_cast<uint64_t>(bp.total(BufferLife::kHost)),
        MemoryPlace::kPinnedHost);
  l.add("step workspace", static_cast<uint64_t>(model_->allocated_bytes().workspace), MemoryPlace::kDevice);
  if (const auto lib = model_->library_bytes())  // measured: handles, kernels, attention workspace
    l.add("cuBLAS / cuDNN handles, kernels and workspace (measured)", static_cast<uint64_t>(*lib), MemoryPlace::kDevice);
  else
    l.add("attention library workspace (estimate)", static_cast<uint64_t>(bp.total(BufferLife::kLibrary)),
          MemoryPlace::kDevice);
  if (const auto in_use = rt_.ctx.memory_in_use()) l.set_measured(static_cast<uint64_t>(*in_use));
  if (rank_ == 0) QS_LOG_INFO("memory ledger: {}", l.describe());
  summary_.perf.ledger = std::move(l);
}

void TrainJob::open_data() {
  const LlamaConfig& mc = qm_->config;
  if (config_.data.train.empty()) throw InputError(config_.source + ": data.train (a token file) is required");
  train_file_.emplace(TokenFile::open(config_.data.train));
  // Ids made by another tokenizer than the model's are refused, naming both (in-range ids would train).
  const ModelTokenizer tokenizer = model_tokenizer(config_.model.path);
  const std::string train_warning = check_token_file_tokenizer(*train_file_, tokenizer);
  if (rank_ == 0 && !train_warning.empty()) QS_LOG_WARN("{}", train_warning);
  train_file_->validate(static_cast<uint32_t>(mc.vocab_size));
  if (!config_.data.eval.empty()) {
    eval_file_.emplace(TokenFile::open(config_.data.eval));
    const std::string eval_warning = check_token_file_tokenizer(*eval_file_, tokenizer);
    if (rank_ == 0 && !eval_warning.empty()) QS_LOG_WARN("{}", eval_warning);
    eval_file_->validate(static_cast<uint32_t>(mc.vocab_size));
  }
  packing_ = resolve_packing(config_.data.packing, *train_file_, eval_file_ ? &*eval_file_ : nullptr);
  if (rank_ == 0 && config_.data.packing == "auto")
    QS_LOG_INFO("data.packing auto: {}", packing_ == Packing::kPacked
                                             ? std::string("packed (the token files mark their documents)")
                                             : "wrapped (" + (train_file_->doc_starts() ? config_.data.eval : config_.data.train) +
                                                   " marks no documents: a token file older than version 3)");
  const PackedDataset all(*train_file_, T_, /*pad_last=*/false, packing_);
  train_data_.emplace(all);
  if (eval_file_) {
    eval_data_.emplace(*eval_file_, T_, /*pad_last=*/false, packing_);
  } else if (config_.data.eval_fraction > 0) {
    auto [tr, ev] = split_eval(all, config_.data.eval_fraction);
    train_data_.emplace(tr);
    eval_data_.emplace(ev);
  }
  const int64_t G = config_.batch.global_batch_size, micro = config_.batch.micro_batch_size;
  if (train_data_->num_sequences() < G)
    throw InputError(config_.data.train + ": " + std::to_string(train_data_->num_sequences()) +
                     " training sequences of " + std::to_string(T_) + " tokens, fewer than one global batch (" +
                     std::to_string(G) + ")");
  loader_.emplace(*train_data_, G, config_.data.seed, rank_, world_);
  max_steps_ = config_.max_steps(train_data_->num_sequences());
  summary_.max_steps = max_steps_;
  sched_ = LrSchedule{config_.schedule.type, config_.optimizer.lr, config_.schedule.warmup_steps, max_steps_,
                      config_.schedule.min_lr_ratio};
  micro_steps_ = G / (micro * world_);
}

// The resumed run's sharded state (resharded to this world size), data position and history.
void TrainJob::restore_resumed() {
  TrainHistory history;
  if (resume_) {
    // The LR schedule continues unchanged unless the job asks (checkpoint.allow_schedule_change).
    std::string err, changed;
    try {
      changed = check_resume_schedule(*resume_, sched_, config_.checkpoint.allow_schedule_change);
    } catch (const std::exception& e) {
      err = e.what();
    }
    throw_if_any_failed(comm_, err);
    if (!changed.empty() && rank_ == 0)
      QS_LOG_WARN("resume from {}: the LR schedule changes (checkpoint.allow_schedule_change): {}", resume_->dir,
                  changed);
    load_sharded_checkpoint(comm_, *resume_, state_, config_.model.allow_nonfinite);
    err.clear();
    try {
      history = checkpoint_history(*resume_);
      loader_->restore(resume_->metadata.at("trainer").at("data"),
                       (std::filesystem::path(resume_->dir) / "metadata.json").string() + " (trainer.data)");
      // A checkpoint is taken between optimizer steps: its data position is the start of batch
      // `step` (another would skip or repeat data in silence).
      const DistributedSampler& sampler = loader_->sampler();
      if (sampler.global_step() != resume_->step || sampler.state().offset != 0)
        throw InputError("metadata.json: trainer.data is at batch " + std::to_string(sampler.global_step()) +
                         " (epoch " + std::to_string(sampler.state().epoch) + ", step " +
                         std::to_string(sampler.state().step) + ", offset " + std::to_string(sampler.state().offset) +
                         "), expected the start of batch " + std::to_string(resume_->step) +
                         ", the checkpoint's step; refusing to resume from it");
    } catch (const std::exception& e) {
      err = resume_->dir + ": " + e.what();
    }
    throw_if_any_failed(comm_, err);
    start_step_ = resume_->step;
    if (rank_ == 0)
      QS_LOG_INFO("resumed from {} (step {}, saved by {} ranks, now {} ranks)", resume_->dir, start_step_,
                  resume_->world_size, world_);
  }
  stop_step_ = config_.checkpoint.stop_after_steps > 0
                   ? std::min(max_steps_, std::max(start_step_, config_.checkpoint.stop_after_steps))
                   : max_steps_;
  summary_.losses = history.losses;
  summary_.eval_losses = history.eval_losses;
  summary_.steps = start_step_;
  summary_.resumed_from = resume_ ? resume_->dir : std::string();
}

// Rank 0's metrics logger and the model line; every rank's GEMM rate for MFU.
void TrainJob::open_logger() {
  const LlamaConfig& mc = qm_->config;
  if (rank_ == 0 && resume_ && !config_.logging.metrics_jsonl.empty())
    drop_metrics_after(config_.logging.metrics_jsonl, start_step_);
  if (rank_ == 0 && !config_.logging.metrics_jsonl.empty() && !std::filesystem::exists(config_.logging.metrics_jsonl))
    fresh_metrics_ = config_.logging.metrics_jsonl;
  if (rank_ == 0) logger_ = std::make_unique<MetricsLogger>(config_.logging.metrics_jsonl, max_steps_, resume_.has_value());
  if (rank_ == 0 && !config_.logging.tensorboard_dir.empty())
    QS_LOG_INFO("TensorBoard events: {} (tensorboard --logdir {})",
                logger_->open_tensorboard(config_.logging.tensorboard_dir, start_step_ + 1),
                config_.logging.tensorboard_dir);
  if (rank_ == 0)
    QS_LOG_INFO("model: {} layers, hidden {}, vocab {}; {} trainable LoRA parameters; {} units over {} ranks; {} steps "
                "on {}",
                mc.num_hidden_layers, mc.hidden_size, mc.vocab_size, qm_->trainable_parameters, qm_->mgr->num_units(),
                world_, max_steps_, rt_.ctx.describe());
  // MFU's denominator: this GPU's bf16 GEMM rate (logging.gemm_tflops; 0 on the CPU: no MFU reported).
  gemm_flops_ = config_.logging.gemm_tflops < 0 && rates_.gemm_flops > 0
                    ? rates_.gemm_flops  // measured for the memory plan a moment ago
                    : job_gemm_flops(rt_.ctx, config_.logging.gemm_tflops);
  flops_per_token_ = useful_flops_per_token(mc, T_, qm_->trainable_parameters);
  if (rank_ == 0 && gemm_flops_ > 0)
    QS_LOG_INFO("bf16 GEMM rate on {}: {:.0f} TFLOP/s; useful work {:.2f} GFLOP per token", rt_.ctx.describe(),
                gemm_flops_ * 1e-12, flops_per_token_ * 1e-9);

  summary_.trainable_parameters = qm_->trainable_parameters;
  summary_.perf.gemm_flops = gemm_flops_;
  summary_.perf.flops_per_token = flops_per_token_;
  summary_.perf.plan = plan_.describe();
  summary_.perf.plan_brief = plan_.brief();
  summary_.perf.attention_deterministic = model_->attention_deterministic();
  summary_.perf.keep_layers = plan_.keep_layers;
  summary_.perf.host_keep_layers = plan_.host_keep_layers;
  summary_.perf.kept_mlp = plan_.kept_mlp;
  summary_.perf.host_kept_mlp = plan_.host_kept_mlp;
  summary_.perf.full_kept = plan_.full_kept;
  summary_.perf.dequantized_layers = plan_.dequantized;
  summary_.perf.micro_batch = plan_.micro_batch;
  summary_.perf.est_step_s = plan_.est_step_s;
  summary_.perf.mlp_chunk_rows = plan_.mlp_chunk_rows;
  summary_.perf.offload_params = plan_.offload_params;
  summary_.perf.offload_optimizer = plan_.offload_optimizer;
  summary_.perf.embedding_on_host = plan_.embedding_on_host;
  summary_.perf.host_checkpoints = plan_.host_checkpoints;
  summary_.perf.checkpoint_slots = plan_.host_checkpoints ? plan_.checkpoint_slots : 0;
  summary_.perf.checkpoint_every = plan_.checkpoint_every;
}

// ---- steps ----------------------------------------------------------------------------------

StepRecord TrainJob::run_step(int64_t step) {
  StepRecord r;
  r.start = std::chrono::steady_clock::now();
  std::vector<Batch> batches;
  for (int64_t k = 0; k < micro_steps_; ++k) batches.push_back(loader_->next_batch(static_cast<int>(config_.batch.micro_batch_size)));
  StepOptions so;
  so.step = step;
  so.adamw.lr = sched_.lr_at(step);
  so.adamw.beta1 = config_.optimizer.beta1;
  so.adamw.beta2 = config_.optimizer.beta2;
  so.adamw.eps = config_.optimizer.eps;
  so.adamw.weight_decay = config_.optimizer.weight_decay;
  so.grad_clip = config_.optimizer.grad_clip;
  so.rank_row_offset = rank_ * (config_.batch.global_batch_size / world_);
  so.seq_len = T_;
  const StepStats st = train_step(rt_, *qm_, *model_, *fsdp_, opt_, batches, so);
  r.step_s = seconds_since(r.start);
  r.step = step + 1;
  r.loss = st.loss;
  r.grad_norm = st.grad_norm;
  r.lr = so.adamw.lr;
  // Both are global (all-reduced): every rank stops here together, before the step is saved.
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))
    throw JobInputError(fmt::format("{}: step {}: the loss is {} and the gradient norm {}: the training diverged and "
                                    "was stopped before anything of this step was saved (checkpoints of earlier "
                                    "steps are kept; no exports were written). Lower optimizer.lr (now {:g}), "
                                    "lora.alpha ({:g}) or optimizer.weight_decay ({:g}), or set optimizer.grad_clip",
                                    config_.source, r.step, r.loss, r.grad_norm, so.adamw.lr, config_.lora.alpha,
                                    config_.optimizer.weight_decay),
                        rank_ == 0);
  r.tokens = st.tokens;
  r.input_tokens = st.input_tokens;
  summary_.perf.step_seconds.push_back(r.step_s);
  if (summary_.perf.step_seconds.size() == 1) {
    summary_.perf.first_step_done_s = seconds_since_launch();
    if (rank_ == 0) QS_LOG_INFO("first step done {:.1f} s after launch", summary_.perf.first_step_done_s);
  }
  summary_.perf.step_tokens.push_back(st.tokens);
  summary_.perf.inside.host_syncs += st.inside.host_syncs;
  summary_.perf.inside.device_allocs += st.inside.device_allocs;
  summary_.perf.inside.name_lookups += st.inside.name_lookups;
  if (const auto in_use = rt_.ctx.memory_in_use())
    summary_.perf.peak_gpu_bytes = std::max(summary_.perf.peak_gpu_bytes, *in_use);
  if (callbacks_ && callbacks_->after_step) callbacks_->after_step(step + 1, *model_);
  summary_.losses.push_back(r.loss);
  summary_.steps = step + 1;
  return r;
}

bool TrainJob::eval_due(int64_t done) const {
  const int64_t every = config_.logging.eval_every_steps;
  return eval_data_ && ((every > 0 && done % every == 0) || done == max_steps_);
}

double TrainJob::evaluate(int64_t done) {
  const PackedDataset& data = *eval_data_;
  const auto [first, end] = eval_range(data.num_sequences(), rank_, world_);  // [first, end)
  // Every forward gathers units (collectives), so every rank runs the same number of them:
  // ranks with a shorter slice repeat a sequence and do not count it.
  const int64_t rounds = (data.num_sequences() + world_ - 1) / world_;
  std::vector<int32_t> in(static_cast<size_t>(T_)), tg(static_cast<size_t>(T_)), pos(static_cast<size_t>(T_));
  const LossTotals t = sequence_losses(*model_, rounds, [&](int64_t k, EvalSequence& s) {
    const int64_t i = first + k;
    const bool counted = i < end;
    data.get(counted ? i : std::min<int64_t>(first, data.num_sequences() - 1), in.data(), tg.data(), pos.data());
    s.ids.assign(in.begin(), in.end());
    s.targets.assign(tg.begin(), tg.end());
    if (data.restarts_positions()) s.positions.assign(pos.begin(), pos.end());
    return counted;
  });
  const double total_loss = sum_over_ranks(comm_, t.loss_sum);
  const int64_t total_tokens = sum_over_ranks(comm_, t.tokens);
  const double loss = total_tokens > 0 ? total_loss / static_cast<double>(total_tokens) : NAN;
  summary_.eval_losses.emplace_back(done, loss);
  return loss;
}

void TrainJob::log(const StepRecord& r) {
  const bool due = r.step % std::max<int64_t>(config_.logging.every_steps, 1) == 0 || r.step == max_steps_ ||
                   r.step == 1 || r.eval_loss;
  if (rank_ != 0 || !due) return;
  const double dt = seconds_since(r.start);  // the step and its eval
  // Throughput as other trainers report it: every token processed (padding excluded), and beside
  // it the loss targets (fewer with prompt masking or padding).
  const double global_tokens = static_cast<double>(r.input_tokens), target_tokens = static_cast<double>(r.tokens);
  StepMetrics m;
  m.step = r.step;
  m.loss = r.loss;
  m.eval_loss = r.eval_loss;
  m.lr = r.lr;
  m.grad_norm = r.grad_norm;
  m.tokens_per_s = dt > 0 ? global_tokens / dt : 0.0;
  m.target_tokens_per_s = dt > 0 ? target_tokens / dt : 0.0;
  m.step_time_s = r.step_s;
  m.peak_mem_bytes = peak_rss_bytes();
  m.peak_gpu_mem_bytes = rt_.ctx.memory_in_use();
  // Every token processed (all ranks) over the step time, over every rank's GPU rate (0 without one: no MFU).
  if (gemm_flops_ > 0 && r.step_s > 0) m.mfu = flops_per_token_ * global_tokens / r.step_s / (gemm_flops_ * world_);
  logger_->log(m);
}

bool TrainJob::save_due(int64_t done) const {
  const int64_t every = config_.checkpoint.every_steps;
  return !config_.checkpoint.dir.empty() && (done == stop_step_ || (every > 0 && done % every == 0));
}

void TrainJob::save(int64_t done) {
  CheckpointSaveOptions so;
  so.root = config_.checkpoint.dir;
  so.step = done;
  so.keep_last = config_.checkpoint.keep_last;
  so.trainer = trainer_state_json(config_, done, max_steps_, *loader_, sched_, {summary_.losses, summary_.eval_losses});
  const auto t0 = std::chrono::steady_clock::now();
  opt_.finish();  // a host optimizer's last step is in the moments
  summary_.last_checkpoint = save_sharded_checkpoint(comm_, state_, so);
  saved_ = true;
  if (rank_ == 0) QS_LOG_INFO("saved checkpoint {} ({:.2f} s)", summary_.last_checkpoint, seconds_since(t0));
}

// ---- finish ---------------------------------------------------------------------------------

TrainSummary TrainJob::finish() {
  summary_.profile = model_->profile();
  summary_.perf.qkv_backward_fused = model_->qkv_backward_fused();
  if (config_.logging.profile && !callbacks_ && rank_ == 0) print_profile();
  if (summary_.steps < max_steps_) {
    if (rank_ == 0)
      QS_LOG_INFO("stopped after step {} of {} (checkpoint.stop_after_steps); resume with --resume auto",
                  summary_.steps, max_steps_);
    return std::move(summary_);
  }
  export_final();
  saved_ = true;
  return std::move(summary_);
}

void TrainJob::print_profile() const {
  // The split is timed with CUDA events: the CPU backend has none to print.
  if (!rt_.ctx.is_cuda()) return;
  // The first step builds plans and warms caches: the split covers every step run here.
  const StepProfile& p = model_->profile();
  double total = 0;
  for (double v : p.ms) total += v;
  const int64_t steps_run = std::max<int64_t>(summary_.steps - start_step_, 1);
  QS_LOG_INFO("compute-stream time split over {} steps ({:.1f} ms per step{}):", steps_run, total / steps_run,
              p.truncated ? "; event pool full, later marks untimed" : "");
  for (size_t i = 0; i < p.ms.size(); ++i)
    QS_LOG_INFO("  {:<22} {:9.2f} ms/step  {:5.1f}%", step_part_name(static_cast<StepPart>(i)), p.ms[i] / steps_run,
                total > 0 ? 100.0 * p.ms[i] / total : 0.0);
}

// The trained job's exports (every rank takes part; rank 0 writes): the base model as the
// bitsandbytes 4-bit folder transformers loads, and the PEFT adapter, under checkpoint.dir. A run
// resumed after a kill during the export writes only the exports that are not complete
// (run_protocol.h).
void TrainJob::export_final() {
  const FinalExportPlan plan = agree_on_final_export(comm_, config_.checkpoint.dir, start_step_, max_steps_);
  if (plan.dir.empty()) {
    if (!plan.done.empty()) {  // written by an earlier invocation: the end-of-job report names them
      summary_.exported_base = plan.done + "/" + kFinalExports[0];
      summary_.exported_adapter = plan.done + "/" + kFinalExports[1];
    }
    return;
  }
  const std::string base = plan.dir + "/" + kFinalExports[0], adapter = plan.dir + "/" + kFinalExports[1];
  auto pending = [&plan](const char* name) {
    return std::find(plan.pending.begin(), plan.pending.end(), name) != plan.pending.end();
  };
  ExportOptions eo;
  if (pending(kFinalExports[0])) {
    eo.format = ExportFormat::kBnb4;
    eo.out_dir = base;
    export_model(comm_, *qm_->tree, qm_->config, *qm_->mgr, qm_->units, eo);
  }
  if (pending(kFinalExports[1])) {
    eo.format = ExportFormat::kPeft;
    eo.out_dir = adapter;
    // The base as the user gave it, usable from any working directory (PEFT resolves a relative
    // path against the caller's): model.path made absolute, or the exported base for a model made
    // from scratch. Not config.json's _name_or_path: a folder's config may name another model (the
    // one it was fine-tuned from); `qshard export --base-model NAME` writes a hub name.
    eo.base_model_name_or_path = absolute_dir(config_.model.path.empty() ? base : config_.model.path);
    eo.r = config_.lora.r;
    eo.lora_alpha = config_.lora.alpha;
    eo.use_rslora = config_.lora.rslora;
    eo.lora_dropout = config_.lora.dropout;
    eo.target_modules = config_.lora.target_modules;
    export_model(comm_, *qm_->tree, qm_->config, *qm_->mgr, qm_->units, eo);
  }
  summary_.exported_base = base;
  summary_.exported_adapter = adapter;
  if (rank_ == 0) QS_LOG_INFO("exported the base model to {} and the LoRA adapter to {}", base, adapter);
}

}  // namespace qshard
