// The op harness: every op of llama_ops.h, through its dispatch (ops::), on every backend this
// build has and this machine can run (the CPU always; CUDA once its twins exist and a GPU is
// visible), on fresh random inputs and on adversarial ones, against an independent oracle in
// double precision (or an exact rule). Inputs travel to the backend's device in its activation
// dtype; outputs come back widened to f32; the oracle reads the inputs as the backend holds them
// (bf16-rounded on CUDA), so a tolerance covers the op's own arithmetic and output rounding. The
// tolerance of each op is declared next to it with its reason, per backend: CPU = f32 arithmetic
// against the double oracle; CUDA = bf16 outputs (one rounding: 2^-9 = 2e-3 of a value, so 4e-3 of
// the output scale with the f32 work before it) unless the op says otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/llama_ops.h"
#include "model/op_harness.h"
#include "runtime/allocator.h"
#include "runtime/tensor.h"

namespace qshard {
namespace {

using namespace op_harness;

// ---- the ops ----------------------------------------------------------------------------------

// GEMM. CPU tol 2e-6 x sqrt-ish growth: f32 accumulation over K = 67 terms, each rounding ~6e-8
// relative to the running sum: K * 6e-8 ~ 4e-6 of the output scale.
TEST(OpHarness, Gemm) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t M = 13, N = 9, K = 67;
        GemmShape s{M, N, K, ta == 1, tb == 1, 1.5f, 0.5f};
        s.a_type = s.b_type = s.c_type = ctx.activation_dtype();
        Tensor a = to_act(ctx, in.vec(M * K)), b = to_act(ctx, in.bounded(K * N)), c = to_act(ctx, in.bounded(M * N));
        const auto A = back(ctx, a), B = back(ctx, b), C0 = back(ctx, c);
        ops::gemm(c.raw(), a.raw(), b.raw(), s, ctx);
        std::vector<double> want(M * N);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            double acc = 0;
            for (int64_t k = 0; k < K; ++k) acc += double(ta ? A[k * M + m] : A[m * K + k]) * (tb ? B[n * K + k] : B[k * N + n]);
            want[m * N + n] = 1.5 * acc + 0.5 * C0[m * N + n];
          }
        report(ctx, ta ? (tb ? "gemm TT" : "gemm TN") : (tb ? "gemm NT" : "gemm NN"), in.adversarial, back(ctx, c), want,
               tol(ctx, 1e-5, 4e-3));
      }
  });
}

// Strided batches (GemmShape::batch): three products over views of wider buffers with their own
// strides, each against the oracle; the padding between the batches of C keeps its values.
TEST(OpHarness, GemmBatched) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t M = 9, N = 16, K = 24, nb = 3;
        GemmShape s{M, N, K, ta == 1, tb == 1, 0.5f, 1.0f};
        s.a_type = s.b_type = s.c_type = ctx.activation_dtype();
        const int64_t arows = ta ? K : M, acols = ta ? M : K, brows = tb ? N : K, bcols = tb ? K : N;
        s.lda = acols * nb, s.stride_a = acols;      // the batches side by side in A's rows
        s.ldb = bcols, s.stride_b = brows * bcols;   // one after another in B
        s.ldc = N + 8, s.stride_c = M * (N + 8) + 8;  // apart in C, with padding between
        s.batch = nb;
        Tensor a = to_act(ctx, in.vec(arows * s.lda)), b = to_act(ctx, in.bounded(nb * brows * s.ldb)),
               c = to_act(ctx, in.bounded(nb * s.stride_c));
        const auto A = back(ctx, a), B = back(ctx, b), C0 = back(ctx, c);
        ops::gemm(c.raw(), a.raw(), b.raw(), s, ctx);
        std::vector<double> want(C0.begin(), C0.end());
        for (int64_t i = 0; i < nb; ++i)
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              double acc = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double x = ta ? A[k * s.lda + i * s.stride_a + m] : A[m * s.lda + i * s.stride_a + k];
                const double y = tb ? B[i * s.stride_b + n * s.ldb + k] : B[i * s.stride_b + k * s.ldb + n];
                acc += x * y;
              }
              double& w = want[i * s.stride_c + m * s.ldc + n];
              w = 0.5 * acc + w;
            }
        report(ctx, ta ? (tb ? "gemm batched TT" : "gemm batched TN") : (tb ? "gemm batched NT" : "gemm batched NN"),
               in.adversarial, back(ctx, c), want, tol(ctx, 1e-5, 4e-3));
      }
  });
}

// GEMM reading and writing column blocks of wider buffers (lda / ldb / ldc larger than the rows:
// the LoRA fold). The padding columns of C must keep their values. Tolerances as above.
TEST(OpHarness, GemmLeadingDimensions) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t M = 11, N = 16, K = 40;
        GemmShape s{M, N, K, ta == 1, tb == 1, 0.75f, 1.0f};
        s.a_type = s.b_type = s.c_type = ctx.activation_dtype();
        const int64_t arows = ta ? K : M, acols = ta ? M : K, brows = tb ? N : K, bcols = tb ? K : N;
        s.lda = acols + 8;
        s.ldb = bcols + 16;
        s.ldc = N + 8;
        Tensor a = to_act(ctx, in.vec(arows * s.lda)), b = to_act(ctx, in.bounded(brows * s.ldb)),
               c = to_act(ctx, in.bounded(M * s.ldc));
        const auto A = back(ctx, a), B = back(ctx, b), C0 = back(ctx, c);
        ops::gemm(c.raw(), a.raw(), b.raw(), s, ctx);
        std::vector<double> want(M * s.ldc);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < s.ldc; ++n) {
            if (n >= N) {  // padding: untouched
              want[m * s.ldc + n] = C0[m * s.ldc + n];
              continue;
            }
            double acc = 0;
            for (int64_t k = 0; k < K; ++k)
              acc += double(ta ? A[k * s.lda + m] : A[m * s.lda + k]) * (tb ? B[n * s.ldb + k] : B[k * s.ldb + n]);
            want[m * s.ldc + n] = 0.75 * acc + C0[m * s.ldc + n];
          }
        report(ctx, ta ? (tb ? "gemm ld TT" : "gemm ld TN") : (tb ? "gemm ld NT" : "gemm ld NN"), in.adversarial,
               back(ctx, c), want, tol(ctx, 1e-5, 4e-3));
      }
  });
}

// gemm_into: D = alpha op(A) op(B) + beta C with C a buffer of its own (the residual stream added
// in the GEMM's epilogue, LlamaModel::linear_fwd), with ldc > N: D's padding keeps its values, C is
// left as it was; beta 0 reads no C (null). Tolerances as above.
TEST(OpHarness, GemmInto) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    for (const float beta : {1.0f, 0.0f}) {
      const int64_t M = 13, N = 24, K = 16;
      GemmShape s{M, N, K, false, true, 0.5f, beta};
      s.a_type = s.b_type = s.c_type = ctx.activation_dtype();
      s.ldc = N + 8;
      Tensor a = to_act(ctx, in.vec(M * K)), b = to_act(ctx, in.bounded(N * K)), c = to_act(ctx, in.bounded(M * s.ldc)),
             d = to_act(ctx, in.bounded(M * s.ldc));
      const auto A = back(ctx, a), B = back(ctx, b), C0 = back(ctx, c), D0 = back(ctx, d);
      ops::gemm_into(d.raw(), a.raw(), b.raw(), beta != 0.0f ? c.raw() : nullptr, s, ctx);
      std::vector<double> want(M * s.ldc);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < s.ldc; ++n) {
          if (n >= N) {
            want[m * s.ldc + n] = D0[m * s.ldc + n];
            continue;
          }
          double acc = 0;
          for (int64_t k = 0; k < K; ++k) acc += double(A[m * K + k]) * B[n * K + k];
          want[m * s.ldc + n] = 0.5 * acc + beta * C0[m * s.ldc + n];
        }
      report(ctx, beta != 0.0f ? "gemm_into C" : "gemm_into no C", in.adversarial, back(ctx, d), want,
             tol(ctx, 1e-5, 4e-3));
      const auto C1 = back(ctx, c);
      for (size_t i = 0; i < C1.size(); ++i) ASSERT_EQ(C1[i], C0[i]) << "gemm_into wrote C at " << i;
    }
  });
}

// RMSNorm forward and backward. CPU tol 1e-5: a mean of C squares in f32, one rsqrt. On CUDA, C = 96
// (one vector per thread) and 2056 (three, the last partial) run the register-resident kernels,
// C = 8200 (too wide for them) the 8-wide ones, C = 90 the scalar ones; ld = C + 8 writes the
// forward's output and reads the backward's incoming gradient as a column block of a wider buffer
// (the LoRA fold).
// C 8 / 16 / 64 / 128: Qwen3's q_norm / k_norm over head_dim (rows of [N*H, D]).
TEST(OpHarness, RmsNorm) {
  for (const int64_t C : {int64_t{96}, int64_t{2056}, int64_t{8200}, int64_t{90}, int64_t{8}, int64_t{16}, int64_t{64},
                          int64_t{128}})
    for (const int64_t pad : {int64_t{0}, int64_t{8}}) for_each_case([C, pad](DeviceContext& ctx, Inputs& in) {
      const int64_t N = 7, ld = C + pad;
      const float eps = 1e-5f;
      const auto W = in.bounded(C, 0.2f);
      std::vector<float> w1(W);
      for (auto& w : w1) w += 1.0f;
      Tensor x = to_act(ctx, in.vec(N * C)), g = to_act(ctx, in.vec(N * ld));
      const auto X = back(ctx, x), G = back(ctx, g);
      Tensor out = to_act(ctx, std::vector<float>(N * ld, 5.0f)),
             dx = to_act(ctx, std::vector<float>(N * C, 0.0f)), w = to_f32_dev(ctx, w1),
             rstd = to_f32_dev(ctx, std::vector<float>(N));
      ops::rmsnorm_fwd(out.raw(), rstd.data<float>(), x.raw(), w.data<float>(), N, C, eps, ctx, pad ? ld : 0);
      ops::rmsnorm_bwd(dx.raw(), g.raw(), x.raw(), w.data<float>(), rstd.data<float>(), N, C, ctx, pad ? ld : 0);
      std::vector<double> want(N * ld, 5.0), dwant(N * C);
      for (int64_t n = 0; n < N; ++n) {
        double ss = 0;
        for (int64_t c = 0; c < C; ++c) ss += double(X[n * C + c]) * X[n * C + c];
        const double r = 1.0 / std::sqrt(ss / C + eps);
        double dot = 0;
        for (int64_t c = 0; c < C; ++c) dot += double(G[n * ld + c]) * w1[c] * X[n * C + c] * r;
        for (int64_t c = 0; c < C; ++c) {
          want[n * ld + c] = w1[c] * X[n * C + c] * r;
          dwant[n * C + c] = r * (double(G[n * ld + c]) * w1[c] - X[n * C + c] * r * dot / C);
        }
      }
      const std::string tag = "C" + std::to_string(C) + (pad ? " ld" : "");
      report(ctx, ("rmsnorm_fwd " + tag).c_str(), in.adversarial, back(ctx, out), want, tol(ctx, 1e-5, 4e-3));
      report(ctx, ("rmsnorm_bwd " + tag).c_str(), in.adversarial, back(ctx, dx), dwant, tol(ctx, 1e-5, 4e-3));
    });
}

