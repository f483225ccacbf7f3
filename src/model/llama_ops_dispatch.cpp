// The one dispatch of llama_ops.h: activation pointers in ctx.activation_dtype(), the twin of
// ctx.backend(). CUDA builds have the CUDA twins of every op; attention's (cuDNN's fused SDPA)
// needs cuDNN and the cudnn-frontend headers at build time (QSHARD_WITH_CUDNN); has_backend() says
// which exist.
#include <cstring>
#include <string>

#include "model/llama_ops.h"
#include "runtime/accumulate.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace qshard::ops {
namespace {

float* f(void* p) { return static_cast<float*>(p); }
const float* f(const void* p) { return static_cast<const float*>(p); }
#if QSHARD_WITH_CUDA
uint16_t* h(void* p) { return static_cast<uint16_t*>(p); }
const uint16_t* h(const void* p) { return static_cast<const uint16_t*>(p); }
#endif

// The ops of cuDNN's fused attention (attention_cached_fwd is a kernel of this project's own).
[[maybe_unused]] bool is_attention(const char* op) {
  return op && std::strncmp(op, "attention", 9) == 0 && std::strcmp(op, "attention_cached_fwd") != 0;
}

}  // namespace

bool has_backend(Backend backend, const char* op) {
  if (backend == Backend::kCpu) return true;
#if QSHARD_WITH_CUDA && QSHARD_WITH_CUDNN
  (void)is_attention;
  (void)op;
  return true;
#elif QSHARD_WITH_CUDA
  return !is_attention(op);
#else
  (void)op;
  return false;
#endif
}

// The twin of ctx.backend() (runtime/dispatch.h: a CPU build has no CUDA twins).
#define QS_DISPATCH(op, cpu_call, cuda_call) QS_DISPATCH_TWIN(ctx.backend() == Backend::kCpu, op, cpu_call, cuda_call)

void prepare(DeviceContext& ctx) { QS_DISPATCH("prepare", (void)0, cuda::prepare(ctx)); }

