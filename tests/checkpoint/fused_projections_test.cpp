// checkpoint/fused_projections.h: Phi-3's fused 4-bit weights split into their parts and fused back
// without requantizing. On fresh random weights quantized by qshard (NF4 and FP4, with and without
// double quantization, blocksizes 64 to 256) and row splits that meet the 4-bit blocks and the
// nested blocks of 256 absmax values at their boundaries or inside them:
//  - each part dequantizes to the fused weight's rows, bit for bit;
//  - the parts keep the fused block sizes where the split is aligned (real Phi-3 shapes) and take
//    smaller ones only where it is not;
//  - fusing the parts gives the fused state dict back, every entry's bytes;
//  - parts quantized on their own (another offset, other block statistics) are refused by name,
//    and so is a split point inside a packed byte.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "checkpoint/fused_projections.h"
#include "common/test_util.h"

namespace qshard {
namespace {

Tensor random_weight(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 0.05f);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (float& x : v) x = n(g);
  return Tensor::from_f32({rows, cols}, DType::kBF16, v);
}

bool same(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

struct Case {
  int64_t cols;
  std::vector<int64_t> rows;
  const char* what;
};

TEST(FusedProjections, SplitIsExactAndFusesBack) {
  const std::vector<Case> cases = {
      {32, {32, 16, 16}, "tiny phi3 qkv: blocks aligned, nested blocks not"},
      {20, {20, 10, 10}, "phi3_odd qkv: 4-bit blocks straddle the split points"},
      {256, {256, 64, 64}, "hidden 256: blocks and nested blocks aligned"},
      {64, {96, 96}, "gate_up"},
      {30, {7 * 2, 9 * 2, 3 * 2}, "uneven rows"},
  };
  int64_t parts_checked = 0, smaller_blocks = 0;
  uint32_t seed = 1;
  for (const Case& c : cases)
    for (QuantType qt : {QuantType::kNf4, QuantType::kFp4})
      for (bool nested : {true, false})
        for (int64_t bs : {64, 128, 256}) {
          SCOPED_TRACE(std::string(c.what) + " " + quant_type_name(qt) + (nested ? " dq" : "") + " bs " + std::to_string(bs));
          int64_t total = 0;
          for (int64_t r : c.rows) total += r;
          const Params4bit fused = quantize_4bit(random_weight(total, c.cols, seed++), {qt, bs, nested});
          const Tensor whole = dequantize_4bit(fused, DType::kF32);
          const std::vector<Params4bit> parts = split_params4bit(fused, c.rows, "w");
          ASSERT_EQ(parts.size(), c.rows.size());
          int64_t row0 = 0;
          for (size_t i = 0; i < parts.size(); row0 += c.rows[i], ++i) {
            EXPECT_TRUE(same(dequantize_4bit(parts[i], DType::kF32), take_rows(whole, row0, c.rows[i]))) << "part " << i;
            const int64_t e0 = row0 * c.cols;
            const bool aligned = e0 % bs == 0 && (!nested || e0 % (bs * 256) == 0);
            EXPECT_EQ(parts[i].quant_state.blocksize == bs && (!nested || parts[i].quant_state.state2->blocksize == 256),
                      aligned)
                << "part " << i;
            smaller_blocks += !aligned;
            ++parts_checked;
          }
          const Params4bit back = fuse_params4bit(parts, "w");
          const NamedTensors want = params4bit_state_dict(fused, "w"), got = params4bit_state_dict(back, "w");
          ASSERT_EQ(want.size(), got.size());
          for (size_t k = 0; k < want.size(); ++k) {
            EXPECT_EQ(want[k].first, got[k].first);
            EXPECT_TRUE(same(want[k].second, got[k].second)) << want[k].first;
          }
        }
  std::printf("%lld parts dequantize to their rows bit for bit (%lld with smaller blocks), all fuse back\n",
              static_cast<long long>(parts_checked), static_cast<long long>(smaller_blocks));
  EXPECT_GT(smaller_blocks, 0);
}

TEST(FusedProjections, RefusesWhatIsNotExact) {
  // Parts quantized each on its own: other offsets (double quant), other block statistics.
  const std::vector<Params4bit> apart = {quantize_4bit(random_weight(32, 32, 7)), quantize_4bit(random_weight(16, 32, 8))};
  std::string m = testing_util::error_of([&] { fuse_params4bit(apart, "model.layers.0.self_attn.qkv_proj.weight"); });
  EXPECT_NE(m.find("model.layers.0.self_attn.qkv_proj.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("without requantizing"), std::string::npos) << m;
  const std::vector<Params4bit> plain = {quantize_4bit(random_weight(1, 64, 9), {QuantType::kNf4, 64, false}),
                                         quantize_4bit(random_weight(1, 64, 10), {QuantType::kNf4, 64, false})};
  EXPECT_NO_THROW(fuse_params4bit(plain, "w"));  // block-aligned plain statistics fuse: nothing is shared
  const std::vector<Params4bit> shared = {quantize_4bit(random_weight(1, 32, 9), {QuantType::kNf4, 64, false}),
                                          quantize_4bit(random_weight(1, 32, 10), {QuantType::kNf4, 64, false})};
  m = testing_util::error_of([&] { fuse_params4bit(shared, "w"); });  // two halves of one block, two absmax
  EXPECT_NE(m.find("blocksize"), std::string::npos) << m;
  // A split point inside a packed byte (odd element offset).
  const Params4bit odd = quantize_4bit(random_weight(4, 3, 11));
  m = testing_util::error_of([&] { split_params4bit(odd, {1, 3}, "w"); });
  EXPECT_NE(m.find("inside a packed byte"), std::string::npos) << m;
  m = testing_util::error_of([&] { split_params4bit(odd, {1, 1}, "w"); });
  EXPECT_NE(m.find("does not split"), std::string::npos) << m;
}

}  // namespace
}  // namespace qshard
