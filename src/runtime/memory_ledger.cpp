#include "runtime/memory_ledger.h"

#include <fmt/format.h>

#include "runtime/machine.h"

namespace qshard {

const char* memory_place_name(MemoryPlace p) { return p == MemoryPlace::kDevice ? "device" : "pinned host"; }

void MemoryLedger::add(const std::string& name, uint64_t bytes, MemoryPlace place) {
  if (bytes == 0) return;
  for (LedgerLine& l : lines_)
    if (l.name == name && l.place == place) {
      l.bytes += bytes;
      return;
    }
  lines_.push_back({name, bytes, place});
}

uint64_t MemoryLedger::total(MemoryPlace place) const {
  uint64_t t = 0;
  for (const LedgerLine& l : lines_)
    if (l.place == place) t += l.bytes;
  return t;
}

std::optional<int64_t> MemoryLedger::unaccounted() const {
  if (!measured_) return std::nullopt;
  return static_cast<int64_t>(*measured_) - static_cast<int64_t>(total(MemoryPlace::kDevice));
}

std::string MemoryLedger::describe() const {
  std::string s;
  for (MemoryPlace p : {MemoryPlace::kDevice, MemoryPlace::kPinnedHost}) {
    std::string parts;
    for (const LedgerLine& l : lines_)
      if (l.place == p) parts += fmt::format("{}{} {}", parts.empty() ? "" : " + ", l.name, human_bytes(l.bytes));
    if (parts.empty() && !(p == MemoryPlace::kDevice && measured_)) continue;
    if (!s.empty()) s += "; ";
    s += fmt::format("{} {} = {}", p == MemoryPlace::kDevice ? device_label_ : memory_place_name(p), human_bytes(total(p)),
                     parts.empty() ? "nothing" : parts);
    if (p == MemoryPlace::kDevice && measured_) {
      const int64_t u = *unaccounted();
      s += fmt::format("; measured in use {} ({}{} unaccounted)", human_bytes(*measured_), u < 0 ? "-" : "",
                       human_bytes(static_cast<double>(u < 0 ? -u : u)));
    }
  }
  return s.empty() ? "nothing allocated" : s;
}

nlohmann::json MemoryLedger::to_json() const {
  nlohmann::json j;
  j["device"] = nlohmann::json::array();
  j["pinned_host"] = nlohmann::json::array();
  for (const LedgerLine& l : lines_)
    j[l.place == MemoryPlace::kDevice ? "device" : "pinned_host"].push_back({{"name", l.name}, {"bytes", l.bytes}});
  j["device_total"] = total(MemoryPlace::kDevice);
  j["pinned_host_total"] = total(MemoryPlace::kPinnedHost);
  if (measured_) {
    j["measured_device_in_use"] = *measured_;
    j["unaccounted"] = *unaccounted();
  }
  return j;
}

}  // namespace qshard
