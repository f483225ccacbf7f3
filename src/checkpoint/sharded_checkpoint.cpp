#include "checkpoint/sharded_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "checkpoint/crc32.h"
#include "checkpoint/safetensors.h"
#include "runtime/collective_status.h"
#include "runtime/error.h"
#include "runtime/input_file.h"
#include "runtime/log.h"
#include "runtime/numbers.h"

namespace qshard {
namespace fs = std::filesystem;
namespace {

constexpr const char* kMetadataName = "metadata.json";
constexpr const char* kPartialSuffix = ".partial";

std::string rank_file_name(int rank, int world) {
  char b[64];
  std::snprintf(b, sizeof b, "rank-%05d-of-%05d.safetensors", rank, world);
  return b;
}

// fsync of a directory, so that renames and new entries in it are durable.
void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw InputError(dir.string() + ": cannot open the folder to fsync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0) throw InputError(dir.string() + ": fsync failed: " + std::strerror(e));
}

// Parses "step-<digits>" (exactly; not ".partial"); -1 otherwise.
int64_t step_of_dir_name(const std::string& name) {
  static const std::string p = "step-";
  if (name.rfind(p, 0) != 0 || name.size() == p.size() || name.size() > p.size() + 18) return -1;
  int64_t s = 0;
  for (size_t i = p.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    s = s * 10 + (name[i] - '0');
  }
  return s;
}

// Removes a complete checkpoint so that no crash on the way leaves it looking complete.
void remove_checkpoint_dir(const fs::path& dir) {
  std::error_code ec;
  fs::remove(dir / kMetadataName, ec);
  try {
    fsync_dir(dir);
  } catch (const std::exception&) {
  }
  fs::remove_all(dir, ec);
  if (ec) QS_LOG_WARN("could not remove old checkpoint {}: {}", dir.string(), ec.message());
}

void check_slices(const std::vector<UnitStateShard>& units) {
  for (const auto& u : units) {
    QS_CHECK(u.layout != nullptr, "unit " + u.unit + " has no layout");
    QS_CHECK(u.slices.size() == units.front().slices.size(), "unit " + u.unit + ": every unit needs the same slices");
    for (size_t i = 0; i < u.slices.size(); ++i) {
      const auto& [name, t] = u.slices[i];
      QS_CHECK(name == units.front().slices[i].first, "unit " + u.unit + ": slice names differ across units");
      QS_CHECK(t.dtype() == DType::kF32 && t.numel() * 4 == u.layout->shard_bytes(),
               "unit " + u.unit + " slice " + name + ": expected f32 of the shard size");
    }
  }
}

nlohmann::json units_json(const std::vector<UnitStateShard>& units) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& u : units) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const FlatEntry& e : u.layout->entries()) {
      QS_CHECK(e.dtype == DType::kF32 && e.offset % 4 == 0, "trainable tensor " + e.name + " is not f32-aligned f32");
      tensors.push_back({{"name", e.name}, {"offset", e.offset / 4}, {"shape", e.shape}});
    }
    out.push_back({{"name", u.unit},
                   {"numel", u.layout->total_bytes() / 4},
                   {"shard_numel", u.layout->shard_bytes() / 4},
                   {"tensors", std::move(tensors)}});
  }
  return out;
}

// Checks with a message naming the metadata file.
struct MetaReader {
  std::string label;
  [[noreturn]] void fail(const std::string& what) const { throw InputError(label + ": " + what); }
  const nlohmann::json& field(const nlohmann::json& obj, const char* key, nlohmann::json::value_t type,
                              const std::string& where) const {
    if (!obj.is_object() || !obj.contains(key)) fail(where + "has no '" + key + "'");
    const nlohmann::json& v = obj.at(key);
    const bool ok = type == nlohmann::json::value_t::number_integer ? v.is_number_integer() : v.type() == type;
    if (!ok) fail(where + "'" + key + "' has the wrong type (" + std::string(v.type_name()) + ")");
    return v;
  }
  int64_t integer(const nlohmann::json& obj, const char* key, const std::string& where, int64_t min) const {
    const int64_t v = field(obj, key, nlohmann::json::value_t::number_integer, where).get<int64_t>();
    if (v < min) fail(where + "'" + key + "' is " + std::to_string(v) + ", below " + std::to_string(min));
    return v;
  }
};

