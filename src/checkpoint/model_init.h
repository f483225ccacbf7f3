// model_init.h: deterministic initial values for a model tree, identical on every rank and at
// every world size (everything derives from one seed and each tensor's fully qualified name).
//
// init_random_base: float weights ~ N(0, init_std) (transformers' initializer_range), RMSNorm
//   weights 1, 4-bit projections quantized from such a normal draw (a random tiny Llama), or with
//   draw_4bit drawn directly in 4-bit (quant/random_4bit.h: the statistics quantize_4bit gives such a
//   draw, not its bytes; no float tensor is made: what a 70B bench base needs). Tensors are filled
//   on the host's threads, each from its own seed-and-name stream: the same bytes at any thread count.
//   draw_on: where the draw_4bit projections are drawn: kCpu on the host's threads, kCuda on the
//   current GPU (quant/random_4bit.h random_4bit_to_host: chunks through pinned staging, 20 MB of
//   device and 20 MB of pinned memory per host thread, up to 8, freed on return) into the same
//   host tensors with the same bytes. Ignored without draw_4bit. The tree stays on the host.
// init_lora: PEFT's default init: lora_A ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)),
//   lora_B = 0 (so the adapted model starts equal to the base model).
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/module_tree.h"

namespace qshard {

void init_random_base(Module& root, uint64_t seed, double init_std = 0.02, bool draw_4bit = false,
                      Device draw_on = Device::kCpu);
void init_lora(Module& root, uint64_t seed);

}  // namespace qshard
