// hf_tokenizer.cpp: the native tokenizer's public API (hf_tokenizer.h): load reads tokenizer.json
// (the BPE model, added tokens, normalizer, pre-tokenizer, post-processor, decoder) and the
// tokenizer_config.json beside it; encode matches the added tokens in two passes as the tokenizers
// library does (those with normalized false in the raw text; each section between them through the
// normalizer; those with normalized true in the normalized section), then runs each section between
// them through the pre-tokenizer and the BPE model; decode runs the decoders. The pipeline's stages:
// hf_tokenizer_pipeline.h.
#include "text/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
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
#include "runtime/input_file.h"
#include "runtime/json_field.h"
#include "text/hf_tokenizer_pipeline.h"
#include "text/special_token.h"

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
  bool normalized = true;  // matched in the normalized text (its content normalized too), not the raw
};

bool is_word_char(char32_t c) { return c == '_' || (c < 128 && std::isalnum(static_cast<int>(c))) || c >= 128; }

// The longest added token starting at each byte offset of a text, in one pass linear in the text
// (however many tokens share a prefix, however long they are): an Aho-Corasick automaton over the
// tokens' contents reversed, run over the text from its end. After reading text[i] (right to left)
// the state is the longest text[i, j) that ends some token; the nearest terminal on its failure
// chain (`out`) is the longest token equal to some text[i, j), i.e. the longest starting at i.
// Each byte takes one goto plus failure steps that only undo earlier gotos: at most 2 steps a byte.
class AddedMatcher {
 public:
  // tokens: non-empty contents; among equal contents the first (lowest index) is reported.
  void build(const std::vector<AddedToken>& tokens) {
    nodes_.assign(1, Node{});
    edges_.clear();
    for (uint32_t t = 0; t < tokens.size(); ++t) {
      const std::string& c = tokens[t].content;
      int32_t v = 0;
      for (size_t k = c.size(); k-- > 0;) {
        const auto b = static_cast<unsigned char>(c[k]);
        int32_t w = child(v, b);
        if (w < 0) {
          w = static_cast<int32_t>(nodes_.size());
          nodes_.push_back(Node{});
          nodes_[static_cast<size_t>(w)].byte = b;
          nodes_[static_cast<size_t>(w)].sibling = nodes_[static_cast<size_t>(v)].first_child;
          nodes_[static_cast<size_t>(v)].first_child = w;
          edges_.emplace(key(v, b), w);
          if (v == 0) root_[b] = w;
        }
        v = w;
      }
      if (nodes_[static_cast<size_t>(v)].token < 0) nodes_[static_cast<size_t>(v)].token = static_cast<int32_t>(t);
    }
    // Failure and output links, breadth first (a node's failure target is shallower).
    std::vector<int32_t> order{0};
    for (size_t q = 0; q < order.size(); ++q) {
      const int32_t u = order[q];
      for (int32_t v = nodes_[static_cast<size_t>(u)].first_child; v >= 0; v = nodes_[static_cast<size_t>(v)].sibling) {
        Node& nv = nodes_[static_cast<size_t>(v)];
        int32_t f = 0;
        if (u != 0) {
          f = nodes_[static_cast<size_t>(u)].fail;
          while (f != 0 && child(f, nv.byte) < 0) f = nodes_[static_cast<size_t>(f)].fail;
          const int32_t g = child(f, nv.byte);
          f = g >= 0 ? g : 0;
        }
        nv.fail = f;
        nv.out = nv.token >= 0 ? v : nodes_[static_cast<size_t>(f)].out;
        order.push_back(v);
      }
    }
  }

  // (offset, token index) of the longest token starting at each offset that starts one, ascending.
  // *steps grows by the automaton steps taken (at most 2 per byte).
  std::vector<std::pair<size_t, uint32_t>> longest_starts(std::string_view text, uint64_t* steps) const {
    std::vector<std::pair<size_t, uint32_t>> hits;
    if (nodes_.size() <= 1) return hits;
    uint64_t n_steps = 0;
    int32_t state = 0;
    for (size_t i = text.size(); i-- > 0;) {
      const auto b = static_cast<unsigned char>(text[i]);
      int32_t next;
      while ((next = child(state, b)) < 0 && state != 0) {
        state = nodes_[static_cast<size_t>(state)].fail;
        ++n_steps;
      }
      state = next >= 0 ? next : 0;
      ++n_steps;
      if (const int32_t t = nodes_[static_cast<size_t>(state)].out; t >= 0)
        hits.emplace_back(i, static_cast<uint32_t>(nodes_[static_cast<size_t>(t)].token));
    }
    std::reverse(hits.begin(), hits.end());
    *steps += n_steps;
    return hits;
  }

