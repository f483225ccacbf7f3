#include "train/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "model/llama_model.h"
#include "runtime/error.h"
#include "runtime/machine.h"
#include "train/flops.h"

namespace qshard {
namespace {

// The runtime's own device memory beyond the plan's buffers: the CUDA context, communicators and
// what the build leaves in the pools (an estimate used before anything is measured), and the
// libraries' handles and workspaces, taken at their first use in the step. cuDNN's attention
// workspace grows with the micro-batch's tokens: its deterministic backward, measured on the H200
// at the 8B shape (hidden 4096), 0.35 GB at 2048 tokens and 1.25-1.3 GB at 8192, about 36 bytes per
// token per hidden unit. Past 2 GiB (attention_cudnn.cpp: from ~14.6k tokens at the 8B shape) it
// runs in calls of b sequences, the most whose workspace is within 2 GiB, or with a budget (lean)
// within what the non-deterministic backward would take (about 8 bytes per token per q column,
// measured: 0.5 GB at 16,384 tokens, 13.48 GB at 409,600) with its f32 dQ accumulator (4 more,
// which the step's buffers count: llama_buffers.cpp, "attention workspace (cuDNN)"); where one
// sequence is past that, the non-deterministic backward itself.
constexpr double kRuntimeBytes = 0.75e9;
constexpr double kAttentionWorkspaceLimit = 2.0 * (1 << 30);  // attention_cudnn.cpp's
double library_bytes(int64_t micro, double T, double hidden, double q_width, bool lean) {
  const double tokens = static_cast<double>(micro) * T;
  const double deterministic = 36.0 * tokens * hidden;
  if (deterministic <= kAttentionWorkspaceLimit) return 0.1e9 + deterministic;
  const double bound = lean ? std::min(kAttentionWorkspaceLimit, 12.0 * tokens * q_width) : kAttentionWorkspaceLimit;
  for (int64_t b = micro / 2; b >= 1; --b) {
    const double ws = 36.0 * static_cast<double>(b) * T * hidden;
    if (micro % b == 0 && ws <= bound) return 0.1e9 + (lean ? std::max(ws - 4.0 * tokens * q_width, 0.0) : ws);
  }
  return 0.1e9 + 4.0 * tokens * q_width;  // the half the step's buffers do not count
}

LlamaModelOptions step_options(const TrainConfig& config, int64_t micro, int64_t chunk_rows, bool host_checkpoints,
                               int64_t checkpoint_slots = kCheckpointSlots, int64_t checkpoint_every = 1,
                               bool kept_mlp = true) {
  LlamaModelOptions mo;
  mo.kept_mlp = kept_mlp;
  mo.max_batch = micro;
  mo.max_seq = config.data.max_seq_len;
  mo.lora_dropout = static_cast<float>(config.lora.dropout);
  mo.mlp_chunk_rows = chunk_rows;
  mo.host_checkpoints = host_checkpoints;
  mo.checkpoint_slots = checkpoint_slots;
  mo.checkpoint_every = checkpoint_every;
  return mo;
}

}  // namespace

std::string MemoryPlan::describe() const {
  std::string s = budget > 0 ? fmt::format("memory plan for a budget of {}: ", human_bytes(budget)) : "memory plan: ";
  const char* mem = cuda ? "GPU" : "host";
  s += fmt::format("base {}{}; MLP {}; ", offload_params ? "offloaded to pinned host memory" : cuda ? "on the GPU" : "resident",
                   offload_optimizer ? ", optimizer on the host" : "",
                   mlp_chunk_rows > 0 ? fmt::format("in chunks of {} rows", mlp_chunk_rows) : std::string("whole"));
  if (keep_layers <= 1)
    s += fmt::format("every layer but the last recomputed in the backward");
  else
    s += fmt::format("{} keep their activations{} ({} each{}), the rest recomputed",
                     host_keep_layers > 0
                         ? fmt::format("{} of {} layers (the host-kept ones spread among them)",
                                       keep_layers, layers)
                         : fmt::format("layers {}-{} of {}", layers - keep_layers, layers - 1, layers),
                     kept_mlp ? "" : " but the MLP's gate / up",
                     human_bytes(per_kept),
                     full_kept > 0 ? fmt::format("; {} of them their norms' outputs and SwiGLU's too, {} more each",
                                                 full_kept, human_bytes(per_full))
                                   : std::string());
  if (dequantized > 0)
    s += fmt::format("; {} of {} layers' base dequantized on the {} from its first use on ({} each{})", dequantized,
                     layers, mem, human_bytes(per_dequantized),
                     dequantized >= layers && dequantized_ws > 0 ? ", the workspace without weights" : "");
  if (checkpoint_every > 1) s += "; every second layer input kept (the others recomputed from the one before)";
  if (host_checkpoints)
    s += fmt::format("; the layer inputs in pinned host memory, {} on the {}{}", checkpoint_slots, mem,
                     checkpoint_every > 1 ? " (one the recomputed input's)" : "");
  if (embedding_on_host) s += cuda ? "; the embedding table in pinned host memory" : "; the embedding table whole on every rank";
  if (host_keep_layers > 0)
    s += fmt::format("; {} more keep theirs in pinned host memory ({}{}, through {} staging set{} of {} on the {})",
                     host_keep_layers, host_kept_mlp ? "" : "without gate / up, ", human_bytes(host_bytes()),
                     staging_sets(), staging_sets() > 1 ? "s" : "", human_bytes(per_host_kept), mem);
  s += fmt::format("; {}: {} {} + step buffers {} + kept {}{} = {}", mem, measured ? "in use" : "resident (estimate)",
                   human_bytes(resident), human_bytes(step), human_bytes(kept_bytes()),
                   dequantized > 0 ? " + dequantized " + human_bytes(dequantized_bytes()) : std::string(),
                   human_bytes(total()));
  if (est_step_s > 0) {
    s += fmt::format("; micro-batch {}, estimated {:.3f} s a step", micro_batch, est_step_s);
    if (candidates > 1 && runner_up_s > 0)
      s += fmt::format(" (fastest of {} plans; next: {}, {:.3f} s)", candidates, runner_up, runner_up_s);
  }
  return s;
}

std::string MemoryPlan::brief() const {
  std::string s = fmt::format("micro-batch {}", micro_batch);
  if (offload_params) s += ", base offloaded";
  if (offload_optimizer) s += ", optimizer on the host";
  if (mlp_chunk_rows > 0) s += fmt::format(", MLP in chunks of {} rows", mlp_chunk_rows);
  if (keep_layers > 1)
    s += fmt::format(", {} kept{}{}", keep_layers, kept_mlp ? "" : " without gate / up",
                     full_kept > 0 ? fmt::format(" ({} full)", full_kept) : std::string());
  if (host_keep_layers > 0)
    s += fmt::format(", {} host-kept{}", host_keep_layers, host_kept_mlp ? "" : " without gate / up");
  if (dequantized > 0) s += fmt::format(", {} dequantized", dequantized);
  if (embedding_on_host) s += ", embedding on the host";
  if (host_checkpoints) s += ", checkpoints on the host";
  if (checkpoint_every > 1) s += ", every second checkpoint";
  return s;
}

std::vector<std::string> MemoryPlan::pins() const {
  QS_CHECK(kept_mlp || !host_kept_mlp, "MemoryPlan::pins: host-kept layers whole beside lean device-kept ones");
  std::vector<std::string> v = {fmt::format("batch.micro_batch_size={}", micro_batch),
                                offload_params ? "offload.params=true" : "memory.base=gpu"};
  if (offload_optimizer) v.push_back("offload.optimizer=true");
  v.push_back(fmt::format("memory.embedding={}", embedding_on_host ? "host" : "gpu"));
  v.push_back(fmt::format("memory.host_checkpoints={}", host_checkpoints ? "true" : "false"));
  v.push_back(fmt::format("memory.checkpoint_every={}", checkpoint_every));
  v.push_back(fmt::format("memory.kept_mlp={}", !kept_mlp ? "false" : host_kept_mlp ? "true" : "device"));
  v.push_back(fmt::format("memory.host_keep_layers={}", host_keep_layers));
  if (host_staging != 2) v.push_back(fmt::format("memory.host_staging_sets={}", host_staging));
  return v;
}

namespace {

// The cost model's constants, measured on one H200 (docs/PERFORMANCE.md, sessions 11 and 12,
// Llama-3.1-8B and 70B shapes): MFU of a large micro-batch with full recompute; the share of that
// time the recompute takes (every layer kept runs at 1 / (1 - share) the speed); the per-micro-batch
// fixed cost (dequantizing the base, the head, launch latency) in tokens' worth of compute; what an
// offloaded base costs beyond its exposed copies, as a share of its copy time (the copies share
// the device's memory with the kernels behind them: 2 x 2048 with every layer kept ran 4.5% slower
// offloaded, with no wait exposed); the host AdamW's bytes per second (masters, moments,
// gradients: 32 bytes a parameter). Defaults for the rates when none were measured (tests,
// estimates before a GPU is seen).
constexpr double kMfuRecompute = 0.54;
// Attention (PaLM's count, useful_flops_per_token's) runs at the same MFU up to 2048 tokens a
// sequence and at a higher one as sequences grow (cuDNN's fused kernels: 317 TFLOP/s at 1 x 2048,
// 532 at 1 x 8192 in isolation, session 19): linear in log2 T up to kMfuAttention from 32,768
// tokens, fitted to 524,288 tokens on an H100 (730.5 s a step, session 24) and within 3% of the
// steps at 32,768, 131,072, 262,144 (H100) and 409,600 tokens (H200). With one MFU for all the
// 524,288-token step was estimated at 1,183 s.
constexpr double kMfuAttention = 0.895;
double attention_mfu(double T) {
  const double x = std::clamp((std::log2(std::max(T, 1.0)) - 11.0) / 4.0, 0.0, 1.0);  // 2048 -> 0, 32768 -> 1
  return kMfuRecompute + (kMfuAttention - kMfuRecompute) * x;
}
// Refitted (session 31) to 36 trials of `qshard bench --try-plans` on an H100 (8 x 2048, budgets
// 10.08-21.47 GB, docs/PERFORMANCE.md): with these the plan's choice is the fastest measured at 10.08
// and 12.48 GB and within 1% of it at 16.1 and 21.47 GB, the estimates' spread 0.9% about their mean.
// The fixed cost is a micro-batch's whole (dequantizing the base, the head, the LoRA's small GEMMs,
// launches): a kept layer saves its recompute, not any of that. With the fixed cost scaled by the
// recompute (as before) and 290 tokens, micro-batch 1 with 27 layers kept was chosen at 12.48 GB and
// ran at 13,914 tokens/s, against 14,589 for micro-batch 2 with 22.
constexpr double kRecomputeShare = 0.29;
constexpr double kFixedTokens = 350;
// Full kept sets (LlamaModelOptions::full_kept_sets), all L - 1 of them, save this share of N a: a kept
// layer's backward otherwise reruns two RMSNorms, the fold's x A^T twice and one SwiGLU (2.2 GB moved
// at 8 x 2048 of the 8B shape). Measured on an H100 (session 32, docs/PERFORMANCE.md): 20 full sets
// took 15.2 ms off the every-layer-kept step at 8 x 2048 (RMSNorm 26.6 -> 22.7 ms, SwiGLU 53.5 ->
// 44.4, LoRA 91.3 -> 89.1), 0.76 ms a set, against N a = 1.36 s there (the 998 ms step of session 31:
// N a (1 - 0.29) + 350 a): 31 x 0.76 / 1364.
constexpr double kFullShare = 0.017;
// Dequantized layers (LlamaModelOptions::dequantized_layers), every one of them, save this many
// tokens' worth (N0's units) of each micro-batch's fixed work: a layer's two dequants a micro-batch.
// Measured on an H100 (session 34, docs/PERFORMANCE.md): dequant 13.0 ms of the every-layer-kept
// step at 8 x 2048 (16,553 tokens/s), a = 84 us a token there.
constexpr double kDequantTokens = 155;
constexpr double kOffloadContention = 0.06;
// The share of whole host-kept sets' gate / up copies exposed beside an offloaded base (estimate()).
constexpr double kWholeHostExposed = 0.6;
constexpr double kHostAdamBytesPerSecond = 10e9;
constexpr double kDefaultGemmFlops = kPlanDefaultGemmFlops;
constexpr double kDefaultH2dBytesPerSecond = kPlanDefaultH2dBytesPerSecond;
// The lookup's read of its rows from pinned host memory (in place, through unified addressing) as
// a share of the pinned copy rate.
constexpr double kHostReadShare = 0.5;

// What the estimate needs besides the plan.
struct CostInputs {
  double L = 1, T = 1, batch = 1;  // layers, tokens per sequence, sequences per rank per step
  double C = 1;                    // hidden size (a checkpoint's row)
  double flops_per_token = 0;      // useful_flops_per_token
  double layer_bytes = 0;          // one layer's frozen bytes (what an offloaded layer copies)
  double lora_params = 0;
  double embed_row_bytes = 0;      // one row of the embedding table
  double gate_up_share = 0;        // gate / up's share of a layer's forward FLOPs (a kept layer
                                   // without them recomputes that much: LlamaModelOptions::kept_mlp,
                                   // host_kept_mlp)
  double I = 1;                    // intermediate size (gate / up's row: what a lean set leaves out)
  int world = 1;
  double attention_flops = 0;      // flops_per_token's attention (a token's scores and values, PaLM's count)
};

// The job's sizes for the cost model (and the resident estimate): the 4-bit base as the build
// makes it, and the LoRA parameters on all seven projections.
struct JobSizes {
  Llama4bitBytes base;
  double lora_params = 0;
  CostInputs cost;
};
}  // namespace

double lora_param_count(const LlamaConfig& lc, int64_t r, const std::vector<std::string>& targets) {
  const double C = static_cast<double>(lc.hidden_size), I = static_cast<double>(lc.intermediate_size);
  const double q = static_cast<double>(lc.num_attention_heads * lc.head_dim);
  const double kv = static_cast<double>(lc.num_key_value_heads * lc.head_dim);
  double per_layer = 0;  // in + out of each target
  for (const std::string& t : targets) {
    if (t == "q_proj" || t == "o_proj") per_layer += C + q;
    else if (t == "k_proj" || t == "v_proj") per_layer += C + kv;
    else if (t == "gate_proj" || t == "up_proj" || t == "down_proj") per_layer += C + I;
  }
  return static_cast<double>(r) * static_cast<double>(lc.num_hidden_layers) * per_layer;
}

namespace {

JobSizes job_sizes(const TrainConfig& config, const LlamaConfig& lc, int world) {
  JobSizes z;
  const double other_b = config.model.path.empty() ? static_cast<double>(dtype_size(config.model.init.dtype)) : 2.0;
  z.base = llama_4bit_bytes(lc, config.model.blocksize, config.model.double_quant, other_b);
  const double L = static_cast<double>(lc.num_hidden_layers);
  const double C = static_cast<double>(lc.hidden_size);
  static const std::vector<std::string> kAllSeven = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                     "gate_proj", "up_proj", "down_proj"};
  z.lora_params = lora_param_count(lc, config.lora.r, kAllSeven);  // all seven, as the model's buffers
  const int64_t T = config.data.max_seq_len;
  z.cost = CostInputs{L, static_cast<double>(T),
                      static_cast<double>(config.batch.global_batch_size / std::max(world, 1)), C,
                      useful_flops_per_token(lc, T, static_cast<uint64_t>(z.lora_params)), z.base.projections / L,
                      z.lora_params, C * other_b};
  // A layer's forward per token: its seven projections (2 in out each) and causal attention (about
  // 2 q T: scores and values over T / 2 keys on average); gate and up are 4 C I of it.
  const double I = static_cast<double>(lc.intermediate_size);
  const double q = static_cast<double>(lc.num_attention_heads * lc.head_dim);
  const double kv = static_cast<double>(lc.num_key_value_heads * lc.head_dim);
  const double layer_fwd = 4 * C * q + 4 * C * kv + 6 * C * I + 2 * q * static_cast<double>(T);
  z.cost.gate_up_share = layer_fwd > 0 ? 4 * C * I / layer_fwd : 0.0;
  z.cost.I = I;
  z.cost.attention_flops =
      z.cost.flops_per_token - useful_flops_per_token(lc, 0, static_cast<uint64_t>(z.lora_params));
  z.cost.world = world;
  return z;
}

// The layers a plan leaves to recompute (all but the kept ones and the last): the host tier's.
int64_t open_layers(const MemoryPlan& p) { return std::max<int64_t>(p.layers - std::max<int64_t>(p.keep_layers, 1), 0); }

// 1 + the kept layers (each but the last costs per_kept) that `room` bytes hold, at most `layers`.
int64_t kept_for_room(double room, double per_kept, int64_t layers) {
  const double extra = room > 0 ? std::floor(room / per_kept) : 0.0;
  return std::clamp<int64_t>(1 + static_cast<int64_t>(std::min(extra, 1e9)), 0, layers);
}

// The full sets (memory.full_kept_layers): with auto and a budget, once every layer is kept, as
// many as the memory left holds (a whole kept layer saves about ten times the step time per byte;
// below that, the room too small for one more kept layer would buy a set or two, 0.08% each, and
// take the budget's margin: session 32, 10.08 GB); as configured, at most the device-kept sets and
// (with a budget) what the memory left holds.
void fill_full_sets(MemoryPlan& p, const MemoryConfig& m) {
  const int64_t sets = p.mlp_chunk_rows == 0 && p.kept_mlp && p.per_full > 0 ? std::max<int64_t>(p.keep_layers - 1, 0)
                                                                             : 0;
  p.full_kept = 0;
  if (sets == 0 || m.full_kept_layers == 0) return;
  if (m.full_kept_layers < 0 && (p.budget <= 0 || p.keep_layers < p.layers)) return;
  int64_t n = m.full_kept_layers < 0 ? sets : std::min(m.full_kept_layers, sets);
  if (p.budget > 0) {
    const double room = p.budget - p.resident - p.step - p.kept_bytes();
    n = std::min(n, static_cast<int64_t>(std::floor(std::max(room, 0.0) / p.per_full)));
  }
  p.full_kept = n;
}

// The dequantized layers (memory.dequantized_layers): with auto, a budget and the GPU, once every
// layer is kept and every kept set is full (a full set saves a little more a byte), as many as the
// memory left holds; as configured, at most the layers and (with a budget) what the memory left
// holds. Every layer dequantized frees the workspace's weights (dequantized_ws).
void fill_dequantized(MemoryPlan& p, const MemoryConfig& m) {
  p.dequantized = 0;
  if (m.dequantized_layers == 0 || p.per_dequantized <= 0 || p.layers <= 0) return;
  if (m.dequantized_layers < 0) {
    if (!p.cuda || p.budget <= 0 || p.keep_layers < p.layers) return;
    const int64_t sets = std::max<int64_t>(p.keep_layers - 1, 0);
    if (p.per_full > 0 && p.full_kept < sets) return;
  }
  int64_t n = m.dequantized_layers < 0 ? p.layers : std::min(m.dequantized_layers, p.layers);
  if (p.budget > 0) {
    const double room = std::max(p.budget - p.resident - p.step - p.kept_bytes(), 0.0);
    const double all = p.per_dequantized * static_cast<double>(p.layers) - p.dequantized_ws;
    if (n < p.layers || room < all)
      n = std::min({n, p.layers - 1, static_cast<int64_t>(std::floor(room / p.per_dequantized))});
  }
  p.dequantized = std::max<int64_t>(n, 0);
}

double estimate(const MemoryPlan& p, const CostInputs& in, const PlanRates& r) {
  const double R = r.gemm_flops > 0 ? r.gemm_flops : kDefaultGemmFlops;
  const double h2d = r.h2d_bytes_per_second > 0 ? r.h2d_bytes_per_second : kDefaultH2dBytesPerSecond;
  // seconds per token, full recompute
  const double a =
      ((in.flops_per_token - in.attention_flops) / kMfuRecompute + in.attention_flops / attention_mfu(in.T)) / R;
  const double N = static_cast<double>(p.micro_batch) * in.T;
  // The kept fraction of the layers (device- or host-kept): a kept layer without gate / up still
  // recomputes those two GEMMs.
  const double device_kept = std::min(static_cast<double>(std::max<int64_t>(p.keep_layers, 1) - 1), in.L - 1);
  const double host_kept = std::min(static_cast<double>(p.host_keep_layers), in.L - 1 - device_kept);
  const double kept = in.L > 1 ? (device_kept * (p.kept_mlp ? 1.0 : 1.0 - in.gate_up_share) +
                                  host_kept * (p.host_kept_mlp ? 1.0 : 1.0 - in.gate_up_share)) /
                                     (in.L - 1)
                               : 0.0;
  const double full = in.L > 1 ? std::min(static_cast<double>(p.full_kept), device_kept) / (in.L - 1) : 0.0;
  const double dequantized = in.L > 0 ? std::min(static_cast<double>(p.dequantized), in.L) / in.L : 0.0;
  double micro = N * a * (1 - kRecomputeShare * kept - kFullShare * full) + (kFixedTokens - kDequantTokens * dequantized) * a;
  const double copy = in.layer_bytes / in.world / h2d;
  if (p.offload_params) {
    // Each layer's shard crosses host to device once in the forward and once in the backward,
    // behind that layer's compute: exposed where the copy is longer (the forward at small N).
    const double fwd = N * a * (1 - kRecomputeShare) / (3 * in.L);
    micro += in.L * (std::max(0.0, copy - fwd) + std::max(0.0, copy - 3 * fwd) + kOffloadContention * 2 * copy);
  }
  // The offload stream's copies: the host tier's stored sets and the layer inputs held on the host
  // (memory.host_checkpoints) go out during the forward and come back during the backward, each
  // direction at the pinned rate, one stream for both. The host-kept layers are spread over every
  // layer (LlamaModel, session 33), so their copies hide behind the whole forward, and the
  // backward's (less the offloaded base's own copies); what that compute cannot cover is exposed.
  // A checkpoint alone hides behind its own layer (67 MB against about 5 ms at 8B, 4 x 2048).
  const double x = N * in.C * 2 / h2d, layer_fwd = N * a * (1 - kRecomputeShare) / (3 * in.L);
  const double crossing =
      p.host_checkpoints ? static_cast<double>(std::max<int64_t>(
                               llama_checkpoint_buffers(static_cast<int64_t>(in.L), p.checkpoint_every) -
                                   p.checkpoint_slots,
                               0))  // values the host holds
                         : 0.0;
  if (p.host_keep_layers > p.staging_sets()) {
    const double out = (static_cast<double>(p.host_keep_layers - p.staging_sets()) * p.per_host_kept) / h2d + crossing * x;
    const double fwd = layer_fwd * (in.L - 1);
    const double open = in.L - static_cast<double>(std::max<int64_t>(p.keep_layers, 1));
    const double recomputed = std::max(0.0, open - static_cast<double>(p.host_keep_layers));
    const double bwd = 2 * fwd + N * a * kRecomputeShare * recomputed / (in.L - 1) -
                       (p.offload_params ? in.L * copy : 0.0);
    micro += std::max(0.0, out - fwd) + std::max(0.0, out - bwd) + kOffloadContention * 2 * out;
    // Whole host-kept sets beside an offloaded base: their gate / up ([N, I] each, what a lean set
    // leaves out; two thirds of a whole set at 8B) are copied in the very passes whose base copies
    // fill PCIe, and are exposed at about kWholeHostExposed of their one-way time (H100: 10 whole
    // sets at 10.08 GB, micro-batch 2, 12,860 tokens/s against 13,778 estimated; session 33's 5 and
    // 10 whole sets at 12.48 GB, 0.57 and 1.0).
    if (p.host_kept_mlp && p.offload_params)
      micro += kWholeHostExposed * static_cast<double>(p.host_keep_layers - p.staging_sets()) *
               (2 * N * in.I * 2) / h2d;
  } else if (crossing > 0) {
    micro += crossing * (std::max(0.0, x - layer_fwd) + kOffloadContention * 2 * x);
  }
  // Every second checkpoint: the odd layers' forward once more in the backward.
  if (p.checkpoint_every > 1) {
    const double fwd = N * a * (1 - kRecomputeShare) / (3 * in.L);
    micro += fwd * std::max(0.0, in.L - 1 - std::floor(in.L / 2));
  }
  // The embedding in pinned host memory: the lookup reads its N rows over PCIe, on the compute stream.
  if (p.embedding_on_host) micro += N * in.embed_row_bytes / (kHostReadShare * h2d);
  double step = micro * (in.batch / static_cast<double>(p.micro_batch));
  if (p.offload_optimizer) step += in.lora_params / in.world * 32 / kHostAdamBytesPerSecond;
  return step;
}

}  // namespace

