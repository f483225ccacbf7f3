// CPU reference tests of quantize_4bit / dequantize_4bit and the packed state dict.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "quant/blockwise.h"
#include "quant/params4bit.h"

namespace qshard {
namespace {

std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Largest half-gap between neighbouring code values: the worst rounding error for a value
// scaled into [-1, 1] (NF4: (1 - 0.7229568) / 2; FP4: (1 - 8/12) / 2).
float half_gap(QuantType t) {
  auto c = code_table(t);
  std::sort(c.begin(), c.end());
  float g = 0;
  for (int i = 0; i < 15; ++i) g = std::max(g, (c[i + 1] - c[i]) / 2);
  return g;
}

struct RoundTripCase {
  QuantType type;
  int64_t blocksize;
  bool dq;
  DType dtype;
  int64_t n;
};

class RoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(RoundTrip, ErrorWithinBucketBound) {
  const auto c = GetParam();
  std::vector<float> v = randn(c.n, 7 + static_cast<uint32_t>(c.n), 0.02f);
  Tensor x = Tensor::from_f32({c.n}, c.dtype, v);
  v = x.to_f32_vector();  // the values actually quantized (after bf16/f16 rounding)
  Params4bit p = quantize_4bit(x, {c.type, c.blocksize, c.dq});
  ASSERT_EQ(p.data.shape(), Shape({(c.n + 1) / 2, 1}));
  Tensor y = dequantize_4bit(p, DType::kF32);
  ASSERT_EQ(y.shape(), x.shape());
  const std::vector<float> out = y.to_f32_vector();
  // Per-block exact absmax vs the (possibly double-quantized) absmax used for dequant.
  const std::vector<float> used = p.quant_state.absmax_f32();
  const float hg = half_gap(c.type);
  double max_ratio = 0;
  for (int64_t i = 0; i < c.n; ++i) {
    const int64_t b = i / c.blocksize;
    float true_absmax = 0;
    for (int64_t j = b * c.blocksize; j < std::min(c.n, (b + 1) * c.blocksize); ++j)
      true_absmax = std::max(true_absmax, std::fabs(v[j]));
    // |x - q(x)| <= absmax * half_gap, plus the error of the absmax itself (double quant).
    const float bound = true_absmax * hg + std::fabs(true_absmax - used[b]) + 1e-6f * true_absmax;
    const float err = std::fabs(v[i] - out[i]);
    ASSERT_LE(err, bound) << "i=" << i << " x=" << v[i] << " y=" << out[i];
    if (bound > 0) max_ratio = std::max(max_ratio, static_cast<double>(err / bound));
  }
  std::printf("max err / bound = %.3f\n", max_ratio);
}

INSTANTIATE_TEST_SUITE_P(
    Quant, RoundTrip,
    ::testing::Values(RoundTripCase{QuantType::kNf4, 64, true, DType::kBF16, 4096 * 3 + 5},
                      RoundTripCase{QuantType::kNf4, 64, false, DType::kF32, 65},
                      RoundTripCase{QuantType::kNf4, 32, true, DType::kF16, 1001},
                      RoundTripCase{QuantType::kNf4, 4096, true, DType::kF32, 64 * 300 + 17},
                      RoundTripCase{QuantType::kFp4, 64, false, DType::kBF16, 4097},
                      RoundTripCase{QuantType::kFp4, 128, true, DType::kF32, 64 * 600 + 1},
                      RoundTripCase{QuantType::kNf4, 256, false, DType::kF16, 1}),
    [](const ::testing::TestParamInfo<RoundTripCase>& info) {
      const auto& c = info.param;
      return std::string(quant_type_name(c.type)) + "_bs" + std::to_string(c.blocksize) + (c.dq ? "_dq_" : "_") +
             dtype_torch_name(c.dtype) + "_n" + std::to_string(c.n);
    });

TEST(Quantize, PackingNibbleOrderAndOddPadding) {
  // Values chosen to land on table entries: absmax 1, codes are the table indices.
  const auto& t = code_table(QuantType::kNf4);
  std::vector<float> v = {t[15], t[0], t[3], t[12], t[9]};  // 5 elements -> 3 bytes
  Params4bit p = quantize_4bit(Tensor::from_f32({5}, DType::kF32, v), {QuantType::kNf4, 64, false});
  const uint8_t* d = p.data.data<uint8_t>();
  EXPECT_EQ(d[0], 0xf0);
  EXPECT_EQ(d[1], 0x3c);
  EXPECT_EQ(d[2], 0x97);  // last low nibble pads with NF4's zero code 7
  EXPECT_EQ(p.quant_state.absmax.data<float>()[0], 1.0f);
  Params4bit f = quantize_4bit(Tensor::from_f32({1}, DType::kF32, std::vector<float>{-1.0f}), {QuantType::kFp4, 64, false});
  EXPECT_EQ(f.data.data<uint8_t>()[0], 0xb0);  // FP4 pads with 0
}

TEST(Quantize, AllZeroBlockEncodesLikeCuda) {
  std::vector<float> v(192, 0.0f);
  for (int i = 0; i < 64; ++i) v[i] = 0.01f * (i - 32);
  for (int i = 128; i < 192; ++i) v[i] = 0.5f;
  Params4bit p = quantize_4bit(Tensor::from_f32({192}, DType::kF32, v), {QuantType::kNf4, 64, false});
  // The middle block: absmax 0, 0 * (1/0) = NaN -> code 0 for every element.
  for (int i = 32; i < 64; ++i) EXPECT_EQ(p.data.data<uint8_t>()[i], 0x00) << i;
  EXPECT_EQ(p.quant_state.absmax.data<float>()[1], 0.0f);
  const auto y = dequantize_4bit(p, DType::kF32).to_f32_vector();
  for (int i = 64; i < 128; ++i) EXPECT_EQ(y[i], -0.0f);
}

TEST(Quantize, DoubleQuantStructure) {
  const int64_t n = 64 * 600 + 3;
  Params4bit p = quantize_4bit(Tensor::from_f32({n}, DType::kF32, randn(n, 3)), {QuantType::kNf4, 64, true});
  const QuantState& st = p.quant_state;
  ASSERT_TRUE(st.nested());
  EXPECT_EQ(st.absmax.dtype(), DType::kU8);
  EXPECT_EQ(st.absmax.numel(), 601);
  EXPECT_EQ(st.state2->absmax.numel(), 3);  // ceil(601 / 256)
  EXPECT_EQ(st.state2->code.numel(), 256);
  EXPECT_EQ(st.state2->blocksize, 256);
  EXPECT_GT(st.state2->offset, 0.0f);
}

TEST(StateDict, KeysOrderAndRoundTrip) {
  const int64_t rows = 33, cols = 65;
  Tensor x = Tensor::from_f32({rows, cols}, DType::kBF16, randn(rows * cols, 11));
  for (bool dq : {false, true}) {
    for (QuantType qt : {QuantType::kNf4, QuantType::kFp4}) {
      Params4bit p = quantize_4bit(x, {qt, 64, dq});
      const std::string w = "model.layers.0.mlp.down_proj.weight";
      NamedTensors sd = params4bit_state_dict(p, w);
      std::vector<std::string> keys;
      for (auto& [k, t] : sd) keys.push_back(k);
      std::vector<std::string> expect = {w, w + ".absmax", w + ".quant_map"};
      if (dq) {
        expect.push_back(w + ".nested_absmax");
        expect.push_back(w + ".nested_quant_map");
      }
      expect.push_back(w + ".quant_state.bitsandbytes__" + quant_type_name(qt));
      EXPECT_EQ(keys, expect);
      std::map<std::string, Tensor> m(sd.begin(), sd.end());
      const std::string js(reinterpret_cast<const char*>(m[expect.back()].bytes().data()), m[expect.back()].nbytes());
      if (!dq) {
        EXPECT_EQ(js, std::string("{\"quant_type\": \"") + quant_type_name(qt) +
                          "\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": [33, 65]}");
      } else {
        EXPECT_NE(js.find("\"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": "),
                  std::string::npos)
            << js;
      }
      auto lookup = [&](const std::string& k) -> std::optional<Tensor> {
        auto it = m.find(k);
        if (it == m.end()) return std::nullopt;
        return it->second;
      };
      EXPECT_TRUE(is_4bit_weight(w, lookup));
      Params4bit q = params4bit_from_state_dict(w, lookup, "test");
      EXPECT_TRUE(bitwise_equal(dequantize_4bit(q), dequantize_4bit(p)));
      NamedTensors sd2 = params4bit_state_dict(q, w);
      ASSERT_EQ(sd2.size(), sd.size());
      for (size_t i = 0; i < sd.size(); ++i) EXPECT_TRUE(bitwise_equal(sd[i].second, sd2[i].second)) << sd[i].first;
    }
  }
}

// ---- bad input -----------------------------------------------------------------------------

class BadStateDict : public ::testing::Test {
 protected:
  void SetUp() override {
    Params4bit p = quantize_4bit(Tensor::from_f32({4, 32}, DType::kF32, randn(128, 5)), {QuantType::kNf4, 64, true});
    for (auto& [k, t] : params4bit_state_dict(p, w_)) sd_[k] = t;
  }
  void expect_error(const std::string& needle) {
    auto lookup = [&](const std::string& k) -> std::optional<Tensor> {
      auto it = sd_.find(k);
      if (it == sd_.end()) return std::nullopt;
      return it->second;
    };
    try {
      params4bit_from_state_dict(w_, lookup, "ckpt.safetensors");
      FAIL() << "expected InputError containing " << needle;
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("ckpt.safetensors"), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  }
  void set_json(const std::string& js) {
    sd_[w_ + ".quant_state.bitsandbytes__nf4"] =
        Tensor::from_bytes({static_cast<int64_t>(js.size())}, DType::kU8,
                           std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(js.data()), js.size()));
  }
  std::string json() {
    const Tensor& t = sd_[w_ + ".quant_state.bitsandbytes__nf4"];
    return std::string(reinterpret_cast<const char*>(t.bytes().data()), t.nbytes());
  }
  const std::string w_ = "layer.weight";
  std::map<std::string, Tensor> sd_;
};

TEST_F(BadStateDict, MissingKeys) {
  sd_.erase(w_ + ".absmax");
  expect_error("missing tensor 'layer.weight.absmax'");
}

TEST_F(BadStateDict, MissingPackedState) {
  sd_.erase(w_ + ".quant_state.bitsandbytes__nf4");
  expect_error("quant_state.bitsandbytes__nf4");
}

TEST_F(BadStateDict, TruncatedJson) {
  const std::string js = json();
  set_json(js.substr(0, js.size() / 2));
  expect_error("not valid JSON");
}

TEST_F(BadStateDict, MalformedJsonFields) {
  std::string js = json();
  set_json(std::string("[1, 2]"));
  expect_error("not a JSON object");
  set_json("{\"quant_type\": \"nf5\", \"blocksize\": 64, \"dtype\": \"float32\", \"shape\": [4, 32]}");
  expect_error("unknown quant type 'nf5'");
  set_json("{\"quant_type\": \"nf4\", \"blocksize\": 48, \"dtype\": \"float32\", \"shape\": [4, 32]}");
  expect_error("invalid blocksize 48");
  set_json("{\"quant_type\": \"nf4\", \"dtype\": \"float32\", \"shape\": [4, 32]}");
  expect_error("\"blocksize\"");
  set_json("{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"int7\", \"shape\": [4, 32]}");
  expect_error("'int7'");
}

TEST_F(BadStateDict, PackedSizeDoesNotMatchShape) {
  sd_[w_] = Tensor::zeros({63, 1}, DType::kU8);
  expect_error("needs 64");
}

TEST_F(BadStateDict, WrongAbsmaxCount) {
  sd_[w_ + ".absmax"] = Tensor::zeros({3}, DType::kU8);
  expect_error("absmax has 3 entries, expected 2");
}

TEST(QuantizeBadInput, RejectsBadOptionsAndDtypes) {
  Tensor x = Tensor::from_f32({64}, DType::kF32, randn(64, 1));
  EXPECT_THROW(quantize_4bit(x, {QuantType::kNf4, 100, true}), InputError);
  EXPECT_THROW(quantize_4bit(Tensor::zeros({64}, DType::kI32), {}), InputError);
  EXPECT_THROW(quantize_4bit(Tensor::zeros({0}, DType::kF32), {}), InputError);
}

}  // namespace
}  // namespace qshard
