#include "train/bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <fmt/format.h>

#include "checkpoint/safetensors.h"
#include "runtime/allocator.h"
#include "runtime/error.h"
#include "runtime/gpu_monitor.h"
#include "runtime/input_file.h"
#include "runtime/job_settings.h"
#include "runtime/log.h"
#include "runtime/machine.h"
#include "runtime/numbers.h"
#include "runtime/runtime.h"
#include "runtime/tensor.h"
#include "train/flops.h"
#include "train/memory_plan.h"
#include "train/qlora_model.h"
#include "text/token_file.h"
#include "train/trainer.h"

namespace qshard {
namespace {

struct Preset {
  const char* name;
  int64_t vocab, hidden, intermediate, layers, heads, kv_heads, positions;
  DType dtype;
  const char* shape;
};
constexpr Preset kPresets[] = {
    {"tiny", 258, 128, 352, 4, 4, 2, 512, DType::kF32, "the tiny test Llama"},
    {"1b", 128256, 2048, 8192, 16, 32, 8, 131072, DType::kBF16, "Llama-3.2-1B shape (untied head)"},
    {"8b", 128256, 4096, 14336, 32, 32, 8, 131072, DType::kBF16, "Llama-3.1-8B shape"},
    {"70b", 128256, 8192, 28672, 80, 64, 8, 131072, DType::kBF16, "Llama-3.1-70B shape"},
};

const Preset& find_preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return p;
  throw InputError("bench --preset '" + name + "': expected tiny, 1b, 8b or 70b");
}

double gib(double bytes) { return bytes / double(1 << 30); }

}  // namespace

TrainConfig bench_config(const BenchOptions& o, const std::string& data_train, int world) {
  const Preset& p = find_preset(o.preset);
  for (const auto& [name, v] : {std::pair{"bench --vocab", o.vocab}, {"bench --hidden", o.hidden},
                                {"bench --intermediate", o.intermediate}, {"bench --layers", o.layers},
                                {"bench --heads", o.heads}, {"bench --kv-heads", o.kv_heads}})
    check_int(name, v, 0, kMaxBenchSize);  // 0: the preset's; a negative size is refused, not the preset's
  for (const auto& [name, v] : {std::pair{"bench --batch", o.batch}, {"bench --seq", o.seq}, {"bench --rank", o.rank},
                                {"bench --steps", o.steps}})
    check_int(name, v, 1, kMaxBenchCount);
  check_int("bench --warmup", o.warmup, 0, kMaxBenchCount);
  check_int("bench --profile-steps", o.profile_steps, 0, kMaxBenchCount);
  check_int("bench --micro-batch", o.micro_batch, -1, kMaxBenchCount);
  check_int("bench --keep-layers", o.keep_layers, -1, kMaxBenchSize);
  check_int("bench --host-keep-layers", o.host_keep_layers, -1, kMaxBenchSize);
  check_int("bench --mlp-chunk-tokens", o.mlp_chunk_tokens, -1, kMaxBenchCount);
  check_double("bench --gpu-budget-gb", o.gpu_budget_gb, 0, kMaxBenchGb);
  check_int("bench --list-plans", o.list_plans, 0, 1000);
  check_int("bench --try-plans", o.try_plans, 0, 1000);
  TrainConfig c;
  c.source = "qshard bench";
  ModelInitConfig& m = c.model.init;
  m.vocab_size = o.vocab > 0 ? o.vocab : p.vocab;
  m.hidden_size = o.hidden > 0 ? o.hidden : p.hidden;
  m.intermediate_size = o.intermediate > 0 ? o.intermediate : p.intermediate;
  m.num_hidden_layers = o.layers > 0 ? o.layers : p.layers;
  m.num_attention_heads = o.heads > 0 ? o.heads : p.heads;
  m.num_key_value_heads = o.kv_heads > 0 ? o.kv_heads : p.kv_heads;
  m.max_position_embeddings = std::max(p.positions, o.seq);
  m.dtype = p.dtype;
  m.seed = 0;
  m.draw_4bit = true;  // no float original needed: the projections are drawn in 4-bit (~5x faster)
  c.model.quant_type = QuantType::kNf4;
  c.model.blocksize = 64;
  c.model.double_quant = true;
  c.lora.r = o.rank;
  c.lora.alpha = 2.0 * static_cast<double>(o.rank);
  c.optimizer.lr = 1e-4;
  c.optimizer.weight_decay = 0;
  c.schedule.warmup_steps = 0;
  c.data.train = data_train;
  c.data.max_seq_len = o.seq;
  c.batch.micro_batch_size = o.micro_batch < 0 ? o.batch : o.micro_batch;
  c.batch.global_batch_size = o.batch * world;
  c.steps = o.warmup + o.steps + o.profile_steps;
  c.offload.params = o.offload;
  c.offload.optimizer = o.offload_optimizer;
  c.memory.gpu_budget_gb = o.gpu_budget_gb;
  c.memory.keep_layers = o.keep_layers;
  c.memory.host_keep_layers = o.host_keep_layers;
  c.memory.mlp_chunk_tokens = o.mlp_chunk_tokens;
  c.logging.every_steps = 1;
  c.device = o.device;
  for (const std::string& kv : o.set) apply_override(c, kv);
  c.validate(world);
  return c;
}

