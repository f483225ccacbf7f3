// CUDA twin of attention_fwd / attention_bwd: cuDNN 9's fused SDPA (flash attention) through the
// cudnn-frontend graph API. Causal, grouped-query (kv heads divide q heads), bf16 in and out, f32
// softmax; q/k/v/out read in their [B,T,heads,D] storage by strides (no transposes). Saved state:
// the row statistics (log-sum-exp, f32 [B,H,T]) the backward needs. Graphs are built once per
// shape (prepare_attention at model construction; another shape builds on first use) and cached
// with their plans; the backward uses cuDNN's deterministic algorithm so a resumed run is bitwise
// the straight one on the same GPU. Its workspace grows with the batch's tokens (about 36 bytes a
// token per hidden unit at the 8B shape: 2.4 GB at 8 x 2048): past the limit (2 GiB) the backward
// runs in calls of fewer whole sequences (each sequence's attention is its own), the most whose
// workspace is within the limit, or, lean (set_attention_lean_workspace: a job with a memory
// budget), within what the non-deterministic algorithm would take with its f32 dQ accumulator.
// 8 x 2048 on an H100 (session 31): 2 calls of 4 (1.2 GB) 1.96 ms a layer, lean 4 calls of 2
// (0.6 GB) 2.16 ms, against the non-deterministic 1.84 ms (0.5 GB). Only where one sequence is past
// the bound (long sequences, or packed data past it) does the non-deterministic one run, with a note.
// cuDNN 9.10.0 and 9.10.1 are refused (known-bad SDPA).
// Packed data (AttentionPieces): the B*T rows as up to P sequences of their own in cuDNN's ragged
// layout (THD: each piece's rows where they are, found by element offsets; a padding mask with
// each piece's length; the row statistics ragged too, [B*T, H]); graphs of their own, for P.
// Scores (AttentionScores): the scale is the graphs' attn_scale. Soft-capped scores (Gemma 2) run
// the eager attention (attention_eager.cu) with its workspace here: cudnn-frontend's Softcap score
// modifier, with the causal mask and the window built inside it (cuDNN takes no built-in mask
// beside one), built its forward graph on an H200 with cuDNN 9.19, but the backward graph was
// refused by the frontend ("Attention score mod enabled and hence other subgraphs are disabled":
// commit 8628da6 has that code).
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "model/llama_ops.h"
#include "runtime/cuda_check.h"

namespace qshard::cuda {
namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

void check(fe::error_t e, const char* what) {
  if (e.is_bad()) throw Error(std::string("cuDNN attention: ") + what + ": " + e.get_message());
}

// The most workspace the deterministic backward may take in one call before it runs in chunks of
// sequences (or, where one sequence is past it, the non-deterministic one is used).
constexpr int64_t kAttentionWorkspaceLimit = int64_t{2} << 30;

// uids of the graphs' tensors
enum : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };
// uids of the ragged graphs' index tensors (AttentionPieces::ragged, ragged_layout's arrays)
enum : int64_t { kSeqQ = 20, kSeqKv, kOffQ, kOffK, kOffV, kOffO, kOffStats, kOffDO, kOffDQ, kOffDK, kOffDV };

struct Graphs {
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  int64_t fwd_ws = 0, bwd_ws = 0;
  int64_t bwd_batch = 0;         // sequences per backward call (the batch unless chunked)
  bool bwd_deterministic = true;
};

struct CudnnState {
  cudnnHandle_t handle = nullptr;
  std::mutex mu;
  // (B, T, H, Hkv, D, window, P, deterministic, scale, chunk, lean, ld): P > 0 the packed graphs of up
  // to P pieces; scale the graphs' attn_scale (scale_for(D)); chunk the backward's forced sequences a
  // call; lean the bound on its chunks' workspace; ld > 0 the backward's dQ / dK / dV rows ld apart
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, float, int64_t, bool, int64_t>,
           Graphs>
      graphs;
  bool deterministic = true;  // the backward's algorithm (set_attention_deterministic)
  int64_t chunk = 0;          // set_attention_backward_sequences (0: by the workspace limit)
  bool lean = false;          // set_attention_lean_workspace
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  void* eager = nullptr;  // the eager attention's workspace (soft-capped scores)
  size_t eager_bytes = 0;
  ~CudnnState() {
    graphs.clear();
    if (workspace) cudaFree(workspace);
    if (eager) cudaFree(eager);
    if (handle) cudnnDestroy(handle);
  }
};

