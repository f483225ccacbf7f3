#include "train/crc32c.h"

#include <array>

namespace qshard {
namespace {

const std::array<uint32_t, 256>& table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> x{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      x[i] = c;
    }
    return x;
  }();
  return t;
}

}  // namespace

uint32_t crc32c_update(uint32_t crc, std::span<const uint8_t> bytes) {
  const auto& t = table();
  uint32_t c = ~crc;
  for (const uint8_t b : bytes) c = t[(c ^ b) & 0xFF] ^ (c >> 8);
  return ~c;
}

}  // namespace qshard