void validate_metadata(const nlohmann::json& m, const MetaReader& r) {
  using vt = nlohmann::json::value_t;
  if (!m.is_object()) r.fail("not a JSON object");
  const std::string format = r.field(m, "format", vt::string, "").get<std::string>();
  if (format != kCheckpointFormat) r.fail("format is '" + format + "', expected '" + kCheckpointFormat + "'");
  const int64_t version = r.integer(m, "format_version", "", 1);
  if (version > kCheckpointFormatVersion)
    r.fail("format_version " + std::to_string(version) + " is newer than this qshard reads (" +
           std::to_string(kCheckpointFormatVersion) + ")");
  r.integer(m, "step", "", 0);
  const int64_t world = r.integer(m, "world_size", "", 1);
  // One file a rank (so world_size is bounded by the file's size, and products with it below).
  const auto& files = r.field(m, "files", vt::array, "");
  if (static_cast<int64_t>(files.size()) != world)
    r.fail("lists " + std::to_string(files.size()) + " files for world_size " + std::to_string(world));
  for (const auto& s : r.field(m, "slices", vt::array, ""))
    if (!s.is_string()) r.fail("'slices' holds a non-string");
  for (const auto& u : r.field(m, "units", vt::array, "")) {
    const std::string name = r.field(u, "name", vt::string, "a unit ").get<std::string>();
    const std::string where = "unit '" + name + "' ";
    const int64_t numel = r.integer(u, "numel", where, 0), shard = r.integer(u, "shard_numel", where, 0);
    // A shard is numel / world_size rounded up to 16 bytes a rank (flat_layout.h): at most 4
    // elements more.
    if (shard > numel / world + 4)
      r.fail(where + "shard_numel " + std::to_string(shard) + " is more than numel " + std::to_string(numel) +
             " / world_size " + std::to_string(world) + " padded to 16 bytes");
    int64_t covered = 0;
    if (!__builtin_mul_overflow(shard, world, &covered) && covered < numel)
      r.fail(where + "shard_numel " + std::to_string(shard) + " x world_size " + std::to_string(world) +
             " does not cover numel " + std::to_string(numel));
    for (const auto& t : r.field(u, "tensors", vt::array, where)) {
      r.field(t, "name", vt::string, where + "tensor ");
      r.integer(t, "offset", where + "tensor ", 0);
      for (const auto& d : r.field(t, "shape", vt::array, where + "tensor "))
        if (!d.is_number_integer() || d.get<int64_t>() < 0) r.fail(where + "a tensor shape holds a bad dimension");
    }
  }
  for (int64_t i = 0; i < world; ++i) {
    const auto& f = files[static_cast<size_t>(i)];
    const std::string where = "files[" + std::to_string(i) + "] ";
    if (r.integer(f, "rank", where, 0) != i) r.fail(where + "has rank " + f.at("rank").dump());
    const std::string fname = r.field(f, "name", vt::string, where).get<std::string>();
    if (fname != rank_file_name(static_cast<int>(i), static_cast<int>(world)))
      r.fail(where + "is named '" + fname + "', expected '" + rank_file_name(static_cast<int>(i), static_cast<int>(world)) + "'");
    r.integer(f, "bytes", where, 8);
    const int64_t crc = r.integer(f, "crc32", where, 0);
    if (crc > 0xFFFFFFFFll) r.fail(where + "crc32 is out of range");
  }
  r.field(m, "trainer", vt::object, "");
}

// Test hook: QSHARD_TEST_KILL_DURING_SAVE=RANK:STEP makes that rank die (SIGKILL) halfway through
// writing its file of that step's save; (-1, -1) when unset. Read strictly (numbers.h): a value that
// is not two integers would never fire, and the test that set it would pass for the wrong reason.
std::pair<int64_t, int64_t> kill_during_save_for_test() {
  const char* k = std::getenv("QSHARD_TEST_KILL_DURING_SAVE");
  if (k == nullptr || *k == '\0') return {-1, -1};
  const std::string_view text(k);
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos)
    throw InputError("environment variable QSHARD_TEST_KILL_DURING_SAVE='" + std::string(text) + "': expected RANK:STEP");
  return {parse_int("environment variable QSHARD_TEST_KILL_DURING_SAVE (rank)", text.substr(0, colon), 0, INT32_MAX),
          parse_int("environment variable QSHARD_TEST_KILL_DURING_SAVE (step)", text.substr(colon + 1), 0, INT64_MAX)};
}