nlohmann::json list_memory_plans(const BenchOptions& o, int world, std::string* text) {
  const TrainConfig c = bench_config(o, "-", world);
  const LlamaConfig lc = job_llama_config(c.model);
  PlanRates rates;  // the cost model's defaults (an H200's), this host's free memory
  rates.host_available_bytes = static_cast<double>(host_memory_available().bytes);
  const std::vector<MemoryPlan> all = plan_candidates(c, lc, Backend::kCuda, DType::kBF16, world, rates);
  const MemoryPlan* chosen = fastest_fitting(all);
  if (!chosen) plan_memory(c, lc, Backend::kCuda, DType::kBF16, world, rates);  // throws: no plan fits the budget
  QS_CHECK(chosen != nullptr, "list_memory_plans: no plan fits, and the plan did not refuse the budget");
  // The plan's own choice first (on a tie plan_memory keeps the earlier candidate), then by estimate.
  std::vector<const MemoryPlan*> fit;
  for (const MemoryPlan& p : all)
    if (p.fits() && &p != chosen) fit.push_back(&p);
  std::stable_sort(fit.begin(), fit.end(),
                   [](const MemoryPlan* a, const MemoryPlan* b) { return a->est_step_s < b->est_step_s; });
  fit.insert(fit.begin(), chosen);
  const double tokens = static_cast<double>(c.batch.global_batch_size * c.data.max_seq_len);
  nlohmann::json j;
  j["weighed"] = all.size();
  j["fit"] = fit.size();
  j["gpu_budget_gb"] = o.gpu_budget_gb;
  j["tokens_per_step"] = tokens;
  j["chosen_est_step_s"] = chosen->est_step_s;
  j["plans"] = nlohmann::json::array();
  std::string t = fmt::format(
      "memory plans for {} x {} tokens a step on {} GPU{}{}: {} weighed, {} fit; estimated at an H200's rates "
      "(GEMM {:.0f} TFLOP/s, host to device {:.0f} GB/s), {} of host memory free\n",
      c.batch.global_batch_size, c.data.max_seq_len, world, world > 1 ? "s" : "",
      o.gpu_budget_gb > 0 ? fmt::format(" within {} GB", o.gpu_budget_gb) : std::string(" (no budget)"), all.size(),
      fit.size(), kPlanDefaultGemmFlops / 1e12, kPlanDefaultH2dBytesPerSecond / 1e9,
      human_bytes(rates.host_available_bytes));
  t += fmt::format("{:>3}  {:>9}  {:>9}  {:>7}  {}\n", "#", "s a step", "tokens/s", "GPU GB", "the plan");
  for (size_t i = 0; i < fit.size() && static_cast<int64_t>(i) < o.list_plans; ++i) {
    const MemoryPlan& p = *fit[i];
    const double tps = p.est_step_s > 0 ? tokens / p.est_step_s : 0.0;  // every rank's tokens
    t += fmt::format("{:>3}  {:>9.3f}  {:>9.0f}  {:>7.2f}  {}{}\n", i + 1, p.est_step_s, tps, p.total() / 1e9, p.brief(),
                     i == 0 ? "  (the plan's choice)" : "");
    j["plans"].push_back({{"est_step_s", p.est_step_s},
                          {"est_tokens_per_s", tps},
                          {"gpu_bytes", p.total()},
                          {"host_kept_bytes", p.host_bytes()},
                          {"micro_batch", p.micro_batch},
                          {"offload_params", p.offload_params},
                          {"offload_optimizer", p.offload_optimizer},
                          {"keep_layers", p.keep_layers},
                          {"host_keep_layers", p.host_keep_layers},
                          {"host_staging_sets", p.staging_sets()},
                          {"kept_mlp", p.kept_mlp},
                          {"host_kept_mlp", p.host_kept_mlp},
                          {"full_kept", p.full_kept},
                          {"dequantized_layers", p.dequantized},
                          {"embedding_on_host", p.embedding_on_host},
                          {"host_checkpoints", p.host_checkpoints},
                          {"checkpoint_every", p.checkpoint_every},
                          {"brief", p.brief()},
                          {"pins", p.pins()}});
  }
  j["text"] = t;
  if (text) *text = t;
  return j;
}

