#include "checkpoint/bnb_folder.h"
#include "checkpoint/nonfinite.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "checkpoint/hf_config.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_index.h"
#include "quant/blockwise.h"
#include "runtime/input_file.h"
#include "runtime/log.h"
#include "runtime/machine.h"
#include "runtime/parallel.h"

namespace qshard {
namespace fs = std::filesystem;
namespace {

// One output tensor: its header entry and how to produce its bytes.
struct OutEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t nbytes() const { return static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype); }
};

// Output entries are produced in groups (one input tensor -> one or six outputs); `emit` returns
// the tensors of a group, in the declared order, and counts what it did into the report it is
// given (its own, merged into the folder's in group order: the figures do not depend on threads).
// `work_bytes`: host memory emit needs at its most (bounds how many run at once).
struct OutGroup {
  std::vector<OutEntry> entries;
  std::function<NamedTensors(FolderReport&)> emit;
  uint64_t work_bytes = 0;
};

void merge_report(FolderReport& into, const FolderReport& part) {
  into.converted_tensors += part.converted_tensors;
  into.copied_tensors += part.copied_tensors;
  into.converted_elements += part.converted_elements;
  into.max_abs_err = std::max(into.max_abs_err, part.max_abs_err);
  into.sum_sq_err += part.sum_sq_err;
  into.sum_sq_ref += part.sum_sq_ref;
  into.nonfinite_values += part.nonfinite_values;
}

// How many tensors may be worked on at once: `requested` when set, else the host's threads (at
// most 16), no more than half the available host memory holds at `most_bytes` each; at least one.
int worker_count(uint64_t most_bytes, int requested) {
  if (requested > 0) return requested;
  const uint64_t by_memory = host_memory_available().bytes / 2 / std::max<uint64_t>(most_bytes, 1);
  return static_cast<int>(std::clamp<uint64_t>(by_memory, 1, static_cast<uint64_t>(host_threads(16))));
}

int emit_workers(const std::vector<OutGroup>& groups) {
  uint64_t most = 1;
  for (const auto& g : groups) most = std::max(most, g.work_bytes);
  return worker_count(most, 0);
}

// Runs groups[order[k]].emit for every k on `workers` threads, at most `workers` results ahead of
// the consumer, which takes them in order through next(k). The first failure (in that order) is
// rethrown by next() for its group; the workers stop taking new groups once one failed or the
// runner is destroyed.
class EmitPipeline {
 public:
  EmitPipeline(std::vector<OutGroup>& groups, std::vector<size_t> order, int workers)
      : groups_(groups), order_(std::move(order)), slots_(order_.size()),
        ahead_(workers > 1 ? static_cast<size_t>(workers) : 0) {
    for (size_t w = 0; w < ahead_; ++w) pool_.emplace_back([this] { work(); });
  }
  ~EmitPipeline() {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : pool_) t.join();
  }
  // Group order[i]'s tensors and report part; i must go 0, 1, 2, ... (the consumer's order).
  NamedTensors next(size_t i, FolderReport& part) {
    std::unique_lock<std::mutex> lock(mu_);
    consumed_ = i;
    cv_.notify_all();
    if (ahead_ == 0 && slots_[i].state == kTodo) {  // one worker: the consumer emits itself
      slots_[i].state = kRunning;
      lock.unlock();
      run(i);
      lock.lock();
    }
    cv_.wait(lock, [&] { return slots_[i].state == kDone; });
    Slot s = std::move(slots_[i]);
    slots_[i] = Slot{};
    slots_[i].state = kDone;
    if (s.error) std::rethrow_exception(s.error);
    part = s.report;
    return std::move(s.tensors);
  }

 private:
  enum State { kTodo, kRunning, kDone };
  struct Slot {
    State state = kTodo;
    NamedTensors tensors;
    FolderReport report;
    std::exception_ptr error;
  };
  void run(size_t i) {
    Slot out;
    try {
      out.tensors = groups_[order_[i]].emit(out.report);
    } catch (...) {
      out.error = std::current_exception();
    }
    const std::lock_guard<std::mutex> lock(mu_);
    out.state = kDone;
    slots_[i] = std::move(out);
    if (slots_[i].error) failed_ = true;
    cv_.notify_all();
  }
  void work() {
    for (;;) {
      size_t i;
      {
        std::unique_lock<std::mutex> lock(mu_);
        // Groups consumed_ .. consumed_ + ahead_ - 1 may be running or waiting for the consumer.
        cv_.wait(lock, [&] { return stop_ || failed_ || next_ >= slots_.size() || next_ < consumed_ + ahead_; });
        if (stop_ || failed_ || next_ >= slots_.size()) return;
        i = next_++;
        slots_[i].state = kRunning;
      }
      run(i);
    }
  }
  std::vector<OutGroup>& groups_;
  const std::vector<size_t> order_;
  std::vector<Slot> slots_;
  const size_t ahead_;  // worker threads (0: the consumer emits each group itself)
  std::vector<std::thread> pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t next_ = 0, consumed_ = 0;
  bool stop_ = false, failed_ = false;
};

