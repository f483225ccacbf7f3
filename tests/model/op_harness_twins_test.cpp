// The op harness, part two: the kernel twins of the layers below model/ - quant/ (4-bit quantize
// and dequantize, the 8-bit double quantization of the absmax), optim/ (AdamW, the gradient norm's
// sum of squares and its clip coefficient) and shard/ (gradient accumulation, the f32 -> bf16/f16
// compute copy) - each through its layer's dispatch (quant::, optim::, the Tensor forms of
// accumulate.h) on every backend (op_harness.h: the CPU, and CUDA where there is a GPU), with the
// context's stream, on random then adversarial inputs (never zeros), against an independent oracle
// in double precision or an exact rule. These twins take f32 (or codes) on both backends and the
// headers promise the same bits on both, so one tolerance serves both unless a case says otherwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "model/op_harness.h"
#include "optim/adamw.h"
#include "quant/blockwise.h"
#include "runtime/accumulate.h"

namespace qshard {
namespace {

using namespace op_harness;

// Host values -> a 1-d tensor of `dtype` on the backend's device, and back.
template <class T>
Tensor to_dev(DeviceContext& ctx, DType dtype, const std::vector<T>& v) {
  return Tensor::from_vector({static_cast<int64_t>(v.size())}, dtype, v).to(ctx.compute_device());
}
template <class T>
std::vector<T> to_host(DeviceContext& ctx, const Tensor& t) {
  ctx.compute().synchronize();
  const Tensor h = t.to(Device::kCpu);
  return std::vector<T>(h.data<T>(), h.data<T>() + h.numel());
}

// The entry of `table` nearest to v; the backend's pick `got` counts as right when it is within
// 1e-6 as near (the encoders' thresholds are float literals of the midpoints and they scale by a
// rounded f32 reciprocal: an input that close to a threshold may go either way).
double nearest_entry(const float* table, int entries, double v, double got) {
  double best = table[0];
  for (int c = 1; c < entries; ++c)
    if (std::fabs(table[c] - v) < std::fabs(best - v)) best = table[c];
  return std::fabs(got - v) <= std::fabs(best - v) + 1e-6 ? got : best;
}

int nibble(const std::vector<uint8_t>& packed, int64_t i) { return i % 2 == 0 ? packed[i / 2] >> 4 : packed[i / 2] & 0xf; }

// ---- quant/ -----------------------------------------------------------------------------------

// 4-bit quantization (quant::quantize_4bit), NF4 and FP4, from f32 and from bf16 (the inputs as
// the backend holds them). n = 5 blocks of 64 + 7: a partial last block and an odd count.
// Rules: absmax[b] = max |x| over the block, exactly (tol 0). Each code decodes to the table entry
// nearest x / absmax (ties within 1e-6 either way), compared as table[code] * absmax: one f32
// product against the double one, 6e-8 of a value: tol 1e-7 of the scale. The odd count's pad
// nibble is the code of zero.
TEST(OpHarnessTwins, Quantize4bit) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    const int64_t bs = 64, n = 5 * bs + 7, nb = (n + bs - 1) / bs;
    for (const QuantType type : {QuantType::kNf4, QuantType::kFp4})
      for (const DType dtype : {DType::kF32, DType::kBF16}) {
        const std::vector<float> X = in.vec(n);
        const Tensor x = Tensor::from_f32({n}, dtype, X).to(ctx.compute_device());
        const std::vector<float> xa = x.to(Device::kCpu).to_f32_vector();  // as the backend holds them
        Tensor packed = to_dev(ctx, DType::kU8, std::vector<uint8_t>((n + 1) / 2, 0xee));
        Tensor absmax = to_f32_dev(ctx, std::vector<float>(nb, -1.0f));
        quant::quantize_4bit(ctx.compute_device(), x.raw(), dtype, n, bs, type, packed.data<uint8_t>(),
                             absmax.data<float>(), ctx.stream());
        const std::vector<uint8_t> P = to_host<uint8_t>(ctx, packed);
        const std::vector<float> A = to_host<float>(ctx, absmax);
        std::vector<double> awant(nb, 0.0), want(n);
        std::vector<float> got(n);
        for (int64_t i = 0; i < n; ++i) awant[i / bs] = std::max(awant[i / bs], std::fabs(double(xa[i])));
        const float* table = decode_table(type);
        for (int64_t i = 0; i < n; ++i) {
          const float a = A[i / bs], t = table[nibble(P, i)];
          got[i] = t * a;
          want[i] = nearest_entry(table, 16, xa[i] / awant[i / bs], t) * awant[i / bs];
        }
        const std::string tag = std::string(quant_type_name(type)) + " " + dtype_torch_name(dtype);
        report(ctx, ("quantize_4bit absmax " + tag).c_str(), in.adversarial, A, awant, 0.0);
        report(ctx, ("quantize_4bit codes " + tag).c_str(), in.adversarial, got, want, 1e-7);
        EXPECT_EQ(P.back() & 0xf, zero_code(type)) << "the pad nibble of an odd count";
      }
  });
}