namespace {

// One bench: builds the job, runs its steps, measures. `report`: rank 0 prints the table and writes
// --json (try_memory_plans' trials do neither).
nlohmann::json run_one(const BenchOptions& o, World& world, bool report) {
  const int rank = world.rank(), size = world.size();
  // Random token ids, the same on every rank (one file per rank: no shared folder needed).
  TrainConfig probe = bench_config(o, "-", size);
  const int64_t V = probe.model.init.vocab_size, T = o.seq;
  const int64_t sequences = (o.warmup + o.steps + o.profile_steps) * o.batch * size + 1;
  std::vector<uint32_t> ids(static_cast<size_t>(sequences * T + 1));
  uint64_t x = 0x2545f4914f6cdd1dull;
  for (uint32_t& id : ids) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    id = static_cast<uint32_t>(x % static_cast<uint64_t>(V));
  }
  const std::string dir = o.token_dir.empty() ? std::filesystem::temp_directory_path().string() : o.token_dir;
  const std::string path = fmt::format("{}/qshard-bench-{}-{}.tok", dir, static_cast<long>(getpid()), rank);
  write_token_file(path, static_cast<uint32_t>(V), ids);
  ids = {};
  struct Remove {
    std::string p;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove(p, ec);
    }
  } remove{path};
  TrainConfig cfg = bench_config(o, path, size);
  // --set runtime.* (the former environment knobs; a variable that is set still wins).
  set_job_settings({cfg.runtime.collective_timeout_s, cfg.runtime.host_memory_bytes, cfg.runtime.nccl_blocking});

  JobRuntime job(world, cfg.device, "bench --device");
  Runtime& rt = job.get();
  TrainCallbacks cb;
  // The timed steps run with the profiler paused (its events would be in their time); the split
  // comes from profile_steps more steps after them.
  // No profiler on the CPU backend: no profiled steps there.
  const int64_t profile_steps = rt.ctx.is_cuda() ? o.profile_steps : 0;
  cfg.steps -= o.profile_steps - profile_steps;
  cb.profile = profile_steps > 0;
  cb.profile_paused = true;
  // The SM clock, power and clock-event reasons over the timed steps (NVML on a host thread).
  std::unique_ptr<GpuMonitor> clocks = rt.ctx.is_cuda() ? std::make_unique<GpuMonitor>(100) : nullptr;
  if (clocks && o.warmup == 0 && o.steps > 0) clocks->start();
  GpuClockSummary clock_summary;
  cb.after_step = [&](int64_t step, LlamaModel& model) {
    if (clocks && step == o.warmup && o.steps > 0) clocks->start();
    if (step == o.warmup + o.steps) {
      if (clocks) clock_summary = clocks->stop();
      model.reset_profile();
      model.set_profiling(true);
    }
  };
  const TrainSummary s = train(cfg, rt, &cb);

  // The ceilings, measured now (CUDA).
  const double copy_bps = measure_copy_bandwidth(rt.ctx), h2d_bps = measure_h2d_bandwidth(rt.ctx);
  const TrainPerf& p = s.perf;
  double secs = 0, tokens = 0;
  const size_t timed_end = static_cast<size_t>(o.warmup + o.steps);
  for (size_t i = static_cast<size_t>(o.warmup); i < std::min(timed_end, p.step_seconds.size()); ++i) {
    secs += p.step_seconds[i];
    tokens += static_cast<double>(p.step_tokens[i]);
  }
  double profiled_secs = 0;  // the profiled steps' wall time: what the profiler's marks add
  for (size_t i = timed_end; i < p.step_seconds.size(); ++i) profiled_secs += p.step_seconds[i];
  const double profiled_step_s = profile_steps > 0 ? profiled_secs / static_cast<double>(profile_steps) : 0;
  const double tps = secs > 0 ? tokens / secs : 0;
  const double mfu = p.gemm_flops > 0 ? p.flops_per_token * tps / (p.gemm_flops * size) : 0;
  // Against the card's data-sheet rate too (dense bf16): the measured rate is a burst at start.
  const std::string gpu_name = rt.ctx.is_cuda() ? device_name() : std::string();
  const double spec_flops = dense_bf16_spec_flops(gpu_name);
  const double mfu_spec = spec_flops > 0 ? p.flops_per_token * tps / (spec_flops * size) : 0;
  const ModelInitConfig& m = cfg.model.init;
  nlohmann::json j;
  j["preset"] = o.preset;
  j["model"] = {{"vocab_size", m.vocab_size},          {"hidden_size", m.hidden_size},
                {"intermediate_size", m.intermediate_size}, {"num_hidden_layers", m.num_hidden_layers},
                {"num_attention_heads", m.num_attention_heads}, {"num_key_value_heads", m.num_key_value_heads}};
  j["batch"] = o.batch;
  j["seq"] = o.seq;
  j["lora_rank"] = o.rank;
  j["ranks"] = size;
  j["device"] = rt.ctx.describe();
  j["steps_timed"] = o.steps;
  j["warmup"] = o.warmup;
  j["profile_steps"] = profile_steps;
  j["profiled_step_s"] = profiled_step_s;
  j["plan"] = {{"offload_params", p.offload_params},   {"offload_optimizer", p.offload_optimizer},
               {"micro_batch", p.micro_batch},         {"est_step_s", p.est_step_s},
               {"keep_layers", p.keep_layers},         {"host_keep_layers", p.host_keep_layers},
               {"kept_mlp", p.kept_mlp},               {"host_kept_mlp", p.host_kept_mlp},
               {"full_kept", p.full_kept},             {"mlp_chunk_rows", p.mlp_chunk_rows},
               {"dequantized_layers", p.dequantized_layers},
               {"embedding_on_host", p.embedding_on_host},
               {"host_checkpoints", p.host_checkpoints}, {"checkpoint_slots", p.checkpoint_slots},
               {"checkpoint_every", p.checkpoint_every}, {"gpu_budget_gb", o.gpu_budget_gb},
               {"brief", p.plan_brief},                {"text", p.plan}};
  j["attention_deterministic"] = p.attention_deterministic;
  j["qkv_backward_fused"] = p.qkv_backward_fused;
  j["tokens_per_s"] = tps;
  j["step_s"] = o.steps > 0 ? secs / static_cast<double>(o.steps) : 0;
  j["mfu"] = mfu;
  j["device_name"] = gpu_name;
  j["spec_gemm_flops"] = spec_flops;  // 0: a card flops.h has no data-sheet rate for
  j["mfu_spec"] = mfu_spec;
  j["useful_gflop_per_token"] = p.flops_per_token * 1e-9;
  j["peak_gpu_bytes"] = p.peak_gpu_bytes;
  j["peak_pinned_host_bytes"] = pinned_host_peak_bytes();
  j["peak_rss_bytes"] = peak_rss_bytes();
  j["launch_to_first_step_s"] = p.first_step_done_s;
  j["losses"] = s.losses;
  j["limits"] = {{"gemm_tflops", p.gemm_flops * 1e-12}, {"copy_gbps", copy_bps * 1e-9}, {"h2d_pinned_gbps", h2d_bps * 1e-9}};
  nlohmann::json split = nlohmann::json::object();
  const double per = profile_steps > 0 ? 1.0 / static_cast<double>(profile_steps) : 0;
  for (size_t i = 0; i < s.profile.ms.size(); ++i)
    if (rt.ctx.is_cuda()) split[step_part_name(static_cast<StepPart>(i))] = s.profile.ms[i] * per;
  j["time_split_ms"] = split;
  // The split by place (model/llama_model.cpp's mark lines), the largest first: which mark's
  // interval a part's time comes from.
  std::vector<std::pair<double, std::pair<StepPart, uint32_t>>> sites;
  for (const auto& [key, ms] : s.profile.sites) sites.push_back({ms * per, key});
  std::sort(sites.begin(), sites.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  nlohmann::json by_site = nlohmann::json::array();
  for (size_t i = 0; i < std::min<size_t>(sites.size(), 40); ++i)
    by_site.push_back({{"part", step_part_name(sites[i].second.first)},
                       {"line", sites[i].second.second},
                       {"ms", sites[i].first}});
  if (rt.ctx.is_cuda()) j["time_split_sites"] = by_site;
  if (clock_summary.available())
    j["gpu_clock"] = {{"samples", clock_summary.samples},
                      {"sm_mhz_median", clock_summary.sm_mhz_median},
                      {"sm_mhz_p10", clock_summary.sm_mhz_p10},
                      {"sm_mhz_p90", clock_summary.sm_mhz_p90},
                      {"sm_mhz_max", clock_summary.sm_mhz_max},
                      {"power_w_median", clock_summary.power_w_median},
                      {"power_limit_w", clock_summary.power_limit_w},
                      {"power_capped_share", clock_summary.power_capped_share},
                      {"thermal_share", clock_summary.thermal_share}};
  j["memory_ledger"] = p.ledger.to_json();

  if (rank == 0 && report) {
    std::string t;
    t += fmt::format("qshard bench: {} (L {}, hidden {}, intermediate {}, vocab {}), {} x {} tokens per rank, "
                     "LoRA r {} on all seven projections, {} rank{} on {}\n",
                     o.preset, m.num_hidden_layers, m.hidden_size, m.intermediate_size, m.vocab_size, o.batch, o.seq,
                     o.rank, size, size == 1 ? "" : "s", rt.ctx.describe());
    t += p.plan + "\n";
    t += "memory ledger at start:\n";
    for (const LedgerLine& l : p.ledger.lines())
      t += fmt::format("  {:<52} {:>9.3f} GB  {}\n", l.name, static_cast<double>(l.bytes) * 1e-9, memory_place_name(l.place));
    if (const auto u = p.ledger.unaccounted())
      t += fmt::format("  {:<52} {:>9.3f} GB  (measured in use {:.3f} GB)\n", "device, unaccounted",
                       static_cast<double>(*u) * 1e-9, static_cast<double>(*p.ledger.measured()) * 1e-9);
    t += fmt::format("  {:<26} {:.0f}\n", "tokens/s", tps);
    t += fmt::format("  {:<26} {:.1f} ms ({} timed after {} warm-up)\n", "step", o.steps ? 1e3 * secs / o.steps : 0.0,
                     o.steps, o.warmup);
    t += fmt::format("  {:<26} {:.1f} s\n", "launch to first step", p.first_step_done_s);
    if (p.gemm_flops > 0)
      t += fmt::format("  {:<26} {:.1f}% ({:.2f} GFLOP/token useful, bf16 GEMM {:.0f} TFLOP/s measured)\n", "MFU",
                       100 * mfu, p.flops_per_token * 1e-9, p.gemm_flops * 1e-12);
    if (spec_flops > 0)
      t += fmt::format("  {:<26} {:.1f}% ({}: {:.0f} TFLOP/s dense bf16, the data sheet's)\n", "MFU of the spec",
                       100 * mfu_spec, gpu_name, spec_flops * 1e-12);
    if (rt.ctx.is_cuda()) {
      t += fmt::format("  {:<26} {:.2f} GiB\n", "peak GPU memory (device)", gib(static_cast<double>(p.peak_gpu_bytes)));
      t += fmt::format("  {:<26} {:.2f} GiB\n", "peak pinned host memory", gib(static_cast<double>(pinned_host_peak_bytes())));
      t += fmt::format("  {:<26} {:.2f} GiB\n", "peak host memory (RSS)", gib(static_cast<double>(peak_rss_bytes())));
      t += fmt::format("  {:<26} copy {:.0f} GB/s, pinned host-to-device {:.1f} GB/s\n", "limits measured now",
                       copy_bps * 1e-9, h2d_bps * 1e-9);
      if (clock_summary.available())
        t += fmt::format("  {:<26} {}\n", "GPU during timed steps", clock_summary.describe());
      double total = 0;
      for (double v : s.profile.ms) total += v;
      if (profile_steps > 0)
        t += fmt::format("  time split per profiled step ({} after the timed ones, {:.1f} ms each against the timed "
                         "{:.1f} ms; compute stream, {:.1f} ms{}):\n",
                         profile_steps, 1e3 * profiled_step_s, o.steps ? 1e3 * secs / o.steps : 0.0, total * per,
                         s.profile.truncated ? "; more marks than the event pool: the rest not split" : "");
      for (size_t i = 0; i < s.profile.ms.size(); ++i)
        if (s.profile.ms[i] > 0)
          t += fmt::format("    {:<22} {:9.2f} ms  {:5.1f}%\n", step_part_name(static_cast<StepPart>(i)),
                           s.profile.ms[i] * per, total > 0 ? 100 * s.profile.ms[i] / total : 0.0);
    }
    t += fmt::format("  {:<26} {:.2f} GiB\n", "peak host RSS", gib(static_cast<double>(peak_rss_bytes())));
    std::fputs(t.c_str(), stdout);
    std::fflush(stdout);
    if (!o.json.empty()) {
      write_file_atomic(o.json, j.dump(2) + "\n");
    }
  }
  return j;
}