CudnnState& state(DeviceContext& ctx) {
  if (!ctx.attention_handle()) {
    const size_t v = cudnnGetVersion();
    if (v == 91000 || v == 91001)
      throw Error("cuDNN " + std::to_string(v) + " is refused: its fused attention gives wrong results (9.10.0/9.10.1); "
                  "install another cuDNN 9");
    if (v < 90000) throw Error("cuDNN " + std::to_string(v) + " is too old: fused attention needs cuDNN 9");
    auto* s = new CudnnState();
    if (cudnnCreate(&s->handle) != CUDNN_STATUS_SUCCESS) {
      delete s;
      throw Error("cuDNN attention: cudnnCreate failed");
    }
    ctx.set_attention_handle(s, [](void* p) { delete static_cast<CudnnState*>(p); });
  }
  return *static_cast<CudnnState*>(ctx.attention_handle());
}

// [B, T, heads, D] storage as the [B, heads, T, D] tensor cuDNN wants.
fe::graph::Tensor_attributes bthd(const char* name, int64_t uid, int64_t B, int64_t T, int64_t heads, int64_t D) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({B, heads, T, D})
      .set_stride({T * heads * D, D, heads * D, 1});
}

// A graph with bf16 inputs and outputs, f32 intermediates and compute.
std::shared_ptr<fe::graph::Graph> bf16_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

void finish(fe::graph::Graph& g, cudnnHandle_t h, int64_t& ws, const char* what) {
  check(g.validate(), what);
  check(g.build_operation_graph(h), what);
  check(g.create_execution_plans({fe::HeurMode_t::A}), what);
  check(g.check_support(h), what);
  check(g.build_plans(h), what);
  check(g.get_workspace_size(ws), what);
}

