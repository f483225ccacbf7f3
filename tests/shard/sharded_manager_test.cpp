// The sharded-parameter manager under mpirun -np 1..4 on the CPU backend (and on the GPU with
// ranks sharing one device through the MPI staging path, label `cuda` via QSHARD_SHARD_DEVICE).
// Every rank builds the same full tensors from a seed; sizes are chosen not to divide by any
// world size.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "common/test_stream.h"
#include "quant/params4bit.h"
#include "runtime/mpi_communicator.h"
#ifdef QSHARD_WITH_NCCL
#include <cuda_runtime.h>

#include "runtime/nccl_communicator.h"
#endif
#include "runtime/world.h"
#include "runtime/accumulate.h"
#include "shard/sharded_parameter_manager.h"

namespace qshard {
namespace {

Device test_device() {
  const char* d = std::getenv("QSHARD_SHARD_DEVICE");
  return d && std::string(d) == "cuda" ? Device::kCuda : Device::kCpu;
}

Tensor randn(const Shape& s, DType d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 0.05f);
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  for (auto& x : v) x = n(rng);
  return Tensor::from_f32(s, d, v);
}

struct FullModel {
  // unit -> kind -> (name, tensor)
  std::vector<std::vector<std::vector<std::pair<std::string, Tensor>>>> units;
};

// Three "decoder layers" and a root unit, with awkward sizes.
FullModel make_model() {
  FullModel m;
  const int64_t dims[] = {37, 64, 101};
  for (int u = 0; u < 4; ++u) {
    std::vector<std::vector<std::pair<std::string, Tensor>>> kinds(kNumBufferKinds);
    const int64_t d = dims[u % 3];
    if (u < 3) {
      for (const char* proj : {"q_proj", "down_proj"}) {
        Params4bit p = quantize_4bit(randn({d, 96 + u}, DType::kBF16, 100 * u + proj[0]), {QuantType::kNf4, 64, true});
        for (auto& [k, t] : params4bit_state_dict(p, std::string(proj) + ".weight")) {
          if (k.find("quant_state.bitsandbytes") != std::string::npos) continue;  // JSON: metadata, not gathered
          kinds[0].emplace_back(k, t);
        }
        kinds[2].emplace_back(std::string(proj) + ".lora_A.weight", randn({4, 96 + u}, DType::kF32, 7 * u + 1));
        kinds[2].emplace_back(std::string(proj) + ".lora_B.weight", randn({d, 4}, DType::kF32, 7 * u + 2));
      }
      kinds[1].emplace_back("input_layernorm.weight", randn({d}, DType::kBF16, 50 + u));
    } else {
      kinds[1].emplace_back("embed_tokens.weight", randn({33, 17}, DType::kBF16, 99));
      kinds[1].emplace_back("norm.weight", randn({17}, DType::kBF16, 98));
      // A unit with no 4-bit and no trainable tensors.
    }
    m.units.push_back(kinds);
  }
  return m;
}

// own_root: the root unit gets a slot of its own (as shard_module_tree adds it).
std::unique_ptr<ShardedParameterManager> build(Communicator& comm, const FullModel& m, bool offload,
                                               bool own_root = false) {
  ShardOptions o;
  o.offload_params = o.offload_optimizer = offload;
  o.compute_device = test_device();
  auto mgr = std::make_unique<ShardedParameterManager>(comm, qshard_test_compute_stream(), o);
  for (size_t u = 0; u < m.units.size(); ++u) {
    const int id = u < 3 ? mgr->add_unit("layers." + std::to_string(u)) : mgr->add_unit("root", own_root);
    for (int k = 0; k < kNumBufferKinds; ++k)
      for (const auto& [name, t] : m.units[u][k]) mgr->add_tensor(id, static_cast<BufferKind>(k), name, t);
  }
  mgr->finalize();
  return mgr;
}

::testing::AssertionResult same_bytes(const Tensor& a, const Tensor& b) {
  Tensor x = a.to(Device::kCpu), y = b.to(Device::kCpu);
  if (x.nbytes() != y.nbytes() || (x.nbytes() && std::memcmp(x.raw(), y.raw(), x.nbytes()) != 0))
    return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

// QSHARD_SHARD_COMM=nccl runs the same tests over NCCL (one rank per GPU); default MPI.
class Sharded : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test_device() == Device::kCuda && !cuda_available()) GTEST_SKIP() << "no CUDA device";
    const char* c = std::getenv("QSHARD_SHARD_COMM");
    if (c && std::string(c) == "nccl") {
#ifdef QSHARD_WITH_NCCL
      int gpus = 0;
      cudaGetDeviceCount(&gpus);
      if (World::get().local_size() > gpus)
        GTEST_SKIP() << World::get().local_size() << " ranks on " << gpus << " GPU(s): NCCL needs one each";
      comm_ = std::make_unique<NcclCommunicator>(World::get().comm());
#else
      GTEST_SKIP() << "built without NCCL";
#endif
    } else {
      comm_ = std::make_unique<MpiCommunicator>(World::get().comm());
    }
  }
  std::unique_ptr<Communicator> comm_;
};