fs::path prepare_out_dir(const std::string& out_dir) {
  const fs::path out(out_dir);
  check_output_folder(out_dir, "output folder");
  const fs::path partial = partial_dir_for(out.string());
  std::error_code ec;
  fs::remove_all(partial, ec);
  fs::create_directories(partial, ec);
  if (ec) throw InputError("cannot create output folder " + partial.string() + ": " + ec.message());
  return partial;
}

void finish_out_dir(const fs::path& partial, const std::string& out_dir) {
  std::error_code ec;
  if (fs::exists(out_dir)) fs::remove(out_dir, ec);  // an empty directory (checked before)
  fs::rename(partial, out_dir, ec);
  if (ec) throw InputError("cannot move " + partial.string() + " to " + out_dir + ": " + ec.message());
}

void write_json(const fs::path& path, const nlohmann::json& j) {
  write_file_atomic(path.string(), j.dump(2) + "\n");
}

// Writes all groups into one or more safetensors files under `out`.
int write_groups(const fs::path& out, std::vector<OutGroup>& groups, uint64_t max_shard_bytes, FolderReport& rep,
                 int workers) {
  // Shards split between groups only, so a 4-bit weight keeps its statistics in its own file.
  std::vector<std::pair<std::string, uint64_t>> sizes;
  for (const auto& g : groups) {
    uint64_t b = 0;
    for (const auto& e : g.entries) b += e.nbytes();
    sizes.emplace_back(g.entries.front().name, b);
  }
  const ShardPlan plan = plan_shards(sizes, max_shard_bytes);
  // The groups of each file, in group order (one pass: linear in groups, whatever the file count).
  std::vector<std::vector<size_t>> groups_of_file(plan.files.size());
  for (size_t gi = 0; gi < groups.size(); ++gi) groups_of_file[plan.file_of_tensor[gi]].push_back(gi);
  // The groups in the order they are written (file by file), emitted ahead on the workers.
  std::vector<size_t> order;
  order.reserve(groups.size());
  for (const auto& gs : groups_of_file) order.insert(order.end(), gs.begin(), gs.end());
  EmitPipeline pipeline(groups, order, workers);
  size_t taken = 0;
  SafetensorsIndex index;
  for (size_t f = 0; f < plan.files.size(); ++f) {
    SafetensorsWriter w((out / plan.files[f]).string());
    for (size_t gi : groups_of_file[f])
      for (const auto& e : groups[gi].entries) w.declare(e.name, e.dtype, e.shape);
    w.begin({{"format", "pt"}});
    for (size_t gi : groups_of_file[f]) {
      FolderReport part;
      NamedTensors ts = pipeline.next(taken++, part);
      merge_report(rep, part);
      QS_CHECK(ts.size() == groups[gi].entries.size(), "emitted tensor count differs from the declaration");
      for (size_t k = 0; k < ts.size(); ++k) {
        const auto& [name, t] = ts[k];
        const OutEntry& e = groups[gi].entries[k];
        QS_CHECK(name == e.name && t.dtype() == e.dtype && t.numel() == shape_numel(e.shape),
                 "tensor " + name + " differs from its declaration");
        Tensor host = t.device() == Device::kCpu ? t : t.to(Device::kCpu);
        w.write(name, host.bytes());
        index.weight_map.emplace_back(name, plan.files[f]);
        index.total_size += host.nbytes();
        rep.bytes_out += host.nbytes();
      }
    }
    w.finish();
  }
  if (plan.files.size() > 1) write_safetensors_index((out / kSafetensorsIndexName).string(), index);
  return static_cast<int>(plan.files.size());
}

