#include "checkpoint/export.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <thread>
#include <map>
#include <set>

#include "checkpoint/bnb_folder.h"
#include "checkpoint/fused_projections.h"
#include "checkpoint/peft_adapter.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_index.h"
#include "quant/blockwise.h"
#include "runtime/collective_status.h"
#include "runtime/input_file.h"
#include "runtime/log.h"

namespace qshard {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPeftPrefix = "base_model.model.";
constexpr const char* kAdapterFile = "adapter_model.safetensors";
// The adapter_config.json field set and fixed values of PEFT 0.21.2 (tests/data/model/nf4_adapter,
// written by real PEFT); peft_version names the version whose format this is.
constexpr const char* kPeftVersion = "0.21.2";

// One tensor of the output: where it comes from and how it is produced on rank 0. A fused Phi-3
// output (checkpoint/fused_projections.h) comes from its parts' tensors:
//   kFuse4bit   one entry of the fused weight's bitsandbytes state dict (fuse_params4bit of the parts)
//   kFuseRows   the parts' float tensors stacked by rows (an unquantized tree's bnb4 export)
//   kFuseMerge  the parts' merged bf16 weights (kMerge / kCastBf16 each) stacked by rows
//   kFuseLoraA  the parts' lora_A stacked: [n r, C]
//   kFuseLoraB  the parts' lora_B block-diagonal: [rows, n r]
enum class Op { kCopy, kCastBf16, kMerge, kFuse4bit, kFuseRows, kFuseMerge, kFuseLoraA, kFuseLoraB };
struct OutTensor {
  std::string name;    // key in the output file
  std::string source;  // FQN in the tree (kMerge: the projection's weight; fused: part 0's)
  DType dtype;
  Shape shape;
  int unit = 0;        // FSDP unit that holds the source
  Op op = Op::kCopy;
  std::vector<std::string> parts;  // fused: the parts' sources, in row order
  std::string fused_weight;        // kFuse4bit: the fused weight's key (its state dict holds `name`)
  uint64_t nbytes() const { return static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype); }
};

struct Layout {
  std::vector<OutTensor> tensors;
  std::vector<std::string> files;
  std::vector<size_t> file_of;  // per tensor
};

int unit_of(const ShardedTree& units, const std::string& fqn) {
  int root = -1;
  for (size_t u = 0; u < units.unit_paths.size(); ++u) {
    const std::string& p = units.unit_paths[u];
    if (p.empty()) root = static_cast<int>(u);
    else if (fqn.size() > p.size() && fqn.compare(0, p.size(), p) == 0 && fqn[p.size()] == '.') return static_cast<int>(u);
  }
  QS_CHECK(root >= 0, "sharded tree has no root unit");
  return root;
}

