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

// The compute stream a job's DeviceContext would own.
Stream& bench_compute_stream() {
  static Stream s(stream_names::kCompute);
  return s;
}


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

nlohmann::json memory_json(const ProcMemory& m) {
  return {{"rss", m.rss}, {"hwm", m.hwm}, {"anon", m.anon}, {"file", m.file}, {"shmem", m.shmem}};
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

// ---- the run --------------------------------------------------------------------------------

// The resolved flags (see the usage line).
struct BenchOptions {
  std::string shape = "8b";
  int64_t layers = 0;  // 0: the shape's own
  std::vector<ExportFormat> formats = {ExportFormat::kBnb4, ExportFormat::kPeft, ExportFormat::kMerged};
  std::string out = (fs::temp_directory_path() / "qshard_bench_export").string();
  bool keep = false;
  std::vector<ExportFormat> keep_only;
  std::string json_path;
  int64_t lora_r = 16;
  double lora_alpha = 16;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double max_shard_gb = 5.0;
  bool warmup = true;
  std::string command;  // argv, for the record

  bool kept(ExportFormat f) const { return keep || std::find(keep_only.begin(), keep_only.end(), f) != keep_only.end(); }
};

// The sharded model and what building it cost (rank-local; the figures are rank 0's).
struct Model {
  LlamaConfig config;
  std::unique_ptr<Module> tree;
  std::unique_ptr<ShardedParameterManager> mgr;
  ShardedTree units;
  ShardOptions shard_options;
  uint64_t state_dict_bytes = 0;  // every tensor of the tree's state dict, LoRA included
  double tree_s = 0, fill_s = 0, shard_s = 0, warmup_s = 0;
  ProcMemory before_warmup, after_warmup;
};

// build_llama_tree + random values + shard_module_tree + finalize (+ the warm-up pass).
std::unique_ptr<Model> build_model(const BenchOptions& b, Communicator& comm) {
  auto m = std::make_unique<Model>();
  m->config = make_config(b.shape, b.layers);
  double t = now_s();
  LlamaTreeOptions to;
  to.dtype = DType::kBF16;
  to.quant = QuantizeOptions{QuantType::kNf4, 64, true};
  to.lora.r = b.lora_r;
  m->tree = build_llama_tree(m->config, to);
  m->tree_s = now_s() - t;
  t = now_s();
  randomize(*m->tree, "", 1234, b.threads);
  m->fill_s = now_s() - t;
  for (const auto& [k, v] : state_dict(*m->tree)) m->state_dict_bytes += v.nbytes();
  t = now_s();
  m->shard_options.offload_params = m->shard_options.offload_optimizer = true;
  m->shard_options.compute_device = Device::kCpu;
  m->mgr = std::make_unique<ShardedParameterManager>(comm, bench_compute_stream(), m->shard_options);
  m->units = shard_module_tree(*m->tree, *m->mgr, "model.layers");
  m->mgr->finalize();
  m->shard_s = now_s() - t;
  m->before_warmup = m->after_warmup = read_proc_memory();
  if (b.warmup) {
    t = now_s();
    for (int u = 0; u < m->mgr->num_units(); ++u) {
      m->mgr->gather(u);
      m->mgr->release(u);
    }
    m->mgr->compute_stream().synchronize();
    m->warmup_s = now_s() - t;
    trim_heap();
    m->after_warmup = read_proc_memory();
  }
  return m;
}

struct FormatResult {
  ExportFormat format = ExportFormat::kBnb4;
  double seconds = 0;
  ExportReport report;
  uint64_t disk_bytes = 0;
  ProcMemory before, after, sampled;  // sampled: maxima of the polling thread during the export
  bool hwm_reset = false;             // clear_refs worked: after.hwm is this export's peak
  int64_t rusage_before = 0, rusage_after = 0;
  int64_t peak() const { return hwm_reset && after.hwm >= 0 ? after.hwm : sampled.rss; }
  int64_t rise() const { return peak() - before.rss; }
};

// One export_model() call on every rank; rank 0 measures it and deletes the folder unless kept.
FormatResult measure_export(const BenchOptions& b, Model& m, Communicator& comm, ExportFormat f) {
  const bool root = comm.rank() == 0;
  FormatResult r;
  r.format = f;
  ExportOptions o;
  o.out_dir = (fs::path(b.out) / export_format_name(f)).string();
  o.format = f;
  o.r = b.lora_r;
  o.lora_alpha = b.lora_alpha;
  o.max_shard_bytes = static_cast<uint64_t>(b.max_shard_gb * 1e9);
  o.base_model_name_or_path = "qshard/bench-export-" + b.shape;
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
  r.report = export_model(m.mgr->comm(), *m.tree, m.config, *m.mgr, m.units, o);
  r.seconds = now_s() - t0;
  if (root) {
    r.sampled = sampler->stop();
    r.after = read_proc_memory();
    r.rusage_after = rusage_max_rss();
    r.disk_bytes = bytes_on_disk(o.out_dir);
    if (!b.kept(f)) fs::remove_all(o.out_dir);
    std::printf("%-6s %7.2f s  %.3f GB written (%.3f GB on disk, %zu files%s)\n", export_format_name(f), r.seconds,
                gb(r.report.bytes), gb(r.disk_bytes), r.report.files.size(), b.kept(f) ? ", kept" : "");
    std::fflush(stdout);
  }
  comm.barrier();
  return r;
}

std::string peak_method(const std::vector<FormatResult>& results) {
  const bool hwm = std::all_of(results.begin(), results.end(), [](const FormatResult& r) { return r.hwm_reset; });
  return hwm ? "VmHWM of /proc/self/status after writing 5 to /proc/self/clear_refs"
             : "largest VmRSS polled every 2 ms (/proc/self/clear_refs not writable; rusage_max_rss is the "
               "process' lifetime peak)";
}

void print_results(const Model& m, const std::vector<FormatResult>& results) {
  const double unit = static_cast<double>(m.mgr->memory().unit_bytes_max);
  std::printf("\nrank-0 host memory (GB); peak = %s\n", peak_method(results).c_str());
  std::printf("%-6s %8s %7s %7s %10s %9s %9s %10s %10s %11s %9s %9s\n", "format", "time s", "GB out", "GB/s",
              "peak unit", "RSS base", "RSS peak", "peak-base", "anon +max", "file +max", "/ unit", "/ out");
  for (const FormatResult& r : results) {
    const double rise = static_cast<double>(r.rise());
    std::printf("%-6s %8.2f %7.3f %7.3f %10.3f %9.3f %9.3f %10.3f %10.3f %11.3f %9.2f %9.3f\n",
                export_format_name(r.format), r.seconds, gb(r.report.bytes), gb(r.report.bytes) / r.seconds,
                gb(r.report.peak_unit_bytes), gb(r.before.rss), gb(r.peak()), gb(rise),
                gb(r.sampled.anon - r.before.anon), gb(r.sampled.file - r.before.file), rise / unit,
                rise / r.report.bytes);
  }
  std::printf("(peak unit: ExportReport::peak_unit_bytes; anon/file +max: largest RssAnon / RssFile polled minus the "
              "baseline's; / unit: peak-base over the largest unit, %.3f GB; / out: over the format's exported bytes)\n",
              gb(unit));
}

nlohmann::json results_json(const BenchOptions& b, const Model& m, int world_size,
                            const std::vector<FormatResult>& results) {
  const LlamaConfig& c = m.config;
  const ShardMemoryStats ms = m.mgr->memory();
  nlohmann::json j;
  j["bench"] = "export";
  j["date"] = utc_now();
  j["hostname"] = host_name();
  j["cpu_model"] = cpu_model();
  j["cpu_threads"] = std::thread::hardware_concurrency();
  j["mem_total_bytes"] = mem_total_bytes();
  j["command"] = b.command;
  j["world_size"] = world_size;
  j["shape"] = {{"name", b.shape}, {"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                {"intermediate_size", c.intermediate_size}, {"num_hidden_layers", c.num_hidden_layers},
                {"num_attention_heads", c.num_attention_heads}, {"num_key_value_heads", c.num_key_value_heads},
                {"max_position_embeddings", c.max_position_embeddings}, {"rope_theta", c.rope_theta},
                {"tie_word_embeddings", c.tie_word_embeddings}};
  j["model"] = {{"float_dtype", "bfloat16"}, {"quant_type", "nf4"}, {"blocksize", 64}, {"double_quant", true},
                {"lora_r", b.lora_r}, {"lora_alpha", b.lora_alpha}, {"state_dict_bytes", m.state_dict_bytes}};
  j["shard_options"] = {{"offload", m.shard_options.offload_params}, {"compute_device", "cpu"},
                        {"gathered_slots", m.shard_options.gathered_slots}};
  j["build"] = {{"seconds", m.tree_s + m.fill_s + m.shard_s}, {"tree_s", m.tree_s}, {"fill_s", m.fill_s},
                {"shard_s", m.shard_s}, {"fill_threads", b.threads}};
  j["manager_memory"] = {{"shard_bytes", ms.shard_bytes}, {"slot_bytes", ms.slot_bytes},
                         {"unit_bytes_max", ms.unit_bytes_max}};
  j["warmup"] = {{"done", b.warmup}, {"seconds", m.warmup_s}, {"before", memory_json(m.before_warmup)},
                 {"after", memory_json(m.after_warmup)}};
  j["peak_method"] = peak_method(results);
  j["max_shard_bytes"] = static_cast<uint64_t>(b.max_shard_gb * 1e9);
  for (const FormatResult& r : results) {
    j["formats"].push_back(
        {{"format", export_format_name(r.format)}, {"seconds", r.seconds}, {"bytes", r.report.bytes},
         {"tensors", r.report.tensors}, {"files", r.report.files}, {"disk_bytes", r.disk_bytes},
         {"gb_per_s", gb(r.report.bytes) / r.seconds}, {"peak_unit_bytes", r.report.peak_unit_bytes},
         {"hwm_reset", r.hwm_reset}, {"baseline", memory_json(r.before)}, {"after", memory_json(r.after)},
         {"sampled_max", memory_json(r.sampled)}, {"peak_rss", r.peak()}, {"peak_minus_baseline", r.rise()},
         {"anon_peak_minus_baseline", r.sampled.anon - r.before.anon},
         {"file_peak_minus_baseline", r.sampled.file - r.before.file}, {"rusage_max_rss_before", r.rusage_before},
         {"rusage_max_rss_after", r.rusage_after},
         {"peak_minus_baseline_over_unit_bytes_max", static_cast<double>(r.rise()) / ms.unit_bytes_max},
         {"peak_minus_baseline_over_bytes", static_cast<double>(r.rise()) / r.report.bytes}});
  }
  return j;
}

int run(World& world, const BenchOptions& b) {
  const bool root = world.rank() == 0;
  MpiCommunicator comm(world.comm());
  if (root) {
    if (fs::exists(b.out) && !(fs::is_directory(b.out) && fs::is_empty(b.out)))
      throw InputError("--out " + b.out + ": exists and is not an empty folder (the bench removes its work folder; "
                       "choose a new one)");
    fs::create_directories(b.out);
  }
  comm.barrier();
  const std::unique_ptr<Model> m = build_model(b, comm);
  if (root) {
    const LlamaConfig& c = m->config;
    const ShardMemoryStats ms = m->mgr->memory();
    std::string formats;
    for (const ExportFormat f : b.formats) formats += (formats.empty() ? "" : ",") + std::string(export_format_name(f));
    std::printf("bench_export: shape %s (%lld layers, vocab %lld, hidden %lld, intermediate %lld), NF4 bs64 double "
                "quant, bf16 floats, LoRA r=%lld alpha %g on 7 projections; world size %d; formats %s; out %s; "
                "max shard %.3g GB\n",
                b.shape.c_str(), (long long)c.num_hidden_layers, (long long)c.vocab_size, (long long)c.hidden_size,
                (long long)c.intermediate_size, (long long)b.lora_r, b.lora_alpha, comm.size(), formats.c_str(),
                b.out.c_str(), b.max_shard_gb);
    std::printf("build: %.2f s (tree %.2f, random fill %.2f on %d threads, shard+finalize %.2f); model %.3f GB\n",
                m->tree_s + m->fill_s + m->shard_s, m->tree_s, m->fill_s, b.threads, m->shard_s,
                gb(m->state_dict_bytes));
    std::printf("manager (rank 0): shards %.3f GB, gathered slots %.3f GB, largest unit %.3f GB\n", gb(ms.shard_bytes),
                gb(ms.slot_bytes), gb(ms.unit_bytes_max));
    if (b.warmup)
      std::printf("warm-up gather+release of %d units: %.2f s, RSS %.3f -> %.3f GB\n", m->mgr->num_units(),
                  m->warmup_s, gb(m->before_warmup.rss), gb(m->after_warmup.rss));
    std::fflush(stdout);
  }
  std::vector<FormatResult> results;
  for (const ExportFormat f : b.formats) results.push_back(measure_export(b, *m, comm, f));
  if (!root) return 0;
  print_results(*m, results);
  if (!b.json_path.empty()) {
    std::ofstream f(b.json_path);
    f << results_json(b, *m, comm.size(), results).dump(2) << "\n";
    if (!f) throw InputError("--json " + b.json_path + ": cannot write");
    std::printf("wrote %s\n", b.json_path.c_str());
  }
  if (!b.keep && b.keep_only.empty()) fs::remove_all(b.out);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_export: time and rank-0 peak host memory of export_model() on an 8B-shaped model"};
  BenchOptions b;
  std::string formats_arg = "bnb4,peft,merged", keep_only_arg;
  bool no_warmup = false;
  app.add_option("--shape", b.shape, "8b (Llama-3-8B) | tiny (2 layers, hidden 512)");
  app.add_option("--layers", b.layers, "override the number of decoder layers")->check(CLI::Range(1, 1000));
  app.add_option("--formats", formats_arg, "comma-separated, run in this order: bnb4,peft,merged");
  app.add_option("--out", b.out, "work folder (must not exist or be empty; removed at the end unless kept)");
  auto* keep_opt = app.add_flag("--keep", b.keep, "keep the work folder and every output folder");
  app.add_option("--keep-only", keep_only_arg, "keep only these formats' folders (comma-separated)")->excludes(keep_opt);
  app.add_option("--json", b.json_path, "write the results as JSON to this file");
  app.add_option("--lora-r", b.lora_r, "LoRA rank on all seven projections")->check(CLI::Range(1, 4096));
  app.add_option("--threads", b.threads, "threads that fill the random model (the export runs on one)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--max-shard-gb", b.max_shard_gb, "split bnb4 / merged files past this size (GB)")
      ->check(CLI::Range(0.001, 1e6));
  app.add_flag("--no-warmup", no_warmup, "do not gather every unit once before the first export");
  CLI11_PARSE(app, argc, argv);

  for (int i = 0; i < argc; ++i) b.command += (i ? " " : "") + std::string(argv[i]);
  b.warmup = !no_warmup;
  try {
    make_config(b.shape, b.layers);  // validates --shape
    b.formats = parse_formats(formats_arg, "--formats");
    if (!keep_only_arg.empty()) b.keep_only = parse_formats(keep_only_arg, "--keep-only");
  } catch (const std::exception& e) {  // flag errors, before MPI starts
    std::fprintf(stderr, "bench_export: %s\n", e.what());
    return 2;
  }
  return run_job(argc, argv, [&](World& world) { return run(world, b); });
}