 private:
  struct Node {
    int32_t fail = 0, out = -1, token = -1;  // out: nearest terminal on the failure chain, itself included
    int32_t first_child = -1, sibling = -1;  // the children, for the breadth-first pass
    unsigned char byte = 0;                  // the byte leading here
  };
  static uint64_t key(int32_t v, unsigned char b) { return (static_cast<uint64_t>(v) << 8) | b; }
  int32_t child(int32_t v, unsigned char b) const {
    if (v == 0) return root_[b];
    auto it = edges_.find(key(v, b));
    return it == edges_.end() ? -1 : it->second;
  }
  std::vector<Node> nodes_{1};
  std::unordered_map<uint64_t, int32_t> edges_;  // (node, byte) -> child, below the root
  std::array<int32_t, 256> root_ = filled_root();
  static std::array<int32_t, 256> filled_root() {
    std::array<int32_t, 256> r;
    r.fill(-1);
    return r;
  }
};

// The added tokens of one matching pass, longest first, and their matcher.
struct AddedSet {
  std::vector<AddedToken> tokens;
  AddedMatcher matcher;

  void build() {
    std::stable_sort(tokens.begin(), tokens.end(),
                     [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
    matcher.build(tokens);
  }

  // Cuts text at the added tokens: leftmost match, longest at that position (the tokenizers
  // library's aho-corasick LeftmostLongest); a single_word token not standing alone is dropped and
  // the search resumes after it, as the library's find_matches does; lstrip / rstrip take the
  // whitespace beside a match along. Calls on_text(begin, end) for each non-empty stretch between
  // matches and on_token(id) for each match, in order. *steps grows by the matcher's steps.
  template <class OnText, class OnToken>
  void split(std::string_view text, uint64_t* steps, OnText on_text, OnToken on_token) const {
    const auto hits = matcher.longest_starts(text, steps);
    size_t at = 0, section = 0;
    for (const auto& [pos, index] : hits) {
      if (pos < at) continue;
      const AddedToken* hit = &tokens[index];
      if (hit->single_word) {
        size_t k = pos;
        while (k > 0 && (static_cast<unsigned char>(text[--k]) & 0xC0) == 0x80) {
        }
        const bool left_ok = pos == 0 || !is_word_char(utf8_decode_at(text, k));
        const size_t e = pos + hit->content.size();
        const bool right_ok = e >= text.size() || !is_word_char(utf8_decode_at(text, e));
        if (!left_ok || !right_ok) {
          at = e;
          continue;
        }
      }
      size_t b = pos, e = pos + hit->content.size();
      if (hit->lstrip)
        while (b > section && std::isspace(static_cast<unsigned char>(text[b - 1]))) --b;
      if (hit->rstrip)
        while (e < text.size() && std::isspace(static_cast<unsigned char>(text[e]))) ++e;
      if (b > section) on_text(section, b);
      on_token(hit->id);
      section = at = e;
    }
    if (section < text.size()) on_text(section, text.size());
  }
};

// What a token id must be, in messages: an integer in [0, kMaxVocabSize).
const std::string kTokenIdWhat = "a token id (an integer from 0 to " + std::to_string(kMaxVocabSize - 1) +
                                 ", kMaxVocabSize: 16x the largest real vocabulary)";

// v as a token id, or nullopt when it is none.
std::optional<uint32_t> as_token_id(const json& v) {
  const bool ok = (v.is_number_unsigned() && v.get<uint64_t>() < kMaxVocabSize) ||
                  (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < int64_t{kMaxVocabSize});
  if (!ok) return std::nullopt;
  return static_cast<uint32_t>(v.get<uint64_t>());
}

// f as a token id; otherwise an InputError naming the file, f's path and the value.
uint32_t token_id(const JsonField& f) {
  const std::optional<uint32_t> i = as_token_id(f.json());
  if (!i) f.expected(kTokenIdWhat);
  return *i;
}

// A token as a key in a message: quoted, cut to 40 bytes.
std::string shown(const std::string& tok) {
  size_t n = std::min<size_t>(tok.size(), 40);
  while (n > 0 && n < tok.size() && (static_cast<unsigned char>(tok[n]) & 0xC0) == 0x80) --n;
  return "\"" + tok.substr(0, n) + (n < tok.size() ? "...\"" : "\"");
}

}  // namespace

// ---- the tokenizer ------------------------------------------------------------------------------------

struct HfTokenizer::Impl {
  std::string path;
  std::unordered_map<std::string, uint32_t> vocab;
  std::vector<std::string> id_to_token;
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges;  // (a, b) -> (rank, merged id)
  std::optional<uint32_t> unk;
  std::string missing_unk;  // an unk_token the vocabulary lacks: encoding a piece that needs it is refused
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::array<std::optional<uint32_t>, 256> byte_ids{};  // "<0xAB>" tokens (byte_fallback)
  std::optional<Normalizer> normalizer;
  std::optional<PreTokenizer> pre_tokenizer;
  std::optional<Decoder> decoder;
  std::vector<AddedToken> added;       // all of them, as read (token_to_id, bos / eos)
  AddedSet raw_added;                  // normalized false: matched in the raw text
  AddedSet norm_added;                 // normalized true: contents normalized, matched in normalized text
  mutable std::atomic<uint64_t> added_steps{0};  // the matcher's steps, all encodes (a test hook)
  std::vector<bool> special;           // per id
  std::vector<uint32_t> prefix_ids, suffix_ids;  // the post-processor's template around the text
  std::optional<uint32_t> bos, eos;
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<uint32_t>> cache;

