#include "shard/sharded_parameter_manager.h"

#include <cstring>

#include "runtime/allocator.h"
#include "shard/accumulate.h"
#ifdef QSHARD_WITH_CUDA
#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"
#endif

namespace qshard {

const char* buffer_kind_name(BufferKind k) {
  switch (k) {
    case BufferKind::kFrozen4bit: return "frozen-4bit";
    case BufferKind::kFrozenFloat: return "frozen-float";
    case BufferKind::kTrainable: return "trainable";
  }
  return "?";
}

const char* unit_state_name(UnitState s) {
  switch (s) {
    case UnitState::kSharded: return "SHARDED";
    case UnitState::kGathering: return "GATHERING";
    case UnitState::kGathered: return "GATHERED";
  }
  return "?";
}

struct ShardedParameterManager::Unit {
  std::string name;
  UnitState state = UnitState::kSharded;
  FlatLayout layout[kNumBufferKinds];
  std::vector<Tensor> pending[kNumBufferKinds];  // full tensors until finalize()
  Tensor shard[kNumBufferKinds];                 // u8 [shard_bytes]; host when offloaded
  Tensor grad_shard;                             // f32 [shard_bytes / 4] of kTrainable
  int slot = -1;
  std::vector<std::function<void(int)>> hooks;
  uint64_t gathered_bytes = 0;  // all kinds padded + gradients
};

// A gathered buffer set: one flat buffer per kind sized for the largest unit, a staging copy of
// the shards (offload), and the full gradient buffer.
struct ShardedParameterManager::Slot {
  Tensor flat[kNumBufferKinds];
  Tensor staging[kNumBufferKinds];
  Tensor grad;   // f32, largest trainable padded size
  int unit = -1;
  Event gathered;  // on the gather stream: the all-gather into this slot is done
  Event released;  // on the compute stream: the last use of this slot's unit is done
  Event grads_read;  // on the reduce stream: the reduce-scatter read the gradients
};

namespace {

bool on_device(const Tensor& t) { return t.device() == Device::kCuda; }

// Copy of n bytes, ordered on `stream` (synchronous on the CPU).
void copy_async(void* dst, const void* src, size_t n, void* stream) {
  if (n == 0) return;
#ifdef QSHARD_WITH_CUDA
  if (stream != nullptr || cuda_available()) {
    QS_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
    return;
  }
#endif
  (void)stream;
  std::memmove(dst, src, n);
}

void zero_async(Tensor& t, void* stream) {
  if (t.nbytes() == 0) return;
#ifdef QSHARD_WITH_CUDA
  if (on_device(t)) {
    QS_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), static_cast<cudaStream_t>(stream)));
    return;
  }
#endif
  (void)stream;
  std::memset(t.raw(), 0, t.nbytes());
}

}  // namespace

ShardedParameterManager::ShardedParameterManager(Communicator& comm, const ShardOptions& options)
    : comm_(comm), options_(options) {
  QS_CHECK(options.gathered_slots >= 1, "gathered_slots must be at least 1");
  if (options.compute_device == Device::kCuda && !cuda_available())
    throw Error("sharded parameters on the GPU requested, but no CUDA device is visible");
  compute_ = std::make_unique<Stream>(stream_names::kCompute);
  h2d_ = std::make_unique<Stream>(stream_names::kH2D);
  gather_ = std::make_unique<Stream>(stream_names::kGather);
  reduce_ = std::make_unique<Stream>(stream_names::kReduce);
}

ShardedParameterManager::~ShardedParameterManager() {
  // Work still in flight reads the buffers being freed.
  for (Stream* s : {compute_.get(), h2d_.get(), gather_.get(), reduce_.get()})
    if (s) s->synchronize();
}

ShardedParameterManager::Unit& ShardedParameterManager::unit_at(int unit) {
  if (unit < 0 || unit >= num_units()) throw Error("no FSDP unit " + std::to_string(unit));
  return *units_[unit];
}
const ShardedParameterManager::Unit& ShardedParameterManager::unit_at(int unit) const {
  return const_cast<ShardedParameterManager*>(this)->unit_at(unit);
}