std::string module_short_name(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

// Validates the LoRA slots against the options (every rank, before any collective). The options'
// targets are PEFT's names for the family (Phi-3: qkv_proj for the tree's q/k/v_proj, ...).
void check_lora(const Module& tree, const LlamaConfig& config, const ExportOptions& o, const std::string& label) {
  const std::vector<std::string> targets = tree_lora_targets(config, o.target_modules, label + ": options.target_modules");
  size_t n = 0;
  for (const auto& [key, t] : state_dict(tree, {true, false, true})) {
    const size_t at = key.find(".lora_A.weight");
    if (at == std::string::npos) continue;
    ++n;
    if (t.dim(0) != o.r)
      throw InputError(label + ": options.r is " + std::to_string(o.r) + " but '" + key + "' has rank " + std::to_string(t.dim(0)));
    const std::string name = module_short_name(key.substr(0, at));
    if (std::find(targets.begin(), targets.end(), name) == targets.end())
      throw InputError(label + ": '" + key + "' adapts module '" + name + "', which options.target_modules does not list");
  }
  if (n == 0 && o.format == ExportFormat::kPeft) throw InputError(label + ": the model has no LoRA adapters to export");
}

// The outputs of a fused Phi-3 module for the tree key `key` of its first part (`part`): their
// names, dtypes and shapes from the tree's slots and QuantStates, without gathering. Empty for the
// keys that an output listed here already covers (part 0's 4-bit statistics, its merged weight's).
std::vector<OutTensor> fused_outputs(const Module& tree, const std::string& key, const FusedPartRef& part,
                                     const ExportOptions& o, int unit) {
  const FusedProjection& f = *part.proj;
  const std::string layer = part.fused_path.substr(0, part.fused_path.size() - f.fused.size());
  std::vector<std::string> sources;
  for (const std::string& p : f.parts) sources.push_back(layer + p + part.rest);
  const Resolved r = resolve(tree, key);
  OutTensor out{part.fused_path + part.rest, key, r.tensor.dtype(), {}, unit, Op::kCopy, sources, {}};
  if (o.format == ExportFormat::kPeft) {
    const int64_t n = static_cast<int64_t>(f.parts.size()), rank = part.rest == ".lora_A.weight" ? r.tensor.dim(0) : r.tensor.dim(1);
    out.name = kPeftPrefix + out.name;
    out.dtype = DType::kF32;
    out.op = part.rest == ".lora_A.weight" ? Op::kFuseLoraA : Op::kFuseLoraB;
    out.shape = out.op == Op::kFuseLoraA ? Shape{n * rank, r.tensor.dim(1)} : Shape{f.total_rows(), n * rank};
    return {out};
  }
  if (part.rest != ".weight") return {};  // 4-bit statistics: with the weight; biases: Phi-3 has none
  if (r.kind == NodeKind::kParams4bit && o.format == ExportFormat::kBnb4) {
    // The fused weight's state dict, planned from the parts' scalars (meta tensors, no bytes).
    std::vector<const QuantState*> states;
    for (const std::string& s : sources) states.push_back(&resolve(tree, s).params4bit->quant_state);
    Params4bit meta;
    meta.quant_state = fused_quant_state_scalars(states, "export of '" + part.fused_path + ".weight'");
    QuantState& st = meta.quant_state;
    const int64_t n = st.numel(), nb = st.num_blocks();
    meta.data = Tensor::meta({(n + 1) / 2, 1}, DType::kU8);
    st.absmax = Tensor::meta({nb}, st.nested() ? DType::kU8 : DType::kF32);
    st.code = Tensor::meta({16}, DType::kF32);
    if (st.nested()) {
      st.state2->absmax = Tensor::meta({(nb + st.state2->blocksize - 1) / st.state2->blocksize}, DType::kF32);
      st.state2->code = Tensor::meta({256}, DType::kF32);
    }
    std::vector<OutTensor> outs;
    for (const auto& [name, t] : params4bit_state_dict(meta, out.name)) {
      OutTensor e = out;
      e.name = name;
      e.dtype = t.dtype();
      e.shape = t.shape();
      e.op = Op::kFuse4bit;
      e.fused_weight = out.name;
      outs.push_back(std::move(e));
    }
    return outs;
  }
  const int64_t cols = r.kind == NodeKind::kParams4bit ? r.params4bit->quant_state.shape[1] : r.tensor.dim(1);
  out.shape = {f.total_rows(), cols};
  if (o.format == ExportFormat::kMerged) {
    out.op = Op::kFuseMerge;
    out.dtype = DType::kBF16;
  } else {
    out.op = Op::kFuseRows;
  }
  return {out};
}

Layout plan_layout(const Module& tree, const LlamaConfig& config, const ShardedTree& units, const ExportOptions& o) {
  Layout L;
  std::vector<std::pair<std::string, uint64_t>> groups;  // shard planning: a weight with its statistics
  std::vector<size_t> group_of;
  std::set<std::string> trainable;
  for (const auto& [k, t] : state_dict(tree, {true, false, true})) trainable.insert(k);
  const std::vector<FusedProjection> fused = fused_projections(config);
  for (const auto& [key, t] : state_dict(tree)) {
    const bool is_lora = trainable.count(key) > 0;
    if ((o.format == ExportFormat::kPeft) != is_lora) continue;
    if (const auto part = fused_part_of(fused, key)) {
      // Phi-3: the parts' tensors leave as the fused module's, in part 0's place.
      if (part->index != 0) continue;
      bool first = true;
      for (OutTensor& out : fused_outputs(tree, key, *part, o, unit_of(units, key))) {
        if (first || groups.empty()) groups.emplace_back(out.name, 0);
        first = false;
        groups.back().second += out.nbytes();
        group_of.push_back(groups.size() - 1);
        L.tensors.push_back(std::move(out));
      }
      continue;
    }
    const Resolved r = resolve(tree, key);
    OutTensor out{key, key, t.dtype(), t.shape(), unit_of(units, key), Op::kCopy, {}, {}};
    bool new_group = true;
    if (o.format == ExportFormat::kPeft) {
      out.name = kPeftPrefix + key;
      out.dtype = DType::kF32;
    } else if (o.format == ExportFormat::kBnb4) {
      new_group = r.kind != NodeKind::kTensor;  // statistics stay with their weight
    } else {                                    // kMerged: weights only, as bf16
      if (r.kind == NodeKind::kParams4bit) {
        out.op = Op::kMerge;
        out.shape = r.params4bit->quant_state.shape;
      } else if (r.kind == NodeKind::kParameter || r.kind == NodeKind::kBuffer) {
        out.op = dtype_is_float(t.dtype()) ? Op::kCastBf16 : Op::kCopy;
        if (out.op == Op::kCastBf16 && try_resolve(tree, key.substr(0, key.rfind('.')) + ".lora_A.weight"))
          out.op = Op::kMerge;  // an unquantized projection with LoRA
      } else {
        continue;  // 4-bit statistics
      }
      if (out.op != Op::kCopy) out.dtype = DType::kBF16;
    }
    if (new_group || groups.empty()) groups.emplace_back(out.name, 0);
    groups.back().second += out.nbytes();
    group_of.push_back(groups.size() - 1);
    L.tensors.push_back(std::move(out));
  }
  if (o.format == ExportFormat::kPeft) {
    L.files = {kAdapterFile};
    L.file_of.assign(L.tensors.size(), 0);
  } else {
    const ShardPlan plan = plan_shards(groups, o.max_shard_bytes);
    L.files = plan.files;
    for (size_t g : group_of) L.file_of.push_back(plan.file_of_tensor[g]);
  }
  return L;
}

// The last fused 4-bit weight produced (its state dict's entries are written one after another).
struct FuseCache {
  std::string key;
  NamedTensors entries;
};

Tensor produce(const Module& tree, const OutTensor& t, const ExportOptions& o, FuseCache& cache);

// A fused Phi-3 output from its parts (unit gathered, rank 0).
Tensor produce_fused(const Module& tree, const OutTensor& t, const ExportOptions& o, FuseCache& cache) {
  switch (t.op) {
    case Op::kFuse4bit: {
      if (cache.key != t.fused_weight) {
        std::vector<Params4bit> parts;
        for (const std::string& s : t.parts) parts.push_back(resolve(tree, s).params4bit->to(Device::kCpu));
        cache.entries = params4bit_state_dict(fuse_params4bit(parts, "export of '" + t.fused_weight + "'"), t.fused_weight);
        cache.key = t.fused_weight;
      }
      for (const auto& [name, tensor] : cache.entries)
        if (name == t.name) return tensor;
      throw Error("export: the fused 4-bit weight " + t.fused_weight + " has no entry " + t.name);
    }
    case Op::kFuseRows:
    case Op::kFuseMerge: {
      std::vector<Tensor> rows;
      for (const std::string& s : t.parts) {
        const Resolved r = resolve(tree, s);
        if (t.op == Op::kFuseRows) {
          rows.push_back(r.tensor.to(Device::kCpu));
          continue;
        }
        // Each part as kMerged would write it on its own: 4-bit or with LoRA merged, else cast.
        const bool merge = r.kind == NodeKind::kParams4bit || try_resolve(tree, s.substr(0, s.rfind('.')) + ".lora_A.weight");
        const Shape shape = r.kind == NodeKind::kParams4bit ? r.params4bit->quant_state.shape : r.tensor.shape();
        const OutTensor pt{s, s, DType::kBF16, shape, t.unit, merge ? Op::kMerge : Op::kCastBf16, {}, {}};
        rows.push_back(produce(tree, pt, o, cache));
      }
      Tensor out = concat_rows(rows);
      if (out.dtype() != t.dtype) out = Tensor::from_f32(out.shape(), t.dtype, out.to_f32_vector());
      return out;
    }
    case Op::kFuseLoraA:
    case Op::kFuseLoraB: {
      std::vector<Tensor> parts;
      for (const std::string& s : t.parts) {
        const Tensor h = resolve(tree, s).tensor.to(Device::kCpu);
        parts.push_back(h.dtype() == DType::kF32 ? h : Tensor::from_f32(h.shape(), DType::kF32, h.to_f32_vector()));
      }
      if (t.op == Op::kFuseLoraA) return concat_rows(parts);
      // Block-diagonal: part i's rows read columns [i r, (i + 1) r) and zeros elsewhere.
      Tensor out = Tensor::zeros(t.shape, DType::kF32);
      float* dst = out.data<float>();
      const int64_t R = t.shape[1];
      int64_t row0 = 0, col0 = 0;
      for (const Tensor& b : parts) {
        const float* src = b.data<float>();
        for (int64_t i = 0; i < b.dim(0); ++i)
          for (int64_t k = 0; k < b.dim(1); ++k) dst[(row0 + i) * R + col0 + k] = src[i * b.dim(1) + k];
        row0 += b.dim(0);
        col0 += b.dim(1);
      }
      return out;
    }
    default:
      throw Error("export: " + t.name + " is not a fused output");
  }
}

// Rank 0, unit gathered: the output tensor in host memory.
Tensor produce(const Module& tree, const OutTensor& t, const ExportOptions& o, FuseCache& cache) {
  if (!t.parts.empty()) return produce_fused(tree, t, o, cache);
  const Resolved r = resolve(tree, t.source);
  if (t.op == Op::kCopy) {
    // Already on the host (CPU backend, or an offloaded shard's gathered view): written from the
    // gathered buffer itself before the unit is released, no copy.
    if (r.tensor.device() == Device::kCpu && r.tensor.dtype() == t.dtype) return r.tensor;
    Tensor host = r.tensor.to(Device::kCpu);
    if (host.dtype() == t.dtype) return host;
    return Tensor::from_f32(host.shape(), t.dtype, host.to_f32_vector());
  }
  if (t.op == Op::kCastBf16) {
    if (r.tensor.dtype() == DType::kBF16)  // no f32 round trip; on the host, no copy either
      return r.tensor.device() == Device::kCpu ? r.tensor : r.tensor.to(Device::kCpu);
    return Tensor::from_f32(t.shape, DType::kBF16, r.tensor.to(Device::kCpu).to_f32_vector());
  }
  // kMerge: W (f32) + scaling * B @ A, rounded once to bf16. Rows are split over threads; each
  // element's arithmetic is the same as a serial loop (dequantize, round to W's original dtype,
  // sum B[i,k] * A[k,j] over k = 0..r-1 in order, scale, add, round to bf16), so the bits do not
  // depend on the thread count.
  const int64_t out = t.shape[0], in = t.shape[1];
  const std::string path = t.source.substr(0, t.source.rfind('.'));
  const auto a = try_resolve(tree, path + ".lora_A.weight");
  const auto b = try_resolve(tree, path + ".lora_B.weight");
  std::vector<float> A, B;
  int64_t rank = 0;
  float scaling = 0.0f;
  if (a && b) {
    A = a->tensor.to(Device::kCpu).to_f32_vector();  // [r, in]
    B = b->tensor.to(Device::kCpu).to_f32_vector();  // [out, r]
    rank = a->tensor.dim(0);
    scaling = static_cast<float>(o.use_rslora ? o.lora_alpha / std::sqrt(static_cast<double>(rank))
                                              : o.lora_alpha / static_cast<double>(rank));
  }
  Params4bit p4;  // host copies of the gathered views (cpu_offload)
  Dequant4bitArgs args;
  DType w_dtype = DType::kF32;
  Tensor w_float;  // an unquantized projection, on the host
  if (r.kind == NodeKind::kParams4bit) {
    p4 = r.params4bit->to(Device::kCpu);
    p4.quant_state.validate("export " + t.name);
    QS_CHECK(p4.quant_state.numel() == out * in, "4-bit weight " + t.source + " does not have the export's shape");
    args = dequant_args(p4);
    // In the original dtype first, as bitsandbytes' forward and PEFT's merge see the weight.
    w_dtype = p4.quant_state.dtype;
  } else {
    w_float = r.tensor.to(Device::kCpu);
    QS_CHECK(w_float.numel() == out * in, "weight " + t.source + " does not have the export's shape");
  }
  Tensor result = Tensor::empty(t.shape, DType::kBF16);
  uint16_t* dst = result.data<uint16_t>();
  // Plain f32 absmax of every block (nested statistics decoded once).
  std::vector<float> absmax_f32;
  const float* absmax = args.absmax;
  if (r.kind == NodeKind::kParams4bit && args.absmax_q8) {
    const int64_t nblocks = (args.n + args.blocksize - 1) / args.blocksize;
    absmax_f32.resize(static_cast<size_t>(nblocks));
    cpu::decode_nested_absmax(args.absmax_q8, args.nested_absmax, args.nested_code, nblocks, args.nested_blocksize,
                              args.offset, absmax_f32.data());
    absmax = absmax_f32.data();
  }
  auto round_to = [](float x, DType dt) {
    if (dt == DType::kBF16) return bf16_to_f32(f32_to_bf16(x));
    if (dt == DType::kF16) return f16_to_f32(f32_to_f16(x));
    return x;
  };
  auto rows = [&](int64_t first, int64_t last) {
    std::vector<float> w(static_cast<size_t>(in)), acc(static_cast<size_t>(in)), blk;
    for (int64_t i = first; i < last; ++i) {
      if (r.kind == NodeKind::kParams4bit) {
        // Row i is elements [i * in, (i + 1) * in) of the flat weight: dequantize the 4-bit blocks
        // covering it (whole blocks; a block starts at an even element, so nibble order holds).
        const int64_t e0 = i * in, bs = args.blocksize;
        const int64_t b0 = e0 / bs, b1 = (e0 + in + bs - 1) / bs;
        const int64_t first_el = b0 * bs, len = std::min(b1 * bs, args.n) - first_el;
        float* wp = w.data();
        if (first_el != e0 || len != in) {
          blk.resize(static_cast<size_t>(len));
          wp = blk.data();
        }
        cpu::dequantize_4bit_blocks(args.packed + first_el / 2, absmax + b0, args.code, len, bs, wp);
        const float* src = wp + (e0 - first_el);
        for (int64_t j = 0; j < in; ++j) w[j] = round_to(src[j], w_dtype);
      } else {
        const Tensor row = w_float.flat_slice(i * in, in);
        const std::vector<float> v = row.to_f32_vector();
        std::copy(v.begin(), v.end(), w.begin());
      }
      if (rank > 0) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t k = 0; k < rank; ++k) {
          const float bk = B[i * rank + k];
          const float* ak = A.data() + k * in;
          for (int64_t j = 0; j < in; ++j) acc[j] += bk * ak[j];
        }
        for (int64_t j = 0; j < in; ++j) w[j] += scaling * acc[j];
      }
      for (int64_t j = 0; j < in; ++j) dst[i * in + j] = f32_to_bf16(w[j]);
    }
  };
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 16);
  const int64_t per = (out + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (int64_t first = per; first < out; first += per) pool.emplace_back(rows, first, std::min(out, first + per));
  rows(0, std::min(out, per));
  for (auto& th : pool) th.join();
  return result;
}

