// hf_tokenizer.cpp: the native tokenizer's public API (hf_tokenizer.h): load reads tokenizer.json
// (the BPE model, added tokens, normalizer, pre-tokenizer, post-processor, decoder) and the
// tokenizer_config.json beside it; encode matches the added tokens, then runs each section between
// them through the pipeline and the BPE model; decode runs the decoders. The pipeline's stages:
// hf_tokenizer_pipeline.h.
#include "text/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <mutex>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "text/hf_tokenizer_pipeline.h"

namespace qshard {

namespace {

using hf_tok::Decoder;
using hf_tok::json;
using hf_tok::Normalizer;
using hf_tok::parse_decoder;
using hf_tok::parse_normalizer;
using hf_tok::parse_pre_tokenizer;
using hf_tok::Piece;
using hf_tok::PreTokenizer;
using hf_tok::utf8_decode_at;
using hf_tok::utf8_len;

// ---- added tokens ----------------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false;
};

bool is_word_char(char32_t c) { return c == '_' || (c < 128 && std::isalnum(static_cast<int>(c))) || c >= 128; }

}  // namespace

// ---- the tokenizer ------------------------------------------------------------------------------------

struct HfTokenizer::Impl {
  std::string path;
  std::unordered_map<std::string, uint32_t> vocab;
  std::vector<std::string> id_to_token;
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges;  // (a, b) -> (rank, merged id)
  std::optional<uint32_t> unk;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::array<std::optional<uint32_t>, 256> byte_ids{};  // "<0xAB>" tokens (byte_fallback)
  std::optional<Normalizer> normalizer;
  std::optional<PreTokenizer> pre_tokenizer;
  std::optional<Decoder> decoder;
  std::vector<AddedToken> added;       // longest first
  std::array<std::vector<const AddedToken*>, 256> added_by_byte;  // by first byte, longest first
  std::vector<bool> special;           // per id
  std::vector<uint32_t> prefix_ids, suffix_ids;  // the post-processor's template around the text
  std::optional<uint32_t> bos, eos;
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<uint32_t>> cache;

  void bpe(const std::string& word, std::vector<uint32_t>& out) const;
  void encode_section(std::string text, bool at_origin, std::vector<uint32_t>& out) const;
};

