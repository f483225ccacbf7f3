// bench/export: time and rank-0 peak host memory of export_model() (src/checkpoint/export.h) on a
// Llama-3-8B-shaped sharded QLoRA model, in each export format (bnb4, peft, merged).
//
// The claim measured: export_model() streams the model one FSDP unit at a time, so rank 0's peak
// host memory during an export is bounded by the largest unit plus a fixed overhead, not by the
// model's size. Per format it reports:
//   - wall time of export_model() (rank 0, from a barrier to its return; includes the self-check,
//     the fsyncs and the rename), tensor bytes written (ExportReport::bytes), GB/s, bytes on disk;
//   - ExportReport::peak_unit_bytes (the export's own count of host copies alive at once);
//   - rank 0's RSS just before the export (baseline) and its peak during the export. The peak is
//     the kernel's high-water mark VmHWM of /proc/self/status, reset before each export by
//     writing "5" to /proc/self/clear_refs. Where clear_refs is not writable (some sandboxes), the
//     peak is the largest VmRSS seen by a thread polling /proc/self/status every 2 ms, and the
//     output says so (getrusage's ru_maxrss is the process' lifetime peak and cannot be reset; it
//     is reported beside it). The polling thread also gives the peak of RssAnon (heap: the copies
//     the claim is about) and RssFile (pages of mapped files, e.g. the self-check's mmap of the
//     written folder) separately: VmHWM counts both.
//   - peak minus baseline, against the largest unit (ShardMemoryStats::unit_bytes_max, its
//     gathered buffers including gradients) and against the format's exported bytes.
// Page cache of the written files is not RSS and is not counted; it is reported as it is.
//
// Model: build_llama_tree() with bf16 float tensors (embeddings, norms, lm_head) and bf16 as the
// 4-bit weights' original dtype: what transformers keeps when it loads Llama-3-8B with
// torch_dtype=bfloat16 and saves a bitsandbytes folder. Projections NF4, blocksize 64, double
// quant; LoRA on all seven projections. Values are random but not drawn from a normal and
// quantized (that takes many minutes for 8B on a CPU): the packed codes and the uint8 absmax
// codes are random bytes (any byte is a valid code pair), the nested absmax is uniform in
// [0.005, 0.02] around a nested offset of 0.04 (so every decoded absmax is positive and finite),
// float weights uniform with std 0.02, norms in [0.9, 1.1], lora_A uniform +-1/sqrt(in) (PEFT's
// init), lora_B uniform +-0.01 (non-zero: the PEFT self-check refuses an all-zero lora_B). The
// values come from a counter-based generator (splitmix64) in fixed chunks: they do not depend on
// --threads.
// Sharding: World + MpiCommunicator over MPI_COMM_WORLD (a singleton without mpirun, or
// mpirun -np N), ShardOptions offload on, compute device CPU, two gathered slots, one unit per
// decoder layer + the root unit. Before the first export every unit is gathered and released once
// (--no-warmup skips it): that touches the gathered slots, as a trainer has, and drops the tree's
// build-time copies, so each export starts from the same state; the warm-up's own RSS change is
// reported.
// Disk: formats run one at a time in --formats order; each output folder is deleted right after
// it is measured unless --keep / --keep-only names it. 8B: bnb4 ~5.7 GB, merged bf16 ~16 GB.
//
// Usage: bench_export [--shape 8b|tiny] [--layers N] [--formats bnb4,peft,merged] [--out DIR]
//                     [--keep | --keep-only FORMATS] [--json FILE] [--lora-r 16] [--threads N]
//                     [--max-shard-gb 5] [--no-warmup]
//        mpirun -np N bench_export ...   (every rank builds the model; rank 0 writes and measures)
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/export.h"
#include "checkpoint/llama_tree.h"
#include "runtime/failure.h"
#include "runtime/mpi_communicator.h"
#include "runtime/world.h"

using namespace qshard;
namespace fs = std::filesystem;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// ---- host memory of this process ---------------------------------------------------------------