nlohmann::json peft_config_json(const ExportOptions& o, const LlamaConfig& config) {
  nlohmann::json j;  // sorted keys, as PEFT writes them
  for (const char* k : {"alora_invocation_tokens", "arrow_config", "auto_mapping", "corda_config", "eva_config",
                        "exclude_modules", "kasa_config", "layer_replication", "layers_pattern", "layers_to_transform",
                        "lora_ga_config", "megatron_config", "modules_to_save", "monteclora_config", "revision",
                        "target_parameters", "trainable_token_indices", "use_bdlora", "velora_config"})
    j[k] = nullptr;
  j["alpha_pattern"] = nlohmann::json::object();
  j["rank_pattern"] = nlohmann::json::object();
  // Phi-3: each fused target is one adapter of rank n*r over its n parts (block-diagonal lora_B),
  // with the alpha that keeps PEFT's scaling at alpha / r (rsLoRA: alpha / sqrt(r)).
  auto number = [](double v) {
    return v == std::floor(v) && std::fabs(v) < 1e15 ? nlohmann::json(static_cast<int64_t>(v)) : nlohmann::json(v);
  };
  for (const FusedProjection& f : fused_projections(config)) {
    const std::string name = f.short_name();
    if (std::find(o.target_modules.begin(), o.target_modules.end(), name) == o.target_modules.end()) continue;
    const double n = static_cast<double>(f.parts.size());
    j["rank_pattern"][name] = static_cast<int64_t>(f.parts.size()) * o.r;
    j["alpha_pattern"][name] = number(o.use_rslora ? o.lora_alpha * std::sqrt(n) : o.lora_alpha * n);
  }
  j["loftq_config"] = nlohmann::json::object();
  j["base_model_name_or_path"] = o.base_model_name_or_path.empty() ? nlohmann::json() : nlohmann::json(o.base_model_name_or_path);
  j["bias"] = "none";
  j["ensure_weight_tying"] = false;
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["lora_alpha"] = number(o.lora_alpha);
  j["lora_bias"] = false;
  j["lora_dropout"] = o.lora_dropout;
  j["megatron_core"] = "megatron.core";
  j["peft_type"] = "LORA";
  j["peft_version"] = kPeftVersion;
  j["qalora_group_size"] = 16;
  j["r"] = o.r;
  j["target_modules"] = o.target_modules;
  j["task_type"] = "CAUSAL_LM";
  j["use_dora"] = false;
  j["use_qalora"] = false;
  j["use_rslora"] = o.use_rslora;
  return j;
}

