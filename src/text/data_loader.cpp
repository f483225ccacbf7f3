#include "text/data_loader.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include <tuple>

#include "runtime/error.h"
#include "runtime/json_field.h"

namespace qshard {
namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias (rejection of the short last interval).
uint64_t bounded(uint64_t& s, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do x = splitmix64(s);
  while (x >= limit);
  return x % bound;
}

}  // namespace

// ---- PackedDataset --------------------------------------------------------------------------

Packing parse_packing(const std::string& name) {
  if (name == "wrapped") return Packing::kWrapped;
  if (name == "padded") return Packing::kPadded;
  if (name == "packed") return Packing::kPacked;
  throw InputError(fmt::format("data.packing '{}': expected auto, wrapped, padded or packed", name));
}

Packing resolve_packing(const std::string& name, const TokenFile& train, const TokenFile* eval) {
  if (name != "auto") return parse_packing(name);
  return train.doc_starts() && (!eval || eval->doc_starts()) ? Packing::kPacked : Packing::kWrapped;
}

namespace {

// Best-fit decreasing (data_loader.h, packed): pieces of `lengths` into rows of T; returns the
// piece order (row by row, each row's pieces in the order placed) and the row offsets into it.
std::pair<std::vector<int64_t>, std::vector<int64_t>> best_fit_decreasing(const std::vector<int>& lengths, int T) {
  const int64_t P = static_cast<int64_t>(lengths.size());
  std::vector<int64_t> order(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<int64_t> row_of(static_cast<size_t>(P));
  std::set<std::pair<int, int64_t>> room;  // (free positions, row) of the rows not full
  int64_t rows = 0;
  for (const int64_t p : order) {
    const int len = lengths[p];
    auto it = room.lower_bound({len, int64_t{-1}});
    int64_t r;
    int left;
    if (it != room.end()) {
      r = it->second;
      left = it->first - len;
      room.erase(it);
    } else {
      r = rows++;
      left = T - len;
    }
    if (left > 0) room.insert({left, r});
    row_of[p] = r;
  }
  std::vector<int64_t> offsets(static_cast<size_t>(rows) + 1, 0);
  for (const int64_t p : order) ++offsets[row_of[p] + 1];
  for (int64_t r = 0; r < rows; ++r) offsets[r + 1] += offsets[r];
  std::vector<int64_t> next(offsets.begin(), offsets.end() - 1), placed(static_cast<size_t>(P));
  for (const int64_t p : order) placed[next[row_of[p]]++] = p;
  return {std::move(placed), std::move(offsets)};
}

}  // namespace

PackedDataset::PackedDataset(const TokenFile& file, int max_seq_len, bool pad_last, Packing packing) {
  QS_CHECK(max_seq_len > 0, "max_seq_len must be > 0");
  tokens_ = file.tokens();
  loss_mask_ = file.loss_mask();
  id_bits_ = file.id_bits();
  T_ = max_seq_len;
  const int64_t n = static_cast<int64_t>(tokens_.size());
  if (packing != Packing::kWrapped) {
    const char* mode = packing == Packing::kPadded ? "padded" : "packed";
    if (!file.doc_starts())
      throw InputError(fmt::format("{}: data.packing {} needs the document starts of a version 3 token file; this "
                                   "one was written without them (re-tokenize it with qshard tokenize or "
                                   "scripts/tools/tokenize_hf.py, or set data.packing: wrapped)",
                                   file.path(), mode));
    auto windows = std::make_shared<std::vector<std::pair<int64_t, int64_t>>>();
    int64_t begin = 0;
    for (int64_t i = 1; i <= n; ++i) {
      if (i < n && !(tokens_[static_cast<size_t>(i)] & kTokenDocStart)) continue;
      for (int64_t s = begin; i - s >= 2; s += T_) windows->push_back({s, i});  // document [begin, i)
      begin = i;
    }
    if (windows->empty())
      throw InputError(fmt::format("{}: no document of 2 or more tokens (data.packing {})", file.path(), mode));
    if (packing == Packing::kPacked) {
      std::vector<int> lengths(windows->size());
      for (size_t p = 0; p < windows->size(); ++p)
        lengths[p] = static_cast<int>(std::min<int64_t>(T_, (*windows)[p].second - 1 - (*windows)[p].first));
      auto [placed, offsets] = best_fit_decreasing(lengths, T_);
      auto by_row = std::make_shared<std::vector<std::pair<int64_t, int64_t>>>(windows->size());
      for (size_t k = 0; k < placed.size(); ++k) (*by_row)[k] = (*windows)[static_cast<size_t>(placed[k])];
      windows = std::move(by_row);
      rows_ = std::make_shared<const std::vector<int64_t>>(std::move(offsets));
      count_ = total_ = static_cast<int64_t>(rows_->size()) - 1;
    } else {
      count_ = total_ = static_cast<int64_t>(windows->size());
    }
    windows_ = std::move(windows);
    return;
  }
  int64_t full = n >= 1 ? (n - 1) / T_ : 0;
  const int64_t tail = n - full * T_;  // tokens from the first unused sequence start
  if (pad_last && tail >= 2) ++full;
  count_ = total_ = full;
  if (count_ == 0)
    throw InputError(fmt::format("{}: {} tokens make no sequence of max_seq_len {} (needs {} tokens)", file.path(), n,
                                 T_, T_ + 1));
}

int64_t PackedDataset::max_pieces() const {
  if (!rows_) return 1;
  int64_t most = 1;
  const std::vector<int64_t>& rows = *rows_;
  for (int64_t i = first_; i < first_ + count_; ++i)
    most = std::max(most, rows[static_cast<size_t>(i + 1)] - rows[static_cast<size_t>(i)] + 1);
  return most;
}

PackedDataset PackedDataset::range(int64_t first, int64_t count) const {
  QS_CHECK(first >= 0 && count >= 0 && first + count <= count_, "PackedDataset::range out of bounds");
  PackedDataset d = *this;
  d.first_ = first_ + first;
  d.count_ = count;
  return d;
}

int PackedDataset::get(int64_t i, int32_t* inputs, int32_t* targets, int32_t* positions) const {
  QS_CHECK(i >= 0 && i < count_, "sequence index out of range");
  const uint32_t id_bits = id_bits_;
  if (rows_) {  // packed: the row's pieces, then padding; positions restart with each
    const std::vector<int64_t>& rows = *rows_;
    int j = 0;
    for (int64_t k = rows[static_cast<size_t>(first_ + i)]; k < rows[static_cast<size_t>(first_ + i + 1)]; ++k) {
      const auto [s, end] = (*windows_)[static_cast<size_t>(k)];
      const int len = static_cast<int>(std::min<int64_t>(T_, end - 1 - s));
      for (int t = 0; t < len; ++t, ++j) {
        const uint32_t next = tokens_[static_cast<size_t>(s + t + 1)];
        inputs[j] = static_cast<int32_t>(tokens_[static_cast<size_t>(s + t)] & id_bits);
        targets[j] = loss_mask_ && (next & kTokenNoLoss) ? kIgnoreIndex : static_cast<int32_t>(next & id_bits);
        if (positions) positions[j] = t;
      }
    }
    const int used = j;
    for (int t = 0; j < T_; ++j, ++t) {
      inputs[j] = 0;
      targets[j] = kIgnoreIndex;
      if (positions) positions[j] = t;
    }
    return used;
  }
  if (positions)
    for (int j = 0; j < T_; ++j) positions[j] = j;
  int64_t start = (first_ + i) * T_;
  int64_t n = static_cast<int64_t>(tokens_.size());
  if (windows_) std::tie(start, n) = (*windows_)[static_cast<size_t>(first_ + i)];  // the document ends at n
  for (int j = 0; j < T_; ++j) {
    const int64_t a = start + j, b = start + j + 1;
    inputs[j] = a < n ? static_cast<int32_t>(tokens_[a] & id_bits) : 0;
    targets[j] = b < n && !(loss_mask_ && (tokens_[b] & kTokenNoLoss)) ? static_cast<int32_t>(tokens_[b] & id_bits)
                                                                        : kIgnoreIndex;
  }
  return static_cast<int>(std::clamp<int64_t>(n - start, 0, T_));
}

std::pair<PackedDataset, PackedDataset> split_eval(const PackedDataset& all, double eval_fraction) {
  QS_CHECK(eval_fraction > 0 && eval_fraction < 1, "eval_fraction must be in (0, 1)");
  const int64_t n = all.num_sequences();
  if (n < 2)
    throw InputError(fmt::format("data.eval_fraction = {}: only {} sequence(s) of max_seq_len {}; need >= 2 to hold "
                                 "some out",
                                 eval_fraction, n, all.max_seq_len()));
  int64_t n_eval = static_cast<int64_t>(static_cast<double>(n) * eval_fraction);
  n_eval = std::max<int64_t>(1, std::min(n_eval, n - 1));
  return {all.range(0, n - n_eval), all.range(n - n_eval, n_eval)};
}

// ---- DistributedSampler ---------------------------------------------------------------------

DistributedSampler::DistributedSampler(int64_t num_sequences, int64_t global_batch, uint64_t seed, int rank, int world)
    : n_(num_sequences), G_(global_batch), seed_(seed), rank_(rank), world_(world) {
  QS_CHECK(world >= 1 && rank >= 0 && rank < world, "bad rank / world");
  QS_CHECK(global_batch > 0 && global_batch % world == 0, "global_batch must be a positive multiple of world");
  if (n_ < G_)
    throw InputError(fmt::format("the training data has {} sequences, fewer than one global batch of {} "
                                 "(use more data, a shorter data.max_seq_len or a smaller batch.global_batch_size)",
                                 n_, G_));
  steps_per_epoch_ = n_ / G_;
}

std::vector<int64_t> DistributedSampler::permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  uint64_t s = seed ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(epoch + 1));
  splitmix64(s);
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[bounded(s, static_cast<uint64_t>(i + 1))]);
  return p;
}

