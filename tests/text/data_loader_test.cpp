#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "runtime/error.h"
#include "common/test_util.h"
#include "text/data_loader.h"

namespace qshard {
namespace {

using testing_util::TempDir;

// A token file holding 0, 1, 2, ..., n-1 (so a token's value is its position).
std::string iota_file(const TempDir& dir, int64_t n, const std::string& name = "t.tok") {
  std::vector<uint32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), 0u);
  write_token_file(dir.file(name), static_cast<uint32_t>(n), t);
  return dir.file(name);
}

TEST(PackedDataset, SequencesAreShiftedWindows) {
  TempDir dir;
  const TokenFile f = TokenFile::open(iota_file(dir, 35));
  const PackedDataset d(f, 8);
  EXPECT_EQ(d.num_sequences(), 4);  // (35 - 1) / 8; tail 32..34 dropped
  std::vector<int32_t> in(8), tg(8);
  d.get(2, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<int32_t>{16, 17, 18, 19, 20, 21, 22, 23}));
  EXPECT_EQ(tg, (std::vector<int32_t>{17, 18, 19, 20, 21, 22, 23, 24}));
  d.get(3, in.data(), tg.data());
  EXPECT_EQ(tg.back(), 32);  // the last full sequence reads token 32 as its last target
}

TEST(PackedDataset, PadLastUsesIgnoreIndex) {
  TempDir dir;
  const TokenFile f = TokenFile::open(iota_file(dir, 35));
  const PackedDataset d(f, 8, /*pad_last=*/true);
  ASSERT_EQ(d.num_sequences(), 5);
  std::vector<int32_t> in(8), tg(8);
  d.get(4, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<int32_t>{32, 33, 34, 0, 0, 0, 0, 0}));
  EXPECT_EQ(tg, (std::vector<int32_t>{33, 34, -100, -100, -100, -100, -100, -100}));
}

// Padded: documents A (3 tokens), B (1 token: skipped), C (12 tokens) of a version 3 file, T = 4.
// Every sequence holds one document: A padded; C in 3 windows (k*4 .. k*4 + 5), the last padded;
// the loss mask is honoured; no target is ever a token of another document.
TEST(PackedDataset, PaddedKeepsDocumentsApart) {
  TempDir dir;
  std::vector<uint32_t> t;
  auto doc = [&](uint32_t first, int n, bool masked_head) {
    for (int i = 0; i < n; ++i) {
      uint32_t id = first + static_cast<uint32_t>(i);
      if (i == 0) id |= kTokenDocStart;
      if (masked_head && i < 2) id |= kTokenNoLoss;
      t.push_back(id);
    }
  };
  doc(10, 3, false);  // A: 10 11 12
  doc(20, 1, false);  // B: 20
  doc(30, 12, true);  // C: 30 .. 41, its first two tokens context only
  {
    TokenFileWriter w(dir.file("d.tok"), 64, /*loss_mask=*/true, /*doc_starts=*/true);
    w.append(t);
    w.finish();
  }
  const TokenFile f = TokenFile::open(dir.file("d.tok"));
  EXPECT_TRUE(f.doc_starts());
  EXPECT_NO_THROW(f.validate(64));
  const PackedDataset d(f, 4, false, Packing::kPadded);
  ASSERT_EQ(d.num_sequences(), 4);
  std::vector<int32_t> in(4), tg(4);
  const int32_t X = static_cast<int32_t>(kIgnoreIndex);
  // The return value counts the input positions holding a token (throughput: padding excluded).
  EXPECT_EQ(d.get(0, in.data(), tg.data()), 3);
  EXPECT_EQ(in, (std::vector<int32_t>{10, 11, 12, 0}));
  EXPECT_EQ(tg, (std::vector<int32_t>{11, 12, X, X}));
  EXPECT_EQ(d.get(1, in.data(), tg.data()), 4);
  EXPECT_EQ(in, (std::vector<int32_t>{30, 31, 32, 33}));
  EXPECT_EQ(tg, (std::vector<int32_t>{X, 32, 33, 34}));  // 31 is context only
  d.get(3, in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<int32_t>{38, 39, 40, 41}));
  EXPECT_EQ(tg, (std::vector<int32_t>{39, 40, 41, X}));
  // The same file packed: A's last target is B's token (documents share sequences).
  const PackedDataset p(f, 4);
  EXPECT_EQ(p.get(0, in.data(), tg.data()), 4);
  EXPECT_EQ(tg, (std::vector<int32_t>{11, 12, 20, X}));
  // A batch counts its tokens: sequences 0 (3 tokens and a pad) and 1 (4 tokens) of the padded set.
  const std::vector<int64_t> idx = {0, 1};
  const Batch b = make_batch(d, idx);
  EXPECT_EQ(b.tokens, 7);
  int64_t targets = 0;
  for (int32_t v : b.targets) targets += v != X;
  EXPECT_EQ(targets, 5);  // fewer loss targets than tokens: masked context and the document's end
  // Ranges and the eval split work on padded sequences too.
  const auto [train, eval] = split_eval(d, 0.25);
  EXPECT_EQ(train.num_sequences(), 3);
  eval.get(0, in.data(), tg.data());
  EXPECT_EQ(in[0], 38);
}