TEST_F(Sharded, GatheredUnitsEqualTheOriginalsWithPrefetch) {
  const FullModel m = make_model();
  for (bool offload : {false, true}) {
    auto mgr = build(*comm_, m, offload);
    const int n = mgr->num_units();
    int hook_calls = 0;
    for (int u = 0; u < n; ++u) mgr->on_gathered(u, [&](int) { ++hook_calls; });
    // Forward order with prefetch of the next unit, then backward order.
    for (int pass = 0; pass < 2; ++pass) {
      for (int i = 0; i < n; ++i) {
        const int u = pass == 0 ? i : n - 1 - i;
        const int next = pass == 0 ? u + 1 : u - 1;
        mgr->gather(u);
        if (next >= 0 && next < n) mgr->prefetch(next);
        mgr->compute_stream().synchronize();  // the host reads the views below
        EXPECT_EQ(mgr->state(u), UnitState::kGathered);
        for (int k = 0; k < kNumBufferKinds; ++k)
          for (const auto& [name, t] : m.units[u][k])
            EXPECT_TRUE(same_bytes(mgr->view(u, static_cast<BufferKind>(k), name), t)) << name << " offload " << offload;
        mgr->release(u);
      }
    }
    EXPECT_EQ(hook_calls, 2 * n);
    const ShardMemoryStats s = mgr->memory();
    EXPECT_LE(s.gathered_peak, 2);
    EXPECT_EQ(s.gathered_now, 0);
    // Memory: this rank's shards plus at most two gathered units (the fixed slots).
    uint64_t total_padded = 0;
    for (int u = 0; u < n; ++u)
      for (int k = 0; k < kNumBufferKinds; ++k) total_padded += mgr->layout(u, static_cast<BufferKind>(k)).padded_bytes();
    EXPECT_LE(s.shard_bytes, 2 * total_padded / comm_->size() + 1);
    EXPECT_LE(s.gathered_bytes_peak, 2 * s.unit_bytes_max);  // at most two units gathered
    EXPECT_EQ(s.gathered_bytes_now, 0u);
    // The slots themselves: per slot and kind the largest buffer (+ staging for offload).
    EXPECT_LE(s.slot_bytes, s.slot_bytes_bound);
    if (comm_->rank() == 0)
      std::printf("world %d offload %d: shards %llu B, slots %llu B, peak gathered %llu B (2 x largest unit %llu B)\n",
                  comm_->size(), offload, (unsigned long long)s.shard_bytes, (unsigned long long)s.slot_bytes,
                  (unsigned long long)s.gathered_bytes_peak, (unsigned long long)s.unit_bytes_max);
  }
}

// The ledger (account()) is every allocation the manager made, device and pinned host; at world
// size 1 without offload the shards are read in place: no gathered copies of any kind, views
// point into the shards themselves.
TEST_F(Sharded, LedgerIsEveryAllocationAndWorldOneReadsInPlace) {
  const FullModel m = make_model();
  for (bool offload : {false, true}) {
    auto mgr = build(*comm_, m, offload);
    MemoryLedger ledger;
    mgr->account(ledger);
    const ShardMemoryStats s = mgr->memory();
    EXPECT_EQ(ledger.total(MemoryPlace::kDevice) + ledger.total(MemoryPlace::kPinnedHost), s.shard_bytes + s.slot_bytes)
        << ledger.describe();
    bool slot_copies = false;
    for (const LedgerLine& l : ledger.lines()) slot_copies = slot_copies || l.name.rfind("gathered slots", 0) == 0;
    const bool in_place = comm_->size() == 1 && !offload;
    EXPECT_EQ(slot_copies, !in_place) << ledger.describe();
    if (test_device() == Device::kCuda && offload)
      EXPECT_GT(ledger.total(MemoryPlace::kPinnedHost), 0u) << "offloaded shards live in pinned host memory";
    mgr->gather(1);
    const Tensor master = mgr->master_shard(1);
    const auto* lo = static_cast<const uint8_t*>(master.raw());
    const auto* v = static_cast<const uint8_t*>(mgr->view(1, BufferKind::kTrainable, "q_proj.lora_A.weight").raw());
    EXPECT_EQ(v >= lo && v < lo + master.nbytes(), in_place) << "a view into the master shard iff read in place";
    mgr->release(1);
  }
}

