#include "model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "model/offload_ring.h"
#include "quant/params4bit.h"
#include "runtime/allocator.h"
#include "runtime/error.h"

namespace qshard {

namespace {

// Pinned staging slots for ids/targets: uploads in flight before the ring laps one.
constexpr int kStagingSlots = 16;

// A GEMM shape with its operand types.
GemmShape typed(GemmShape s, DType a, DType b, DType c) {
  s.a_type = a;
  s.b_type = b;
  s.c_type = c;
  return s;
}

}  // namespace

struct LlamaModel::Staging {
  PinnedHostAllocator pinned;
  int64_t* base = nullptr;  // [kStagingSlots, slot]
  int64_t slot = 0;         // int64s per slot: max_rows, or the ragged layout's bytes / 8 when more
  std::vector<Event> done;  // per slot: recorded on the compute stream after its copy
  int next = 0;
  ~Staging() {
    for (const Event& e : done) e.synchronize();
    if (base) pinned.release(base);
  }
};

void check_attention_shape(const LlamaConfig& config, Backend backend, const std::string& source) {
  if (backend == Backend::kCuda && config.head_dim % 8 != 0)
    throw InputError(source + ": head_dim " + std::to_string(config.head_dim) +
                     " is not a multiple of 8, which the GPU's fused attention (cuDNN) needs; run this model "
                     "with device cpu");
}

LlamaModel::LlamaModel(const LlamaConfig& config, Module& root, DeviceContext& ctx, const LlamaModelOptions& options)
    : config_(config), ctx_(ctx), options_(options),
      act_(std::make_unique<LlamaActivations>()),
      profiler_(ctx.compute(), options.profile && ctx.is_cuda(),
                StepProfiler::events_for(options.max_batch *
                                         (options.max_seq > 0 ? options.max_seq : config.max_position_embeddings))) {
  const LlamaConfig& c = config_;
  QS_CHECK(c.head_dim % 2 == 0, "head_dim must be even for RoPE");
  check_attention_shape(c, ctx.backend(), "the model");
  QS_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0,
           "num_attention_heads must be a multiple of num_key_value_heads");
  QS_CHECK(options.max_batch >= 1, "max_batch must be at least 1");
  max_seq_ = options.max_seq > 0 ? options.max_seq : c.max_position_embeddings;
  max_rows_ = options.max_batch * max_seq_;
  QS_CHECK(options.keep_layers >= 0 && options.mlp_chunk_rows >= 0, "keep_layers and mlp_chunk_rows must be >= 0");
  mlp_rows_ = options.mlp_chunk_rows > 0 ? std::min(options.mlp_chunk_rows, max_rows_) : max_rows_;
  QS_CHECK(mlp_rows_ == max_rows_ || options.keep_layers == 0,
           "keep_layers > 0 needs the whole MLP (mlp_chunk_rows 0 or >= the rows of a micro-batch)");
  QS_CHECK(options.host_keep_layers >= 0 && (mlp_rows_ == max_rows_ || options.host_keep_layers == 0),
           "host_keep_layers must be >= 0, and > 0 needs the whole MLP");
  QS_CHECK(options.checkpoint_every == 1 ||
               (options.checkpoint_every == 2 && options.keep_layers <= 1 && options.host_keep_layers == 0),
           "checkpoint_every must be 1, or 2 with every layer recomputed (keep_layers <= 1, no host-kept layers)");
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim, N = max_rows_;

  // ---- find every slot once (names and shapes checked) ----
  const DType act_t = ctx_.activation_dtype();
  tree_ = std::make_unique<LlamaTreeSlots>(c, root, ctx_, options.fold_lora);
  source_ = tree_.get();

  // ---- the buffers, once: the plan of this tree (model/llama_buffers.h) ----
  QS_CHECK(options.kv_cache_tokens >= 0 && options.kv_cache_tokens <= max_seq_,
           "kv_cache_tokens must be in [0, max_seq]");
  // The config's and options' sizes, as the planner takes them; then the tree's own (its
  // projections, LoRA ranks, fold columns, head dtype) in place of the planner's assumptions.
  LlamaBufferDims d = llama_buffer_dims(c, options, ctx_.backend(), act_t, act_t, /*lora_r=*/0);
  tree_->measure(d);
  QS_CHECK(d.T == max_seq_ && d.N == max_rows_ && d.NM == mlp_rows_, "buffer dims disagree with the model's");
  head_rows_ = d.head_rows;
  LlamaActivations& a = *act_;
  plan_ = llama_buffer_plan(d, ctx_.backend(), act_t, &a);
  a.storage = plan_.allocate(BufferLife::kRun, ctx_.compute_device(), /*zero=*/true);
  a.kept_storage = plan_.allocate(BufferLife::kKept, ctx_.compute_device(), /*zero=*/false);
  a.dequantized_storage = plan_.allocate(BufferLife::kWeights, ctx_.compute_device(), /*zero=*/false);
  dequant_layout_.assign(static_cast<size_t>(d.dequantized_layers), 0u);
  dequant_slot_bytes_ = llama_dequantized_layer_bytes(d, act_t);
  llama_buffer_aliases(d, act_t, a);
  a.work = a;
  RopeParams rp;
  rp.theta = c.rope_theta;
  rp.head_dim = D;
  rp.llama3 = c.rope_scaling.rope_type == "llama3";
  rp.factor = c.rope_scaling.factor;
  rp.low_freq_factor = c.rope_scaling.low_freq_factor;
  rp.high_freq_factor = c.rope_scaling.high_freq_factor;
  rp.original_max_position_embeddings = c.rope_scaling.original_max_position_embeddings;
  // The libraries' handles, kernels and attention workspace, measured (the memory ledger's line).
  const std::optional<int64_t> before_libraries = ctx_.memory_in_use();
  ops::prepare(ctx_);
  max_pieces_ = options.packed_positions ? (options.packed_max_pieces > 0 ? options.packed_max_pieces : N) : 0;
  // Each window the layers use (Gemma's sliding and full layers: two), with the model's scores.
  std::vector<int64_t> windows;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (std::find(windows.begin(), windows.end(), layer_window(c, l)) == windows.end())
      windows.push_back(layer_window(c, l));
  ops::set_attention_lean_workspace(ctx_, options.attention_lean_workspace);
  // the backward's graphs for dq|dk|dv side by side too, where q|k|v's backward may run fused (qkv_fused_ld)
  qkv_ld_ = options.fuse_qkv_backward && options.fold_lora && !c.qk_norm && attention_scores().softcap <= 0.0f
                ? (H + 2 * Hkv) * D
                : 0;
  const int64_t prepare_pieces = ctx_.backend() == Backend::kCuda ? max_pieces_ : 0;
  for (int64_t w : windows)
    attention_deterministic_ &=
        ops::prepare_attention(ctx_, options.max_batch, max_seq_, H, Hkv, D, w, prepare_pieces, attention_scores());
  // A cuDNN that refuses the gradients' strides leaves q|k|v's backward unfused (the plain graphs
  // are built above), with a note: slower, not wrong.
  if (qkv_ld_ > 0) {
    try {
      for (int64_t w : windows)
        attention_deterministic_ &= ops::prepare_attention(ctx_, options.max_batch, max_seq_, H, Hkv, D, w,
                                                           prepare_pieces, attention_scores(), qkv_ld_);
    } catch (const Error& e) {
      std::fprintf(stderr, "qshard: note: attention's backward with dq|dk|dv side by side was refused (%s); q|k|v's "
                   "backward runs a GEMM per projection\n", e.what());
      qkv_ld_ = 0;
    }
  }
  const std::optional<int64_t> after_libraries = ctx_.memory_in_use();
  if (before_libraries && after_libraries) library_bytes_ = std::max<int64_t>(*after_libraries - *before_libraries, 0);
  rp.linear_factor = c.rope_scaling.rope_type == "linear" ? c.rope_scaling.factor : 1.0;
  ops::rope_tables(a.rope_cos, a.rope_sin, rp, max_seq_, ctx_);
  if (c.rope_local_theta > 0) {  // Gemma 3's sliding layers: plain RoPE of their own base
    RopeParams local;
    local.theta = c.rope_local_theta;
    local.head_dim = D;
    ops::rope_tables(a.rope_cos_local, a.rope_sin_local, local, max_seq_, ctx_);
  }

  // ---- workspace: the plan's (the larger of a layer's and an LM-head chunk's scratch) ----
  ctx_.workspace().reserve(static_cast<size_t>(plan_.total(BufferLife::kWorkspace)));

  // ---- pinned staging for ids / targets ----
  staging_ = std::make_unique<Staging>();
  staging_->slot = std::max<int64_t>(N, (d.ragged_ints * 4 + 7) / 8);
  staging_->base =
      static_cast<int64_t*>(staging_->pinned.allocate(static_cast<size_t>(kStagingSlots * staging_->slot) * 8));
  QS_CHECK(staging_->base != nullptr, "could not allocate the pinned staging for ids and targets");
  QS_CHECK(!ctx_.is_cuda() || device_reads_at_host_address(staging_->base),
           "the GPU cannot read pinned host memory at its host address (unified addressing), which the ids' and "
           "targets' uploads need");
  if (d.ragged_ints > 0) ragged_host_.resize(static_cast<size_t>(d.ragged_ints));
  for (int i = 0; i < kStagingSlots; ++i) staging_->done.emplace_back();

