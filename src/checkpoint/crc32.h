// crc32.h: CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320, init and final xor 0xFFFFFFFF),
// the checksum of zlib's crc32() and Python's zlib.crc32, so a user can verify a checkpoint file
// with `python3 -c "import zlib,sys; print(zlib.crc32(open(sys.argv[1],'rb').read()))" FILE`.
// crc32_update(crc32_update(0, a), b) == crc32 of a followed by b. Slicing-by-8 tables.
// Thread safety: pure functions (the tables are built once, thread-safely).
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace qshard {

uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> bytes);
inline uint32_t crc32(std::span<const uint8_t> bytes) { return crc32_update(0, bytes); }
// CRC-32 of a whole file, read in 4 MiB chunks. Throws InputError naming the path on I/O errors.
uint32_t crc32_file(const std::string& path);

}  // namespace qshard
