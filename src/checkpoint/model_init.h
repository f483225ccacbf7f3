// model_init.h: deterministic initial values for a model tree, identical on every rank and at
// every world size (everything derives from one seed and each tensor's fully qualified name).
//
// init_random_base: float weights ~ N(0, init_std) (transformers' initializer_range), RMSNorm
//   weights 1, 4-bit projections quantized from such a normal draw (a random tiny Llama).
// init_lora: PEFT's default init: lora_A ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)),
//   lora_B = 0 (so the adapted model starts equal to the base model).
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/module_tree.h"

namespace qshard {

void init_random_base(Module& root, uint64_t seed, double init_std = 0.02);
void init_lora(Module& root, uint64_t seed);

}  // namespace qshard