// One input of a ragged graph: an int32 [n] index tensor (lengths or offsets).
TensorPtr index_tensor(fe::graph::Graph& g, const char* name, int64_t uid, int64_t n) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({n, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}

// window: a sliding window (0 < window < T); anything else is plain causal attention (one graph).
// P > 0: packed data's graphs (the rows as up to P ragged pieces). scores: the scale
// (scale_for(D)); no soft-cap (the eager attention's). ld > 0: the backward writes each token's dQ,
// dK and dV rows ld elements after the last (q|k|v's gradients side by side; packed, at the ragged
// layout's offsets made for those rows).
Graphs& graphs_for(DeviceContext& ctx, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t window,
                   int64_t P, AttentionScores scores, int64_t ld = 0) {
  CudnnState& s = state(ctx);
  std::lock_guard<std::mutex> lock(s.mu);
  if (window <= 0 || window >= T) window = 0;
  QS_CHECK(window <= std::numeric_limits<int>::max(), "attention: sliding window too large");
  const float scale = scores.scale_for(D);  // HF: head_dim ** -0.5, or Gemma's query_pre_attn_scalar ** -0.5
  QS_CHECK(scores.softcap <= 0.0f, "cuDNN attention: soft-capped scores are the eager attention's");
  QS_CHECK(ld == 0 || (ld >= H * D && ld >= Hkv * D && ld % 8 == 0),
           "cuDNN attention: gradient rows ld apart need ld >= the heads' width, a multiple of 8");
  const auto key = std::make_tuple(B, T, H, Hkv, D, window, P, s.deterministic, scale, s.chunk, s.lean, ld);
  auto it = s.graphs.find(key);
  if (it != s.graphs.end()) return it->second;
  QS_CHECK(Hkv > 0 && H % Hkv == 0, "attention: H must be a multiple of Hkv");
  const int64_t Bg = P > 0 ? P : B;  // the graphs' batch: the pieces when packed
  // A [B, T, heads, D] operand as cuDNN's [Bc, heads, T, D] (Bc: Bg, or a chunk of the sequences);
  // packed, each piece's rows found by the offsets `off` (the batch stride is then unused).
  auto operand = [&](fe::graph::Graph& g, const char* name, int64_t uid, int64_t heads, int64_t off_uid, int64_t Bc) {
    TensorPtr t = g.tensor(bthd(name, uid, Bc, T, heads, D));
    if (P > 0) t->set_ragged_offset(index_tensor(g, (std::string(name) + " offsets").c_str(), off_uid, P + 1));
    return t;
  };
  auto output = [&](fe::graph::Graph& g, const TensorPtr& t, const char* name, int64_t uid, int64_t heads,
                    int64_t off_uid, int64_t Bc, int64_t row = 0) {
    if (row == 0) row = heads * D;  // a token's heads to the next token's
    t->set_output(true).set_uid(uid).set_dim({Bc, heads, T, D}).set_stride({T * row, D, row, 1});
    if (P > 0) t->set_ragged_offset(index_tensor(g, (std::string(name) + " offsets").c_str(), off_uid, P + 1));
  };
  // The row statistics: [B, H, T] (BHSD), or packed [B*T, H] per row, ragged.
  auto stats_layout = [&](fe::graph::Graph& g, fe::graph::Tensor_attributes& t, int64_t Bc) {
    t.set_data_type(fe::DataType_t::FLOAT).set_dim({Bc, H, T, 1});
    if (P > 0)
      t.set_stride({H * T, 1, H, 1}).set_ragged_offset(index_tensor(g, "Stats offsets", kOffStats, P + 1));
    else
      t.set_stride({H * T, T, 1, 1});
  };
  auto masks = [&](fe::graph::Graph& g, auto& opts) {
    opts.set_causal_mask(true);
    // Keys u with u + window > t (cuDNN's top-left diagonal band: transformers' sliding window).
    if (window > 0) opts.set_diagonal_band_left_bound(static_cast<int>(window));
    if (P > 0)  // each piece its own sequence: keys of the piece only (its length both ways)
      opts.set_padding_mask(true)
          .set_seq_len_q(index_tensor(g, "piece lengths (q)", kSeqQ, P))
          .set_seq_len_kv(index_tensor(g, "piece lengths (kv)", kSeqKv, P))
          .set_max_total_seq_len_q(B * T)
          .set_max_total_seq_len_kv(B * T);
  };
  Graphs gr;
  {
    auto g = bf16_graph();
    TensorPtr q = operand(*g, "Q", kQ, H, kOffQ, Bg);
    TensorPtr k = operand(*g, "K", kK, Hkv, kOffK, Bg);
    TensorPtr v = operand(*g, "V", kV, Hkv, kOffV, Bg);
    auto opts = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(scale);
    masks(*g, opts);
    auto [o, stats] = g->sdpa(q, k, v, opts);
    output(*g, o, "O", kO, H, kOffO, Bg);
    stats->set_output(true).set_uid(kStats);
    stats_layout(*g, *stats, Bg);
    finish(*g, s.handle, gr.fwd_ws, "forward graph");
    gr.fwd = g;
  }
  auto backward_graph = [&](bool deterministic, int64_t Bc, int64_t& ws) {
    auto g = bf16_graph();
    TensorPtr q = operand(*g, "Q", kQ, H, kOffQ, Bc);
    TensorPtr k = operand(*g, "K", kK, Hkv, kOffK, Bc);
    TensorPtr v = operand(*g, "V", kV, Hkv, kOffV, Bc);
    TensorPtr o = operand(*g, "O", kO, H, kOffO, Bc);
    TensorPtr d_o = operand(*g, "dO", kDO, H, kOffDO, Bc);
    fe::graph::Tensor_attributes stats_attr;
    stats_attr.set_name("Stats").set_uid(kStats);
    stats_layout(*g, stats_attr, Bc);
    TensorPtr stats = g->tensor(stats_attr);
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("sdpa_backward")
                    .set_attn_scale(scale)
                    .set_deterministic_algorithm(deterministic);
    masks(*g, opts);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, opts);
    output(*g, dq, "dQ", kDQ, H, kOffDQ, Bc, ld);
    output(*g, dk, "dK", kDK, Hkv, kOffDK, Bc, ld);
    output(*g, dv, "dV", kDV, Hkv, kOffDV, Bc, ld);
    finish(*g, s.handle, ws, "backward graph");
    return g;
  };
  const bool forced = s.chunk > 0 && s.chunk < Bg && Bg % s.chunk == 0 && P == 0 && s.deterministic;
  gr.bwd = backward_graph(s.deterministic, forced ? s.chunk : Bg, gr.bwd_ws);
  gr.bwd_batch = forced ? s.chunk : Bg;
  gr.bwd_deterministic = s.deterministic;
  if (!forced && s.deterministic && gr.bwd_ws > kAttentionWorkspaceLimit) {
    // The deterministic backward's workspace grows with the tokens (it failed to allocate at
    // 131072 tokens next to the step's 65 GB on an H200). Calls of fewer whole sequences (unpacked
    // data: the batch stride separates them), the most whose workspace is within the bound; else
    // the non-deterministic one. Built here, at start-up.
    const int64_t det_ws = gr.bwd_ws;
    int64_t nd_ws = 0;
    std::shared_ptr<fe::graph::Graph> nd;
    int64_t bound = kAttentionWorkspaceLimit;
    if (s.lean) {  // no more than the non-deterministic backward and its f32 dQ accumulator
      nd = backward_graph(false, Bg, nd_ws);
      bound = std::min(bound, nd_ws + Bg * T * H * D * 4);
    }
    // From the largest chunk its workspace, taken as proportional to the sequences, would fit.
    const int64_t first = std::min(Bg / 2, static_cast<int64_t>(static_cast<double>(Bg) * bound / det_ws));
    for (int64_t b = P > 0 ? 0 : first; b >= 1; --b) {
      if (Bg % b != 0) continue;
      int64_t ws = 0;
      auto g = backward_graph(true, b, ws);
      if (ws <= bound) {
        gr.bwd = g;
        gr.bwd_ws = ws;
        gr.bwd_batch = b;
        break;
      }
    }
    if (gr.bwd_batch == Bg) {
      gr.bwd = nd ? nd : backward_graph(false, Bg, nd_ws);
      gr.bwd_ws = nd_ws;
      gr.bwd_deterministic = false;
      static std::once_flag noted;
      std::call_once(noted, [&] {
        std::fprintf(stderr,
                     "qshard: note: attention backward at %lld x %lld tokens%s: cuDNN's deterministic algorithm "
                     "wants %.1f GB of workspace%s; using the non-deterministic one (%.1f GB): attention gradients "
                     "are not bitwise repeatable at this length\n",
                     static_cast<long long>(B), static_cast<long long>(T), P > 0 ? " (packed)" : "", det_ws / 1e9,
                     P > 0 ? "" : ", one sequence a call too much", nd_ws / 1e9);
      });
    }
  }
  // One workspace for every graph, grown here (a build is start-up work, never inside a step
  // once prepare_attention has seen the step's shape).
  const int64_t need = std::max<int64_t>({gr.fwd_ws, gr.bwd_ws, 1});
  if (need > s.workspace_bytes) {
    if (s.workspace) {
      ctx.compute().synchronize();
      QS_CUDA_CHECK(cudaFree(s.workspace));
    }
    QS_CUDA_CHECK(cudaMalloc(&s.workspace, static_cast<size_t>(need)));
    s.workspace_bytes = need;
  }
  return s.graphs.emplace(key, std::move(gr)).first->second;
}

