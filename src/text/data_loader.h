// data_loader.h: packed training sequences, the deterministic distributed sampler, batches.
//
// Packing (PackedDataset): the token file is one stream t[0..N). With T = max_seq_len, sequence i
// is the T + 1 tokens t[i*T, i*T + T + 1) (consecutive sequences share one token): its inputs are
// the first T, its targets the last T (targets[j] = inputs[j + 1], next-token prediction).
// Documents are packed back to back across sequence boundaries (each carries its own BOS/EOS).
// Count: floor((N - 1) / T) full sequences; the leftover tail (< T + 1 tokens) is dropped, so
// training batches have no padding. With pad_last = true the tail (if it has >= 2 tokens)
// becomes one more sequence whose missing positions have input 0 and target kIgnoreIndex (-100,
// the loss skips them); eval uses this so that small eval files still count.
// That is Packing::kWrapped (data.packing: wrapped): a token attends to the documents before it
// in its sequence, and a document's last token has the next one's first as its target.
// Padded (Packing::kPadded; data.packing: padded): no sequence holds more than one document, so no
// token attends across a document boundary. Documents are found by the kTokenDocStart bit of a
// version 3 token file (text/token_file.h; an older file is an InputError naming it). A document
// of n >= 2 tokens gives ceil((n - 1) / T) pieces: piece k of it is tokens [k*T, k*T + T + 1)
// of the document (targets: min(T, n - 1 - k*T) next tokens), the positions past its end input 0
// and target kIgnoreIndex (the causal mask keeps the padding from touching the real positions).
// Documents of one token are skipped. One piece per sequence.
// Packed (Packing::kPacked; data.packing: packed): the padded run's pieces, several to a sequence
// and no padding between them. The pieces are placed best-fit decreasing: longest first (ties in
// file order), each into the sequence with the least room that still holds it, else a new one
// (deterministic: it depends on the file and T only). Within a sequence the pieces lie in the
// order placed, each as many inputs as it has targets, then padding (input 0, target
// kIgnoreIndex) up to T. Positions restart at 0 with
// each piece (and with the padding), and the model's attention keeps to a piece: position p of
// a sequence reads positions p - pos[p] .. p (LlamaModel: the `positions` of a batch). So every
// (context, target) pair of the padded run is here, with the same context: the loss over the
// whole data is the padded run's, in about (tokens / T) sequences rather than one per piece.
// A dataset may be a contiguous range of sequences of a larger one (`range`), which is how the
// eval split is held out: split_eval(all, f) keeps the last max(1, floor(n * f)) sequences for
// eval (when f > 0 and n >= 2) and the rest for training, the same on every rank and world size.
//
// Sampler (DistributedSampler): G = global batch (sequences per optimizer step over all ranks),
// W = world size, rank r. Per epoch e the n sequences are shuffled by a permutation that depends
// only on (seed, e) and n: Fisher-Yates with splitmix64 and unbiased bounded draws (portable,
// unlike std::shuffle). Steps per epoch: S = floor(n / G) (the last n - S*G of the permutation
// are not used in that epoch). Global batch s of epoch e = perm_e[s*G, (s+1)*G); rank r owns the
// contiguous slice [s*G + r*G/W, s*G + (r+1)*G/W) and reads it in micro-batches, in order. So the
// union over ranks of step s is the same set for every W, and micro-batch k of rank r is a fixed
// subset of it. After S steps the epoch advances (a new permutation).
// State: (epoch, step, offset) with offset = sequences of this rank's slice already read in the
// current step (0 at a step boundary, where checkpoints are taken); serialized as JSON together
// with seed, n and G, which restore() checks. At offset 0 the state does not depend on W or r,
// so a run can resume at another world size.
//
// Batch: inputs and targets [B, T] row-major int32 (B = micro batch, T = max_seq_len); positions
// [B, T] for packed data (empty otherwise: position t of each row is t).
// Thread safety: PackedDataset is immutable; sampler and loader are used from one thread.
// Ownership: a PackedDataset views the TokenFile's mapping; the TokenFile must outlive it.
#pragma once

#include "runtime/ignore_index.h"

#include <cstdint>
#include <memory>
#include <string>
#include <span>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/token_file.h"

namespace qshard {

// kIgnoreIndex (-100, the target of padded positions) comes from runtime/ignore_index.h.

enum class Packing : uint8_t { kWrapped, kPadded, kPacked };
// "wrapped" | "padded" | "packed"; anything else throws InputError naming the value ("auto" too:
// resolve_packing takes it).
Packing parse_packing(const std::string& name);
// data.packing as a job runs it: "auto" (the default) is packed when the training file, and the
// eval file if any, mark their documents (version 3 or later: what qshard tokenize writes), else
// wrapped (an older file says nothing of its documents); any other name is parse_packing's.
Packing resolve_packing(const std::string& name, const TokenFile& train, const TokenFile* eval = nullptr);

class PackedDataset {
 public:
  // REQUIRES: max_seq_len > 0. Throws InputError naming the file if it holds no sequence.
  // pad_last: wrapped mode only.
  PackedDataset(const TokenFile& file, int max_seq_len, bool pad_last = false, Packing packing = Packing::kWrapped);

