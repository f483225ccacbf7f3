#include "shard/sharded_parameter_manager.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

#include "runtime/allocator.h"
#include "runtime/parallel.h"
#include "runtime/accumulate.h"

namespace qshard {

const char* buffer_kind_name(BufferKind k) {
  switch (k) {
    case BufferKind::kFrozen4bit: return "frozen-4bit";
    case BufferKind::kFrozenFloat: return "frozen-float";
    case BufferKind::kTrainable: return "trainable";
    case BufferKind::kFrozenHost: return "frozen-host";
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
                                                 // (kFrozenHost: the whole buffer, pinned)
  Tensor grad_shard;                             // f32 [shard_bytes / 4] of kTrainable
  int slot = -1;
  bool own_slot = false;
  int own_slot_index = -1;  // with own_slot: its slot in slots_
  bool frozen_on_device = false;  // finalize(): an own-slot unit at world size 1 (offload_params aside)
  std::vector<std::function<void(int)>> hooks, release_hooks;
  uint64_t gathered_bytes = 0;  // all kinds padded + gradients
};

// A gathered buffer set: one flat buffer per kind sized for the largest unit it serves, a staging
// copy of the shards (offloaded kinds), the full gradient buffer and the reduce-scatter output.
struct ShardedParameterManager::Slot {
  Tensor flat[kNumBufferKinds];
  Tensor staging[kNumBufferKinds];
  Tensor grad;     // f32, largest trainable padded size
  Tensor reduced;  // f32, largest trainable shard: reduce-scatter output before accumulation
  Tensor compute_copy;  // trainable_compute_dtype copy of flat[kTrainable] (undefined for f32)
  int unit = -1;
  bool shared = true;  // one of the gathered_slots (not a unit's own slot)
  Event copied;    // on the h2d stream: the offloaded shards are staged on the device
  Event gathered;  // on the gather stream: the all-gather into this slot is done
  Event released;  // on the compute stream: the last use of this slot's unit is done
  Event grads_ready;  // on the compute stream: the unit's gradients are complete
  Event grads_read;  // on the reduce stream: the reduce-scatter read the gradients
};

namespace {

// Copy of n bytes, ordered on `stream` (synchronous on the CPU).
void copy_async(void* dst, const void* src, size_t n, void* stream) { copy_bytes_anywhere_async(dst, src, n, stream); }

void zero_async(Tensor& t, void* stream) { zero_bytes_async(t.raw(), t.device(), t.nbytes(), stream); }

constexpr int kHostKind = static_cast<int>(BufferKind::kFrozenHost);

}  // namespace

ShardedParameterManager::ShardedParameterManager(Communicator& comm, Stream& compute, const ShardOptions& options)
    : comm_(comm), options_(options), compute_(compute) {
  QS_CHECK(options.gathered_slots >= 1, "gathered_slots must be at least 1");
  if (options.compute_device == Device::kCuda && !cuda_available())
    throw Error("sharded parameters on the GPU requested, but no CUDA device is visible");
  h2d_ = std::make_unique<Stream>(stream_names::kH2D);
  gather_ = std::make_unique<Stream>(stream_names::kGather);
  reduce_ = std::make_unique<Stream>(stream_names::kReduce);
}

ShardedParameterManager::~ShardedParameterManager() {
  // Work still in flight reads the buffers being freed.
  for (Stream* s : {&compute_, h2d_.get(), gather_.get(), reduce_.get()})
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
  // Offloaded shard: page-locked host memory so the h2d copy is a true async DMA. Not zeroed here:
  // finalize() writes every byte of a shard (the packing zeroes its gaps and tail).
  static PinnedHostAllocator pinned;
  void* p = pinned.allocate(static_cast<size_t>(n));
  return Tensor::adopt(p, {n}, DType::kU8, Device::kCpu, [](void* q) { pinned.release(q); });
}

int ShardedParameterManager::add_unit(const std::string& name, bool own_slot) {
  QS_CHECK(!finalized_, "add_unit after finalize");
  units_.push_back(std::make_unique<Unit>());
  units_.back()->name = name;
  units_.back()->own_slot = own_slot;
  return num_units() - 1;
}

size_t ShardedParameterManager::add_tensor(int unit, BufferKind kind, const std::string& name, const Tensor& full) {
  QS_CHECK(!finalized_, "add_tensor after finalize");
  if (kind == BufferKind::kTrainable && full.dtype() != DType::kF32)
    throw Error("trainable tensor '" + name + "' must be float32 (master form), got " + dtype_torch_name(full.dtype()));
  Unit& u = unit_at(unit);
  FlatLayout& layout = u.layout[static_cast<int>(kind)];
  layout.add(name, full.dtype(), full.shape());
  u.pending[static_cast<int>(kind)].push_back(full);
  return layout.entries().size() - 1;
}

bool ShardedParameterManager::host_side(const Unit& u, int kind) const {
  if (kind == kHostKind) return options_.compute_device != Device::kCpu;
  if (kind == static_cast<int>(BufferKind::kTrainable)) return options_.offload_optimizer;
  return options_.offload_params && !u.frozen_on_device;
}

bool ShardedParameterManager::resident(const Unit& u, int kind) const {
  return kind == kHostKind || (comm_.size() == 1 && !host_side(u, kind));
}

const Tensor& ShardedParameterManager::flat_of(const Unit& u, int kind) const {
  return resident(u, kind) ? u.shard[kind] : slots_[u.slot]->flat[kind];
}

std::unique_ptr<ShardedParameterManager::Slot> ShardedParameterManager::make_slot(const SlotSizes& sizes) {
  const int world = comm_.size();
  const int64_t grad_bytes = sizes.train;
  auto slot = std::make_unique<Slot>();
  for (int k = 0; k < kNumBufferKinds; ++k) {
    if (sizes.flat[k] > 0) {  // 0: every unit it serves reads that kind in place (its shard)
      slot->flat[k] = alloc(sizes.flat[k], false);
      slot_bytes_ += slot->flat[k].nbytes();
    }
    if (sizes.staging[k] > 0) {  // offloaded shards are copied next to the gather first (h2d on a GPU)
      slot->staging[k] = alloc(sizes.staging[k], false);
      slot_bytes_ += slot->staging[k].nbytes();
    }
  }
  const int64_t g = std::max<int64_t>(grad_bytes, 4);
  slot->grad = alloc(g, false).view_as(DType::kF32, {g / 4});
  const int64_t r = std::max<int64_t>(g / world + kFlatAlign, 4) / 4 * 4;
  slot->reduced = alloc(r, false).view_as(DType::kF32, {r / 4});
  slot_bytes_ += slot->grad.nbytes() + slot->reduced.nbytes();
  if (options_.trainable_compute_dtype != DType::kF32) {
    const int64_t n = std::max<int64_t>(grad_bytes / 4, 1);
    slot->compute_copy = alloc(n * static_cast<int64_t>(dtype_size(options_.trainable_compute_dtype)), false)
                             .view_as(options_.trainable_compute_dtype, {n});
    slot_bytes_ += slot->compute_copy.nbytes();
  }
  return slot;
}

void ShardedParameterManager::finalize() {
  QS_CHECK(!finalized_, "finalize called twice");
  const int world = comm_.size(), rank = comm_.rank();
  const int t = static_cast<int>(BufferKind::kTrainable);
  const auto start = std::chrono::steady_clock::now();
  SlotSizes shared;  // per kind the largest shared unit's buffer that is not read in place
  for (auto& up : units_) {
    Unit& u = *up;
    // An own-slot unit at world size 1 holds its whole self in that slot: its frozen shards live
    // there (on the device) rather than in pinned memory with a device copy beside them.
    u.frozen_on_device = world == 1 && u.own_slot;
    uint64_t unit_bytes = 0;
    for (int k = 0; k < kNumBufferKinds; ++k) {
      FlatLayout& l = u.layout[k];
      l.set_world(k == kHostKind ? 1 : world);  // kFrozenHost: whole on every rank
      if (k == kHostKind) {  // never gathered: its shard is the whole buffer
        shard_bytes_ += l.padded_bytes();
        continue;
      }
      if (!u.own_slot) {
        if (!resident(u, k)) shared.flat[k] = std::max(shared.flat[k], l.padded_bytes());
        if (host_side(u, k) && world > 1) shared.staging[k] = std::max(shared.staging[k], l.shard_bytes());
        if (k == t) shared.train = std::max(shared.train, l.padded_bytes());
      }
      unit_bytes += l.padded_bytes();
      shard_bytes_ += l.shard_bytes();
    }
    shard_bytes_ += u.layout[t].shard_bytes();  // its gradient shard
    unit_bytes += u.layout[t].padded_bytes();   // its gradients
    u.gathered_bytes = unit_bytes;
    unit_bytes_max_ = std::max<uint64_t>(unit_bytes_max_, unit_bytes);
  }
  // This rank's shards. Allocations and copies to the device run on this thread (its CUDA
  // device); the packing (a 70B base is ~40 GB) runs on the host's threads, a batch of units at
  // a time (host memory: one packed buffer per unit of the batch). At world size 1 a shard in host
  // memory is the whole buffer: packed in place.
  for (auto& up : units_) {
    Unit& u = *up;
    for (int k = 0; k < kNumBufferKinds; ++k)
      u.shard[k] = alloc(u.layout[k].shard_bytes(), host_side(u, k)).flat_slice(0, u.layout[k].shard_bytes());
    // Gradient shards live where the compute is (accumulated on the reduce stream).
    u.grad_shard = alloc(u.layout[t].shard_bytes(), false)
                       .flat_slice(0, u.layout[t].shard_bytes())
                       .view_as(DType::kF32, {u.layout[t].shard_bytes() / 4});
  }
  alloc_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // kFrozenHost is read by the kernels at its host address: the GPU must map pinned memory there.
  if (options_.compute_device == Device::kCuda)
    for (const auto& up : units_)
      if (!up->layout[kHostKind].empty() && !device_reads_at_host_address(up->shard[kHostKind].raw()))
        throw Error("FSDP unit '" + up->name + "': this GPU does not read pinned host memory at its host address " +
                    "(no unified addressing), so '" + up->layout[kHostKind].entries()[0].name +
                    "' cannot stay in host memory (memory.embedding: gpu)");
  auto on_host = [](const std::vector<Tensor>& ts) {
    for (const Tensor& x : ts)
      if (x.device() != Device::kCpu) return false;
    return true;
  };
  const size_t threads = static_cast<size_t>(host_threads(16));
  for (size_t b = 0; b < units_.size(); b += threads) {
    const size_t n = std::min(threads, units_.size() - b);
    std::vector<std::array<Tensor, kNumBufferKinds>> packed(n);
    parallel_for(n, static_cast<int>(threads), [&](size_t j) {  // host memory only
      Unit& u = *units_[b + j];
      for (int k = 0; k < kNumBufferKinds; ++k) {
        if (!on_host(u.pending[k])) continue;  // packed below, on this thread
        if ((world == 1 || k == kHostKind) && u.shard[k].device() == Device::kCpu)
          u.layout[k].pack_into(static_cast<uint8_t*>(u.shard[k].raw()), u.pending[k]);
        else
          packed[j][k] = u.layout[k].pack(u.pending[k]);
      }
    });
    for (size_t j = 0; j < n; ++j) {
      Unit& u = *units_[b + j];
      for (int k = 0; k < kNumBufferKinds; ++k) {
        const FlatLayout& l = u.layout[k];
        if (!on_host(u.pending[k])) packed[j][k] = l.pack(u.pending[k]);
        const int64_t from = k == kHostKind ? 0 : rank * l.shard_bytes();  // kFrozenHost: the whole buffer
        if (packed[j][k].defined())
          copy_bytes(u.shard[k].raw(), u.shard[k].device(), static_cast<const uint8_t*>(packed[j][k].raw()) + from,
                     Device::kCpu, static_cast<size_t>(l.shard_bytes()));
        u.pending[k].clear();
      }
    }
  }
  // The bound: per shared slot the largest shared unit's buffers (+ staging, gradients, reduce
  // output); per own-slot unit its own.
  auto slot_cost = [&](const SlotSizes& z) {
    uint64_t c = 0;
    for (int k = 0; k < kNumBufferKinds; ++k) c += z.flat[k] + z.staging[k];
    const int64_t g = std::max<int64_t>(z.train, 4);
    c += g + std::max<int64_t>(g / world + kFlatAlign, 4);
    if (options_.trainable_compute_dtype != DType::kF32)  // the LoRA compute copy
      c += std::max<int64_t>(z.train / 4, 1) * dtype_size(options_.trainable_compute_dtype);
    return c;
  };
  slot_bound_ = slot_cost(shared) * options_.gathered_slots;
  for (int s = 0; s < options_.gathered_slots; ++s) slots_.push_back(make_slot(shared));
  for (auto& up : units_) {
    Unit& u = *up;
    if (!u.own_slot) continue;
    SlotSizes own;
    for (int k = 0; k < kNumBufferKinds; ++k) {
      own.flat[k] = resident(u, k) ? 0 : u.layout[k].padded_bytes();
      own.staging[k] = host_side(u, k) && !resident(u, k) && world > 1 ? u.layout[k].shard_bytes() : 0;
    }
    own.train = u.layout[t].padded_bytes();
    slot_bound_ += slot_cost(own);
    slots_.push_back(make_slot(own));
    slots_.back()->shared = false;
    u.own_slot_index = static_cast<int>(slots_.size()) - 1;
  }
  finalized_ = true;
}

void ShardedParameterManager::prefetch(int unit) {
  QS_CHECK(finalized_, "prefetch before finalize");
  Unit& u = unit_at(unit);
  if (u.state != UnitState::kSharded) return;
  int free_slot = -1;
  if (u.own_slot) {
    free_slot = u.own_slot_index;  // SHARDED implies its own slot is free
  } else {
    for (size_t s = 0; s < slots_.size(); ++s)
      if (slots_[s]->shared && slots_[s]->unit < 0) {
        free_slot = static_cast<int>(s);
        break;
      }
  }
  if (free_slot < 0)
    throw Error("FSDP unit '" + u.name + "': all " + std::to_string(options_.gathered_slots) +
                " gathered slots are in use; release a unit before gathering another");
  transition(u, UnitState::kSharded, UnitState::kGathering);
  Slot& slot = *slots_[free_slot];
  slot.unit = unit;
  u.slot = free_slot;
  // The slot's previous unit may still be read by compute (and its gradients by the reduce).
  h2d_->wait(slot.released);
  gather_->wait(slot.released);
  // The optimizer's writes of the masters this gather reads: the h2d copy of offloaded masters,
  // the gather (and its LoRA compute copy) of every kind.
  if (host_side(u, static_cast<int>(BufferKind::kTrainable))) {
    if (master_fence_) master_fence_(unit);  // a host optimizer's writes of these masters are done
    h2d_->wait(masters_written_);
  }
  gather_->wait(masters_written_);
  gather_->wait(slot.grads_read);
  const bool alone = comm_.size() == 1;
  const void* src[kNumBufferKinds];
  for (int k = 0; k < kNumBufferKinds; ++k) {
    src[k] = u.shard[k].raw();
    if (k == kHostKind) continue;  // read in place from pinned host memory
    if (host_side(u, k)) {
      // Offloaded: the pinned host shard goes to the device (h2d): at world size 1 straight into
      // the slot (the shard is the whole buffer: nothing to gather), else into the staging copy
      // the all-gather sends.
      void* dst = alone ? slot.flat[k].raw() : slot.staging[k].raw();
      copy_async(dst, src[k], static_cast<size_t>(u.layout[k].shard_bytes()), h2d_->handle());
      src[k] = dst;
    }
  }
  h2d_->record(slot.copied);
  gather_->wait(slot.copied);
  // One grouped collective for the unit's kinds (fused by NCCL; MPI runs them one by one).
  // At world size 1 there is nothing to gather: resident kinds are read in place, offloaded ones
  // were copied into the slot above.
  if (!alone) {
    comm_.group_begin();
    for (int k = 0; k < kNumBufferKinds; ++k)
      if (!resident(u, k))
        comm_.all_gather(src[k], slot.flat[k].raw(), static_cast<size_t>(u.layout[k].shard_bytes()), DType::kU8,
                         gather_->handle());
    comm_.group_end();
  }
  if (slot.compute_copy.defined()) {  // post-gather transform: the LoRA weights' compute copy
    const int t = static_cast<int>(BufferKind::kTrainable);
    const int64_t n = u.layout[t].padded_bytes() / 4;
    if (n > 0) {
      Tensor in = flat_of(u, t).flat_slice(0, n * 4).view_as(DType::kF32, {n});
      Tensor out = slot.compute_copy.flat_slice(0, n);
      convert_f32(out, in, gather_->handle());
    }
  }
  gather_->record(slot.gathered);
  ++gathered_now_;
  gathered_peak_ = std::max(gathered_peak_, gathered_now_);
  gathered_bytes_now_ += u.gathered_bytes;
  gathered_bytes_peak_ = std::max(gathered_bytes_peak_, gathered_bytes_now_);
}

void ShardedParameterManager::gather(int unit, GatherFor purpose) {
  Unit& u = unit_at(unit);
  if (u.state == UnitState::kSharded) prefetch(unit);
  transition(u, UnitState::kGathering, UnitState::kGathered);
  Slot& slot = *slots_[u.slot];
  compute_.wait(slot.gathered);
  if (purpose == GatherFor::kBackward) {
    // The previous reduce-scatter of this slot must have read its gradients.
    compute_.wait(slot.grads_read);
    zero_async(slot.grad, compute_.handle());
  }
  for (auto& h : u.hooks) h(unit);
}

void ShardedParameterManager::release(int unit) {
  Unit& u = unit_at(unit);
  transition(u, UnitState::kGathered, UnitState::kSharded);
  Slot& slot = *slots_[u.slot];
  compute_.record(slot.released);
  for (auto& h : u.release_hooks) h(unit);
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
  return l.view(flat_of(u, static_cast<int>(kind)), *e);
}

Tensor ShardedParameterManager::view(int unit, BufferKind kind, const FlatEntry& entry) const {
  const Unit& u = unit_at(unit);
  if (u.state != UnitState::kGathered)
    throw Error("FSDP unit '" + u.name + "': view of '" + entry.name + "' in state " + unit_state_name(u.state));
  return u.layout[static_cast<int>(kind)].view(flat_of(u, static_cast<int>(kind)), entry);
}

const void* ShardedParameterManager::data(int unit, BufferKind kind, const FlatEntry& entry) const {
  const Unit& u = unit_at(unit);
  if (u.state != UnitState::kGathered)
    throw Error("FSDP unit '" + u.name + "': view of '" + entry.name + "' in state " + unit_state_name(u.state));
  return static_cast<const uint8_t*>(flat_of(u, static_cast<int>(kind)).raw()) + entry.offset;
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

Tensor ShardedParameterManager::compute_view(int unit, const std::string& name) const {
  const Unit& u = unit_at(unit);
  if (u.state != UnitState::kGathered)
    throw Error("FSDP unit '" + u.name + "': compute copy of '" + name + "' in state " + unit_state_name(u.state));
  const Slot& slot = *slots_[u.slot];
  if (!slot.compute_copy.defined())
    throw Error("FSDP unit '" + u.name + "': no compute copy (trainable_compute_dtype is float32)");
  const FlatEntry* e = u.layout[static_cast<int>(BufferKind::kTrainable)].find(name);
  if (!e) throw Error("FSDP unit '" + u.name + "' has no trainable tensor '" + name + "'");
  return slot.compute_copy.flat_slice(e->offset / 4, e->nbytes / 4).reshape(e->shape);
}

float* ShardedParameterManager::grad_data(int unit, const FlatEntry& entry) const {
  const Unit& u = unit_at(unit);
  if (u.state != UnitState::kGathered)
    throw Error("FSDP unit '" + u.name + "': gradient of '" + entry.name + "' in state " + unit_state_name(u.state));
  return reinterpret_cast<float*>(static_cast<uint8_t*>(const_cast<void*>(slots_[u.slot]->grad.raw())) + entry.offset);
}

const void* ShardedParameterManager::compute_data(int unit, const FlatEntry& entry) const {
  const Unit& u = unit_at(unit);
  if (u.state != UnitState::kGathered)
    throw Error("FSDP unit '" + u.name + "': compute copy of '" + entry.name + "' in state " + unit_state_name(u.state));
  const Slot& slot = *slots_[u.slot];
  if (!slot.compute_copy.defined()) return nullptr;
  return static_cast<const uint8_t*>(slot.compute_copy.raw()) +
         entry.offset / 4 * static_cast<int64_t>(dtype_size(options_.trainable_compute_dtype));
}

void ShardedParameterManager::reduce_scatter_grads(int unit, bool accumulate) {
  Unit& u = unit_at(unit);
  if (u.state != UnitState::kGathered)
    throw Error("FSDP unit '" + u.name + "': reduce-scatter of gradients in state " + unit_state_name(u.state));
  const FlatLayout& l = u.layout[static_cast<int>(BufferKind::kTrainable)];
  const int64_t n = l.shard_bytes() / 4;
  if (n == 0) return;
  Slot& slot = *slots_[u.slot];
  QS_CHECK(slot.reduced.numel() >= n, "reduce buffer smaller than the gradient shard");
  Event& grads_ready = slot.grads_ready;
  compute_.record(grads_ready);
  reduce_->wait(grads_ready);
  if (!accumulate) {
    comm_.reduce_scatter(slot.grad.raw(), u.grad_shard.raw(), static_cast<size_t>(n), DType::kF32, ReduceOp::kAvg,
                         reduce_->handle());
  } else {
    // Into the slot's reduce buffer, then added into the shard, both on the reduce stream.
    comm_.reduce_scatter(slot.grad.raw(), slot.reduced.raw(), static_cast<size_t>(n), DType::kF32, ReduceOp::kAvg,
                         reduce_->handle());
    Tensor reduced = slot.reduced.flat_slice(0, n);
    accumulate_f32(u.grad_shard, reduced, reduce_->handle());
  }
  reduce_->record(slot.grads_read);
}

void ShardedParameterManager::on_gathered(int unit, std::function<void(int)> hook) {
  unit_at(unit).hooks.push_back(std::move(hook));
}

void ShardedParameterManager::on_released(int unit, std::function<void(int)> hook) {
  unit_at(unit).release_hooks.push_back(std::move(hook));
}

void ShardedParameterManager::release_all_views() {
  for (int u = 0; u < num_units(); ++u) {
    QS_CHECK(units_[u]->state == UnitState::kSharded, "release_all_views with a unit gathered");
    for (auto& h : units_[u]->release_hooks) h(u);
  }
}

Tensor ShardedParameterManager::master_shard(int unit) const {
  const Unit& u = unit_at(unit);
  if (master_fence_) master_fence_(unit);
  const Tensor& s = u.shard[static_cast<int>(BufferKind::kTrainable)];
  return s.view_as(DType::kF32, {static_cast<int64_t>(s.nbytes() / 4)});
}

Tensor ShardedParameterManager::grad_shard(int unit) const { return unit_at(unit).grad_shard; }

void ShardedParameterManager::masters_written() { compute_.record(masters_written_); }

void ShardedParameterManager::wait_for_gradients() {
  reduce_->record(grads_done_);
  compute_.wait(grads_done_);
}

void ShardedParameterManager::account(MemoryLedger& ledger) const {
  QS_CHECK(finalized_, "account before finalize");
  static const char* const kShardNames[kNumBufferKinds] = {"base shards (4-bit)", "frozen float shards",
                                                           "LoRA master shards", "host-read tensors (whole)"};
  static const char* const kSlotNames[kNumBufferKinds] = {"gathered slots (4-bit)", "gathered slots (float)",
                                                          "gathered slots (LoRA)", "gathered slots (host)"};
  for (const auto& up : units_) {
    const Unit& u = *up;
    for (int k = 0; k < kNumBufferKinds; ++k) {
      const MemoryPlace p = host_side(u, k) && options_.compute_device != Device::kCpu ? MemoryPlace::kPinnedHost
                                                                                      : MemoryPlace::kDevice;
      std::string name = kShardNames[k];  // kFrozenHost: one line for every unit's
      if (u.own_slot && k != static_cast<int>(BufferKind::kTrainable) && k != kHostKind) name = u.name + " unit shards";
      ledger.add(name + (resident(u, k) ? " (read in place)" : ""), static_cast<uint64_t>(u.shard[k].nbytes()), p);
    }
    ledger.add("LoRA gradient shards", static_cast<uint64_t>(u.grad_shard.nbytes()), MemoryPlace::kDevice);
  }
  for (size_t si = 0; si < slots_.size(); ++si) {
    const Slot& slot = *slots_[si];
    std::string owner;  // an own slot: " (root)"
    for (const auto& up : units_)
      if (up->own_slot && up->own_slot_index == static_cast<int>(si)) owner = " (" + up->name + ")";
    for (int k = 0; k < kNumBufferKinds; ++k) {
      if (slot.flat[k].defined()) ledger.add(kSlotNames[k] + owner, slot.flat[k].nbytes(), MemoryPlace::kDevice);
      if (slot.staging[k].defined())
        ledger.add("staging of offloaded shards", slot.staging[k].nbytes(), MemoryPlace::kDevice);
    }
    ledger.add("slot gradients and reduce outputs", slot.grad.nbytes() + slot.reduced.nbytes(), MemoryPlace::kDevice);
    if (slot.compute_copy.defined()) ledger.add("LoRA compute copies", slot.compute_copy.nbytes(), MemoryPlace::kDevice);
  }
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