// Writes the converted folder: tensors, config.json, side files, all under OUT.partial-<pid>,
// renamed to OUT at the end; on any error the partial folder is removed and nothing else touched.
void write_output_folder(const std::string& in_dir, const std::string& out_dir, std::vector<OutGroup>& groups,
                         uint64_t max_shard_bytes, const nlohmann::json& config, FolderReport& rep, int workers) {
  const fs::path partial = prepare_out_dir(out_dir);
  try {
    rep.files_written = write_groups(partial, groups, max_shard_bytes, rep, workers);
    write_json(partial / "config.json", config);
    copy_model_side_files(in_dir, partial.string());
    finish_out_dir(partial, out_dir);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(partial, ec);
    throw;
  }
}

void accumulate_error(FolderReport& rep, const std::vector<float>& ref, const float* got) {
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ref[i])) continue;  // counted in nonfinite_values (allow_nonfinite)
    const double d = static_cast<double>(got[i]) - ref[i];
    rep.max_abs_err = std::max(rep.max_abs_err, std::fabs(d));
    rep.sum_sq_err += d * d;
    rep.sum_sq_ref += static_cast<double>(ref[i]) * ref[i];
  }
}

bool is_stat_suffix(const std::string& name, std::string* base) {
  static const char* kSuffixes[] = {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                                    ".quant_state.bitsandbytes__nf4", ".quant_state.bitsandbytes__fp4"};
  for (const char* s : kSuffixes) {
    const std::string suf(s);
    if (name.size() > suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0) {
      *base = name.substr(0, name.size() - suf.size());
      return true;
    }
  }
  return false;
}

}  // namespace

