#include "checkpoint/safetensors_index.h"
#include "runtime/input_file.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

namespace qshard {

namespace {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

const ojson* index_member(const ojson& obj, std::string_view key) {
  for (const auto& [k, v] : obj.items())
    if (k == key) return &v;
  return nullptr;
}

bool is_plain_file_name(std::string_view f) {
  return !f.empty() && f.find('/') == std::string_view::npos && f.find('\\') == std::string_view::npos &&
         f.find("..") == std::string_view::npos && f.find('\0') == std::string_view::npos;
}

}  // namespace

SafetensorsIndex read_safetensors_index(const std::string& path) {
  const ojson root = parse_json_strict(read_input_file(path, "safetensors index"), path);
  if (!root.is_object()) throw InputError(fmt::format("{}: expected a JSON object, got {}", path, root.type_name()));

  SafetensorsIndex index;
  const ojson* meta = index_member(root, "metadata");
  if (!meta || !meta->is_object())
    throw InputError(fmt::format("{}: expected \"metadata\": {{\"total_size\": N}}, {}", path,
                                 meta ? std::string("got ") + meta->type_name() : std::string("missing")));
  const ojson* total = index_member(*meta, "total_size");
  if (!total) throw InputError(fmt::format("{}: missing \"metadata.total_size\"", path));
  if (total->is_number_unsigned()) {
    index.total_size = total->get<uint64_t>();
  } else if (total->is_number_float() && total->get<double>() >= 0 && total->get<double>() < 0x1p64 &&
             std::floor(total->get<double>()) == total->get<double>()) {
    index.total_size = static_cast<uint64_t>(total->get<double>());  // some tools write 1.2e10
  } else {
    throw InputError(fmt::format("{}: \"metadata.total_size\" must be a non-negative integer, got {}", path,
                                 total->dump()));
  }

  const ojson* map = index_member(root, "weight_map");
  if (!map) throw InputError(fmt::format("{}: missing \"weight_map\"", path));
  if (!map->is_object())
    throw InputError(fmt::format("{}: \"weight_map\" must be an object {{tensor: file}}, got {}", path,
                                 map->type_name()));
  index.weight_map.reserve(map->size());
  for (const auto& [name, file] : map->items()) {
    if (!file.is_string())
      throw InputError(fmt::format("{}: weight_map[\"{}\"] must be a file name string, got {}", path, name,
                                   file.type_name()));
    const std::string f = file.get<std::string>();
    if (!is_plain_file_name(f))
      throw InputError(fmt::format("{}: weight_map[\"{}\"] = \"{}\": expected a plain file name in the same folder "
                                   "(non-empty, no '/', '\\' or \"..\")",
                                   path, name, f));
    index.weight_map.emplace_back(name, f);  // duplicates were rejected by parse_json_strict
  }
  return index;
}

void write_safetensors_index(const std::string& path, const SafetensorsIndex& index) {
  ojson root = ojson::object();
  root["metadata"] = ojson::object({{"total_size", index.total_size}});
  ojson map = ojson::object();
  auto& items = map.get_ref<ojson::object_t&>();
  std::map<std::string_view, int> seen;
  for (const auto& [name, file] : index.weight_map) {
    if (!seen.emplace(name, 0).second)
      throw Error(fmt::format("write_safetensors_index({}): tensor \"{}\" listed twice", path, name));
    if (!is_plain_file_name(file))
      throw Error(fmt::format("write_safetensors_index({}): tensor \"{}\": \"{}\" is not a plain file name", path,
                              name, file));
    // Uniqueness checked above; append without ordered_map's linear search.
    static_cast<std::vector<std::pair<const std::string, ojson>>&>(items).emplace_back(name, file);
  }
  root["weight_map"] = std::move(map);
  std::string text;
  try {
    text = root.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {  // names that are not UTF-8
    throw Error(fmt::format("write_safetensors_index({}): {}", path, e.what()));
  }
  write_file_atomic(path, text);
}

ShardPlan plan_shards(const std::vector<std::pair<std::string, uint64_t>>& tensors, uint64_t max_bytes,
                      const std::string& prefix) {
  if (max_bytes == 0) throw Error("plan_shards: max_bytes must be > 0");
  ShardPlan plan;
  plan.file_of_tensor.reserve(tensors.size());
  size_t nfiles = 1;
  uint64_t current = 0;  // bytes in the current file
  bool current_empty = true;
  for (const auto& [name, nbytes] : tensors) {
    const bool fits = nbytes <= max_bytes && current <= max_bytes - nbytes;
    if (!current_empty && !fits) {
      ++nfiles;
      current = 0;
      current_empty = true;
    }
    plan.file_of_tensor.push_back(nfiles - 1);
    current += nbytes;  // a single oversized tensor may exceed max_bytes; the next starts a file
    current_empty = false;
  }
  if (nfiles == 1) {
    plan.files.push_back(prefix + ".safetensors");
  } else {
    for (size_t i = 0; i < nfiles; ++i)
      plan.files.push_back(fmt::format("{}-{:05d}-of-{:05d}.safetensors", prefix, i + 1, nfiles));
  }
  return plan;
}

// ---- SafetensorsFolder -----------------------------------------------------------------------

SafetensorsFolder SafetensorsFolder::open(const std::string& dir) {
  const fs::path d(dir);
  std::error_code ec;
  if (fs::exists(d, ec)) check_input_folder(dir, "safetensors folder");  // a file, FIFO or device: named
  if (!fs::is_directory(d, ec))
    throw InputError(fmt::format("{}: not a directory (expected a folder with {} or {})", dir, kSafetensorsSingleName,
                                 kSafetensorsIndexName));
  if (fs::exists(d / kSafetensorsSingleName, ec)) {
    SafetensorsFolder f = open_file((d / kSafetensorsSingleName).string());
    f.dir_ = dir;
    return f;
  }
  const fs::path index_path = d / kSafetensorsIndexName;
  if (!fs::exists(index_path, ec)) {
    std::string others;
    for (const auto& e : fs::directory_iterator(d, ec)) {
      if (e.path().extension() == ".safetensors") others += (others.empty() ? "" : ", ") + e.path().filename().string();
    }
    throw InputError(fmt::format("{}: neither {} nor {} found{}", dir, kSafetensorsSingleName, kSafetensorsIndexName,
                                 others.empty() ? std::string()
                                                : " (other .safetensors files: " + others +
                                                      "; open one with SafetensorsFolder::open_file)"));
  }

  const SafetensorsIndex index = read_safetensors_index(index_path.string());
  SafetensorsFolder f;
  f.dir_ = dir;
  std::map<std::string, size_t> file_pos;
  for (const auto& [name, file] : index.weight_map) {
    auto it = file_pos.find(file);
    if (it == file_pos.end()) {
      const fs::path shard = d / file;
      if (!fs::exists(shard, ec))
        throw InputError(fmt::format("{}: shard \"{}\" (holding tensor \"{}\") is missing: {} does not exist",
                                     index_path.string(), file, name, shard.string()));
      f.files_.push_back(SafetensorsFile::open(shard.string()));
      it = file_pos.emplace(file, f.files_.size() - 1).first;
    }
    const SafetensorsFile& sf = f.files_[it->second];
    if (!sf.contains(name))
      throw InputError(fmt::format("{}: tensor \"{}\" is listed in shard \"{}\" but {} has no such tensor",
                                   index_path.string(), name, file, sf.path()));
    f.file_index_.emplace(name, it->second);
    f.names_.push_back(name);
  }
  return f;
}

SafetensorsFolder SafetensorsFolder::open_file(const std::string& path) {
  SafetensorsFolder f;
  f.dir_ = fs::path(path).parent_path().string();
  if (f.dir_.empty()) f.dir_ = ".";
  f.files_.push_back(SafetensorsFile::open(path));
  for (const SafetensorsEntry& e : f.files_[0].entries()) {
    f.file_index_.emplace(e.name, 0);
    f.names_.push_back(e.name);
  }
  return f;
}

const SafetensorsFile* SafetensorsFolder::file_of(std::string_view name) const {
  const auto it = file_index_.find(name);
  return it == file_index_.end() ? nullptr : &files_[it->second];
}

const SafetensorsEntry* SafetensorsFolder::find(std::string_view name) const {
  const SafetensorsFile* f = file_of(name);
  return f ? f->find(name) : nullptr;
}

const SafetensorsFile& SafetensorsFolder::require(std::string_view name) const {
  const SafetensorsFile* f = file_of(name);
  if (!f) throw InputError(fmt::format("{}: no tensor named \"{}\" in this checkpoint ({} tensors)", dir_, name,
                                       names_.size()));
  return *f;
}

Tensor SafetensorsFolder::get(std::string_view name) const { return require(name).get(name); }

std::span<const uint8_t> SafetensorsFolder::bytes(std::string_view name) const { return require(name).bytes(name); }

}  // namespace qshard