  // ---- the host tier (model/offload_ring.h): host-kept layers spread evenly over all the layers
  // but the last, the last of them at the layer before it (its staging set still holds it when the
  // backward comes), so that each copy has the compute of the layers between to hide behind, kept
  // or not; the device-kept layers are the last of the others, the earliest recomputed. The layer
  // inputs x_0..x_L through checkpoint_slots device slots ----
  device_kept_sets_ = d.kept_sets;
  {
    const int64_t L = c.num_hidden_layers;
    host_index_.assign(static_cast<size_t>(L), -1);
    kept_index_.assign(static_cast<size_t>(L), -1);
    const int64_t span = L - 1;
    for (int64_t h = 0; h < d.host_sets; ++h)
      host_index_[static_cast<size_t>((h + 1) * span / d.host_sets - 1)] = static_cast<int>(h);
    int64_t k = d.kept_sets;
    for (int64_t l = span - 1; l >= 0 && k > 0; --l)
      if (host_index_[static_cast<size_t>(l)] < 0) kept_index_[static_cast<size_t>(l)] = static_cast<int>(--k);
  }
  if (d.host_sets > 0 || d.host_checkpoints) offload_ = std::make_unique<Stream>(stream_names::kActivationOffload);
  if (d.host_sets > 0) {
    // the kept sets (full ones first), then the staging sets, each at its own size
    // (LlamaModelOptions::full_kept_sets, host_kept_mlp)
    const int64_t kept_bytes = llama_kept_sets_bytes(d, ctx_.backend(), act_t);
    const int64_t set_bytes = llama_kept_set_bytes(d, ctx_.backend(), act_t, true);
    QS_CHECK(a.kept_storage.nbytes() == static_cast<size_t>(kept_bytes + d.staging_sets * set_bytes),
             "kept sets are not contiguous: the kept sets', then the staging sets'");
    kept_ring_ = std::make_unique<OffloadRing>(
        static_cast<int>(d.host_sets), static_cast<int>(d.staging_sets), set_bytes,
        static_cast<uint8_t*>(a.kept_storage.raw()) + kept_bytes, ctx_.compute_device(), *offload_);
  }
  if (d.host_checkpoints)
    ckpt_ring_ = std::make_unique<OffloadRing>(
        static_cast<int>(d.checkpoints), static_cast<int>(llama_checkpoint_ring_slots(d)),
        N * c.hidden_size * static_cast<int64_t>(dtype_size(act_t)), static_cast<uint8_t*>(a.xs),
        ctx_.compute_device(), *offload_);
}

std::vector<int64_t> LlamaModel::host_kept_layers() const {
  std::vector<int64_t> v;
  for (size_t l = 0; l < host_index_.size(); ++l)
    if (host_index_[l] >= 0) v.push_back(static_cast<int64_t>(l));
  return v;
}

std::vector<int64_t> LlamaModel::device_kept_layers() const {
  std::vector<int64_t> v;
  for (size_t l = 0; l < kept_index_.size(); ++l)
    if (kept_index_[l] >= 0) v.push_back(static_cast<int64_t>(l));
  return v;
}

int LlamaModel::staging_set(int h) const { return static_cast<int>(device_kept_sets_) + h % kept_ring_->slots(); }

// A ring's wait on the compute stream, timed as a wait (the step's split).
void LlamaModel::ring_before(OffloadRing& ring, int i, bool write) {
  mark(StepPart::kWait);
  if (write) ring.before_write(i, ctx_.compute());
  else ring.before_read(i, ctx_.compute());
  mark(StepPart::kOther);
}

LlamaModel::~LlamaModel() = default;

LlamaStepBytes LlamaModel::allocated_bytes() const {
  return {static_cast<double>(act_->storage.nbytes() + act_->kept_storage.nbytes()),
          static_cast<double>(ctx_.workspace().capacity())};
}

LlamaStepBytes llama_step_bytes(const BufferPlan& plan) {
  LlamaStepBytes b;
  b.activations = static_cast<double>(plan.total(BufferLife::kRun) + plan.total(BufferLife::kKept));
  b.workspace = static_cast<double>(plan.total(BufferLife::kWorkspace));
  b.workspace_attention = static_cast<double>(plan.total(BufferLife::kLibrary));
  return b;
}

LlamaStepBytes llama_step_bytes(const LlamaConfig& c, const LlamaModelOptions& o, Backend backend, DType act_t,
                                DType head_t, int64_t r) {
  return llama_step_bytes(llama_buffer_plan(llama_buffer_dims(c, o, backend, act_t, head_t, r), backend, act_t));
}

double llama_kept_layer_bytes(const LlamaConfig& c, const LlamaModelOptions& o, Backend backend, DType act_t,
                              int64_t r, bool host_tier, bool full) {
  LlamaModelOptions one = o;
  one.keep_layers = 2;  // one kept set
  one.host_keep_layers = 0;
  one.mlp_chunk_rows = 0;
  if (full) one.kept_mlp = true;
  const LlamaBufferDims d = llama_buffer_dims(c, one, backend, act_t, act_t, r);
  return d.kept_sets > 0 ? static_cast<double>(llama_kept_set_bytes(d, backend, act_t, host_tier, full)) : 0.0;
}

void* LlamaModel::act(void* base, int64_t elems) const {
  return static_cast<uint8_t*>(base) + elems * static_cast<int64_t>(dtype_size(ctx_.activation_dtype()));
}
const void* LlamaModel::act(const void* base, int64_t elems) const {
  return static_cast<const uint8_t*>(base) + elems * static_cast<int64_t>(dtype_size(ctx_.activation_dtype()));
}

void LlamaModel::check_sizes(int64_t B, int64_t T) const {
  QS_CHECK(B >= 1 && T >= 1 && T <= max_seq_ && B * T <= max_rows_,
           "batch " + std::to_string(B) + " x " + std::to_string(T) + " is past the model's buffers (" +
               std::to_string(options_.max_batch) + " x " + std::to_string(max_seq_) + ")");
}

void LlamaModel::upload(int64_t* device_dst, std::span<const int64_t> values) {
  QS_CHECK(static_cast<int64_t>(values.size()) <= max_rows_, "upload: more values than rows");
  upload_bytes(device_dst, values.data(), values.size_bytes());
}

void LlamaModel::upload_bytes(void* device_dst, const void* values, size_t bytes) {
  Staging& sg = *staging_;
  QS_CHECK(static_cast<int64_t>(bytes) <= sg.slot * 8, "upload: more bytes than a staging slot");
  const int slot = sg.next;
  sg.next = (sg.next + 1) % kStagingSlots;
  Event& done = sg.done[static_cast<size_t>(slot)];
  if (!done.query()) done.synchronize();  // the ring lapped a copy still queued (rare: a long queue)
  int64_t* host = sg.base + slot * sg.slot;
  std::memcpy(host, values, bytes);
  ops::upload_async(device_dst, host, bytes, ctx_);
  ctx_.compute().record(done);
}

// ---- binding (model/llama_binding.h) ---------------------------------------------------------------

BindScratch LlamaModel::bind_scratch() const {
  BindScratch s;
  s.biases = act_->biases;
  s.bias_stride = std::max({config_.hidden_size, config_.intermediate_size,
                            config_.num_attention_heads * config_.head_dim});
  s.head_dim = config_.head_dim;
  s.norms = act_->norms;
  s.lora_cvt = act_->lora_cvt;
  s.lora_alpha = options_.lora_alpha;
  s.use_rslora = options_.use_rslora;
  s.norm_offset = config_.gemma_norms ? 1.0f : 0.0f;
  return s;
}

AttentionScores LlamaModel::attention_scores() const {
  AttentionScores s;
  if (config_.query_pre_attn_scalar > 0)  // transformers: query_pre_attn_scalar ** -0.5 (a double, used in f32)
    s.scale = static_cast<float>(std::pow(config_.query_pre_attn_scalar, -0.5));
  s.softcap = static_cast<float>(config_.attn_logit_softcapping);
  return s;
}

GatedAct LlamaModel::gated_act() const { return config_.gelu_tanh ? GatedAct::kGeluTanh : GatedAct::kSilu; }

const float* LlamaModel::rope_table(bool sin) const {
  const bool local = layer_local_rope(config_, layer_.layer);
  if (sin) return local ? act_->rope_sin_local : act_->rope_sin;
  return local ? act_->rope_cos_local : act_->rope_cos;
}

void LlamaModel::bind_root() {
  mark(StepPart::kBind);
  qshard::bind_root(source_->root(), config_.hidden_size, bind_scratch(), root_binding_, ctx_);
  act_->head_converted = false;
  mark(StepPart::kOther);
}

void LlamaModel::bind_layer(int64_t layer) {
  QS_CHECK(layer >= 0 && layer < config_.num_hidden_layers, "layer index out of range");
  mark(StepPart::kBind);
  qshard::bind_layer(source_->layer(layer), layer, bind_scratch(), layer_, ctx_);
  mark(StepPart::kOther);
}

// ---- one decoder layer ------------------------------------------------------------------------------

DropoutKey LlamaModel::dropout_key(int idx) const {
  return DropoutKey{training_ ? options_.lora_dropout : 0.0f, options_.dropout_seed, step_,
                    static_cast<uint64_t>(layer_.layer) * kLlamaProjections.size() + idx,
                    row_offset_ + chunk_row_offset_};
}