// The double quantization of an absmax (quant::subtract_offset, then quant::quantize_8bit against
// the signed dynamic map in blocks of 256; n = 300: a full block and a partial one). Centring: one
// f32 subtraction, 6e-8 of the larger operand: tol 1e-7 of the scale. Nested absmax = max |centred|
// over the block of the values as the backend holds them, exactly (tol 0). Codes: the map entry
// nearest centred / nested absmax (ties within 1e-6 either way), compared decoded: tol 1e-7 as above.
TEST(OpHarnessTwins, DoubleQuant8bit) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    const int64_t bs = 256, n = 300, nb = 2;
    std::vector<float> X = in.vec(n, 0.05f);  // an absmax: positive, one per 4-bit block
    for (auto& v : X) v = std::fabs(v) + 0.01f;
    double mean = 0;
    for (float v : X) mean += v;
    const float offset = static_cast<float>(mean / n);
    Tensor x = to_f32_dev(ctx, X);
    quant::subtract_offset(ctx.compute_device(), x.data<float>(), n, offset, ctx.stream());
    const std::vector<float> C = back(ctx, x);
    std::vector<double> cwant(n);
    for (int64_t i = 0; i < n; ++i) cwant[i] = double(X[i]) - offset;
    report(ctx, "subtract_offset", in.adversarial, C, cwant, 1e-7);

    const auto& map = dynamic_map_signed();
    const Tensor code = to_f32_dev(ctx, std::vector<float>(map.begin(), map.end()));
    Tensor q = to_dev(ctx, DType::kU8, std::vector<uint8_t>(n, 0));
    Tensor nested = to_f32_dev(ctx, std::vector<float>(nb, -1.0f));
    quant::quantize_8bit(ctx.compute_device(), x.data<float>(), n, bs, code.data<float>(), q.data<uint8_t>(),
                         nested.data<float>(), ctx.stream());
    const std::vector<uint8_t> Q = to_host<uint8_t>(ctx, q);
    const std::vector<float> N = to_host<float>(ctx, nested);
    std::vector<double> nwant(nb, 0.0), want(n);
    std::vector<float> got(n);
    for (int64_t i = 0; i < n; ++i) nwant[i / bs] = std::max(nwant[i / bs], std::fabs(double(C[i])));
    for (int64_t i = 0; i < n; ++i) {
      const float m = map[Q[i]];
      got[i] = m * N[i / bs];
      want[i] = nearest_entry(map.data(), 256, C[i] / nwant[i / bs], m) * nwant[i / bs];
    }
    report(ctx, "quantize_8bit absmax", in.adversarial, N, nwant, 0.0);
    report(ctx, "quantize_8bit codes", in.adversarial, got, want, 1e-7);
  });
}