const std::string& ShardedParameterManager::unit_name(int unit) const { return unit_at(unit).name; }
UnitState ShardedParameterManager::state(int unit) const { return unit_at(unit).state; }
const FlatLayout& ShardedParameterManager::layout(int unit, BufferKind kind) const {
  return unit_at(unit).layout[static_cast<int>(kind)];
}

void ShardedParameterManager::transition(Unit& u, UnitState from, UnitState to) {
  if (u.state != from)
    throw Error("FSDP unit '" + u.name + "': transition " + unit_state_name(from) + " -> " + unit_state_name(to) +
                " requested in state " + unit_state_name(u.state));
  u.state = to;
}

Tensor ShardedParameterManager::alloc(int64_t bytes, bool host_side) {
  const int64_t n = std::max<int64_t>(bytes, 1);
  if (options_.compute_device == Device::kCpu) return Tensor::zeros({n}, DType::kU8);
  if (!host_side) return Tensor::zeros({n}, DType::kU8, Device::kCuda);
  // Offloaded shard: page-locked host memory so the h2d copy is a true async DMA.
  static PinnedHostAllocator pinned;
  void* p = pinned.allocate(static_cast<size_t>(n));
  std::memset(p, 0, static_cast<size_t>(n));
  return Tensor::adopt(p, {n}, DType::kU8, Device::kCpu, [](void* q) { pinned.release(q); });
}

int ShardedParameterManager::add_unit(const std::string& name) {
  QS_CHECK(!finalized_, "add_unit after finalize");
  units_.push_back(std::make_unique<Unit>());
  units_.back()->name = name;
  return num_units() - 1;
}

void ShardedParameterManager::add_tensor(int unit, BufferKind kind, const std::string& name, const Tensor& full) {
  QS_CHECK(!finalized_, "add_tensor after finalize");
  if (kind == BufferKind::kTrainable && full.dtype() != DType::kF32)
    throw Error("trainable tensor '" + name + "' must be float32 (master form), got " + dtype_torch_name(full.dtype()));
  Unit& u = unit_at(unit);
  u.layout[static_cast<int>(kind)].add(name, full.dtype(), full.shape());
  u.pending[static_cast<int>(kind)].push_back(full);
}

void ShardedParameterManager::finalize() {
  QS_CHECK(!finalized_, "finalize called twice");
  const int world = comm_.size(), rank = comm_.rank();
  int64_t slot_bytes[kNumBufferKinds] = {0, 0, 0};
  for (auto& up : units_) {
    Unit& u = *up;
    uint64_t unit_bytes = 0;
    for (int k = 0; k < kNumBufferKinds; ++k) {
      FlatLayout& l = u.layout[k];
      l.set_world(world);
      const Tensor flat = l.pack(u.pending[k]);
      u.pending[k].clear();
      const bool host_side = options_.offload;
      u.shard[k] = alloc(l.shard_bytes(), host_side).flat_slice(0, l.shard_bytes());
      copy_bytes(u.shard[k].raw(), u.shard[k].device(), static_cast<const uint8_t*>(flat.raw()) + rank * l.shard_bytes(),
                 Device::kCpu, static_cast<size_t>(l.shard_bytes()));
      shard_bytes_ += l.shard_bytes();
      slot_bytes[k] = std::max(slot_bytes[k], l.padded_bytes());
      unit_bytes += l.padded_bytes();
    }
    const int64_t t = static_cast<int>(BufferKind::kTrainable);
    u.grad_shard = alloc(u.layout[t].shard_bytes(), options_.offload)
                       .flat_slice(0, u.layout[t].shard_bytes())
                       .view_as(DType::kF32, {u.layout[t].shard_bytes() / 4});
    shard_bytes_ += u.layout[t].shard_bytes();
    unit_bytes += u.layout[t].padded_bytes();  // its gradients
    u.gathered_bytes = unit_bytes;
    unit_bytes_max_ = std::max<uint64_t>(unit_bytes_max_, unit_bytes);
  }
  for (int k = 0; k < kNumBufferKinds; ++k) {
    slot_bound_ += std::max<int64_t>(slot_bytes[k], 1);
    if (options_.offload) slot_bound_ += slot_bytes[k] / world + kFlatAlign;  // staging
  }
  slot_bound_ += std::max<int64_t>(slot_bytes[static_cast<int>(BufferKind::kTrainable)], 4);  // gradients
  slot_bound_ *= options_.gathered_slots;
  for (int s = 0; s < options_.gathered_slots; ++s) {
    auto slot = std::make_unique<Slot>();
    for (int k = 0; k < kNumBufferKinds; ++k) {
      slot->flat[k] = alloc(slot_bytes[k], false);
      slot_bytes_ += slot->flat[k].nbytes();
      if (options_.offload) {  // the shard is copied next to the gather first (h2d on a GPU)
        slot->staging[k] = alloc(slot_bytes[k] / world + kFlatAlign, false);
        slot_bytes_ += slot->staging[k].nbytes();
      }
    }
    const int64_t g = std::max<int64_t>(slot_bytes[static_cast<int>(BufferKind::kTrainable)], 4);
    slot->grad = alloc(g, false).view_as(DType::kF32, {g / 4});
    slot_bytes_ += slot->grad.nbytes();
    slots_.push_back(std::move(slot));
  }
  finalized_ = true;
}