// config.json of a bnb4 or merged export.
//   bnb4, the config read from a 4-bit folder: that config.json as read (quantization_config with
//     its compute dtype and quant storage, dtype, every other field), once the tree's 4-bit weights
//     are checked against its bnb_4bit_quant_type / bnb_4bit_use_double_quant;
//   bnb4 otherwise (a float folder quantized on load, a random base): the config as read plus
//     transformers' default quantization_config for the weights' quant type and double quant
//     (bnb_quantization_config: compute dtype float32); dtype as read, or the embedding's dtype
//     when the config has none;
//   merged: no quantization_config, dtype bfloat16.
nlohmann::json model_config_json(const Module& tree, const LlamaConfig& c, const ExportOptions& o) {
  nlohmann::json j = c.raw;
  auto set_dtype = [&j](DType dt) {
    bool has_dtype = false;
    for (const char* k : {"torch_dtype", "dtype"})
      if (j.contains(k)) {
        j[k] = dtype_torch_name(dt);
        has_dtype = true;
      }
    if (!has_dtype) j["torch_dtype"] = dtype_torch_name(dt);
  };
  if (o.format == ExportFormat::kMerged) {
    j.erase("quantization_config");
    set_dtype(DType::kBF16);
    return j;
  }
  std::vector<std::pair<std::string, const Params4bit*>> weights;
  for (const auto& [k, t] : state_dict(tree))
    if (const auto r = try_resolve(tree, k); r && r->kind == NodeKind::kParams4bit) weights.emplace_back(k, r->params4bit);
  if (weights.empty()) throw InputError(o.out_dir + ": the model has no 4-bit weights; a bnb4 export needs a quantized tree");
  if (c.quantized) {
    const nlohmann::json& q = j["quantization_config"];
    const std::string label = c.source_dir.empty() ? std::string("the model's config") : c.source_dir + "/config.json";
    for (const auto& [k, p] : weights) {
      const QuantState& st = p->quant_state;
      if (q.contains("bnb_4bit_quant_type") && q["bnb_4bit_quant_type"] != quant_type_name(st.quant_type))
        throw InputError(o.out_dir + ": 4-bit weight '" + k + "' is " + quant_type_name(st.quant_type) + " but " + label +
                         " has quantization_config.bnb_4bit_quant_type " + q["bnb_4bit_quant_type"].dump());
      if (q.contains("bnb_4bit_use_double_quant") && q["bnb_4bit_use_double_quant"] != st.nested())
        throw InputError(o.out_dir + ": 4-bit weight '" + k + "' is " + (st.nested() ? "" : "not ") +
                         "double-quantized but " + label + " has quantization_config.bnb_4bit_use_double_quant " +
                         q["bnb_4bit_use_double_quant"].dump());
    }
    return j;
  }
  const QuantState& st = weights.front().second->quant_state;
  j["quantization_config"] = bnb_quantization_config({st.quant_type, st.blocksize, st.nested()});
  if (!j.contains("torch_dtype") && !j.contains("dtype")) {
    const auto e = try_resolve(tree, "model.embed_tokens.weight");
    j["torch_dtype"] = dtype_torch_name(e ? e->tensor.dtype() : DType::kBF16);
  }
  return j;
}

