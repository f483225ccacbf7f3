// flat_layout.h: how the tensors of one FSDP unit and kind are laid out in a flat byte buffer,
// and how that buffer is cut into per-rank shards.
//
// Byte layout: entries back to back in the order added, each starting at a multiple of
// kFlatAlign bytes (16: vector loads in kernels, and f32 boundaries for reduce-scatter); the
// buffer is padded with zeros to padded_bytes = round_up(total_bytes, world * kFlatAlign) so that
// every rank's shard has the same size shard_bytes = padded_bytes / world and starts aligned.
// Rank r owns bytes [r * shard_bytes, (r + 1) * shard_bytes).
// The layout knows nothing of what the bytes mean (NF4 codes, statistics, floats).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/tensor.h"

namespace qshard {

inline constexpr int64_t kFlatAlign = 16;

struct FlatEntry {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  int64_t offset = 0;  // bytes from the buffer start
  int64_t nbytes = 0;
};

class FlatLayout {
 public:
  // Appends a tensor; names must be unique within the layout.
  const FlatEntry& add(const std::string& name, DType dtype, const Shape& shape);
  void set_world(int world_size);  // fixes padded_bytes / shard_bytes

  const std::vector<FlatEntry>& entries() const { return entries_; }
  const FlatEntry* find(const std::string& name) const;
  int64_t total_bytes() const { return total_; }
  int64_t padded_bytes() const { return padded_; }
  int64_t shard_bytes() const { return shard_; }
  bool empty() const { return entries_.empty(); }

  // Packs full tensors (one per entry, same order; any device) into a host buffer of
  // padded_bytes, zero padding included.
  Tensor pack(const std::vector<Tensor>& tensors) const;
  // The same into `dst` (host memory of padded_bytes, e.g. a pinned shard): every byte written.
  void pack_into(uint8_t* dst, const std::vector<Tensor>& tensors) const;
  // A typed view of `entry` inside `flat` (u8 [padded_bytes], any device).
  Tensor view(const Tensor& flat, const FlatEntry& entry) const;

 private:
  std::vector<FlatEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
  int64_t total_ = 0, padded_ = 0, shard_ = 0;
};

}  // namespace qshard