  int64_t num_sequences() const { return count_; }
  int max_seq_len() const { return T_; }
  // Sequences [first, first + count) of this dataset as a dataset. REQUIRES: in range.
  PackedDataset range(int64_t first, int64_t count) const;
  // Writes sequence i's inputs and targets (T each; a target past the stream, or a token the file
  // marks kTokenNoLoss, is kIgnoreIndex). Returns the input positions that hold a token (T but for
  // padding: a padded document's end, the padded tail). REQUIRES: 0 <= i < num_sequences().
  // positions (T, optional): each input's position in its piece (packed: restarting with each
  // piece; else 0..T-1).
  int get(int64_t i, int32_t* inputs, int32_t* targets, int32_t* positions = nullptr) const;
  // Whether get's positions restart within a sequence (packed data): the model must be given them.
  bool restarts_positions() const { return rows_ != nullptr; }
  // The most pieces (runs of positions from 0) one of this dataset's sequences holds, its padded
  // tail counted as one: packed, its documents' pieces + 1 at most; otherwise 1.
  int64_t max_pieces() const;

 private:
  PackedDataset() = default;
  std::span<const uint32_t> tokens_;
  int T_ = 0;
  int64_t first_ = 0;  // in sequences of the whole stream
  int64_t count_ = 0;
  int64_t total_ = 0;  // sequences of the whole stream (incl. a padded tail)
  bool loss_mask_ = false;  // version 2 file: kTokenNoLoss tokens are never targets
  uint32_t id_bits_ = ~0u;
  // Padded and packed: the pieces, each its first token and its document's end. Padded: piece i
  // is sequence i; packed: sequence i holds pieces [(*rows_)[i], (*rows_)[i + 1]) of windows_.
  std::shared_ptr<const std::vector<std::pair<int64_t, int64_t>>> windows_;
  std::shared_ptr<const std::vector<int64_t>> rows_;
};

// {train, eval}: eval = the last max(1, floor(n * eval_fraction)) sequences. REQUIRES:
// 0 < eval_fraction < 1; throws InputError when fewer than 2 sequences exist.
std::pair<PackedDataset, PackedDataset> split_eval(const PackedDataset& all, double eval_fraction);

struct SamplerState {
  int64_t epoch = 0;
  int64_t step = 0;    // step within the epoch
  int64_t offset = 0;  // sequences of this rank's slice read in the current step
};

class DistributedSampler {
 public:
  // REQUIRES: global_batch % world == 0, 0 <= rank < world. Throws InputError when the dataset
  // has fewer sequences than one global batch.
  DistributedSampler(int64_t num_sequences, int64_t global_batch, uint64_t seed, int rank, int world);

  // The next `micro` sequence indices of this rank's slice; moves to the next step (and epoch)
  // when the slice is used up. REQUIRES: micro divides global_batch / world.
  std::vector<int64_t> next(int64_t micro);
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  // Optimizer steps completed since the start (epoch * steps_per_epoch + step).
  int64_t global_step() const { return state_.epoch * steps_per_epoch_ + state_.step; }
  const SamplerState& state() const { return state_; }

  // {"epoch", "step", "offset", "seed", "num_sequences", "global_batch"}
  nlohmann::json state_json() const;
  // Throws InputError when seed, num_sequences or global_batch differ from this sampler's, or
  // when offset != 0 and does not fit this world size; a missing or mistyped field is an InputError
  // naming `label` (where the state was read: a checkpoint's metadata.json) and the field.
  void restore(const nlohmann::json& state, const std::string& label = "data loader state");

  // The epoch's permutation of [0, n) (world independent).
  static std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch);

 private:
  void ensure_permutation();
  int64_t n_, G_;
  uint64_t seed_;
  int rank_, world_;
  int64_t steps_per_epoch_;
  SamplerState state_;
  std::vector<int64_t> perm_;
  int64_t perm_epoch_ = -1;
};

struct Batch {
  std::vector<int32_t> inputs;   // [B, T]
  std::vector<int32_t> targets;  // [B, T]; kIgnoreIndex where padded
  std::vector<int32_t> positions;  // [B, T] of packed data (PackedDataset::restarts_positions); else empty
  int B = 0;
  int T = 0;
  int64_t tokens = 0;            // input positions that hold a token (B x T less the padding)
};

// The sequences `indices` of `data` as one batch.
Batch make_batch(const PackedDataset& data, std::span<const int64_t> indices);

// Eval sequences of rank r: the contiguous range [r*n/W, (r+1)*n/W) (remainders spread).
std::pair<int64_t, int64_t> eval_range(int64_t num_sequences, int rank, int world);

// Sampler + dataset: what the trainer calls each micro-step.
class DataLoader {
 public:
  DataLoader(const PackedDataset& data, int64_t global_batch, uint64_t seed, int rank, int world)
      : data_(data), sampler_(data.num_sequences(), global_batch, seed, rank, world) {}
  Batch next_batch(int micro_batch_size) { return make_batch(data_, sampler_.next(micro_batch_size)); }
  const DistributedSampler& sampler() const { return sampler_; }
  nlohmann::json state() const { return sampler_.state_json(); }
  void restore(const nlohmann::json& state, const std::string& label = "data loader state") {
    sampler_.restore(state, label);
  }

 private:
  PackedDataset data_;
  DistributedSampler sampler_;
};

}  // namespace qshard
