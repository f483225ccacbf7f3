// sharded_checkpoint.h: resumable training checkpoints, written by every rank in parallel and
// loadable at any world size (issue 6).
//
// What is saved: per FSDP unit, named f32 slices of this rank's trainable shard ("master" = the
// fp32 LoRA weights, "exp_avg" / "exp_avg_sq" = AdamW's moments), each shard_numel floats (the
// unit's kTrainable FlatLayout: entries at world-independent offsets, padded to a multiple of the
// world size), plus an opaque JSON object from the trainer (config, data position, scheduler, RNG,
// history), identical on every rank.
//
// Layout on disk (root = checkpoint.dir):
//   root/step-00000015/                          a complete checkpoint (step 15)
//     rank-00000-of-00002.safetensors            rank 0's slices: "<unit>/<slice>" F32 [shard_numel]
//     rank-00001-of-00002.safetensors              (__metadata__: format, rank, world_size, step)
//     metadata.json                              written last (below)
//   root/step-00000020.partial/                  a save in progress or one that died: never loaded
// metadata.json:
//   {"format": "qshard.train_checkpoint", "format_version": 1, "step": 15, "world_size": 2,
//    "slices": ["master", "exp_avg", "exp_avg_sq"],
//    "units": [{"name": "model.layers.0", "numel": N, "shard_numel": S,
//               "tensors": [{"name": "model.layers.0.self_attn.q_proj.lora_A.weight",
//                            "offset": 0, "shape": [8, 64]}, ...]}, ...],
//    "files": [{"rank": 0, "name": "rank-00000-of-00002.safetensors", "bytes": B, "crc32": C}, ...],
//    "trainer": {...}}
// numel: f32 elements of the unit's unpadded flat buffer (world-independent); offset: a tensor's
// first element in it; crc32: zlib's CRC-32 of the whole file (checkpoint/crc32.h).
//
// Save protocol (save_sharded_checkpoint, collective): rank 0 creates root/step-N.partial (an old
// one of the same name is removed); every rank writes its file there (temp + fsync + rename, the
// safetensors writer) and checksums it; the ranks agree on success (a failure on any rank, e.g.
// an unwritable or full destination, throws InputError on every rank and rank 0 removes the
// partial folder: earlier checkpoints are untouched); the (bytes, crc32) pairs are gathered to
// rank 0, which writes metadata.json (temp + fsync + rename), fsyncs the folder, renames it to
// root/step-N (an existing step-N is replaced only after the new one is complete) and fsyncs
// root. Then rank 0 keeps the newest keep_last checkpoints (0: all) and removes stale *.partial
// folders; a removed checkpoint loses its metadata.json first, so a crash while deleting never
// leaves a loadable-looking folder with missing files.
// A rank killed during a save leaves step-N.partial without metadata.json: list_checkpoints()
// and read_checkpoint_metadata() ignore or refuse it, and the previous checkpoint stays loadable.
// Test hook: with QSHARD_TEST_KILL_DURING_SAVE="<rank>:<step>" that rank SIGKILLs itself halfway
// through writing its file of that step (tests/train/checkpoint_fault_test.cpp).
//
// Load (load_sharded_checkpoint, collective, any world size W'): rank r' needs flat elements
// [r' * S', (r' + 1) * S') of each unit; it reads them from the saved files that hold them
// (resharding), after checking each such file's size and CRC-32 against metadata.json, its
// safetensors structure, its __metadata__ and each tensor's dtype and shape; it also checksums
// the files f with f % W' == r', so every file is verified by some rank. Elements past numel
// (this world's padding) are zero. Everything is read into staging buffers first; the ranks agree
// on success; only then are the targets written, so a truncated, corrupted or mismatched
// checkpoint is refused with an InputError naming the file (on every rank) and never half-loaded.
// The units must match metadata.json (names, numel, tensor names, offsets and shapes): loading
// into another model is refused naming the first difference.
// Non-finite values: unless allow_nonfinite, each rank scans the floats it loads (LoRA masters and
// AdamW moments, its new range of every unit and slice) and refuses a NaN / Inf with an InputError
// naming the file, the slice, the tensor and the flat index in it, on every rank, before anything
// is written (a run that diverged, or a corrupted file whose CRC was recomputed).
// Filesystem: root must be shared by all ranks (one job per root).
// Thread safety: one thread per rank; every rank makes the same calls.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/communicator.h"
#include "shard/flat_layout.h"

namespace qshard {

inline constexpr const char* kCheckpointFormat = "qshard.train_checkpoint";
inline constexpr int kCheckpointFormatVersion = 1;

// One unit's trainable state on this rank. `layout` is the unit's kTrainable layout (set_world
// done); each slice is f32 [layout->shard_bytes() / 4] on any device. Units whose layout is empty
// take part with no slices written.
struct UnitStateShard {
  std::string unit;
  const FlatLayout* layout = nullptr;
  std::vector<std::pair<std::string, Tensor>> slices;  // same names, same order, on every unit
};

struct CheckpointSaveOptions {
  std::string root;         // checkpoint.dir
  int64_t step = 0;         // completed optimizer steps
  int64_t keep_last = 0;    // complete checkpoints to keep (0: all)
  nlohmann::json trainer;   // opaque, identical on every rank (rank 0's is written)
};

struct CheckpointInfo {
  std::string dir;   // root/step-N
  int64_t step = 0;
  int world_size = 0;
  nlohmann::json metadata;  // the whole metadata.json
};

// "step-00000015" (at least 8 digits).
std::string checkpoint_dir_name(int64_t step);

// Collective. Returns root/step-N. Throws InputError on every rank if any rank fails.
std::string save_sharded_checkpoint(Communicator& comm, const std::vector<UnitStateShard>& units,
                                    const CheckpointSaveOptions& options);

// Complete checkpoints (step-N folders with metadata.json) under root, ascending by step; a
// missing root gives none. Does not validate beyond the names.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& root);

// `path` is a checkpoint folder (with metadata.json) or a root holding step-N folders (the newest
// complete one is taken). Reads and validates metadata.json (strict JSON, format and version, the
// keys and types above). Throws InputError naming the folder or file: no metadata.json (an
// incomplete save), unknown format, newer version, malformed fields. Local (no collectives).
CheckpointInfo read_checkpoint_metadata(const std::string& path);

// Collective: fills each unit's slices (a subset of metadata "slices", by name) from `info`.
void load_sharded_checkpoint(Communicator& comm, const CheckpointInfo& info, const std::vector<UnitStateShard>& units,
                             bool allow_nonfinite = false);

}  // namespace qshard