void gemm(void* C, const void* A, const void* B, const GemmShape& s, DeviceContext& ctx) {
  QS_DISPATCH("gemm", cpu::gemm(f(C), f(A), B, s, ctx), cuda::gemm(C, A, B, s, ctx));
}
void gemm_into(void* D, const void* A, const void* B, const void* C, const GemmShape& s, DeviceContext& ctx) {
  QS_DISPATCH("gemm", cpu::gemm_into(f(D), f(A), B, f(C), s, ctx), cuda::gemm_into(D, A, B, C, s, ctx));
}
void embedding_fwd(void* out, const int64_t* ids, const void* weight, DType weight_type, int64_t N, int64_t C,
                   int64_t V, DeviceContext& ctx, float scale) {
  QS_DISPATCH("embedding_fwd", cpu::embedding_fwd(f(out), ids, weight, weight_type, N, C, V, ctx, scale),
              cuda::embedding_fwd(h(out), ids, weight, weight_type, N, C, V, ctx, scale));
}
void rmsnorm_fwd(void* out, float* rstd, const void* x, const float* weight, int64_t N, int64_t C, float eps,
                 DeviceContext& ctx, int64_t ld_out) {
  QS_DISPATCH("rmsnorm_fwd", cpu::rmsnorm_fwd(f(out), rstd, f(x), weight, N, C, eps, ctx, ld_out),
              cuda::rmsnorm_fwd(h(out), rstd, h(x), weight, N, C, eps, ctx, ld_out));
}
void rmsnorm_bwd(void* dx, const void* dout, const void* x, const float* weight, const float* rstd, int64_t N,
                 int64_t C, DeviceContext& ctx, int64_t ld_dout) {
  QS_DISPATCH("rmsnorm_bwd", cpu::rmsnorm_bwd(f(dx), f(dout), f(x), weight, rstd, N, C, ctx, ld_dout),
              cuda::rmsnorm_bwd(h(dx), h(dout), h(x), weight, rstd, N, C, ctx, ld_dout));
}
void add(void* out, const void* a, const void* b, int64_t n, DeviceContext& ctx) {
  QS_DISPATCH("add", cpu::add(f(out), f(a), f(b), n, ctx), cuda::add(h(out), h(a), h(b), n, ctx));
}
void accumulate(void* out, const void* b, int64_t n, DeviceContext& ctx) {
  QS_DISPATCH("accumulate", cpu::accumulate(f(out), f(b), n, ctx), cuda::accumulate(h(out), h(b), n, ctx));
}
void accumulate_f32(float* out, const float* b, int64_t n, DeviceContext& ctx) {
  // runtime/accumulate.h's twins (the sharded manager's gradient accumulation: one kernel for both).
  QS_DISPATCH("accumulate_f32", qshard::cpu::accumulate_f32(out, b, n, ctx.stream()),
              qshard::cuda::accumulate_f32(out, b, n, ctx.stream()));
}
void copy(void* out, const void* x, int64_t n, DeviceContext& ctx) {
  QS_DISPATCH("copy", cpu::copy(f(out), f(x), n, ctx), cuda::copy(h(out), h(x), n, ctx));
}
void zero(void* x, int64_t n, DeviceContext& ctx) {
  QS_DISPATCH("zero", cpu::zero(f(x), n, ctx), cuda::zero(h(x), n, ctx));
}
void copy_2d(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows, int64_t cols, float scale,
             DeviceContext& ctx) {
  QS_DISPATCH("copy_2d", cpu::copy_2d(f(dst), ld_dst, src ? f(src) : nullptr, ld_src, rows, cols, scale, ctx),
              cuda::copy_2d(h(dst), ld_dst, src ? h(src) : nullptr, ld_src, rows, cols, scale, ctx));
}
void copy_2d_batch(const Copy2dBlock* blocks, int count, DeviceContext& ctx) {
  QS_DISPATCH("copy_2d_batch", cpu::copy_2d_batch(blocks, count, ctx), cuda::copy_2d_batch(blocks, count, ctx));
}
void add_bias(void* y, const float* bias, int64_t N, int64_t W, DeviceContext& ctx) {
  QS_DISPATCH("add_bias", cpu::add_bias(f(y), bias, N, W, ctx), cuda::add_bias(h(y), bias, N, W, ctx));
}
void to_f32(float* out, const void* x, DType type, int64_t n, DeviceContext& ctx, float offset) {
  QS_DISPATCH("to_f32", cpu::to_f32(out, x, type, n, ctx, offset), cuda::to_f32(out, x, type, n, ctx, offset));
}
void rope_tables(float* cos, float* sin, const RopeParams& p, int64_t T, DeviceContext& ctx) {
  QS_DISPATCH("rope_tables", cpu::rope_tables(cos, sin, p, T, ctx), cuda::rope_tables(cos, sin, p, T, ctx));
}
void rope_fwd(void* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
              DeviceContext& ctx, const int64_t* pos, int64_t ld) {
  QS_DISPATCH("rope_fwd", cpu::rope_fwd(f(x), cos, sin, B, T, nh, D, ctx, pos, ld),
              cuda::rope_fwd(h(x), cos, sin, B, T, nh, D, ctx, pos, ld));
}
void rope_bwd(void* dx, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
              DeviceContext& ctx, const int64_t* pos, int64_t ld) {
  QS_DISPATCH("rope_bwd", cpu::rope_bwd(f(dx), cos, sin, B, T, nh, D, ctx, pos, ld),
              cuda::rope_bwd(h(dx), cos, sin, B, T, nh, D, ctx, pos, ld));
}
#if QSHARD_WITH_CUDA && QSHARD_WITH_CUDNN
#define QS_DISPATCH_ATTENTION QS_DISPATCH
#else
#define QS_DISPATCH_ATTENTION(op, cpu_call, cuda_call) \
  do {                                                 \
    if (ctx.backend() != Backend::kCpu) missing_twin(op, backend_name(ctx.backend())); \
    cpu_call;                                          \
  } while (0)