// Fields of /proc/self/status, in bytes; -1 where the kernel does not report the field.
struct ProcMemory {
  int64_t rss = -1;    // VmRSS
  int64_t hwm = -1;    // VmHWM: peak VmRSS since start or since the last clear_refs "5"
  int64_t anon = -1;   // RssAnon: heap, anonymous mappings
  int64_t file = -1;   // RssFile: resident pages of mapped files
  int64_t shmem = -1;  // RssShmem
};

ProcMemory read_proc_memory() {
  ProcMemory m;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return m;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    long long kb = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &kb) == 1) m.rss = kb * 1024;
    else if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) m.hwm = kb * 1024;
    else if (std::sscanf(line, "RssAnon: %lld kB", &kb) == 1) m.anon = kb * 1024;
    else if (std::sscanf(line, "RssFile: %lld kB", &kb) == 1) m.file = kb * 1024;
    else if (std::sscanf(line, "RssShmem: %lld kB", &kb) == 1) m.shmem = kb * 1024;
  }
  std::fclose(f);
  return m;
}

// Resets VmHWM to the current VmRSS (Linux >= 4.0). False when the file is not writable.
bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

// The process' lifetime peak RSS (getrusage; Linux reports kilobytes).
int64_t rusage_max_rss() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// A thread that polls /proc/self/status every `period` and keeps the largest VmRSS, RssAnon and
// RssFile it sees (each field's own maximum; they need not be simultaneous).
class RssSampler {
 public:
  explicit RssSampler(std::chrono::milliseconds period) : period_(period), thread_([this] { loop(); }) {}
  ~RssSampler() { stop(); }
  // Stops the thread (idempotent) and returns the maxima.
  ProcMemory stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    sample();  // the state at the end counts too
    return max_;
  }

 private:
  void sample() {
    const ProcMemory m = read_proc_memory();
    max_.rss = std::max(max_.rss, m.rss);
    max_.anon = std::max(max_.anon, m.anon);
    max_.file = std::max(max_.file, m.file);
    max_.shmem = std::max(max_.shmem, m.shmem);
  }
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_) {
      sample();
      cv_.wait_for(lock, period_, [this] { return done_; });
    }
  }
  std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  ProcMemory max_;
  std::thread thread_;  // last: starts after the members above exist
};

// Gives freed heap back to the kernel so that a baseline does not carry an earlier step's garbage.
void trim_heap() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

// ---- fast deterministic random fill -----------------------------------------------------------

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
// Items per chunk: each chunk is one task for the thread pool; values depend on the item index
// only, never on the thread that fills it.
constexpr int64_t kChunk = int64_t{1} << 20;
constexpr float kInitBound = 0.034641f;  // uniform(-b, b) has std 0.02 (transformers' initializer_range)

// splitmix64's output function: item i of stream `seed` is mix64(seed + (i + 1) * kGolden).
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
uint64_t random_at(uint64_t seed, int64_t i) { return mix64(seed + static_cast<uint64_t>(i + 1) * kGolden); }
float uniform01(uint64_t bits) { return static_cast<float>(bits >> 40) * 0x1p-24f; }  // [0, 1)

// FNV-1a of a tensor's FQN: a seed per tensor that is the same on every platform.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Runs fn(begin, end) over [0, n) in chunks of kChunk on up to `threads` threads.
template <class Fn>
void for_chunks(int64_t n, int threads, const Fn& fn) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const int workers = static_cast<int>(std::min<int64_t>(threads, chunks));
  std::atomic<int64_t> next{0};
  const auto work = [&] {
    for (int64_t c; (c = next.fetch_add(1)) < chunks;) fn(c * kChunk, std::min(n, (c + 1) * kChunk));
  };
  if (workers <= 1) return work();
  std::vector<std::thread> pool;
  for (int t = 0; t < workers; ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
}

