// The one dispatch of llama_ops.h: activation pointers in ctx.activation_dtype(), the twin of
// ctx.backend(). The CUDA twins come with the CUDA training step; until then a CUDA context
// reaching an op is an error naming the op (the trainer refuses device: cuda before that).
#include "model/llama_ops.h"

#include <string>

#include "runtime/error.h"

namespace qshard::ops {
namespace {

float* f(void* p) { return static_cast<float*>(p); }
const float* f(const void* p) { return static_cast<const float*>(p); }

void require_cpu(const DeviceContext& ctx, const char* op) {
  if (ctx.backend() != Backend::kCpu)
    throw Error(std::string("op ") + op + ": no " + backend_name(ctx.backend()) + " implementation in this build");
}

}  // namespace

bool has_backend(Backend backend) { return backend == Backend::kCpu; }

void gemm(void* C, const void* A, const void* B, const GemmShape& s, DeviceContext& ctx) {
  require_cpu(ctx, "gemm");
  cpu::gemm(f(C), f(A), B, s, ctx);
}
void embedding_fwd(void* out, const int64_t* ids, const void* weight, DType weight_type, int64_t N, int64_t C,
                   int64_t V, DeviceContext& ctx) {
  require_cpu(ctx, "embedding_fwd");
  cpu::embedding_fwd(f(out), ids, weight, weight_type, N, C, V, ctx);
}
void rmsnorm_fwd(void* out, float* rstd, const void* x, const float* weight, int64_t N, int64_t C, float eps,
                 DeviceContext& ctx) {
  require_cpu(ctx, "rmsnorm_fwd");
  cpu::rmsnorm_fwd(f(out), rstd, f(x), weight, N, C, eps, ctx);
}
void rmsnorm_bwd(void* dx, const void* dout, const void* x, const float* weight, const float* rstd, int64_t N,
                 int64_t C, DeviceContext& ctx) {
  require_cpu(ctx, "rmsnorm_bwd");
  cpu::rmsnorm_bwd(f(dx), f(dout), f(x), weight, rstd, N, C, ctx);
}
void add(void* out, const void* a, const void* b, int64_t n, DeviceContext& ctx) {
  require_cpu(ctx, "add");
  cpu::add(f(out), f(a), f(b), n, ctx);
}
void accumulate(void* out, const void* b, int64_t n, DeviceContext& ctx) {
  require_cpu(ctx, "accumulate");
  cpu::accumulate(f(out), f(b), n, ctx);
}
void copy(void* out, const void* x, int64_t n, DeviceContext& ctx) {
  require_cpu(ctx, "copy");
  cpu::copy(f(out), f(x), n, ctx);
}
void zero(void* x, int64_t n, DeviceContext& ctx) {
  require_cpu(ctx, "zero");
  cpu::zero(f(x), n, ctx);
}
void add_bias(void* y, const float* bias, int64_t N, int64_t W, DeviceContext& ctx) {
  require_cpu(ctx, "add_bias");
  cpu::add_bias(f(y), bias, N, W, ctx);
}
void to_f32(float* out, const void* x, DType type, int64_t n, DeviceContext& ctx) {
  require_cpu(ctx, "to_f32");
  cpu::to_f32(out, x, type, n, ctx);
}
void rope_tables(float* cos, float* sin, const RopeParams& p, int64_t T, DeviceContext& ctx) {
  require_cpu(ctx, "rope_tables");
  cpu::rope_tables(cos, sin, p, T, ctx);
}
void rope_fwd(void* x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
              DeviceContext& ctx) {
  require_cpu(ctx, "rope_fwd");
  cpu::rope_fwd(f(x), cos, sin, B, T, nh, D, ctx);
}
void rope_bwd(void* dx, const float* cos, const float* sin, int64_t B, int64_t T, int64_t nh, int64_t D,
              DeviceContext& ctx) {
  require_cpu(ctx, "rope_bwd");
  cpu::rope_bwd(f(dx), cos, sin, B, T, nh, D, ctx);
}
void attention_fwd(void* out, void* saved, const void* q, const void* k, const void* v, int64_t B, int64_t T,
                   int64_t H, int64_t Hkv, int64_t D, DeviceContext& ctx) {
  require_cpu(ctx, "attention_fwd");
  cpu::attention_fwd(f(out), saved, f(q), f(k), f(v), B, T, H, Hkv, D, ctx);
}
void attention_bwd(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                   const void* out, const void* saved, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                   DeviceContext& ctx) {
  require_cpu(ctx, "attention_bwd");
  cpu::attention_bwd(f(dq), f(dk), f(dv), f(dout), f(q), f(k), f(v), f(out), saved, B, T, H, Hkv, D, ctx);
}
void swiglu_fwd(void* h, const void* gate, const void* up, int64_t n, DeviceContext& ctx) {
  require_cpu(ctx, "swiglu_fwd");
  cpu::swiglu_fwd(f(h), f(gate), f(up), n, ctx);
}
void swiglu_bwd(void* dgate, void* dup, const void* dh, const void* gate, const void* up, int64_t n,
                DeviceContext& ctx) {
  require_cpu(ctx, "swiglu_bwd");
  cpu::swiglu_bwd(f(dgate), f(dup), f(dh), f(gate), f(up), n, ctx);
}
void dropout_fwd(void* out, const void* x, const DropoutKey& key, int64_t N, int64_t W, DeviceContext& ctx) {
  require_cpu(ctx, "dropout_fwd");
  cpu::dropout_fwd(f(out), f(x), key, N, W, ctx);
}
void cross_entropy_fwd_bwd(void* logits, double* loss_sum, const int64_t* targets, int64_t n, int64_t V,
                           float grad_scale, DeviceContext& ctx) {
  require_cpu(ctx, "cross_entropy_fwd_bwd");
  cpu::cross_entropy_fwd_bwd(f(logits), loss_sum, targets, n, V, grad_scale, ctx);
}
void round_to_dtype(void* x, int64_t n, DType dtype, DeviceContext& ctx) {
  require_cpu(ctx, "round_to_dtype");
  cpu::round_to_dtype(f(x), n, dtype, ctx);
}

void dequantize_4bit(void* out, const Dequant4bitArgs& args, DType dtype, DeviceContext& ctx) {
  require_cpu(ctx, "dequantize_4bit");
  dequantize_4bit_args_cpu(args, f(out));
  cpu::round_to_dtype(f(out), args.n, dtype, ctx);
}

}  // namespace qshard::ops