// At world size 1 an own-slot unit's frozen shards stay on the device even with offload_params
// (its slot would hold the whole unit anyway): read in place, no pinned copy, no slot buffer; the
// layers are still offloaded. At larger world sizes the root is offloaded like the rest.
TEST_F(Sharded, WorldOneKeepsAnOwnSlotUnitOnTheDevice) {
  const FullModel m = make_model();
  auto mgr = build(*comm_, m, /*offload=*/true, /*own_root=*/true);
  const bool alone = comm_->size() == 1;
  MemoryLedger ledger;
  mgr->account(ledger);
  const ShardMemoryStats s = mgr->memory();
  EXPECT_EQ(ledger.total(MemoryPlace::kDevice) + ledger.total(MemoryPlace::kPinnedHost), s.shard_bytes + s.slot_bytes);
  bool root_in_place = false, root_slot = false;
  for (const LedgerLine& l : ledger.lines()) {
    if (l.name == "root unit shards (read in place)") {
      root_in_place = true;
      EXPECT_EQ(l.place, MemoryPlace::kDevice) << ledger.describe();
    }
    root_slot = root_slot || l.name == "gathered slots (float) (root)";
  }
  EXPECT_EQ(root_in_place, alone) << ledger.describe();
  EXPECT_EQ(root_slot, !alone) << ledger.describe();
  if (test_device() == Device::kCuda) {
    EXPECT_GT(ledger.total(MemoryPlace::kPinnedHost), 0u) << "the layers' shards are still offloaded";
  }
  for (int u : {3, 0}) {  // the root, then a layer: every gathered tensor is the original
    mgr->gather(u);
    mgr->compute_stream().synchronize();  // the host reads the views below (the layer's h2d copy)
    for (int k = 0; k < kNumBufferKinds; ++k)
      for (const auto& [name, t] : m.units[u][k])
        EXPECT_TRUE(same_bytes(mgr->view(u, static_cast<BufferKind>(k), name), t)) << u << " " << name;
    mgr->release(u);
  }
}

TEST_F(Sharded, StateTransitionsAreAsserted) {
  auto mgr = build(*comm_, make_model(), false);
  EXPECT_THROW(mgr->view(0, BufferKind::kFrozenFloat, "input_layernorm.weight"), Error);  // SHARDED
  EXPECT_THROW(mgr->release(0), Error);
  mgr->prefetch(0);
  mgr->prefetch(1);
  EXPECT_THROW(mgr->prefetch(2), Error);  // both slots in use
  EXPECT_EQ(mgr->state(1), UnitState::kGathering);
  mgr->gather(0);
  mgr->gather(1);
  EXPECT_THROW(mgr->view(0, BufferKind::kFrozenFloat, "nope"), Error);
  mgr->release(0);
  mgr->release(1);
  EXPECT_THROW(mgr->release(1), Error);
}

// Each rank writes gradients k * (rank + 1) (integer-valued floats, so every sum is exact); the
// averaged shard must equal the serial computation, and accumulate must add.
TEST_F(Sharded, ReduceScatterOfGradientsIsTheAverage) {
  auto mgr = build(*comm_, make_model(), false);
  const int world = comm_->size(), rank = comm_->rank();
  for (int u = 0; u < 3; ++u) {
    for (bool accumulate : {false, true}) {
      mgr->gather(u);
      mgr->compute_stream().synchronize();  // gather() zeroes the gradients on the compute stream
      const FlatLayout& l = mgr->layout(u, BufferKind::kTrainable);
      for (const auto& e : l.entries()) {
        Tensor g = mgr->grad(u, e.name);
        std::vector<float> v(static_cast<size_t>(g.numel()));
        for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i % 13) * (rank + 1));
        g.copy_from(Tensor::from_f32(g.shape(), DType::kF32, v));
      }
      mgr->reduce_scatter_grads(u, accumulate);
      mgr->release(u);
      mgr->wait_for_gradients();
      mgr->compute_stream().synchronize();
      // Serial reference for this rank's slice of the flat gradient buffer.
      const int64_t shard_elems = l.shard_bytes() / 4;
      std::vector<float> flat(static_cast<size_t>(l.padded_bytes() / 4), 0.0f);
      for (const auto& e : l.entries())
        for (int64_t i = 0; i < e.nbytes / 4; ++i) {
          float s = 0;
          for (int r = 0; r < world; ++r) s += static_cast<float>((i % 13) * (r + 1));
          flat[e.offset / 4 + i] = s / static_cast<float>(world);
        }
      // EXPECT, not ASSERT: a rank must not skip the next unit's collectives (see gtest_mpi_main).
      const auto got = mgr->grad_shard(u).to(Device::kCpu).to_f32_vector();
      EXPECT_EQ(static_cast<int64_t>(got.size()), shard_elems);
      int64_t wrong = 0, first = -1;
      for (int64_t i = 0; i < std::min<int64_t>(shard_elems, got.size()); ++i)
        if (got[i] != (accumulate ? 2.0f : 1.0f) * flat[rank * shard_elems + i] && wrong++ == 0) first = i;
      EXPECT_EQ(wrong, 0) << "unit " << u << ", first wrong element " << first;
    }
  }
}