std::vector<std::string> model_side_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code kind_ec;
    if (e.is_directory(kind_ec)) continue;  // subfolders (a cache, a repo's .git) are not the model's files
    // Anything else that is not a regular file (a FIFO, a socket, a link to /dev/zero) is refused by
    // name rather than copied (which would block or never end) or left out in silence.
    if (!e.is_regular_file(kind_ec)) check_input_file(e.path().string(), "model folder side file");
    const std::string name = e.path().filename().string();
    if (name == "config.json" || name == kSafetensorsIndexName || e.path().extension() == ".safetensors") continue;
    out.push_back(name);
  }
  if (ec) throw InputError("cannot list model folder " + dir + ": " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

void copy_model_side_files(const std::string& in_dir, const std::string& out_dir) {
  for (const std::string& name : model_side_files(in_dir)) {
    std::error_code ec;
    fs::copy_file(fs::path(in_dir) / name, fs::path(out_dir) / name, ec);
    if (ec) throw InputError("cannot copy " + (fs::path(in_dir) / name).string() + " to " + out_dir + ": " + ec.message());
  }
}

nlohmann::json bnb_quantization_config(const QuantizeOptions& o, DType compute_dtype) {
  nlohmann::json q;  // std::map-backed: keys come out sorted
  q["_load_in_4bit"] = true;
  q["_load_in_8bit"] = false;
  q["bnb_4bit_compute_dtype"] = dtype_torch_name(compute_dtype);
  q["bnb_4bit_quant_storage"] = "uint8";
  q["bnb_4bit_quant_type"] = quant_type_name(o.quant_type);
  q["bnb_4bit_use_double_quant"] = o.compress_statistics;
  q["llm_int8_enable_fp32_cpu_offload"] = false;
  q["llm_int8_has_fp16_weight"] = false;
  q["llm_int8_skip_modules"] = nullptr;
  q["llm_int8_threshold"] = 6.0;
  q["load_in_4bit"] = true;
  q["load_in_8bit"] = false;
  q["quant_method"] = "bitsandbytes";
  return q;
}

FolderReport quantize_model_folder(const std::string& in_dir, const std::string& out_dir,
                                   const QuantizeFolderOptions& opt) {
  validate_blocksize(opt.quant.blocksize);
  const LlamaConfig cfg = LlamaConfig::load(in_dir);
  if (cfg.quantized)
    throw InputError(in_dir + "/config.json: the model is already quantized (quantization_config present)");
  const SafetensorsFolder in = SafetensorsFolder::open(in_dir);
  check_stored_layers(cfg, in.names(), in_dir);
  for (const auto& [name, shape] : llama_expected_weights(cfg)) {
    const SafetensorsEntry* e = in.find(name);
    if (!e) throw InputError(in_dir + ": tensor '" + name + "' required by config.json is missing");
    if (e->shape != shape)
      throw InputError(in_dir + ": tensor '" + name + "' has shape " + shape_str(e->shape) + ", config.json implies " +
                       shape_str(shape));
    if (!e->dtype || !dtype_is_float(*e->dtype))
      throw InputError(in_dir + ": tensor '" + name + "' has dtype " + e->dtype_name + " (expected F32, BF16 or F16)");
  }
  const bool cuda = opt.use_cuda && cuda_available();
  // Pass 1 (header): the packed JSON's length depends on the double-quant offset, a mean of the
  // block absmax, which is cheap to compute without encoding; one tensor per thread.
  std::vector<std::string> projections;
  uint64_t largest = 1;
  for (const std::string& name : in.names())
    if (is_llama_projection_weight(name)) {
      const SafetensorsEntry& e = *in.find(name);
      if (!e.dtype || !dtype_is_float(*e.dtype))
        throw InputError(in_dir + ": tensor '" + name + "' has dtype " + e.dtype_name + " (expected F32, BF16 or F16)");
      projections.push_back(name);
      largest = std::max<uint64_t>(largest, static_cast<uint64_t>(shape_numel(e.shape)));
    }
  // Host bytes per element that one tensor's quantization holds at its most (input, f32 copy,
  // quantizer's f32 copy, dequantized f32, packed); on the GPU path one tensor at a time.
  const uint64_t per_element = 16;
  const int workers = cuda ? 1 : worker_count(largest * per_element, opt.threads);
  std::map<std::string, float> offsets;
  if (opt.quant.compress_statistics) {
    std::vector<float> found(projections.size());
    parallel_for(projections.size(), workers, [&](size_t k) {
      const std::vector<float> x = in.get(projections[k]).to_f32_vector();
      const int64_t n = static_cast<int64_t>(x.size()), bs = opt.quant.blocksize, nb = (n + bs - 1) / bs;
      std::vector<float> amax(static_cast<size_t>(nb), 0.0f);
      for (int64_t b = 0; b < nb; ++b) {  // max |x| per block; a NaN never wins (as fmax)
        float m = 0.0f;
        for (int64_t i = b * bs; i < std::min(n, (b + 1) * bs); ++i) {
          const float a = std::fabs(x[i]);
          m = a > m ? a : m;
        }
        amax[b] = m;
      }
      found[k] = cpu::absmax_mean(amax.data(), nb);
    });
    for (size_t k = 0; k < projections.size(); ++k) offsets[projections[k]] = found[k];
  }
  FolderReport rep;
  std::vector<OutGroup> groups;
  for (const std::string& name : in.names()) {
    const SafetensorsEntry& e = *in.find(name);
    rep.bytes_in += e.nbytes();
    if (!is_llama_projection_weight(name)) {
      if (!e.dtype) throw InputError(in_dir + ": tensor '" + name + "' has dtype " + e.dtype_name + " that qshard cannot copy");
      groups.push_back({{{name, *e.dtype, e.shape}},
                        [&in, name](FolderReport& part) {
                          ++part.copied_tensors;
                          return NamedTensors{{name, in.get(name)}};
                        },
                        e.nbytes()});
      continue;
    }
    QuantState st;
    st.quant_type = opt.quant.quant_type;
    st.blocksize = opt.quant.blocksize;
    st.dtype = *e.dtype;
    st.shape = e.shape;
    const int64_t n = shape_numel(e.shape), nb = (n + st.blocksize - 1) / st.blocksize;
    if (opt.quant.compress_statistics) {
      st.state2 = NestedQuantState{};
      st.state2->offset = offsets.at(name);
    }
    std::vector<OutEntry> entries = {{name, DType::kU8, {(n + 1) / 2, 1}},
                                     {name + ".absmax", st.nested() ? DType::kU8 : DType::kF32, {nb}},
                                     {name + ".quant_map", DType::kF32, {16}}};
    if (st.nested()) {
      entries.push_back({name + ".nested_absmax", DType::kF32, {(nb + 255) / 256}});
      entries.push_back({name + ".nested_quant_map", DType::kF32, {256}});
    }
    entries.push_back({name + ".quant_state.bitsandbytes__" + quant_type_name(st.quant_type), DType::kU8,
                       {static_cast<int64_t>(st.packed_json().size())}});
    const float planned_offset = st.nested() ? st.state2->offset : 0.0f;
    groups.push_back({entries,
                      [&in, name, &opt, cuda, planned_offset](FolderReport& part) {
                        const Tensor x = in.get(name);
                        // One thread: the groups already run on the worker threads.
                        part.nonfinite_values +=
                            require_finite(x, in.dir(), name, opt.allow_nonfinite,
                                           "; refusing to quantize them (--allow-nonfinite to quantize anyway)", 1);
                        const std::vector<float> v = x.to_f32_vector();
                        Params4bit p = quantize_4bit(cuda ? x.to(Device::kCuda) : x, opt.quant);
                        if (p.quant_state.nested())
                          QS_CHECK(p.quant_state.state2->offset == planned_offset, "offset differs from pass 1");
                        Tensor back = dequantize_4bit(p, DType::kF32);
                        if (back.device() != Device::kCpu) back = back.to(Device::kCpu);
                        accumulate_error(part, v, back.data<float>());
                        ++part.converted_tensors;
                        part.converted_elements += x.numel();
                        return params4bit_state_dict(p, name);
                      },
                      static_cast<uint64_t>(n) * per_element});
  }
  nlohmann::json config = cfg.raw;
  config["quantization_config"] = bnb_quantization_config(opt.quant, opt.compute_dtype);
  write_output_folder(in_dir, out_dir, groups, opt.max_shard_bytes, config, rep, workers);
  return rep;
}

FolderReport dequantize_model_folder(const std::string& in_dir, const std::string& out_dir,
                                     std::optional<DType> out_dtype, uint64_t max_shard_bytes, bool allow_nonfinite) {
  if (out_dtype && !dtype_is_float(*out_dtype))
    throw InputError(std::string("dequantize: output dtype ") + dtype_torch_name(*out_dtype) + " is not a float type");
  const LlamaConfig cfg = LlamaConfig::load(in_dir);
  if (!cfg.quantized) throw InputError(in_dir + "/config.json: no bitsandbytes quantization_config; nothing to dequantize");
  const SafetensorsFolder in = SafetensorsFolder::open(in_dir);
  check_stored_layers(cfg, in.names(), in_dir);
  const std::string label = in_dir;
  TensorLookup lookup = [&in](const std::string& k) -> std::optional<Tensor> {
    if (!in.contains(k)) return std::nullopt;
    return in.get(k);
  };
  for (const auto& [name, shape] : llama_expected_weights(cfg)) {
    if (!in.contains(name)) throw InputError(in_dir + ": tensor '" + name + "' required by config.json is missing");
    // Packed 4-bit bytes of this shape without a quant state beside them: named as such (the
    // shape check below would call it a wrong shape).
    const SafetensorsEntry* e = in.find(name);
    const bool packed = (!e->dtype || !dtype_is_float(*e->dtype)) &&
                        e->nbytes() == static_cast<uint64_t>((shape_numel(shape) + 1) / 2);
    if (is_4bit_weight(name, lookup) || packed) {
      // The statistics' values are checked once, here, before anything is written.
      const SafetensorsFile* file = in.file_of(name);
      Params4bit p = params4bit_from_state_dict(name, lookup, file ? file->path() : label, allow_nonfinite);
      if (p.quant_state.shape != shape)
        throw InputError(in_dir + ": 4-bit tensor '" + name + "' has shape " + shape_str(p.quant_state.shape) +
                         ", config.json implies " + shape_str(shape));
    } else if (in.find(name)->shape != shape) {
      throw InputError(in_dir + ": tensor '" + name + "' has shape " + shape_str(in.find(name)->shape) +
                       ", config.json implies " + shape_str(shape));
    }
  }
  FolderReport rep;
  std::vector<OutGroup> groups;
  std::optional<DType> weights_dtype;  // the 4-bit weights' output dtype, if they all share one
  bool mixed = false;
  for (const std::string& name : in.names()) {
    rep.bytes_in += in.find(name)->nbytes();
    std::string base;
    if (is_stat_suffix(name, &base) && is_4bit_weight(base, lookup)) continue;  // consumed with its weight
    if (is_4bit_weight(name, lookup)) {
      const QuantState st = params4bit_from_state_dict(name, lookup, label, allow_nonfinite).quant_state;
      const DType dt = out_dtype.value_or(st.dtype);  // bitsandbytes' dequantize_4bit gives st.dtype
      if (weights_dtype && *weights_dtype != dt) mixed = true;
      weights_dtype = dt;
      groups.push_back({{{name, dt, st.shape}},
                        [name, lookup, label, dt](FolderReport& part) {
                          Params4bit p = params4bit_from_state_dict(name, lookup, label, /*allow_nonfinite=*/true);
                          ++part.converted_tensors;
                          part.converted_elements += p.quant_state.numel();
                          return NamedTensors{{name, dequantize_4bit(p, dt)}};
                        },
                        // packed + statistics, f32 values, the output
                        static_cast<uint64_t>(st.numel()) * (5 + dtype_size(dt))});
      continue;
    }
    const SafetensorsEntry& e = *in.find(name);
    if (!e.dtype) throw InputError(in_dir + ": tensor '" + name + "' has dtype " + e.dtype_name + " that qshard cannot copy");
    groups.push_back({{{name, *e.dtype, e.shape}},
                      [&in, name](FolderReport& part) {
                        ++part.copied_tensors;
                        return NamedTensors{{name, in.get(name)}};
                      },
                      e.nbytes()});
  }
  nlohmann::json config = cfg.raw;
  config.erase("quantization_config");
  if (mixed) QS_LOG_WARN("{}: the 4-bit weights were quantized from several dtypes; config.json's dtype is kept as read", in_dir);
  if (weights_dtype && !mixed)
    for (const char* k : {"torch_dtype", "dtype"})
      if (config.contains(k)) config[k] = dtype_torch_name(*weights_dtype);
  write_output_folder(in_dir, out_dir, groups, max_shard_bytes, config, rep, emit_workers(groups));
  return rep;
}

}  // namespace qshard