#endif
void set_attention_lean_workspace(DeviceContext& ctx, bool lean) {
#if QSHARD_WITH_CUDA && QSHARD_WITH_CUDNN
  if (ctx.backend() == Backend::kCuda) cuda::set_attention_lean_workspace(ctx, lean);
#else
  (void)ctx;
  (void)lean;
#endif
}
bool prepare_attention(DeviceContext& ctx, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t window,
                       int64_t max_pieces, AttentionScores scores, int64_t ld_dqkv) {
  bool deterministic = true;  // the CPU's attention is
  QS_DISPATCH_ATTENTION("prepare_attention", ((void)window, (void)max_pieces, (void)scores, (void)ld_dqkv),
                        deterministic = cuda::prepare_attention(ctx, B, T, H, Hkv, D, window, max_pieces, scores,
                                                                ld_dqkv));
  return deterministic;
}
void attention_fwd(void* out, void* saved, const void* q, const void* k, const void* v, int64_t B, int64_t T,
                   int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window,
                   const AttentionPieces* pieces, AttentionScores scores) {
  QS_DISPATCH_ATTENTION("attention_fwd",
                        cpu::attention_fwd(f(out), saved, f(q), f(k), f(v), B, T, H, Hkv, D, ctx, window,
                                           pieces ? pieces->pos : nullptr, scores),
                        cuda::attention_fwd(h(out), saved, h(q), h(k), h(v), B, T, H, Hkv, D, ctx, window, pieces,
                                            scores));
}
void attention_cached_fwd(void* out, const void* q, const void* k_cache, const void* v_cache, int64_t T, int64_t P,
                          int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx, int64_t window,
                          AttentionScores scores) {
  QS_DISPATCH("attention_cached_fwd",
              cpu::attention_cached_fwd(f(out), f(q), f(k_cache), f(v_cache), T, P, H, Hkv, D, ctx, window, scores),
              cuda::attention_cached_fwd(h(out), h(q), h(k_cache), h(v_cache), T, P, H, Hkv, D, ctx, window, scores));
}
void attention_bwd(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                   const void* out, const void* saved, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                   DeviceContext& ctx, int64_t window, const AttentionPieces* pieces, AttentionScores scores,
                   int64_t ld_dqkv) {
  QS_DISPATCH_ATTENTION(
      "attention_bwd",
      cpu::attention_bwd(f(dq), f(dk), f(dv), f(dout), f(q), f(k), f(v), f(out), saved, B, T, H, Hkv, D, ctx, window,
                         pieces ? pieces->pos : nullptr, scores, ld_dqkv),
      cuda::attention_bwd(h(dq), h(dk), h(dv), h(dout), h(q), h(k), h(v), h(out), saved, B, T, H, Hkv, D, ctx,
                          window, pieces, scores, ld_dqkv));
}
void swiglu_fwd(void* hh, const void* gate, const void* up, int64_t n, DeviceContext& ctx, GatedAct act) {
  QS_DISPATCH("swiglu_fwd", cpu::swiglu_fwd(f(hh), f(gate), f(up), n, ctx, act),
              cuda::swiglu_fwd(h(hh), h(gate), h(up), n, ctx, act));
}
void swiglu_bwd(void* dgate, void* dup, const void* dh, const void* gate, const void* up, int64_t n,
                DeviceContext& ctx, GatedAct act) {
  QS_DISPATCH("swiglu_bwd", cpu::swiglu_bwd(f(dgate), f(dup), f(dh), f(gate), f(up), n, ctx, act),
              cuda::swiglu_bwd(h(dgate), h(dup), h(dh), h(gate), h(up), n, ctx, act));
}
void dropout_fwd(void* out, const void* x, const DropoutKey& key, int64_t N, int64_t W, DeviceContext& ctx) {
  QS_DISPATCH("dropout_fwd", cpu::dropout_fwd(f(out), f(x), key, N, W, ctx),
              cuda::dropout_fwd(h(out), h(x), key, N, W, ctx));
}
void cross_entropy_fwd_bwd(void* logits, double* loss_sum, const int64_t* targets, int64_t n, int64_t V,
                           float grad_scale, DeviceContext& ctx, void* dlogits, DType dlogits_type, float softcap) {
  // The CPU: the gradient in place, then converted (or copied) where it was asked for.
  QS_DISPATCH("cross_entropy_fwd_bwd",
              (cpu::cross_entropy_fwd_bwd(f(logits), loss_sum, targets, n, V, grad_scale, ctx, softcap),
               dlogits && dlogits != logits && grad_scale != 0.0f
                   ? cpu::convert(dlogits, dlogits_type, logits, DType::kF32, n * V, ctx)
                   : (void)0),
              cuda::cross_entropy_fwd_bwd(f(logits), loss_sum, targets, n, V, grad_scale, ctx, dlogits, dlogits_type,
                                          softcap));
}
void logit_softcap(float* x, int64_t n, float cap, DeviceContext& ctx) {
  QS_DISPATCH("logit_softcap", cpu::logit_softcap(x, n, cap, ctx), cuda::logit_softcap(x, n, cap, ctx));
}
void round_to_dtype(void* x, int64_t n, DType dtype, DeviceContext& ctx) {
  QS_DISPATCH("round_to_dtype", cpu::round_to_dtype(f(x), n, dtype, ctx),
              cuda::round_to_dtype(f(x), n, dtype, ctx));
}
void convert(void* out, DType out_type, const void* x, DType x_type, int64_t n, DeviceContext& ctx) {
  QS_DISPATCH("convert", cpu::convert(out, out_type, x, x_type, n, ctx),
              cuda::convert(out, out_type, x, x_type, n, ctx));
}
bool gemm_supports(const DeviceContext& ctx, DType a_type, DType b_type) {
  if (ctx.backend() == Backend::kCpu) return a_type == DType::kF32;
  return a_type == b_type;
}
void upload_async(void* dst, const void* src, size_t bytes, DeviceContext& ctx) {
  if (bytes == 0) return;
  QS_DISPATCH("upload_async", std::memcpy(dst, src, bytes), cuda::upload(dst, src, bytes, ctx));
}
// The forward's operand: the CPU GEMM reads the f32 products as they are; CUDA writes bf16 with
// one rounding.
void dequantize_4bit(void* out, const Dequant4bitArgs& args, DeviceContext& ctx) {
  QS_DISPATCH("dequantize_4bit", cpu::dequantize_4bit(args, out, DType::kF32, ctx.stream()),
              qshard::cuda::dequantize_4bit(args, out, ctx.activation_dtype(), ctx.stream()));
}
void dequantize_4bit_batch(void* const* outs, const Dequant4bitArgs* args, int count, DeviceContext& ctx) {
  if (count == 0) return;
  QS_DISPATCH("dequantize_4bit_batch", cpu::dequantize_4bit_batch(args, outs, count, DType::kF32, ctx.stream()),
              qshard::cuda::dequantize_4bit_batch(args, outs, count, ctx.activation_dtype(), ctx.stream()));
}
bool dequant_rules_differ(const DeviceContext& ctx, DType quant_dtype) {
  return quant_dtype != DType::kF32 && quant_dtype != ctx.activation_dtype();
}
// The backward's operand: the same products rounded through quant_dtype (the CPU rounds the f32
// values in place; CUDA dequantizes into quant_dtype, then converts in place, element by element).
void dequantize_4bit_rounded(void* out, const Dequant4bitArgs& args, DType quant_dtype, DeviceContext& ctx) {
  if (!dequant_rules_differ(ctx, quant_dtype)) {
    dequantize_4bit(out, args, ctx);
    return;
  }
  QS_DISPATCH("dequantize_4bit_rounded",
              {
                cpu::dequantize_4bit(args, out, DType::kF32, ctx.stream());
                if (args.out_ld != 0 && args.out_ld != args.row_len) {
                  for (int64_t r = 0; r < args.n / args.row_len; ++r)
                    cpu::round_to_dtype(f(out) + r * args.out_ld, args.row_len, quant_dtype, ctx);
                } else {
                  cpu::round_to_dtype(f(out), args.n, quant_dtype, ctx);
                }
              },
              {
                QS_CHECK(args.out_ld == 0 || args.out_ld == args.row_len,
                         "dequantize_4bit_rounded: CUDA writes a packed weight");
                qshard::cuda::dequantize_4bit(args, out, quant_dtype, ctx.stream());
                cuda::convert(out, ctx.activation_dtype(), out, quant_dtype, args.n, ctx);
              });
}

}  // namespace qshard::ops
