// random_tree.h (tests): seeded random tensors and a module tree filled with them.
#pragma once

#include <random>
#include <vector>

#include "checkpoint/module_tree.h"

namespace qshard::testing_util {

// N(0, std) values of `dtype` (rounded from f32), deterministic for `seed`.
inline Tensor randn(const Shape& s, DType d, uint32_t seed, float std = 0.05f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, std);
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  for (auto& x : v) x = n(rng);
  return Tensor::from_f32(s, d, v);
}

// Every slot of the tree: float tensors random, 4-bit slots quantized from random weights with
// their own options. `seed` advances once per tensor.
inline void randomize(Module& m, uint32_t& seed) {
  for (const auto& cs : m.slots()) {
    auto& s = const_cast<Module::Slot&>(cs);
    if (s.kind == Module::SlotKind::kParams4bit) {
      const QuantState& st = s.params4bit->quant_state;
      *s.params4bit = quantize_4bit(randn(st.shape, st.dtype, seed++), {st.quant_type, st.blocksize, st.nested()});
    } else {
      s.tensor.copy_from(randn(s.tensor.shape(), s.tensor.dtype(), seed++));
    }
  }
  for (const auto& [n, c] : m.children()) randomize(*c, seed);
}

}  // namespace qshard::testing_util