void run(DeviceContext& ctx, const fe::graph::Graph& g, std::unordered_map<int64_t, void*>& pack, const char* what) {
  CudnnState& s = state(ctx);
  if (cudnnSetStream(s.handle, static_cast<cudaStream_t>(ctx.stream())) != CUDNN_STATUS_SUCCESS)
    throw Error("cuDNN attention: cudnnSetStream failed");
  check(g.execute(s.handle, pack, s.workspace), what);
}

// The device pointers of ragged_layout's arrays, by uid: lengths (q and kv), offsets of q/out/dout
// (and dq), of k/v (and dk/dv), of the statistics; with gradient rows ld apart, dq's, dk's and
// dv's from the array made for them (ragged_layout's ld_dqkv).
void add_pieces(std::unordered_map<int64_t, void*>& pack, const AttentionPieces& pc, bool grads_ld = false) {
  auto* r = const_cast<int32_t*>(pc.ragged);
  const int64_t P = pc.max;
  int32_t *len = r, *off_q = r + P, *off_kv = off_q + P + 1, *off_stats = off_kv + P + 1, *off_grad = off_stats + P + 1;
  for (int64_t uid : {kSeqQ, kSeqKv}) pack[uid] = len;
  for (int64_t uid : {kOffQ, kOffO, kOffDO}) pack[uid] = off_q;
  for (int64_t uid : {kOffK, kOffV}) pack[uid] = off_kv;
  pack[kOffDQ] = grads_ld ? off_grad : off_q;
  for (int64_t uid : {kOffDK, kOffDV}) pack[uid] = grads_ld ? off_grad : off_kv;
  pack[kOffStats] = off_stats;
}

