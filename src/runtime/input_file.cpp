#include "runtime/input_file.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>
#include <vector>

#include "runtime/error.h"
#include "runtime/json_field.h"
#include "runtime/log.h"

namespace qshard {
using json = nlohmann::json;

namespace {
const char* file_kind(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a folder";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "a special file";
}
}  // namespace

uint64_t check_input_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw InputError("cannot open " + what + " " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw InputError(what + " " + path + " is " + file_kind(st.st_mode) + ", not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

void check_input_folder(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw InputError("cannot open " + what + " " + path + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw InputError(what + " " + path + " is " + file_kind(st.st_mode) + ", not a folder");
}

void check_output_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;  // a new file (its folder is checked when it is written)
    throw InputError("cannot write " + what + " " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode))
    throw InputError(what + " " + path + " is " + file_kind(st.st_mode) +
                     ", not a regular file: qshard writes only regular files (nothing was written)");
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
    throw InputError(what + " " + path + " is a symbolic link: give the file it points to (writing here would "
                     "replace the link and leave its target as it was; nothing was written)");
}

void remove_stale_partials(const std::string& path, const std::string& sep) {
  namespace fs = std::filesystem;
  const fs::path out = fs::path(path).lexically_normal();
  const std::string prefix = out.filename().string() + sep;
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  std::error_code ec;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    const long pid = std::stol(digits);
    if (pid == static_cast<long>(::getpid())) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    std::error_code rm;
    fs::remove_all(it->path(), rm);  // a symbolic link is removed itself, never followed
    if (!rm) QS_LOG_INFO("removed {}: left by process {}, which no longer runs", it->path().string(), pid);
  }
}

void check_output_folder(const std::string& path, const std::string& what) {
  if (path.empty()) throw InputError(what + ": the path is empty");
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode))
      throw InputError(what + " " + path + " is a symbolic link: give the folder it points to, or a new path "
                       "(the output is renamed onto the path, which would replace the link)");
    if (!S_ISDIR(st.st_mode)) throw InputError(what + " " + path + " is " + file_kind(st.st_mode) + ", not a folder");
    std::error_code ec;
    if (!std::filesystem::is_empty(path, ec) || ec)
      throw InputError(what + " " + path + " already exists and is not empty; choose a new folder");
    return;
  }
  if (errno != ENOENT && errno != ENOTDIR) throw InputError("cannot use " + what + " " + path + ": " + std::strerror(errno));
  for (std::filesystem::path p = std::filesystem::path(path).parent_path(); !p.empty() && p != p.root_path();
       p = p.parent_path()) {
    if (::stat(p.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) continue;  // made with the folder, or a file further up
      throw InputError("cannot use " + what + " " + path + ": " + p.string() + ": " + std::strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
      throw InputError(what + " " + path + ": " + p.string() + " is " + file_kind(st.st_mode) + ", not a folder");
    break;  // the nearest existing parent is a folder
  }
}

std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  const uint64_t size = check_input_file(path, what);
  if (size > max_bytes)
    throw InputError(what + " " + path + " is " + std::to_string(size) + " bytes, more than the " +
                     std::to_string(max_bytes) + " bytes such a file may have");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot open " + what + " " + path + ": " + std::strerror(errno));
  std::string text;
  text.resize(static_cast<size_t>(size));
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (static_cast<uint64_t>(in.gcount()) != size)
    throw InputError(what + " " + path + ": read " + std::to_string(in.gcount()) + " of " + std::to_string(size) +
                     " bytes (did it change while being read?)");
  return text;
}

namespace {

// Where the parser is, for naming a duplicate key: one frame per open object or array (an
// object's keys so far and its current key; an array's current element).
struct JsonFrame {
  bool object = false;
  std::unordered_set<std::string> keys;
  std::string key;
  int64_t index = 0;
};

// "messages[1].role": the path of `key` in the innermost open object.
std::string json_path(const std::vector<JsonFrame>& frames, const std::string& key) {
  std::string path;
  for (size_t i = 0; i + 1 < frames.size(); ++i)
    path += frames[i].object ? (path.empty() ? "" : ".") + frames[i].key : "[" + std::to_string(frames[i].index) + "]";
  return path + (path.empty() ? "" : ".") + key;
}

// The parse of parse_json_input, for json and ordered_json alike: nesting bounded by kMaxJsonDepth
// and duplicate keys refused (nlohmann keeps the last in silence; which one a writer meant is a
// guess), both while parsing.
template <class Json>
Json parse_bounded(std::string_view text, const std::string& label) {
  std::string problem;
  std::vector<JsonFrame> frames;
  const typename Json::parser_callback_t check = [&](int depth, json::parse_event_t event, Json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) {
          problem = "JSON nested more than " + std::to_string(kMaxJsonDepth) +
                    " levels deep; refused (no qshard file nests that deep)";
          throw InputError("");  // stops the parser; reported below
        }
        frames.emplace_back().object = event == json::parse_event_t::object_start;
        break;
      case json::parse_event_t::key: {
        JsonFrame& f = frames.back();
        f.key = parsed.template get<std::string>();
        if (!f.keys.insert(f.key).second) {
          problem = "duplicate key \"" + json_path(frames, f.key) +
                    "\" in a JSON object (which of the two values counts would be a guess)";
          throw InputError("");
        }
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames.pop_back();
        [[fallthrough]];
      case json::parse_event_t::value:
        if (!frames.empty() && !frames.back().object) ++frames.back().index;  // an array's element ends
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), check);
  } catch (const InputError&) {
    if (!problem.empty()) throw InputError(label + ": " + problem);
    throw;
  } catch (const json::exception& e) {
    throw InputError(label + ": not valid JSON (" + json_error_text(e) + ")");
  }
}

}  // namespace

nlohmann::json parse_json_input(std::string_view text, const std::string& label) {
  return parse_bounded<nlohmann::json>(text, label);
}

nlohmann::ordered_json parse_ordered_json_input(std::string_view text, const std::string& label) {
  return parse_bounded<nlohmann::ordered_json>(text, label);
}

namespace {
const json* json_field(const json& obj, const std::string& key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}
[[noreturn]] void json_field_error(const std::string& label, const std::string& key, const char* expected,
                                   const json& v) {
  std::string shown = v.dump();
  if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
  throw InputError(label + ": key \"" + key + "\" must be " + expected + ", got " + shown);
}
}  // namespace

std::string json_string(const json& obj, const std::string& key, const std::string& label, const std::string& def) {
  const json* v = json_field(obj, key);
  if (!v) return def;
  if (!v->is_string()) json_field_error(label, key, "a string", *v);
  return v->get<std::string>();
}

bool json_bool(const json& obj, const std::string& key, const std::string& label, bool def) {
  const json* v = json_field(obj, key);
  if (!v) return def;
  if (!v->is_boolean()) json_field_error(label, key, "true or false", *v);
  return v->get<bool>();
}

double json_number(const json& obj, const std::string& key, const std::string& label, double def) {
  const json* v = json_field(obj, key);
  if (!v) return def;
  if (!v->is_number()) json_field_error(label, key, "a number", *v);
  return v->get<double>();
}

}  // namespace qshard
