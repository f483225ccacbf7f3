// bench/random_4bit: values per second per core of a random 4-bit base, drawn directly
// (quant/random_4bit.h) against drawn in float and quantized (random_normal -> Tensor::from_f32 in
// the base's dtype -> quantize_4bit: what init_random_base does without model.init.draw_4bit).
//
// The claim measured: random_4bit draws a projection's codes and statistics at >= 1e8 values/s on
// one core, several times the float path, so a 70B base (69e9 projection values) is drawn in
// seconds on a 16-core host. Per path it reports wall time, values/s and values/s per core of one
// [rows, cols] tensor (default 8192 x 28672: a 70B MLP projection), NF4 blocksize 64 with double
// quant, N(0, 0.02) stored as bfloat16 (the 70B preset's dtype); then random_4bit on --threads
// threads and whether its bytes equal the one-thread draw's. The float path runs one thread, as
// init_random_base runs it (one tensor per thread). Best of --repeat runs.
//
// Usage: bench_random_4bit [--rows 8192] [--cols 28672] [--blocksize 64] [--threads N] [--repeat 3]
//                          [--no-float] [--cuda]
// --cuda adds the GPU draw (quant/random_4bit.h): into device tensors, and into host tensors
// through pinned staging (a batch of 8 such tensors on 1, 4 and 8 stagers), the first checked byte
// for byte against the CPU draw.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "checkpoint/random_llama.h"
#include "quant/params4bit.h"
#include "quant/random_4bit.h"

namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double best_seconds(int repeat, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

bool same_bytes(const qshard::Params4bit& a, const qshard::Params4bit& b) {
  return qshard::bitwise_equal(a.data, b.data) && qshard::bitwise_equal(a.quant_state.absmax, b.quant_state.absmax) &&
         qshard::bitwise_equal(a.quant_state.state2->absmax, b.quant_state.state2->absmax) &&
         a.quant_state.state2->offset == b.quant_state.state2->offset;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace qshard;
  int64_t rows = 8192, cols = 28672, blocksize = 64;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), repeat = 3;
  bool no_float = false, cuda = false;
  CLI::App app{"values/s of a random 4-bit base: direct draw vs float draw + quantize"};
  app.add_option("--rows", rows, "tensor rows")->check(CLI::PositiveNumber);
  app.add_option("--cols", cols, "tensor columns")->check(CLI::PositiveNumber);
  app.add_option("--blocksize", blocksize, "values per absmax (32 .. 4096)");
  app.add_option("--threads", threads, "threads for the parallel direct draw")->check(CLI::PositiveNumber);
  app.add_option("--repeat", repeat, "runs per path (best reported)")->check(CLI::PositiveNumber);
  app.add_flag("--no-float", no_float, "skip the float path");
  app.add_flag("--cuda", cuda, "also the GPU draw (a CUDA build with a GPU)");
  CLI11_PARSE(app, argc, argv);

  if (cuda && !cuda_available()) {
    std::fprintf(stderr, "bench_random_4bit: --cuda needs a CUDA build and a visible GPU\n");
    return 1;
  }
  const Shape shape{rows, cols};
  const double n = static_cast<double>(rows) * static_cast<double>(cols);
  const QuantizeOptions q{QuantType::kNf4, blocksize, true};
  const std::string name = "model.layers.0.mlp.down_proj.weight";
  std::printf("bench_random_4bit: [%lld, %lld] = %.0f M values, NF4 blocksize %lld double quant, N(0, 0.02) bf16\n",
              static_cast<long long>(rows), static_cast<long long>(cols), n * 1e-6, static_cast<long long>(blocksize));
  auto report = [&](const char* what, double s, int cores) {
    std::printf("  %-40s %8.3f s  %8.1f M values/s  %8.1f M values/s/core\n", what, s, n / s * 1e-6,
                n / s / cores * 1e-6);
  };
  Params4bit one;
  report("direct draw, 1 thread", best_seconds(repeat, [&] { one = random_4bit(shape, DType::kBF16, q, 0.02, 7, 1); }),
         1);
  if (threads > 1) {
    Params4bit many;
    report(("direct draw, " + std::to_string(threads) + " threads").c_str(),
           best_seconds(repeat, [&] { many = random_4bit(shape, DType::kBF16, q, 0.02, 7, threads); }), threads);
    std::printf("  %d-thread bytes equal the 1-thread draw's: %s\n", threads, same_bytes(one, many) ? "yes" : "NO");
  }
  if (cuda) {  // the GPU draw (quant/random_4bit.h): device tensors, and into host tensors via pinned staging
    Params4bit dev;
    report("GPU draw, device tensors (per core: 1)",
           best_seconds(repeat, [&] { dev = random_4bit(shape, DType::kBF16, q, 0.02, 7, Device::kCuda, nullptr); }),
           1);
    std::printf("  GPU bytes equal the CPU draw's: %s\n", same_bytes(one, dev.to(Device::kCpu)) ? "yes" : "NO");
    // A batch of 8 such tensors (keys 7, 8, ...), as init_random_base hands a model's projections over.
    std::vector<Params4bit> outs(8);
    std::vector<Random4bitJob> jobs;
    for (size_t i = 0; i < outs.size(); ++i) jobs.push_back({shape, DType::kBF16, q, 0.02, 7 + i, &outs[i]});
    for (int t : {1, 4, 8}) {
      const double s = best_seconds(repeat, [&] { random_4bit_to_host(jobs, Device::kCuda, t); });
      std::printf("  %-40s %8.3f s  %8.1f M values/s\n",
                  ("GPU draw of 8 into host tensors, " + std::to_string(t) + " stager(s)").c_str(), s, 8 * n / s * 1e-6);
    }
    const Params4bit& host = outs[0];
    std::printf("  GPU-to-host bytes equal the CPU draw's: %s\n", same_bytes(one, host) ? "yes" : "NO");
  }
  if (!no_float) {
    Params4bit f;
    double draw = 0, convert = 0, quant = 0;
    const double total = best_seconds(repeat, [&] {
      const auto t0 = Clock::now();
      std::vector<float> v = random_normal(0, name, static_cast<int64_t>(n), 0.02);
      const auto t1 = Clock::now();
      const Tensor w = Tensor::from_f32(shape, DType::kBF16, v);
      v = {};
      const auto t2 = Clock::now();
      f = quantize_4bit(w, q);
      const auto t3 = Clock::now();
      draw = std::chrono::duration<double>(t1 - t0).count();
      convert = std::chrono::duration<double>(t2 - t1).count();
      quant = std::chrono::duration<double>(t3 - t2).count();
    });
    report("float draw + bf16 + quantize_4bit, 1 thread", total, 1);
    std::printf("    (last run: random_normal %.3f s, to bf16 %.3f s, quantize_4bit %.3f s)\n", draw, convert, quant);
  }
  return 0;
}
