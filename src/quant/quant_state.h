// quant_state.h: bitsandbytes' QuantState, and its packed JSON form.
//
// What: the statistics that turn packed 4-bit codes back into values.
//   quant_type  nf4 | fp4
//   blocksize   elements per absmax (power of two, 32..4096)
//   dtype       dtype of the original tensor (the dequant output dtype)
//   shape       shape of the original tensor; n = prod(shape)
//   absmax      [nblocks] f32, or [nblocks] u8 when nested (double quant); nblocks = ceil(n/bs)
//   code        [16] f32 (state-dict name: quant_map)
//   state2      nested state (double quant): absmax [ceil(nblocks/256)] f32, code [256] f32 (the
//               signed dynamic map; state-dict name nested_quant_map), blocksize 256, offset
//               (f32; lives only in the packed JSON, never as a tensor)
// Packed JSON (the bytes of `quant_state.bitsandbytes__nf4|fp4`): Python's json.dumps of
//   {"quant_type", "blocksize", "dtype", "shape"[, "nested_blocksize", "nested_dtype",
//    "nested_offset"]} with ", " / ": " separators; nested_offset printed as Python's repr of the
//   float32 offset widened to double.
// Ownership: tensors are shared views (copying a QuantState does not copy bytes).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "quant/codebook.h"
#include "runtime/tensor.h"

namespace qshard {

// The most elements a quant state's shape may hold (2^62): (n + 1) / 2 and the block counts stay
// in int64. A packed JSON shape past it is an InputError naming the field, never an overflow.
constexpr int64_t kMaxQuantNumel = int64_t{1} << 62;

struct NestedQuantState {
  Tensor absmax;           // [ceil(nblocks / blocksize)] f32
  Tensor code;             // [256] f32
  int64_t blocksize = 256;
  DType dtype = DType::kF32;  // bitsandbytes' nested_dtype (always float32 in practice)
  float offset = 0.0f;
};

struct QuantState {
  QuantType quant_type = QuantType::kNf4;
  int64_t blocksize = 64;
  DType dtype = DType::kF32;
  Shape shape;
  Tensor absmax;
  Tensor code;
  std::optional<NestedQuantState> state2;

  bool nested() const { return state2.has_value(); }
  int64_t numel() const { return shape_numel(shape); }
  int64_t num_blocks() const { return (numel() + blocksize - 1) / blocksize; }

  // The JSON text of the packed form (exact json.dumps bytes).
  std::string packed_json() const;
  // Fills quant_type, blocksize, dtype, shape and the nested scalars from packed JSON bytes.
  // `label` names the source (file and key) in error messages. Throws InputError on malformed
  // JSON, missing or mistyped fields, unknown quant type/dtype, invalid blocksize or
  // nested_blocksize, a shape with a negative dimension or more than kMaxQuantNumel elements, and on a
  // type key (nf4|fp4 suffix) that disagrees with the JSON's quant_type.
  static QuantState from_packed_json(std::string_view json, const std::string& label);

  // Absmax decoded to float32 on the CPU ([nblocks]); for a nested state
  // code256[q] * nested_absmax + offset, as bitsandbytes does it.
  std::vector<float> absmax_f32() const;
  // Checks that tensor shapes/dtypes agree with the scalars; throws InputError naming `label`.
  void validate(const std::string& label) const;
  // Checks the values dequantization multiplies by (REQUIRES: validate passed): quant_map and
  // nested_quant_map finite and in [-1, 1], nested_absmax and nested_offset finite, and every
  // absmax as dequantization decodes it (absmax_f32) finite and below the magnitude at which
  // `dtype` holds Inf (float16: 65520, exclusive). Throws InputError naming `label`, the field, the first bad
  // index, its value and the count. One pass over the statistics (n/blocksize values).
  void check_values(const std::string& label) const;
};

// Python's repr() of a double (what json.dumps prints for a float): shortest round-trip digits,
// exponent form when the decimal exponent is < -4 or >= 16, e.g. 1.4999999621068127e-05, 0.5,
// 2.0, 1e+16.
std::string python_float_repr(double v);

}  // namespace qshard