// The choices a plan's shape is made of (list_memory_plans' and run_one's "plan" objects alike);
// the kept layers' counts are not among them (stage 2 sets them from the memory measured after the
// build).
bool same_shape(const nlohmann::json& a, const nlohmann::json& b) {
  for (const char* k : {"micro_batch", "offload_params", "offload_optimizer", "kept_mlp", "embedding_on_host",
                        "host_checkpoints", "checkpoint_every"})
    if (a.at(k) != b.at(k)) return false;
  // host_kept_mlp only where the plan has host-kept layers
  return a.at("host_keep_layers") == 0 || a.at("host_kept_mlp") == b.at("host_kept_mlp");
}

}  // namespace

nlohmann::json run_bench(const BenchOptions& o, World& world) {
  const int rank = world.rank(), size = world.size();
  if (!o.json.empty()) check_output_file(o.json, "bench --json");  // before anything runs (a FIFO would block)
  if (o.list_plans > 0 && o.try_plans > 0)
    throw InputError(fmt::format("bench --list-plans {} and --try-plans {}: one or the other (--list-plans "
                                 "estimates the plans, --try-plans runs them)",
                                 o.list_plans, o.try_plans));
  if (o.list_plans > 0 || o.try_plans > 0) {
    std::string text;
    nlohmann::json j = o.list_plans > 0 ? list_memory_plans(o, size, &text) : try_memory_plans(o, world, &text);
    if (rank == 0) {
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
      if (!o.json.empty()) write_file_atomic(o.json, j.dump(2) + "\n");
    }
    return j;
  }
  return run_one(o, world, true);
}