// ---- self-check (rank 0, on the written folder; one tensor at a time) ----

[[noreturn]] void check_fail(const std::string& dir, const std::string& what) {
  throw InputError("export self-check of " + dir + ": " + what);
}

void check_against_tree(const Module& tree, const Layout& L, const SafetensorsFolder& f, const std::string& dir) {
  const std::vector<std::string> names = f.names();
  if (names.size() != L.tensors.size())
    check_fail(dir, std::to_string(names.size()) + " tensors stored, " + std::to_string(L.tensors.size()) + " exported");
  for (const OutTensor& t : L.tensors) {
    const SafetensorsEntry* e = f.find(t.name);
    if (!e) check_fail(dir, "tensor '" + t.name + "' is missing");
    if (!t.parts.empty()) {  // a fused Phi-3 tensor: no tree key of its own; as planned from its parts
      if (e->dtype != t.dtype || e->shape != t.shape)
        check_fail(dir, "tensor '" + t.name + "' is " + e->dtype_name + " " + shape_str(e->shape) + ", planned " +
                            dtype_torch_name(t.dtype) + " " + shape_str(t.shape));
      continue;
    }
    const auto r = try_resolve(tree, t.source);
    if (!r) check_fail(dir, "key '" + t.name + "' does not resolve through the model tree ('" + t.source + "')");
    if (e->dtype != r->tensor.dtype() || e->shape != r->tensor.shape())
      check_fail(dir, "tensor '" + t.name + "' is " + e->dtype_name + " " + shape_str(e->shape) + ", the tree has " +
                          dtype_torch_name(r->tensor.dtype()) + " " + shape_str(r->tensor.shape()));
  }
}