// copy_2d: a scaled column block into a wider buffer, and zeros; the rest untouched. One rounding
// of scale * x (exact on the CPU's f32; bf16 on CUDA), tol 0 against that rounding.
TEST(OpHarness, Copy2d) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    const int64_t rows = 9, cols = 13, ld_src = 16, ld_dst = 40;
    Tensor src = to_act(ctx, in.vec(rows * ld_src)), dst = to_act(ctx, std::vector<float>(rows * ld_dst, 3.0f));
    const auto S = back(ctx, src);
    ops::copy_2d(dst.raw(), ld_dst, src.raw(), ld_src, rows, cols, 0.5f, ctx);
    ops::copy_2d(static_cast<uint8_t*>(dst.raw()) + 20 * dtype_size(ctx.activation_dtype()), ld_dst, nullptr, 0, rows, 7,
                 0.0f, ctx);
    std::vector<double> want(rows * ld_dst, 3.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float v = 0.5f * S[r * ld_src + c];
        want[r * ld_dst + c] = ctx.is_cuda() ? bf16_to_f32(f32_to_bf16(v)) : v;
      }
      for (int64_t c = 20; c < 27; ++c) want[r * ld_dst + c] = 0.0;
    }
    report(ctx, "copy_2d", in.adversarial, back(ctx, dst), want, 0.0);
  });
}

// copy_2d of whole 16-byte words (CUDA's word kernel: scale 1, widths and strides multiples of 8,
// aligned bases), as the row fold copies dy beside its s dt columns: exact, the gaps untouched.
TEST(OpHarness, Copy2dWords) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    const int64_t rows = 67, cols = 64, ld_src = 72, ld_dst = 80;
    Tensor src = to_act(ctx, in.vec(rows * ld_src)), dst = to_act(ctx, std::vector<float>(rows * ld_dst, 3.0f));
    const auto S = back(ctx, src);
    ops::copy_2d(dst.raw(), ld_dst, src.raw(), ld_src, rows, cols, 1.0f, ctx);
    std::vector<double> want(rows * ld_dst, 3.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) want[r * ld_dst + c] = S[r * ld_src + c];
    report(ctx, "copy_2d (words)", in.adversarial, back(ctx, dst), want, 0.0);
  });
}

// accumulate_f32: a fold group's A gradients added into each projection's f32 gradient, whatever
// the activation dtype: one float add each, exact.
TEST(OpHarness, AccumulateF32) {
  for (auto& ctx : backends()) {
    const int64_t n = 70001;
    std::vector<float> out(n), b(n);
    for (int64_t i = 0; i < n; ++i) out[i] = 0.37f * static_cast<float>(i % 97) - 11.0f, b[i] = 1e-3f * static_cast<float>(i % 89) - 0.04f;
    Tensor to = Tensor::from_vector({n}, DType::kF32, out).to(ctx->compute_device());
    Tensor tb = Tensor::from_vector({n}, DType::kF32, b).to(ctx->compute_device());
    ops::accumulate_f32(static_cast<float*>(to.raw()), static_cast<const float*>(tb.raw()), n - 1, *ctx);
    ctx->compute().synchronize();
    const Tensor got = to.to(Device::kCpu);
    const auto* g = static_cast<const float*>(got.raw());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += g[i] != (i < n - 1 ? out[i] + b[i] : out[i]);
    EXPECT_EQ(wrong, 0) << (ctx->is_cuda() ? "cuda" : "cpu");
  }
}

// copy_2d_batch: the LoRA fold's packing in one op: blocks of different sizes (scaled copies and
// zeros) into two buffers, as copy_2d would write each; the rest untouched. tol 0 against one
// rounding of scale * x.
TEST(OpHarness, Copy2dBatch) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    const int64_t rows = 37, ld_dst = 52, ld_src = 11, cat_rows = 3, cat_cols = 29;
    const size_t esz = dtype_size(ctx.activation_dtype());
    Tensor src = to_act(ctx, in.vec(rows * ld_src)), dst = to_act(ctx, std::vector<float>(rows * ld_dst, 3.0f));
    Tensor a = to_act(ctx, in.vec(cat_rows * cat_cols)), cat = to_act(ctx, std::vector<float>(2 * cat_rows * cat_cols, 5.0f));
    const auto S = back(ctx, src), A = back(ctx, a);
    auto at = [&](Tensor& t, int64_t elems) { return static_cast<uint8_t*>(t.raw()) + elems * static_cast<int64_t>(esz); };
    // columns 40..51 of dst: 4 zeros, 5 of src scaled by 0.25, 3 zeros; rows 3..5 of cat: a.
    const std::vector<Copy2dBlock> blocks = {
        {at(dst, 40), ld_dst, nullptr, 0, rows, 4, 0.0f},
        {at(dst, 44), ld_dst, at(src, 2), ld_src, rows, 5, 0.25f},
        {at(dst, 49), ld_dst, nullptr, 0, rows, 3, 0.0f},
        {at(cat, cat_rows * cat_cols), cat_cols, a.raw(), cat_cols, cat_rows, cat_cols, 1.0f},
    };
    ops::copy_2d_batch(blocks.data(), static_cast<int>(blocks.size()), ctx);
    auto round = [&](float v) { return ctx.is_cuda() ? bf16_to_f32(f32_to_bf16(v)) : v; };
    std::vector<double> want(rows * ld_dst, 3.0), want_cat(2 * cat_rows * cat_cols, 5.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 40; c < 44; ++c) want[r * ld_dst + c] = 0.0;
      for (int64_t c = 0; c < 5; ++c) want[r * ld_dst + 44 + c] = round(0.25f * S[r * ld_src + 2 + c]);
      for (int64_t c = 49; c < 52; ++c) want[r * ld_dst + c] = 0.0;
    }
    for (int64_t i = 0; i < cat_rows * cat_cols; ++i) want_cat[cat_rows * cat_cols + i] = round(A[i]);
    report(ctx, "copy_2d_batch", in.adversarial, back(ctx, dst), want, 0.0);
    report(ctx, "copy_2d_batch (stack)", in.adversarial, back(ctx, cat), want_cat, 0.0);
  });
}

// Host -> device uploads from pinned host memory (CUDA: a kernel reading it in place): exact bytes
// at whole words, with a tail, from an unaligned source, and past one block's grid stride; the
// bytes after the destination's span keep theirs.
TEST(OpHarness, Upload) {
  for (auto& ctx : backends()) {
    PinnedHostAllocator pinned;
    const size_t most = 300001;
    auto* host = static_cast<uint8_t*>(pinned.allocate(most + 8));
    for (size_t i = 0; i < most + 8; ++i) host[i] = static_cast<uint8_t>((i * 131 + 7) % 251);
    if (ctx->is_cuda()) {
      ASSERT_TRUE(device_reads_at_host_address(host));
    }
    for (const auto& [offset, n] : std::vector<std::pair<size_t, size_t>>{{0, 148}, {0, 151}, {1, 301}, {0, most}, {3, 5}}) {
      const std::vector<uint8_t> fill(n + 16, 0xAB);
      Tensor dst = Tensor::from_bytes({static_cast<int64_t>(n + 16)}, DType::kU8, fill).to(ctx->compute_device());
      ops::upload_async(dst.raw(), host + offset, n, *ctx);
      ctx->compute().synchronize();
      const Tensor got = dst.to(Device::kCpu);
      const auto* g = static_cast<const uint8_t*>(got.raw());
      size_t wrong = 0;
      for (size_t i = 0; i < n; ++i) wrong += g[i] != host[offset + i];
      for (size_t i = n; i < n + 16; ++i) wrong += g[i] != 0xAB;
      std::printf("  upload %-6s %zu bytes from offset %zu: %zu wrong\n", backend_name(ctx->backend()), n, offset, wrong);
      EXPECT_EQ(wrong, 0u) << n << " bytes from offset " << offset << " on " << backend_name(ctx->backend());
    }
    pinned.release(host);
  }
}