// The save's first half on this rank: write the file, checksum it. Returns (bytes, crc32).
std::pair<int64_t, int64_t> write_rank_file(const fs::path& path, const std::vector<UnitStateShard>& units, int rank,
                                            int world, int64_t step) {
  SafetensorsWriter w(path.string());
  size_t tensors = 0;
  for (const auto& u : units)
    for (const auto& [name, t] : u.slices)
      if (t.numel() > 0) {
        w.declare(u.unit + "/" + name, DType::kF32, {t.numel()});
        ++tensors;
      }
  w.begin({{"format", kCheckpointFormat},
           {"rank", std::to_string(rank)},
           {"world_size", std::to_string(world)},
           {"step", std::to_string(step)}});
  const auto [kill_rank, kill_step] = kill_during_save_for_test();
  size_t written = 0;
  for (const auto& u : units)
    for (const auto& [name, t] : u.slices) {
      if (t.numel() == 0) continue;
      if (kill_rank == rank && kill_step == step && written == tensors / 2) {
        QS_LOG_WARN("QSHARD_TEST_KILL_DURING_SAVE: rank {} kills itself while saving step {}", rank, step);
        std::raise(SIGKILL);
      }
      const Tensor host = t.device() == Device::kCpu ? t : t.to(Device::kCpu);
      w.write(u.unit + "/" + name, host.bytes());
      ++written;
    }
  w.finish();
  return {static_cast<int64_t>(w.file_size()), static_cast<int64_t>(crc32_file(path.string()))};
}

// Unit u's flat elements [a, b) of `slice`, staged at staging[p - first] (p: the element in the
// unit's flat buffer), must be finite: else an InputError naming the file that holds the first
// NaN / Inf (saved shards of s_old elements), the slice, the tensor and the index in it.
void refuse_nonfinite(const UnitStateShard& u, const std::string& slice, const std::vector<float>& staging, int64_t a,
                      int64_t b, int64_t first, int64_t s_old, const nlohmann::json& files, const std::string& dir) {
  int64_t count = 0, at = -1;
  for (int64_t p = a; p < b; ++p)
    if (!std::isfinite(staging[static_cast<size_t>(p - first)]) && count++ == 0) at = p;
  if (count == 0) return;
  std::string tensor = "(padding)";
  int64_t index = at;
  for (const FlatEntry& e : u.layout->entries())
    if (at >= e.offset / 4 && at < (e.offset + e.nbytes) / 4) {
      tensor = e.name;
      index = at - e.offset / 4;
      break;
    }
  const std::string file = (fs::path(dir) / files[static_cast<size_t>(at / s_old)].at("name").get<std::string>()).string();
  throw InputError("checkpoint file " + file + ": slice '" + slice + "' of '" + tensor + "' holds NaN/Inf (the first at flat index " +
                   std::to_string(index) + "; " + std::to_string(count) + " in this rank's part of unit '" + u.unit +
                   "'); refusing to resume from it (--allow-nonfinite to load it anyway)");
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char b[40];
  std::snprintf(b, sizeof b, "step-%08lld", static_cast<long long>(step));
  return b;
}