  void bpe(const std::string& word, std::vector<uint32_t>& out) const;
  // A stretch of the raw text between added tokens of raw_added: normalized, cut at those of
  // norm_added, each stretch between them pre-tokenized and run through the BPE model.
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
    } else if (!missing_unk.empty()) {  // the tokenizers library: "Unk token ... not found in the vocabulary"
      throw InputError(path + ": a piece of the text is not in the vocabulary, and the model's unk_token '" +
                       missing_unk + "' is not either; refused (the tokenizers library refuses it too)");
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
  if (normalizer) {
    try {
      normalizer->apply(text, hf_tok::normalized_limit(text.size()));
    } catch (const InputError& e) {
      throw InputError(path + ": " + e.what());
    }
  }
  uint64_t steps = 0;
  norm_added.split(
      text, &steps,
      [&](size_t b, size_t e) {
        // at_origin: the piece starts at offset 0 of the input (Metaspace's prepend_scheme "first").
        std::vector<Piece> pieces{{text.substr(b, e - b), at_origin && b == 0}};
        if (pre_tokenizer) pre_tokenizer->apply(pieces);
        for (const Piece& p : pieces)
          if (!p.text.empty()) bpe(p.text, out);
      },
      [&](uint32_t id) { out.push_back(id); });
  added_steps.fetch_add(steps, std::memory_order_relaxed);
}

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;
HfTokenizer::~HfTokenizer() = default;

namespace {

// The tokenizer.json a load() argument names: the file itself, or a folder's tokenizer.json. A
// missing path or a folder without one is an InputError naming the path; special files are refused
// by read_input_file (a FIFO would block for ever).
std::string tokenizer_json_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st))
    throw InputError(path + ": cannot read the tokenizer (a tokenizer.json file or a folder holding one): " +
                     (ec ? ec.message() : std::string("no such file or folder")));
  if (!fs::is_directory(st)) return path;
  const std::string file = (fs::path(path) / "tokenizer.json").string();
  if (!fs::exists(fs::status(file, ec)))
    throw InputError(path + ": cannot read the tokenizer: the folder has no tokenizer.json");
  return file;
}

}  // namespace

HfTokenizer HfTokenizer::load(const std::string& path_in) {
  const std::string path = tokenizer_json_path(path_in);
  return from_json(read_input_file(path, "tokenizer file", kMaxTokenizerFileBytes), path);
}