// SwiGLU and GeGLU (Gemma's tanh gelu) forward and backward. CPU tol 1e-6: one exp or tanh and a
// few products per element. n = 517 runs CUDA's scalar kernels, n = 1024 the 8-wide ones; the two
// give the same bits on the same inputs.
TEST(OpHarness, SwiGlu) {
  for (const GatedAct act : {GatedAct::kSilu, GatedAct::kGeluTanh})
    for (const int64_t n : {int64_t{517}, int64_t{1024}}) for_each_case([act, n](DeviceContext& ctx, Inputs& in) {
      const bool gelu = act == GatedAct::kGeluTanh;
      const std::string op = gelu ? "geglu" : "swiglu";
      Tensor g = to_act(ctx, in.vec(n)), u = to_act(ctx, in.vec(n)), d = to_act(ctx, in.vec(n));
      const auto Gt = back(ctx, g), U = back(ctx, u), D = back(ctx, d);
      Tensor h = to_act(ctx, std::vector<float>(n)),
             dg = to_act(ctx, std::vector<float>(n)), du = to_act(ctx, std::vector<float>(n));
      ops::swiglu_fwd(h.raw(), g.raw(), u.raw(), n, ctx, act);
      ops::swiglu_bwd(dg.raw(), du.raw(), d.raw(), g.raw(), u.raw(), n, ctx, act);
      std::vector<double> hw(n), dgw(n), duw(n);
      for (int64_t i = 0; i < n; ++i) {
        const double x = Gt[i];
        double a, da;  // act(x) and its derivative
        if (gelu) {  // 0.5 x (1 + tanh(c (x + k x^3))), written independently of the twins
          const double c = std::sqrt(2.0 / M_PI), th = std::tanh(c * (x + 0.044715 * x * x * x));
          a = 0.5 * x * (1.0 + th);
          da = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * x * x);
        } else {
          const double sig = 1.0 / (1.0 + std::exp(-x));
          a = x * sig;
          da = sig * (1.0 + x * (1.0 - sig));
        }
        hw[i] = a * U[i];
        duw[i] = D[i] * a;
        dgw[i] = D[i] * U[i] * da;
      }
      report(ctx, (op + "_fwd").c_str(), in.adversarial, back(ctx, h), hw, tol(ctx, 1e-6, 4e-3));
      report(ctx, (op + "_bwd dgate").c_str(), in.adversarial, back(ctx, dg), dgw, tol(ctx, 1e-6, 4e-3));
      report(ctx, (op + "_bwd dup").c_str(), in.adversarial, back(ctx, du), duw, tol(ctx, 1e-6, 4e-3));
      if (n % 8 == 0) {  // the scalar path (n - 1 elements) against the wide one, bit for bit
        Tensor h2 = to_act(ctx, std::vector<float>(n)), dg2 = to_act(ctx, std::vector<float>(n)),
               du2 = to_act(ctx, std::vector<float>(n));
        ops::swiglu_fwd(h2.raw(), g.raw(), u.raw(), n - 1, ctx, act);
        ops::swiglu_bwd(dg2.raw(), du2.raw(), d.raw(), g.raw(), u.raw(), n - 1, ctx, act);
        const auto a1 = back(ctx, h), a2 = back(ctx, h2), b1 = back(ctx, dg), b2 = back(ctx, dg2);
        const auto c1 = back(ctx, du), c2 = back(ctx, du2);
        for (int64_t i = 0; i < n - 1; ++i) {
          ASSERT_EQ(a1[i], a2[i]) << op << "_fwd wide vs scalar at " << i;
          ASSERT_EQ(b1[i], b2[i]) << op << "_bwd dgate wide vs scalar at " << i;
          ASSERT_EQ(c1[i], c2[i]) << op << "_bwd dup wide vs scalar at " << i;
        }
      }
      // In place, as the model's backward runs it (dgate over gate, dup over up): the same bits as
      // into separate buffers, through the wide path (n) and the scalar one (n - 1 of an odd n).
      const int64_t m = n % 8 == 0 ? n : n - 1;
      Tensor gi = to_act(ctx, Gt), ui = to_act(ctx, U);
      ops::swiglu_bwd(gi.raw(), ui.raw(), d.raw(), gi.raw(), ui.raw(), m, ctx, act);
      const auto dg1 = back(ctx, dg), du1 = back(ctx, du), dgi = back(ctx, gi), dui = back(ctx, ui);
      for (int64_t i = 0; i < m; ++i) {
        ASSERT_EQ(dgi[i], dg1[i]) << op << "_bwd dgate in place at " << i;
        ASSERT_EQ(dui[i], du1[i]) << op << "_bwd dup in place at " << i;
      }
    });
}

// A float for a case's name: "%g" (0.0625, 50).
std::string num(float x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}

// Packed data's positions [B*T]: row b holds pieces of the given lengths (summing to T), each
// counting from 0.
std::vector<int64_t> packed_positions(int64_t B, int64_t T, const std::vector<std::vector<int64_t>>& pieces) {
  std::vector<int64_t> pos;
  for (int64_t b = 0; b < B; ++b) {
    for (const int64_t len : pieces[static_cast<size_t>(b)])
      for (int64_t t = 0; t < len; ++t) pos.push_back(t);
    EXPECT_EQ(static_cast<size_t>((b + 1) * T), pos.size()) << "row " << b << "'s pieces do not fill it";
  }
  return pos;
}

// RoPE with llama3 scaling, T = 67 (not a multiple of 64), forward then backward = identity.
// CPU tol 1e-5: f32 angles t * inv_freq (HF computes them in f32 too; the oracle uses the same
// f32 inv_freq, then double trig). On CUDA, D = 16 and 128 run the 8-wide kernel (half % 8 == 0),
// D = 24 the scalar one. Then packed data: each row rotated by its position in its piece.
TEST(OpHarness, Rope) {
  for (const int64_t D : {int64_t{16}, int64_t{128}, int64_t{24}}) for_each_case([D](DeviceContext& ctx, Inputs& in) {
    const int64_t B = 2, T = 67, nh = 3;
    RopeParams p;
    p.theta = 500000.0;
    p.head_dim = D;
    p.llama3 = true;
    p.factor = 8;
    p.low_freq_factor = 1;
    p.high_freq_factor = 4;
    p.original_max_position_embeddings = 32;
    Tensor cs = to_f32_dev(ctx, std::vector<float>(T * D / 2)), sn = to_f32_dev(ctx, std::vector<float>(T * D / 2));
    Tensor x = to_act(ctx, in.vec(B * T * nh * D));
    const auto X = back(ctx, x);
    ops::rope_tables(cs.data<float>(), sn.data<float>(), p, T, ctx);
    ops::rope_fwd(x.raw(), cs.data<float>(), sn.data<float>(), B, T, nh, D, ctx);
    const std::vector<float> inv = rope_inv_freq(p);
    std::vector<double> want(X.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < nh; ++h)
          for (int64_t i = 0; i < D / 2; ++i) {
            const size_t o = ((b * T + t) * nh + h) * D;
            const double a = static_cast<float>(t) * inv[i], c = std::cos(a), s = std::sin(a);
            want[o + i] = X[o + i] * c - X[o + i + D / 2] * s;
            want[o + i + D / 2] = X[o + i + D / 2] * c + X[o + i] * s;
          }
    report(ctx, ("rope_fwd D" + std::to_string(D)).c_str(), in.adversarial, back(ctx, x), want, tol(ctx, 1e-5, 4e-3));
    ops::rope_bwd(x.raw(), cs.data<float>(), sn.data<float>(), B, T, nh, D, ctx);
    // CUDA: two bf16 roundings (after the forward and after the backward).
    report(ctx, ("rope_bwd(rope_fwd(x)) D" + std::to_string(D)).c_str(), in.adversarial, back(ctx, x), std::vector<double>(X.begin(), X.end()),
           tol(ctx, 1e-5, 8e-3));
    // Packed data: row r rotated by pos[r] (pieces restarting at 0), not by its index in the sequence.
    const std::vector<int64_t> pos = packed_positions(B, T, {{20, 1, 30, 16}, {5, 62}});
    Tensor pos_dev = Tensor::from_vector({B * T}, DType::kI64, pos).to(ctx.compute_device());
    Tensor y = to_act(ctx, std::vector<float>(X.begin(), X.end()));
    ops::rope_fwd(y.raw(), cs.data<float>(), sn.data<float>(), B, T, nh, D, ctx, pos_dev.data<int64_t>());
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t h = 0; h < nh; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          const size_t o = (r * nh + h) * D;
          const double a = static_cast<float>(pos[r]) * inv[i], c = std::cos(a), s = std::sin(a);
          want[o + i] = X[o + i] * c - X[o + i + D / 2] * s;
          want[o + i + D / 2] = X[o + i + D / 2] * c + X[o + i] * s;
        }
    report(ctx, ("rope_fwd packed D" + std::to_string(D)).c_str(), in.adversarial, back(ctx, y), want, tol(ctx, 1e-5, 4e-3));
    ops::rope_bwd(y.raw(), cs.data<float>(), sn.data<float>(), B, T, nh, D, ctx, pos_dev.data<int64_t>());
    report(ctx, ("rope_bwd(rope_fwd(x)) packed D" + std::to_string(D)).c_str(), in.adversarial, back(ctx, y),
           std::vector<double>(X.begin(), X.end()), tol(ctx, 1e-5, 8e-3));
    // Rows of heads ld apart (q|k's gradients inside q|k|v's rows): the packed rotation's bits in
    // each row's first nh D elements, the rest of the row untouched; forward and backward.
    const int64_t ld = (nh + 1) * D;
    std::vector<float> wide(static_cast<size_t>(B * T * ld));
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t j = 0; j < ld; ++j)
        wide[r * ld + j] = j < nh * D ? X[r * nh * D + j] : 7.0f + static_cast<float>(j % 5);
    Tensor z = to_act(ctx, wide), packed = to_act(ctx, std::vector<float>(X.begin(), X.end()));
    const std::vector<float> wide_in = back(ctx, z);
    for (const bool fwd : {true, false}) {
      if (fwd) {
        ops::rope_fwd(z.raw(), cs.data<float>(), sn.data<float>(), B, T, nh, D, ctx, nullptr, ld);
        ops::rope_fwd(packed.raw(), cs.data<float>(), sn.data<float>(), B, T, nh, D, ctx);
      } else {
        ops::rope_bwd(z.raw(), cs.data<float>(), sn.data<float>(), B, T, nh, D, ctx, nullptr, ld);
        ops::rope_bwd(packed.raw(), cs.data<float>(), sn.data<float>(), B, T, nh, D, ctx);
      }
      const std::vector<float> got = back(ctx, z), ref = back(ctx, packed);
      int64_t bad = 0;
      for (int64_t r = 0; r < B * T; ++r)
        for (int64_t j = 0; j < ld; ++j) {
          const float want_v = j < nh * D ? ref[r * nh * D + j] : wide_in[r * ld + j];
          bad += std::memcmp(&got[r * ld + j], &want_v, sizeof(float)) != 0;
        }
      EXPECT_EQ(bad, 0) << (fwd ? "rope_fwd" : "rope_bwd") << " rows " << ld << " apart, D " << D << ", "
                        << backend_name(ctx.backend());
    }
  });
}

