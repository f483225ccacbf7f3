// sharded_parameter_manager.h: FSDP-style sharding of a model's parameters across ranks.
//
// What: the model is cut into units (a decoder layer each; embeddings + final norm + LM head form
// the root unit). A unit owns one flat buffer per kind, never mixing kinds:
//   kFrozen4bit   packed NF4/FP4 bytes and quantization statistics of its Linear4bit weights
//   kFrozenFloat  norms, embeddings, LM head (never quantized)
//   kTrainable    LoRA A/B, fp32 master form
//   kFrozenHost   frozen tensors kept whole, not sharded, in pinned host memory on every rank and
//                 read in place by the kernels through unified addressing (the embedding table:
//                 a lookup reads only the step's rows). A gather copies nothing of it and no slot
//                 holds it; it needs no collective at any world size.
// Each buffer is padded to a multiple of the world size (flat_layout.h); rank r keeps shard r.
// Offload: with offload_params the frozen shards, with offload_optimizer the trainable (master)
// shards live in pinned host memory and are copied to the device (h2d stream) before the gather.
// One exception: at world size 1 an own-slot unit (the root) keeps its frozen shards on the
// device, read in place: its slot would hold the whole unit anyway, next to a pinned copy.
// Gradient shards always live on the compute device (accumulated there on the reduce stream);
// an optimizer on the host copies them out after wait_for_gradients().
// Gathered buffers live in `gathered_slots` (default 2: the unit computing now and the one
// prefetched) fixed-size slots sized by the largest shared-slot unit, so a rank never holds more
// than its shards plus two units; a unit added with own_slot (the root unit: embeddings, final
// norm, LM head) has a slot of its own, so it can stay gathered across the layers without
// making every layer slot as large as itself. Resident kinds: at world size 1 a kind whose shard
// lives on the compute device (not offloaded) is its own gathered buffer: views point into the
// shard, a gather copies nothing and the slots hold no buffer of that kind (the base and the
// root unit are not kept twice); the trainable masters are then read in place too (AdamW writes
// them after the step's last read). An offloaded kind at world size 1 is copied host to device
// straight into the slot (no staging copy, no collective).
//
// Unit states, asserted on every transition:
//   SHARDED --prefetch()--> GATHERING --gather()--> GATHERED --release()--> SHARDED
// Streams (stream.h): h2d (offloaded shard -> device), gather (all-gather of the next unit while
// the current one computes), reduce (gradient reduce-scatter while backward moves on), compute
// (the caller's kernels: the DeviceContext's stream, borrowed, not owned). Order across streams is
// event record + wait only; the only host waits are in the MPI communicator (which completes its
// call before returning) and on the CPU backend. Every buffer is allocated at finalize(): the
// step (prefetch, gather, release, reduce_scatter_grads, wait_for_gradients) allocates nothing
// and, over NCCL, never blocks the host.
// Gradients: gather(unit, GatherFor::kBackward) zeroes the unit's full fp32 gradient buffer (in its
// slot; a forward gather leaves it alone); the caller fills it through grad(); reduce_scatter_grads()
// averages it over ranks into the slot's preallocated reduce buffer and then into this rank's fp32
// gradient shard (written, or added when accumulate is true), all on the reduce stream.
// Views: view() returns typed tensors into the gathered buffer, valid until release(); hooks
// registered with on_gathered() run at gather() to bind them (e.g. as Params4bit into a tree, or a
// post-gather transform), hooks registered with on_released() at release() to unbind them.
// Thread safety: one thread drives a manager; every rank makes the same calls in the same order.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/memory_ledger.h"
#include "runtime/stream.h"
#include "shard/flat_layout.h"

