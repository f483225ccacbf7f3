// memory_ledger.h: where every byte of a job's device and pinned host memory goes.
//
// What: a list of lines (name, bytes, place), added by the parts that own the memory, each from
// the sizes it allocated (not estimates): the sharded-parameter manager (base shards, root unit,
// gathered slots, LoRA masters, gradients, compute copies, staging), the optimizer state, the
// model's buffer plan (model/llama_buffers.h: activations, kept layers, workspace, the attention
// library's estimated workspace) and the runtime's own memory measured before the build (the CUDA
// context and libraries). measured(): the device memory in use (cudaMemGetInfo) when the ledger
// was closed; the difference to the device lines is printed as "unaccounted" (allocator rounding,
// library allocations nobody reported) so the ledger is honest about what it does not know.
// Sizes are the requested bytes of each allocation; pools round them (runtime/allocator.h).
// Thread safety: none (made once at start-up).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace qshard {

enum class MemoryPlace { kDevice, kPinnedHost };
const char* memory_place_name(MemoryPlace p);

struct LedgerLine {
  std::string name;
  uint64_t bytes = 0;
  MemoryPlace place = MemoryPlace::kDevice;
};

class MemoryLedger {
 public:
  // device_label: how describe() names the compute device's memory ("GPU", or "host" for the CPU
  // backend, whose "device" memory is host memory).
  explicit MemoryLedger(std::string device_label = "GPU") : device_label_(std::move(device_label)) {}
  // Lines of 0 bytes are kept out; a name added twice at one place adds up.
  void add(const std::string& name, uint64_t bytes, MemoryPlace place);
  const std::vector<LedgerLine>& lines() const { return lines_; }
  uint64_t total(MemoryPlace place) const;
  // The device memory in use measured when the ledger was closed (none on the CPU backend).
  void set_measured(std::optional<uint64_t> device_in_use) { measured_ = device_in_use; }
  std::optional<uint64_t> measured() const { return measured_; }
  // measured - total(kDevice) (negative: the ledger counts more than is in use).
  std::optional<int64_t> unaccounted() const;
  // "GPU 7.1 GB = base shards (4-bit) 3.6 GB + ...; measured in use 7.3 GB (0.2 GB unaccounted)",
  // then "; pinned host ..." when there is any.
  std::string describe() const;
  // {"device": [{"name", "bytes"}...], "pinned_host": [...], "device_total", "pinned_host_total",
  //  "measured_device_in_use", "unaccounted"}.
  nlohmann::json to_json() const;

 private:
  std::vector<LedgerLine> lines_;
  std::optional<uint64_t> measured_;
  std::string device_label_;
};

}  // namespace qshard