// Double oracle of causal GQA attention: out and, given dout, dq/dk/dv. pos (packed data, [B*T]):
// query t reads keys of its own piece only, u >= t - pos[t] (written independently of the twins).
// scores: s = (q . k) * scale (scale 0: 1 / sqrt(D)), then with softcap > 0 s = softcap *
// tanh(s / softcap) before the mask; the backward through it multiplies by 1 - tanh^2. max_score:
// the largest |(q . k) * scale| before the cap (what f32's conditioning scales with).
struct AttentionOracle {
  std::vector<double> out, dq, dk, dv;
  double max_score = 0;
};
AttentionOracle attention_oracle(const std::vector<float>& Q, const std::vector<float>& K, const std::vector<float>& V,
                                 const std::vector<float>& dO, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                 int64_t window = 0, const std::vector<int64_t>* pos = nullptr,
                                 AttentionScores scores = {}) {
  AttentionOracle r;
  r.out.assign(Q.size(), 0.0);
  r.dq.assign(Q.size(), 0.0);
  r.dk.assign(K.size(), 0.0);
  r.dv.assign(V.size(), 0.0);
  const int64_t ratio = H / Hkv;
  const double scale = scores.scale != 0.0f ? double(scores.scale) : 1.0 / std::sqrt(double(D));
  const double cap = scores.softcap;
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * T + t) * H + h) * D; };
  auto ki = [&](int64_t b, int64_t t, int64_t h) { return ((b * T + t) * Hkv + h) * D; };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t hk = h / ratio;
        // A sliding window: keys t - window < u <= t (transformers' rule), written independently.
        int64_t first = window > 0 && t >= window ? t - window + 1 : 0;
        if (pos) first = std::max(first, t - (*pos)[static_cast<size_t>(b * T + t)]);
        std::vector<double> p(t + 1, 0.0), dp(t + 1, 0.0), dcap(t + 1, 1.0);  // dcap: d capped / d raw
        double mx = -1e300;
        for (int64_t u = first; u <= t; ++u) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(Q[qi(b, t, h) + d]) * K[ki(b, u, hk) + d];
          p[u] = dot * scale;
          r.max_score = std::max(r.max_score, std::fabs(p[u]));
          if (cap > 0) {
            const double th = std::tanh(p[u] / cap);
            p[u] = cap * th;
            dcap[u] = 1.0 - th * th;
          }
          mx = std::max(mx, p[u]);
        }
        double sum = 0;
        for (int64_t u = first; u <= t; ++u) sum += (p[u] = std::exp(p[u] - mx));
        for (int64_t u = first; u <= t; ++u) p[u] /= sum;
        double pdp = 0;
        for (int64_t u = first; u <= t; ++u) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            r.out[qi(b, t, h) + d] += p[u] * V[ki(b, u, hk) + d];
            r.dv[ki(b, u, hk) + d] += p[u] * dO[qi(b, t, h) + d];
            dot += double(dO[qi(b, t, h) + d]) * V[ki(b, u, hk) + d];
          }
          dp[u] = dot;
          pdp += p[u] * dot;
        }
        for (int64_t u = first; u <= t; ++u) {
          const double ds = p[u] * (dp[u] - pdp) * dcap[u] * scale;
          for (int64_t d = 0; d < D; ++d) {
            r.dq[qi(b, t, h) + d] += ds * K[ki(b, u, hk) + d];
            r.dk[ki(b, u, hk) + d] += ds * Q[qi(b, t, h) + d];
          }
        }
      }
  return r;
}

// Causal GQA attention forward and backward, GQA ratios 1, 3 and 4, T = 67 (not a multiple of
// 64); adversarial inputs give large scores and saturated softmaxes, and a third kind gives every
// row very negative scores (all keys equal, q = -40 k: the Hopper fused-backward trap). T 128 and
// 200 too for the negative rows.
// CPU tol: 1e-5 (softmax with the max subtracted in f32, T-term f32 sums), widened by the
// conditioning of large scores: a score of magnitude S is known to f32's ~6e-8 * S, which moves
// its probability by that much relative: tol = max(1e-5, 4 * 6e-8 * max|S|).
// Adversarial inputs here: v and dout x100, scores up to ~|70| (saturated rows); not x100 scores,
// which only measure f32's conditioning.
// CUDA tol (cuDNN flash attention: bf16 in and out, S in f32 from the held bf16 inputs, P rounded
// to bf16 before P.V and in the backward, 2^-9 relative each): 1e-2 of the output scale for out,
// 2e-2 for the gradients (two such products each).
// Gemma's scores: a scale other than 1 / sqrt(D) and a tanh soft-cap, with and without a sliding
// window, D 16 and 256; the caps put random inputs' scores in tanh's bend and saturate adversarial
// ones (and a Gemma 2-like cap of 50 at scale 1/16). The tolerances are the same: the cap's tanh
// is f32 work on the f32 scores (CPU: it moves a score by no more than the score's own rounding).
// On CUDA soft-capped scores run the eager attention (attention_eager.cu: scores in memory, P and
// dS rounded to bf16 as cuDNN's are), packed data too, within the same tolerances.
TEST(OpHarness, Attention) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    if (!ops::has_backend(ctx.backend(), "attention_fwd")) {
      std::printf("  attention: no %s twin in this build\n", backend_name(ctx.backend()));
      return;
    }
    struct Shape {
      int64_t T, ratio;
      bool negative_rows;
      int64_t window = 0;  // a sliding window (Mistral), 0: none
      bool packed = false;  // packed data: pieces of their own within each sequence
      int64_t D = 64;
      AttentionScores scores = {};  // Gemma: another scale, a soft-cap
    };
    std::vector<Shape> shapes = {{67, 1, false}, {67, 3, false}, {67, 4, false}, {67, 4, true}, {67, 2, false, 16},
                                 {67, 4, false, 3}, {67, 1, false, 0, true}, {67, 4, false, 0, true},
                                 {67, 2, false, 8, true},
                                 {67, 2, false, 0, false, 16, {1.0f, 0.0f}}, {67, 2, false, 0, false, 16, {1.0f, 1.0f}},
                                 {67, 4, false, 16, false, 16, {1.0f, 1.0f}}, {67, 2, false, 0, false, 256, {0.1f, 0.5f}},
                                 {67, 1, false, 8, false, 256, {0.1f, 0.5f}}, {67, 2, false, 0, true, 16, {1.0f, 1.0f}}};
    if (in.adversarial) shapes.push_back({128, 2, true}), shapes.push_back({200, 4, true}), shapes.push_back({200, 2, false, 64});
    if (in.adversarial) shapes.push_back({128, 4, false, 32, false, 256, {0.0625f, 50.0f}});
    for (const Shape& sh : shapes) {
      const int64_t B = 2, T = sh.T, Hkv = 2, H = Hkv * sh.ratio, D = sh.D;
      const float qk = in.adversarial ? 3.0f : 0.5f;
      std::vector<float> Qf = in.bounded(B * T * H * D, qk), Kf = in.bounded(B * T * Hkv * D, qk);
      if (sh.negative_rows) {  // every score of every row about -40 * |w|^2 / sqrt(D)
        std::vector<float> w = in.bounded(D, 1.0f);
        for (auto& x : w) x = std::fabs(x) + 0.5f;
        for (int64_t i = 0; i < B * T * Hkv; ++i)
          for (int64_t d = 0; d < D; ++d) Kf[i * D + d] = w[d];
        for (int64_t i = 0; i < B * T * H; ++i)
          for (int64_t d = 0; d < D; ++d) Qf[i * D + d] = -40.0f * w[d];
      }
      // (Negative rows: v and dout of unit scale; dq is then a sum of terms that cancel to 0,
      // whose f32 noise grows with their magnitude, not with the output's.)
      auto vals = [&](size_t n) { return sh.negative_rows ? in.bounded(n) : in.vec(n); };
      Tensor q = to_act(ctx, Qf), k = to_act(ctx, Kf), v = to_act(ctx, vals(B * T * Hkv * D)),
             dout = to_act(ctx, vals(B * T * H * D)), out = to_act(ctx, std::vector<float>(Qf.size()));
      Tensor dq = to_act(ctx, std::vector<float>(Qf.size(), 9.0f)), dk = to_act(ctx, std::vector<float>(Kf.size(), 9.0f)),
             dv = to_act(ctx, std::vector<float>(Kf.size(), 9.0f));  // overwritten
      Tensor saved = Tensor::zeros({static_cast<int64_t>(attention_saved_bytes(ctx.backend(), B, T, H, Hkv, D))},
                                   DType::kU8, ctx.compute_device());
      // Packed: pieces of 20, 1, 30 and T - 51 rows, and of 5 and T - 5; the graphs sized for 8 (2 unused).
      const std::vector<int64_t> pos = packed_positions(B, T, {{20, 1, 30, T - 51}, {5, T - 5}});
      const int64_t P = 8;
      std::vector<int32_t> ragged(static_cast<size_t>(ragged_layout_ints(P)));
      EXPECT_EQ(6, ragged_layout(ragged.data(), pos.data(), B * T, P, H, Hkv, D));
      Tensor pos_dev = Tensor::from_vector({B * T}, DType::kI64, pos).to(ctx.compute_device());
      Tensor ragged_dev =
          Tensor::from_vector({static_cast<int64_t>(ragged.size())}, DType::kI32, ragged).to(ctx.compute_device());
      const AttentionPieces pieces{pos_dev.data<int64_t>(), ragged_dev.data<int32_t>(), P};
      const AttentionPieces* pc = sh.packed ? &pieces : nullptr;
      const std::string name = "attention T" + std::to_string(T) + " gqa " + std::to_string(sh.ratio) +
                               (sh.negative_rows ? " neg-rows" : "") +
                               (sh.window ? " window " + std::to_string(sh.window) : "") +
                               (sh.packed ? " packed" : "") + (D != 64 ? " D" + std::to_string(D) : "") +
                               (sh.scores.scale != 0.0f ? " scale " + num(sh.scores.scale) : "") +
                               (sh.scores.softcap > 0.0f ? " softcap " + num(sh.scores.softcap) : "");
      ops::attention_fwd(out.raw(), saved.raw(), q.raw(), k.raw(), v.raw(), B, T, H, Hkv, D, ctx, sh.window, pc,
                         sh.scores);
      ops::attention_bwd(dq.raw(), dk.raw(), dv.raw(), dout.raw(), q.raw(), k.raw(), v.raw(), out.raw(), saved.raw(),
                         B, T, H, Hkv, D, ctx, sh.window, pc, sh.scores);
      if (sh.scores.softcap <= 0.0f) {
        // dq|dk|dv side by side in rows ld apart (q|k|v's fused backward; packed: the ragged layout's
        // offsets for them): the same bits per row
        const int64_t ld = (H + 2 * Hkv) * D;
        Tensor dqkv = to_act(ctx, std::vector<float>(static_cast<size_t>(B * T * ld), 9.0f));
        auto* base = static_cast<uint8_t*>(dqkv.raw());
        const size_t esz = dtype_size(ctx.activation_dtype());
        std::vector<int32_t> ragged_ld(ragged.size());
        ragged_layout(ragged_ld.data(), pos.data(), B * T, P, H, Hkv, D, ld);
        Tensor ragged_ld_dev =
            Tensor::from_vector({static_cast<int64_t>(ragged_ld.size())}, DType::kI32, ragged_ld).to(ctx.compute_device());
        const AttentionPieces pieces_ld{pos_dev.data<int64_t>(), ragged_ld_dev.data<int32_t>(), P};
        ops::attention_bwd(base, base + H * D * esz, base + (H + Hkv) * D * esz, dout.raw(), q.raw(), k.raw(), v.raw(),
                           out.raw(), saved.raw(), B, T, H, Hkv, D, ctx, sh.window, sh.packed ? &pieces_ld : nullptr,
                           sh.scores, ld);
        const std::vector<float> got = back(ctx, dqkv), gq = back(ctx, dq), gk = back(ctx, dk), gv = back(ctx, dv);
        int64_t bad = 0;
        for (int64_t n = 0; n < B * T; ++n) {
          bad += std::memcmp(&got[n * ld], &gq[n * H * D], H * D * sizeof(float)) != 0;
          bad += std::memcmp(&got[n * ld + H * D], &gk[n * Hkv * D], Hkv * D * sizeof(float)) != 0;
          bad += std::memcmp(&got[n * ld + (H + Hkv) * D], &gv[n * Hkv * D], Hkv * D * sizeof(float)) != 0;
        }
        EXPECT_EQ(bad, 0) << name << ": dq|dk|dv side by side differ from packed (rows of " << ld << ")";
      }
      const AttentionOracle o = attention_oracle(back(ctx, q), back(ctx, k), back(ctx, v), back(ctx, dout), B, T, H,
                                                 Hkv, D, sh.window, sh.packed ? &pos : nullptr, sh.scores);
      const double cond = o.max_score;
      const double t_cpu = std::max(1e-5, 4 * 6e-8 * cond);
      const double t_out = tol(ctx, t_cpu, 1e-2), t_grad = tol(ctx, t_cpu, 2e-2);
      for (const auto& [what, got, want, t] :
           {std::tuple{" out", back(ctx, out), o.out, t_out}, std::tuple{" dq", back(ctx, dq), o.dq, t_grad},
            std::tuple{" dk", back(ctx, dk), o.dk, t_grad}, std::tuple{" dv", back(ctx, dv), o.dv, t_grad}}) {
        bool finite = true;
        for (float x : got) finite = finite && std::isfinite(x);
        EXPECT_TRUE(finite) << name << what << ": NaN or Inf";
        report(ctx, (name + what).c_str(), in.adversarial, got, want, t);
      }
    }
  });
}