// The bound layer's projections as GEMM operands: 4-bit ones dequantized into the workspace (or
// the layer's slot, options.dequantized_layers).
void LlamaModel::dequantize_layer() {
  mark(StepPart::kDequant);
  Workspace& ws = ctx_.workspace();
  const DType act_t = ctx_.activation_dtype();
  const size_t esz = dtype_size(act_t);
  // Which groups fold: every projection with LoRA, no LoRA dropout in this mode (its mask is per
  // projection), and a weight this path can widen (4-bit, or dense in the activation dtype).
  for (size_t g = 0; g < kFoldGroups.size(); ++g) {
    bool fold = options_.fold_lora && !(training_ && options_.lora_dropout > 0.0f);
    int64_t R = 0;
    for (int idx : kFoldGroups[g]) {
      if (idx < 0) continue;
      const ProjectionBinding& p = layer_.proj[static_cast<size_t>(idx)];
      fold = fold && p.r > 0 && (p.quantized || p.weight_dtype == act_t);
      fold_off_[static_cast<size_t>(idx)] = R;
      R += p.r;
    }
    fold_[g] = fold;
    fold_r_[g] = fold ? R : 0;
  }
  // The backwards row-folded (linear_bwd), each with a weight this path widens (4-bit, or dense in
  // the activation dtype: copied) and a buffer
  // for [dy | s dt]: down_proj's with gate|up folded, in their input-gradient buffer (dh2, rows
  // C + R_gu apart); o_proj's with q|k|v folded, in dq's buffer (llama_buffer_plan sizes it).
  row_fold_.fill(false);
  for (const auto& [idx, on] : {std::pair{kO, fold_[0]}, std::pair{kDown, fold_[1] && layer_.proj[kDown].r <= fold_r_[1]}}) {
    const ProjectionBinding& p = layer_.proj[static_cast<size_t>(idx)];
    row_fold_[static_cast<size_t>(idx)] = on && p.r > 0 && p.lora_A && (p.quantized || p.weight_dtype == act_t);
  }
  // Where the weights go: the workspace, or (options.dequantized_layers) the layer's own slot,
  // whose weights of this layout are there from an earlier bind: then only the LoRA's columns and
  // rows are packed again.
  const size_t l = static_cast<size_t>(layer_.layer);
  uint8_t* slot = l < dequant_layout_.size()
                      ? static_cast<uint8_t*>(act_->dequantized) + static_cast<int64_t>(l) * dequant_slot_bytes_
                      : nullptr;
  const uint32_t layout = dequant_layout();
  const bool made = slot && dequant_layout_[l] == layout;
  int64_t slot_used = 0;
  auto take = [&](int64_t bytes, const char* what) -> void* {
    if (!slot) return ws.take(static_cast<size_t>(bytes), what);
    slot_used = buffer_aligned(slot_used);
    QS_CHECK(slot_used + bytes <= dequant_slot_bytes_, std::string("dequantized layer slot too small for the ") + what);
    void* p = slot + slot_used;
    slot_used += bytes;
    return p;
  };
  // The 4-bit projections are dequantized by one batched launch after the loop (the LoRA packing
  // writes other columns of the folded buffers, so it may run first).
  std::array<Dequant4bitArgs, kLlamaProjections.size()> batch_args{};
  std::array<void*, kLlamaProjections.size()> batch_outs{};
  int batch = 0;
  // The fold's packing (s B blocks and their zeros beside each weight, the A stacks): one launch.
  std::array<Copy2dBlock, 4 * kLlamaProjections.size()> packs{};
  static_assert(packs.size() <= static_cast<size_t>(kCopy2dBatchMax));
  int npacks = 0;
  auto pack = [&](void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows, int64_t cols, float scale) {
    if (rows * cols > 0) packs[static_cast<size_t>(npacks++)] = Copy2dBlock{dst, ld_dst, src, ld_src, rows, cols, scale};
  };
  // A folded group's weights in one piece, stacked in the group's order ([W_q; W_k; W_v], rows
  // in + R wide): q|k|v's backward reads them as one operand (qkv_bwd_fused).
  std::array<uint8_t*, kFoldGroups.size()> group_w{};
  std::array<int64_t, kFoldGroups.size()> group_rows{};
  for (size_t i = 0; i < layer_.proj.size(); ++i) {
    const ProjectionBinding& p = layer_.proj[i];
    const int g = fold_group(static_cast<int>(i));
    if (g >= 0 && fold_[static_cast<size_t>(g)]) {
      // W_ext [out, in + R] = [W | 0 .. s B | .. 0]: this projection's scaled B in its own columns.
      const int64_t R = fold_r_[static_cast<size_t>(g)], ld = p.in + R;
      const size_t gi = static_cast<size_t>(g);
      if (!group_w[gi]) {
        int64_t rows = 0;
        for (int idx : kFoldGroups[gi])
          if (idx >= 0) rows += layer_.proj[static_cast<size_t>(idx)].out;
        group_w[gi] = static_cast<uint8_t*>(take(rows * ld * static_cast<int64_t>(esz), "folded projections"));
      }
      void* w = group_w[gi] + group_rows[gi] * ld * static_cast<int64_t>(esz);
      group_rows[gi] += p.out;
      if (!made && p.quantized) {
        Dequant4bitArgs q = p.q;
        q.row_len = p.in;
        q.out_ld = ld;
        batch_args[batch] = q;  // the forward's rule (the backward's: backward_weight)
        batch_outs[batch++] = w;
      } else if (!made) {
        ops::copy_2d(w, ld, p.dense, p.in, p.out, p.in, 1.0f, ctx_);
      }
      const int64_t off = fold_off_[i];
      pack(act(w, p.in), ld, nullptr, 0, p.out, off, 0.0f);
      pack(act(w, p.in + off), ld, p.lora_B, p.r, p.out, p.r, p.scaling);
      pack(act(w, p.in + off + p.r), ld, nullptr, 0, p.out, R - off - p.r, 0.0f);
      // A_cat: this projection's A [r, in] at rows off of the group's stack.
      pack(act(lora_cat(g), off * p.in), p.in, p.lora_A, p.in, p.r, p.in, 1.0f);
      weights_[i] = w;
    } else if (p.quantized) {
      const bool rows = row_fold_[i];  // [W; A]: A's r rows below W
      void* w = take(p.in * (p.out + (rows ? p.r : 0)) * static_cast<int64_t>(esz), "dequantized projection");
      if (!made) {
        batch_args[batch] = p.q;  // the forward's rule (the backward's: backward_weight)
        batch_outs[batch++] = w;
      }
      if (rows) pack(act(w, p.out * p.in), p.in, p.lora_A, p.in, p.r, p.in, 1.0f);
      weights_[i] = w;
    } else if (p.weight_dtype == act_t && row_fold_[i]) {  // [W; A]: W copied, A's r rows below it
      void* w = take(p.in * (p.out + p.r) * static_cast<int64_t>(esz), "row-folded projection");
      if (!made) pack(w, p.in, p.dense, p.in, p.out, p.in, 1.0f);
      pack(act(w, p.out * p.in), p.in, p.lora_A, p.in, p.r, p.in, 1.0f);
      weights_[i] = w;
    } else if (p.weight_dtype == act_t) {
      weights_[i] = p.dense;
    } else if (ops::gemm_supports(ctx_, act_t, p.weight_dtype)) {
      weights_[i] = nullptr;  // read in its own dtype
    } else {
      void* w = take(p.in * p.out * static_cast<int64_t>(esz), "converted projection");
      if (!made) ops::convert(w, act_t, p.dense, p.weight_dtype, p.in * p.out, ctx_);
      weights_[i] = w;
    }
  }
  if (slot) dequant_layout_[l] = layout;  // filled in stream order below (the batched dequant)
  if (npacks > 0) {
    mark(StepPart::kLoraPack);
    ops::copy_2d_batch(packs.data(), npacks, ctx_);
  }
  mark(StepPart::kDequant);
  ops::dequantize_4bit_batch(batch_outs.data(), batch_args.data(), batch, ctx_);
}

uint32_t LlamaModel::dequant_layout() const {
  uint32_t bits = 1u | (fold_[0] ? 2u : 0u) | (fold_[1] ? 4u : 0u);
  for (size_t i = 0; i < row_fold_.size(); ++i)
    if (row_fold_[i]) bits |= 8u << i;
  return bits;
}

int64_t LlamaModel::fold_ld(int g) const { return config_.hidden_size + fold_r_[static_cast<size_t>(g)]; }

void* LlamaModel::lora_cat(int g) const { return act(act_->lora_cat, g == 0 ? 0 : fold_r_[0] * config_.hidden_size); }

// ---- LoRA fold ------------------------------------------------------------------------------------
// PEFT's y = x W^T + s (x A^T) B^T for the projections of one group (same input x, width C) as
// ONE widened GEMM per projection and one small GEMM per group, instead of two LoRA GEMMs per
// projection that each re-read and re-write y:
//   forward:  t = x A_cat^T (A_cat = the group's A matrices stacked, [R, C]) is written into R
//             extra columns of x's own buffer [N, C + R]; then y_j = [x | t] W_ext_j^T with
//             W_ext_j = [W_j | 0 .. s B_j .. 0] ([out_j, C + R], dequantized in place + packed):
//             the LoRA term is R more steps of the base GEMM's K loop.
//   backward: dx = sum_j dy_j W_j (the base input-gradient GEMMs, reading W_ext's first columns)
//             and s dt = sum_j dy_j [0 .. s B_j .. 0] into dx's R extra columns (one skinny GEMM
//             per projection through W_ext's own LoRA block); then dB_j += s dy_j^T t_j,
//             dA_j += (s dt_j)^T x, dx += (s dt) A_cat (one GEMM per group, K = R).
// Without the fold (o_proj, down_proj, LoRA dropout, dense weights of another dtype, or
// options.fold_lora false) each projection runs its own LoRA GEMMs (linear_fwd / linear_bwd).

void LlamaModel::fold_fwd(int g, void* x, int64_t N) {
  if (!fold_[static_cast<size_t>(g)]) return;
  const int64_t C = config_.hidden_size, R = fold_r_[static_cast<size_t>(g)], ld = C + R;
  const DType act_t = ctx_.activation_dtype();
  const void* a_cat = lora_cat(g);
  mark(StepPart::kLora);
  GemmShape s = typed({N, R, C, false, true}, act_t, act_t, act_t);
  s.lda = ld;
  s.ldc = ld;
  ops::gemm(act(x, C), x, a_cat, s, ctx_);  // t = x A_cat^T into the extra columns
  mark(StepPart::kOther);
}