namespace qshard {

enum class BufferKind : int { kFrozen4bit = 0, kFrozenFloat = 1, kTrainable = 2, kFrozenHost = 3 };
inline constexpr int kNumBufferKinds = 4;
const char* buffer_kind_name(BufferKind k);

enum class UnitState { kSharded, kGathering, kGathered };
const char* unit_state_name(UnitState s);

struct ShardOptions {
  bool offload_params = false;     // frozen shards (4-bit, norms, embeddings) in pinned host memory
  bool offload_optimizer = false;  // trainable master shards in pinned host memory (AdamW on the host)
  Device compute_device = Device::kCpu;
  int gathered_slots = 2;
  // bf16 / f16: every gather also writes a compute copy of the unit's trainable (f32) buffer in
  // this dtype, on the gather stream after the all-gather (the post-gather transform the CUDA
  // GEMMs read LoRA A/B from); f32: no copy.
  DType trainable_compute_dtype = DType::kF32;
};

// What a gather is for: a backward gather also zeroes the unit's gradient buffer.
enum class GatherFor { kForward, kBackward };

struct ShardMemoryStats {
  uint64_t shard_bytes = 0;          // this rank's parameter, master and gradient shards
  uint64_t slot_bytes = 0;           // gathered slots, allocated once at finalize: per slot and
                                     // kind the largest unit's buffer, plus gradients (+ staging)
  uint64_t slot_bytes_bound = 0;     // gathered_slots x (sum over kinds of the largest buffer +
                                     // gradients + staging), what slot_bytes must not exceed
  uint64_t unit_bytes_max = 0;       // the largest unit, gathered (all kinds + gradients)
  uint64_t gathered_bytes_now = 0;   // bytes of the units gathered now (their own sizes)
  uint64_t gathered_bytes_peak = 0;
  int gathered_now = 0;              // units in GATHERING or GATHERED
  int gathered_peak = 0;
};

class ShardedParameterManager {
 public:
  // `comm`: the data communicator; `compute`: the stream the caller's kernels run on.
  ShardedParameterManager(Communicator& comm, Stream& compute, const ShardOptions& options);
  ~ShardedParameterManager();
  ShardedParameterManager(const ShardedParameterManager&) = delete;
  ShardedParameterManager& operator=(const ShardedParameterManager&) = delete;

  // ---- building (before finalize) ----
  // own_slot: the unit gets a gathered slot of its own (the root unit).
  int add_unit(const std::string& name, bool own_slot = false);
  // `full` is the whole tensor (every rank passes the same values); kTrainable must be f32.
  // kFrozenHost: on a GPU, finalize() checks that the device reads pinned host memory at its host
  // address (unified addressing) and refuses otherwise.
  // Returns the entry's index in layout(unit, kind).entries() (stable: entries are laid out in
  // the order added), so a caller binds views later without looking the name up.
  size_t add_tensor(int unit, BufferKind kind, const std::string& name, const Tensor& full);
  // Lays out every unit, keeps this rank's shards, allocates the gathered slots. Collective-free.
  void finalize();
  // The seconds finalize() spent allocating this rank's shards (pinned host memory for offloaded
  // ones: page-locking dominates), the rest of it being the packing and the slots.
  double shard_alloc_seconds() const { return alloc_seconds_; }

  int num_units() const { return static_cast<int>(units_.size()); }
  const std::string& unit_name(int unit) const;
  UnitState state(int unit) const;
  const FlatLayout& layout(int unit, BufferKind kind) const;

  // ---- the step ----
  void prefetch(int unit);  // SHARDED -> GATHERING (no-op when already gathering/gathered)
  // (prefetch) -> GATHERED; compute stream ordered after the gather; kBackward zeroes gradients.
  void gather(int unit, GatherFor purpose = GatherFor::kForward);
  void release(int unit);   // GATHERED -> SHARDED
  Tensor view(int unit, BufferKind kind, const std::string& name) const;  // REQUIRES GATHERED
  // The same for an entry of layout(unit, kind) found once by the caller (no name lookup).
  Tensor view(int unit, BufferKind kind, const FlatEntry& entry) const;  // REQUIRES GATHERED
  // The address of an entry's bytes in the gathered buffer: view() without building a Tensor (the
  // step's post-gather binding). REQUIRES GATHERED.
  const void* data(int unit, BufferKind kind, const FlatEntry& entry) const;
  Tensor grad(int unit, const std::string& name) const;                    // REQUIRES GATHERED
  // The compute copy (trainable_compute_dtype) of a trainable entry. REQUIRES GATHERED and a
  // trainable_compute_dtype other than f32.
  Tensor compute_view(int unit, const std::string& name) const;
  // The gradient of a trainable entry of layout(unit, kTrainable), found once by the caller: the
  // step's lookup without names. REQUIRES GATHERED.
  float* grad_data(int unit, const FlatEntry& entry) const;
  // Likewise the compute copy of an entry (trainable_compute_dtype), or null when there is none
  // (trainable_compute_dtype f32). REQUIRES GATHERED.
  const void* compute_data(int unit, const FlatEntry& entry) const;
  void reduce_scatter_grads(int unit, bool accumulate);                    // REQUIRES GATHERED
  void on_gathered(int unit, std::function<void(int)> hook);
  void on_released(int unit, std::function<void(int)> hook);
  // Runs every unit's on_released hooks once (after finalize: the tree drops the full tensors it
  // was built with and keeps shapes only until a unit is gathered).
  void release_all_views();