#if QSHARD_WITH_CUDA
// The eager attention in chunks of 64 query rows (cuda::eager_attention_fwd / _bwd with a layout
// of the smallest chunk): T 200 is four chunks, the last one short; with a window the later
// chunks start at a key past 0; packed pieces cross the chunks. Plain and soft-capped scores,
// GQA 1 and 4, D 64 and 256. Against the oracle, with attention's CUDA tolerances; and the
// backward run twice gives the same bits (fixed summation order).
TEST(OpHarness, AttentionEagerChunks) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    if (!ctx.is_cuda()) return;
    struct Shape {
      int64_t ratio, window;
      bool packed;
      int64_t D;
      AttentionScores scores;
    };
    for (const Shape& sh : {Shape{1, 0, false, 64, {}}, Shape{4, 0, false, 64, {0.0f, 1.0f}},
                            Shape{2, 48, false, 64, {0.0f, 1.0f}}, Shape{2, 0, true, 64, {0.0f, 1.0f}},
                            Shape{2, 100, true, 256, {0.0625f, 50.0f}}}) {
      const int64_t B = 2, T = 200, Hkv = 2, H = Hkv * sh.ratio, D = sh.D;
      const EagerAttentionLayout layout = eager_attention_layout(T, Hkv, D, /*chunk_bytes=*/1);
      ASSERT_EQ(64, layout.rows);
      const float qk = in.adversarial ? 3.0f : 0.5f;
      std::vector<float> Qf = in.bounded(B * T * H * D, qk), Kf = in.bounded(B * T * Hkv * D, qk);
      Tensor q = to_act(ctx, Qf), k = to_act(ctx, Kf), v = to_act(ctx, in.vec(B * T * Hkv * D)),
             dout = to_act(ctx, in.vec(B * T * H * D)), out = to_act(ctx, std::vector<float>(Qf.size()));
      Tensor dq = to_act(ctx, std::vector<float>(Qf.size(), 9.0f)), dk = to_act(ctx, std::vector<float>(Kf.size(), 9.0f)),
             dv = to_act(ctx, std::vector<float>(Kf.size(), 9.0f));
      Tensor saved = Tensor::zeros({B * H * T * 4}, DType::kU8, ctx.compute_device());
      Tensor ws = Tensor::zeros({static_cast<int64_t>(layout.total())}, DType::kU8, ctx.compute_device());
      const std::vector<int64_t> pos = packed_positions(B, T, {{70, 1, 60, T - 131}, {5, T - 5}});
      Tensor pos_dev = Tensor::from_vector({B * T}, DType::kI64, pos).to(ctx.compute_device());
      const int64_t* pc = sh.packed ? pos_dev.data<int64_t>() : nullptr;
      auto h = [](Tensor& t) { return static_cast<uint16_t*>(t.raw()); };
      cuda::eager_attention_fwd(h(out), saved.raw(), h(q), h(k), h(v), B, H, ctx, sh.window, pc, sh.scores, layout,
                                ws.raw());
      cuda::eager_attention_bwd(h(dq), h(dk), h(dv), h(dout), h(q), h(k), h(v), h(out), saved.raw(), B, H, ctx,
                                sh.window, pc, sh.scores, layout, ws.raw());
      const std::vector<float> dq1 = back(ctx, dq), dk1 = back(ctx, dk), dv1 = back(ctx, dv);
      cuda::eager_attention_bwd(h(dq), h(dk), h(dv), h(dout), h(q), h(k), h(v), h(out), saved.raw(), B, H, ctx,
                                sh.window, pc, sh.scores, layout, ws.raw());
      const AttentionOracle o = attention_oracle(back(ctx, q), back(ctx, k), back(ctx, v), back(ctx, dout), B, T, H,
                                                 Hkv, D, sh.window, sh.packed ? &pos : nullptr, sh.scores);
      const std::string name = "eager chunks gqa " + std::to_string(sh.ratio) +
                               (sh.window ? " window " + std::to_string(sh.window) : "") + (sh.packed ? " packed" : "") +
                               " D" + std::to_string(D) +
                               (sh.scores.softcap > 0.0f ? " softcap " + num(sh.scores.softcap) : "");
      for (const auto& [what, got, want, t] :
           {std::tuple{" out", back(ctx, out), o.out, 1e-2}, std::tuple{" dq", dq1, o.dq, 2e-2},
            std::tuple{" dk", dk1, o.dk, 2e-2}, std::tuple{" dv", dv1, o.dv, 2e-2}})
        report(ctx, (name + what).c_str(), in.adversarial, got, want, t);
      EXPECT_TRUE(back(ctx, dq) == dq1 && back(ctx, dk) == dk1 && back(ctx, dv) == dv1)
          << name << ": the backward run twice differs";
    }
  });
}
#endif

#if QSHARD_WITH_CUDA && QSHARD_WITH_CUDNN
// cuDNN's deterministic backward in calls of n sequences (cuda::set_attention_backward_sequences):
// each sequence's attention is its own, so 6 sequences in calls of 3, 2 and 1 give the whole
// batch's gradients bit for bit (and the oracle's, within attention's CUDA tolerances), with and
// without a sliding window, GQA 4, D 64 and 128. And the automatic choice at the 8B layer's shapes:
// 4 x 2048 in one call (1.2 GB of workspace); 8 x 2048, whose one call would want 2.4 GB (over
// the 2 GiB limit; before, the non-deterministic algorithm ran there), in calls of fewer sequences,
// still deterministic.
TEST(OpHarness, AttentionBackwardInChunks) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    if (!ctx.is_cuda()) return;
    struct Shape {
      int64_t window, D;
    };
    for (const Shape& sh : {Shape{0, 64}, Shape{16, 64}, Shape{0, 128}}) {
      const int64_t B = 6, T = 67, Hkv = 2, H = 8, D = sh.D;
      const float qk = in.adversarial ? 3.0f : 0.5f;
      std::vector<float> Qf = in.bounded(B * T * H * D, qk), Kf = in.bounded(B * T * Hkv * D, qk);
      Tensor q = to_act(ctx, Qf), k = to_act(ctx, Kf), v = to_act(ctx, in.vec(B * T * Hkv * D)),
             dout = to_act(ctx, in.vec(B * T * H * D)), out = to_act(ctx, std::vector<float>(Qf.size()));
      Tensor dq = to_act(ctx, std::vector<float>(Qf.size(), 9.0f)), dk = to_act(ctx, std::vector<float>(Kf.size(), 9.0f)),
             dv = to_act(ctx, std::vector<float>(Kf.size(), 9.0f));
      Tensor saved = Tensor::zeros({static_cast<int64_t>(attention_saved_bytes(ctx.backend(), B, T, H, Hkv, D))},
                                   DType::kU8, ctx.compute_device());
      ops::attention_fwd(out.raw(), saved.raw(), q.raw(), k.raw(), v.raw(), B, T, H, Hkv, D, ctx, sh.window);
      auto backward = [&] {
        ops::attention_bwd(dq.raw(), dk.raw(), dv.raw(), dout.raw(), q.raw(), k.raw(), v.raw(), out.raw(), saved.raw(),
                           B, T, H, Hkv, D, ctx, sh.window);
        return std::vector<std::vector<float>>{back(ctx, dq), back(ctx, dk), back(ctx, dv)};
      };
      const cuda::AttentionBackwardPlan whole = cuda::attention_backward_plan(ctx, B, T, H, Hkv, D, sh.window);
      ASSERT_EQ(whole.sequences_per_call, B);
      ASSERT_TRUE(whole.deterministic);
      const std::vector<std::vector<float>> want = backward();
      const AttentionOracle o = attention_oracle(back(ctx, q), back(ctx, k), back(ctx, v), back(ctx, dout), B, T, H,
                                                 Hkv, D, sh.window, nullptr, {});
      for (const int64_t n : {3, 2, 1}) {
        cuda::set_attention_backward_sequences(ctx, n);
        const cuda::AttentionBackwardPlan plan = cuda::attention_backward_plan(ctx, B, T, H, Hkv, D, sh.window);
        EXPECT_EQ(plan.sequences_per_call, n);
        EXPECT_TRUE(plan.deterministic);
        const std::vector<std::vector<float>> got = backward();
        const std::string name = "attention backward in calls of " + std::to_string(n) +
                                 (sh.window ? " window " + std::to_string(sh.window) : "") + " D" + std::to_string(D);
        report(ctx, (name + " dq").c_str(), in.adversarial, got[0], o.dq, 2e-2);
        report(ctx, (name + " dk").c_str(), in.adversarial, got[1], o.dk, 2e-2);
        report(ctx, (name + " dv").c_str(), in.adversarial, got[2], o.dv, 2e-2);
        EXPECT_TRUE(got == want) << name << ": not the whole batch's gradients bit for bit";
      }
      cuda::set_attention_backward_sequences(ctx, 0);
    }
    if (in.adversarial) return;  // the 8B shapes once
    const cuda::AttentionBackwardPlan four = cuda::attention_backward_plan(ctx, 4, 2048, 32, 8, 128);
    EXPECT_EQ(four.sequences_per_call, 4);
    EXPECT_TRUE(four.deterministic);
    const cuda::AttentionBackwardPlan eight = cuda::attention_backward_plan(ctx, 8, 2048, 32, 8, 128);
    std::printf("  8 x 2048: %lld sequences a call, %s, %.2f GB of workspace\n",
                static_cast<long long>(eight.sequences_per_call),
                eight.deterministic ? "deterministic" : "non-deterministic", eight.workspace_bytes / 1e9);
    EXPECT_TRUE(eight.deterministic);
    EXPECT_LT(eight.sequences_per_call, 8);
    EXPECT_EQ(8 % eight.sequences_per_call, 0);
    EXPECT_LE(eight.workspace_bytes, int64_t{2} << 30);
    // Lean (a job with a memory budget): calls of fewer sequences, no more workspace.
    cuda::set_attention_lean_workspace(ctx, true);
    const cuda::AttentionBackwardPlan lean = cuda::attention_backward_plan(ctx, 8, 2048, 32, 8, 128);
    cuda::set_attention_lean_workspace(ctx, false);
    std::printf("  8 x 2048, lean: %lld sequences a call, %s, %.2f GB of workspace\n",
                static_cast<long long>(lean.sequences_per_call),
                lean.deterministic ? "deterministic" : "non-deterministic", lean.workspace_bytes / 1e9);
    EXPECT_TRUE(lean.deterministic);
    EXPECT_LE(lean.sequences_per_call, eight.sequences_per_call);
    EXPECT_LE(lean.workspace_bytes, eight.workspace_bytes);
  });
}
#endif