std::vector<MemoryPlan> plan_candidates(const TrainConfig& config, const LlamaConfig& lc, Backend backend, DType act_t,
                                        int world, const PlanRates& rates) {
  const MemoryConfig& m = config.memory;
  const bool cuda = backend == Backend::kCuda;
  const double budget = m.gpu_budget_gb * 1e9;
  const int64_t per_rank = config.batch.global_batch_size / std::max(world, 1);
  const int64_t T = config.data.max_seq_len;

  // Estimates of what stays on the GPU besides the step's buffers.
  const JobSizes sizes = job_sizes(config, lc, world);
  const double proj_b = sizes.base.projections;
  const double L = static_cast<double>(lc.num_hidden_layers);
  const double root = sizes.base.other;  // embeddings, head, norms: gathered whole at the head
  const double unit = proj_b / L;        // one decoder layer, gathered (two in flight)
  const double lora_p = sizes.lora_params;
  // The embedding table (whole, on every rank) when it lives in pinned host memory.
  const double embed_b = sizes.cost.embed_row_bytes * static_cast<double>(lc.vocab_size);
  if (config.memory.embedding == "host" && lc.tie_word_embeddings)
    throw InputError(config.source + ": memory.embedding = host, but the model ties its embedding to the LM head "
                     "(tie_word_embeddings), which every micro-batch reads whole: set memory.embedding: gpu or auto");
  auto resident = [&](bool offload_params, bool offload_opt, bool embed_host) {
    double b = cuda ? kRuntimeBytes : 0.0;
    const double root_d = root - (embed_host ? embed_b : 0.0);  // the root unit on the device
    if (world == 1)  // the base read in place, or offloaded through two layer slots; the root on the device
      b += (offload_params ? 2 * unit : proj_b) + root_d;
    else  // two gathered layer slots and the root's own slot, beside this rank's shards unless offloaded
      b += 2 * unit + root_d + (offload_params ? 0.0 : (proj_b + root_d) / world);
    b += lora_p * 4 * (offload_opt ? 1.0 : 4.0) / world;  // gradient shards; master + moments unless offloaded
    b += 2 * (lora_p / L) * (2 + 4);                       // two units' compute copies and full gradients
    return b;
  };

  // One candidate: the step's buffers for micro-batch `micro`, the kept layers the budget holds.
  // Pinned host memory the plan may give kept activations or layer inputs: memory.host_budget_gb,
  // else half of what the host has free less an offloaded base's shards; `unknown` when neither.
  auto host_room_for = [&](bool offload_params, double unknown) {
    if (m.host_budget_gb > 0) return m.host_budget_gb * 1e9;
    if (rates.host_available_bytes <= 0) return unknown;
    return 0.5 * rates.host_available_bytes - (offload_params ? (proj_b + root) / world : 0.0);
  };
  auto candidate = [&](int64_t micro, bool offload_params, bool offload_opt, bool embed_host, bool host_ck,
                       int64_t every) {
    MemoryPlan p;
    p.budget = budget;
    p.layers = lc.num_hidden_layers;
    p.cuda = cuda;
    p.micro_batch = micro;
    p.offload_params = offload_params;
    p.offload_optimizer = offload_opt;
    p.host_checkpoints = host_ck;
    p.checkpoint_every = every;
    // The layer inputs' device slots: three, or as many more as keep the rest within the host
    // memory given to them (at 8B and 512k tokens a layer input is 4.3 GB: 30 of them are more
    // than a 128 GiB host holds); every second checkpoint: one of them the scratch.
    const int64_t kept_inputs = llama_checkpoint_buffers(lc.num_hidden_layers, every);
    if (host_ck) {
      const double x = static_cast<double>(micro * T * lc.hidden_size) * static_cast<double>(dtype_size(act_t));
      const double room = host_room_for(offload_params, std::numeric_limits<double>::infinity());
      const double on_host = std::isfinite(room) ? std::floor(std::max(room, 0.0) / x) : 1e9;
      p.checkpoint_slots = std::clamp<int64_t>(kept_inputs - static_cast<int64_t>(std::min(on_host, 1e9)),
                                               kCheckpointSlots, kept_inputs);
    }
    p.embedding_on_host = embed_host;
    const int64_t N = micro * T;
    if (m.mlp_chunk_tokens < 0) p.mlp_chunk_rows = N > kAutoChunkAbove ? kAutoChunkRows : 0;
    else p.mlp_chunk_rows = m.mlp_chunk_tokens >= N ? 0 : m.mlp_chunk_tokens;
    p.step_buffers = llama_buffer_plan(
        llama_buffer_dims(lc, step_options(config, micro, p.mlp_chunk_rows, host_ck, p.checkpoint_slots, every),
                          backend, act_t, act_t,
                          config.lora.r),
        backend, act_t);
    p.step = static_cast<double>(p.step_buffers.total());
    auto per_kept_of = [&](bool kept_mlp) {
      return llama_kept_layer_bytes(lc, step_options(config, micro, 0, host_ck, kCheckpointSlots, 1, kept_mlp), backend,
                                    act_t, config.lora.r);
    };
    const double whole_set = per_kept_of(true), lean_set = per_kept_of(false);
    p.per_kept = p.per_host_kept = whole_set;
    const double full_set = llama_kept_layer_bytes(lc, step_options(config, micro, 0, host_ck, kCheckpointSlots, 1, true),
                                                   backend, act_t, config.lora.r, false, true);
    {  // one layer's dequantized slot; every layer's leaves the workspace's weights out
      LlamaModelOptions o = step_options(config, micro, p.mlp_chunk_rows, host_ck, p.checkpoint_slots, every);
      o.dequantized_layers = lc.num_hidden_layers;
      const LlamaBufferDims dd = llama_buffer_dims(lc, o, backend, act_t, act_t, config.lora.r);
      p.per_dequantized = static_cast<double>(llama_dequantized_layer_bytes(dd, act_t));
      p.dequantized_ws = p.step - static_cast<double>(llama_buffer_plan(dd, backend, act_t).total()) +
                         p.per_dequantized * static_cast<double>(lc.num_hidden_layers);
    }
    p.library = cuda ? library_bytes(micro, static_cast<double>(T), static_cast<double>(lc.hidden_size),
                                     static_cast<double>(lc.num_attention_heads * lc.head_dim), budget > 0)
                     : 0.0;
    p.resident = resident(offload_params, offload_opt, embed_host) + p.library;
    p.keep_layers = m.keep_layers >= 0 ? std::min<int64_t>(m.keep_layers, lc.num_hidden_layers) : 0;
    const bool whole = p.mlp_chunk_rows == 0 && p.per_kept > 0;
    auto fill = [&](MemoryPlan& q) {  // the device-kept layers the budget holds beside q's staging sets
      if (m.keep_layers < 0 && budget > 0 && whole && every == 1)
        q.keep_layers = kept_for_room(budget - q.resident - q.step - q.staging_bytes(), q.per_kept, q.layers);
      q.host_keep_layers = std::clamp<int64_t>(q.host_keep_layers, 0, whole ? open_layers(q) : 0);
      q.per_full = whole && q.kept_mlp ? full_set - whole_set : 0.0;
      fill_full_sets(q, m);
      fill_dequantized(q, m);
    };
    p.keep_layers = m.keep_layers >= 0 ? std::min<int64_t>(m.keep_layers, lc.num_hidden_layers) : 0;
    p.host_keep_layers = m.host_keep_layers > 0 ? m.host_keep_layers : 0;
    p.host_staging = m.host_staging_sets;
    // Kept layers without gate / up (LlamaModelOptions::kept_mlp, host_kept_mlp): as configured, or
    // with auto the fastest of three at the kept layers the budget holds: whole sets; lean ones (a
    // third of the bytes each at 8B: more of them, each recomputing its two GEMMs); whole on the
    // device beside lean ones in the host tier (whose copies PCIe bounds: a third of the bytes each).
    const bool weigh_lean = m.kept_mlp == "auto" && cuda && budget > 0 && whole && m.keep_layers < 0 && every == 1;
    std::vector<std::pair<bool, bool>> shapes;  // (kept_mlp, host_kept_mlp), preferred first on a tie
    if (m.kept_mlp == "false") shapes = {{false, false}};
    else if (m.kept_mlp == "device") shapes = {{true, false}};
    else if (weigh_lean) shapes = {{true, true}, {false, false}, {true, false}};
    else shapes = {{true, true}};
    // The plan's choice of host-kept layers (a budget on the GPU, the whole MLP): the fastest count
    // whose staging sets fit the budget and whose host sets fit the host memory given to the tier.
    const double host_room = host_room_for(offload_params, 0.0);
    // Beside an offloaded base and beside checkpoints in host memory too (all of them at once: 8B,
    // 8 x 2048 in one micro-batch, 8.79-12.48 GB on an H100: 13,527-13,663 tokens/s, the fastest
    // measured at those budgets, 3-15 ms of waits a step). Sessions 16-18 refused both combinations
    // after H200 runs that stalled (11,613 tokens/s at 10 GB with the base offloaded, 47-72 ms of
    // waits beside host checkpoints), made while the ids' and targets' uploads still went through
    // the copy engine (LlamaModel::upload_bytes); not re-measured on an H200 since.
    // (none without host memory to give it: its staging sets alone would be device-kept layers)
    const bool choose_host = cuda && budget > 0 && whole && m.host_keep_layers < 0 && every == 1 && host_room > 0;
    const MemoryPlan base = p;
    for (size_t i = 0; i < shapes.size(); ++i) {
      MemoryPlan v = base;
      v.kept_mlp = shapes[i].first;
      v.host_kept_mlp = shapes[i].second;
      v.per_kept = v.kept_mlp ? whole_set : lean_set;
      v.per_host_kept = v.host_kept_mlp ? whole_set : lean_set;
      fill(v);
      if (cuda) v.est_step_s = estimate(v, sizes.cost, rates);
      MemoryPlan best = v;
      if (choose_host)
        for (int64_t h = 1; h < v.layers; ++h) {
          MemoryPlan q = v;
          q.host_keep_layers = h;
          if (q.resident + q.step + q.staging_bytes() > budget || q.host_bytes() > host_room) break;
          fill(q);
          if (q.host_keep_layers < h) break;  // no layers left to recompute
          q.est_step_s = estimate(q, sizes.cost, rates);
          if (q.est_step_s < best.est_step_s * (1 - 1e-9)) best = q;
        }
      if (i == 0 || best.est_step_s < p.est_step_s * (1 - 1e-9)) p = best;
    }
    return p;
  };

  // The choices open to the plan: the micro-batch (batch.micro_batch_size 0: any divisor of the
  // rank's batch; else the config's), the base on the GPU or offloaded (on the GPU with a budget;
  // offload.params: true keeps it offloaded), the LoRA optimizer on the GPU or the host (only when
  // nothing fits with it on the GPU: a host AdamW leaves the GPU idle).
  std::vector<int64_t> micros;
  if (config.batch.micro_batch_size > 0) {
    micros.push_back(config.batch.micro_batch_size);
  } else if (!cuda) {
    micros.push_back(1);  // no cost model for the CPU backend: the smallest step buffers
  } else {
    for (int64_t d = 1; d <= per_rank; ++d)
      if (per_rank % d == 0 && d * T <= kMaxMicroTokens) micros.push_back(d);
  }
  // Offloading by choice (not because nothing else fits) needs the host to hold the pinned shards
  // beside the build's own copy of the base, with room to spare: three bases' worth.
  const bool host_room = rates.host_available_bytes <= 0 || rates.host_available_bytes >= 3 * (proj_b + root) / world;
  const bool choose_offload = cuda && budget > 0 && !config.offload.params && m.base == "auto";
  std::vector<MemoryPlan> all;
  // The optimizer on the host as the config asks, else on the GPU first; on the host only when no
  // candidate fits with it on the GPU (and the plan may choose: a budget on the GPU).
  const bool opt_fixed = config.offload.optimizer;
  // The embedding: as configured; auto weighs both with a budget on the GPU (an untied table).
  std::vector<bool> embed_places = {m.embedding == "host"};
  if (m.embedding == "auto" && cuda && budget > 0 && !lc.tie_word_embeddings) embed_places.push_back(true);
  // The checkpoints: as configured; auto weighs both with a budget on the GPU.
  std::vector<bool> checkpoint_places = {m.host_checkpoints == "true"};
  if (m.host_checkpoints == "auto" && cuda && budget > 0) checkpoint_places.push_back(true);
  // Every second layer input: as configured; 0 weighs it with a budget on the GPU where no plan
  // with every input fits (below).
  auto fits_gpu = [&](const MemoryPlan& p) { return p.resident + p.step <= budget; };
  auto add_candidates = [&](int64_t every) {
    for (bool opt : {opt_fixed, true}) {
      for (int64_t micro : micros)
        for (bool off : {false, true}) {
          if (!off && config.offload.params) continue;
          if (off && !config.offload.params && !choose_offload) continue;
          for (bool embed_host : embed_places)
            for (bool host_ck : checkpoint_places) {
              MemoryPlan p = candidate(micro, off, opt, embed_host, host_ck, every);
              // auto weighs the layer inputs in pinned host memory only where the host holds some
              // (the slots cover the rest)
              if (host_ck && m.host_checkpoints == "auto" &&
                  (p.checkpoint_slots >= llama_checkpoint_buffers(lc.num_hidden_layers, every) ||
                   static_cast<double>(p.step_buffers.total(BufferLife::kHost)) >
                       host_room_for(off, std::numeric_limits<double>::infinity())))
                continue;
              all.push_back(std::move(p));
            }
        }
      // Without host room the base is offloaded only when nothing fits on the GPU.
      if (choose_offload && !host_room) {
        const bool resident_fits = std::any_of(all.begin(), all.end(), [&](const MemoryPlan& p) {
          return !p.offload_params && p.resident + p.step <= budget;
        });
        if (resident_fits)
          all.erase(std::remove_if(all.begin(), all.end(), [](const MemoryPlan& p) { return p.offload_params; }),
                    all.end());
      }
      if (opt || budget <= 0 || !cuda) break;
      if (std::any_of(all.begin(), all.end(), fits_gpu)) break;
    }
  };
  add_candidates(m.checkpoint_every > 0 ? m.checkpoint_every : 1);
  if (m.checkpoint_every == 0 && cuda && budget > 0 && !std::any_of(all.begin(), all.end(), fits_gpu))
    add_candidates(2);
  QS_CHECK(!all.empty(), "memory plan: no candidate");
  return all;
}