TEST_F(Sharded, MasterShardIsThisRanksSlice) {
  const FullModel m = make_model();
  auto mgr = build(*comm_, m, true);
  const FlatLayout& l = mgr->layout(1, BufferKind::kTrainable);
  std::vector<Tensor> full;
  for (const auto& [n, t] : m.units[1][2]) full.push_back(t);
  const Tensor flat = l.pack(full);
  const Tensor mine = mgr->master_shard(1).to(Device::kCpu);
  EXPECT_EQ(mine.nbytes(), static_cast<size_t>(l.shard_bytes()));
  EXPECT_EQ(std::memcmp(mine.raw(), static_cast<const uint8_t*>(flat.raw()) + comm_->rank() * l.shard_bytes(),
                        mine.nbytes()),
            0);
}

// The post-gather transform: with trainable_compute_dtype bf16 every gather also writes the
// LoRA weights' bf16 compute copy (round to nearest even of the gathered f32 values).
TEST_F(Sharded, GatherWritesTheBf16ComputeCopyOfTrainables) {
  const FullModel m = make_model();
  ShardOptions o;
  o.compute_device = test_device();
  o.trainable_compute_dtype = DType::kBF16;
  ShardedParameterManager mgr(*comm_, qshard_test_compute_stream(), o);
  for (size_t u = 0; u < m.units.size(); ++u) {
    const int id = mgr.add_unit(u < 3 ? "layers." + std::to_string(u) : "root", u == 3);
    for (int k = 0; k < kNumBufferKinds; ++k)
      for (const auto& [name, t] : m.units[u][k]) mgr.add_tensor(id, static_cast<BufferKind>(k), name, t);
  }
  mgr.finalize();
  size_t checked = 0;
  for (int u = 0; u < mgr.num_units(); ++u) {
    mgr.gather(u);
    mgr.compute_stream().synchronize();
    for (const auto& [name, t] : m.units[u][static_cast<int>(BufferKind::kTrainable)]) {
      const Tensor c = mgr.compute_view(u, name).to(Device::kCpu);
      ASSERT_EQ(c.dtype(), DType::kBF16);
      ASSERT_EQ(c.shape(), t.shape());
      const std::vector<float> want = t.to_f32_vector();
      for (int64_t i = 0; i < c.numel(); ++i)
        ASSERT_EQ(c.data<uint16_t>()[i], f32_to_bf16(want[i])) << name << "[" << i << "]";
      ++checked;
    }
    mgr.release(u);
  }
  EXPECT_EQ(checked, 12u);  // 3 layers x 2 projections x (A, B)
  EXPECT_LE(mgr.memory().slot_bytes, mgr.memory().slot_bytes_bound);
  // Without a compute dtype there is no copy to view.
  auto plain = build(*comm_, m, false);
  plain->gather(0);
  EXPECT_THROW(plain->compute_view(0, "q_proj.lora_A.weight"), Error);
  plain->release(0);
}

TEST(Accumulate, ConvertCudaMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Tensor a = randn({100003}, DType::kF32, 3);
  Tensor ref = Tensor::zeros({100003}, DType::kBF16), dev = Tensor::zeros({100003}, DType::kBF16, Device::kCuda);
  convert_f32(ref, a, nullptr);
  Tensor da = a.to(Device::kCuda);
  convert_f32(dev, da, nullptr);
  EXPECT_TRUE(bitwise_equal(ref, dev.to(Device::kCpu)));
}

TEST(Accumulate, CudaMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  Tensor a = randn({100003}, DType::kF32, 1), b = randn({100003}, DType::kF32, 2);
  Tensor ref = a.clone();
  accumulate_f32(ref, b, nullptr);
  Tensor da = a.to(Device::kCuda), db = b.to(Device::kCuda);
  accumulate_f32(da, db, nullptr);
  const auto x = ref.to_f32_vector(), y = da.to(Device::kCpu).to_f32_vector();
  std::printf("accumulate: cpu %g gpu %g (tolerance 0)\n", x[7], y[7]);
  EXPECT_EQ(x, y);
}

}  // namespace
}  // namespace qshard