// Every (context, target) pair of a dataset: the context is the inputs from the start of the
// token's piece (its position back) to the token itself.
std::multiset<std::pair<std::vector<int32_t>, int32_t>> context_pairs(const PackedDataset& d) {
  const int T = d.max_seq_len();
  std::multiset<std::pair<std::vector<int32_t>, int32_t>> out;
  std::vector<int32_t> in(T), tg(T), pos(T);
  for (int64_t i = 0; i < d.num_sequences(); ++i) {
    d.get(i, in.data(), tg.data(), pos.data());
    for (int j = 0; j < T; ++j) {
      if (tg[j] == kIgnoreIndex) continue;
      EXPECT_GE(j - pos[j], 0);
      out.insert({std::vector<int32_t>(in.begin() + (j - pos[j]), in.begin() + j + 1), tg[j]});
    }
  }
  return out;
}

// A version 3 file of documents with the given lengths (token values count up from 1; the first
// two tokens of every third document are context only).
std::string doc_file(const TempDir& dir, const std::vector<int>& lengths) {
  std::vector<uint32_t> t;
  uint32_t next = 1;
  for (size_t d = 0; d < lengths.size(); ++d)
    for (int i = 0; i < lengths[d]; ++i) {
      uint32_t id = next++ % 4000 + 1;
      if (i == 0) id |= kTokenDocStart;
      if (d % 3 == 2 && i < 2) id |= kTokenNoLoss;
      t.push_back(id);
    }
  TokenFileWriter w(dir.file("docs.tok"), 4096, /*loss_mask=*/true, /*doc_starts=*/true);
  w.append(t);
  w.finish();
  return dir.file("docs.tok");
}

// Packed: documents A (3 tokens), B (1: skipped), C (12), D (2) at T = 4 are the pieces A (2
// targets), C (4, 4, 3) and D (1), placed longest first: C0 and C1 fill a row each, C2 opens a
// row with room 1, A one with room 2, and D goes to the row with the least room that holds it
// (C2's). Positions restart with each piece and with the padding.
TEST(PackedDataset, PackedPlacesThePaddedPiecesBestFitDecreasing) {
  TempDir dir;
  std::vector<uint32_t> t;
  auto doc = [&](uint32_t first, int n) {
    for (int i = 0; i < n; ++i) t.push_back((first + static_cast<uint32_t>(i)) | (i == 0 ? kTokenDocStart : 0u));
  };
  doc(10, 3);  // A: 10 11 12
  doc(20, 1);  // B: 20
  doc(30, 12);  // C: 30 .. 41
  doc(50, 2);  // D: 50 51
  {
    TokenFileWriter w(dir.file("d.tok"), 64, /*loss_mask=*/false, /*doc_starts=*/true);
    w.append(t);
    w.finish();
  }
  const TokenFile f = TokenFile::open(dir.file("d.tok"));
  const PackedDataset d(f, 4, false, Packing::kPacked);
  EXPECT_TRUE(d.restarts_positions());
  ASSERT_EQ(d.num_sequences(), 4);
  std::vector<int32_t> in(4), tg(4), pos(4);
  const int32_t X = static_cast<int32_t>(kIgnoreIndex);
  EXPECT_EQ(d.get(0, in.data(), tg.data(), pos.data()), 4);
  EXPECT_EQ(in, (std::vector<int32_t>{30, 31, 32, 33}));
  EXPECT_EQ(tg, (std::vector<int32_t>{31, 32, 33, 34}));
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 3}));
  d.get(1, in.data(), tg.data(), pos.data());
  EXPECT_EQ(in, (std::vector<int32_t>{34, 35, 36, 37}));
  EXPECT_EQ(d.get(2, in.data(), tg.data(), pos.data()), 4);
  EXPECT_EQ(in, (std::vector<int32_t>{38, 39, 40, 50}));
  EXPECT_EQ(tg, (std::vector<int32_t>{39, 40, 41, 51}));
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 0}));
  EXPECT_EQ(d.get(3, in.data(), tg.data(), pos.data()), 2);
  EXPECT_EQ(in, (std::vector<int32_t>{10, 11, 0, 0}));
  EXPECT_EQ(tg, (std::vector<int32_t>{11, 12, X, X}));
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 0, 1}));
  // A batch carries the positions; wrapped and padded batches do not need them.
  const std::vector<int64_t> idx = {2, 3};
  const Batch b = make_batch(d, idx);
  EXPECT_EQ(b.tokens, 6);
  EXPECT_EQ(b.positions, (std::vector<int32_t>{0, 1, 2, 0, 0, 1, 0, 1}));
  EXPECT_TRUE(make_batch(PackedDataset(f, 4, false, Packing::kPadded), idx).positions.empty());
  // The same pairs as the padded run.
  EXPECT_EQ(context_pairs(d), context_pairs(PackedDataset(f, 4, false, Packing::kPadded)));
}