void check_model_folder(const Module* tree, const Layout& L, const std::string& dir, bool quantized) {
  const LlamaConfig c = LlamaConfig::load(dir);
  if (c.quantized != quantized) check_fail(dir, quantized ? "config.json lacks quantization_config" : "config.json has quantization_config");
  const SafetensorsFolder f = SafetensorsFolder::open(dir);
  if (tree) check_against_tree(*tree, L, f, dir);
  // One weight at a time, read in place from the mapping (views, no copies); each weight's mapped
  // pages are dropped once checked, so the check's resident memory stays that of one weight, not
  // of the folder.
  std::vector<std::string> touched;
  const TensorLookup lookup = [&f, &touched](const std::string& k) -> std::optional<Tensor> {
    const SafetensorsEntry* e = f.find(k);
    if (!e) return std::nullopt;
    if (!e->dtype) return f.get(k);  // throws, naming the dtype
    touched.push_back(k);
    const std::span<const uint8_t> b = f.bytes(k);
    return Tensor::adopt(const_cast<uint8_t*>(b.data()), e->shape, *e->dtype, Device::kCpu, [](void*) {});
  };
  auto release_touched = [&] {
    for (const std::string& k : touched) f.release_pages(k);
    touched.clear();
  };
  size_t expected = 0;
  for (const auto& [name, shape] : llama_expected_weights(c)) {
    const SafetensorsEntry* e = f.find(name);
    if (!e) check_fail(dir, "tensor '" + name + "' required by config.json is missing");
    if (quantized && is_llama_projection_weight(name)) {
      const Params4bit p = params4bit_from_state_dict(name, lookup, dir);
      if (p.quant_state.shape != shape)
        check_fail(dir, "4-bit tensor '" + name + "' has shape " + shape_str(p.quant_state.shape) + ", config.json implies " + shape_str(shape));
      expected += 1 + quant_state_key_suffixes(p.quant_state).size();
      release_touched();
      continue;
    }
    ++expected;
    if (e->shape != shape) check_fail(dir, "tensor '" + name + "' has shape " + shape_str(e->shape) + ", config.json implies " + shape_str(shape));
    if (!quantized) {
      if (e->dtype != DType::kBF16) check_fail(dir, "tensor '" + name + "' is " + e->dtype_name + ", expected BF16");
      const std::span<const uint8_t> b = f.bytes(name);
      for (size_t i = 0; i + 1 < b.size(); i += 2)
        if ((b[i + 1] & 0x7f) == 0x7f && (b[i] & 0x80)) check_fail(dir, "tensor '" + name + "' holds a NaN or infinity");
      f.release_pages(name);
    }
  }
  if (f.names().size() != expected)
    check_fail(dir, std::to_string(f.names().size()) + " tensors stored, config.json implies " + std::to_string(expected));
}

void check_peft_folder(const Module& tree, const Layout& L, const std::string& dir, const ExportOptions& o) {
  const PeftLoraConfig c = read_peft_config(dir);
  if (c.r != o.r || c.lora_alpha != o.lora_alpha || c.use_rslora != o.use_rslora || c.target_modules != o.target_modules)
    check_fail(dir, "adapter_config.json differs from the export options (r, lora_alpha, use_rslora or target_modules)");
  const SafetensorsFolder f = SafetensorsFolder::open_file((fs::path(dir) / kAdapterFile).string());
  check_against_tree(tree, L, f, dir);
  for (const OutTensor& t : L.tensors) {
    const bool is_b = t.source.ends_with(".lora_B.weight");
    const std::string module = module_short_name(t.name.substr(0, t.name.size() - std::string(".lora_B.weight").size()));
    if (t.shape[is_b ? 1 : 0] != c.rank_of(module))
      check_fail(dir, "tensor '" + t.name + "' has shape " + shape_str(t.shape) + " for r = " + std::to_string(c.rank_of(module)));
    if (!is_b || o.allow_zero_lora_b) continue;
    const std::span<const uint8_t> b = f.bytes(t.name);
    bool nonzero = false;
    for (size_t i = 0; i + 3 < b.size() && !nonzero; i += 4) {
      float v;
      std::memcpy(&v, b.data() + i, 4);
      nonzero = v != 0.0f;
    }
    if (!nonzero)
      check_fail(dir, "lora_B '" + t.name + "' is all zero: the adapter is untrained or its values were lost "
                      "(set allow_zero_lora_b to export an untrained adapter)");
  }
}