HfTokenizer HfTokenizer::from_json(std::string_view text, const std::string& path) {
  namespace fs = std::filesystem;
  const json doc = parse_json_input(text, path);
  // Every field is read through a JsonField: a missing one or one of the wrong type is an InputError
  // naming the file and its path in the document (runtime/json_field.h).
  const JsonField j(doc, path);
  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  t.path = path;
  const JsonField m = j.object().at("model", "an object: the BPE model").object();
  const std::string type = m.string_or("type", "BPE");
  if (type != "BPE")
    throw InputError(path + ": model type '" + type + "' is not supported (BPE is: byte-level and SentencePiece style)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.string_or(key, "") != "") throw InputError(path + ": model." + key + " is not supported");
  if (m.number_or("dropout", 0) > 0)
    throw InputError(path + ": model.dropout > 0 (BPE dropout) is not supported for encoding");
  const JsonField vocab = m.at("vocab", "an object {token: id}").object();
  for (auto& [tok, id] : vocab.json().items()) {
    const std::optional<uint32_t> i = as_token_id(id);
    if (!i) token_id(vocab.entry(tok, kTokenIdWhat.c_str()));  // throws, naming model.vocab["tok"]
    if (t.id_to_token.size() <= *i) t.id_to_token.resize(*i + 1);
    if (!t.id_to_token[*i].empty())
      throw InputError(path + ": model.vocab gives id " + std::to_string(*i) + " to both " +
                       shown(t.id_to_token[*i]) + " and " + shown(tok));
    t.vocab.emplace(tok, *i);
    t.id_to_token[*i] = tok;
  }
  t.fuse_unk = m.bool_or("fuse_unk", false);
  t.byte_fallback = m.bool_or("byte_fallback", false);
  t.ignore_merges = m.bool_or("ignore_merges", false);
  if (const auto unk = m.find("unk_token")) {
    const std::string name = unk->string();
    auto it = t.vocab.find(name);
    if (it != t.vocab.end()) t.unk = it->second;
    else t.missing_unk = name;
  }
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (auto it = t.vocab.find(name); it != t.vocab.end()) t.byte_ids[static_cast<size_t>(b)] = it->second;
  }
  uint32_t rank = 0;
  for (const JsonField& mg : m.at("merges", "an array of merges").elements()) {
    std::string a, b;
    const json& v = mg.json();
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) mg.fail("merge '" + s + "' is not two tokens");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (v.is_array() && v.size() == 2 && v[0].is_string() && v[1].is_string()) {
      a = v[0].get<std::string>();
      b = v[1].get<std::string>();
    } else {
      mg.expected("a merge: \"a b\" or [\"a\", \"b\"]");
    }
    auto ia = t.vocab.find(a), ib = t.vocab.find(b), ic = t.vocab.find(a + b);
    if (ia == t.vocab.end() || ib == t.vocab.end() || ic == t.vocab.end())
      throw InputError(mg.where() + " ('" + a + "' '" + b + "') names a token missing from the vocabulary");
    t.merges.emplace((static_cast<uint64_t>(ia->second) << 32) | ib->second, std::make_pair(rank, ic->second));
    ++rank;
  }
  if (const auto added = j.find("added_tokens")) {
    std::unordered_map<uint32_t, std::string> added_ids;
    uint64_t added_bytes = 0;
    for (const JsonField& a : added->elements()) {
      AddedToken at;
      at.content = a.object().at("content", "a string").string();
      at.id = token_id(a.at("id", kTokenIdWhat.c_str()));
      at.special = a.bool_or("special", false);
      at.lstrip = a.bool_or("lstrip", false);
      at.rstrip = a.bool_or("rstrip", false);
      at.single_word = a.bool_or("single_word", false);
      at.normalized = a.bool_or("normalized", !at.special);  // the library's AddedToken::from(content, special)
      if (auto [it, fresh] = added_ids.emplace(at.id, at.content); !fresh && it->second != at.content)
        throw InputError(a.where() + ".id " + std::to_string(at.id) + " is also the id of added token " +
                         shown(it->second) + " (not " + shown(at.content) + ")");
      if ((added_bytes += at.content.size()) > kMaxAddedTokenBytes)
        throw InputError(path + ": added_tokens hold more than " + std::to_string(kMaxAddedTokenBytes) +
                         " bytes of content (at " + a.path() + "); refused");
      if (at.content.empty()) continue;
      if (t.id_to_token.size() <= at.id) t.id_to_token.resize(at.id + 1);
      t.id_to_token[at.id] = at.content;
      t.added.push_back(at);
    }
  }
  t.special.assign(t.id_to_token.size(), false);
  for (const AddedToken& a : t.added) t.special[a.id] = a.special;
  if (const auto f = j.find("normalizer")) t.normalizer = parse_normalizer(*f, path);
  // The two matching passes; a normalized token is matched by its normalized content (the
  // library's AddedVocabulary::refresh_added_tokens), and one that normalizes to nothing never.
  for (const AddedToken& a : t.added) {
    if (!a.normalized) {
      t.raw_added.tokens.push_back(a);
      continue;
    }
    AddedToken n = a;
    if (t.normalizer) {
      try {
        t.normalizer->apply(n.content, hf_tok::normalized_limit(n.content.size()));
      } catch (const InputError& e) {
        throw InputError(path + ": added token " + std::to_string(a.id) + ": " + e.what());
      }
    }
    if (!n.content.empty()) t.norm_added.tokens.push_back(std::move(n));
  }
  t.raw_added.build();
  t.norm_added.build();
  if (const auto f = j.find("pre_tokenizer")) t.pre_tokenizer = parse_pre_tokenizer(*f, path);
  if (const auto f = j.find("decoder")) t.decoder = parse_decoder(*f, path);
  // Post-processor: a TemplateProcessing's single template (possibly inside a Sequence).
  std::function<void(const JsonField&, int)> post = [&](const JsonField& p, int depth) {
    hf_tok::check_sequence_depth(depth, path, "post_processor");
    const std::string type = hf_tok::component_type(p);
    if (type == "Sequence") {
      for (const JsonField& c : p.at("processors", "an array").elements()) post(c, depth + 1);
    } else if (type == "TemplateProcessing") {
      bool seen_a = false;
      for (const JsonField& item : p.at("single", "an array").elements()) {
        if (item.object().has("Sequence")) {
          seen_a = true;
          continue;
        }
        const std::string tok = item.at("SpecialToken", "an object").at("id", "a string").string();
        const JsonField ids = p.at("special_tokens", "an object").entry(tok, "an object").at("ids", "an array");
        for (const JsonField& id : ids.elements()) {
          const uint32_t i = token_id(id);
          if (i >= t.id_to_token.size() || t.id_to_token[i].empty())
            id.fail("holds id " + std::to_string(i) + ", which names no token of the vocabulary or the added tokens");
          (seen_a ? t.suffix_ids : t.prefix_ids).push_back(i);
        }
      }
    } else if (type != "ByteLevel") {
      throw InputError(path + ": post_processor type '" + type +
                       "' is not supported (TemplateProcessing, ByteLevel and Sequence are)");
    }
  };
  if (const auto f = j.find("post_processor")) post(*f, 0);
  // bos / eos from tokenizer_config.json (a string, or {"content": ...}), when the folder has one.
  const fs::path cfg_path = fs::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (fs::exists(fs::status(cfg_path, ec))) {
    const std::string cfg = cfg_path.string();
    const json c = parse_json_input(read_input_file(cfg, "tokenizer config"), cfg);
    const JsonField config(c, cfg);
    config.object();
    auto named = [&](const char* key) -> std::optional<uint32_t> {
      const auto f = config.find(key);
      if (!f) return std::nullopt;
      const std::string token = special_token_text(*f);
      for (const AddedToken& a : t.added)
        if (a.content == token) return a.id;
      if (auto vt = t.vocab.find(token); vt != t.vocab.end()) return vt->second;
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
  // Added tokens with normalized false first, in the raw text; each stretch between them goes
  // through encode_section (the normalizer, the normalized added tokens, the pre-tokenizer, BPE).
  uint64_t steps = 0;
  t.raw_added.split(
      text, &steps, [&](size_t b, size_t e) { t.encode_section(text.substr(b, e - b), b == 0, out); },
      [&](uint32_t id) { out.push_back(id); });
  t.added_steps.fetch_add(steps, std::memory_order_relaxed);
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
uint64_t HfTokenizer::added_token_match_steps() const { return impl_->added_steps.load(); }
std::optional<uint32_t> HfTokenizer::bos_id() const { return impl_->bos; }
std::optional<uint32_t> HfTokenizer::eos_id() const { return impl_->eos; }

}  // namespace qshard
