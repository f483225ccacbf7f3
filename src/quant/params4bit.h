// params4bit.h: the 4-bit parameter (packed bytes + QuantState), quantize / dequantize of whole
// tensors, and its bitsandbytes state-dict form.
//
// What: Params4bit mirrors bitsandbytes' Params4bit: `data` holds the packed codes, uint8 of
// shape [(n+1)/2, 1] (a quant_storage of bf16/f16/f32 is only a reinterpretation of the same
// bytes), `quant_state` the statistics. quantize_4bit / dequantize_4bit run on the device of
// their input (CPU reference, or CUDA kernels on the default stream; the call returns when the
// result is ready).
// State dict (shared/FORMATS.md "State-dict keys"), for a weight key W, in this order:
//   W                                   u8 [(n+1)/2, 1]
//   W.absmax                            f32 [nblocks] | u8 [nblocks] (double quant)
//   W.quant_map                         f32 [16]
//   W.nested_absmax                     f32 [ceil(nblocks/256)]   (double quant)
//   W.nested_quant_map                  f32 [256]                 (double quant)
//   W.quant_state.bitsandbytes__nf4|fp4 u8 [len(json)]
// (A bias, if any, belongs to the linear layer and sits between W and W.absmax in a full
// layer's state dict; the caller inserts it.)
// Ownership: all tensors are shared views; state-dict entries alias the Params4bit's tensors,
// except the packed JSON tensor which is built on demand.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "quant/blockwise.h"
#include "quant/quant_state.h"

namespace qshard {

struct Params4bit {
  Tensor data;
  QuantState quant_state;
  // A copy whose packed data and statistics are on `device` (tensors already there are shared).
  Params4bit to(Device device) const;
};

struct QuantizeOptions {
  QuantType quant_type = QuantType::kNf4;
  int64_t blocksize = 64;
  bool compress_statistics = true;  // double quantization (bitsandbytes' default for Linear4bit)
};

// x: any shape, f32/bf16/f16, CPU or CUDA. Result tensors live on x's device.
Params4bit quantize_4bit(const Tensor& x, const QuantizeOptions& options = {});
// The Params4bit around blockwise 4-bit codes: `packed` [(n+1)/2] u8 and their plain `absmax`
// [ceil(n/blocksize)] f32 (quantize_4bit's kernel output, or random_4bit's draw) of a tensor of
// `shape` and `dtype`; with options.compress_statistics the absmax is double-quantized (centred in
// place, so `absmax` is consumed) exactly as quantize_4bit does it. Tensors stay on their device.
// REQUIRES: the sizes above; packed and absmax on one device.
Params4bit params4bit_from_blocks(Tensor packed, Tensor absmax, const Shape& shape, DType dtype,
                                  const QuantizeOptions& options);
// A zero-filled Params4bit with the layout quantize_4bit would give a tensor of `shape` and
// `dtype` (CPU): the placeholder a model is built with before its weights are loaded.
// shapes_only: data and statistics are meta tensors (shapes and dtypes, no bytes): for a caller
// that replaces the whole Params4bit (a random base) and needs only its quant state's scalars.
Params4bit empty_params4bit(const Shape& shape, DType dtype, const QuantizeOptions& options, bool shapes_only = false);
// Result: quant_state.shape, dtype `out_dtype` (default: quant_state.dtype), on data's device.
Tensor dequantize_4bit(const Params4bit& p, std::optional<DType> out_dtype = std::nullopt);

// The kernel arguments for dequantizing `p` where its tensors live (pointers alias p's tensors).
Dequant4bitArgs dequant_args(const Params4bit& p);

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The packed JSON as a u8 tensor (the value of W.quant_state.bitsandbytes__nf4|fp4).
Tensor packed_quant_state_tensor(const QuantState& st);
// Key suffixes after W in bitsandbytes' order (".absmax", ".quant_map", ...), for this state.
std::vector<std::string> quant_state_key_suffixes(const QuantState& st);
// W and its statistics keys (CPU or device tensors as stored; the JSON tensor is on the CPU).
NamedTensors params4bit_state_dict(const Params4bit& p, const std::string& weight_key);

// Looks a key up; returns nullopt when absent.
using TensorLookup = std::function<std::optional<Tensor>(const std::string& key)>;
// Rebuilds a Params4bit from a state dict. `source` names the file or folder in errors. Throws
// InputError naming the key for: a missing key (the quant state: both names it may have, and
// what is stored under the weight's key), a packed JSON that is malformed, a packed size
// that does not match the shape, statistics of the wrong dtype or size, and (unless
// allow_nonfinite) statistics that dequantize to NaN / Inf or past the dtype's range
// (QuantState::check_values: one pass over the n/blocksize statistics, not the packed codes).
Params4bit params4bit_from_state_dict(const std::string& weight_key, const TensorLookup& lookup,
                                      const std::string& source, bool allow_nonfinite = false);
// True if `lookup` has W.quant_state.bitsandbytes__nf4 or __fp4 (i.e. W is a 4-bit weight).
bool is_4bit_weight(const std::string& weight_key, const TensorLookup& lookup);

}  // namespace qshard
