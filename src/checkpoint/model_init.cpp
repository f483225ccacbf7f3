#include "checkpoint/model_init.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>
#include <functional>
#include <random>
#include <string>

#include "checkpoint/random_llama.h"
#include "quant/random_4bit.h"
#include "runtime/parallel.h"

namespace qshard {
namespace {

// A tensor's stream key: seed mixed with an FNV-1a hash of the name (as random_normal), so the
// values do not depend on visiting order, rank or world size.
uint64_t name_key(uint64_t seed, const std::string& fqn) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : fqn) h = (h ^ c) * 1099511628211ull;
  return h;
}

// LoRA A's generator per tensor.
std::mt19937_64 rng_for(uint64_t seed, const std::string& fqn) { return std::mt19937_64(name_key(seed, fqn)); }

double uniform01(std::mt19937_64& g) { return (static_cast<double>(g() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

void visit(Module& m, const std::string& prefix, const std::function<void(Module::Slot&, const std::string&)>& f) {
  for (const auto& s : m.slots()) f(const_cast<Module::Slot&>(s), prefix + s.name);
  for (const auto& [name, child] : m.children()) visit(*child, prefix + name + ".", f);
}

}  // namespace

void init_random_base(Module& root, uint64_t seed, double init_std, bool draw_4bit, Device draw_on) {
  // Every tensor has its own generator (random_normal, random_4bit), so tensors are filled in
  // parallel and the values do not depend on the thread count, the order or the device. The large
  // float tensors (a 70B's embedding and LM head, 1e9 values each, on random_normal's counter-based
  // path) first, each split over every core; with draw_4bit the projections as one batch on
  // `draw_on`; the rest one tensor per thread, largest first.
  const int threads = host_threads(32);
  std::vector<std::pair<Module::Slot*, std::string>> large, todo;
  std::vector<Random4bitJob> drawn;
  visit(root, "", [&](Module::Slot& s, const std::string& fqn) {
    if (s.trainable) return;
    if (draw_4bit && s.kind == Module::SlotKind::kParams4bit) {
      const QuantState& st = s.params4bit->quant_state;
      drawn.push_back({st.shape, st.dtype, {st.quant_type, st.blocksize, st.nested()}, init_std, name_key(seed, fqn),
                       s.params4bit.get()});
      return;
    }
    const bool split = s.kind != Module::SlotKind::kParams4bit && s.tensor.numel() > kFastNormalElements &&
                       fqn.find("norm.weight") == std::string::npos;
    (split ? large : todo).emplace_back(&s, fqn);
  });
  for (auto& [s, fqn] : large) random_normal_into(s->tensor, seed, fqn, init_std, threads);
  std::stable_sort(drawn.begin(), drawn.end(),
                   [](const Random4bitJob& a, const Random4bitJob& b) { return shape_numel(a.shape) > shape_numel(b.shape); });
  random_4bit_to_host(drawn, draw_on, draw_on == Device::kCpu ? threads : host_threads(8));
  auto numel = [](const Module::Slot* s) {
    return s->kind == Module::SlotKind::kParams4bit ? s->params4bit->quant_state.numel() : s->tensor.numel();
  };
  std::stable_sort(todo.begin(), todo.end(), [&](const auto& a, const auto& b) { return numel(a.first) > numel(b.first); });
  auto fill = [&](Module::Slot& s, const std::string& fqn) {
    if (s.kind == Module::SlotKind::kParams4bit) {  // quantized from a normal draw
      const QuantState& st = s.params4bit->quant_state;
      const Tensor w = Tensor::from_f32(st.shape, st.dtype, random_normal(seed, fqn, st.numel(), init_std));
      *s.params4bit = quantize_4bit(w, {st.quant_type, st.blocksize, st.nested()});
      return;
    }
    if (fqn.find("norm.weight") != std::string::npos) {
      s.tensor.copy_from(Tensor::from_f32(s.tensor.shape(), s.tensor.dtype(),
                                          std::vector<float>(static_cast<size_t>(s.tensor.numel()), 1.0f)));
      return;
    }
    random_normal_into(s.tensor, seed, fqn, init_std);
  };
  parallel_for(todo.size(), threads, [&](size_t i) { fill(*todo[i].first, todo[i].second); });
}

void init_lora(Module& root, uint64_t seed) {
  visit(root, "", [&](Module::Slot& s, const std::string& fqn) {
    if (!s.trainable) return;
    std::vector<float> v(static_cast<size_t>(s.tensor.numel()), 0.0f);
    if (fqn.find(".lora_A.") != std::string::npos) {
      auto g = rng_for(seed, fqn);
      const double bound = 1.0 / std::sqrt(static_cast<double>(s.tensor.shape().back()));
      for (auto& x : v) x = static_cast<float>((2.0 * uniform01(g) - 1.0) * bound);
    }
    s.tensor.copy_from(Tensor::from_f32(s.tensor.shape(), s.tensor.dtype(), v));
  });
}

}  // namespace qshard