// The eager attention's workspace for sequences of T (grown here: start-up work in
// prepare_attention, never inside a step once it has seen the step's shape).
void* eager_workspace(DeviceContext& ctx, int64_t T, int64_t Hkv, int64_t D) {
  CudnnState& s = state(ctx);
  std::lock_guard<std::mutex> lock(s.mu);
  const size_t need = eager_attention_layout(T, Hkv, D).bound;
  if (need > s.eager_bytes) {
    if (s.eager) {
      ctx.compute().synchronize();
      QS_CUDA_CHECK(cudaFree(s.eager));
      s.eager = nullptr;
    }
    QS_CUDA_CHECK(cudaMalloc(&s.eager, need));
    s.eager_bytes = need;
  }
  return s.eager;
}

int64_t pieces_of(const AttentionPieces* pieces) {
  if (!pieces) return 0;
  QS_CHECK(pieces->ragged && pieces->max > 0, "attention: packed pieces without their ragged layout");
  return pieces->max;
}

}  // namespace

void set_attention_deterministic(DeviceContext& ctx, bool deterministic) {
  CudnnState& s = state(ctx);
  std::lock_guard<std::mutex> lock(s.mu);
  s.deterministic = deterministic;
}

bool prepare_attention(DeviceContext& ctx, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t window,
                       int64_t max_pieces, AttentionScores scores, int64_t ld_dqkv) {
  QS_CHECK(Hkv > 0 && H % Hkv == 0, "attention: H must be a multiple of Hkv");
  if (scores.softcap > 0.0f) {  // the eager attention: its workspace, no graphs (its order is fixed)
    eager_workspace(ctx, T, Hkv, D);
    return true;
  }
  bool deterministic = graphs_for(ctx, B, T, H, Hkv, D, window, 0, scores).bwd_deterministic;
  if (ld_dqkv > 0) deterministic &= graphs_for(ctx, B, T, H, Hkv, D, window, 0, scores, ld_dqkv).bwd_deterministic;
  if (max_pieces > 0) deterministic &= graphs_for(ctx, B, T, H, Hkv, D, window, max_pieces, scores).bwd_deterministic;
  if (max_pieces > 0 && ld_dqkv > 0)
    deterministic &= graphs_for(ctx, B, T, H, Hkv, D, window, max_pieces, scores, ld_dqkv).bwd_deterministic;
  return deterministic;
}

