#include "shard/flat_layout.h"

#include "runtime/sync_counters.h"

#include <cstring>

namespace qshard {

namespace {
int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
}  // namespace

const FlatEntry& FlatLayout::add(const std::string& name, DType dtype, const Shape& shape) {
  if (index_.count(name)) throw Error("flat layout: tensor '" + name + "' added twice");
  FlatEntry e{name, dtype, shape, round_up(total_, kFlatAlign), shape_numel(shape) * static_cast<int64_t>(dtype_size(dtype))};
  total_ = e.offset + e.nbytes;
  index_[name] = entries_.size();
  entries_.push_back(std::move(e));
  padded_ = shard_ = 0;
  return entries_.back();
}

void FlatLayout::set_world(int world) {
  QS_CHECK(world > 0, "world size must be positive");
  padded_ = round_up(std::max<int64_t>(total_, 1), world * kFlatAlign);
  shard_ = padded_ / world;
}

const FlatEntry* FlatLayout::find(const std::string& name) const {
  count_name_lookup();
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

void FlatLayout::pack_into(uint8_t* dst, const std::vector<Tensor>& tensors) const {
  QS_CHECK(tensors.size() == entries_.size(), "pack: one tensor per entry");
  QS_CHECK(padded_ > 0, "pack: set_world first");
  int64_t end = 0;  // bytes written so far: the gaps before each entry and the tail are zeroed
  for (size_t i = 0; i < tensors.size(); ++i) {
    const FlatEntry& e = entries_[i];
    const Tensor& t = tensors[i];
    if (t.dtype() != e.dtype || t.numel() != shape_numel(e.shape))
      throw Error("pack: tensor '" + e.name + "' is " + dtype_torch_name(t.dtype()) + shape_str(t.shape()) +
                  ", layout expects " + dtype_torch_name(e.dtype) + shape_str(e.shape));
    if (e.offset > end) std::memset(dst + end, 0, static_cast<size_t>(e.offset - end));
    if (e.nbytes) copy_bytes(dst + e.offset, Device::kCpu, t.raw(), t.device(), e.nbytes);
    end = e.offset + e.nbytes;
  }
  if (padded_ > end) std::memset(dst + end, 0, static_cast<size_t>(padded_ - end));
}

Tensor FlatLayout::pack(const std::vector<Tensor>& tensors) const {
  Tensor flat = Tensor::empty({padded_}, DType::kU8);
  pack_into(static_cast<uint8_t*>(flat.raw()), tensors);
  return flat;
}

Tensor FlatLayout::view(const Tensor& flat, const FlatEntry& e) const {
  return flat.flat_slice(e.offset, e.nbytes).view_as(e.dtype, e.shape);
}

}  // namespace qshard
