// libFuzzer target for the safetensors header parser (checkpoint/safetensors.h).
// Property: for any byte string, parse_safetensors_header either returns a header whose entries
// all lie inside the input, or throws InputError; nothing else (no crash, no other exception,
// no out-of-bounds read under ASan).
// Build: cmake -DQSHARD_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ ...; run:
//   build/.../tests/fuzz/safetensors_fuzz -max_len=4096 tests/data/safetensors
#include <cstdint>
#include <cstdlib>
#include <span>

#include "checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  try {
    const qshard::SafetensorsHeader h = qshard::parse_safetensors_header(bytes, "fuzz");
    for (const qshard::SafetensorsEntry& e : h.entries)
      if (e.begin > e.end || h.data_offset + e.end > size) std::abort();
  } catch (const qshard::InputError&) {
  }
  return 0;
}
