// ignore_index.h: the target that no loss counts.
//
// kIgnoreIndex (-100) is PyTorch's CrossEntropyLoss ignore_index and the label Hugging Face puts on
// padded or masked positions. The data side (text/data_loader.h: padding, prompt masks) writes it
// and the model side (model/llama_ops.h: cross entropy, the loss normalizer) skips it; both read
// it from here, the one layer they share.
#pragma once

#include <cstdint>

namespace qshard {

constexpr int64_t kIgnoreIndex = -100;

}  // namespace qshard
