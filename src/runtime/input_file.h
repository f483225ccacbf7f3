// input_file.h: reading what a user hands qshard (a YAML job, config.json, adapter_config.json, a
// JSON list of ids, a text corpus, a token file) without blocking, exhausting memory or recursing
// without bound on hostile input.
//
// check_input_file: `path` must name a regular file (symbolic links followed): a folder, a FIFO, a
//   socket or a device (/dev/zero) is an InputError naming `what` and the path, raised before the
//   file is opened (opening a FIFO would block for ever). Returns its size in bytes. Every file a
//   qshard command reads goes through it (or read_input_file); a reader that opens the file itself
//   afterwards opens with O_NONBLOCK and checks fstat too, so a FIFO swapped in between never blocks.
// check_input_folder: `path` must name a folder (symbolic links followed): a missing path, a
//   regular file, a FIFO, a socket or a device is an InputError naming `what`, the path and what
//   it is instead (a model, adapter or checkpoint folder given as a file).
// read_input_file: check_input_file, then the whole file, refused when larger than max_bytes.
// parse_json_input: JSON text -> json with the nesting bounded by kMaxJsonDepth (checked while
//   parsing, before a deep document is built: deeper input is an InputError naming `label`, not a
//   stack overflow in a later recursive copy) and no key twice in one object (an InputError
//   naming `label` and the key's path, "messages[1].role": nlohmann kept the last in silence);
//   syntax errors are InputErrors naming `label`.
//   parse_ordered_json_input: the same, keeping the objects' key order (chat-template side files).
// json_string / json_bool / json_number: `obj[key]` with its type checked; absent or null gives
//   `def`; any other type is an InputError `label: key "key" must be ..., got <value>` (never a
//   nlohmann type_error escaping from a config file a user wrote). `obj` must be an object.
// check_output_file: `path` is where a command writes a file of its own (a token file, logits,
//   a JSON result, the metrics log): absent, or a regular file (symbolic links followed) that it
//   may replace. A folder, FIFO, socket or device is an InputError naming `what` and the path,
//   raised before any work: writing a FIFO blocks for ever, and a device renamed over is gone.
//   Every writer of such files calls it (SafetensorsWriter, write_file_atomic, TokenFileWriter,
//   the metrics log); commands call it again before their work starts. A symbolic link there is
//   refused too (the file is renamed onto the path: the link would be replaced, its target left).
// remove_stale_partials: the siblings of `path` named <its name><sep><pid> (a writer's temporary
//   file or folder, ".tmp." or ".partial-") whose process no longer runs are removed, each logged:
//   a command killed while writing leaves nothing that the next run of it keeps.
// check_output_folder: `path` is a folder a command makes (quantize, dequantize, init-model,
//   export): not empty, not a symbolic link, absent or an empty folder, and every parent that
//   exists a folder; else an InputError naming `what`, the path and what is in the way.
// Thread safety: free functions, no shared state.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace qshard {

inline constexpr int kMaxJsonDepth = 256;
inline constexpr uint64_t kMaxConfigBytes = uint64_t{64} << 20;  // YAML jobs, config.json, JSON side files

uint64_t check_input_file(const std::string& path, const std::string& what);
void check_input_folder(const std::string& path, const std::string& what);
void check_output_file(const std::string& path, const std::string& what);
void check_output_folder(const std::string& path, const std::string& what);
void remove_stale_partials(const std::string& path, const std::string& sep);
std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes = kMaxConfigBytes);
nlohmann::json parse_json_input(std::string_view text, const std::string& label);
nlohmann::ordered_json parse_ordered_json_input(std::string_view text, const std::string& label);  // key order kept
std::string json_string(const nlohmann::json& obj, const std::string& key, const std::string& label,
                        const std::string& def);
bool json_bool(const nlohmann::json& obj, const std::string& key, const std::string& label, bool def);
double json_number(const nlohmann::json& obj, const std::string& key, const std::string& label, double def);

}  // namespace qshard