const MemoryPlan* fastest_fitting(const std::vector<MemoryPlan>& all) {
  const MemoryPlan* best = nullptr;
  for (const MemoryPlan& p : all)
    if (p.fits() && (!best || p.est_step_s < best->est_step_s * (1 - 1e-9))) best = &p;
  return best;
}

MemoryPlan plan_memory(const TrainConfig& config, const LlamaConfig& lc, Backend backend, DType act_t, int world,
                       const PlanRates& rates) {
  const MemoryConfig& m = config.memory;
  const double budget = m.gpu_budget_gb * 1e9;
  const int64_t T = config.data.max_seq_len;
  const std::vector<MemoryPlan> all = plan_candidates(config, lc, backend, act_t, world, rates);
  // Within the budget: the fastest estimate; ties (the CPU, no budget) keep the config's order (the
  // base on the GPU first, the optimizer on the GPU first). Nothing fits: the smallest.
  const MemoryPlan* best = fastest_fitting(all);
  if (!best) {
    for (const MemoryPlan& p : all)
      if (!best || p.resident + p.step < best->resident + best->step) best = &p;
    // On the GPU a budget is a limit: a job that cannot keep to it is refused before anything is
    // built (the CPU's plans have no GPU to keep to one; they take the smallest).
    if (backend == Backend::kCuda)
      throw InputError(fmt::format(
          "{}: memory.gpu_budget_gb = {}: no plan of this job fits {} of GPU memory; the smallest of the {} plans "
          "needs {} ({}). Raise memory.gpu_budget_gb, or make the step smaller (data.max_seq_len {}, "
          "batch.micro_batch_size {})",
          config.source, m.gpu_budget_gb, human_bytes(budget), all.size(),
          human_bytes(best->resident + best->step + best->staging_bytes()), best->describe(), T,
          config.batch.micro_batch_size == 0 ? std::string("0: the plan's choice") : std::to_string(config.batch.micro_batch_size)));
  }
  MemoryPlan chosen = *best;
  chosen.candidates = static_cast<int>(all.size());
  for (const MemoryPlan& p : all)
    if (&p != best && p.fits() && (chosen.runner_up_s <= 0 || p.est_step_s < chosen.runner_up_s)) {
      chosen.runner_up_s = p.est_step_s;
      chosen.runner_up = p.brief();
    }
  if (m.keep_layers > 0 && chosen.mlp_chunk_rows > 0)
    throw InputError(fmt::format("{}: memory.keep_layers = {} keeps whole layers, but the MLP runs in chunks of {} rows "
                                 "(memory.mlp_chunk_tokens = {}; {} tokens per micro-batch): set memory.keep_layers: "
                                 "0 or memory.mlp_chunk_tokens: 0",
                                 config.source, m.keep_layers, chosen.mlp_chunk_rows, m.mlp_chunk_tokens,
                                 chosen.micro_batch * T));
  // Stage 1 keeps the configured kept layers (0 without one); stage 2 fills the budget with the
  // memory measured after the build.
  chosen.keep_layers = m.keep_layers >= 0 ? std::min<int64_t>(m.keep_layers, lc.num_hidden_layers) : 0;
  fill_full_sets(chosen, m);
  fill_dequantized(chosen, m);
  return chosen;
}