  // ---- this rank's trainable state (the optimizer's view) ----
  Tensor master_shard(int unit) const;  // f32 [shard_bytes / 4] of kTrainable
  Tensor grad_shard(int unit) const;    // f32, same size
  // The compute stream's view of reduce-scattered gradients: waits for the reduce stream.
  void wait_for_gradients();
  // The optimizer enqueued its writes of the master shards on the compute stream: every later
  // gather's copies wait for them (an event, no host wait).
  void masters_written();
  // An optimizer that writes master shards in pinned host memory on a thread of its own (AdamW
  // on the host overlapping the next forward, train/host_adamw.h): fence(u) returns once unit u's
  // masters are final. A gather calls it before it copies those masters, master_shard() before
  // it hands them out. Null: none.
  void set_master_fence(std::function<void(int)> fence) { master_fence_ = std::move(fence); }

  Stream& compute_stream() { return compute_; }
  const ShardOptions& options() const { return options_; }
  ShardMemoryStats memory() const;
  // This manager's allocations into `ledger`: shards by kind (layer units and own-slot units such
  // as the root apart), gradient shards, gathered slots by kind, staging, slot gradients and
  // reduce outputs, compute copies; device or pinned host as they live. REQUIRES finalized.
  void account(MemoryLedger& ledger) const;
  Communicator& comm() { return comm_; }

 private:
  struct Unit;
  struct Slot;
  Unit& unit_at(int unit);
  const Unit& unit_at(int unit) const;
  void transition(Unit& u, UnitState from, UnitState to);
  Tensor alloc(int64_t bytes, bool host_side);
  struct SlotSizes {
    int64_t flat[kNumBufferKinds] = {0, 0, 0};     // 0: no buffer (read in place)
    int64_t staging[kNumBufferKinds] = {0, 0, 0};  // device copy of offloaded shards (world > 1)
    int64_t train = 0;                             // trainable padded bytes: gradients, compute copy
  };
  // u's shard of this kind lives in pinned host memory (offload_optimizer for the trainable kind,
  // offload_params for the frozen ones unless the unit's frozen shards stay on the device).
  bool host_side(const Unit& u, int kind) const;
  // World size 1 and the unit's shard of the kind on the compute device: the shard is the whole
  // buffer, read in place by a gather (no slot buffer, no copy).
  bool resident(const Unit& u, int kind) const;
  const Tensor& flat_of(const Unit& u, int kind) const;  // the gathered buffer of u's kind
  std::unique_ptr<Slot> make_slot(const SlotSizes& sizes);

  Communicator& comm_;
  ShardOptions options_;
  bool finalized_ = false;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<std::unique_ptr<Slot>> slots_;
  Stream& compute_;
  std::unique_ptr<Stream> h2d_, gather_, reduce_;
  Event grads_done_;  // on the reduce stream: every reduce-scatter so far is done
  Event masters_written_;  // on the compute stream: the last optimizer step's writes
  std::function<void(int)> master_fence_;  // set_master_fence
  int gathered_now_ = 0, gathered_peak_ = 0;
  uint64_t shard_bytes_ = 0, slot_bytes_ = 0, slot_bound_ = 0, unit_bytes_max_ = 0;
  uint64_t gathered_bytes_now_ = 0, gathered_bytes_peak_ = 0;
  double alloc_seconds_ = 0;
};

}  // namespace qshard