// Over many documents of mixed lengths (some longer than T, the loss mask in use): packed has
// every (context, target) pair of padded, no more, in far fewer sequences; the placement does not
// depend on anything but the file and T.
TEST(PackedDataset, PackedHasThePaddedRunsPairsInFewerSequences) {
  TempDir dir;
  std::vector<int> lengths;
  uint64_t s = 7;
  for (int d = 0; d < 400; ++d) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    lengths.push_back(1 + static_cast<int>((s >> 33) % 90));
  }
  const TokenFile f = TokenFile::open(doc_file(dir, lengths));
  for (int T : {16, 64, 128}) {
    const PackedDataset padded(f, T, false, Packing::kPadded), packed(f, T, false, Packing::kPacked);
    EXPECT_EQ(context_pairs(packed), context_pairs(padded)) << "T = " << T;
    int64_t inputs = 0;
    std::vector<int32_t> in(T), tg(T), pos(T);
    for (int64_t i = 0; i < packed.num_sequences(); ++i) inputs += packed.get(i, in.data(), tg.data(), pos.data());
    // Best fit leaves less than one sequence of room in all but a few rows.
    EXPECT_LT(packed.num_sequences(), inputs / T + 3) << "T = " << T;
    // At T = 128 every document is one piece (1 to 90 tokens): packed needs well under half the
    // sequences of padded; at 16 most pieces are full ones in both.
    EXPECT_LT(packed.num_sequences() * (T == 128 ? 2 : 1), padded.num_sequences()) << "T = " << T;
    const PackedDataset again(f, T, false, Packing::kPacked);
    std::vector<int32_t> in2(T), tg2(T), pos2(T);
    for (int64_t i = 0; i < packed.num_sequences(); ++i) {
      packed.get(i, in.data(), tg.data(), pos.data());
      again.get(i, in2.data(), tg2.data(), pos2.data());
      ASSERT_EQ(in, in2);
    }
  }
}

TEST(PackedDataset, PaddedNeedsDocumentStarts) {
  TempDir dir;
  const TokenFile f = TokenFile::open(iota_file(dir, 35));
  try {
    PackedDataset d(f, 8, false, Packing::kPadded);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(f.path()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("version 3"), std::string::npos) << e.what();
  }
  try {
    PackedDataset d(f, 8, false, Packing::kPacked);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("data.packing packed needs"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_packing("sorted"), InputError);
  EXPECT_EQ(parse_packing("wrapped"), Packing::kWrapped);
  EXPECT_EQ(parse_packing("packed"), Packing::kPacked);
}

// data.packing auto (the default): packed when the files mark their documents, else wrapped; the
// other names as they are (an explicit packed on an older file still refused by the dataset).
TEST(PackedDataset, AutoPacksFilesThatMarkTheirDocuments) {
  TempDir dir;
  const TokenFile old = TokenFile::open(iota_file(dir, 35));
  const TokenFile docs = TokenFile::open(doc_file(dir, {5, 9, 3}));
  EXPECT_EQ(resolve_packing("auto", docs), Packing::kPacked);
  EXPECT_EQ(resolve_packing("auto", old), Packing::kWrapped);
  EXPECT_EQ(resolve_packing("auto", docs, &old), Packing::kWrapped);  // the eval file says nothing of its documents
  EXPECT_EQ(resolve_packing("auto", docs, &docs), Packing::kPacked);
  EXPECT_EQ(resolve_packing("padded", docs), Packing::kPadded);
  EXPECT_EQ(resolve_packing("packed", old), Packing::kPacked);
  EXPECT_THROW(resolve_packing("sorted", docs), InputError);
  // The most pieces a sequence holds: packed, its pieces and the padded tail; otherwise 1.
  const PackedDataset packed(docs, 8, false, Packing::kPacked);
  EXPECT_EQ(packed.max_pieces(), 3);  // pieces of 8, 4, 2 targets: rows [8] and [4, 2] + 2 of padding
  EXPECT_EQ(PackedDataset(docs, 8, false, Packing::kPadded).max_pieces(), 1);
  EXPECT_EQ(PackedDataset(old, 8).max_pieces(), 1);
}

TEST(PackedDataset, TooFewTokensNamesTheFile) {
  TempDir dir;
  const TokenFile f = TokenFile::open(iota_file(dir, 8));
  try {
    PackedDataset d(f, 8);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), f.path() + ": 8 tokens make no sequence of max_seq_len 8 (needs 9 tokens)");
  }
}