void attention_fwd(uint16_t* out, void* saved, const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t B,
                   int64_t T, int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window,
                   const AttentionPieces* pieces, AttentionScores scores) {
  if (scores.softcap > 0.0f) {
    eager_attention_fwd(out, saved, q, k, v, B, H, ctx, window, pieces ? pieces->pos : nullptr, scores,
                        eager_attention_layout(T, Hkv, D), eager_workspace(ctx, T, Hkv, D));
    return;
  }
  Graphs& gr = graphs_for(ctx, B, T, H, Hkv, D, window, pieces_of(pieces), scores);
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<uint16_t*>(q)},
                                             {kK, const_cast<uint16_t*>(k)},
                                             {kV, const_cast<uint16_t*>(v)},
                                             {kO, out},
                                             {kStats, saved}};
  if (pieces) add_pieces(pack, *pieces);
  run(ctx, *gr.fwd, pack, "forward");
}

void attention_bwd(uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout, const uint16_t* q,
                   const uint16_t* k, const uint16_t* v, const uint16_t* out, const void* saved, int64_t B, int64_t T,
                   int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window,
                   const AttentionPieces* pieces, AttentionScores scores, int64_t ld_dqkv) {
  QS_CHECK(ld_dqkv == 0 || scores.softcap <= 0.0f, "attention_bwd: gradient rows ld_dqkv apart are the fused kernels'");
  if (scores.softcap > 0.0f) {
    eager_attention_bwd(dq, dk, dv, dout, q, k, v, out, saved, B, H, ctx, window, pieces ? pieces->pos : nullptr,
                        scores, eager_attention_layout(T, Hkv, D), eager_workspace(ctx, T, Hkv, D));
    return;
  }
  Graphs& gr = graphs_for(ctx, B, T, H, Hkv, D, window, pieces_of(pieces), scores, ld_dqkv);
  // In chunks of gr.bwd_batch sequences (the whole batch unless its deterministic workspace was too
  // large): sequence c's rows start c T heads D elements in (its gradients' c T ld_dqkv with rows
  // that far apart), its statistics c H T floats in.
  const int64_t b = pieces ? B : gr.bwd_batch;
  for (int64_t c = 0; c < B; c += b) {
    const int64_t oq = c * T * H * D, okv = c * T * Hkv * D;
    const int64_t odq = ld_dqkv > 0 ? c * T * ld_dqkv : oq, odkv = ld_dqkv > 0 ? c * T * ld_dqkv : okv;
    std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<uint16_t*>(q + oq)},
                                               {kK, const_cast<uint16_t*>(k + okv)},
                                               {kV, const_cast<uint16_t*>(v + okv)},
                                               {kO, const_cast<uint16_t*>(out + oq)},
                                               {kDO, const_cast<uint16_t*>(dout + oq)},
                                               {kStats, static_cast<float*>(const_cast<void*>(saved)) + c * H * T},
                                               {kDQ, dq + odq},
                                               {kDK, dk + odkv},
                                               {kDV, dv + odkv}};
    if (pieces) add_pieces(pack, *pieces, ld_dqkv > 0);
    run(ctx, *gr.bwd, pack, "backward");
  }
}

void set_attention_lean_workspace(DeviceContext& ctx, bool lean) {
  CudnnState& s = state(ctx);
  std::lock_guard<std::mutex> lock(s.mu);
  s.lean = lean;
}

void set_attention_backward_sequences(DeviceContext& ctx, int64_t n) {
  QS_CHECK(n >= 0, "attention: sequences a backward call must be >= 0");
  CudnnState& s = state(ctx);
  std::lock_guard<std::mutex> lock(s.mu);
  s.chunk = n;
}

AttentionBackwardPlan attention_backward_plan(DeviceContext& ctx, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                              int64_t D, int64_t window, int64_t max_pieces, AttentionScores scores) {
  if (scores.softcap > 0.0f) return {B, true, static_cast<int64_t>(eager_attention_layout(T, Hkv, D).bound)};
  const Graphs& gr = graphs_for(ctx, B, T, H, Hkv, D, window, max_pieces, scores);
  return {max_pieces > 0 ? B : gr.bwd_batch, gr.bwd_deterministic, gr.bwd_ws};
}

}  // namespace qshard::cuda