void fill_bytes(Tensor& t, uint64_t seed, int threads) {
  auto* p = static_cast<uint8_t*>(t.raw());
  const int64_t n = static_cast<int64_t>(t.nbytes()), words = (n + 7) / 8;
  for_chunks(words, threads, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      const uint64_t r = random_at(seed, w);
      std::memcpy(p + w * 8, &r, static_cast<size_t>(std::min<int64_t>(8, n - w * 8)));
    }
  });
}

// Uniform [lo, hi) values in an f32 or bf16 tensor (bf16 rounded to nearest even).
void fill_uniform(Tensor& t, float lo, float hi, uint64_t seed, int threads) {
  const float span = hi - lo;
  if (t.dtype() == DType::kF32) {
    float* p = t.data<float>();
    for_chunks(t.numel(), threads, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = lo + span * uniform01(random_at(seed, i));
    });
  } else if (t.dtype() == DType::kBF16) {
    uint16_t* p = t.data<uint16_t>();
    for_chunks(t.numel(), threads, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float v = lo + span * uniform01(random_at(seed, i));
        uint32_t u;
        std::memcpy(&u, &v, 4);
        p[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      }
    });
  } else {
    throw Error(std::string("bench_export: no random fill for dtype ") + dtype_torch_name(t.dtype()));
  }
}

// Valid random 4-bit statistics: see the header comment.
void fill_params4bit(Params4bit& p, uint64_t seed, int threads) {
  QuantState& st = p.quant_state;
  fill_bytes(p.data, mix64(seed + 1), threads);
  if (st.nested()) {
    fill_bytes(st.absmax, mix64(seed + 2), threads);  // u8 codes into the signed dynamic map
    fill_uniform(st.state2->absmax, 0.005f, 0.02f, mix64(seed + 3), threads);
    st.state2->offset = 0.04f;  // decoded absmax = code[q] * nested_absmax + offset in [0.02, 0.06]
  } else {
    fill_uniform(st.absmax, 0.02f, 0.06f, mix64(seed + 2), threads);
  }
}

void randomize(Module& m, const std::string& path, uint64_t seed, int threads) {
  const std::string leaf = path.substr(path.rfind('.') + 1);  // whole path when it has no dot
  for (const Module::Slot& cs : m.slots()) {
    Module::Slot& s = *m.slot(cs.name);
    const uint64_t ts = mix64(seed ^ fnv1a(path + "." + s.name));
    if (s.kind == Module::SlotKind::kParams4bit) {
      fill_params4bit(*s.params4bit, ts, threads);
    } else if (m.type_name() == "LlamaRMSNorm") {
      fill_uniform(s.tensor, 0.9f, 1.1f, ts, threads);
    } else if (leaf == "lora_A") {  // [r, in]
      const float b = 1.0f / std::sqrt(static_cast<float>(s.tensor.dim(1)));
      fill_uniform(s.tensor, -b, b, ts, threads);
    } else if (leaf == "lora_B") {
      fill_uniform(s.tensor, -0.01f, 0.01f, ts, threads);
    } else {
      fill_uniform(s.tensor, -kInitBound, kInitBound, ts, threads);
    }
  }
  for (const auto& [name, child] : m.children()) randomize(*child, path.empty() ? name : path + "." + name, seed, threads);
}

// ---- model shape ------------------------------------------------------------------------------