// 4-bit dequantization (quant::dequantize_4bit) of random codes with a nested absmax into f32,
// bf16 and f16, and a batch of three tensors (quant::dequantize_4bit_batch: one launch on CUDA, one
// by one on the CPU; plain and nested absmax, counts not a multiple of 8). Oracle in double:
// table[code] * (map[q] * nested_absmax + offset). The twins round three times in f32 (the
// product, the offset's add, the value; nested absmax ~1, offset ~1, so the scale is >= 1): tol
// 1e-6; a bf16 output adds one rounding (at most 2^-8 = 3.9e-3 of a value): 4e-3; f16 (2^-11 =
// 4.9e-4): 1e-3.
TEST(OpHarnessTwins, Dequantize4bitNestedAndBatch) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    const auto& map = dynamic_map_signed();
    const Tensor map_d = to_f32_dev(ctx, std::vector<float>(map.begin(), map.end()));
    struct Made {
      Tensor packed, absmax, q8, nested;
      Dequant4bitArgs args;
      std::vector<double> want;
    };
    // A quantized tensor of n values in blocks of 64 with random codes and statistics.
    auto make = [&](int64_t n, QuantType type, bool nested) {
      const int64_t bs = 64, nb = (n + bs - 1) / bs;
      Made m;
      std::vector<uint8_t> P((n + 1) / 2), Q(nb);
      for (auto& b : P) b = static_cast<uint8_t>(in.rng() & 0xff);
      for (auto& b : Q) b = static_cast<uint8_t>(in.rng() & 0xff);
      std::vector<float> A = in.bounded(nb), Nst = in.bounded((nb + 255) / 256, 0.2f);
      for (auto& a : A) a = std::fabs(a) + 0.1f;
      for (auto& a : Nst) a = std::fabs(a) + 0.5f;
      const float offset = 1.0f + std::fabs(in.bounded(1, 0.1f)[0]);
      m.packed = to_dev(ctx, DType::kU8, P);
      m.args.packed = m.packed.data<uint8_t>();
      m.args.n = n;
      m.args.blocksize = bs;
      std::copy(decode_table(type), decode_table(type) + 16, m.args.code);
      if (nested) {
        m.q8 = to_dev(ctx, DType::kU8, Q);
        m.nested = to_f32_dev(ctx, Nst);
        m.args.absmax_q8 = m.q8.data<uint8_t>();
        m.args.nested_absmax = m.nested.data<float>();
        m.args.nested_code = map_d.data<float>();
        m.args.offset = offset;
      } else {
        m.absmax = to_f32_dev(ctx, A);
        m.args.absmax = m.absmax.data<float>();
      }
      m.want.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t b = i / bs;
        const double a = nested ? double(map[Q[b]]) * Nst[b / 256] + offset : double(A[b]);
        m.want[i] = decode_table(type)[nibble(P, i)] * a;
      }
      return m;
    };
    const Made one = make(64 * 300 + 5, QuantType::kNf4, true);  // two nested blocks, an odd count
    for (const DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      Tensor out = Tensor::zeros({one.args.n}, dt, ctx.compute_device());
      quant::dequantize_4bit(ctx.compute_device(), one.args, out.raw(), dt, ctx.stream());
      const double t = dt == DType::kF32 ? 1e-6 : dt == DType::kBF16 ? 4e-3 : 1e-3;
      report(ctx, (std::string("dequantize_4bit nested ") + dtype_torch_name(dt)).c_str(), in.adversarial,
             back(ctx, out), one.want, t);
    }
    std::vector<Made> batch;
    batch.push_back(make(64 * 9, QuantType::kNf4, true));
    batch.push_back(make(64 * 4 + 33, QuantType::kFp4, false));
    batch.push_back(make(64 * 20, QuantType::kFp4, true));
    std::vector<Dequant4bitArgs> args;
    std::vector<Tensor> outs;
    std::vector<void*> out_ptrs;
    for (const Made& m : batch) {
      args.push_back(m.args);
      outs.push_back(Tensor::zeros({m.args.n}, DType::kBF16, ctx.compute_device()));
      out_ptrs.push_back(outs.back().raw());
    }
    quant::dequantize_4bit_batch(ctx.compute_device(), args.data(), out_ptrs.data(), static_cast<int>(args.size()),
                                 DType::kBF16, ctx.stream());
    for (size_t k = 0; k < batch.size(); ++k)
      report(ctx, ("dequantize_4bit_batch " + std::to_string(k)).c_str(), in.adversarial, back(ctx, outs[k]),
             batch[k].want, 4e-3);
  });
}

