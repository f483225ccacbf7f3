// comm_test_util.h: deterministic per-rank data for the communicator tests.
//
// Every rank can regenerate any rank's input from (rank, index, salt), so each rank computes the
// expected result of a collective serially, in rank order, without extra communication.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace qshard::test {

inline uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t key(int rank, size_t i, uint64_t salt) {
  return mix64(mix64(salt * 1315423911ull + static_cast<uint64_t>(rank)) + i);
}

inline uint8_t pattern_byte(int rank, size_t i, uint64_t salt) {
  return static_cast<uint8_t>(key(rank, i, salt) >> 56);
}

// An integer in [-500, 500] as a float: sums over a few ranks are exact in f32.
inline float int_value(int rank, size_t i, uint64_t salt) {
  return static_cast<float>(static_cast<int>(key(rank, i, salt) % 1001) - 500);
}

// A non-integer in +-[2^-8, 2^8): sums round, so the summation order shows in the bits.
inline float rand_value(int rank, size_t i, uint64_t salt) {
  uint64_t k = key(rank, i, salt);
  float mant = static_cast<float>(k >> 40) / static_cast<float>(1ull << 24);  // [0, 1)
  int exp = static_cast<int>((k >> 8) % 16) - 8;
  float v = (1.0f + mant) * static_cast<float>(exp >= 0 ? (1u << exp) : 1.0 / (1u << -exp));
  return (k & 1) ? -v : v;
}

}  // namespace qshard::test
