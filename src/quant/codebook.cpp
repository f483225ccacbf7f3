#include "quant/codebook.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/error.h"

namespace qshard {

QuantType parse_quant_type(std::string_view s) {
  if (s == "nf4") return QuantType::kNf4;
  if (s == "fp4") return QuantType::kFp4;
  throw InputError("unknown quant type '" + std::string(s) + "' (expected 'nf4' or 'fp4')");
}

const char* quant_type_name(QuantType t) { return t == QuantType::kNf4 ? "nf4" : "fp4"; }

void validate_blocksize(int64_t blocksize) {
  const bool pow2 = blocksize > 0 && (blocksize & (blocksize - 1)) == 0;
  if (!pow2 || blocksize < 32 || blocksize > 4096)
    throw InputError("invalid blocksize " + std::to_string(blocksize) +
                     " (expected a power of two from 32 to 4096)");
}

const std::array<float, 16>& code_table(QuantType t) {
  static const std::array<float, 16> nf4 = [] {
    std::array<float, 16> a{};
    std::copy(std::begin(kNf4Table), std::end(kNf4Table), a.begin());
    return a;
  }();
  static const std::array<float, 16> fp4 = [] {
    std::array<float, 16> a{};
    std::copy(std::begin(kFp4Table), std::end(kFp4Table), a.begin());
    return a;
  }();
  return t == QuantType::kNf4 ? nf4 : fp4;
}

// bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), replayed in
// float32 with fused multiply-adds where torch.linspace uses them (see shared/FORMATS.md).
const std::array<float, 256>& dynamic_map_signed() {
  static const std::array<float, 256> map = [] {
    std::vector<float> v;
    for (int i = 0; i < 7; ++i) {
      const int k = (1 << i) + 1;  // boundaries in linspace(0.1, 1, k)
      const float step = (1.0f - 0.1f) / static_cast<float>(1 << i);
      std::vector<float> boundary(k);
      for (int j = 0; j < k; ++j) {
        boundary[j] = j < k / 2 ? std::fmaf(step, static_cast<float>(j), 0.1f)
                                : std::fmaf(-step, static_cast<float>(k - 1 - j), 1.0f);
      }
      const float s = static_cast<float>(std::pow(10.0, i - 6));
      for (int j = 0; j + 1 < k; ++j) {
        const float mean = static_cast<float>((boundary[j] + boundary[j + 1]) / 2.0f);
        v.push_back(s * mean);
        v.push_back(-(s * mean));
      }
    }
    v.push_back(0.0f);
    v.push_back(1.0f);
    std::sort(v.begin(), v.end());
    std::array<float, 256> a{};
    QS_CHECK(v.size() == 256, "dynamic map must have 256 entries");
    std::copy(v.begin(), v.end(), a.begin());
    return a;
  }();
  return map;
}

}  // namespace qshard