std::string save_sharded_checkpoint(Communicator& comm, const std::vector<UnitStateShard>& units,
                                    const CheckpointSaveOptions& o) {
  check_slices(units);
  QS_CHECK(!o.root.empty(), "checkpoint root is empty");
  const int rank = comm.rank(), world = comm.size();
  const fs::path root(o.root), final_dir = root / checkpoint_dir_name(o.step),
      partial = root / (checkpoint_dir_name(o.step) + kPartialSuffix);

  // ---- rank 0 prepares the partial folder ----
  std::string err;
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(root, ec);
    if (ec) err = "checkpoint.dir " + o.root + ": cannot create it: " + ec.message();
    if (err.empty()) {
      fs::remove_all(partial, ec);
      if (!ec) fs::create_directory(partial, ec);
      if (ec) err = "checkpoint.dir " + o.root + ": cannot create " + partial.string() + ": " + ec.message();
    }
  }
  throw_if_any_failed(comm, err);

  // ---- every rank writes and checksums its file ----
  std::pair<int64_t, int64_t> mine{0, 0};
  try {
    mine = write_rank_file(partial / rank_file_name(rank, world), units, rank, world, o.step);
  } catch (const std::exception& e) {
    err = "saving checkpoint step " + std::to_string(o.step) + ": " + e.what();
  }
  // Agreement doubles as the barrier before the metadata: every file is complete past this point.
  try {
    throw_if_any_failed(comm, err);
  } catch (...) {
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(partial, ec);
    }
    throw;
  }
  std::vector<int64_t> all(static_cast<size_t>(2 * world));
  const int64_t send[2] = {mine.first, mine.second};
  comm.all_gather(send, all.data(), 2, DType::kI64, nullptr);

  // ---- rank 0: metadata last, then the rename, then keep-last ----
  if (rank == 0) {
    try {
      nlohmann::json files = nlohmann::json::array();
      for (int r = 0; r < world; ++r)
        files.push_back({{"rank", r}, {"name", rank_file_name(r, world)}, {"bytes", all[2 * r]}, {"crc32", all[2 * r + 1]}});
      nlohmann::json slices = nlohmann::json::array();
      if (!units.empty())
        for (const auto& sl : units.front().slices) slices.push_back(sl.first);
      const nlohmann::json meta = {{"format", kCheckpointFormat}, {"format_version", kCheckpointFormatVersion},
                                   {"step", o.step},           {"world_size", world},
                                   {"slices", slices},         {"units", units_json(units)},
                                   {"files", files},           {"trainer", o.trainer}};
      write_file_atomic((partial / kMetadataName).string(), meta.dump(1) + "\n");
      fsync_dir(partial);
      std::error_code ec;
      const fs::path replaced = root / (checkpoint_dir_name(o.step) + ".replaced");
      const bool had = fs::exists(final_dir);
      if (had) {
        fs::remove_all(replaced, ec);
        fs::rename(final_dir, replaced, ec);
        if (ec) throw InputError("cannot move the old " + final_dir.string() + " aside: " + ec.message());
      }
      fs::rename(partial, final_dir, ec);
      if (ec) throw InputError("cannot rename " + partial.string() + " to " + final_dir.string() + ": " + ec.message());
      fsync_dir(root);
      if (had) remove_checkpoint_dir(replaced);
      // keep the newest keep_last, drop stale partial folders
      const auto complete = list_checkpoints(o.root);
      if (o.keep_last > 0 && static_cast<int64_t>(complete.size()) > o.keep_last)
        for (size_t i = 0; i + static_cast<size_t>(o.keep_last) < complete.size(); ++i)
          if (complete[i].first != o.step) remove_checkpoint_dir(complete[i].second);
      for (const auto& e : fs::directory_iterator(root, ec)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && n.size() > std::strlen(kPartialSuffix) &&
            n.ends_with(kPartialSuffix) && step_of_dir_name(n.substr(0, n.size() - std::strlen(kPartialSuffix))) >= 0)
          fs::remove_all(e.path(), ec);
      }
    } catch (const std::exception& e) {
      err = "saving checkpoint step " + std::to_string(o.step) + ": " + e.what();
      std::error_code ec;
      fs::remove_all(partial, ec);
    } catch (...) {
      err = "saving checkpoint step " + std::to_string(o.step) + ": unknown error";
    }
  }
  throw_if_any_failed(comm, err);
  return final_dir.string();
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t s = step_of_dir_name(e.path().filename().string());
    if (s >= 0 && e.is_directory() && fs::exists(e.path() / kMetadataName)) out.emplace_back(s, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

CheckpointInfo read_checkpoint_metadata(const std::string& path) {
  fs::path dir(path);
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw InputError("checkpoint " + path + ": no such file or folder");
  check_input_folder(path, "checkpoint");  // a regular file, FIFO or device: named
  if (!fs::exists(dir / kMetadataName)) {
    const auto found = list_checkpoints(path);
    if (!found.empty()) {
      dir = found.back().second;
    } else {
      const std::string name = dir.filename().string();
      if (name.ends_with(kPartialSuffix) || step_of_dir_name(name) >= 0)
        throw InputError("checkpoint " + path + ": incomplete (no " + kMetadataName +
                         "): a save that did not finish; it is never loaded");
      throw InputError("checkpoint " + path + ": neither a checkpoint (no " + kMetadataName +
                       ") nor a folder holding complete step-N checkpoints");
    }
  }
  const std::string meta_path = (dir / kMetadataName).string();
  const std::string text = read_input_file(meta_path, "checkpoint metadata");
  CheckpointInfo info;
  info.dir = dir.string();
  info.metadata = parse_json_strict(text, meta_path);
  validate_metadata(info.metadata, MetaReader{meta_path});
  info.step = info.metadata.at("step").get<int64_t>();
  info.world_size = info.metadata.at("world_size").get<int>();
  if (step_of_dir_name(dir.filename().string()) != info.step)
    throw InputError(meta_path + ": step " + std::to_string(info.step) + " does not match the folder name " +
                     dir.filename().string());
  return info;
}

void load_sharded_checkpoint(Communicator& comm, const CheckpointInfo& info, const std::vector<UnitStateShard>& units,
                             bool allow_nonfinite) {
  check_slices(units);
  const int rank = comm.rank(), world = comm.size();
  const nlohmann::json& m = info.metadata;
  const std::string meta_path = (fs::path(info.dir) / kMetadataName).string();
  const int old_world = info.world_size;
  const auto& files = m.at("files");

  // staging[u][s]: this rank's new shard of slice s of unit u
  std::vector<std::vector<std::vector<float>>> staging(units.size());
  std::string err;
  try {
    // ---- the model must be the one saved ----
    const auto& saved_units = m.at("units");
    std::set<std::string> saved_slices;
    for (const auto& s : m.at("slices")) saved_slices.insert(s.get<std::string>());
    if (saved_units.size() != units.size())
      throw InputError(meta_path + ": the checkpoint holds " + std::to_string(saved_units.size()) +
                       " units, this model " + std::to_string(units.size()) + ": a different model");
    for (size_t i = 0; i < units.size(); ++i) {
      const auto& su = saved_units[i];
      const UnitStateShard& u = units[i];
      const std::string where = meta_path + ": unit " + std::to_string(i) + " ('" + su.at("name").get<std::string>() + "')";
      if (su.at("name").get<std::string>() != u.unit)
        throw InputError(where + " is '" + u.unit + "' in this model: a different model");
      const auto& st = su.at("tensors");
      const auto& entries = u.layout->entries();
      if (st.size() != entries.size())
        throw InputError(where + " holds " + std::to_string(st.size()) + " trainable tensors, this model " +
                         std::to_string(entries.size()) + " (another LoRA rank or target_modules?)");
      for (size_t k = 0; k < entries.size(); ++k) {
        const auto& t = st[k];
        if (t.at("name").get<std::string>() != entries[k].name || t.at("shape").get<Shape>() != entries[k].shape)
          throw InputError(where + ": tensor '" + t.at("name").get<std::string>() + "' " + t.at("shape").dump() +
                           " does not match this model's '" + entries[k].name + "' (another LoRA rank or model?)");
        // Elements, compared as elements (a byte count x 4 could wrap and match).
        if (t.at("offset").get<int64_t>() != entries[k].offset / 4)
          throw InputError(where + ": tensors[" + std::to_string(k) + "] ('" + entries[k].name + "') offset " +
                           t.at("offset").dump() + " differs from this model's " +
                           std::to_string(entries[k].offset / 4) + ": the slices would be read from other elements");
      }
      if (su.at("numel").get<int64_t>() != u.layout->total_bytes() / 4)
        throw InputError(where + ": numel " + su.at("numel").dump() + " differs from this model's " +
                         std::to_string(u.layout->total_bytes() / 4));
      for (const auto& [name, t] : u.slices)
        if (!saved_slices.count(name)) throw InputError(meta_path + ": the checkpoint has no slice '" + name + "'");
    }

    // ---- which saved files this rank reads; verify them (size, CRC, structure) ----
    // Per unit: this rank's new flat range [a, b) (clipped to numel) and the shard sizes.
    struct Range {
      int64_t a, b, s_new, s_old;
    };
    std::vector<Range> ranges;
    for (size_t i = 0; i < units.size(); ++i) {
      const int64_t numel = units[i].layout->total_bytes() / 4, s_new = units[i].layout->shard_bytes() / 4;
      ranges.push_back({std::min(numel, rank * s_new), std::min(numel, (rank + 1) * s_new), s_new,
                        saved_units[i].at("shard_numel").get<int64_t>()});  // s_old > 0 when numel > 0
    }
    std::set<int> need;
    for (int f = rank; f < old_world; f += world) need.insert(f);
    for (const Range& r : ranges)
      if (r.a < r.b)
        for (int64_t f = r.a / r.s_old; f <= (r.b - 1) / r.s_old; ++f) need.insert(static_cast<int>(f));
    std::map<int, SafetensorsFile> open_files;
    for (int f : need) {
      const auto& fe = files[static_cast<size_t>(f)];
      const std::string p = (fs::path(info.dir) / fe.at("name").get<std::string>()).string();
      check_input_file(p, "checkpoint file");  // a FIFO would block the CRC's read for ever
      std::error_code ec;
      const auto size = fs::file_size(p, ec);
      if (ec) throw InputError("checkpoint file " + p + ": " + ec.message() + " (listed in " + meta_path + ")");
      if (static_cast<int64_t>(size) != fe.at("bytes").get<int64_t>())
        throw InputError("checkpoint file " + p + ": " + std::to_string(size) + " bytes, " + meta_path + " says " +
                         fe.at("bytes").dump() + ": truncated or replaced; refusing to load");
      const uint32_t crc = crc32_file(p);
      if (crc != fe.at("crc32").get<uint32_t>())
        throw InputError("checkpoint file " + p + ": CRC-32 " + std::to_string(crc) + " but " + meta_path + " says " +
                         fe.at("crc32").dump() + ": the file is corrupted; refusing to load");
      SafetensorsFile sf = SafetensorsFile::open(p);
      const auto& md = sf.metadata();
      auto mdv = [&](const char* k) { auto it = md.find(k); return it == md.end() ? std::string("(none)") : it->second; };
      if (mdv("format") != kCheckpointFormat || mdv("rank") != std::to_string(f) ||
          mdv("world_size") != std::to_string(old_world) || mdv("step") != std::to_string(info.step))
        throw InputError("checkpoint file " + p + ": its header says rank " + mdv("rank") + " of " + mdv("world_size") +
                         ", step " + mdv("step") + "; expected rank " + std::to_string(f) + " of " +
                         std::to_string(old_world) + ", step " + std::to_string(info.step) + " (a file from another save?)");
      open_files.emplace(f, std::move(sf));
    }

    // ---- copy the overlapping pieces into staging ----
    for (size_t i = 0; i < units.size(); ++i) {
      const UnitStateShard& u = units[i];
      const auto [a, b, S_new, S_old] = ranges[i];
      staging[i].resize(u.slices.size());
      for (size_t s = 0; s < u.slices.size(); ++s) {
        std::vector<float>& dst = staging[i][s];
        dst.assign(static_cast<size_t>(S_new), 0.0f);
        if (a >= b) continue;
        const std::string tname = u.unit + "/" + u.slices[s].first;
        for (int64_t f = a / S_old; f <= (b - 1) / S_old; ++f) {
          const SafetensorsFile& sf = open_files.at(static_cast<int>(f));
          const SafetensorsEntry* e = sf.find(tname);
          if (!e) throw InputError("checkpoint file " + sf.path() + ": no tensor '" + tname + "'");
          if (e->dtype != DType::kF32 || e->shape != Shape{S_old})
            throw InputError("checkpoint file " + sf.path() + ": tensor '" + tname + "' is not F32 [" +
                             std::to_string(S_old) + "]");
          const std::span<const uint8_t> src = sf.bytes(tname);
          const int64_t lo = std::max(a, f * S_old), hi = std::min(b, (f + 1) * S_old);
          std::memcpy(dst.data() + (lo - rank * S_new), src.data() + (lo - f * S_old) * 4,
                      static_cast<size_t>(hi - lo) * 4);
        }
        if (!allow_nonfinite) refuse_nonfinite(u, u.slices[s].first, dst, a, b, rank * S_new, S_old, files, info.dir);
      }
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  throw_if_any_failed(comm, err);

  // ---- every rank verified its part: apply ----
  for (size_t i = 0; i < units.size(); ++i)
    for (size_t s = 0; s < units[i].slices.size(); ++s) {
      Tensor dst = units[i].slices[s].second;
      const std::vector<float>& src = staging[i][s];
      copy_bytes(dst.raw(), dst.device(), src.data(), Device::kCpu, src.size() * 4);
    }
}

}  // namespace qshard