void LlamaModel::fold_bwd(int g, void* dx, const void* x, int64_t N) {
  if (!fold_[static_cast<size_t>(g)]) return;
  const int64_t C = config_.hidden_size, R = fold_r_[static_cast<size_t>(g)], ld = C + R;
  const DType act_t = ctx_.activation_dtype();
  const void* a_cat = lora_cat(g);
  mark(StepPart::kLora);
  // dA_j += (s dt_j)^T x for the whole group as ONE GEMM over x ([R, C] f32 in the workspace; one
  // read of x, not one a projection), each projection's rows then added to its gradient.
  bool any = false;
  for (int idx : kFoldGroups[static_cast<size_t>(g)]) any = any || (idx >= 0 && layer_.proj[static_cast<size_t>(idx)].grad_A);
  if (any) {
    Workspace& ws = ctx_.workspace();
    const size_t ws_mark = ws.used();
    auto* da = static_cast<float*>(ws.take(static_cast<size_t>(R * C) * sizeof(float), "LoRA A gradients (fold group)"));
    GemmShape sa = typed({R, C, N, true, false, 1.0f, 0.0f}, act_t, act_t, DType::kF32);
    sa.lda = ld;
    sa.ldb = ld;
    ops::gemm(da, act(dx, C), x, sa, ctx_);  // (s dt_cat)^T x
    for (int idx : kFoldGroups[static_cast<size_t>(g)]) {
      if (idx < 0) continue;
      const ProjectionBinding& p = layer_.proj[static_cast<size_t>(idx)];
      if (p.grad_A) ops::accumulate_f32(p.grad_A, da + fold_off_[static_cast<size_t>(idx)] * C, p.r * C, ctx_);
    }
    ws.rewind(ws_mark);
  }
  GemmShape s = typed({N, C, R, false, false, 1.0f, 1.0f}, act_t, act_t, act_t);
  s.lda = ld;
  s.ldc = ld;
  ops::gemm(dx, act(dx, C), a_cat, s, ctx_);  // dx += (s dt) A_cat (reads the extra columns, writes the first C)
  mark(StepPart::kOther);
}

int64_t LlamaModel::qkv_fused_ld() const {
  if (qkv_ld_ == 0 || !fold_[0]) return 0;  // qkv_ld_: the option, no q/k norms, no soft-cap
  if (pos_ && pieces_.ragged && ragged_ld_ != qkv_ld_) return 0;  // packed data: the ragged layout must have it
  for (int idx : kFoldGroups[0]) {
    const ProjectionBinding& p = layer_.proj[static_cast<size_t>(idx)];
    // the backward multiplies with the forward's operand (backward_weight's rule)
    if (p.quantized && ops::dequant_rules_differ(ctx_, p.weight_dtype)) return 0;
  }
  return qkv_ld_;
}

void LlamaModel::qkv_bwd_fused(void* dx, const void* dqkv, int64_t ld, const void* x, int64_t N) {
  const int64_t C = config_.hidden_size, R = fold_r_[0], W = C + R;
  const DType act_t = ctx_.activation_dtype();
  const size_t esz = dtype_size(act_t);
  // the stacked operand [W_q; W_k; W_v] ([ld, W]): dequantize_layer takes the group in one piece
  const auto* wq = static_cast<const uint8_t*>(weights_[kQ]);
  QS_CHECK(wq && static_cast<const uint8_t*>(weights_[kK]) == wq + layer_.proj[kQ].out * W * static_cast<int64_t>(esz) &&
               static_cast<const uint8_t*>(weights_[kV]) ==
                   wq + (layer_.proj[kQ].out + layer_.proj[kK].out) * W * static_cast<int64_t>(esz) &&
               layer_.proj[kQ].out + layer_.proj[kK].out + layer_.proj[kV].out == ld,
           "qkv_bwd_fused: q|k|v's folded weights are not one stacked operand");
  GemmShape s = typed({N, C, ld, false, false, 1.0f, 0.0f}, act_t, act_t, act_t);
  s.lda = ld;
  s.ldb = W;
  s.ldc = W;
  mark(StepPart::kGemm);
  ops::gemm(dx, dqkv, wq, s, ctx_);  // dx = dq W_q + dk W_k + dv W_v, one K loop
  // s dt = dqkv [s B_q | s B_k | s B_v] (zeros beside each block): each projection's dt in its columns
  mark(StepPart::kLora);
  GemmShape st = typed({N, R, ld, false, false, 1.0f, 0.0f}, act_t, act_t, act_t);
  st.lda = ld;
  st.ldb = W;
  st.ldc = W;
  ops::gemm(act(dx, C), dqkv, act(wq, C), st, ctx_);
  int64_t col = 0;
  for (int idx : kFoldGroups[0]) {
    const ProjectionBinding& p = layer_.proj[static_cast<size_t>(idx)];
    if (p.grad_B) {  // dB += s dy^T t
      GemmShape sb = typed({p.out, p.r, N, true, false, p.scaling, 1.0f}, act_t, act_t, DType::kF32);
      sb.lda = ld;
      sb.ldb = W;
      ops::gemm(p.grad_B, act(dqkv, col), act(x, C + fold_off_[static_cast<size_t>(idx)]), sb, ctx_);
    }
    col += p.out;
  }
  mark(StepPart::kOther);
}

// An unfolded LoRA term runs FIRST, y = s t B^T (+ residual), and the base GEMM then adds into y
// (beta 1): y is written twice and read once, where adding the LoRA term after the base GEMM
// (y += s t B^T) read and wrote it once more. The residual stream (x2 = x + o_proj(a), out =
// x2 + down_proj(m)) enters the same way, as the first GEMM's C, in place of a separate add.
bool LlamaModel::keeps_t(int idx, const void* buf) const {
  const ProjectionBinding& p = layer_.proj[static_cast<size_t>(idx)];
  return buf && p.r > 0 && row_fold_[static_cast<size_t>(idx)] && dropout_key(idx).p == 0.0f;
}

void LlamaModel::linear_fwd(int idx, void* y, const void* x, int64_t N, int64_t ldx, const void* residual,
                            void* t_out) {
  const ProjectionBinding& p = layer_.proj[idx];
  const DType act_t = ctx_.activation_dtype();
  const int g = fold_group(idx);
  const bool folded = g >= 0 && fold_[static_cast<size_t>(g)];
  const int64_t K = folded ? p.in + fold_r_[static_cast<size_t>(g)] : p.in;
  const void* c_in = residual;  // what the base GEMM adds (null: nothing)
  Workspace& ws = ctx_.workspace();
  const size_t ws_mark = ws.used();
  if (p.r > 0 && !folded) {
    QS_CHECK(ldx == 0 || ldx == p.in, "linear_fwd: an unfolded LoRA input must be packed");
    mark(StepPart::kLora);
    const DropoutKey key = dropout_key(idx);
    const void* xd = x;
    if (key.p > 0.0f) {
      void* buf = ws.take(N * p.in * dtype_size(act_t), "LoRA dropout input");
      ops::dropout_fwd(buf, x, key, N, p.in, ctx_);
      xd = buf;
    }
    void* t = t_out && key.p == 0.0f ? t_out : ws.take(N * p.r * dtype_size(act_t), "LoRA x A^T");
    ops::gemm(t, xd, p.lora_A, typed({N, p.r, p.in, false, true}, act_t, act_t, act_t), ctx_);  // t = xd A^T
    ops::gemm_into(y, t, p.lora_B, residual,
                   typed({N, p.out, p.r, false, true, p.scaling, residual ? 1.0f : 0.0f}, act_t, act_t, act_t),
                   ctx_);  // y = s t B^T (+ residual)
    c_in = y;
  }
  GemmShape s{N, p.out, K, false, true, 1.0f, c_in ? 1.0f : 0.0f};
  s.a_type = s.c_type = act_t;
  s.b_type = weights_[idx] ? act_t : p.weight_dtype;  // dequantized into the workspace: the GEMM's dtype
  s.lda = ldx;
  if (folded) s.ldb = K;
  mark(StepPart::kGemm);
  // y = x W^T (+ c_in) (folded: [x | t] W_ext^T)
  ops::gemm_into(y, x, weights_[idx] ? weights_[idx] : p.dense, c_in, s, ctx_);
  mark(StepPart::kOther);
  ws.rewind(ws_mark);
  if (p.bias) ops::add_bias(y, p.bias, N, p.out, ctx_);
}

// The backward's B operand of projection idx: bitsandbytes' MatMul4Bit.backward multiplies with
// dequantize_4bit's values (rounded to the QuantState's dtype), its forward with the unrounded
// products (ops::dequantize_4bit). Where the two differ (a bf16-made weight on the CPU) the rounded
// weight is dequantized again, packed [out, in], into the workspace (the caller rewinds it) and
// s.ldb set to match; else the forward's operand (weights_[idx], nullptr for a dense weight).
const void* LlamaModel::backward_weight(int idx, GemmShape& s, bool row_fold) {
  const ProjectionBinding& p = layer_.proj[idx];
  if (!p.quantized || !ops::dequant_rules_differ(ctx_, p.weight_dtype)) return weights_[idx];
  mark(StepPart::kDequant);
  const int64_t rows = p.out + (row_fold ? p.r : 0);
  void* w = ctx_.workspace().take(static_cast<size_t>(p.in * rows) * dtype_size(ctx_.activation_dtype()),
                                  "dequantized projection (backward)");
  ops::dequantize_4bit_rounded(w, p.q, p.weight_dtype, ctx_);
  if (row_fold) ops::copy_2d(act(w, p.out * p.in), p.in, p.lora_A, p.in, p.r, p.in, 1.0f, ctx_);
  s.ldb = 0;
  mark(StepPart::kGemm);
  return w;
}

