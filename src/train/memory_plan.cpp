#include "train/memory_plan.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "model/llama_model.h"
#include "runtime/error.h"
#include "runtime/machine.h"

namespace qshard {
namespace {

// The runtime's own device memory beyond the plan's buffers (CUDA context, cuBLAS / cuDNN
// workspaces, NCCL): an estimate used before anything is measured.
constexpr double kRuntimeBytes = 1.0e9;
constexpr double kLibraryBytes = 0.5e9;

LlamaModelOptions step_options(const TrainConfig& config, int64_t chunk_rows) {
  LlamaModelOptions mo;
  mo.max_batch = config.batch.micro_batch_size;
  mo.max_seq = config.data.max_seq_len;
  mo.lora_dropout = static_cast<float>(config.lora.dropout);
  mo.mlp_chunk_rows = chunk_rows;
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
    s += fmt::format("layers {}-{} of {} keep their activations ({} each), the rest recomputed",
                     layers - keep_layers, layers - 1, layers, human_bytes(per_kept));
  s += fmt::format("; {}: {} {} + step buffers {} + kept {} = {}", mem, measured ? "in use" : "resident (estimate)",
                   human_bytes(resident), human_bytes(step),
                   human_bytes(per_kept * static_cast<double>(keep_layers > 1 ? keep_layers - 1 : 0)),
                   human_bytes(total()));
  return s;
}

MemoryPlan plan_memory(const TrainConfig& config, const LlamaConfig& lc, Backend backend, DType act_t, int world) {
  const MemoryConfig& m = config.memory;
  MemoryPlan p;
  p.budget = m.gpu_budget_gb * 1e9;
  p.layers = lc.num_hidden_layers;
  p.cuda = backend == Backend::kCuda;
  p.offload_params = config.offload.params;
  p.offload_optimizer = config.offload.optimizer;
  const int64_t N = config.batch.micro_batch_size * config.data.max_seq_len;
  if (m.mlp_chunk_tokens < 0) p.mlp_chunk_rows = N > kAutoChunkAbove ? kAutoChunkRows : 0;
  else p.mlp_chunk_rows = m.mlp_chunk_tokens >= N ? 0 : m.mlp_chunk_tokens;
  if (m.keep_layers > 0 && p.mlp_chunk_rows > 0)
    throw InputError(fmt::format("{}: memory.keep_layers = {} keeps whole layers, but the MLP runs in chunks of {} rows "
                                 "(memory.mlp_chunk_tokens = {}; {} tokens per micro-batch): set memory.keep_layers: "
                                 "0 or memory.mlp_chunk_tokens: 0",
                                 config.source, m.keep_layers, p.mlp_chunk_rows, m.mlp_chunk_tokens, N));

  // Estimates of what stays on the GPU besides the step's buffers.
  const double other_b = config.model.path.empty() ? static_cast<double>(dtype_size(config.model.init.dtype)) : 2.0;
  const Llama4bitBytes base = llama_4bit_bytes(lc, config.model.blocksize, config.model.double_quant, other_b);
  const double proj_b = base.projections;
  const double L = static_cast<double>(lc.num_hidden_layers);
  const double root = base.other;   // embeddings, head, norms: gathered whole at the head
  const double unit = proj_b / L;   // one decoder layer, gathered (two in flight)
  const double C = static_cast<double>(lc.hidden_size), I = static_cast<double>(lc.intermediate_size);
  const double q = static_cast<double>(lc.num_attention_heads * lc.head_dim);
  const double kv = static_cast<double>(lc.num_key_value_heads * lc.head_dim);
  const double lora_p = static_cast<double>(config.lora.r) * L * (7 * C + 2 * q + 2 * kv + 3 * I);
  auto resident = [&](bool offload_params, bool offload_opt) {
    double b = (p.cuda ? kRuntimeBytes : 0.0) + 2 * unit + root;
    if (!offload_params) b += (proj_b + root) / world;
    b += lora_p * 4 * (offload_opt ? 1.0 : 4.0) / world;  // gradient shards; master + moments unless offloaded
    b += 2 * (lora_p / L) * (2 + 4);                       // two units' compute copies and full gradients
    return b;
  };
  p.step_buffers = llama_buffer_plan(
      llama_buffer_dims(lc, step_options(config, p.mlp_chunk_rows), backend, act_t, act_t, config.lora.r), backend,
      act_t);
  p.step = static_cast<double>(p.step_buffers.total());
  p.per_kept = llama_kept_layer_bytes(lc, step_options(config, 0), backend, act_t, config.lora.r);
  p.resident = resident(p.offload_params, p.offload_optimizer);
  // Over the budget: the base goes to pinned host memory first (streamed to the GPU a layer at a
  // time); the LoRA optimizer state (masters, moments: AdamW on the host) only when that is not
  // enough, since a host AdamW leaves the GPU idle.
  if (p.budget > 0 && backend == Backend::kCuda && !p.offload_params && p.resident + p.step > p.budget) {
    p.offload_params = true;
    p.resident = resident(true, p.offload_optimizer);
  }
  if (p.budget > 0 && backend == Backend::kCuda && !p.offload_optimizer && p.resident + p.step > p.budget) {
    p.offload_optimizer = true;
    p.resident = resident(p.offload_params, true);
  }
  p.keep_layers = m.keep_layers >= 0 ? std::min<int64_t>(m.keep_layers, lc.num_hidden_layers) : 0;
  return p;
}

void plan_kept_layers(MemoryPlan& p, const TrainConfig& config, double in_use_bytes, double optimizer_bytes) {
  if (in_use_bytes > 0) {
    // + what the step's libraries take at their first use (cuBLAS / cuDNN workspaces and plans)
    p.resident = in_use_bytes + optimizer_bytes + kLibraryBytes;
    p.measured = true;
  }
  if (config.memory.keep_layers >= 0 || p.budget <= 0 || p.mlp_chunk_rows > 0 || p.per_kept <= 0) return;
  const double room = p.budget - p.resident - p.step;
  const double extra = room > 0 ? std::floor(room / p.per_kept) : 0.0;
  p.keep_layers = std::clamp<int64_t>(1 + static_cast<int64_t>(std::min(extra, 1e9)), 0, p.layers);
}

}  // namespace qshard