LlamaConfig make_config(const std::string& shape, int64_t layers) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_act", "silu"},
                      {"attention_bias", false}, {"mlp_bias", false}, {"initializer_range", 0.02},
                      {"rms_norm_eps", 1e-5}, {"rope_theta", 500000.0}, {"tie_word_embeddings", false},
                      {"torch_dtype", "bfloat16"}, {"bos_token_id", 128000}, {"eos_token_id", 128001}};
  if (shape == "8b") {  // meta-llama/Meta-Llama-3-8B's config.json
    j.update({{"vocab_size", 128256}, {"hidden_size", 4096}, {"intermediate_size", 14336}, {"num_hidden_layers", 32},
              {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"max_position_embeddings", 8192}});
  } else if (shape == "tiny") {  // a few seconds on a laptop; rows multiples of 64 (bitsandbytes' CPU path)
    j.update({{"vocab_size", 8192}, {"hidden_size", 512}, {"intermediate_size", 1536}, {"num_hidden_layers", 2},
              {"num_attention_heads", 8}, {"num_key_value_heads", 2}, {"max_position_embeddings", 2048},
              {"bos_token_id", 1}, {"eos_token_id", 2}});
  } else {
    throw InputError("--shape '" + shape + "': expected 8b or tiny");
  }
  if (layers > 0) j["num_hidden_layers"] = layers;
  return LlamaConfig::from_json(j, "--shape " + shape);
}

std::vector<ExportFormat> parse_formats(const std::string& list, const std::string& flag) {
  std::vector<ExportFormat> out;
  std::stringstream ss(list);
  for (std::string name; std::getline(ss, name, ',');) {
    ExportFormat f;
    if (name == "bnb4") f = ExportFormat::kBnb4;
    else if (name == "peft") f = ExportFormat::kPeft;
    else if (name == "merged") f = ExportFormat::kMerged;
    else throw InputError(flag + " '" + list + "': unknown format '" + name + "' (expected bnb4, peft or merged)");
    if (std::find(out.begin(), out.end(), f) != out.end()) throw InputError(flag + " '" + list + "': '" + name + "' twice");
    out.push_back(f);
  }
  return out;
}

// ---- machine facts for the record -------------------------------------------------------------

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 ? buf : "unknown";
}

// "model name" of /proc/cpuinfo (x86), or "unknown".
std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos) return line.substr(line.find_first_not_of(" \t", c + 1));
    }
  return "unknown";
}

int64_t mem_total_bytes() {
  std::ifstream f("/proc/meminfo");
  for (std::string line; std::getline(f, line);) {
    long long kb = 0;
    if (std::sscanf(line.c_str(), "MemTotal: %lld kB", &kb) == 1) return kb * 1024;
  }
  return -1;
}

uint64_t bytes_on_disk(const std::string& dir) {
  uint64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) total += e.file_size();
  return total;
}

double gb(double bytes) { return bytes / 1e9; }

// ---- one measured export ----------------------------------------------------------------------

struct FormatResult {
  std::string format;
  double seconds = 0;
  ExportReport report;
  uint64_t disk_bytes = 0;
  ProcMemory before, after, sampled;  // sampled: maxima of the polling thread during the export
  bool hwm_reset = false;             // clear_refs worked: after.hwm is this export's peak
  int64_t rusage_before = 0, rusage_after = 0;
  int64_t peak() const { return hwm_reset && after.hwm >= 0 ? after.hwm : sampled.rss; }
};

nlohmann::json memory_json(const ProcMemory& m) {
  return {{"rss", m.rss}, {"hwm", m.hwm}, {"anon", m.anon}, {"file", m.file}, {"shmem", m.shmem}};
}