void DistributedSampler::ensure_permutation() {
  if (perm_epoch_ != state_.epoch) {
    perm_ = permutation(n_, seed_, state_.epoch);
    perm_epoch_ = state_.epoch;
  }
}

std::vector<int64_t> DistributedSampler::next(int64_t micro) {
  const int64_t per_rank = G_ / world_;
  QS_CHECK(micro > 0 && per_rank % micro == 0,
           fmt::format("micro batch {} must divide global_batch / world = {}", micro, per_rank));
  ensure_permutation();
  const int64_t begin = state_.step * G_ + rank_ * per_rank + state_.offset;
  std::vector<int64_t> out(perm_.begin() + begin, perm_.begin() + begin + micro);
  state_.offset += micro;
  if (state_.offset == per_rank) {
    state_.offset = 0;
    if (++state_.step == steps_per_epoch_) {
      state_.step = 0;
      ++state_.epoch;
    }
  }
  return out;
}

nlohmann::json DistributedSampler::state_json() const {
  return {{"epoch", state_.epoch},   {"step", state_.step}, {"offset", state_.offset},
          {"seed", seed_},           {"num_sequences", n_}, {"global_batch", G_}};
}

void DistributedSampler::restore(const nlohmann::json& j, const std::string& label) {
  const JsonField state = JsonField(j, label).object();
  SamplerState s;
  s.epoch = state.at("epoch", "an integer").integer(0);
  s.step = state.at("step", "an integer").integer(0);
  s.offset = state.at("offset", "an integer").integer(0);
  // The seed is a uint64 (data.seed): any JSON integer from 0 to 2^64 - 1.
  const JsonField seed_field = state.at("seed", "an integer");
  if (!seed_field.json().is_number_unsigned() &&
      !(seed_field.json().is_number_integer() && seed_field.json().get<int64_t>() >= 0))
    seed_field.expected("an integer from 0 to 2^64 - 1");
  const uint64_t seed = seed_field.json().get<uint64_t>();
  const int64_t n = state.at("num_sequences", "an integer").integer(0);
  const int64_t g = state.at("global_batch", "an integer").integer(1);
  if (seed != seed_ || n != n_ || g != G_)
    throw InputError(fmt::format("data loader state (seed {}, {} sequences, global batch {}) does not match this run "
                                 "(seed {}, {} sequences, global batch {}): data, data.packing, data.seed, data.max_seq_len "
                                 "and batch.global_batch_size must stay the same on resume (a run from before "
                                 "data.packing's default became auto: set data.packing: wrapped)",
                                 seed, n, g, seed_, n_, G_));
  if (s.epoch < 0 || s.step < 0 || s.step >= steps_per_epoch_ || s.offset < 0 || s.offset >= G_ / world_)
    throw InputError(fmt::format("data loader state {}: out of range for {} steps per epoch and {} sequences per rank",
                                 j.dump(), steps_per_epoch_, G_ / world_));
  state_ = s;
}

// ---- batches --------------------------------------------------------------------------------

Batch make_batch(const PackedDataset& data, std::span<const int64_t> indices) {
  Batch b;
  b.B = static_cast<int>(indices.size());
  b.T = data.max_seq_len();
  b.inputs.resize(static_cast<size_t>(b.B) * b.T);
  b.targets.resize(b.inputs.size());
  if (data.restarts_positions()) b.positions.resize(b.inputs.size());
  for (int i = 0; i < b.B; ++i) {
    const size_t row = static_cast<size_t>(i) * b.T;
    b.tokens += data.get(indices[i], b.inputs.data() + row, b.targets.data() + row,
                         b.positions.empty() ? nullptr : b.positions.data() + row);
  }
  return b;
}

std::pair<int64_t, int64_t> eval_range(int64_t n, int rank, int world) {
  return {n * rank / world, n * (rank + 1) / world};
}

}  // namespace qshard