// Unfolded without dropout, the LoRA term comes first, dx (+)= s dt A, and the base GEMM then adds
// into dx (beta 1), as linear_fwd orders its two terms. Row-folded (o_proj / down_proj, row_fold_, and
// dy_ext given): dy_ext = [dy | s dy B] ([N, out + r]), and dx (+)= dy_ext [W; A] is the base GEMM
// itself with K = out + r: no GEMM of K = r over dx (N x in, 14336 wide at 8B) and no second pass
// of the base GEMM's epilogue over it.
void LlamaModel::linear_bwd(int idx, void* dx, bool accumulate_dx, const void* dy, const void* x, int64_t N,
                            int64_t ldx, void* dy_ext, const void* t_in) {
  const ProjectionBinding& p = layer_.proj[idx];
  const DType act_t = ctx_.activation_dtype();
  const int g = fold_group(idx);
  const bool folded = g >= 0 && fold_[static_cast<size_t>(g)];
  const int64_t R = folded ? fold_r_[static_cast<size_t>(g)] : 0, W = p.in + R;
  const DropoutKey key = dropout_key(idx);
  const bool row_fold = dy_ext && row_fold_[static_cast<size_t>(idx)] && p.r > 0 && !folded && key.p == 0.0f;
  auto base = [&](bool add) {  // dx (+)= dy W (row-folded: dx (+)= [dy | s dt] [W; A])
    GemmShape s{N, p.in, row_fold ? p.out + p.r : p.out, false, false, 1.0f, add ? 1.0f : 0.0f};
    s.a_type = s.c_type = act_t;
    s.b_type = weights_[idx] ? act_t : p.weight_dtype;
    s.ldc = ldx;
    if (folded) s.ldb = W;  // the first `in` columns of W_ext
    mark(StepPart::kGemm);
    Workspace& ws_w = ctx_.workspace();
    const size_t ws_w_mark = ws_w.used();
    const void* w_bwd = backward_weight(idx, s, row_fold);
    ops::gemm(dx, row_fold ? dy_ext : dy, w_bwd ? w_bwd : p.dense, s, ctx_);
    ws_w.rewind(ws_w_mark);
    mark(StepPart::kOther);
  };
  // dx over x (down_proj's dm over m): only where x is read before dx is first written
  QS_CHECK(dx != x || p.r == 0 || (!folded && key.p == 0.0f && !accumulate_dx),
           "linear_bwd: the input gradient over the input needs an unfolded projection without dropout");
  if (p.r == 0 || folded || key.p > 0.0f) base(accumulate_dx);
  if (p.r == 0) return;
  if (row_fold) {
    QS_CHECK(ldx == 0 || ldx == p.in, "linear_bwd: a row-folded projection's input must be packed");
    QS_CHECK(weights_[idx], "linear_bwd: a row-folded projection's weight must be in the workspace");
    const int64_t ld = p.out + p.r;
    mark(StepPart::kLora);
    Workspace& ws = ctx_.workspace();
    const size_t ws_mark = ws.used();
    // t = x A^T: the forward's (the same GEMM: the same bits), else once more
    const void* t = t_in;
    if (!t) {
      void* w = ws.take(N * p.r * dtype_size(act_t), "LoRA x A^T");
      ops::gemm(w, x, p.lora_A, typed({N, p.r, p.in, false, true}, act_t, act_t, act_t), ctx_);
      t = w;
    }
    if (p.grad_B)  // dB += s dy^T t  (f32 gradient)
      ops::gemm(p.grad_B, dy, t, typed({p.out, p.r, N, true, false, p.scaling, 1.0f}, act_t, act_t, DType::kF32),
                ctx_);
    ws.rewind(ws_mark);
    ops::copy_2d(dy_ext, ld, dy, p.out, N, p.out, 1.0f, ctx_);  // dy_ext = [dy | ..]
    GemmShape st = typed({N, p.r, p.out, false, false, p.scaling, 0.0f}, act_t, act_t, act_t);
    st.ldc = ld;
    ops::gemm(act(dy_ext, p.out), dy, p.lora_B, st, ctx_);  // [.. | s dt], s dt = s dy B
    if (p.grad_A) {  // dA += (s dt)^T x
      GemmShape sa = typed({p.r, p.in, N, true, false, 1.0f, 1.0f}, act_t, act_t, DType::kF32);
      sa.lda = ld;
      ops::gemm(p.grad_A, act(dy_ext, p.out), x, sa, ctx_);
    }
    mark(StepPart::kOther);
    base(accumulate_dx);  // dx (+)= [dy | s dt] [W; A]; x (m) read above, dx may go over it
    return;
  }
  if (folded) {
    // s dt = dy (s B) into dx's extra columns, through W_ext's own [out, R] block (zeros beside
    // this projection's s B: the group's sum lands each dt in its columns). A separate GEMM: as
    // extra output columns of the one above, the widened N (in + R) cost a whole tile column.
    mark(StepPart::kLora);
    GemmShape st = typed({N, R, p.out, false, false, 1.0f, accumulate_dx ? 1.0f : 0.0f}, act_t, act_t, act_t);
    st.ldb = W;
    st.ldc = ldx;
    ops::gemm(act(dx, p.in), dy, act(weights_[idx], p.in), st, ctx_);
    mark(StepPart::kOther);
    if (!p.grad_B) return;
    mark(StepPart::kLora);
    GemmShape sb = typed({p.out, p.r, N, true, false, p.scaling, 1.0f}, act_t, act_t, DType::kF32);
    sb.ldb = ldx;
    ops::gemm(p.grad_B, dy, act(x, p.in + fold_off_[static_cast<size_t>(idx)]), sb, ctx_);  // dB += s dy^T t
    mark(StepPart::kOther);
    return;
  }
  QS_CHECK(ldx == 0 || ldx == p.in, "linear_bwd: an unfolded LoRA input must be packed");
  mark(StepPart::kLora);
  Workspace& ws = ctx_.workspace();
  const size_t ws_mark = ws.used();
  const size_t esz = dtype_size(act_t);
  const void* xd = x;
  if (key.p > 0.0f) {  // recomputed: the same mask
    void* buf = ws.take(N * p.in * esz, "LoRA dropout input");
    ops::dropout_fwd(buf, x, key, N, p.in, ctx_);
    xd = buf;
  }
  const DType f32 = DType::kF32;
  void* t = ws.take(N * p.r * esz, "LoRA x A^T");
  ops::gemm(t, xd, p.lora_A, typed({N, p.r, p.in, false, true}, act_t, act_t, act_t), ctx_);  // t = xd A^T  [N,r]
  if (p.grad_B)  // dB += s dy^T t  (f32 gradient)
    ops::gemm(p.grad_B, dy, t, typed({p.out, p.r, N, true, false, p.scaling, 1.0f}, act_t, act_t, f32), ctx_);
  void* dt = ws.take(N * p.r * esz, "LoRA dy B");
  ops::gemm(dt, dy, p.lora_B, typed({N, p.r, p.out, false, false}, act_t, act_t, act_t), ctx_);  // dt = dy B  [N,r]
  if (p.grad_A)  // dA += s dt^T xd
    ops::gemm(p.grad_A, dt, xd, typed({p.r, p.in, N, true, false, p.scaling, 1.0f}, act_t, act_t, f32), ctx_);
  if (key.p == 0.0f) {  // dx (+)= s dt A, then (after the rewind) the base GEMM adds dy W
    ops::gemm(dx, dt, p.lora_A,
              typed({N, p.in, p.r, false, false, p.scaling, accumulate_dx ? 1.0f : 0.0f}, act_t, act_t, act_t), ctx_);
    ws.rewind(ws_mark);
    mark(StepPart::kOther);
    base(true);
    return;
  }
  void* dxd = ws.take(N * p.in * esz, "LoRA dx");
  ops::gemm(dxd, dt, p.lora_A, typed({N, p.in, p.r, false, false, p.scaling, 0.0f}, act_t, act_t, act_t),
            ctx_);  // s dt A
  ops::dropout_fwd(dxd, dxd, key, N, p.in, ctx_);  // the mask's transpose is itself
  ops::accumulate(dx, dxd, N * p.in, ctx_);
  ws.rewind(ws_mark);
  mark(StepPart::kOther);
}

void LlamaModel::run_layer(const void* x, void* x_out, int64_t B, int64_t T, int64_t cache_pos) {
  const LlamaConfig& c = config_;
  const int64_t N = B * T, C = c.hidden_size;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  LlamaActivations& a = *act_;
  const int64_t ld1 = fold_ld(0), ld2 = fold_ld(1);
  mark(StepPart::kNorm);
  ops::rmsnorm_fwd(a.h1, a.rstd1, x, layer_.input_norm, N, C, eps, ctx_, ld1);
  fold_fwd(0, a.h1, N);
  linear_fwd(kQ, c.qk_norm ? a.q_raw : a.q, a.h1, N, ld1);
  linear_fwd(kK, c.qk_norm ? a.k_raw : a.k, a.h1, N, ld1);
  linear_fwd(kV, a.v, a.h1, N, ld1);
  if (c.qk_norm) {  // Qwen3: RMSNorm over head_dim on each head, before RoPE ([N*H, D] rows)
    QS_CHECK(layer_.q_norm && layer_.k_norm, "qk_norm: the layer has no q_norm / k_norm bound");
    mark(StepPart::kNorm);
    ops::rmsnorm_fwd(a.q, a.rstd_q, a.q_raw, layer_.q_norm, N * H, D, eps, ctx_);
    ops::rmsnorm_fwd(a.k, a.rstd_k, a.k_raw, layer_.k_norm, N * Hkv, D, eps, ctx_);
  }
  mark(StepPart::kRope);
  const int64_t rope_off = cache_pos > 0 ? cache_pos * (D / 2) : 0;  // positions cache_pos ..
  const float* cos = rope_table(false) + rope_off;
  const float* sin = rope_table(true) + rope_off;
  ops::rope_fwd(a.q, cos, sin, B, T, H, D, ctx_, pos_);
  ops::rope_fwd(a.k, cos, sin, B, T, Hkv, D, ctx_, pos_);
  mark(StepPart::kAttention);
  const int64_t window = layer_window(c, layer_.layer);
  const AttentionScores scores = attention_scores();
  if (cache_pos >= 0) {
    const int64_t row = Hkv * D, layer_off = layer_.layer * options_.kv_cache_tokens * row;
    void* kc = act(a.k_cache, layer_off);
    void* vc = act(a.v_cache, layer_off);
    ops::copy(act(kc, cache_pos * row), a.k, T * row, ctx_);
    ops::copy(act(vc, cache_pos * row), a.v, T * row, ctx_);
    if (cache_pos == 0)  // the prompt: the training / eval kernel, so its logits are eval's
      ops::attention_fwd(a.a, a.att_saved, a.q, a.k, a.v, B, T, H, Hkv, D, ctx_, window, nullptr, scores);
    else
      ops::attention_cached_fwd(a.a, a.q, kc, vc, T, cache_pos, H, Hkv, D, ctx_, window, scores);
  } else {
    ops::attention_fwd(a.a, a.att_saved, a.q, a.k, a.v, B, T, H, Hkv, D, ctx_, window, pos_ ? &pieces_ : nullptr,
                       scores);
  }
  mark(StepPart::kOther);
  if (c.gemma_norms) {  // Gemma: x2 = x + post_attention_layernorm(o_proj(a))
    linear_fwd(kO, a.ao, a.a, N, 0, nullptr, keeps_t(kO, a.t_o) ? a.t_o : nullptr);
    mark(StepPart::kNorm);
    ops::rmsnorm_fwd(a.x2, a.rstd_ao, a.ao, layer_.attn_out_norm, N, C, eps, ctx_);
    mark(StepPart::kResidual);
    ops::add(a.x2, x, a.x2, N * C, ctx_);  // residual + attention (HF order)
  } else {
    linear_fwd(kO, a.x2, a.a, N, 0, x,  // x2 = x + o_proj(a), the residual in the GEMMs' epilogue
               keeps_t(kO, a.t_o) ? a.t_o : nullptr);
  }
  // h2 = norm(x2): whole, or (chunked MLP) per chunk into a chunk-sized h2 (mlp_rows_fwd)
  const bool chunks = chunked(N);
  if (!chunks) {
    mark(StepPart::kNorm);
    ops::rmsnorm_fwd(a.h2, a.rstd2, a.x2, layer_.post_norm, N, C, eps, ctx_, ld2);
    fold_fwd(1, a.h2, N);
  }
  if (!x_out) {  // the backward's recompute: down_proj's output is not needed (a chunked MLP: later)
    if (!chunks) mlp_rows_fwd(0, N, false);
    mark(StepPart::kOther);
    return;
  }
  // out = x2 + down(silu(gate(h2)) * up(h2)), over chunks of rows when chunked.
  const int64_t step = chunks ? mlp_rows_ : N;
  for (int64_t r0 = 0; r0 < N; r0 += step) {
    const int64_t rows = std::min(step, N - r0);
    mlp_rows_fwd(r0, rows, chunks);
    chunk_row_offset_ = r0;
    if (c.gemma_norms) {  // Gemma: post_feedforward_layernorm(down(...)) before the residual add
      linear_fwd(kDown, a.dn, a.m, rows, 0, nullptr, !chunks && keeps_t(kDown, a.t_dn) ? a.t_dn : nullptr);
      mark(StepPart::kNorm);
      ops::rmsnorm_fwd(act(x_out, r0 * C), a.rstd_dn, a.dn, layer_.mlp_out_norm, rows, C, eps, ctx_);
      mark(StepPart::kOther);
    } else {  // out = x2 + down_proj(m), the residual in the GEMMs' epilogue
      linear_fwd(kDown, act(x_out, r0 * C), a.m, rows, 0, act(a.x2, r0 * C),
                 !chunks && keeps_t(kDown, a.t_dn) ? a.t_dn : nullptr);
    }
    chunk_row_offset_ = 0;
  }
  if (c.gemma_norms) {
    mark(StepPart::kResidual);
    ops::add(x_out, a.x2, x_out, N * C, ctx_);
  }
  mark(StepPart::kOther);
}