TEST(PackedDataset, EvalSplitHoldsOutTheLastSequences) {
  TempDir dir;
  const TokenFile f = TokenFile::open(iota_file(dir, 4 * 100 + 1));
  const PackedDataset all(f, 4);
  ASSERT_EQ(all.num_sequences(), 100);
  const auto [train, eval] = split_eval(all, 0.05);
  EXPECT_EQ(train.num_sequences(), 95);
  EXPECT_EQ(eval.num_sequences(), 5);
  std::vector<int32_t> in(4), tg(4);
  eval.get(0, in.data(), tg.data());
  EXPECT_EQ(in[0], 95 * 4);  // eval sequence 0 = sequence 95 of the stream
  EXPECT_EQ(split_eval(all, 0.001).second.num_sequences(), 1);  // at least one
  const TokenFile one = TokenFile::open(iota_file(dir, 5, "one.tok"));
  EXPECT_THROW(split_eval(PackedDataset(one, 4), 0.5), InputError);
}

TEST(DistributedSampler, PermutationIsDeterministicAndComplete) {
  const auto p = DistributedSampler::permutation(1000, 7, 0);
  auto sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(p, DistributedSampler::permutation(1000, 7, 0));
  EXPECT_NE(p, DistributedSampler::permutation(1000, 7, 1));  // new order each epoch
  EXPECT_NE(p, DistributedSampler::permutation(1000, 8, 0));  // and per seed
  // Pinned values: the order must not change across platforms or releases (resume depends on it).
  EXPECT_EQ(DistributedSampler::permutation(10, 1234, 0), (std::vector<int64_t>{0, 4, 2, 9, 3, 6, 7, 5, 8, 1}));
}

// Every rank's micro-batches of one step, for world size W.
std::vector<std::multiset<int64_t>> steps_union(int64_t n, int64_t G, int W, int64_t micro, int64_t steps) {
  std::vector<DistributedSampler> samplers;
  for (int r = 0; r < W; ++r) samplers.emplace_back(n, G, 99, r, W);
  std::vector<std::multiset<int64_t>> out;
  for (int64_t s = 0; s < steps; ++s) {
    std::multiset<int64_t> u;
    for (auto& smp : samplers)
      for (int64_t k = 0; k < G / W / micro; ++k)
        for (int64_t i : smp.next(micro)) u.insert(i);
    out.push_back(u);
  }
  return out;
}

TEST(DistributedSampler, SameUnionPerStepForWorldSizes124) {
  const int64_t n = 50, G = 8, steps = 14;  // 6 steps per epoch: crosses two epoch boundaries
  const auto w1 = steps_union(n, G, 1, 2, steps);
  const auto w2 = steps_union(n, G, 2, 2, steps);
  const auto w4 = steps_union(n, G, 4, 1, steps);
  for (int64_t s = 0; s < steps; ++s) {
    EXPECT_EQ(w1[s].size(), 8u);
    EXPECT_EQ(std::set<int64_t>(w1[s].begin(), w1[s].end()).size(), 8u);  // no repeats in a step
    EXPECT_EQ(w1[s], w2[s]) << "step " << s;
    EXPECT_EQ(w1[s], w4[s]) << "step " << s;
  }
  // Within an epoch no sequence repeats.
  std::set<int64_t> epoch0;
  for (int s = 0; s < 6; ++s) epoch0.insert(w1[s].begin(), w1[s].end());
  EXPECT_EQ(epoch0.size(), 48u);
}

TEST(DistributedSampler, RankSlicesAreContiguousInThePermutation) {
  const auto perm = DistributedSampler::permutation(40, 5, 0);
  DistributedSampler r1(40, 8, 5, 1, 2);
  EXPECT_EQ(r1.next(2), (std::vector<int64_t>{perm[4], perm[5]}));
  EXPECT_EQ(r1.next(2), (std::vector<int64_t>{perm[6], perm[7]}));
  EXPECT_EQ(r1.global_step(), 1);
  EXPECT_EQ(r1.next(2), (std::vector<int64_t>{perm[12], perm[13]}));
}

