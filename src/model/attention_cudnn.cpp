// CUDA twin of attention_fwd / attention_bwd: cuDNN 9's fused SDPA (flash attention) through the
// cudnn-frontend graph API. Causal, grouped-query (kv heads divide q heads), bf16 in and out, f32
// softmax; q/k/v/out read in their [B,T,heads,D] storage by strides (no transposes). Saved state:
// the row statistics (log-sum-exp, f32 [B,H,T]) the backward needs. Graphs are built once per
// shape (prepare_attention at model construction; another shape builds on first use) and cached
// with their plans; the backward uses cuDNN's deterministic algorithm so a resumed run is bitwise
// the straight one on the same GPU. cuDNN 9.10.0 and 9.10.1 are refused (known-bad SDPA).
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
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

// The most workspace the deterministic backward may take before the non-deterministic one is used.
int64_t attention_workspace_limit() { return int64_t{2} << 30; }

// uids of the graphs' tensors
enum : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct Graphs {
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  int64_t fwd_ws = 0, bwd_ws = 0;
};

struct CudnnState {
  cudnnHandle_t handle = nullptr;
  std::mutex mu;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>, Graphs> graphs;  // (B, T, H, Hkv, D, window)
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  ~CudnnState() {
    graphs.clear();
    if (workspace) cudaFree(workspace);
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

// window: a sliding window (0 < window < T); anything else is plain causal attention (one graph).
Graphs& graphs_for(DeviceContext& ctx, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t window) {
  CudnnState& s = state(ctx);
  std::lock_guard<std::mutex> lock(s.mu);
  if (window <= 0 || window >= T) window = 0;
  QS_CHECK(window <= std::numeric_limits<int>::max(), "attention: sliding window too large");
  const auto key = std::make_tuple(B, T, H, Hkv, D, window);
  auto it = s.graphs.find(key);
  if (it != s.graphs.end()) return it->second;
  QS_CHECK(Hkv > 0 && H % Hkv == 0, "attention: H must be a multiple of Hkv");
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));  // HF: head_dim ** -0.5
  Graphs gr;
  {
    auto g = bf16_graph();
    TensorPtr q = g->tensor(bthd("Q", kQ, B, T, H, D));
    TensorPtr k = g->tensor(bthd("K", kK, B, T, Hkv, D));
    TensorPtr v = g->tensor(bthd("V", kV, B, T, Hkv, D));
    auto opts = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(scale).set_causal_mask(true);
    // Keys u with u + window > t (cuDNN's top-left diagonal band: transformers' sliding window).
    if (window > 0) opts.set_diagonal_band_left_bound(static_cast<int>(window));
    auto [o, stats] = g->sdpa(q, k, v, opts);
    o->set_output(true).set_uid(kO).set_dim({B, H, T, D}).set_stride({T * H * D, D, H * D, 1});
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({B, H, T, 1}).set_stride(
        {H * T, T, 1, 1});
    finish(*g, s.handle, gr.fwd_ws, "forward graph");
    gr.fwd = g;
  }
  auto backward_graph = [&](bool deterministic, int64_t& ws) {
    auto g = bf16_graph();
    TensorPtr q = g->tensor(bthd("Q", kQ, B, T, H, D));
    TensorPtr k = g->tensor(bthd("K", kK, B, T, Hkv, D));
    TensorPtr v = g->tensor(bthd("V", kV, B, T, Hkv, D));
    TensorPtr o = g->tensor(bthd("O", kO, B, T, H, D));
    TensorPtr d_o = g->tensor(bthd("dO", kDO, B, T, H, D));
    TensorPtr stats = g->tensor(fe::graph::Tensor_attributes()
                                    .set_name("Stats")
                                    .set_uid(kStats)
                                    .set_dim({B, H, T, 1})
                                    .set_stride({H * T, T, 1, 1})
                                    .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("sdpa_backward")
                    .set_attn_scale(scale)
                    .set_causal_mask(true)
                    .set_deterministic_algorithm(deterministic);
    if (window > 0) opts.set_diagonal_band_left_bound(static_cast<int>(window));
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, opts);
    dq->set_output(true).set_uid(kDQ).set_dim({B, H, T, D}).set_stride({T * H * D, D, H * D, 1});
    dk->set_output(true).set_uid(kDK).set_dim({B, Hkv, T, D}).set_stride({T * Hkv * D, D, Hkv * D, 1});
    dv->set_output(true).set_uid(kDV).set_dim({B, Hkv, T, D}).set_stride({T * Hkv * D, D, Hkv * D, 1});
    finish(*g, s.handle, ws, "backward graph");
    return g;
  };
  gr.bwd = backward_graph(true, gr.bwd_ws);
  // The deterministic backward's workspace grows with the sequence (it failed to allocate at
  // 131072 tokens next to the step's 65 GB on an H200): past attention_workspace_limit() the
  // non-deterministic algorithm (an f32 dQ accumulator, ~B*H*T*D*4 bytes) takes over. The same
  // run is then not bitwise repeatable in its attention gradients; a note says so once.
  if (gr.bwd_ws > attention_workspace_limit()) {
    const int64_t det_ws = gr.bwd_ws;
    gr.bwd = backward_graph(false, gr.bwd_ws);
    static std::once_flag noted;
    std::call_once(noted, [&] {
      std::fprintf(stderr,
                   "qshard: note: attention backward at %lld x %lld tokens: cuDNN's deterministic algorithm wants "
                   "%.1f GB of workspace; using the non-deterministic one (%.1f GB): attention gradients are not "
                   "bitwise repeatable at this length\n",
                   static_cast<long long>(B), static_cast<long long>(T), det_ws / 1e9, gr.bwd_ws / 1e9);
    });
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

}  // namespace

void prepare_attention(DeviceContext& ctx, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t window) {
  graphs_for(ctx, B, T, H, Hkv, D, window);
}

void attention_fwd(uint16_t* out, void* saved, const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t B,
                   int64_t T, int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window) {
  Graphs& gr = graphs_for(ctx, B, T, H, Hkv, D, window);
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<uint16_t*>(q)},
                                             {kK, const_cast<uint16_t*>(k)},
                                             {kV, const_cast<uint16_t*>(v)},
                                             {kO, out},
                                             {kStats, saved}};
  run(ctx, *gr.fwd, pack, "forward");
}

void attention_bwd(uint16_t* dq, uint16_t* dk, uint16_t* dv, const uint16_t* dout, const uint16_t* q,
                   const uint16_t* k, const uint16_t* v, const uint16_t* out, const void* saved, int64_t B, int64_t T,
                   int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window) {
  Graphs& gr = graphs_for(ctx, B, T, H, Hkv, D, window);
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<uint16_t*>(q)},   {kK, const_cast<uint16_t*>(k)},
                                             {kV, const_cast<uint16_t*>(v)},   {kO, const_cast<uint16_t*>(out)},
                                             {kDO, const_cast<uint16_t*>(dout)}, {kStats, const_cast<void*>(saved)},
                                             {kDQ, dq},                        {kDK, dk},
                                             {kDV, dv}};
  run(ctx, *gr.bwd, pack, "backward");
}

}  // namespace qshard::cuda