// Rank 0's failure as it travels to the other ranks: its kind ('I' InputError, 'E' anything else)
// then its message, so every rank throws the same kind and the job's exit code does not depend on
// which rank's abort comes first (runtime/failure.h: InputError 2, others 1).
std::string status_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const InputError& x) {
    return std::string("I") + x.what();
  } catch (const std::exception& x) {
    return std::string("E") + x.what();
  } catch (...) {
    return "Eunknown error";
  }
}

// QSHARD_TEST_KILL_DURING_EXPORT=<format>: rank 0 dies (SIGKILL) once `written` of `total` tensors
// of an export of that format are written: a job killed in the middle of its final export. Another
// value than a format's name is an InputError (export_model checks it first): a typo would never
// fire, and the test that set it would pass for the wrong reason.
const char* kill_during_export_for_test() {
  const char* k = std::getenv("QSHARD_TEST_KILL_DURING_EXPORT");
  if (k == nullptr || *k == '\0') return nullptr;
  for (ExportFormat f : {ExportFormat::kBnb4, ExportFormat::kPeft, ExportFormat::kMerged})
    if (std::strcmp(k, export_format_name(f)) == 0) return k;
  throw InputError(std::string("environment variable QSHARD_TEST_KILL_DURING_EXPORT='") + k +
                   "': expected bnb4, peft or merged");
}

void maybe_kill_for_test(ExportFormat f, size_t written, size_t total) {
  const char* k = kill_during_export_for_test();
  if (!k || std::strcmp(k, export_format_name(f)) != 0 || written != total / 2) return;
  QS_LOG_WARN("QSHARD_TEST_KILL_DURING_EXPORT: rank 0 kills itself during the {} export ({} of {} tensors written)",
              k, written, total);
  std::raise(SIGKILL);
}

// Makes a rename inside `dir`'s parent durable.
void fsync_parent(const fs::path& dir) {
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  const int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw InputError("export: cannot open " + parent.string() + " to fsync it: " + std::strerror(errno));
  const int rc = ::fsync(fd), err = errno;
  ::close(fd);
  if (rc != 0) throw InputError("export: fsync of " + parent.string() + " failed: " + std::strerror(err));
}

}  // namespace

bool export_complete(const std::string& out_dir) {
  std::error_code ec;
  return fs::is_directory(out_dir, ec) && !fs::is_empty(out_dir, ec) && !ec;
}

const char* export_format_name(ExportFormat f) {
  switch (f) {
    case ExportFormat::kBnb4: return "bnb4";
    case ExportFormat::kPeft: return "peft";
    case ExportFormat::kMerged: return "merged";
  }
  return "?";
}

