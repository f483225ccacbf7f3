#include "model/llama_buffers.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "model/llama_model.h"
#include "model/llama_ops.h"
#include "runtime/device_context.h"
#include "runtime/error.h"
#include "runtime/machine.h"

namespace qshard {

const char* buffer_life_name(BufferLife life) {
  switch (life) {
    case BufferLife::kRun: return "activations";
    case BufferLife::kKept: return "kept layers";
    case BufferLife::kWorkspace: return "workspace";
    case BufferLife::kLibrary: return "library workspace (estimate)";
    case BufferLife::kHost: return "pinned host (kept layers)";
    case BufferLife::kWeights: return "dequantized base layers";
  }
  return "?";
}

void BufferPlan::add(std::string name, int64_t bytes, BufferLife life, void** target) {
  QS_CHECK(bytes >= 0, "buffer " + name + ": negative size");
  if (life == BufferLife::kRun || life == BufferLife::kKept || life == BufferLife::kHost || life == BufferLife::kWeights)
    bytes = buffer_aligned(bytes);
  entries_.push_back({std::move(name), bytes, life, target});
}

int64_t BufferPlan::total(BufferLife life) const {
  int64_t t = 0;
  for (const BufferEntry& e : entries_)
    if (e.life == life) t += e.bytes;
  return t;
}

int64_t BufferPlan::total() const {
  int64_t t = 0;
  for (const BufferEntry& e : entries_)
    if (e.life != BufferLife::kHost) t += e.bytes;
  return t;
}

std::string BufferPlan::ledger(int top) const {
  std::string s;
  for (BufferLife life :
       {BufferLife::kRun, BufferLife::kKept, BufferLife::kWeights, BufferLife::kWorkspace, BufferLife::kLibrary,
        BufferLife::kHost}) {
    const int64_t t = total(life);
    if (t == 0) continue;
    std::vector<const BufferEntry*> es;
    for (const BufferEntry& e : entries_)
      if (e.life == life && e.bytes > 0) es.push_back(&e);
    std::stable_sort(es.begin(), es.end(), [](const BufferEntry* a, const BufferEntry* b) { return a->bytes > b->bytes; });
    s += fmt::format("{}{} {} in {} buffers", s.empty() ? "" : "; ", buffer_life_name(life),
                     human_bytes(static_cast<double>(t)), es.size());
    for (size_t i = 0; i < es.size() && static_cast<int>(i) < top; ++i)
      s += fmt::format("{} {} {}", i == 0 ? ":" : ",", es[i]->name, human_bytes(static_cast<double>(es[i]->bytes)));
  }
  return s;
}

Tensor BufferPlan::allocate(BufferLife life, Device device, bool zero) const {
  const int64_t bytes = total(life);
  if (bytes == 0) {
    for (const BufferEntry& e : entries_)
      if (e.life == life && e.target) *e.target = nullptr;
    return Tensor();
  }
  Tensor storage = zero ? Tensor::zeros({bytes}, DType::kU8, device) : Tensor::empty({bytes}, DType::kU8, device);
  int64_t off = 0;
  for (const BufferEntry& e : entries_) {
    if (e.life != life) continue;
    if (e.target) *e.target = static_cast<uint8_t*>(storage.raw()) + off;
    off += e.bytes;
  }
  return storage;
}

int64_t llama_head_rows(int64_t head_chunk_bytes, int64_t V, int64_t N) {
  // Large enough that the head's GEMMs have hundreds of rows at a 128k vocabulary (~510 rows at
  // the default 256 MiB: the weight read per chunk is amortised), far below [N, V].
  int64_t rows = std::clamp<int64_t>(head_chunk_bytes / (V * 4), 1, std::max<int64_t>(N, 1));
  if (rows > 256 && rows < N) rows -= rows % 256;  // whole GEMM tiles (523 -> 512 rows)
  return rows;
}

LlamaBufferDims llama_buffer_dims(const LlamaConfig& c, const LlamaModelOptions& o, Backend backend, DType act_t,
                                  DType head_t, int64_t r) {
  LlamaBufferDims d;
  d.L = c.num_hidden_layers, d.C = c.hidden_size, d.I = c.intermediate_size, d.V = c.vocab_size;
  d.H = c.num_attention_heads, d.Hkv = c.num_key_value_heads, d.D = c.head_dim;
  d.B = o.max_batch;
  d.T = o.max_seq > 0 ? o.max_seq : c.max_position_embeddings;
  d.N = d.B * d.T;
  d.NM = o.mlp_chunk_rows > 0 ? std::min(o.mlp_chunk_rows, d.N) : d.N;
  const int64_t q = d.H * d.D, kv = d.Hkv * d.D;
  d.max_in = std::max({d.C, q, d.I});
  d.max_out = std::max({d.C, q, d.I});
  d.max_r = r;
  // q (C -> q), k, v (C -> kv), o (q -> C), gate, up (C -> I), down (I -> C): all 4-bit, all dequantized.
  d.dequant_elems = 2 * d.C * q + 2 * d.C * kv + 3 * d.C * d.I;
  // The backward's rounded copy of one projection (model/llama_ops.h, dequantize_4bit_rounded): on
  // the CPU reserved whatever the QuantState's dtype (the config does not say it), on CUDA needed
  // only for an f16-made model (the tree's measured dims count it; this estimate leaves it out).
  // (each with its A's r rows below: linear_bwd's row fold)
  d.round_elems = backend == Backend::kCpu ? std::max({d.C * (q + r), q * (d.C + r), d.C * (d.I + r), d.I * (d.C + r)}) : 0;
  d.lora_elems = r * (7 * d.C + 2 * q + 2 * kv + 3 * d.I);
  if (r > 0 && o.fold_lora) {
    d.fold_r = {3 * r, 2 * r};
    // R more columns per output row; gate|up's: and down_proj's A rows (its backward row-folded)
    // (q|k|v's: and o_proj's A rows, its backward row-folded too)
    d.fold_extra = {(q + 2 * kv) * 3 * r + r * q, 2 * d.I * 2 * r + r * d.I};
  }
  d.convert_lora = act_t != DType::kF32;
  d.convert_head = backend == Backend::kCuda && head_t != act_t;
  d.kept_sets = std::max<int64_t>(std::min(o.keep_layers, d.L) - 1, 0);
  d.kept_mlp = o.kept_mlp;
  d.host_kept_mlp = o.host_kept_mlp;
  // Full sets (h1, h2 and m kept too): whole sets of a whole MLP only (a lean set's backward reruns
  // the MLP's GEMMs and SwiGLU anyway; a chunked MLP keeps no layer).
  d.full_sets = o.kept_mlp && d.NM == d.N ? std::clamp<int64_t>(o.full_kept_sets, 0, d.kept_sets) : 0;
  // Host-kept layers: of those left to recompute (all but the kept sets and the last), through
  // host_staging_sets device staging sets (two by default; at most one a layer). The whole MLP only.
  const int64_t open = std::max<int64_t>(d.L - 1 - d.kept_sets, 0);
  d.host_sets = d.NM == d.N ? std::clamp<int64_t>(o.host_keep_layers, 0, open) : 0;
  d.staging_sets = std::min<int64_t>(d.host_sets, std::max<int64_t>(o.host_staging_sets, 1));
  d.host_checkpoints = o.host_checkpoints;
  d.dequantized_layers = std::clamp<int64_t>(o.dequantized_layers, 0, d.L);
  d.checkpoint_every = o.checkpoint_every;
  d.checkpoints = llama_checkpoint_count(d.L, o.checkpoint_every);
  const int64_t buffers = llama_checkpoint_buffers(d.L, o.checkpoint_every);
  d.checkpoint_slots =
      o.host_checkpoints ? std::clamp<int64_t>(o.checkpoint_slots, 1 + buffers - d.checkpoints, buffers) : 0;
  d.kv_cache_tokens = o.kv_cache_tokens;
  d.dropout = o.lora_dropout > 0;
  d.head_rows = llama_head_rows(o.head_chunk_bytes, d.V, d.N);
  d.qk_norm = c.qk_norm;
  d.gemma_norms = c.gemma_norms;
  d.eager_attention = backend == Backend::kCuda && c.attn_logit_softcapping > 0;
  d.local_rope = c.rope_local_theta > 0;
  d.positions = o.packed_positions;
  if (o.packed_positions && backend == Backend::kCuda)
    d.ragged_ints = ragged_layout_ints(o.packed_max_pieces > 0 ? o.packed_max_pieces : d.N);
  return d;
}

namespace {

// One set of a layer's internals: into the working set (prefix "") or a kept set.
// mlp: a kept set holds gate / up (the working set always does). full: a kept set holds h1, h2 and
// m too (the working set's m is llama_buffer_plan's own entry).
void add_internals(BufferPlan& p, const LlamaBufferDims& d, Backend backend, int64_t esz, BufferLife life,
                   const std::string& prefix, int64_t mlp_rows, LlamaInternals* s, bool mlp = true,
                   bool full = false) {
  const int64_t N = d.N, C = d.C, q = d.H * d.D, kv = d.Hkv * d.D;
  auto t = [&](auto* field) { return s ? reinterpret_cast<void**>(field) : nullptr; };
  // A kept set has no h1 / h2: the backward recomputes them (one RMSNorm and the fold's x A^T each)
  // into the working set's, a sixth less memory per kept layer for two memory-bound kernels. A full
  // set keeps them (and m): where memory is left once every layer is kept.
  const bool kept = life == BufferLife::kKept && !full;
  if (!kept) p.add(prefix + "h1", N * (C + d.fold_r[0]) * esz, life, t(s ? &s->h1 : nullptr));
  p.add(prefix + "rstd1", N * 4, life, t(s ? &s->rstd1 : nullptr));
  p.add(prefix + "q", N * q * esz, life, t(s ? &s->q : nullptr));
  p.add(prefix + "k", N * kv * esz, life, t(s ? &s->k : nullptr));
  p.add(prefix + "v", N * kv * esz, life, t(s ? &s->v : nullptr));
  if (d.qk_norm) {  // Qwen3: q_norm / k_norm's inputs and rstd (their backward reads them)
    p.add(prefix + "q before q_norm", N * q * esz, life, t(s ? &s->q_raw : nullptr));
    p.add(prefix + "k before k_norm", N * kv * esz, life, t(s ? &s->k_raw : nullptr));
    p.add(prefix + "rstd q", N * d.H * 4, life, t(s ? &s->rstd_q : nullptr));
    p.add(prefix + "rstd k", N * d.Hkv * 4, life, t(s ? &s->rstd_k : nullptr));
  }
  p.add(prefix + "attention saved", static_cast<int64_t>(attention_saved_bytes(backend, d.B, d.T, d.H, d.Hkv, d.D)),
        life, t(s ? &s->att_saved : nullptr));
  p.add(prefix + "a", N * q * esz, life, t(s ? &s->a : nullptr));
  p.add(prefix + "x2", N * C * esz, life, t(s ? &s->x2 : nullptr));
  // h2 of the working set: chunk-sized with a chunked MLP (each chunk's norm into it).
  if (!kept) p.add(prefix + "h2", mlp_rows * (C + d.fold_r[1]) * esz, life, t(s ? &s->h2 : nullptr));
  p.add(prefix + "rstd2", N * 4, life, t(s ? &s->rstd2 : nullptr));
  if (d.max_r > 0) {  // o_proj's / down_proj's x A^T (r columns; a set of every kind: its backward reads them)
    p.add(prefix + "o_proj x A^T", N * d.max_r * esz, life, t(s ? &s->t_o : nullptr));
    p.add(prefix + "down_proj x A^T", mlp_rows * d.max_r * esz, life, t(s ? &s->t_dn : nullptr));
  }
  // Without the MLP (kept_mlp / host_kept_mlp false) a kept set leaves gate / up to the backward (two
  // GEMMs from h2, into the working set's): two thirds of a kept layer's bytes at the 8B shape, half
  // of its forward's FLOPs.
  if (kept && !mlp) return;
  p.add(prefix + "gate", mlp_rows * d.I * esz, life, t(s ? &s->g : nullptr));
  p.add(prefix + "up", mlp_rows * d.I * esz, life, t(s ? &s->u : nullptr));
  if (full) p.add(prefix + "m", mlp_rows * d.I * esz, life, t(s ? &s->m : nullptr));
}

}  // namespace

int64_t llama_checkpoint_count(int64_t L, int64_t every) {
  QS_CHECK(every == 1 || every == 2, "checkpoint_every must be 1 or 2");
  return every == 1 || L < 1 ? L + 1 : L / 2 + 2;  // x_0, x_2, .. below L-1 (L / 2 of them), x_L-1, x_L
}

int64_t llama_checkpoint_index(int64_t l, int64_t L, int64_t every) {
  QS_CHECK(every == 1 || every == 2, "checkpoint_every must be 1 or 2");
  if (every == 1 || L < 1) return l;
  if (l >= L - 1) return L / 2 + (l - (L - 1));
  return l % 2 == 0 ? l / 2 : -1;
}

int64_t llama_checkpoint_buffers(int64_t L, int64_t every) {
  return llama_checkpoint_count(L, every) + (every > 1 ? 1 : 0);
}

int64_t llama_checkpoint_ring_slots(const LlamaBufferDims& d) {
  return d.checkpoint_slots - (llama_checkpoint_buffers(d.L, d.checkpoint_every) - d.checkpoints);
}

int64_t llama_kept_set_bytes(const LlamaBufferDims& d, Backend backend, DType act_t, bool host_tier, bool full) {
  BufferPlan one;
  add_internals(one, d, backend, static_cast<int64_t>(dtype_size(act_t)), BufferLife::kKept, "", d.N, nullptr,
                host_tier ? d.host_kept_mlp : d.kept_mlp, full && !host_tier);
  return one.total(BufferLife::kKept);
}

int64_t llama_kept_sets_bytes(const LlamaBufferDims& d, Backend backend, DType act_t) {
  return d.full_sets * llama_kept_set_bytes(d, backend, act_t, false, true) +
         (d.kept_sets - d.full_sets) * llama_kept_set_bytes(d, backend, act_t);
}

BufferPlan llama_buffer_plan(const LlamaBufferDims& d, Backend backend, DType act_t, LlamaActivations* a) {
  BufferPlan p;
  const int64_t esz = static_cast<int64_t>(dtype_size(act_t));
  const int64_t L = d.L, N = d.N, NM = d.NM, C = d.C, I = d.I, V = d.V, T = d.T;
  const int64_t q = d.H * d.D, kv = d.Hkv * d.D;
  const BufferLife run = BufferLife::kRun;
  auto t = [&](auto* field) { return reinterpret_cast<void**>(field); };
  // ---- activations (one allocation, in this order) ----
  // The checkpoints x_0..x_L, or (host_checkpoints) their device slots: the rest wait in pinned
  // host memory (the entry at the end).
  // checkpoint_every 2: one more slot, the scratch an odd layer's input is recomputed into.
  p.add(d.host_checkpoints ? "xs (layer inputs' device slots)" : "xs (layer inputs)",
        (d.host_checkpoints ? d.checkpoint_slots : llama_checkpoint_buffers(L, d.checkpoint_every)) * N * C * esz, run,
        a ? t(&a->xs) : nullptr);
  add_internals(p, d, backend, esz, run, "", NM, a);
  p.add("m", NM * I * esz, run, a ? t(&a->m) : nullptr);
  // The residual stream's gradient: one buffer the layers' backward updates in place (dout, then
  // the gradient at x2, then at the layer's input), the head's rmsnorm_bwd its first writer.
  p.add("dx", N * C * esz, run, a ? t(&a->dx) : nullptr);
  if (d.gemma_norms) {  // the output norms' inputs, rstd and gradients (the MLP's chunk-sized)
    p.add("o_proj output", N * C * esz, run, a ? t(&a->ao) : nullptr);
    p.add("rstd o_proj output", N * 4, run, a ? t(&a->rstd_ao) : nullptr);
    p.add("d o_proj output", N * C * esz, run, a ? t(&a->dao) : nullptr);
    p.add("down_proj output", NM * C * esz, run, a ? t(&a->dn) : nullptr);
    p.add("rstd down_proj output", NM * 4, run, a ? t(&a->rstd_dn) : nullptr);
    p.add("d down_proj output", NM * C * esz, run, a ? t(&a->ddn) : nullptr);
  }
  // The norms' input gradients: dh2 (the MLP's) is consumed before dh1 (attention's) is written, so
  // one buffer serves both; folded, the extra columns get s dt. Without q/k norms da (o_proj's input
  // gradient, read by attention's backward before q_proj's backward writes dh1) shares it too; with
  // them da carries q_norm's input gradient into q_proj's backward. Aliases: llama_buffer_aliases.
  const int64_t dh = N * (C + std::max(d.fold_r[0], d.fold_r[1]));
  if (d.qk_norm) p.add("dh1 = dh2 (= xf)", dh * esz, run, a ? t(&a->dh1) : nullptr);
  else p.add("dh1 = dh2 = da (= xf)", std::max(dh, N * q) * esz, run, a ? t(&a->dh1) : nullptr);
  // The MLP's gradients take no buffers of their own: swiglu_bwd writes dg / du over the gate / up
  // it reads (the set's: kept, staging or working), and dm goes over m, which down_proj's backward
  // has read by then (its LoRA GEMMs, which read m, run before its dm is first written). LoRA
  // dropout on down_proj recomputes its masked input after the base GEMM: then dm has its own.
  if (d.dropout) p.add("dm", NM * I * esz, run, a ? t(&a->dm) : nullptr);
  if (d.qk_norm) p.add("da", N * q * esz, run, a ? t(&a->da) : nullptr);
  // Attention's gradients dq, dk, dv in one buffer: side by side, each token's row [q | kv | kv]
  // (LlamaModel::qkv_fused_ld: q|k|v's backward one GEMM over them), or each packed in its own part
  // (dk at N q, dv at N (q + kv): llama_buffer_aliases). q|k|v folded: o_proj's backward row-folded,
  // [dy | s dt] ([N, C + r]) in the same buffer before attention's backward writes it
  // (LlamaModel::linear_bwd).
  const int64_t dqkv_elems = d.fold_r[0] > 0 && d.max_r > 0 ? std::max(N * (q + 2 * kv), N * (C + d.max_r))
                                                            : N * (q + 2 * kv);
  p.add(q >= C ? "dq | dk | dv (= dxf)" : "dq | dk | dv", dqkv_elems * esz, run, a ? t(&a->dq) : nullptr);
  if (q < C) p.add("dxf", N * C * esz, run, a ? t(&a->dxf) : nullptr);
  if (d.qk_norm) p.add("dk before k_norm", N * kv * esz, run, a ? t(&a->dk_raw) : nullptr);
  p.add("rstdf", N * 4, run, a ? t(&a->rstdf) : nullptr);
  p.add("rope cos", T * d.D / 2 * 4, run, a ? t(&a->rope_cos) : nullptr);
  p.add("rope sin", T * d.D / 2 * 4, run, a ? t(&a->rope_sin) : nullptr);
  if (d.local_rope) {
    p.add("rope cos (sliding layers)", T * d.D / 2 * 4, run, a ? t(&a->rope_cos_local) : nullptr);
    p.add("rope sin (sliding layers)", T * d.D / 2 * 4, run, a ? t(&a->rope_sin_local) : nullptr);
  }
  p.add("ids", N * 8, run, a ? t(&a->ids) : nullptr);
  p.add("targets", N * 8, run, a ? t(&a->targets) : nullptr);
  if (d.positions) p.add("positions (packed data)", N * 8, run, a ? t(&a->positions) : nullptr);
  if (d.ragged_ints > 0) p.add("pieces (packed data, ragged)", d.ragged_ints * 4, run, a ? t(&a->ragged) : nullptr);
  p.add("loss sum", 8, run, a ? t(&a->loss_sum) : nullptr);
  p.add("norms (f32)", (3 * C + (d.qk_norm || d.gemma_norms ? 2 * d.D : 0) + (d.gemma_norms ? 2 * C : 0)) * 4, run,
        a ? t(&a->norms) : nullptr);
  p.add("biases (f32)", 7 * d.max_out * 4, run, a ? t(&a->biases) : nullptr);
  if (d.convert_lora) p.add("LoRA in the activation dtype", d.lora_elems * esz, run, a ? t(&a->lora_cvt) : nullptr);
  if (d.fold_r[0] + d.fold_r[1] > 0)
    p.add("LoRA A stacked (fold)", (d.fold_r[0] + d.fold_r[1]) * C * esz, run, a ? t(&a->lora_cat) : nullptr);
  if (d.convert_head) p.add("LM head converted", V * C * esz, run, a ? t(&a->head_cvt) : nullptr);
  if (d.dequantized_layers > 0)
    p.add(fmt::format("dequantized base layers ({} of {})", d.dequantized_layers, L),
          d.dequantized_layers * llama_dequantized_layer_bytes(d, act_t), BufferLife::kWeights,
          a ? t(&a->dequantized) : nullptr);
  if (d.kv_cache_tokens > 0) {
    p.add("KV cache keys", L * d.kv_cache_tokens * kv * esz, run, a ? t(&a->k_cache) : nullptr);
    p.add("KV cache values", L * d.kv_cache_tokens * kv * esz, run, a ? t(&a->v_cache) : nullptr);
  }
  // ---- kept layers: one set per kept layer but the last (it uses the working set) ----
  // ---- then the host-kept layers' device staging sets (the same layout), at the end of `kept` ----
  if (a) a->kept.assign(static_cast<size_t>(d.kept_sets + d.staging_sets), LlamaInternals{});
  for (int64_t i = 0; i < d.kept_sets; ++i)
    add_internals(p, d, backend, esz, BufferLife::kKept, "kept[" + std::to_string(i) + "].", N,
                  a ? &a->kept[static_cast<size_t>(i)] : nullptr, d.kept_mlp, i < d.full_sets);
  for (int64_t i = 0; i < d.staging_sets; ++i)
    add_internals(p, d, backend, esz, BufferLife::kKept, "host-kept staging[" + std::to_string(i) + "].", N,
                  a ? &a->kept[static_cast<size_t>(d.kept_sets + i)] : nullptr, d.host_kept_mlp);
  // ---- host-kept layers but the last staging_sets (those stay in their staging set from their
  // forward to their backward): one set's bytes each in pinned host memory (the model allocates it) ----
  if (d.host_sets > d.staging_sets) {
    const int64_t set = llama_kept_set_bytes(d, backend, act_t, true);
    for (int64_t i = 0; i < d.host_sets - d.staging_sets; ++i)
      p.add("host kept[" + std::to_string(i) + "]", set, BufferLife::kHost);
  }
  if (d.host_checkpoints && d.checkpoints > llama_checkpoint_ring_slots(d))
    p.add("host checkpoints (layer inputs)", (d.checkpoints - llama_checkpoint_ring_slots(d)) * N * C * esz,
          BufferLife::kHost);
  // ---- workspace: the larger of a layer's and the head's scratch, in bytes ----
  // f32 scratch of the CPU kernels (a GEMM's row, attention's scores): a row is as long as a GEMM's
  // N or K, and LoRA's GEMMs have the rank there (x A^T: N = r; a folded group: N = its ranks' sum,
  // K = C + that sum), which lora.r past the model's widths made the longest (it overflowed the
  // workspace: an internal error).
  const int64_t fold_r = d.fold_r[0] + d.fold_r[1];
  const int64_t gemm_scratch = 2 * std::max({N, V, I, C, d.max_in, d.max_out, d.max_r, C + fold_r}) + 2 * T;
  // LoRA dropout's masked input and input gradient (unfolded projections; the MLP's per chunk)
  const int64_t dropout_ws = d.dropout ? 2 * std::max(N * std::max(C, q), NM * d.max_in) : 0;
  // The layer's projections dequantized (or widened, or converted) and the LoRA intermediates are
  // taken in the activation dtype: bf16 on the GPU holds the layer's weights in half the f32 bytes.
  // (every layer dequantized in a slot of its own, LlamaModelOptions::dequantized_layers: none of it here)
  const int64_t weights_ws = d.dequantized_layers >= L ? 0 : d.dequant_elems + d.fold_extra[0] + d.fold_extra[1];
  const int64_t layer_ws =
      (weights_ws + d.round_elems + dropout_ws + 2 * N * d.max_r) * esz +
      (gemm_scratch + std::max(d.fold_r[0], d.fold_r[1]) * C) * 4;  // (+ a fold group's A gradients, f32)
  // f32 logits, and their gradient in the activation dtype when the GEMM does not take f32 with the head
  // (CUDA: its GEMM takes one dtype for both operands; the CPU's takes f32 with any head, and the
  // gradient goes over the logits: LlamaModel::head_chunks)
  const int64_t dlogits_esz = backend == Backend::kCuda ? esz : 0;
  const int64_t head_ws = d.head_rows * V * (4 + dlogits_esz) + gemm_scratch * 4;
  p.add(layer_ws >= head_ws ? "workspace (a layer's scratch)" : "workspace (an LM-head chunk)",
        std::max(layer_ws, head_ws) + 64 * static_cast<int64_t>(Workspace::kAlign), BufferLife::kWorkspace);
  // ---- cuDNN's attention workspace (prepare_attention): past its limit the non-deterministic
  // backward, whose f32 dQ accumulator is about B*T*H*D*4 bytes (the estimate) ----
  // Soft-capped scores (Gemma 2): the eager attention's chunk of scores and the sequence's dK / dV.
  if (d.eager_attention)
    p.add("attention workspace (eager)", static_cast<int64_t>(eager_attention_layout(d.T, d.Hkv, d.D).bound),
          BufferLife::kLibrary);
  else if (backend == Backend::kCuda)
    p.add("attention workspace (cuDNN)", N * q * 4, BufferLife::kLibrary);
  return p;
}

int64_t llama_dequantized_layer_bytes(const LlamaBufferDims& d, DType act_t) {
  // a piece per projection at most (LlamaModel::dequantize_layer), each aligned
  const int64_t pieces = 7;
  const int64_t bytes = (d.dequant_elems + d.fold_extra[0] + d.fold_extra[1]) * static_cast<int64_t>(dtype_size(act_t)) +
                        pieces * kBufferAlign;
  return buffer_aligned(bytes);
}

void llama_buffer_aliases(const LlamaBufferDims& d, DType act_t, LlamaActivations& a) {
  // The head runs while no layer's backward does: its final norm's output and gradient use the
  // norms' gradient buffer and dq (the last layer's internals stay live in the working set; these
  // do not). The MLP's norm gradient (dh2) shares dh1's buffer (llama_buffer_plan).
  a.dh2 = a.dh1;
  if (!d.dropout) a.dm = a.m;  // the MLP's gradients: llama_buffer_plan
  if (!d.qk_norm) a.da = a.dh1;
  a.xf = a.dh1;
  if (d.H * d.D >= d.C) a.dxf = a.dq;
  // dk and dv packed in dq's buffer (llama_buffer_plan); side by side: LlamaModel's own pointers
  const size_t esz = dtype_size(act_t);
  a.dk = static_cast<uint8_t*>(a.dq) + static_cast<size_t>(d.N * d.H * d.D) * esz;
  a.dv = static_cast<uint8_t*>(a.dk) + static_cast<size_t>(d.N * d.Hkv * d.D) * esz;
}

}  // namespace qshard
