#include "checkpoint/inspect.h"

#include <cstring>
#include <filesystem>
#include <utility>

#include "checkpoint/llama_loader.h"
#include "checkpoint/nonfinite.h"
#include "checkpoint/safetensors_index.h"
#include "runtime/input_file.h"

namespace qshard {
namespace fs = std::filesystem;

namespace {

void fill_rows(InspectReport& rep, const SafetensorsFolder& folder, const Module& tree) {
  for (const std::string& key : folder.names()) {
    const SafetensorsEntry& e = *folder.find(key);
    InspectRow row{key, e.dtype_name, e.shape, e.nbytes(), "", false, false};
    if (!is_valid_fqn(key)) {
      row.node = "key '" + key + "' has an empty name part: no module tree (PyTorch's or qshard's) can hold it";
      rep.problems.push_back(row.node);
      rep.rows.push_back(std::move(row));
      continue;
    }
    try {
      const Resolved r = resolve(tree, key);
      row.resolved = true;
      row.node = r.describe();
      const auto stored = folder.bytes(key);
      Tensor t = r.tensor.device() == Device::kCpu ? r.tensor : r.tensor.to(Device::kCpu);
      row.bytes_match = t.defined() && t.nbytes() == stored.size() &&
                        (stored.empty() || std::memcmp(t.raw(), stored.data(), stored.size()) == 0);
      if (!row.bytes_match) rep.problems.push_back(key + ": resolves to " + row.node + ", whose bytes differ from the file's");
    } catch (const InputError& err) {
      row.node = err.what();
      rep.problems.push_back(err.what());
    }
    rep.rows.push_back(std::move(row));
  }
}

// Float tensors holding NaN / Inf, one problem each (the Llama folder's loader refuses them itself):
// a single file, an adapter or a folder without config.json is checked as a model folder is.
void report_nonfinite(InspectReport& rep, const SafetensorsFolder& folder) {
  for (const std::string& key : folder.names()) {
    const NonfiniteCount n = count_nonfinite(folder.get(key));
    if (n.count > 0)
      rep.problems.push_back("tensor '" + key + "' holds " + std::to_string(n.count) +
                             " NaN/Inf values (the first at flat index " + std::to_string(n.first) + ")");
  }
}

std::unique_ptr<Module> generic_tree(const SafetensorsFolder& folder) {
  const TensorLookup lookup = [&folder](const std::string& k) -> std::optional<Tensor> {
    if (!folder.contains(k)) return std::nullopt;
    return folder.get(k);
  };
  return tree_from_keys(folder.names(), lookup, folder.dir());
}

// A path, or a folder's config.json / weights / index, that is a FIFO, folder or device where a
// file belongs is bad input (exit 2), refused before anything is opened, not a problem of the report.
void check_special_files(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return;  // reported below
  if (!fs::is_directory(path, ec)) {
    check_input_file(path, "safetensors file");
    return;
  }
  const std::pair<const char*, const char*> files[] = {
      {"config.json", "model config"}, {kSafetensorsSingleName, "safetensors file"}, {kSafetensorsIndexName, "safetensors index"}};
  for (const auto& [name, role] : files) {
    const fs::path p = fs::path(path) / name;
    if (fs::exists(fs::symlink_status(p, ec))) check_input_file(p.string(), role);
  }
}

}  // namespace

InspectReport inspect_path(const std::string& path) {
  InspectReport rep;
  rep.path = path;
  check_special_files(path);
  try {
    if (!fs::exists(path)) {
      rep.problems.push_back(path + ": no such file or folder");
      return rep;
    }
    if (!fs::is_directory(path)) {
      rep.kind = "safetensors file";
      const SafetensorsFolder folder = SafetensorsFolder::open_file(path);
      fill_rows(rep, folder, *generic_tree(folder));
      report_nonfinite(rep, folder);
      return rep;
    }
    const bool has_config = fs::exists(fs::path(path) / "config.json");
    const bool has_weights = fs::exists(fs::path(path) / kSafetensorsSingleName) ||
                             fs::exists(fs::path(path) / kSafetensorsIndexName);
    if (!has_weights) {
      // A folder with one other safetensors file (a PEFT adapter, say).
      std::vector<fs::path> files;
      for (const auto& e : fs::directory_iterator(path))
        if (e.path().extension() == ".safetensors") files.push_back(e.path());
      if (files.size() != 1) {
        rep.problems.push_back(path + ": no model.safetensors, no " + kSafetensorsIndexName + " and " +
                               std::to_string(files.size()) + " other .safetensors files");
        return rep;
      }
      rep.kind = "safetensors file";
      const SafetensorsFolder folder = SafetensorsFolder::open_file(files[0].string());
      fill_rows(rep, folder, *generic_tree(folder));
      report_nonfinite(rep, folder);
      return rep;
    }
    const SafetensorsFolder folder = SafetensorsFolder::open(path);
    if (has_config) {
      try {
        LoadedLlama m = load_llama_folder(path);
        rep.kind = m.config.quantized ? "bitsandbytes 4-bit folder (Llama)" : "Hugging Face folder (Llama)";
        fill_rows(rep, folder, *m.tree);
        return rep;
      } catch (const InputError& e) {
        rep.problems.push_back(e.what());
      }
    } else {
      rep.problems.push_back(path + ": no config.json; keys checked against their own tree only");
    }
    rep.kind = "safetensors folder";
    fill_rows(rep, folder, *generic_tree(folder));
    if (!has_config) report_nonfinite(rep, folder);  // else the loader's refusal is the problem above
  } catch (const InputError& e) {
    rep.problems.push_back(e.what());
  }
  return rep;
}

}  // namespace qshard