nlohmann::json try_memory_plans(const BenchOptions& o, World& world, std::string* text) {
  if (world.size() != 1)
    throw InputError(fmt::format("bench --try-plans {}: runs on one rank (this job has {}); list the plans with "
                                 "--list-plans and run one with the --set overrides it shows",
                                 o.try_plans, world.size()));
  if (o.gpu_budget_gb <= 0)
    throw InputError(fmt::format("bench --try-plans {}: needs --gpu-budget-gb (the plans tried are the fastest "
                                 "estimated within it)",
                                 o.try_plans));
  BenchOptions lo = o;
  lo.list_plans = 1000;  // every plan that fits
  lo.try_plans = 0;
  const nlohmann::json listing = list_memory_plans(lo, 1);
  const double budget = o.gpu_budget_gb * 1e9;
  // Which plans: the plan's own choice, then the fastest estimate of each shape not yet tried (the
  // micro-batch, the base's place, each tier's gate / up, a host tier or none: where the cost model
  // is least sure of itself), then the next fastest estimates, up to try_plans of them.
  const std::vector<nlohmann::json> listed = listing.at("plans");
  std::vector<nlohmann::json> plans;
  std::vector<bool> taken(listed.size(), false);
  std::vector<std::string> shapes;
  for (size_t i = 0; i < listed.size() && static_cast<int64_t>(plans.size()) < o.try_plans; ++i) {
    const nlohmann::json& p = listed[i];
    const std::string shape = fmt::format("{} {} {} {} {}", p.at("micro_batch").get<int64_t>(),
                                          p.at("offload_params").get<bool>(), p.at("kept_mlp").get<bool>(),
                                          p.at("host_kept_mlp").get<bool>(), p.at("host_keep_layers").get<int64_t>() > 0);
    if (std::find(shapes.begin(), shapes.end(), shape) != shapes.end()) continue;
    shapes.push_back(shape);
    plans.push_back(p);
    taken[i] = true;
  }
  for (size_t i = 0; i < listed.size() && static_cast<int64_t>(plans.size()) < o.try_plans; ++i)
    if (!taken[i]) plans.push_back(listed[i]);
  nlohmann::json j;
  j["gpu_budget_gb"] = o.gpu_budget_gb;
  j["tokens_per_step"] = listing.at("tokens_per_step");
  j["weighed"] = listing.at("weighed");
  j["fit"] = listing.at("fit");
  j["trials"] = nlohmann::json::array();
  std::string device;
  int fastest = -1;
  double fastest_tps = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    const nlohmann::json& plan = plans[i];
    const std::vector<std::string> pins = plan.at("pins");
    BenchOptions ro = o;
    ro.try_plans = 0;
    ro.list_plans = 0;
    ro.json.clear();
    ro.profile_steps = 0;
    ro.set.insert(ro.set.end(), pins.begin(), pins.end());  // after the command's own: the pins win
    nlohmann::json t = {{"plan", plan.at("brief")},
                        {"est_step_s", plan.at("est_step_s")},
                        {"est_tokens_per_s", plan.at("est_tokens_per_s")},
                        {"pins", pins}};
    QS_LOG_INFO("bench --try-plans: {} of {}: {}", i + 1, plans.size(), plan.at("brief").get<std::string>());
    try {
      const nlohmann::json r = run_one(ro, world, false);
      const int64_t peak = r.at("peak_gpu_bytes");
      const bool within = peak <= 0 || static_cast<double>(peak) <= budget;  // the CPU measures no device memory
      t["tokens_per_s"] = r.at("tokens_per_s");
      t["step_s"] = r.at("step_s");
      t["peak_gpu_bytes"] = peak;
      t["within_budget"] = within;
      t["ran_as"] = r.at("plan").at("brief");
      t["as_listed"] = same_shape(plan, r.at("plan"));
      t["losses"] = r.at("losses");
      t["attention_deterministic"] = r.at("attention_deterministic");
      device = r.at("device");
      const double tps = r.at("tokens_per_s");
      if (within && tps > fastest_tps) fastest = static_cast<int>(i), fastest_tps = tps;
      QS_LOG_INFO("bench --try-plans: {} of {}: {:.0f} tokens/s (estimated {:.0f}), peak {:.2f} GiB", i + 1,
                  plans.size(), tps, plan.at("est_tokens_per_s").get<double>(), gib(static_cast<double>(peak)));
    } catch (const std::exception& e) {
      t["error"] = e.what();
      QS_LOG_WARN("bench --try-plans: {} of {} failed: {}", i + 1, plans.size(), e.what());
    }
    j["trials"].push_back(std::move(t));
  }
  // A plan changes no arithmetic within one micro-batch size (memory_plan.h): the trials of one
  // micro-batch must give the same losses, bit for bit. Each trial names the first of its size. Not
  // where the attention backward is cuDNN's non-deterministic one (no two runs repeat, one plan's
  // neither): those are counted apart.
  std::string mismatch;
  int compared = 0, unrepeatable = 0;
  for (size_t i = 0; i < j["trials"].size(); ++i) {
    nlohmann::json& t = j["trials"][i];
    if (!t.contains("losses")) continue;
    if (!t.at("attention_deterministic").get<bool>()) {
      ++unrepeatable;
      continue;
    }
    for (size_t k = 0; k < i; ++k) {
      const nlohmann::json& u = j["trials"][k];
      if (!u.contains("losses") || !u.at("attention_deterministic").get<bool>()) continue;
      if (plans[k].at("micro_batch") != plans[i].at("micro_batch")) continue;
      t["same_losses_as"] = k;
      t["losses_match"] = u.at("losses") == t.at("losses");
      ++compared;
      if (!t["losses_match"].get<bool>()) mismatch += fmt::format(" #{} against #{};", i + 1, k + 1);
      break;
    }
  }
  j["losses_match"] = mismatch.empty();
  j["losses_compared"] = compared;
  j["losses_unrepeatable"] = unrepeatable;
  j["device"] = device;
  j["fastest"] = fastest;
  j["pins"] = fastest >= 0 ? j["trials"][static_cast<size_t>(fastest)]["pins"] : nlohmann::json::array();

  std::string s = fmt::format(
      "memory plans tried for {} tokens a step within {} GB on {} ({} warm-up + {} timed step{} each; the "
      "estimates at an H200's rates):\n",
      listing.at("tokens_per_step").get<double>(), o.gpu_budget_gb, device.empty() ? std::string("-") : device,
      o.warmup, o.steps, o.steps == 1 ? "" : "s");
  s += fmt::format("{:>3}  {:>9}  {:>9}  {:>8}  {:>8}  {}\n", "#", "estimated", "tokens/s", "step s", "peak GiB",
                   "the plan as it ran");
  for (size_t i = 0; i < j["trials"].size(); ++i) {
    const nlohmann::json& t = j["trials"][i];
    if (t.contains("error")) {
      s += fmt::format("{:>3}  {:>9.0f}  {:>9}  {:>8}  {:>8}  {}: failed: {}\n", i + 1,
                       t.at("est_tokens_per_s").get<double>(), "-", "-", "-", t.at("plan").get<std::string>(),
                       t.at("error").get<std::string>());
      continue;
    }
    const int64_t peak = t.at("peak_gpu_bytes");
    s += fmt::format("{:>3}  {:>9.0f}  {:>9.0f}  {:>8.3f}  {:>8}  {}{}{}{}\n", i + 1,
                     t.at("est_tokens_per_s").get<double>(), t.at("tokens_per_s").get<double>(),
                     t.at("step_s").get<double>(), peak > 0 ? fmt::format("{:.2f}", gib(static_cast<double>(peak))) : "-",
                     t.at("ran_as").get<std::string>(), t.at("within_budget").get<bool>() ? "" : "  (over the budget)",
                     t.at("as_listed").get<bool>() ? "" : fmt::format("  (listed as: {})", t.at("plan").get<std::string>()),
                     static_cast<int>(i) == fastest ? "  <- the fastest" : "");
  }
  if (fastest >= 0) {
    s += fmt::format("fastest as measured within the budget: #{} ({:.0f} tokens/s; the plan's own choice, #1: {}). "
                     "Pin it with:\n ",
                     fastest + 1, fastest_tps,
                     j["trials"][0].contains("tokens_per_s")
                         ? fmt::format("{:.0f}", j["trials"][0]["tokens_per_s"].get<double>())
                         : std::string("failed"));
    for (const std::string& kv : j["pins"].get<std::vector<std::string>>()) s += " --set " + kv;
    s += "\n";
  } else {
    s += "no plan ran within the budget\n";
  }
  s += !mismatch.empty() ? "LOSSES DIFFER between plans of one micro-batch (a plan changed the arithmetic):" + mismatch + "\n"
       : compared > 0     ? "losses: each plan's the same, bit for bit, as every other plan's of its micro-batch\n"
                          : "losses: no two plans of one micro-batch to compare\n";
  if (unrepeatable > 0)
    s += fmt::format("losses of {} plan(s) not compared: their attention backward is cuDNN's non-deterministic one "
                     "(one sequence's deterministic workspace is past its limit), which no two runs repeat\n",
                     unrepeatable);
  j["text"] = s;
  if (text) *text = s;
  return j;
}

}  // namespace qshard