void LlamaModel::mlp_rows_fwd(int64_t r0, int64_t rows, bool norm) {
  LlamaActivations& a = *act_;
  const int64_t ld2 = fold_ld(1);
  if (norm) {  // this chunk's h2 = norm(x2) (and the fold's t) into the chunk-sized h2
    mark(StepPart::kNorm);
    ops::rmsnorm_fwd(a.h2, a.rstd2 + r0, act(a.x2, r0 * config_.hidden_size), layer_.post_norm, rows,
                     config_.hidden_size, static_cast<float>(config_.rms_norm_eps), ctx_, ld2);
    fold_fwd(1, a.h2, rows);
  }
  const void* h2 = norm ? a.h2 : act(a.h2, r0 * ld2);
  chunk_row_offset_ = r0;
  linear_fwd(kGate, a.g, h2, rows, ld2);
  linear_fwd(kUp, a.u, h2, rows, ld2);
  mark(StepPart::kSwiglu);
  ops::swiglu_fwd(a.m, a.g, a.u, rows * config_.intermediate_size, ctx_, gated_act());
  mark(StepPart::kOther);
  chunk_row_offset_ = 0;
}

bool LlamaModel::chunked(int64_t N) const { return N > mlp_rows_; }

int LlamaModel::kept_set(int64_t layer) const {
  const int64_t L = config_.num_hidden_layers;
  if (mlp_rows_ < max_rows_) return -1;  // chunked MLP: every layer recomputes
  if (layer == L - 1) return static_cast<int>(act_->kept.size());  // the working set
  return kept_index_[static_cast<size_t>(layer)];
}

void LlamaModel::layer_forward(const void* x_in, void* x_out, int64_t B, int64_t T) {
  check_sizes(B, T);
  layer_forward_kept(x_in, x_out, B, T, -1);
}

void LlamaModel::layer_forward_kept(const void* x_in, void* x_out, int64_t B, int64_t T, int set, int64_t cache_pos) {
  LlamaActivations& a = *act_;
  const bool own = set >= 0 && set < static_cast<int>(a.kept.size());
  if (own) a.use(a.kept[static_cast<size_t>(set)]);
  ctx_.workspace().reset();
  dequantize_layer();
  run_layer(x_in, x_out, B, T, cache_pos);
  ctx_.workspace().reset();
  if (own) a.use(a.work);
}

void LlamaModel::layer_backward(const void* x_in, const void* dout, void* dx, int64_t B, int64_t T) {
  check_sizes(B, T);
  layer_backward_impl(x_in, dout, dx, B, T, -1);
}