double plan_step_estimate(const MemoryPlan& p, const TrainConfig& config, const LlamaConfig& lc, int world,
                          const PlanRates& rates) {
  return estimate(p, job_sizes(config, lc, world).cost, rates);
}

void plan_kept_layers(MemoryPlan& p, const TrainConfig& config, double in_use_bytes, double optimizer_bytes) {
  if (in_use_bytes > 0) {
    // + what the step's libraries take at their first use (cuBLAS / cuDNN workspaces and plans)
    p.resident = in_use_bytes + optimizer_bytes + p.library;
    p.measured = true;
  }
  // The host tier's staging sets were sized against the estimate: with more in use than estimated
  // they give way (down to two, then one set, then none) rather than take the plan past its budget.
  if (config.memory.host_keep_layers < 0 && p.budget > 0)
    while (p.host_keep_layers > 0 && p.resident + p.step + p.staging_bytes() > p.budget) {
      if (p.staging_sets() > 2) --p.host_staging;
      else p.host_keep_layers = p.host_keep_layers > 1 ? 1 : 0;
    }
  p.full_kept = 0;
  if (config.memory.keep_layers < 0 && p.budget > 0 && p.mlp_chunk_rows == 0 && p.per_kept > 0)
    p.keep_layers = kept_for_room(p.budget - p.resident - p.step - p.staging_bytes(), p.per_kept, p.layers);
  p.host_keep_layers = std::min(p.host_keep_layers, p.mlp_chunk_rows == 0 ? open_layers(p) : int64_t{0});
  fill_full_sets(p, config.memory);
  fill_dequantized(p, config.memory);
}

}  // namespace qshard
