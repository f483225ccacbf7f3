// crc32c.h: CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF),
// the checksum of iSCSI (RFC 3720), SSE4.2's crc32 instruction and TFRecord files, and its masked
// form, which TFRecord stores (train/tf_event.h).
//
// Not zlib's CRC-32 (checkpoint/crc32.h: polynomial 0xEDB88320): the two differ on every input but
// the empty one. Known values: crc32c("123456789") = 0xE3069283, crc32c(32 zero bytes) = 0x8A9136AA.
// crc32c_update(crc32c_update(0, a), b) == crc32c of a followed by b. One 256-entry table (the
// records it checks are a few hundred bytes; no need for slicing).
// masked_crc32c(c) = ((c >> 15) | (c << 17)) + 0xA282EAD8 (uint32 arithmetic): TFRecord masks the
// CRC so that a CRC of bytes that hold CRCs does not degenerate.
// Thread safety: pure functions (the table is built once, thread-safely).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace qshard {

uint32_t crc32c_update(uint32_t crc, std::span<const uint8_t> bytes);
inline uint32_t crc32c(std::span<const uint8_t> bytes) { return crc32c_update(0, bytes); }
inline uint32_t crc32c(std::string_view bytes) {
  return crc32c({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
}

inline constexpr uint32_t kCrc32cMaskDelta = 0xA282EAD8u;
inline constexpr uint32_t masked_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kCrc32cMaskDelta; }
inline constexpr uint32_t unmasked_crc32c(uint32_t masked) {
  const uint32_t r = masked - kCrc32cMaskDelta;
  return (r >> 17) | (r << 15);
}

}  // namespace qshard