void HfTokenizer::Impl::bpe(const std::string& word, std::vector<uint32_t>& out) const {
  if (ignore_merges) {
    if (auto it = vocab.find(word); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    if (auto it = cache.find(word); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  // Symbols: the word's characters as vocabulary ids (byte-fallback tokens or unk otherwise).
  struct Sym {
    uint32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Sym> sym;
  bool last_unk = false;
  for (size_t i = 0; i < word.size();) {
    const size_t n = std::min(utf8_len(static_cast<unsigned char>(word[i])), word.size() - i);
    const std::string ch = word.substr(i, n);
    i += n;
    if (auto it = vocab.find(ch); it != vocab.end()) {
      sym.push_back({it->second, 0, 0, true});
      last_unk = false;
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_ids[b].has_value();
      if (all) {
        for (unsigned char b : ch) sym.push_back({*byte_ids[b], 0, 0, true});
        last_unk = false;
        continue;
      }
    }
    if (unk) {
      if (!(fuse_unk && last_unk)) sym.push_back({*unk, 0, 0, true});
      last_unk = true;
    }
  }
  const int n = static_cast<int>(sym.size());
  for (int k = 0; k < n; ++k) sym[k].prev = k - 1, sym[k].next = k + 1 < n ? k + 1 : -1;
  // Merges by rank, then leftmost (the tokenizers library's Word::merge_all without dropout).
  struct Cand {
    uint32_t rank;
    int pos;
    uint32_t new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q;
  auto pair_of = [&](int a, int b) -> const std::pair<uint32_t, uint32_t>* {
    auto it = merges.find((static_cast<uint64_t>(sym[a].id) << 32) | sym[b].id);
    return it == merges.end() ? nullptr : &it->second;
  };
  for (int k = 0; k + 1 < n; ++k)
    if (auto m = pair_of(k, k + 1)) q.push({m->first, k, m->second});
  while (!q.empty()) {
    const Cand c = q.top();
    q.pop();
    Sym& s = sym[c.pos];
    if (!s.alive || s.next < 0) continue;
    const int r = s.next;
    auto m = pair_of(c.pos, r);
    if (!m || m->second != c.new_id) continue;  // an expired entry
    s.id = c.new_id;
    sym[r].alive = false;
    s.next = sym[r].next;
    if (s.next >= 0) sym[s.next].prev = c.pos;
    if (s.prev >= 0)
      if (auto pm = pair_of(s.prev, c.pos)) q.push({pm->first, s.prev, pm->second});
    if (s.next >= 0)
      if (auto nm = pair_of(c.pos, s.next)) q.push({nm->first, c.pos, nm->second});
  }
  std::vector<uint32_t> ids;
  for (int k = 0; k < n; ++k)
    if (sym[k].alive) ids.push_back(sym[k].id);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mu);
  if (cache.size() > 200000) cache.clear();
  cache.emplace(word, std::move(ids));
}

void HfTokenizer::Impl::encode_section(std::string text, bool at_origin, std::vector<uint32_t>& out) const {
  if (normalizer) normalizer->apply(text);
  std::vector<Piece> pieces{{std::move(text), at_origin}};
  if (pre_tokenizer) pre_tokenizer->apply(pieces);
  for (const Piece& p : pieces)
    if (!p.text.empty()) bpe(p.text, out);
}

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;
HfTokenizer::~HfTokenizer() = default;

HfTokenizer HfTokenizer::load(const std::string& path_in) {
  namespace fs = std::filesystem;
  std::string path = path_in;
  std::error_code ec;
  if (fs::is_directory(path, ec)) path = (fs::path(path) / "tokenizer.json").string();
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot read the tokenizer (a tokenizer.json file or a folder holding one)");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    throw InputError(path + ": not JSON: " + e.what());
  }
  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  t.path = path;
  try {
    const json& m = j.at("model");
    const std::string type = m.value("type", "BPE");
    if (type != "BPE")
      throw InputError(path + ": model type '" + type + "' is not supported (BPE is: byte-level and SentencePiece style)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(key) && !m[key].is_null() && m[key] != "")
        throw InputError(path + ": model." + key + " is not supported");
    if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0)
      throw InputError(path + ": model.dropout > 0 (BPE dropout) is not supported for encoding");
    for (auto& [tok, id] : m.at("vocab").items()) {
      const uint32_t i = id.get<uint32_t>();
      t.vocab.emplace(tok, i);
      if (t.id_to_token.size() <= i) t.id_to_token.resize(i + 1);
      t.id_to_token[i] = tok;
    }
    t.fuse_unk = m.value("fuse_unk", false);
    t.byte_fallback = m.value("byte_fallback", false);
    t.ignore_merges = m.value("ignore_merges", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      auto it = t.vocab.find(m["unk_token"].get<std::string>());
      if (it != t.vocab.end()) t.unk = it->second;
    }
    char name[8];
    for (int b = 0; b < 256; ++b) {
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      if (auto it = t.vocab.find(name); it != t.vocab.end()) t.byte_ids[static_cast<size_t>(b)] = it->second;
    }
    uint32_t rank = 0;
    for (const json& mg : m.at("merges")) {
      std::string a, b;
      if (mg.is_string()) {
        const std::string s = mg.get<std::string>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) throw InputError(path + ": merge '" + s + "' is not two tokens");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2) {
        a = mg[0].get<std::string>();
        b = mg[1].get<std::string>();
      } else {
        throw InputError(path + ": merges[" + std::to_string(rank) + "] is neither \"a b\" nor [a, b]");
      }
      auto ia = t.vocab.find(a), ib = t.vocab.find(b), ic = t.vocab.find(a + b);
      if (ia == t.vocab.end() || ib == t.vocab.end() || ic == t.vocab.end())
        throw InputError(path + ": merges[" + std::to_string(rank) + "] ('" + a + "' '" + b +
                         "') names a token missing from the vocabulary");
      t.merges.emplace((static_cast<uint64_t>(ia->second) << 32) | ib->second, std::make_pair(rank, ic->second));
      ++rank;
    }
    if (j.contains("added_tokens") && j["added_tokens"].is_array())
      for (const json& a : j["added_tokens"]) {
        AddedToken at;
        at.content = a.at("content").get<std::string>();
        at.id = a.at("id").get<uint32_t>();
        at.special = a.value("special", false);
        at.lstrip = a.value("lstrip", false);
        at.rstrip = a.value("rstrip", false);
        at.single_word = a.value("single_word", false);
        if (at.content.empty()) continue;
        if (t.id_to_token.size() <= at.id) t.id_to_token.resize(at.id + 1);
        t.id_to_token[at.id] = at.content;
        t.added.push_back(at);
      }
    std::stable_sort(t.added.begin(), t.added.end(),
                     [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
    for (const AddedToken& a : t.added) t.added_by_byte[static_cast<unsigned char>(a.content[0])].push_back(&a);
    t.special.assign(t.id_to_token.size(), false);
    for (const AddedToken& a : t.added) t.special[a.id] = a.special;
    if (j.contains("normalizer") && !j["normalizer"].is_null()) t.normalizer = parse_normalizer(j["normalizer"], path);
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null())
      t.pre_tokenizer = parse_pre_tokenizer(j["pre_tokenizer"], path);
    if (j.contains("decoder") && !j["decoder"].is_null()) t.decoder = parse_decoder(j["decoder"], path);
    // Post-processor: a TemplateProcessing's single template (possibly inside a Sequence).
    std::function<void(const json&)> post = [&](const json& p) {
      const std::string type = p.value("type", "");
      if (type == "Sequence") {
        for (const json& c : p.at("processors")) post(c);
      } else if (type == "TemplateProcessing") {
        bool seen_a = false;
        for (const json& item : p.at("single")) {
          if (item.contains("Sequence")) {
            seen_a = true;
            continue;
          }
          const std::string tok = item.at("SpecialToken").at("id").get<std::string>();
          const json& ids = p.at("special_tokens").at(tok).at("ids");
          for (const json& id : ids) (seen_a ? t.suffix_ids : t.prefix_ids).push_back(id.get<uint32_t>());
        }
      } else if (type != "ByteLevel") {
        throw InputError(path + ": post_processor type '" + type +
                         "' is not supported (TemplateProcessing, ByteLevel and Sequence are)");
      }
    };
    if (j.contains("post_processor") && !j["post_processor"].is_null()) post(j["post_processor"]);
  } catch (const json::exception& e) {
    throw InputError(path + ": " + e.what());
  }
  // bos / eos from tokenizer_config.json (a string, or {"content": ...}).
  const fs::path cfg_path = fs::path(path).parent_path() / "tokenizer_config.json";
  if (std::ifstream cf(cfg_path); cf) {
    json c = json::parse(cf, nullptr, /*allow_exceptions=*/false);
    if (c.is_discarded()) throw InputError(cfg_path.string() + ": not JSON");
    auto named = [&](const char* key) -> std::optional<uint32_t> {
      if (!c.contains(key)) return std::nullopt;
      const json& v = c[key];
      std::string name;
      if (v.is_string()) name = v.get<std::string>();
      else if (v.is_object() && v.contains("content") && v["content"].is_string()) name = v["content"].get<std::string>();
      else return std::nullopt;
      for (const AddedToken& a : t.added)
        if (a.content == name) return a.id;
      if (auto it = t.vocab.find(name); it != t.vocab.end()) return it->second;
      return std::nullopt;
    };
    t.bos = named("bos_token");
    t.eos = named("eos_token");
  }
  return HfTokenizer(std::move(impl));
}

std::vector<uint32_t> HfTokenizer::encode(std::string_view raw, bool add_special_tokens) const {
  const Impl& t = *impl_;
  const std::string text = utf8_replace_invalid(raw);
  std::vector<uint32_t> out;
  if (add_special_tokens) out.insert(out.end(), t.prefix_ids.begin(), t.prefix_ids.end());
  // Added tokens first: leftmost match, longest at that position; the text between them goes
  // through the normalizer, the pre-tokenizer and the model.
  size_t at = 0, section = 0;
  while (at < text.size()) {
    const AddedToken* hit = nullptr;
    for (const AddedToken* a : t.added_by_byte[static_cast<unsigned char>(text[at])]) {
      if (text.compare(at, a->content.size(), a->content) != 0) continue;
      if (a->single_word) {
        size_t k = at;
        while (k > 0 && (static_cast<unsigned char>(text[--k]) & 0xC0) == 0x80) {
        }
        const bool left_ok = at == 0 || !is_word_char(utf8_decode_at(text, k));
        const size_t e = at + a->content.size();
        const bool right_ok = e >= text.size() || !is_word_char(utf8_decode_at(text, e));
        if (!left_ok || !right_ok) continue;
      }
      hit = a;
      break;
    }
    if (!hit) {
      ++at;  // (a token starts on a character boundary: continuation bytes start none)
      continue;
    }
    size_t b = at, e = at + hit->content.size();
    if (hit->lstrip)
      while (b > section && std::isspace(static_cast<unsigned char>(text[b - 1]))) --b;
    if (hit->rstrip)
      while (e < text.size() && std::isspace(static_cast<unsigned char>(text[e]))) ++e;
    if (b > section) t.encode_section(text.substr(section, b - section), section == 0, out);
    out.push_back(hit->id);
    section = at = e;
  }
  if (section < text.size()) t.encode_section(text.substr(section), section == 0, out);
  if (add_special_tokens) out.insert(out.end(), t.suffix_ids.begin(), t.suffix_ids.end());
  return out;
}

std::string HfTokenizer::decode(std::span<const uint32_t> ids, bool skip_special) const {
  const Impl& t = *impl_;
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (uint32_t id : ids) {
    if (id >= t.id_to_token.size() || t.id_to_token[id].empty())
      throw InputError(t.path + ": decode: id " + std::to_string(id) + " is not in the vocabulary");
    if (skip_special && t.special[id]) continue;
    toks.push_back(t.id_to_token[id]);
  }
  if (!t.decoder) {
    std::string s;
    for (size_t i = 0; i < toks.size(); ++i) s += (i ? " " : "") + toks[i];
    return s;
  }
  t.decoder->apply(toks);
  std::string s;
  for (const std::string& x : toks) s += x;
  return s;
}

uint32_t HfTokenizer::vocab_size() const { return static_cast<uint32_t>(impl_->id_to_token.size()); }

std::optional<uint32_t> HfTokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->vocab.find(std::string(token));
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::string HfTokenizer::id_to_token(uint32_t id) const {
  return id < impl_->id_to_token.size() ? impl_->id_to_token[id] : std::string();
}

bool HfTokenizer::is_special(uint32_t id) const { return id < impl_->special.size() && impl_->special[id]; }

const std::string& HfTokenizer::path() const { return impl_->path; }
std::optional<uint32_t> HfTokenizer::bos_id() const { return impl_->bos; }
std::optional<uint32_t> HfTokenizer::eos_id() const { return impl_->eos; }

}  // namespace qshard
