#include "train/qlora_model.h"

#include "checkpoint/fused_projections.h"

#include <chrono>
#include <set>

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/fused_projections.h"
#include "checkpoint/llama_loader.h"
#include "checkpoint/llama_tree.h"
#include "checkpoint/nonfinite.h"
#include "checkpoint/peft_adapter.h"
#include "checkpoint/random_llama.h"
#include "model/llama_model.h"
#include "runtime/machine.h"
#include "train/memory_plan.h"
#include "checkpoint/model_init.h"

namespace qshard {

LlamaConfig job_llama_config(const ModelConfig& model) {
  if (!model.path.empty()) return LlamaConfig::load(model.path);
  nlohmann::json j = llama_config_json(model.init, model.init.dtype);
  return LlamaConfig::from_json(j, "model.init");
}

namespace {

// Every rank builds the whole 4-bit base before sharding it, then trains with the step's buffers
// (LlamaModel's activations and workspace for micro_batch_size x max_seq_len): refuse a job this
// machine cannot hold before anything is built, naming the keys and the bytes.
void check_job_fits(const TrainConfig& config, const LlamaConfig& lc, Runtime& rt, const MemoryPlan* plan) {
  const double other = config.model.path.empty() ? static_cast<double>(dtype_size(config.model.init.dtype)) : 2.0;
  const double largest =
      static_cast<double>(std::max(lc.vocab_size, lc.intermediate_size)) * static_cast<double>(lc.hidden_size);
  const std::string what =
      config.model.path.empty() ? "the job's model (model.init)" : "the job's model (" + config.model.path + ")";
  const double base = llama_4bit_bytes(lc, config.model.blocksize, config.model.double_quant, other).total();
  // The step's buffers as the memory plan sizes them (the MLP chunked for long sequences).
  const bool for_training = plan != nullptr;
  const double step = for_training ? plan->step : 0.0;
  const bool offload = for_training ? plan->offload_params : config.offload.params;
  const std::string batch = "micro_batch_size " + std::to_string(config.batch.micro_batch_size) + " x max_seq_len " +
                            std::to_string(config.data.max_seq_len);
  const bool cuda = rt.ctx.is_cuda();
  // LoRA in f32: the tree's A and B (made on the host), and on the CPU backend the state the
  // memory plan counts on the device (master, gradient and AdamW shards, two gathered units'
  // weights and gradients). lora.r 65536 ended the build with a failed allocation (exit 1).
  const double lora_p =
      lora_param_count(lc, config.lora.r, tree_lora_targets(lc, config.lora.target_modules, config.source + ": lora.target_modules"));
  const double units = std::max<double>(static_cast<double>(lc.num_hidden_layers), 1.0);
  const double lora = lora_p * 4.0 * (1.0 + (cuda ? 0.0 : 4.0 / rt.data.size() + 2.0 * 2.0 / units));
  require_host_memory(base + largest * 4.0 + lora + (cuda ? 0.0 : step), what,
                      llama_size_keys(lc) + ", projections in 4-bit; LoRA r " + std::to_string(config.lora.r) + " on " +
                          std::to_string(config.lora.target_modules.size()) + " projections: " +
                          fmt::format("{:.3g}", lora_p) + " f32 parameters" + (cuda ? "" : " with AdamW's state") +
                          (cuda || !for_training ? "" : "; activations for " + batch));
  // On the GPU: the step's buffers, and without offload.params this rank's shard of the base.
  const double gpu = step + (offload ? 0.0 : base / rt.data.size());
  if (cuda && gpu > 0)
    require_device_memory(gpu, what + " on the GPU",
                          (for_training ? "activations for " + batch : std::string("no step")) +
                              (offload ? std::string()
                                       : ", this rank's shard of the 4-bit base over " +
                                             std::to_string(rt.data.size()) + " ranks"));
}

// lora.init_adapter: the adapter's LoRA weights replace PEFT's init, once its settings are the job's.
void start_from_adapter(Module& tree, const TrainConfig& config, const LlamaConfig& model) {
  const std::string& dir = config.lora.init_adapter;
  const PeftLoraConfig a = read_peft_config(dir);
  const LoraConfig& l = config.lora;
  auto mismatch = [&](const std::string& what, const std::string& theirs, const std::string& ours) {
    throw InputError(config.source + ": lora.init_adapter " + dir + ": the adapter's " + what + " is " + theirs +
                     " but this job's is " + ours + "; set the job's to the adapter's, or start without it");
  };
  if (a.r != l.r) mismatch("r (lora.r)", std::to_string(a.r), std::to_string(l.r));
  if (a.lora_alpha != l.alpha) mismatch("lora_alpha (lora.alpha)", fmt::format("{}", a.lora_alpha), fmt::format("{}", l.alpha));
  if (a.use_rslora != l.rslora) mismatch("use_rslora (lora.rslora)", a.use_rslora ? "true" : "false", l.rslora ? "true" : "false");
  std::vector<std::string> theirs = a.target_modules, ours = l.target_modules;
  std::sort(theirs.begin(), theirs.end());
  std::sort(ours.begin(), ours.end());
  if (theirs != ours)
    mismatch("target_modules (lora.target_modules)", fmt::format("[{}]", fmt::join(theirs, ", ")),
             fmt::format("[{}]", fmt::join(ours, ", ")));
  load_peft_adapter(tree, dir, fused_projections(model));
  // The adapter's LoRA weights, as loaded into the trainable slots (named by their module path).
  for (const auto& [key, t] : state_dict(tree, {true, false, true}))
    require_finite(t, dir + "/adapter_model.safetensors", key, config.model.allow_nonfinite,
                   "; refusing to start from it (lora.init_adapter; --allow-nonfinite to load it anyway)");
}

}  // namespace

std::unique_ptr<QloraModel> build_qlora_model(const TrainConfig& config, Runtime& rt, BuildFor what) {
  if (what == BuildFor::kExport) return build_qlora_model(config, rt, nullptr);
  const MemoryPlan plan =
      plan_memory(config, job_llama_config(config.model), rt.ctx.backend(), rt.ctx.activation_dtype(), rt.data.size());
  return build_qlora_model(config, rt, &plan);
}

std::unique_ptr<QloraModel> build_qlora_model(const TrainConfig& config, Runtime& rt, const MemoryPlan* plan) {
  auto m = std::make_unique<QloraModel>();
  const bool for_training = plan != nullptr;
  auto t0 = std::chrono::steady_clock::now();
  auto phase = [&](const char* name) {  // the build's start-up time split (QloraModel::build_seconds)
    const auto now = std::chrono::steady_clock::now();
    m->build_seconds.emplace_back(name, std::chrono::duration<double>(now - t0).count());
    t0 = now;
  };
  const QuantizeOptions quant{config.model.quant_type, config.model.blocksize, config.model.double_quant};
  m->config = job_llama_config(config.model);
  check_job_fits(config, m->config, rt, plan);
  // The job's targets as PEFT names them for the family (Phi-3: qkv_proj, gate_up_proj), as the tree's parts.
  const LoraSpec lora{config.lora.r, tree_lora_targets(m->config, config.lora.target_modules, config.source + ": lora.target_modules")};
  if (config.model.path.empty()) {
    // A random base (model.init) in model.init.dtype (float32 unless set).
    LlamaTreeOptions to;
    to.dtype = config.model.init.dtype;
    to.quant = quant;
    to.lora = lora;
    to.shapes_only_4bit = true;  // init_random_base replaces every Params4bit: no zeros to write first
    m->tree = build_llama_tree(m->config, to);
    phase("tree");
    // A 4-bit draw runs on the GPU when the job does (the same bytes as the host's draw).
    init_random_base(*m->tree, config.model.init.seed, m->config.raw.value("initializer_range", 0.02),
                     config.model.init.draw_4bit, rt.ctx.is_cuda() ? Device::kCuda : Device::kCpu);
    phase("random base");
  } else {
    // Frozen float tensors keep the dtype they have in model.path's folder (bf16 stays bf16), so
    // exports write them back as they came in; the model widens them to f32 when it binds them.
    // Float projections are quantized on load; tensors the model has no slot for are ignored.
    // check_job_fits above was the memory check.
    LlamaLoadOptions lo;
    lo.floats = LlamaLoadOptions::Floats::kAsStored;
    lo.quantize = quant;
    lo.lora = lora;
    lo.strict = false;
    lo.allow_nonfinite = config.model.allow_nonfinite;
    LoadedLlama loaded = load_llama_folder(config.model.path, lo);
    m->tree = std::move(loaded.tree);
    phase("load");
  }
  init_lora(*m->tree, config.seed);
  if (for_training && !config.lora.init_adapter.empty()) start_from_adapter(*m->tree, config, m->config);
  for (const auto& [k, t] : state_dict(*m->tree, {true, false, true})) m->trainable_parameters += t.numel();
  phase("LoRA");

  ShardOptions so;
  so.offload_params = for_training ? plan->offload_params : config.offload.params;
  so.offload_optimizer = for_training ? plan->offload_optimizer : config.offload.optimizer;
  so.compute_device = rt.ctx.compute_device();
  // The GEMMs read LoRA A/B in the activation dtype: bf16 compute copies on CUDA, none on the CPU.
  so.trainable_compute_dtype = rt.ctx.activation_dtype();
  m->mgr = std::make_unique<ShardedParameterManager>(rt.data, rt.ctx.compute(), so);
  // memory.embedding (the plan's choice): the embedding table whole in pinned host memory, read in
  // place by the lookup. Not for a tied table (the LM head reads it whole every micro-batch).
  std::set<std::string> host_fqns;
  if (for_training && plan->embedding_on_host) {
    const Module* head = m->tree->find_module("lm_head");
    if (m->config.tie_word_embeddings || !head || !head->slot("weight"))
      throw InputError(config.source + ": memory.embedding = host, but the model's LM head is its embedding table "
                       "(tied), which every micro-batch reads whole: set memory.embedding: gpu or auto");
    host_fqns.insert("model.embed_tokens.weight");
  }
  m->units = shard_module_tree(*m->tree, *m->mgr, "model.layers", host_fqns);
  m->mgr->finalize();
  m->mgr->release_all_views();  // the full tensors go; each rank keeps its shards
  phase("shards");
  // Split: the allocation of the shards (page-locking a pinned base), then the packing.
  const double alloc_s = m->mgr->shard_alloc_seconds();
  m->build_seconds.back().second -= alloc_s;
  m->build_seconds.back().first = "shards: packing";
  m->build_seconds.insert(m->build_seconds.end() - 1, {"shards: allocation", alloc_s});
  // The weights resolve their entries and shapes from the tree's slots once (nothing kept of them).
  const LlamaTreeSlots slots(m->config, *m->tree, rt.ctx, /*fold_lora=*/false);
  m->weights = std::make_unique<ShardedLlamaWeights>(m->config, slots, *m->mgr, m->units);
  return m;
}

std::vector<UnitStateShard> state_shards(QloraModel& model, const std::vector<Tensor>& exp_avg,
                                         const std::vector<Tensor>& exp_avg_sq) {
  ShardedParameterManager& mgr = *model.mgr;
  QS_CHECK(exp_avg.size() == exp_avg_sq.size() && (exp_avg.empty() || static_cast<int>(exp_avg.size()) == mgr.num_units()),
           "optimizer state needs one tensor per unit");
  std::vector<UnitStateShard> out;
  for (int u = 0; u < mgr.num_units(); ++u) {
    UnitStateShard s;
    s.unit = mgr.unit_name(u);
    s.layout = &mgr.layout(u, BufferKind::kTrainable);
    s.slices.emplace_back("master", mgr.master_shard(u));
    if (!exp_avg.empty()) {
      s.slices.emplace_back("exp_avg", exp_avg[u]);
      s.slices.emplace_back("exp_avg_sq", exp_avg_sq[u]);
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace qshard