// ---- optim/ -----------------------------------------------------------------------------------

// AdamW on a unit's shard where the master lives (optim::adamw_step): three steps of
// torch.optim.AdamW, the third with a clip coefficient of 0.5 read from the master's memory
// (grad_scale_ptr, as the trainer passes it). On CUDA also a master on the host with the gradients
// on the device (offload.optimizer: the gradient shard comes to the host). Oracle: the same
// formula in double. f32 per element, ~10 roundings a step, the update's division amplifying none
// (m / sqrt(v) ~ 1): a few 1e-7 of the scale after 3 steps: tol 1e-6 (p ~ N(0, 1); m and v are
// checked too, on their own scales).
TEST(OpHarnessTwins, AdamWStep) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    const int64_t n = 1031;
    AdamWParams ap;
    ap.lr = 1e-2;
    ap.weight_decay = 0.01;
    const std::vector<float> P0 = in.bounded(n);
    std::vector<std::vector<float>> G;
    for (int s = 0; s < 3; ++s) G.push_back(in.vec(n));
    std::vector<Device> master_on = {ctx.compute_device()};
    if (ctx.is_cuda()) master_on.push_back(Device::kCpu);
    for (const Device where : master_on) {
      Tensor p = Tensor::from_vector({n}, DType::kF32, P0).to(where);
      Tensor m = Tensor::zeros({n}, DType::kF32, where), v = Tensor::zeros({n}, DType::kF32, where);
      const Tensor half = Tensor::from_vector({1}, DType::kF32, std::vector<float>{0.5f}).to(where);
      for (int s = 0; s < 3; ++s) {
        const Tensor g = to_f32_dev(ctx, G[s]);  // the gradient shard: on the backend's device
        optim::adamw_step(p, g, m, v, ap, s + 1, ctx.stream(), s == 2 ? half.data<float>() : nullptr);
      }
      std::vector<double> pw(P0.begin(), P0.end()), mw(n, 0.0), vw(n, 0.0);
      for (int s = 0; s < 3; ++s) {
        const double bc1 = 1.0 - std::pow(ap.beta1, s + 1), bc2 = 1.0 - std::pow(ap.beta2, s + 1);
        for (int64_t i = 0; i < n; ++i) {
          const double g = double(G[s][i]) * (s == 2 ? 0.5 : 1.0);
          pw[i] *= 1.0 - ap.lr * ap.weight_decay;
          mw[i] += (1.0 - ap.beta1) * (g - mw[i]);
          vw[i] = vw[i] * ap.beta2 + (1.0 - ap.beta2) * g * g;
          pw[i] += -(ap.lr / bc1) * mw[i] / (std::sqrt(vw[i]) / std::sqrt(bc2) + ap.eps);
        }
      }
      ctx.compute().synchronize();
      const std::string tag = where == Device::kCpu && ctx.is_cuda() ? " (host master)" : "";
      report(ctx, ("adamw_step p" + tag).c_str(), in.adversarial, p.to(Device::kCpu).to_f32_vector(), pw, 1e-6);
      report(ctx, ("adamw_step m" + tag).c_str(), in.adversarial, m.to(Device::kCpu).to_f32_vector(), mw, 1e-6);
      report(ctx, ("adamw_step v" + tag).c_str(), in.adversarial, v.to(Device::kCpu).to_f32_vector(), vw, 1e-6);
    }
  });
}

