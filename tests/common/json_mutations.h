// json_mutations.h: every one-node damage of a JSON document, for the tests that a reader of user
// files (tokenizer.json, config.json, adapter_config.json, ...) refuses each one with an InputError
// naming the file, and never lets a raw nlohmann exception (whose text names no file or key), a
// crash or a value of the wrong type through.
//
// for_each_mutation(doc, fn) calls fn(damaged, what) for every node of doc: each object member
// removed, and each node (the root too) replaced by every one of kJsonMutationValues. `what` names
// the damage: "remove model.vocab" or "model.merges[0] = {}".
// Header only; tests only.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qshard::test {

// A value of each JSON type, and the numbers that break range checks.
inline const std::vector<nlohmann::json>& json_mutation_values() {
  static const std::vector<nlohmann::json> v = {nullptr, true, 7, -1, 1.5, 1e300, "x", nlohmann::json::array(),
                                                nlohmann::json::object()};
  return v;
}

namespace detail {
template <class Json>
void mutate_at(const Json& root, const typename Json::json_pointer& at, const std::string& shown,
               const std::function<void(const Json&, const std::string&)>& fn) {
  const Json& node = root.at(at);
  for (const nlohmann::json& v : json_mutation_values()) {
    Json damaged = root;
    damaged.at(at) = Json(v);
    fn(damaged, (shown.empty() ? "<root>" : shown) + " = " + v.dump());
  }
  if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      const auto child = at / it.key();
      Json damaged = root;
      damaged.at(at).erase(it.key());
      const std::string name = shown.empty() ? it.key() : shown + "." + it.key();
      fn(damaged, "remove " + name);
      mutate_at(root, child, name, fn);
    }
  } else if (node.is_array()) {
    for (size_t i = 0; i < node.size(); ++i) mutate_at(root, at / i, shown + "[" + std::to_string(i) + "]", fn);
  }
}
}  // namespace detail

template <class Json>
void for_each_mutation(const Json& doc, const std::function<void(const Json&, const std::string&)>& fn) {
  detail::mutate_at(doc, typename Json::json_pointer(), "", fn);
}

}  // namespace qshard::test