int run(World& world, const std::string& shape_name, int64_t layers, const std::vector<ExportFormat>& formats,
        const std::string& out, bool keep, const std::vector<ExportFormat>& keep_only, const std::string& json_path,
        int64_t lora_r, int threads, double max_shard_gb, bool warmup, const std::string& command) {
  const bool root = world.rank() == 0;
  MpiCommunicator comm(world.comm());
  const LlamaConfig config = make_config(shape_name, layers);
  if (root) {
    if (fs::exists(out) && !(fs::is_directory(out) && fs::is_empty(out)))
      throw InputError("--out " + out + ": exists and is not an empty folder (the bench removes its work folder; "
                       "choose a new one)");
    fs::create_directories(out);
  }
  comm.barrier();

  // ---- build: tree, random values, sharding (not part of the export) ----
  const double t_build = now_s();
  LlamaTreeOptions to;
  to.dtype = DType::kBF16;
  to.quant = QuantizeOptions{QuantType::kNf4, 64, true};
  to.lora.r = lora_r;
  std::unique_ptr<Module> tree = build_llama_tree(config, to);
  const double t_fill = now_s();
  randomize(*tree, "", 1234, threads);
  uint64_t model_bytes = 0;  // every tensor of the state dict, LoRA included
  for (const auto& [k, t] : state_dict(*tree)) model_bytes += t.nbytes();
  const double t_shard = now_s();
  ShardOptions so;
  so.offload = true;
  so.compute_device = Device::kCpu;
  ShardedParameterManager mgr(comm, so);
  const ShardedTree units = shard_module_tree(*tree, mgr, "model.layers");
  mgr.finalize();
  const double t_built = now_s();
  const ShardMemoryStats ms = mgr.memory();

  ProcMemory warm_before = read_proc_memory(), warm_after = warm_before;
  double warm_s = 0;
  if (warmup) {
    const double t = now_s();
    for (int u = 0; u < mgr.num_units(); ++u) {
      mgr.gather(u);
      mgr.release(u);
    }
    mgr.compute_stream().synchronize();
    warm_s = now_s() - t;
    trim_heap();
    warm_after = read_proc_memory();
  }

  if (root) {
    std::printf("bench_export: shape %s (%lld layers, vocab %lld, hidden %lld, intermediate %lld), NF4 bs64 double quant, "
                "bf16 floats, LoRA r=%lld on 7 projections; world size %d\n",
                shape_name.c_str(), (long long)config.num_hidden_layers, (long long)config.vocab_size,
                (long long)config.hidden_size, (long long)config.intermediate_size, (long long)lora_r, comm.size());
    std::printf("build: %.2f s (tree %.2f, random fill %.2f on %d threads, shard+finalize %.2f); model %.3f GB\n",
                t_built - t_build, t_fill - t_build, t_shard - t_fill, threads, t_built - t_shard, gb(model_bytes));
    std::printf("manager (rank 0): shards %.3f GB, gathered slots %.3f GB, largest unit %.3f GB\n", gb(ms.shard_bytes),
                gb(ms.slot_bytes), gb(ms.unit_bytes_max));
    if (warmup)
      std::printf("warm-up gather+release of %d units: %.2f s, RSS %.3f -> %.3f GB\n", mgr.num_units(), warm_s,
                  gb(warm_before.rss), gb(warm_after.rss));
    std::fflush(stdout);
  }

  // ---- the exports, one at a time ----
  std::vector<FormatResult> results;
  for (const ExportFormat f : formats) {
    FormatResult r;
    r.format = export_format_name(f);
    ExportOptions o;
    o.out_dir = (fs::path(out) / r.format).string();
    o.format = f;
    o.r = lora_r;
    o.lora_alpha = 16;
    o.max_shard_bytes = static_cast<uint64_t>(max_shard_gb * 1e9);
    o.base_model_name_or_path = "qshard/bench-export-" + shape_name;
    std::unique_ptr<RssSampler> sampler;
    if (root) {
      trim_heap();
      r.hwm_reset = reset_peak_rss();
      r.before = read_proc_memory();
      r.rusage_before = rusage_max_rss();
      sampler = std::make_unique<RssSampler>(std::chrono::milliseconds(2));
    }
    comm.barrier();
    const double t0 = now_s();
    r.report = export_model(*tree, config, mgr, units, o);
    r.seconds = now_s() - t0;
    if (root) {
      r.sampled = sampler->stop();
      r.after = read_proc_memory();
      r.rusage_after = rusage_max_rss();
      r.disk_bytes = bytes_on_disk(o.out_dir);
      const bool kept = keep || std::find(keep_only.begin(), keep_only.end(), f) != keep_only.end();
      if (!kept) fs::remove_all(o.out_dir);
      std::printf("%-6s %7.2f s  %.3f GB written (%.3f GB on disk, %zu files%s)\n", r.format.c_str(), r.seconds,
                  gb(r.report.bytes), gb(r.disk_bytes), r.report.files.size(), kept ? ", kept" : "");
      std::fflush(stdout);
    }
    comm.barrier();
    results.push_back(std::move(r));
  }
  if (!root) return 0;

  // ---- report ----
  const bool hwm_ok = std::all_of(results.begin(), results.end(), [](const FormatResult& r) { return r.hwm_reset; });
  const std::string method = hwm_ok ? "VmHWM of /proc/self/status after writing 5 to /proc/self/clear_refs"
                                    : "largest VmRSS polled every 2 ms (/proc/self/clear_refs not writable; "
                                      "rusage_max_rss is the process' lifetime peak)";
  std::printf("\nrank-0 host memory (GB); peak = %s\n", method.c_str());
  std::printf("%-6s %8s %7s %7s %10s %9s %9s %10s %10s %11s %9s %9s\n", "format", "time s", "GB out", "GB/s",
              "peak unit", "RSS base", "RSS peak", "peak-base", "anon +max", "file +max", "/ unit", "/ out");
  for (const FormatResult& r : results) {
    const double rise = static_cast<double>(r.peak() - r.before.rss);
    std::printf("%-6s %8.2f %7.3f %7.3f %10.3f %9.3f %9.3f %10.3f %10.3f %11.3f %9.2f %9.3f\n", r.format.c_str(),
                r.seconds, gb(r.report.bytes), gb(r.report.bytes) / r.seconds, gb(r.report.peak_unit_bytes),
                gb(r.before.rss), gb(r.peak()), gb(rise), gb(r.sampled.anon - r.before.anon),
                gb(r.sampled.file - r.before.file), rise / ms.unit_bytes_max, rise / r.report.bytes);
  }
  std::printf("(anon/file +max: largest RssAnon / RssFile polled minus the baseline's; / unit: peak-base over the largest "
              "unit %.3f GB; / out: over the format's exported bytes)\n", gb(ms.unit_bytes_max));

  if (!json_path.empty()) {
    nlohmann::json j;
    j["bench"] = "export";
    j["date"] = utc_now();
    j["hostname"] = host_name();
    j["cpu_model"] = cpu_model();
    j["cpu_threads"] = std::thread::hardware_concurrency();
    j["mem_total_bytes"] = mem_total_bytes();
    j["command"] = command;
    j["world_size"] = comm.size();
    j["shape"] = {{"name", shape_name}, {"vocab_size", config.vocab_size}, {"hidden_size", config.hidden_size},
                  {"intermediate_size", config.intermediate_size}, {"num_hidden_layers", config.num_hidden_layers},
                  {"num_attention_heads", config.num_attention_heads},
                  {"num_key_value_heads", config.num_key_value_heads},
                  {"max_position_embeddings", config.max_position_embeddings}, {"rope_theta", config.rope_theta},
                  {"tie_word_embeddings", config.tie_word_embeddings}};
    j["model"] = {{"float_dtype", "bfloat16"}, {"quant_type", "nf4"}, {"blocksize", 64}, {"double_quant", true},
                  {"lora_r", lora_r}, {"lora_alpha", 16}, {"state_dict_bytes", model_bytes}};
    j["shard_options"] = {{"offload", so.offload}, {"compute_device", "cpu"}, {"gathered_slots", so.gathered_slots}};
    j["build"] = {{"seconds", t_built - t_build}, {"tree_s", t_fill - t_build}, {"fill_s", t_shard - t_fill},
                  {"shard_s", t_built - t_shard}, {"fill_threads", threads}};
    j["manager_memory"] = {{"shard_bytes", ms.shard_bytes}, {"slot_bytes", ms.slot_bytes},
                           {"unit_bytes_max", ms.unit_bytes_max}};
    j["warmup"] = {{"done", warmup}, {"seconds", warm_s}, {"before", memory_json(warm_before)}, {"after", memory_json(warm_after)}};
    j["peak_method"] = method;
    j["max_shard_bytes"] = static_cast<uint64_t>(max_shard_gb * 1e9);
    for (const FormatResult& r : results) {
      const int64_t rise = r.peak() - r.before.rss;
      j["formats"].push_back(
          {{"format", r.format}, {"seconds", r.seconds}, {"bytes", r.report.bytes}, {"tensors", r.report.tensors},
           {"files", r.report.files}, {"disk_bytes", r.disk_bytes}, {"gb_per_s", gb(r.report.bytes) / r.seconds},
           {"peak_unit_bytes", r.report.peak_unit_bytes}, {"hwm_reset", r.hwm_reset}, {"baseline", memory_json(r.before)},
           {"after", memory_json(r.after)}, {"sampled_max", memory_json(r.sampled)}, {"peak_rss", r.peak()},
           {"peak_minus_baseline", rise}, {"anon_peak_minus_baseline", r.sampled.anon - r.before.anon},
           {"file_peak_minus_baseline", r.sampled.file - r.before.file},
           {"rusage_max_rss_before", r.rusage_before}, {"rusage_max_rss_after", r.rusage_after},
           {"peak_minus_baseline_over_unit_bytes_max", static_cast<double>(rise) / ms.unit_bytes_max},
           {"peak_minus_baseline_over_bytes", static_cast<double>(rise) / r.report.bytes}});
    }
    std::ofstream f(json_path);
    f << j.dump(2) << "\n";
    if (!f) throw InputError("--json " + json_path + ": cannot write");
    std::printf("wrote %s\n", json_path.c_str());
  }
  if (!keep && keep_only.empty()) fs::remove_all(out);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_export: time and rank-0 peak host memory of export_model() on an 8B-shaped model"};
  std::string shape = "8b", formats_arg = "bnb4,peft,merged", keep_only_arg, json_path;
  std::string out = (fs::temp_directory_path() / "qshard_bench_export").string();
  int64_t layers = 0, lora_r = 16;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double max_shard_gb = 5.0;
  bool keep = false, no_warmup = false;
  app.add_option("--shape", shape, "8b (Llama-3-8B) | tiny (2 layers, hidden 512)");
  app.add_option("--layers", layers, "override the number of decoder layers")->check(CLI::Range(1, 1000));
  app.add_option("--formats", formats_arg, "comma-separated, run in this order: bnb4,peft,merged");
  app.add_option("--out", out, "work folder (must not exist or be empty; removed at the end unless kept)");
  auto* keep_opt = app.add_flag("--keep", keep, "keep the work folder and every output folder");
  app.add_option("--keep-only", keep_only_arg, "keep only these formats' folders (comma-separated)")->excludes(keep_opt);
  app.add_option("--json", json_path, "write the results as JSON to this file");
  app.add_option("--lora-r", lora_r, "LoRA rank on all seven projections")->check(CLI::Range(1, 4096));
  app.add_option("--threads", threads, "threads that fill the random model (the export runs on one)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--max-shard-gb", max_shard_gb, "split bnb4 / merged files past this size (GB)")
      ->check(CLI::Range(0.001, 1e6));
  app.add_flag("--no-warmup", no_warmup, "do not gather every unit once before the first export");
  CLI11_PARSE(app, argc, argv);

  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  try {
    make_config(shape, layers);  // validates --shape and --layers
    const std::vector<ExportFormat> formats = parse_formats(formats_arg, "--formats");
    const std::vector<ExportFormat> keep_only =
        keep_only_arg.empty() ? std::vector<ExportFormat>{} : parse_formats(keep_only_arg, "--keep-only");
    return run_job(argc, argv, [&](World& world) {
      return run(world, shape, layers, formats, out, keep, keep_only, json_path, lora_r, threads, max_shard_gb,
                 !no_warmup, command);
    });
  } catch (const std::exception& e) {  // flag errors, before MPI starts
    std::fprintf(stderr, "bench_export: %s\n", e.what());
    return 2;
  }
}
