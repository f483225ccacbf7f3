// bench/dequant: NF4 -> bf16 dequantization throughput with double quantization on the weight
// shapes of Llama-3-8B, beside the device-to-device copy bandwidth measured in the same run.
//
// Effective bandwidth = (packed bytes + uint8 absmax + nested absmax + bf16 output bytes) / time,
// i.e. bytes read + bytes written, the same accounting as the copy figure (2 x buffer size).
// Usage: bench_dequant [--json FILE] [--iters N]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "quant/blockwise.h"
#include "quant/params4bit.h"
#include "runtime/cuda_check.h"

using namespace qshard;

namespace {

__global__ void fill_normalish_kernel(__nv_bfloat16* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29; h *= 0xBF58476D1CE4E5B9ull; h ^= h >> 32;
    // Sum of 4 uniforms: roughly normal, scaled like a trained weight.
    float s = 0.f;
    for (int k = 0; k < 4; ++k) s += static_cast<float>((h >> (16 * k)) & 0xffff) / 65535.0f;
    x[i] = __float2bfloat16_rn((s - 2.0f) * 0.035f);
  }
}

struct Timer {
  cudaEvent_t a, b;
  Timer() { QS_CUDA_CHECK(cudaEventCreate(&a)); QS_CUDA_CHECK(cudaEventCreate(&b)); }
  ~Timer() { cudaEventDestroy(a); cudaEventDestroy(b); }
  void start() { QS_CUDA_CHECK(cudaEventRecord(a)); }
  float stop_ms() {
    QS_CUDA_CHECK(cudaEventRecord(b));
    QS_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    QS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int iters = 50;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
  }
  cudaDeviceProp prop{};
  QS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));

  // Copy bandwidth: 1 GiB device-to-device, read + write counted.
  const size_t copy_bytes_n = size_t(1) << 30;
  void *src = nullptr, *dst = nullptr;
  QS_CUDA_CHECK(cudaMalloc(&src, copy_bytes_n));
  QS_CUDA_CHECK(cudaMalloc(&dst, copy_bytes_n));
  QS_CUDA_CHECK(cudaMemset(src, 1, copy_bytes_n));
  Timer t;
  for (int i = 0; i < 3; ++i) QS_CUDA_CHECK(cudaMemcpyAsync(dst, src, copy_bytes_n, cudaMemcpyDeviceToDevice));
  t.start();
  for (int i = 0; i < iters; ++i) QS_CUDA_CHECK(cudaMemcpyAsync(dst, src, copy_bytes_n, cudaMemcpyDeviceToDevice));
  const double copy_gbs = 2.0 * copy_bytes_n * iters / (t.stop_ms() * 1e-3) / 1e9;
  QS_CUDA_CHECK(cudaFree(src));
  QS_CUDA_CHECK(cudaFree(dst));

  struct ShapeCase { const char* name; int64_t rows, cols; };
  const std::vector<ShapeCase> shapes = {{"q_proj", 4096, 4096},   {"k_proj", 1024, 4096},  {"v_proj", 1024, 4096},
                                         {"o_proj", 4096, 4096},   {"gate_proj", 14336, 4096},
                                         {"up_proj", 14336, 4096}, {"down_proj", 4096, 14336}};
  std::printf("device: %s (%d SMs), iters %d\n", prop.name, prop.multiProcessorCount, iters);
  std::printf("device copy (1 GiB, read+write): %.1f GB/s\n\n", copy_gbs);
  std::printf("| weight | shape | time (us) | effective GB/s | %% of copy |\n|---|---|---|---|---|\n");
  std::string json = "{\"device\": \"" + std::string(prop.name) + "\", \"copy_gbs\": " + std::to_string(copy_gbs) +
                     ", \"iters\": " + std::to_string(iters) + ", \"shapes\": [";
  double total_bytes = 0, total_ms = 0;
  std::vector<std::string> sweep_lines;
  std::vector<Params4bit> layer_params;  // kept alive for the one-launch layer measurement
  std::vector<Tensor> layer_outs;
  std::vector<Dequant4bitArgs> layer_args;
  for (size_t si = 0; si < shapes.size(); ++si) {
    const auto& sc = shapes[si];
    const int64_t n = sc.rows * sc.cols;
    Tensor w = Tensor::empty({sc.rows, sc.cols}, DType::kBF16, Device::kCuda);
    fill_normalish_kernel<<<4096, 256>>>(w.data<__nv_bfloat16>(), n, 1234 + si);
    QS_CUDA_CHECK_LAUNCH();
    QuantizeOptions qo;  // nf4, blocksize 64, double quant
    Params4bit p = quantize_4bit(w, qo);
    const QuantState& st = p.quant_state;
    Dequant4bitArgs a = dequant_args(p);
    Tensor out = Tensor::empty({sc.rows, sc.cols}, DType::kBF16, Device::kCuda);
    const double bytes = static_cast<double>(p.data.nbytes() + st.absmax.nbytes() + st.state2->absmax.nbytes() +
                                             out.nbytes());
    auto time_ms = [&](int units_per_thread) {
      a.units_per_thread = units_per_thread;
      for (int i = 0; i < 3; ++i) cuda::dequantize_4bit(a, out.raw(), DType::kBF16, nullptr);
      t.start();
      for (int i = 0; i < iters; ++i) cuda::dequantize_4bit(a, out.raw(), DType::kBF16, nullptr);
      return t.stop_ms() / iters;
    };
    std::string sweep;
    for (int u : {2, 4, 8, 16}) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), " %d:%.0f", u, bytes / (time_ms(u) * 1e-3) / 1e9);
      sweep += buf;
    }
    sweep_lines.push_back(std::string(sc.name) + " GB/s by units/thread:" + sweep);
    const double ms = time_ms(0);  // automatic choice: the figure reported
    layer_params.push_back(p);
    layer_outs.push_back(out);
    layer_args.push_back(a);
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    total_bytes += bytes;
    total_ms += ms;
    std::printf("| %s | %lldx%lld | %.1f | %.1f | %.1f%% |\n", sc.name, (long long)sc.rows, (long long)sc.cols, ms * 1e3,
                gbs, 100.0 * gbs / copy_gbs);
    json += std::string(si ? ", " : "") + "{\"name\": \"" + sc.name + "\", \"rows\": " + std::to_string(sc.rows) +
            ", \"cols\": " + std::to_string(sc.cols) + ", \"us\": " + std::to_string(ms * 1e3) +
            ", \"gbs\": " + std::to_string(gbs) + "}";
  }
  const double layer_gbs = total_bytes / (total_ms * 1e-3) / 1e9;
  std::printf("| whole layer, 7 launches | 7 weights | %.1f | %.1f | %.1f%% |\n", total_ms * 1e3, layer_gbs,
              100.0 * layer_gbs / copy_gbs);
  // The way the trainer dequantizes a unit: all 7 projections in one batched launch.
  std::vector<void*> outs;
  for (auto& o : layer_outs) outs.push_back(o.raw());
  for (auto& a : layer_args) a.units_per_thread = 0;
  for (int i = 0; i < 3; ++i) cuda::dequantize_4bit_batch(layer_args.data(), outs.data(), 7, DType::kBF16, nullptr);
  t.start();
  for (int i = 0; i < iters; ++i) cuda::dequantize_4bit_batch(layer_args.data(), outs.data(), 7, DType::kBF16, nullptr);
  const double batch_ms = t.stop_ms() / iters;
  const double batch_gbs = total_bytes / (batch_ms * 1e-3) / 1e9;
  std::printf("| whole layer, 1 batched launch | 7 weights | %.1f | %.1f | %.1f%% |\n", batch_ms * 1e3, batch_gbs,
              100.0 * batch_gbs / copy_gbs);
  for (const auto& l : sweep_lines) std::printf("%s\n", l.c_str());
  json += "], \"layer_us\": " + std::to_string(total_ms * 1e3) + ", \"layer_gbs\": " + std::to_string(layer_gbs) +
          ", \"layer_batched_us\": " + std::to_string(batch_ms * 1e3) + ", \"layer_batched_gbs\": " +
          std::to_string(batch_gbs) + "}\n";
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f) { std::fputs(json.c_str(), f); std::fclose(f); }
  }
  return 0;
}
