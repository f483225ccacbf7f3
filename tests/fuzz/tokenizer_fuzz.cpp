// libFuzzer target for the native tokenizer (text/hf_tokenizer.h) on GPT-2's real tokenizer.json
// (tests/data/tokenizer/gpt2.tar.xz, unpacked by CMake): any bytes are text.
// Properties: every id is in the vocabulary, and decoding gives the text back as Python would read
// it (bytes.decode("utf-8", errors="replace")): byte-level BPE is lossless. No crash, no other error.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "text/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const qshard::HfTokenizer tok = qshard::HfTokenizer::load(QSHARD_FUZZ_TOKENIZER);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<uint32_t> ids = tok.encode(text);
  for (uint32_t id : ids)
    if (id >= tok.vocab_size()) std::abort();
  if (tok.decode(ids) != qshard::utf8_replace_invalid(text)) std::abort();
  return 0;
}