// set: -1 recompute the internals from x_in into the working set; else they are in kept set
// `set` (== kept.size(): the working set, left there by this layer's forward).
void LlamaModel::layer_backward_impl(const void* x_in, const void* dout, void* dx, int64_t B, int64_t T, int set) {
  const LlamaConfig& c = config_;
  const int64_t N = B * T, C = c.hidden_size, I = c.intermediate_size;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  LlamaActivations& a = *act_;
  const bool own = set >= 0 && set < static_cast<int>(a.kept.size());
  if (own) a.use(a.kept[static_cast<size_t>(set)]);
  ctx_.workspace().reset();
  dequantize_layer();
  if (set < 0) {
    run_layer(x_in, nullptr, B, T);  // activation checkpointing: recompute the internals
  } else if (own) {  // a kept set: what it does not hold, from what it does (the same kernels: the same bits)
    const LlamaInternals& kept = a.kept[static_cast<size_t>(set)];
    const float eps = static_cast<float>(c.rms_norm_eps);
    if (!kept.h1) {  // a full set (LlamaModelOptions::full_kept_sets) holds h1, h2 and m: nothing to rerun
      mark(StepPart::kNorm);
      ops::rmsnorm_fwd(a.h1, a.rstd1, x_in, layer_.input_norm, N, C, eps, ctx_, fold_ld(0));
      fold_fwd(0, a.h1, N);
    }
    if (!kept.h2) {
      mark(StepPart::kNorm);
      ops::rmsnorm_fwd(a.h2, a.rstd2, a.x2, layer_.post_norm, N, C, eps, ctx_, fold_ld(1));
      fold_fwd(1, a.h2, N);
    }
    if (!kept.m && kept.g) {  // the set holds gate / up (kept_mlp / host_kept_mlp), not m
      mark(StepPart::kSwiglu);
      ops::swiglu_fwd(a.m, a.g, a.u, N * I, ctx_, gated_act());  // one elementwise op
    } else if (!kept.m) {
      mlp_rows_fwd(0, N, false);  // gate / up not kept either: their GEMMs from h2, then m
    }
    if (c.gemma_norms) {  // o_proj's output and its norm's rstd (the working set's), recomputed
      linear_fwd(kO, a.ao, a.a, N);
      ops::rmsnorm_fwd(a.dao, a.rstd_ao, a.ao, layer_.attn_out_norm, N, C, eps, ctx_);
    }
    mark(StepPart::kOther);
  }

  // The residual stream's gradient in place in dx: dout, then (+ the MLP's norm) the gradient at
  // x2, then (+ attention's norm) at x_in. The same additions as copies into separate buffers.
  const int64_t ld1 = fold_ld(0), ld2 = fold_ld(1);
  if (dx != dout) {
    mark(StepPart::kResidual);
    ops::copy(dx, dout, N * C, ctx_);
  }
  // MLP: out = x2 + down(silu(gate(h2)) * up(h2)); dout flows to x2 unchanged (residual).
  const bool chunks = chunked(N);
  const int64_t step = chunks ? mlp_rows_ : N;
  for (int64_t r0 = 0; r0 < N; r0 += step) {
    const int64_t rows = std::min(step, N - r0);
    if (chunks) mlp_rows_fwd(r0, rows, true);  // this chunk's h2 and gate/up/SwiGLU, recomputed
    const void* h2 = chunks ? a.h2 : act(a.h2, r0 * ld2);
    void* dh2 = act(a.dh2, r0 * ld2);
    chunk_row_offset_ = r0;
    const void* dmlp = act(dx, r0 * C);  // the gradient at down_proj's output
    if (c.gemma_norms) {  // through post_feedforward_layernorm: down's output and rstd recomputed
      linear_fwd(kDown, a.dn, a.m, rows, 0, nullptr, !chunks && keeps_t(kDown, a.t_dn) ? a.t_dn : nullptr);
      mark(StepPart::kNorm);
      ops::rmsnorm_fwd(a.ddn, a.rstd_dn, a.dn, layer_.mlp_out_norm, rows, C, static_cast<float>(c.rms_norm_eps), ctx_);
      ops::zero(a.ddn, rows * C, ctx_);
      ops::rmsnorm_bwd(a.ddn, dmlp, a.dn, layer_.mlp_out_norm, a.rstd_dn, rows, C, ctx_);
      mark(StepPart::kOther);
      dmlp = a.ddn;
    }
    // dm over m (llama_buffer_aliases): down_proj's backward reads m (its LoRA input) before it
    // first writes dm; gate / up's gradients over g / u, which swiglu_bwd reads before it writes.
    // row-folded: [dy | s dt] in this chunk's rows of dh2 (rows C + R_gu >= C + r apart), which
    // gate / up's backward writes only after down_proj's has read them
    // down_proj's x A^T as its forward left it: a kept or the working set's (this layer's forward,
    // or Gemma's just above); a recomputed layer's forward stops before down_proj
    const bool t_dn = !chunks && (set >= 0 || c.gemma_norms) && keeps_t(kDown, a.t_dn);
    linear_bwd(kDown, a.dm, false, dmlp, a.m, rows, 0, dh2, t_dn ? a.t_dn : nullptr);
    mark(StepPart::kSwiglu);
    ops::swiglu_bwd(a.g, a.u, a.dm, a.g, a.u, rows * I, ctx_, gated_act());
    linear_bwd(kGate, dh2, false, a.g, h2, rows, ld2);
    linear_bwd(kUp, dh2, true, a.u, h2, rows, ld2);
    chunk_row_offset_ = 0;
    fold_bwd(1, dh2, h2, rows);
    mark(StepPart::kNorm);  // dx's rows: the gradient at x2 (the later chunks read other rows of dx)
    ops::rmsnorm_bwd(act(dx, r0 * C), dh2, act(a.x2, r0 * C), layer_.post_norm, a.rstd2 + r0, rows, C, ctx_, ld2);
  }

  // Attention: x2 = x + o(attn(rope(q(h1)), rope(k(h1)), v(h1))), h1 = norm(x).
  const void* dattn = dx;  // the gradient at o_proj's output
  if (c.gemma_norms) {     // through post_attention_layernorm (its input and rstd in the working set)
    mark(StepPart::kNorm);
    ops::zero(a.dao, N * C, ctx_);
    ops::rmsnorm_bwd(a.dao, dx, a.ao, layer_.attn_out_norm, a.rstd_ao, N, C, ctx_);
    dattn = a.dao;
  }
  // row-folded: [dy | s dt] in dq's buffer (rows C + r apart), which attention's backward writes after
  // o_proj's x A^T: its forward's (kept), or the recompute's (run_layer above)
  linear_bwd(kO, a.da, false, dattn, a.a, N, 0, a.dq, keeps_t(kO, a.t_o) ? a.t_o : nullptr);
  // dq|dk|dv side by side in dq's buffer (rows ld_qkv apart: q|k|v's backward fused), or each packed
  // in its own part of it
  const int64_t ld_qkv = qkv_fused_ld();
  qkv_fused_ = ld_qkv > 0;
  void* dk = ld_qkv > 0 ? act(a.dq, H * D) : a.dk;
  void* dv = ld_qkv > 0 ? act(a.dq, (H + Hkv) * D) : a.dv;
  mark(StepPart::kAttention);
  ops::attention_bwd(a.dq, dk, dv, a.da, a.q, a.k, a.v, a.a, a.att_saved, B, T, H, Hkv, D, ctx_,
                     layer_window(c, layer_.layer), pos_ ? &pieces_ : nullptr, attention_scores(), ld_qkv);
  mark(StepPart::kRope);
  if (ld_qkv > 0) {  // q's heads and k's side by side in each row: one pass; then one GEMM for dx
    ops::rope_bwd(a.dq, rope_table(false), rope_table(true), B, T, H + Hkv, D, ctx_, pos_, ld_qkv);
    qkv_bwd_fused(a.dh1, a.dq, ld_qkv, a.h1, N);
  } else {
    ops::rope_bwd(a.dq, rope_table(false), rope_table(true), B, T, H, D, ctx_, pos_);
    ops::rope_bwd(dk, rope_table(false), rope_table(true), B, T, Hkv, D, ctx_, pos_);
    const void* dq_proj = a.dq;  // the gradient at q_proj's / k_proj's output
    const void* dk_proj = dk;
    if (c.qk_norm) {  // through q_norm / k_norm: into da (free once attention_bwd read it) and dk_raw
      mark(StepPart::kNorm);
      ops::zero(a.da, N * H * D, ctx_);
      ops::rmsnorm_bwd(a.da, a.dq, a.q_raw, layer_.q_norm, a.rstd_q, N * H, D, ctx_);
      ops::zero(a.dk_raw, N * Hkv * D, ctx_);
      ops::rmsnorm_bwd(a.dk_raw, dk, a.k_raw, layer_.k_norm, a.rstd_k, N * Hkv, D, ctx_);
      dq_proj = a.da;
      dk_proj = a.dk_raw;
    }
    linear_bwd(kQ, a.dh1, false, dq_proj, a.h1, N, ld1);
    linear_bwd(kK, a.dh1, true, dk_proj, a.h1, N, ld1);
    linear_bwd(kV, a.dh1, true, dv, a.h1, N, ld1);
  }
  fold_bwd(0, a.dh1, a.h1, N);
  mark(StepPart::kNorm);
  ops::rmsnorm_bwd(dx, a.dh1, x_in, layer_.input_norm, a.rstd1, N, C, ctx_, ld1);
  mark(StepPart::kOther);
  ctx_.workspace().reset();
  if (own) a.use(a.work);
}

// ---- embedding and head -------------------------------------------------------------------------

void LlamaModel::embed(std::span<const int64_t> ids, void* x, int64_t B, int64_t T) {
  check_sizes(B, T);
  QS_CHECK(static_cast<int64_t>(ids.size()) == B * T, "embed: bad sizes");
  upload(act_->ids, ids);
  // Gemma: times sqrt(hidden) in f32, rounded to the embedding's dtype (transformers'
  // embed_scale.to(weight.dtype)); the product in that dtype (embedding_fwd).
  float scale = 1.0f;
  if (config_.embed_scale > 0) {
    scale = static_cast<float>(config_.embed_scale);
    if (root_binding_.embed_dtype == DType::kBF16) scale = bf16_to_f32(f32_to_bf16(scale));
    if (root_binding_.embed_dtype == DType::kF16) scale = f16_to_f32(f32_to_f16(scale));
  }
  ops::embedding_fwd(x, act_->ids, root_binding_.embed, root_binding_.embed_dtype, B * T, config_.hidden_size,
                     config_.vocab_size, ctx_, scale);
}

void LlamaModel::head_chunks(const void* x, const int64_t* targets, void* dx, int64_t N, float grad_scale,
                             float* logits_out) {
  const int64_t C = config_.hidden_size, V = config_.vocab_size;
  LlamaActivations& a = *act_;
  const RootBinding& r = root_binding_;
  const DType act_t = ctx_.activation_dtype();
  mark(StepPart::kHead);
  // The head as a GEMM operand: its own dtype, or converted once per bind into the model's buffer.
  const void* head = r.head;
  DType head_t = r.head_dtype;
  if (!ops::gemm_supports(ctx_, act_t, head_t)) {
    if (!a.head_converted) ops::convert(a.head_cvt, act_t, r.head, r.head_dtype, V * C, ctx_);
    a.head_converted = true;
    head = a.head_cvt;
    head_t = act_t;
  }
  // The logit gradient (f32) in the activation dtype when the GEMM does not take f32 with the head.
  const bool dlogits_cvt = !ops::gemm_supports(ctx_, DType::kF32, head_t);
  ops::rmsnorm_fwd(a.xf, a.rstdf, x, r.norm, N, C, static_cast<float>(config_.rms_norm_eps), ctx_);
  const float softcap = static_cast<float>(config_.final_logit_softcapping);
  Workspace& ws = ctx_.workspace();
  ws.reset();
  void* logits = ws.take(head_rows_ * V * 4, "LM-head logits chunk");  // f32 [rows, V]
  void* dlogits = dlogits_cvt ? ws.take(head_rows_ * V * dtype_size(act_t), "LM-head logit gradient") : logits;
  for (int64_t r0 = 0; r0 < N; r0 += head_rows_) {
    const int64_t rows = std::min(head_rows_, N - r0);
    ops::gemm(logits, act(a.xf, r0 * C), head, typed({rows, V, C, false, true}, act_t, head_t, DType::kF32),
              ctx_);  // [rows, V] = xf W^T
    if (softcap > 0.0f) ops::logit_softcap(static_cast<float*>(logits), rows * V, softcap, ctx_);  // Gemma 2
    if (logits_out) {
      ctx_.compute().synchronize();  // the host copy reads the GEMM's result
      copy_bytes(logits_out + r0 * V, Device::kCpu, logits, ctx_.compute_device(), static_cast<size_t>(rows * V) * 4);
      continue;
    }
    // The gradient straight into the GEMM's dtype when it is not f32 (one read of the f32 logits
    // less than converting afterwards; the same bits).
    const DType dl_t = dlogits_cvt ? act_t : DType::kF32;
    ops::cross_entropy_fwd_bwd(logits, a.loss_sum, targets + r0, rows, V, grad_scale, ctx_, dlogits, dl_t, softcap);
    if (grad_scale != 0.0f) {
      ops::gemm(act(a.dxf, r0 * C), dlogits, head, typed({rows, C, V, false, false}, dl_t, head_t, act_t),
                ctx_);  // dxf = dlogits W (the head is frozen)
    }
  }
  ws.reset();
  mark(StepPart::kOther);
  if (grad_scale != 0.0f) {
    ops::zero(dx, N * C, ctx_);
    ops::rmsnorm_bwd(dx, a.dxf, x, r.norm, a.rstdf, N, C, ctx_);
  }
}

void LlamaModel::head_forward(const void* x, float* logits, int64_t B, int64_t T) {
  check_sizes(B, T);
  head_chunks(x, nullptr, nullptr, B * T, 0.0f, logits);
}

void LlamaModel::head_forward_backward(const void* x, std::span<const int64_t> targets, void* dx, int64_t B,
                                       int64_t T, double normalizer) {
  check_sizes(B, T);
  QS_CHECK(normalizer > 0, "cross entropy normalizer must be positive");
  QS_CHECK(static_cast<int64_t>(targets.size()) == B * T, "head_forward_backward: bad sizes");
  upload(act_->targets, targets);
  head_chunks(x, act_->targets, dx, B * T, static_cast<float>(1.0 / normalizer), nullptr);
}