ExportReport export_model(Communicator& host, Module& tree, const LlamaConfig& config, ShardedParameterManager& mgr,
                          const ShardedTree& units, const ExportOptions& o) {
  Communicator& comm = host;
  void* stream = mgr.compute_stream().handle();
  const bool root = comm.rank() == 0;
  const TreeViews views(units);  // the gathers below re-point the tree: produce() reads it by FQN
  const std::string label = std::string("export ") + export_format_name(o.format) + " to " + o.out_dir;
  // ---- deterministic checks and layout, identical on every rank ----
  if (o.out_dir.empty()) throw InputError("export: options.out_dir is empty");
  kill_during_export_for_test();  // a bad value is refused before anything is written
  if (o.format != ExportFormat::kBnb4) check_lora(tree, config, o, label);
  const Layout L = plan_layout(tree, config, units, o);
  const nlohmann::json model_config = o.format == ExportFormat::kPeft ? nlohmann::json() : model_config_json(tree, config, o);
  ExportReport rep;
  rep.files = L.files;
  for (const OutTensor& t : L.tensors) rep.bytes += t.nbytes();
  rep.tensors = static_cast<int64_t>(L.tensors.size());
  if (L.files.size() > 1) rep.files.push_back(kSafetensorsIndexName);
  rep.files.push_back(o.format == ExportFormat::kPeft ? "adapter_config.json" : "config.json");
  // A model folder's other files (generation_config.json, tokenizer) come along, unchanged.
  const std::vector<std::string> side_files = o.format != ExportFormat::kPeft && !config.source_dir.empty()
                                                  ? model_side_files(config.source_dir)
                                                  : std::vector<std::string>{};
  rep.files.insert(rep.files.end(), side_files.begin(), side_files.end());

  // ---- output folder: rank 0 decides, every rank learns the outcome before any gather ----
  const fs::path partial = partial_dir_for(o.out_dir);
  std::string err;
  if (root) {
    std::error_code ec;
    try {
      check_output_folder(o.out_dir, "export: output folder");
    } catch (const InputError& e) {
      err = e.what();
    }
    if (err.empty()) {
      fs::remove_all(partial, ec);
      fs::create_directories(partial, ec);
      if (ec) err = "export: cannot create " + partial.string() + ": " + ec.message();
    }
  }
  err = broadcast_string(comm, err, 0, stream);
  if (!err.empty()) throw InputError(err);

  // ---- stream the units: gather, copy to host and write on rank 0, release ----
  std::exception_ptr failure;
  std::unique_ptr<SafetensorsWriter> writer;
  std::map<std::string, Tensor> peft_tensors;  // kPeft: name -> host copy
  FuseCache fuse_cache;                         // the fused 4-bit weight being written (Phi-3)
  size_t cur_file = SIZE_MAX;
  SafetensorsIndex index;
  for (size_t begin = 0; begin < L.tensors.size();) {
    size_t end = begin;
    while (end < L.tensors.size() && L.tensors[end].unit == L.tensors[begin].unit) ++end;
    const int unit = L.tensors[begin].unit;
    mgr.gather(unit);
    mgr.compute_stream().synchronize();  // the host reads the gathered views below
    if (root && !failure) {
      try {
        NamedTensors host;  // this unit's output tensors, in host memory
        uint64_t alive = 0;
        for (size_t i = begin; i < end; ++i) {
          host.emplace_back(L.tensors[i].name, produce(tree, L.tensors[i], o, fuse_cache));
          QS_CHECK(host.back().second.dtype() == L.tensors[i].dtype && host.back().second.shape() == L.tensors[i].shape,
                   "tensor " + L.tensors[i].name + " differs from its declaration");
          alive += host.back().second.nbytes();
        }
        rep.peak_unit_bytes = std::max(rep.peak_unit_bytes, alive);
        if (o.format == ExportFormat::kPeft) {
          // The adapter is written at the end, in safetensors' own order (by name: all f32), as
          // PEFT's save_pretrained writes it; its tensors are small, kept until then.
          for (size_t i = begin; i < end; ++i) peft_tensors.emplace(L.tensors[i].name, host[i - begin].second.clone());
          host.clear();
        }
        for (size_t i = begin; i < end && o.format != ExportFormat::kPeft; ++i) {
          if (L.file_of[i] != cur_file) {
            if (writer) writer->finish();
            cur_file = L.file_of[i];
            writer = std::make_unique<SafetensorsWriter>((partial / L.files[cur_file]).string());
            for (size_t k = 0; k < L.tensors.size(); ++k)
              if (L.file_of[k] == cur_file) writer->declare(L.tensors[k].name, L.tensors[k].dtype, L.tensors[k].shape);
            writer->begin({{"format", "pt"}});
          }
          writer->write(L.tensors[i].name, host[i - begin].second.bytes());
          maybe_kill_for_test(o.format, i + 1, L.tensors.size());
          index.weight_map.emplace_back(L.tensors[i].name, L.files[cur_file]);
          index.total_size += L.tensors[i].nbytes();
        }
      } catch (...) {
        failure = std::current_exception();
      }
    }
    mgr.release(unit);
    begin = end;
  }
  comm.barrier();  // every rank is done with its gathers

  // ---- rank 0: finish the files, write the configs, self-check, rename ----
  if (root && !failure) {
    try {
      if (o.format == ExportFormat::kPeft) {
        writer = std::make_unique<SafetensorsWriter>((partial / L.files[0]).string());
        for (const auto& [name, t] : peft_tensors) writer->declare(name, t.dtype(), t.shape());
        writer->begin({{"format", "pt"}});
        size_t written = 0;
        for (const auto& [name, t] : peft_tensors) {
          writer->write(name, t.bytes());
          maybe_kill_for_test(o.format, ++written, peft_tensors.size());
          index.total_size += t.nbytes();
        }
      }
      if (writer) writer->finish();
      writer.reset();
      if (L.files.size() > 1) write_safetensors_index((partial / kSafetensorsIndexName).string(), index);
      if (o.format == ExportFormat::kPeft) {
        write_file_atomic((partial / "adapter_config.json").string(), peft_config_json(o, config).dump(2) + "\n");
        check_peft_folder(tree, L, partial.string(), o);
      } else {
        write_file_atomic((partial / "config.json").string(), model_config.dump(2) + "\n");
        if (!side_files.empty()) copy_model_side_files(config.source_dir, partial.string());
        check_model_folder(o.format == ExportFormat::kBnb4 ? &tree : nullptr, L, partial.string(),
                           o.format == ExportFormat::kBnb4);
      }
      std::error_code ec;
      if (fs::exists(o.out_dir)) fs::remove(o.out_dir, ec);  // an empty directory (checked above)
      fs::rename(partial, o.out_dir, ec);
      if (ec) throw InputError("export: cannot move " + partial.string() + " to " + o.out_dir + ": " + ec.message());
      fsync_parent(fs::path(o.out_dir).lexically_normal());
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (root && failure) {
    writer.reset();  // removes an unfinished temp file
    std::error_code ec;
    fs::remove_all(partial, ec);
  }
  err = broadcast_string(comm, failure ? status_of(failure) : std::string(), 0, stream);
  if (root && failure) std::rethrow_exception(failure);
  if (!err.empty() && err[0] == 'I') throw InputError("export failed on rank 0: " + err.substr(1));
  if (!err.empty()) throw Error("export failed on rank 0: " + err.substr(1));
  return rep;
}

}  // namespace qshard