// Generation's cached attention: T queries at positions [P, P + T) over a cache of P + T keys,
// against the oracle of the whole sequence's causal attention (its rows P..P+T-1); the prompt
// (P = 0), one token after a long prefix, a few tokens after one; GQA 1 and 4, D 64 and 128; and
// Gemma's scores (another scale, a tanh soft-cap, with and without a window) at D 16 and 256.
// CPU tol: attention's (same arithmetic), and the CPU twin must give attention_fwd's rows bit for
// bit (the generate path's promise that a cached step is the full forward's).
// CUDA tol (this project's kernel: scores, softmax and P.V in f32 from the bf16 inputs, one bf16
// rounding of out): 4e-3 of the output scale.
TEST(OpHarness, AttentionCached) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    struct Shape {
      int64_t P, T, ratio, D;
      int64_t window = 0;  // a sliding window (Mistral), 0: none
      AttentionScores scores = {};  // Gemma: another scale, a soft-cap
    };
    for (const Shape& sh :
         {Shape{0, 5, 1, 64}, Shape{37, 1, 4, 64}, Shape{200, 3, 4, 128}, Shape{129, 1, 1, 128}, Shape{9, 2, 2, 48},
          Shape{37, 1, 4, 64, 16}, Shape{200, 3, 2, 128, 64}, Shape{0, 9, 1, 64, 4}, Shape{37, 1, 4, 16, 0, {1.0f, 0.0f}},
          Shape{37, 3, 2, 16, 0, {1.0f, 1.0f}}, Shape{37, 2, 2, 16, 8, {1.0f, 1.0f}},
          Shape{200, 3, 2, 256, 0, {0.1f, 0.5f}}, Shape{129, 1, 4, 256, 64, {0.1f, 0.5f}},
          Shape{0, 9, 1, 256, 4, {0.0625f, 50.0f}}}) {
      const int64_t S = sh.P + sh.T, Hkv = 2, H = Hkv * sh.ratio, D = sh.D;
      const float qk = in.adversarial ? 3.0f : 0.5f;
      const std::vector<float> Qf = in.bounded(S * H * D, qk), Kf = in.bounded(S * Hkv * D, qk), Vf = in.vec(S * Hkv * D);
      Tensor k = to_act(ctx, Kf), v = to_act(ctx, Vf);
      const std::vector<float> Qnew(Qf.begin() + sh.P * H * D, Qf.end());
      Tensor q = to_act(ctx, Qnew), out = to_act(ctx, std::vector<float>(Qnew.size(), 9.0f));
      ops::attention_cached_fwd(out.raw(), q.raw(), k.raw(), v.raw(), sh.T, sh.P, H, Hkv, D, ctx, sh.window, sh.scores);
      // The oracle over the whole sequence, queries as the backend holds them.
      std::vector<float> Qheld = Qf;
      const std::vector<float> qb = back(ctx, q);
      std::copy(qb.begin(), qb.end(), Qheld.begin() + sh.P * H * D);
      const AttentionOracle o =
          attention_oracle(Qheld, back(ctx, k), back(ctx, v), std::vector<float>(Qf.size(), 0.0f), 1, S, H, Hkv, D,
                           sh.window, nullptr, sh.scores);
      const std::vector<double> want(o.out.begin() + sh.P * H * D, o.out.end());
      const std::vector<float> got = back(ctx, out);
      const double t_cpu = std::max(1e-5, 4 * 6e-8 * o.max_score);
      const std::string name = "attention_cached P" + std::to_string(sh.P) + " T" + std::to_string(sh.T) + " gqa " +
                               std::to_string(sh.ratio) + " D" + std::to_string(D) +
                               (sh.window ? " window " + std::to_string(sh.window) : "") +
                               (sh.scores.scale != 0.0f ? " scale " + num(sh.scores.scale) : "") +
                               (sh.scores.softcap > 0.0f ? " softcap " + num(sh.scores.softcap) : "");
      report(ctx, name.c_str(), in.adversarial, got, want, tol(ctx, t_cpu, 4e-3));
      if (ctx.backend() == Backend::kCpu) {  // the same bits as attention_fwd's rows
        Tensor qa = to_act(ctx, Qf), full = to_act(ctx, std::vector<float>(Qf.size()));
        Tensor saved = Tensor::zeros({static_cast<int64_t>(attention_saved_bytes(ctx.backend(), 1, S, H, Hkv, D))},
                                     DType::kU8, ctx.compute_device());
        ops::attention_fwd(full.raw(), saved.raw(), qa.raw(), k.raw(), v.raw(), 1, S, H, Hkv, D, ctx, sh.window,
                           nullptr, sh.scores);
        const std::vector<float> f = back(ctx, full);
        EXPECT_EQ(0, std::memcmp(got.data(), f.data() + sh.P * H * D, got.size() * 4)) << name << ": not attention_fwd's bits";
      }
    }
  });
}