double LlamaModel::take_loss_sum() {
  mark(StepPart::kOther);
  ctx_.compute().synchronize();
  profiler_.collect();
  double v = 0;
  copy_bytes(&v, Device::kCpu, act_->loss_sum, ctx_.compute_device(), sizeof(double));
  const double zero = 0;
  copy_bytes(act_->loss_sum, ctx_.compute_device(), &zero, Device::kCpu, sizeof(double));
  return v;
}

// ---- whole passes -------------------------------------------------------------------------------------

// Where a training step's x_l lives: its checkpoint's ring slot (host_checkpoints) or xs entry, or
// (checkpoint_every 2, an odd l) the scratch after them.
int LlamaModel::checkpoint_index(int64_t l) const {
  return static_cast<int>(llama_checkpoint_index(l, config_.num_hidden_layers, options_.checkpoint_every));
}

void* LlamaModel::checkpoint_at(int64_t l, int64_t NC) const {
  const int i = checkpoint_index(l);
  const OffloadRing* ck = ckpt_ring_.get();
  if (i >= 0) return ck ? ck->slot_ptr(i) : act(act_->xs, i * NC);
  const int64_t scratch =
      ck ? ck->slots() : llama_checkpoint_count(config_.num_hidden_layers, options_.checkpoint_every);
  return act(act_->xs, scratch * NC);
}

void LlamaModel::forward_backward(std::span<const int64_t> ids, std::span<const int64_t> targets, int64_t B,
                                  int64_t T, double normalizer, std::span<const int64_t> positions) {
  const int64_t L = config_.num_hidden_layers, NC = B * T * config_.hidden_size;
  LlamaActivations& a = *act_;
  const void* x_final = forward_layers(ids, B, T, /*keep_checkpoints=*/true, -1, positions);
  mark(StepPart::kWait);
  if (before_root) before_root(Pass::kBackward);
  mark(StepPart::kOther);
  bind_root();
  OffloadRing* ck = ckpt_ring_.get();
  if (ck) ring_before(*ck, checkpoint_index(L), false);
  head_forward_backward(x_final, targets, a.dx, B, T, normalizer);
  mark(StepPart::kOffload);
  if (ck) ck->after_read(checkpoint_index(L), ctx_.compute());
  if (after_root) after_root(Pass::kBackward);
  mark(StepPart::kOther);
  for (int64_t l = L - 1; l >= 0; --l) {
    const int i = checkpoint_index(l);
    if (i < 0) {  // checkpoint_every 2: x_l from checkpoint x_l-1, layer l-1's forward again
      const int j = checkpoint_index(l - 1);
      QS_CHECK(j >= 0, "checkpoint layout: two layer inputs in a row are not kept");
      mark(StepPart::kWait);
      if (before_layer) before_layer(l - 1, Pass::kForward);
      mark(StepPart::kOther);
      bind_layer(l - 1);
      if (ck) ring_before(*ck, j, false);
      layer_forward_kept(checkpoint_at(l - 1, NC), checkpoint_at(l, NC), B, T, -1);
      mark(StepPart::kOffload);
      if (after_layer) after_layer(l - 1, Pass::kForward);
      mark(StepPart::kOther);
    }
    mark(StepPart::kWait);
    if (before_layer) before_layer(l, Pass::kBackward);
    mark(StepPart::kOther);
    bind_layer(l);
    const int h = host_set(l);
    if (h >= 0) ring_before(*kept_ring_, h, false);
    if (ck && i >= 0) ring_before(*ck, i, false);
    layer_backward_impl(checkpoint_at(l, NC), a.dx, a.dx, B, T, h >= 0 ? staging_set(h) : kept_set(l));
    mark(StepPart::kOffload);
    if (ck && i >= 0) ck->after_read(i, ctx_.compute());
    if (h >= 0) kept_ring_->after_read(h, ctx_.compute());
    if (after_layer) after_layer(l, Pass::kBackward);
    mark(StepPart::kOther);
  }
}

// Embedding and every decoder layer (forward hooks). Training keeps every layer's input
// (x_l in checkpoint l, activation checkpointing); eval alternates between two buffers.
// Returns the final hidden state [B,T,C].
const void* LlamaModel::forward_layers(std::span<const int64_t> ids, int64_t B, int64_t T, bool keep_checkpoints,
                                       int64_t cache_pos, std::span<const int64_t> positions) {
  auto slot = [&](int64_t l) { return keep_checkpoints ? l : l % 2; };
  check_sizes(B, T);
  pos_ = nullptr;
  if (!positions.empty()) {
    QS_CHECK(options_.packed_positions && cache_pos < 0,
             "positions given to a model built without options.packed_positions (or to generation)");
    QS_CHECK(static_cast<int64_t>(positions.size()) == B * T, "positions: bad size");
    for (int64_t r = 0; r < B * T; ++r) {  // the rule attention and RoPE rely on (llama_ops.h)
      const int64_t p = positions[static_cast<size_t>(r)], t = r % T;
      QS_CHECK(p >= 0 && p <= t && (p == 0 || positions[static_cast<size_t>(r - 1)] == p - 1),
               "positions: row " + std::to_string(r / T) + " position " + std::to_string(t) +
                   " neither restarts at 0 nor follows the one before");
    }
    upload(act_->positions, positions);
    pos_ = act_->positions;
    pieces_ = AttentionPieces{pos_, nullptr, 0};
    if (act_->ragged) {  // CUDA: the same pieces in cuDNN's ragged layout, made here on the host
      // with the offsets of dq|dk|dv side by side where q|k|v's backward may run fused and they fit int32
      ragged_ld_ = qkv_ld_ > 0 && B * T * qkv_ld_ <= std::numeric_limits<int32_t>::max() ? qkv_ld_ : 0;
      ragged_layout(ragged_host_.data(), positions.data(), B * T, max_pieces_, config_.num_attention_heads,
                    config_.num_key_value_heads, config_.head_dim, ragged_ld_);
      upload_bytes(act_->ragged, ragged_host_.data(), ragged_host_.size() * 4);
      pieces_.ragged = act_->ragged;
      pieces_.max = max_pieces_;
    }
  }
  const int64_t L = config_.num_hidden_layers, NC = B * T * config_.hidden_size;
  LlamaActivations& a = *act_;
  mark(StepPart::kWait);
  if (before_root) before_root(Pass::kForward);
  mark(StepPart::kOther);
  // Training with options.host_checkpoints: x_l through the checkpoint ring's slots (x_0..x_L-slots
  // out to pinned host memory, back before their backward).
  OffloadRing* ck = keep_checkpoints ? ckpt_ring_.get() : nullptr;
  auto x_at = [&](int64_t l) { return keep_checkpoints ? checkpoint_at(l, NC) : act(a.xs, slot(l) * NC); };
  bind_root();
  if (ck) ring_before(*ck, 0, true);
  mark(StepPart::kEmbed);
  embed(ids, x_at(0), B, T);
  mark(StepPart::kOffload);
  if (ck) ck->after_write(0, ctx_.compute());
  if (after_root) after_root(Pass::kForward);
  mark(StepPart::kOther);
  for (int64_t l = 0; l < L; ++l) {
    mark(StepPart::kWait);
    if (before_layer) before_layer(l, Pass::kForward);
    mark(StepPart::kOther);
    bind_layer(l);
    const int h = keep_checkpoints ? host_set(l) : -1;
    if (h >= 0) ring_before(*kept_ring_, h, true);
    const int i = ck ? checkpoint_index(l + 1) : -1;  // -1: x_l+1 into the scratch (checkpoint_every 2)
    if (i >= 0) ring_before(*ck, i, true);
    layer_forward_kept(x_at(l), x_at(l + 1), B, T, h >= 0 ? staging_set(h) : keep_checkpoints ? kept_set(l) : -1,
                       cache_pos);
    mark(StepPart::kOffload);
    if (i >= 0) ck->after_write(i, ctx_.compute());
    if (h >= 0) kept_ring_->after_write(h, ctx_.compute());
    if (after_layer) after_layer(l, Pass::kForward);
    mark(StepPart::kOther);
  }
  return x_at(L);
}

void LlamaModel::forward_loss(std::span<const int64_t> ids, std::span<const int64_t> targets, int64_t B, int64_t T,
                              std::span<const int64_t> positions) {
  QS_CHECK(static_cast<int64_t>(targets.size()) == B * T, "forward_loss: bad sizes");
  const void* x = forward_layers(ids, B, T, false, -1, positions);
  if (before_root) before_root(Pass::kForward);
  bind_root();
  upload(act_->targets, targets);
  head_chunks(x, act_->targets, nullptr, B * T, 0.0f, nullptr);
  if (after_root) after_root(Pass::kForward);
}

std::vector<float> LlamaModel::forward_logits(std::span<const int64_t> ids, int64_t B, int64_t T) {
  std::vector<float> logits(static_cast<size_t>(B * T * config_.vocab_size));
  const void* x = forward_layers(ids, B, T, false);
  if (before_root) before_root(Pass::kForward);
  bind_root();
  head_forward(x, logits.data(), B, T);
  if (after_root) after_root(Pass::kForward);
  return logits;
}

std::vector<float> LlamaModel::forward_cached(std::span<const int64_t> ids, int64_t pos) {
  const int64_t T = static_cast<int64_t>(ids.size());
  QS_CHECK(options_.kv_cache_tokens > 0, "forward_cached: the model was built without a KV cache");
  QS_CHECK(pos >= 0 && T >= 1 && pos + T <= options_.kv_cache_tokens,
           "forward_cached: positions " + std::to_string(pos) + ".." + std::to_string(pos + T) +
               " are past the KV cache of " + std::to_string(options_.kv_cache_tokens));
  const void* x = forward_layers(ids, 1, T, /*keep_checkpoints=*/false, pos);
  std::vector<float> logits(static_cast<size_t>(config_.vocab_size));
  if (before_root) before_root(Pass::kForward);
  bind_root();
  head_chunks(act(x, (T - 1) * config_.hidden_size), nullptr, nullptr, 1, 0.0f, logits.data());  // the last position
  if (after_root) after_root(Pass::kForward);
  return logits;
}

}  // namespace qshard