// The global gradient norm where the gradients live: optim::add_sum_squares over three shards (the
// first overwriting the accumulator, the others adding), then optim::clip_from_sum_squares with
// max_norm 0.5. Oracle in long double. f64 sums of ~2500 terms round ~1e-13 of the total (the CPU
// sequentially, CUDA in a fixed tree): tol 1e-12 relative for the sum and the norm; the
// coefficient min(1, 0.5 / (norm + 1e-6)) is rounded once to f32: tol 1e-7 relative.
TEST(OpHarnessTwins, GradNormAndClip) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    const std::vector<int64_t> sizes = {517, 1024, 999};
    Tensor scratch = to_dev(ctx, DType::kF64, std::vector<double>(2 + kSumSquaresBlocks, -1.0));
    Tensor scale = to_f32_dev(ctx, std::vector<float>{-1.0f});
    double* acc = scratch.data<double>();
    long double want = 0;
    std::vector<Tensor> shards;  // alive until the stream is done with them
    for (size_t u = 0; u < sizes.size(); ++u) {
      const std::vector<float> G = in.vec(sizes[u]);
      for (float g : G) want += static_cast<long double>(g) * g;
      shards.push_back(to_f32_dev(ctx, G));
      optim::add_sum_squares(ctx.compute_device(), acc, acc + 2, shards.back().data<float>(), sizes[u], u > 0,
                             ctx.stream());
    }
    optim::clip_from_sum_squares(ctx.compute_device(), acc, 0.5, acc + 1, scale.data<float>(), ctx.stream());
    const std::vector<double> S = to_host<double>(ctx, scratch);
    const float got_scale = to_host<float>(ctx, scale)[0];
    const double norm = std::sqrt(static_cast<double>(want)), coef = std::min(1.0, 0.5 / (norm + 1e-6));
    std::printf("  %-22s %-4s %-11s sum %.17g want %.17g | norm %.17g want %.17g | scale %.9g want %.9g\n",
                "grad norm + clip", backend_name(ctx.backend()), in.adversarial ? "adversarial" : "random", S[0],
                static_cast<double>(want), S[1], norm, got_scale, coef);
    EXPECT_NEAR(S[0], static_cast<double>(want), 1e-12 * static_cast<double>(want));
    EXPECT_NEAR(S[1], norm, 1e-12 * norm);
    EXPECT_NEAR(got_scale, coef, 1e-7 * coef);
  });
}

// ---- shard/ -----------------------------------------------------------------------------------

// Gradient accumulation (accumulate_f32 on tensors: out += in, twice, as two micro-batches): two
// f32 adds, each 6e-8 of its result: tol 2e-7 of the scale. The compute copy of f32 masters
// (convert_f32 to bf16 and f16): one rounding to nearest even, an exact rule (tol 0).
TEST(OpHarnessTwins, AccumulateAndConvertF32) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    const int64_t n = 1031;
    const std::vector<float> O = in.vec(n), A = in.vec(n), B = in.vec(n);
    Tensor out = to_f32_dev(ctx, O);
    const Tensor a = to_f32_dev(ctx, A), b = to_f32_dev(ctx, B);
    accumulate_f32(out, a, ctx.stream());
    accumulate_f32(out, b, ctx.stream());
    std::vector<double> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = double(O[i]) + A[i] + B[i];
    report(ctx, "accumulate_f32 x2", in.adversarial, back(ctx, out), want, 2e-7);

    for (const DType to : {DType::kBF16, DType::kF16}) {
      Tensor narrow = Tensor::zeros({n}, to, ctx.compute_device());
      convert_f32(narrow, a, ctx.stream());
      std::vector<double> cw(n);
      for (int64_t i = 0; i < n; ++i)
        cw[i] = to == DType::kBF16 ? bf16_to_f32(f32_to_bf16(A[i])) : f16_to_f32(f32_to_f16(A[i]));
      report(ctx, (std::string("convert_f32 ") + dtype_torch_name(to)).c_str(), in.adversarial, back(ctx, narrow), cw,
             0.0);
    }
  });
}

}  // namespace
}  // namespace qshard