TEST(DistributedSampler, ResumeGivesTheSameNextBatches) {
  DistributedSampler a(50, 8, 3, 0, 1);
  for (int i = 0; i < 4 * 9; ++i) a.next(2);  // 9 steps: into epoch 1
  const nlohmann::json state = a.state_json();
  EXPECT_EQ(state["epoch"], 1);
  EXPECT_EQ(state["step"], 3);
  EXPECT_EQ(state["offset"], 0);
  // Round trip through text, as a checkpoint would.
  const auto restored_state = nlohmann::json::parse(state.dump());
  DistributedSampler b(50, 8, 3, 0, 1);
  b.restore(restored_state);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.next(2), b.next(2)) << i;

  // Resuming at another world size: the union of the next step is the same.
  DistributedSampler c(50, 8, 3, 0, 1), r0(50, 8, 3, 0, 2), r1(50, 8, 3, 1, 2);
  for (int i = 0; i < 4 * 9; ++i) c.next(2);
  r0.restore(restored_state);
  r1.restore(restored_state);
  std::multiset<int64_t> u1, u2;
  for (int k = 0; k < 4; ++k)
    for (int64_t i : c.next(2)) u1.insert(i);
  for (auto* s : {&r0, &r1})
    for (int k = 0; k < 2; ++k)
      for (int64_t i : s->next(2)) u2.insert(i);
  EXPECT_EQ(u1, u2);
}

TEST(DistributedSampler, RestoreRejectsMismatch) {
  DistributedSampler a(50, 8, 3, 0, 1);
  nlohmann::json s = a.state_json();
  DistributedSampler other_seed(50, 8, 4, 0, 1);
  EXPECT_THROW(other_seed.restore(s), InputError);
  DistributedSampler other_n(60, 8, 3, 0, 1);
  EXPECT_THROW(other_n.restore(s), InputError);
  s["step"] = 6;  // only 6 steps per epoch: 0..5
  EXPECT_THROW(a.restore(s), InputError);
  EXPECT_THROW(a.restore(nlohmann::json{{"epoch", 0}}), InputError);
  EXPECT_THROW(DistributedSampler(7, 8, 0, 0, 1), InputError);  // fewer sequences than a batch
  // A missing or mistyped field is named with where the state came from (nlohmann's text before).
  auto error_of = [&](const nlohmann::json& state) {
    try {
      a.restore(state, "ck/metadata.json (trainer.data)");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  nlohmann::json bad = a.state_json();
  bad["epoch"] = "0";
  EXPECT_EQ(error_of(bad), R"(ck/metadata.json (trainer.data): epoch: expected an integer >= 0, got "0")");
  bad = a.state_json();
  bad.erase("global_batch");
  EXPECT_EQ(error_of(bad), "ck/metadata.json (trainer.data): global_batch: missing (expected an integer)");
  bad = a.state_json();
  bad["seed"] = -3;
  EXPECT_EQ(error_of(bad), "ck/metadata.json (trainer.data): seed: expected an integer from 0 to 2^64 - 1, got -3");
  EXPECT_EQ(error_of(nlohmann::json::array()), "ck/metadata.json (trainer.data): expected an object, got []");
  EXPECT_EQ(error_of(a.state_json()), "");
}

TEST(DataLoader, BatchesAreRowMajorInputsAndTargets) {
  TempDir dir;
  const TokenFile f = TokenFile::open(iota_file(dir, 8 * 16 + 1));
  const PackedDataset d(f, 8);
  DataLoader loader(d, 4, 11, 0, 1);
  const auto perm = DistributedSampler::permutation(16, 11, 0);
  const Batch b = loader.next_batch(2);
  EXPECT_EQ(b.B, 2);
  EXPECT_EQ(b.T, 8);
  ASSERT_EQ(b.inputs.size(), 16u);
  for (int i = 0; i < 2; ++i)
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(b.inputs[i * 8 + t], perm[i] * 8 + t);
      EXPECT_EQ(b.targets[i * 8 + t], perm[i] * 8 + t + 1);
    }
  EXPECT_EQ(loader.state()["offset"], 2);
}

TEST(EvalRange, CoversAllSequencesOnce) {
  for (int W : {1, 2, 3, 4}) {
    int64_t next = 0;
    for (int r = 0; r < W; ++r) {
      const auto [b, e] = eval_range(10, r, W);
      EXPECT_EQ(b, next);
      next = e;
    }
    EXPECT_EQ(next, 10);
  }
}

}  // namespace
}  // namespace qshard