// Cross entropy in row chunks, with ignored rows; loss sum on the device, logits overwritten by
// their gradient. CPU tol 1e-5: log-sum-exp over V = 301 in f32.
TEST(OpHarness, CrossEntropy) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    const int64_t N = 11, V = 301;
    const auto L = in.vec(N * V, 2.0f);
    std::vector<int64_t> tg(N);
    for (int64_t n = 0; n < N; ++n) tg[n] = n % 4 == 2 ? kIgnoreIndex : (n * 37) % V;
    Tensor logits = Tensor::from_vector({N * V}, DType::kF32, L).to(ctx.compute_device());  // f32 chunks
    Tensor targets = Tensor::from_vector({N}, DType::kI64, tg).to(ctx.compute_device());
    Tensor loss = Tensor::zeros({1}, DType::kF64, ctx.compute_device());
    const float scale = 1.0f / 8.0f;
    for (int64_t r0 = 0; r0 < N; r0 += 4)  // chunks of 4 rows, the last one short
      ops::cross_entropy_fwd_bwd(static_cast<float*>(logits.raw()) + r0 * V, loss.data<double>(),
                                 targets.data<int64_t>() + r0, std::min<int64_t>(4, N - r0), V, scale, ctx);
    std::vector<double> gwant(N * V, 0.0);
    double lwant = 0;
    for (int64_t n = 0; n < N; ++n) {
      if (tg[n] == kIgnoreIndex) continue;
      double mx = -1e300, s = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max<double>(mx, L[n * V + v]);
      for (int64_t v = 0; v < V; ++v) s += std::exp(L[n * V + v] - mx);
      const double lse = mx + std::log(s);
      lwant += lse - L[n * V + tg[n]];
      for (int64_t v = 0; v < V; ++v) gwant[n * V + v] = (std::exp(L[n * V + v] - lse) - (v == tg[n])) * scale;
    }
    ctx.compute().synchronize();
    const double lgot = loss.to(Device::kCpu).data<double>()[0];
    std::printf("  cross_entropy loss sum %s: %.9f want %.9f\n", in.adversarial ? "adversarial" : "random", lgot, lwant);
    EXPECT_NEAR(lgot, lwant, tol(ctx, 1e-5, 2e-5) * std::max(1.0, std::fabs(lwant)));
    std::vector<float> g(N * V);
    ctx.compute().synchronize();
    const Tensor gh = logits.to(Device::kCpu);
    std::copy(gh.data<float>(), gh.data<float>() + N * V, g.begin());
    // CUDA: expf / logf are within 2 ulp of the correctly rounded results.
    report(ctx, "cross_entropy dlogits", in.adversarial, g, gwant, tol(ctx, 1e-5, 2e-5));

    // The gradient written in the activation dtype (the LM head's bf16 dx GEMM on CUDA) instead of
    // over the logits: the bits convert() gives of the in-place f32 gradient, and the same loss.
    const DType act_t = ctx.activation_dtype();
    Tensor logits2 = Tensor::from_vector({N * V}, DType::kF32, L).to(ctx.compute_device());
    Tensor loss2 = Tensor::zeros({1}, DType::kF64, ctx.compute_device());
    Tensor dl = Tensor::zeros({N * V}, act_t, ctx.compute_device());
    Tensor dl_ref = Tensor::zeros({N * V}, act_t, ctx.compute_device());
    // Poison: every element must be written (ignored rows with zeros).
    ops::convert(dl.raw(), act_t, Tensor::from_vector({N * V}, DType::kF32, std::vector<float>(N * V, 7.0f))
                                      .to(ctx.compute_device()).raw(), DType::kF32, N * V, ctx);
    for (int64_t r0 = 0; r0 < N; r0 += 4)
      ops::cross_entropy_fwd_bwd(static_cast<float*>(logits2.raw()) + r0 * V, loss2.data<double>(),
                                 targets.data<int64_t>() + r0, std::min<int64_t>(4, N - r0), V, scale, ctx,
                                 static_cast<char*>(dl.raw()) + r0 * V * dtype_size(act_t), act_t);
    ops::convert(dl_ref.raw(), act_t, logits.raw(), DType::kF32, N * V, ctx);
    ctx.compute().synchronize();
    EXPECT_EQ(loss2.to(Device::kCpu).data<double>()[0], lgot) << "the loss with the gradient written apart";
    const Tensor a = dl.to(Device::kCpu), b = dl_ref.to(Device::kCpu);
    EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), static_cast<size_t>(N * V) * dtype_size(act_t)))
        << "cross_entropy's gradient in " << dtype_torch_name(act_t) << " on " << backend_name(ctx.backend())
        << " is not convert() of the in-place f32 gradient";

    // Gemma 2's final soft-cap: the raw logits through logit_softcap, the loss of the capped ones,
    // the gradient of the raw ones (times 1 - (y / cap)^2). The cap bends random logits (3) and
    // saturates adversarial ones (30). Against the double oracle from the raw logits, tolerances as
    // above (the f32 cap moves a logit by its own rounding); the gradient written apart in f32, bf16
    // and f16 is the bits convert() gives of the in-place f32 one, with the same loss.
    const float cap = in.adversarial ? 30.0f : 3.0f;
    Tensor capped_dev = Tensor::from_vector({N * V}, DType::kF32, L).to(ctx.compute_device());
    ops::logit_softcap(capped_dev.data<float>(), N * V, cap, ctx);
    const std::vector<float> Y = back(ctx, capped_dev);
    auto capped = [&] { return Tensor::from_vector({N * V}, DType::kF32, Y).to(ctx.compute_device()); };
    double cwant = 0;
    std::vector<double> cgwant(N * V, 0.0);
    for (int64_t n = 0; n < N; ++n) {
      if (tg[n] == kIgnoreIndex) continue;
      std::vector<double> y(V), dy(V);
      double mx = -1e300, s = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double th = std::tanh(double(L[n * V + v]) / cap);
        y[v] = cap * th, dy[v] = 1.0 - th * th;
        mx = std::max(mx, y[v]);
      }
      for (int64_t v = 0; v < V; ++v) s += std::exp(y[v] - mx);
      const double lse = mx + std::log(s);
      cwant += lse - y[tg[n]];
      for (int64_t v = 0; v < V; ++v) cgwant[n * V + v] = (std::exp(y[v] - lse) - (v == tg[n])) * scale * dy[v];
    }
    Tensor in_place = capped();
    Tensor closs = Tensor::zeros({1}, DType::kF64, ctx.compute_device());
    for (int64_t r0 = 0; r0 < N; r0 += 4)
      ops::cross_entropy_fwd_bwd(static_cast<float*>(in_place.raw()) + r0 * V, closs.data<double>(),
                                 targets.data<int64_t>() + r0, std::min<int64_t>(4, N - r0), V, scale, ctx, nullptr,
                                 DType::kF32, cap);
    ctx.compute().synchronize();
    const double cgot = closs.to(Device::kCpu).data<double>()[0];
    std::printf("  cross_entropy softcap %g loss sum %s: %.9f want %.9f\n", cap, in.adversarial ? "adversarial" : "random",
                cgot, cwant);
    EXPECT_NEAR(cgot, cwant, tol(ctx, 1e-5, 2e-5) * std::max(1.0, std::fabs(cwant)));
    report(ctx, "cross_entropy softcap dlogits", in.adversarial, back(ctx, in_place), cgwant, tol(ctx, 1e-5, 2e-5));
    for (const DType gt : {DType::kF32, DType::kBF16, DType::kF16}) {
      Tensor lg = capped(), lss = Tensor::zeros({1}, DType::kF64, ctx.compute_device());
      Tensor dg = Tensor::zeros({N * V}, gt, ctx.compute_device()), dg_ref = Tensor::zeros({N * V}, gt, ctx.compute_device());
      ops::convert(dg.raw(), gt, Tensor::from_vector({N * V}, DType::kF32, std::vector<float>(N * V, 7.0f))
                                     .to(ctx.compute_device()).raw(), DType::kF32, N * V, ctx);  // poison
      for (int64_t r0 = 0; r0 < N; r0 += 4)
        ops::cross_entropy_fwd_bwd(static_cast<float*>(lg.raw()) + r0 * V, lss.data<double>(),
                                   targets.data<int64_t>() + r0, std::min<int64_t>(4, N - r0), V, scale, ctx,
                                   static_cast<char*>(dg.raw()) + r0 * V * dtype_size(gt), gt, cap);
      ops::convert(dg_ref.raw(), gt, in_place.raw(), DType::kF32, N * V, ctx);
      ctx.compute().synchronize();
      EXPECT_EQ(lss.to(Device::kCpu).data<double>()[0], cgot) << "the soft-capped loss with the gradient written apart";
      const Tensor a2 = dg.to(Device::kCpu), b2 = dg_ref.to(Device::kCpu);
      EXPECT_EQ(0, std::memcmp(a2.raw(), b2.raw(), static_cast<size_t>(N * V) * dtype_size(gt)))
          << "cross_entropy's soft-capped gradient in " << dtype_torch_name(gt) << " on " << backend_name(ctx.backend())
          << " is not convert() of the in-place f32 gradient";
    }
  });
}

// logit_softcap (Gemma 2's final_logit_softcapping, f32 logits in place): cap * tanh(x / cap)
// against double. Tol 1e-6 of the output scale on both backends: a division, a tanh within a few
// ulp (CUDA's tanhf: 2) and a product, all f32.
TEST(OpHarness, LogitSoftcap) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    for (const float cap : {1.0f, 30.0f}) {
      const int64_t n = 1031;
      const std::vector<float> X = in.vec(n, 10.0f);
      Tensor x = Tensor::from_vector({n}, DType::kF32, X).to(ctx.compute_device());
      ops::logit_softcap(x.data<float>(), n, cap, ctx);
      std::vector<double> want(n);
      for (int64_t i = 0; i < n; ++i) want[i] = cap * std::tanh(double(X[i]) / cap);
      report(ctx, ("logit_softcap " + num(cap)).c_str(), in.adversarial, back(ctx, x), want,
             tol(ctx, 1e-6, 1e-6));
    }
  });
}

// Embedding (a bf16 table, widened) and dropout: exact rules, tolerance 0. The table 24 wide (CUDA:
// 16-byte rows) and 20 wide (element by element), on the device and, on CUDA, in pinned host memory
// read in place (memory.embedding: host); then scaled (Gemma) from bf16, f16 and f32 tables.
TEST(OpHarness, EmbeddingAndDropoutAreExact) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    const int64_t V = 50, N = 9;
    static PinnedHostAllocator pinned;
    for (const int64_t C : {int64_t{24}, int64_t{20}})
      for (const bool host_table : {false, true}) {
        if (host_table && !ctx.is_cuda()) continue;
        const auto Wf = in.vec(V * C);
        const Tensor made = Tensor::from_f32({V, C}, DType::kBF16, Wf);
        Tensor table = made.to(ctx.compute_device());
        if (host_table) {
          void* p = pinned.allocate(made.nbytes());
          std::memcpy(p, made.raw(), made.nbytes());
          table = Tensor::adopt(p, {V, C}, DType::kBF16, Device::kCpu, [](void* q) { pinned.release(q); });
        }
        std::vector<int64_t> ids(N);
        for (int64_t n = 0; n < N; ++n) ids[n] = (n * 13 + 5) % V;
        // CUDA: an id out of range (validated on the host before a real step) reads a zero row; the
        // CPU refuses it (LlamaOps.EmbeddingGathersRowsAndRejectsBadIds).
        if (ctx.is_cuda()) ids[3] = V;
        Tensor idt = Tensor::from_vector({N}, DType::kI64, ids).to(ctx.compute_device());
        Tensor out = to_act(ctx, std::vector<float>(N * C));
        ops::embedding_fwd(out.raw(), idt.data<int64_t>(), table.raw(), DType::kBF16, N, C, V, ctx);
        const std::vector<float> th = made.to_f32_vector();
        std::vector<double> want(N * C);
        for (int64_t n = 0; n < N; ++n)
          for (int64_t c = 0; c < C; ++c) want[n * C + c] = ids[n] < V ? th[ids[n] * C + c] : 0.0;
        report(ctx, host_table ? "embedding_fwd (pinned host table)" : "embedding_fwd", in.adversarial, back(ctx, out),
               want, 0.0);
      }
    // Gemma's scaled embedding (sqrt(hidden) rounded by the caller to the table's dtype: 25.25 for
    // 640 in bf16): the product in f32 rounded to the table's dtype (an f32 table: not rounded),
    // then to the activation dtype; exact. Values below f16's range after the product.
    for (const DType wt : {DType::kBF16, DType::kF16, DType::kF32}) {
      const int64_t C = 24;
      const float scale = 25.25f;
      const Tensor made = Tensor::from_f32({V, C}, wt, in.bounded(V * C, 100.0f));
      const Tensor table = made.to(ctx.compute_device());
      std::vector<int64_t> ids(N);
      for (int64_t n = 0; n < N; ++n) ids[n] = (n * 7 + 3) % V;
      if (ctx.is_cuda()) ids[3] = V;  // a zero row, as above
      Tensor idt = Tensor::from_vector({N}, DType::kI64, ids).to(ctx.compute_device());
      Tensor out = to_act(ctx, std::vector<float>(N * C, 9.0f));
      ops::embedding_fwd(out.raw(), idt.data<int64_t>(), table.raw(), wt, N, C, V, ctx, scale);
      const std::vector<float> th = made.to_f32_vector();
      auto round_to = [](DType t, float v) {
        return t == DType::kBF16 ? bf16_to_f32(f32_to_bf16(v)) : t == DType::kF16 ? f16_to_f32(f32_to_f16(v)) : v;
      };
      std::vector<double> want(N * C);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c)
          want[n * C + c] =
              ids[n] < V ? round_to(ctx.activation_dtype(), round_to(wt, th[ids[n] * C + c] * scale)) : 0.0;
      report(ctx, (std::string("embedding_fwd scale ") + dtype_torch_name(wt)).c_str(), in.adversarial, back(ctx, out),
             want, 0.0);
    }

    const int64_t C = 24;
    const auto X = in.vec(N * C);
    const DropoutKey key{0.3f, 11, 2, 5, 40};
    Tensor x = to_act(ctx, X), y = to_act(ctx, std::vector<float>(N * C));
    ops::dropout_fwd(y.raw(), x.raw(), key, N, C, ctx);
    const std::vector<float> xa = back(ctx, x);  // the inputs as the backend holds them
    std::vector<double> dw(N * C);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t i = n * C + c;
        dw[i] = dropout_keep(key, (key.row_offset + n) * C + c) ? double(xa[i] * (1.0f / 0.7f)) : 0.0;
      }
    report(ctx, "dropout_fwd", in.adversarial, back(ctx, y), dw, tol(ctx, 0.0, 4e-3));  // CUDA: bf16 output
  });
}

