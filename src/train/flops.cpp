#include "train/flops.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "model/llama_ops.h"
#include "runtime/allocator.h"
#include "runtime/stream.h"

namespace qshard {

double useful_flops_per_token(const LlamaConfig& c, int64_t T, uint64_t lora_parameters) {
  const double C = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  const double H = static_cast<double>(c.num_attention_heads), Hkv = static_cast<double>(c.num_key_value_heads);
  const double D = static_cast<double>(c.head_dim), L = static_cast<double>(c.num_hidden_layers);
  const double per_layer = C * H * D * 2 + C * Hkv * D * 2 + 3 * C * I;  // q, o; k, v; gate, up, down
  const double base = L * per_layer + static_cast<double>(c.vocab_size) * C;
  // A sliding window (Mistral; Gemma's sliding layers) bounds the keys a query reads at sliding_window.
  double keys = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const int64_t w = layer_window(c, l);
    keys += static_cast<double>(w > 0 ? std::min(T, w) : T);
  }
  const double attention = 12.0 * H * D * keys;
  return 4.0 * base + attention + 6.0 * static_cast<double>(lora_parameters);
}

double measure_gemm_flops(DeviceContext& ctx) {
  if (!ctx.is_cuda()) return 0.0;
  constexpr int64_t n = 8192;
  const Device dev = ctx.compute_device();
  // Random operands (zeros run faster than real data: the tensor cores draw less power).
  std::vector<float> host(static_cast<size_t>(n * n));
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (float& v : host) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = static_cast<float>(static_cast<double>(x >> 40) / 16777216.0 - 0.5);
  }
  const Tensor r = Tensor::from_f32({n, n}, DType::kBF16, host);
  Tensor a = r.to(dev), b = r.to(dev);
  Tensor c = Tensor::zeros({n, n}, DType::kBF16, dev);
  GemmShape s{n, n, n, false, true};
  s.a_type = s.b_type = s.c_type = DType::kBF16;
  ops::prepare(ctx);
  for (int i = 0; i < 3; ++i) ops::gemm(c.raw(), a.raw(), b.raw(), s, ctx);
  Event start(true), stop(true);
  constexpr int kRuns = 10;
  ctx.compute().record(start);
  for (int i = 0; i < kRuns; ++i) ops::gemm(c.raw(), a.raw(), b.raw(), s, ctx);
  ctx.compute().record(stop);
  stop.synchronize();
  const double ms = stop.elapsed_ms_since(start);
  return ms > 0 ? 2.0 * n * n * n * kRuns / (ms * 1e-3) : 0.0;
}

double job_gemm_flops(DeviceContext& ctx, double gemm_tflops) {
  if (gemm_tflops < 0) return measure_gemm_flops(ctx);
  return ctx.is_cuda() ? gemm_tflops * 1e12 : 0.0;
}

namespace {
double best_copy_rate(DeviceContext& ctx, void* dst, const void* src, Device src_dev, size_t bytes, double factor) {
  double best = 0;
  for (int i = 0; i < 6; ++i) {
    Event start(true), stop(true);
    ctx.compute().record(start);
    copy_bytes_async(dst, ctx.compute_device(), src, src_dev, bytes, ctx.compute().handle());
    ctx.compute().record(stop);
    stop.synchronize();
    const double ms = stop.elapsed_ms_since(start);
    if (i > 0 && ms > 0) best = std::max(best, factor * static_cast<double>(bytes) / (ms * 1e-3));
  }
  return best;
}
constexpr size_t kCopyBytes = size_t{1} << 30;
}  // namespace

double measure_copy_bandwidth(DeviceContext& ctx) {
  if (!ctx.is_cuda()) return 0.0;
  const Device dev = ctx.compute_device();
  Tensor a = Tensor::zeros({static_cast<int64_t>(kCopyBytes)}, DType::kU8, dev);
  Tensor b = Tensor::empty({static_cast<int64_t>(kCopyBytes)}, DType::kU8, dev);
  return best_copy_rate(ctx, b.raw(), a.raw(), dev, kCopyBytes, 2.0);
}

double measure_h2d_bandwidth(DeviceContext& ctx) {
  if (!ctx.is_cuda()) return 0.0;
  PinnedHostAllocator pinned;
  void* host = pinned.allocate(kCopyBytes);
  std::memset(host, 1, kCopyBytes);
  Tensor d = Tensor::empty({static_cast<int64_t>(kCopyBytes)}, DType::kU8, ctx.compute_device());
  const double r = best_copy_rate(ctx, d.raw(), host, Device::kCpu, kCopyBytes, 1.0);
  pinned.release(host);
  return r;
}

double dense_bf16_spec_flops(const std::string& device_name) {
  auto has = [&](const char* part) { return device_name.find(part) != std::string::npos; };
  // The more specific names first: an "H100 NVL" or "H100 PCIe" is an H100 too.
  if (has("H100 NVL") || has("H200 NVL")) return 835e12;
  if (has("H100 PCIe")) return 756e12;
  if (has("H100") || has("H200")) return 989.4e12;  // SXM; GH200's GPU too
  if (has("B200")) return 2250e12;
  if (has("A100")) return 312e12;
  if (has("L40S")) return 362e12;
  if (has("RTX 4090")) return 165.2e12;
  return 0;
}

}  // namespace qshard
