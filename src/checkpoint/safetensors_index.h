// safetensors_index.h: sharded checkpoints (model.safetensors.index.json) and folder views.
//
// What: the Hugging Face layout for weights split over several files:
//   model.safetensors.index.json = {"metadata": {"total_size": N, ...},
//                                   "weight_map": {"<tensor name>": "<file name>", ...}}
//   model-00001-of-00003.safetensors, model-00002-of-00003.safetensors, ...
// total_size is the sum of the tensor byte sizes (transformers' definition); file names are plain
// names inside the same folder (no '/', no ".."). A single-file checkpoint is model.safetensors.
// Other keys in "metadata" and at the top level are ignored (transformers adds some).
//
// plan_shards() decides the split: tensors keep their order, a new file starts when the next
// tensor would push the current one past max_bytes, and a tensor larger than max_bytes gets a
// file of its own (as transformers' shard_checkpoint does). File names follow transformers:
// "<prefix>-00001-of-00003.safetensors" (5 digits), or "<prefix>.safetensors" for one file.
//
// SafetensorsFolder maps every file of a checkpoint (see SafetensorsFile for the mapping rules)
// and answers lookups by tensor name. Ownership: it owns the SafetensorsFiles; spans returned by
// bytes() live as long as the folder. Thread safety: immutable after open(); const methods may be
// called concurrently.
// Errors: bad input is an InputError naming the file (and key or tensor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.h"

namespace qshard {

constexpr const char* kSafetensorsSingleName = "model.safetensors";
constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";

struct SafetensorsIndex {
  uint64_t total_size = 0;
  std::vector<std::pair<std::string, std::string>> weight_map;  // (tensor, file), in file order
};

// Reads and validates an index. InputError naming the path (and key) on bad JSON, missing
// "metadata.total_size" or "weight_map", wrong types, file names containing '/' or "..", empty
// names, or duplicate tensor names.
SafetensorsIndex read_safetensors_index(const std::string& path);
// Writes JSON with indent 2 (metadata first, weight_map in the given order), atomically.
void write_safetensors_index(const std::string& path, const SafetensorsIndex& index);

struct ShardPlan {
  std::vector<std::string> files;       // file names, in order
  std::vector<size_t> file_of_tensor;   // tensor i goes to files[file_of_tensor[i]]
};
// REQUIRES: max_bytes > 0 (Error otherwise). No tensors gives one file "<prefix>.safetensors".
ShardPlan plan_shards(const std::vector<std::pair<std::string, uint64_t>>& tensors, uint64_t max_bytes,
                      const std::string& prefix = "model");

class SafetensorsFolder {
 public:
  // model.safetensors if present (transformers looks for it first), else
  // model.safetensors.index.json with every shard it names. Each tensor listed in the index must
  // be present in its shard. Neither file present: InputError naming the directory (and any
  // other *.safetensors files found there, which open_file() reads).
  static SafetensorsFolder open(const std::string& dir);
  // One file, e.g. ".../adapter_model.safetensors"; dir() is its directory.
  static SafetensorsFolder open_file(const std::string& path);

  bool contains(std::string_view name) const { return find(name) != nullptr; }
  const SafetensorsEntry* find(std::string_view name) const;
  // See SafetensorsFile::get / bytes; InputError naming the folder and the tensor if absent.
  Tensor get(std::string_view name) const;
  std::span<const uint8_t> bytes(std::string_view name) const;
  // SafetensorsFile::release_pages of the file holding `name` (no-op if absent).
  void release_pages(std::string_view name) const {
    if (const SafetensorsFile* f = file_of(name)) f->release_pages(name);
  }
  // All tensor names: index order for a sharded folder, data-offset order for one file.
  std::vector<std::string> names() const { return names_; }
  const std::string& dir() const { return dir_; }
  // The file holding `name` (nullptr if absent).
  const SafetensorsFile* file_of(std::string_view name) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  const SafetensorsFile& require(std::string_view name) const;

  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t, std::less<>> file_index_;  // tensor name -> position in files_
  std::vector<std::string> names_;
};

}  // namespace qshard
