// inspect.h: what `qshard inspect PATH [--check]` reports for a safetensors file, a Hugging Face
// folder (plain or bitsandbytes 4-bit) or a folder of safetensors files.
//
// Every tensor key with its dtype, shape and bytes, and the node it resolves to: through the Llama
// module tree built from config.json when the folder has one, else through a tree built from the
// keys themselves (tree_from_keys). Problems collected (never thrown): a file that fails
// validation, a config that does not parse, a tensor the config needs that is missing or has the
// wrong shape, a key that does not resolve, a key that resolves to other bytes than stored.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace qshard {

struct InspectRow {
  std::string key;
  std::string dtype;
  Shape shape;
  uint64_t bytes = 0;
  std::string node;       // description of the resolved node, or the resolve error
  bool resolved = false;
  bool bytes_match = false;
};

struct InspectReport {
  std::string path;
  std::string kind;  // "safetensors file", "Hugging Face folder", "bitsandbytes 4-bit folder", ...
  std::vector<InspectRow> rows;
  std::vector<std::string> problems;
  bool ok() const { return problems.empty(); }
};

InspectReport inspect_path(const std::string& path);

}  // namespace qshard
