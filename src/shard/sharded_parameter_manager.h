// sharded_parameter_manager.h: FSDP-style sharding of a model's parameters across ranks.
//
// What: the model is cut into units (a decoder layer each; embeddings + final norm + LM head form
// the root unit). A unit owns one flat buffer per kind, never mixing kinds:
//   kFrozen4bit   packed NF4/FP4 bytes and quantization statistics of its Linear4bit weights
//   kFrozenFloat  norms, embeddings, LM head (never quantized)
//   kTrainable    LoRA A/B, fp32 master form
// Each buffer is padded to a multiple of the world size (flat_layout.h); rank r keeps shard r.
// With offload on, shards live in pinned host memory and are copied to the device before the
// gather. Gathered buffers live in `gathered_slots` (default 2: the unit computing now and the one
// prefetched) fixed-size slots, so a rank never holds more than its shards plus two units.
//
// Unit states, asserted on every transition:
//   SHARDED --prefetch()--> GATHERING --gather()--> GATHERED --release()--> SHARDED
// Streams (stream.h): h2d (offloaded shard -> device), gather (all-gather of the next unit while
// the current one computes), reduce (gradient reduce-scatter while backward moves on), compute
// (the caller's kernels). Order across streams is event record + wait only; the only host waits
// are in the MPI communicator (which completes its call before returning) and on the CPU backend.
// Gradients: gather() zeroes the unit's full fp32 gradient buffer (in its slot); the caller fills
// it through grad(); reduce_scatter_grads() averages it over ranks into this rank's fp32 gradient
// shard (added to it when accumulate is true).
// Views: view() returns typed tensors into the gathered buffer, valid until release(); hooks
// registered with on_gathered() run at gather() to bind them (e.g. as Params4bit into a tree).
// Thread safety: one thread drives a manager; every rank makes the same calls in the same order.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/stream.h"
#include "shard/flat_layout.h"

namespace qshard {

enum class BufferKind : int { kFrozen4bit = 0, kFrozenFloat = 1, kTrainable = 2 };
inline constexpr int kNumBufferKinds = 3;
const char* buffer_kind_name(BufferKind k);

enum class UnitState { kSharded, kGathering, kGathered };
const char* unit_state_name(UnitState s);

struct ShardOptions {
  bool offload = false;                 // parameter shards in pinned host memory
  Device compute_device = Device::kCpu;
  int gathered_slots = 2;
};

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
  ShardedParameterManager(Communicator& comm, const ShardOptions& options);
  ~ShardedParameterManager();
  ShardedParameterManager(const ShardedParameterManager&) = delete;
  ShardedParameterManager& operator=(const ShardedParameterManager&) = delete;

  // ---- building (before finalize) ----
  int add_unit(const std::string& name);
  // `full` is the whole tensor (every rank passes the same values); kTrainable must be f32.
  void add_tensor(int unit, BufferKind kind, const std::string& name, const Tensor& full);
  // Lays out every unit, keeps this rank's shards, allocates the gathered slots. Collective-free.
  void finalize();

  int num_units() const { return static_cast<int>(units_.size()); }
  const std::string& unit_name(int unit) const;
  UnitState state(int unit) const;
  const FlatLayout& layout(int unit, BufferKind kind) const;

  // ---- the step ----
  void prefetch(int unit);  // SHARDED -> GATHERING (no-op when already gathering/gathered)
  void gather(int unit);    // (prefetch) -> GATHERED; compute stream ordered after the gather
  void release(int unit);   // GATHERED -> SHARDED
  Tensor view(int unit, BufferKind kind, const std::string& name) const;  // REQUIRES GATHERED
  Tensor grad(int unit, const std::string& name) const;                    // REQUIRES GATHERED
  void reduce_scatter_grads(int unit, bool accumulate);                    // REQUIRES GATHERED
  void on_gathered(int unit, std::function<void(int)> hook);

  // ---- this rank's trainable state (the optimizer's view) ----
  Tensor master_shard(int unit) const;  // f32 [shard_bytes / 4] of kTrainable
  Tensor grad_shard(int unit) const;    // f32, same size
  // The compute stream's view of reduce-scattered gradients: waits for the reduce stream.
  void wait_for_gradients();

  Stream& compute_stream() { return *compute_; }
  ShardMemoryStats memory() const;
  Communicator& comm() { return comm_; }

 private:
  struct Unit;
  struct Slot;
  Unit& unit_at(int unit);
  const Unit& unit_at(int unit) const;
  void transition(Unit& u, UnitState from, UnitState to);
  Tensor alloc(int64_t bytes, bool host_side);

  Communicator& comm_;
  ShardOptions options_;
  bool finalized_ = false;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::unique_ptr<Stream> compute_, h2d_, gather_, reduce_;
  int gathered_now_ = 0, gathered_peak_ = 0;
  uint64_t shard_bytes_ = 0, slot_bytes_ = 0, slot_bound_ = 0, unit_bytes_max_ = 0;
  uint64_t gathered_bytes_now_ = 0, gathered_bytes_peak_ = 0;
};

}  // namespace qshard