// The small ops the skeleton composes with: residual accumulate, bias add, widening a bf16 norm
// weight to f32 (and to 1 + w, Gemma's), rounding f32 values through bf16, converting between f32, bf16 and f16. CPU tol 0 (one exact-or-rounded operation, as
// the oracle); CUDA 8e-3 for the bf16 activation (rounded after each of the two ops), 0 for f32.
TEST(OpHarness, AccumulateBiasWidenRound) {
  for (const int64_t W : {int64_t{37}, int64_t{40}}) for_each_case([W](DeviceContext& ctx, Inputs& in) {
    const int64_t N = 5, n = N * W;  // W 40: CUDA's 8-wide accumulate
    Tensor a = to_act(ctx, in.vec(n)), b = to_act(ctx, in.vec(n));
    const auto A = back(ctx, a), Bv = back(ctx, b);
    const std::vector<float> bias = in.bounded(W);
    Tensor bias_d = to_f32_dev(ctx, bias);
    ops::accumulate(a.raw(), b.raw(), n, ctx);
    ops::add_bias(a.raw(), bias_d.data<float>(), N, W, ctx);
    std::vector<double> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = double(A[i]) + Bv[i] + bias[i % W];
    report(ctx, "accumulate + add_bias", in.adversarial, back(ctx, a), want, tol(ctx, 1e-6, 8e-3));  // CUDA: two bf16 roundings

    const std::vector<float> X = in.vec(n);
    const Tensor xb = Tensor::from_f32({n}, DType::kBF16, X).to(ctx.compute_device());
    Tensor wide = to_f32_dev(ctx, std::vector<float>(n));
    ops::to_f32(wide.data<float>(), xb.raw(), DType::kBF16, n, ctx);
    Tensor r = to_f32_dev(ctx, X);
    ops::round_to_dtype(r.data<float>(), n, DType::kBF16, ctx);
    std::vector<double> rw(n);
    for (int64_t i = 0; i < n; ++i) rw[i] = bf16_to_f32(f32_to_bf16(X[i]));
    ctx.compute().synchronize();
    report(ctx, "to_f32 bf16", in.adversarial, wide.to(Device::kCpu).to_f32_vector(), rw, 0.0);
    // Gemma's RMSNorm weight, 1 + w in f32 (to_f32's offset): one f32 add to the widened value, tol 0.
    Tensor wide1 = to_f32_dev(ctx, std::vector<float>(n));
    ops::to_f32(wide1.data<float>(), xb.raw(), DType::kBF16, n, ctx, 1.0f);
    std::vector<double> ow(n);
    for (int64_t i = 0; i < n; ++i) ow[i] = bf16_to_f32(f32_to_bf16(X[i])) + 1.0f;
    ctx.compute().synchronize();
    report(ctx, "to_f32 bf16 offset 1", in.adversarial, wide1.to(Device::kCpu).to_f32_vector(), ow, 0.0);
    report(ctx, "round_to_dtype bf16", in.adversarial, r.to(Device::kCpu).to_f32_vector(), rw, 0.0);

    // convert (f32 -> bf16 / f16, and bf16 -> f32): one rounding to nearest even, tol 0.
    for (const DType to : {DType::kBF16, DType::kF16}) {
      Tensor narrow = Tensor::zeros({n}, to, ctx.compute_device());
      ops::convert(narrow.raw(), to, r.raw(), DType::kF32, n, ctx);  // r holds bf16-exact values
      const Tensor src = to_f32_dev(ctx, X);
      Tensor direct = Tensor::zeros({n}, to, ctx.compute_device());
      ops::convert(direct.raw(), to, src.raw(), DType::kF32, n, ctx);
      Tensor back32 = to_f32_dev(ctx, std::vector<float>(n));
      ops::convert(back32.data<float>(), DType::kF32, direct.raw(), to, n, ctx);
      ctx.compute().synchronize();
      std::vector<double> want(n);
      for (int64_t i = 0; i < n; ++i)
        want[i] = to == DType::kBF16 ? bf16_to_f32(f32_to_bf16(X[i])) : f16_to_f32(f32_to_f16(X[i]));
      const std::string name = std::string("convert f32->") + dtype_torch_name(to);
      report(ctx, name.c_str(), in.adversarial, direct.to(Device::kCpu).to_f32_vector(), want, 0.0);
      report(ctx, (name + "->f32").c_str(), in.adversarial, back32.to(Device::kCpu).to_f32_vector(), want, 0.0);
      if (to == DType::kBF16)
        report(ctx, "convert bf16-exact f32->bf16", in.adversarial, narrow.to(Device::kCpu).to_f32_vector(), rw, 0.0);
    }
  });
}

// The 4-bit dequantization as the GEMM's operand, by bitsandbytes 0.50.2's two rules (tolerance 0:
// one f32 multiply and the roundings the rule names):
//   forward  ops::dequantize_4bit: act(table[code] * absmax) (CPU f32: the product itself; CUDA bf16)
//   backward ops::dequantize_4bit_rounded(.., kBF16): act(bf16(table[code] * absmax))
// The table and absmax make products that bf16 cannot hold, so a backend that rounds in the forward,
// or not in the backward, fails here (the test checks that the two expectations differ on the CPU).
TEST(OpHarness, DequantizeForwardAndBackwardRules) {
  for_each_case([](DeviceContext& ctx, Inputs& in) {
    const int64_t n = 64 * 5;
    std::vector<uint8_t> packed(n / 2);
    for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<uint8_t>(in.rng() & 0xff);
    std::vector<float> absmax = in.bounded(5);
    for (auto& a : absmax) a = std::fabs(a) + 0.1f;
    absmax[0] = 0.3f;  // 0.3 * (-1 + 1/7.5) = -0.26: not a bf16 value
    Dequant4bitArgs a;
    const Tensor pk = Tensor::from_vector({n / 2}, DType::kU8, packed).to(ctx.compute_device());
    const Tensor am = Tensor::from_vector({5}, DType::kF32, absmax).to(ctx.compute_device());
    a.packed = pk.data<uint8_t>();
    a.n = n;
    a.blocksize = 64;
    for (int i = 0; i < 16; ++i) a.code[i] = -1.0f + i / 7.5f;
    a.absmax = am.data<float>();
    auto to_act = [&](float v) {  // what the activation dtype holds of v
      return ctx.activation_dtype() == DType::kF32 ? v : bf16_to_f32(f32_to_bf16(v));
    };
    std::vector<double> want_fwd(n), want_bwd(n);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int code = i % 2 == 0 ? packed[i / 2] >> 4 : packed[i / 2] & 0xf;
      const float prod = a.code[code] * absmax[i / 64];
      want_fwd[i] = to_act(prod);
      want_bwd[i] = to_act(bf16_to_f32(f32_to_bf16(prod)));
      differ += want_fwd[i] != want_bwd[i];
    }
    if (ctx.activation_dtype() == DType::kF32) {
      EXPECT_TRUE(ops::dequant_rules_differ(ctx, DType::kBF16));
      EXPECT_GT(differ, n / 2) << "the inputs do not tell the two rules apart";
    } else {
      EXPECT_FALSE(ops::dequant_rules_differ(ctx, DType::kBF16));  // bf16 compute: one rounding either way
      EXPECT_EQ(differ, 0);
    }
    EXPECT_FALSE(ops::dequant_rules_differ(ctx, DType::kF32));
    Tensor out = Tensor::zeros({n}, ctx.activation_dtype(), ctx.compute_device());
    ops::dequantize_4bit(out.raw(), a, ctx);
    ctx.compute().synchronize();
    report(ctx, "dequantize_4bit forward", in.adversarial, out.to(Device::kCpu).to_f32_vector(), want_fwd, 0.0);
    Tensor back = Tensor::zeros({n}, ctx.activation_dtype(), ctx.compute_device());
    ops::dequantize_4bit_rounded(back.raw(), a, DType::kBF16, ctx);
    ctx.compute().synchronize();
    report(ctx, "dequantize_4bit backward (bf16)", in.adversarial, back.to(Device::kCpu).to_f32_vector(), want_bwd,
           0.0);
    // An f16-made weight: rounded through f16 (then bf16 on CUDA): differs on both backends.
    std::vector<double> want_f16(n);
    for (int64_t i = 0; i < n; ++i) {
      const int code = i % 2 == 0 ? packed[i / 2] >> 4 : packed[i / 2] & 0xf;
      want_f16[i] = to_act(f16_to_f32(f32_to_f16(a.code[code] * absmax[i / 64])));
    }
    EXPECT_TRUE(ops::dequant_rules_differ(ctx, DType::kF16));
    ops::dequantize_4bit_rounded(back.raw(), a, DType::kF16, ctx);
    ctx.compute().synchronize();
    report(ctx, "dequantize_4bit backward (f16)", in.adversarial, back.to(Device::kCpu).to_f32_vector(), want_f16,
           0.0);

    // Rows of row_len values into a wider buffer (out_ld apart; the padding untouched): 64 / 40
    // (rows crossing quantization blocks) take CUDA's vector path, 20 / 23 its scalar one.
    for (const auto& [row_len, ld] : {std::pair<int64_t, int64_t>{64, 72}, {40, 48}, {20, 23}}) {
      Dequant4bitArgs r = a;
      r.row_len = row_len;
      r.out_ld = ld;
      const int64_t rows = n / row_len;
      Tensor wide = Tensor::from_f32({rows * ld}, ctx.activation_dtype(), std::vector<float>(rows * ld, 2.0f))
                        .to(ctx.compute_device());
      ops::dequantize_4bit(wide.raw(), r, ctx);
      std::vector<double> wwant(rows * ld, 2.0);
      for (int64_t i = 0; i < n; ++i) wwant[(i / row_len) * ld + i % row_len] = want_fwd[i];
      ctx.compute().synchronize();
      report(ctx, ("dequantize_4bit rows " + std::to_string(row_len) + "/" + std::to_string(ld)).c_str(), in.adversarial,
             wide.to(Device::kCpu).to_f32_vector(), wwant, 0.0);
    }
  });
}

}  // namespace
}  // namespace qshard