void ShardedParameterManager::prefetch(int unit) {
  QS_CHECK(finalized_, "prefetch before finalize");
  Unit& u = unit_at(unit);
  if (u.state != UnitState::kSharded) return;
  int free_slot = -1;
  for (size_t s = 0; s < slots_.size(); ++s)
    if (slots_[s]->unit < 0) {
      free_slot = static_cast<int>(s);
      break;
    }
  if (free_slot < 0)
    throw Error("FSDP unit '" + u.name + "': all " + std::to_string(slots_.size()) +
                " gathered slots are in use; release a unit before gathering another");
  transition(u, UnitState::kSharded, UnitState::kGathering);
  Slot& slot = *slots_[free_slot];
  slot.unit = unit;
  u.slot = free_slot;
  // The slot's previous unit may still be read by compute (and its gradients by the reduce).
  h2d_->wait(slot.released);
  gather_->wait(slot.released);
  gather_->wait(slot.grads_read);
  Event copied;
  for (int k = 0; k < kNumBufferKinds; ++k) {
    const FlatLayout& l = u.layout[k];
    const void* src = u.shard[k].raw();
    if (slot.staging[k].defined()) {  // offloaded: pinned host shard -> device staging (h2d)
      copy_async(slot.staging[k].raw(), src, static_cast<size_t>(l.shard_bytes()), h2d_->handle());
      src = slot.staging[k].raw();
    }
    h2d_->record(copied);
    gather_->wait(copied);
    comm_.all_gather(src, slot.flat[k].raw(), static_cast<size_t>(l.shard_bytes()), DType::kU8, gather_->handle());
  }
  gather_->record(slot.gathered);
  ++gathered_now_;
  gathered_peak_ = std::max(gathered_peak_, gathered_now_);
  gathered_bytes_now_ += u.gathered_bytes;
  gathered_bytes_peak_ = std::max(gathered_bytes_peak_, gathered_bytes_now_);
}

void ShardedParameterManager::gather(int unit) {
  Unit& u = unit_at(unit);
  if (u.state == UnitState::kSharded) prefetch(unit);
  transition(u, UnitState::kGathering, UnitState::kGathered);
  Slot& slot = *slots_[u.slot];
  compute_->wait(slot.gathered);
  zero_async(slot.grad, compute_->handle());
  for (auto& h : u.hooks) h(unit);
}

void ShardedParameterManager::release(int unit) {
  Unit& u = unit_at(unit);
  transition(u, UnitState::kGathered, UnitState::kSharded);
  Slot& slot = *slots_[u.slot];
  compute_->record(slot.released);
  slot.unit = -1;
  u.slot = -1;
  --gathered_now_;
  gathered_bytes_now_ -= u.gathered_bytes;
}

Tensor ShardedParameterManager::view(int unit, BufferKind kind, const std::string& name) const {
  const Unit& u = unit_at(unit);
  if (u.state != UnitState::kGathered)
    throw Error("FSDP unit '" + u.name + "': view of '" + name + "' in state " + unit_state_name(u.state));
  const FlatLayout& l = u.layout[static_cast<int>(kind)];
  const FlatEntry* e = l.find(name);
  if (!e) throw Error("FSDP unit '" + u.name + "' has no " + buffer_kind_name(kind) + " tensor '" + name + "'");
  return l.view(slots_[u.slot]->flat[static_cast<int>(kind)], *e);
}

Tensor ShardedParameterManager::grad(int unit, const std::string& name) const {
  const Unit& u = unit_at(unit);
  if (u.state != UnitState::kGathered)
    throw Error("FSDP unit '" + u.name + "': gradient of '" + name + "' in state " + unit_state_name(u.state));
  const FlatLayout& l = u.layout[static_cast<int>(BufferKind::kTrainable)];
  const FlatEntry* e = l.find(name);
  if (!e) throw Error("FSDP unit '" + u.name + "' has no trainable tensor '" + name + "'");
  const Tensor bytes = slots_[u.slot]->grad.view_as(DType::kU8, {slots_[u.slot]->grad.nbytes() > 0
                                                                       ? static_cast<int64_t>(slots_[u.slot]->grad.nbytes())
                                                                       : 0});
  return l.view(bytes, *e);
}

void ShardedParameterManager::reduce_scatter_grads(int unit, bool accumulate) {
  Unit& u = unit_at(unit);
  if (u.state != UnitState::kGathered)
    throw Error("FSDP unit '" + u.name + "': reduce-scatter of gradients in state " + unit_state_name(u.state));
  const FlatLayout& l = u.layout[static_cast<int>(BufferKind::kTrainable)];
  const int64_t n = l.shard_bytes() / 4;
  if (n == 0) return;
  Slot& slot = *slots_[u.slot];
  Event grads_ready;
  compute_->record(grads_ready);
  reduce_->wait(grads_ready);
  const bool direct = !accumulate && on_device(u.grad_shard) == on_device(slot.grad);
  if (direct) {
    comm_.reduce_scatter(slot.grad.raw(), u.grad_shard.raw(), static_cast<size_t>(n), DType::kF32, ReduceOp::kAvg,
                         reduce_->handle());
  } else {
    // Reduce into a temporary next to the full gradients, then move/add into the shard.
    Tensor tmp = Tensor::empty({n}, DType::kF32, slot.grad.device());
    comm_.reduce_scatter(slot.grad.raw(), tmp.raw(), static_cast<size_t>(n), DType::kF32, ReduceOp::kAvg,
                         reduce_->handle());
    if (on_device(tmp) != on_device(u.grad_shard)) {
      Tensor host = Tensor::empty({n}, DType::kF32);
      copy_async(host.raw(), tmp.raw(), tmp.nbytes(), reduce_->handle());
      reduce_->synchronize();  // host-side accumulation below reads it (offloaded optimizer state)
      tmp = host;
    }
    if (accumulate) {
      accumulate_f32(u.grad_shard, tmp, reduce_->handle());
    } else {
      copy_async(u.grad_shard.raw(), tmp.raw(), tmp.nbytes(), reduce_->handle());
    }
    reduce_->synchronize();  // `tmp` is freed on return
  }
  reduce_->record(slot.grads_read);
}

void ShardedParameterManager::on_gathered(int unit, std::function<void(int)> hook) {
  unit_at(unit).hooks.push_back(std::move(hook));
}

Tensor ShardedParameterManager::master_shard(int unit) const {
  const Unit& u = unit_at(unit);
  const Tensor& s = u.shard[static_cast<int>(BufferKind::kTrainable)];
  return s.view_as(DType::kF32, {static_cast<int64_t>(s.nbytes() / 4)});
}

Tensor ShardedParameterManager::grad_shard(int unit) const { return unit_at(unit).grad_shard; }

void ShardedParameterManager::wait_for_gradients() {
  Event done;
  reduce_->record(done);
  compute_->wait(done);
}

ShardMemoryStats ShardedParameterManager::memory() const {
  ShardMemoryStats m;
  m.shard_bytes = shard_bytes_;
  m.slot_bytes = slot_bytes_;
  m.unit_bytes_max = unit_bytes_max_;
  m.slot_bytes_bound = slot_bound_;
  m.gathered_bytes_now = gathered_bytes_now_;
  m.gathered_bytes_peak = gathered_bytes_peak_;
  m.gathered_now = gathered_now_;
  m.gathered_peak = gathered_peak_;
  return m;
}

}  // namespace qshard
