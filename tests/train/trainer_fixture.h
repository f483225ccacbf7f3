// trainer_fixture.h: shared pieces of the trainer tests under mpirun: per-job temporary paths
// (rank 0's pid in the name, so concurrent ctest runs at several world sizes do not collide),
// a learnable token file, and a small job config.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "runtime/runtime.h"
#include "runtime/world.h"
#include "text/token_file.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace qshard {

inline std::string tmp_path(const std::string& name) {
  // One path for all ranks (rank 0 writes it, the others wait at a barrier).
  int pid = ::getpid();
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return (std::filesystem::temp_directory_path() / ("qshard_trainer_test_" + std::to_string(pid) + "_" + name)).string();
}

inline std::string make_token_file(const std::string& name, uint32_t vocab, int64_t n, uint32_t max_token) {
  const std::string path = tmp_path(name);
  if (World::get().rank() == 0) {
    // A learnable stream: a repeating pattern with a little noise.
    std::mt19937 rng(7);
    std::vector<uint32_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[i] = static_cast<uint32_t>((i * 7 + (i / 5) % 3) % 50 + (rng() % 4 == 0 ? 60 : 0));
    if (max_token) t[n / 2] = max_token;
    write_token_file(path, vocab, t);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

inline TrainConfig small_config(const std::string& data) {
  TrainConfig c;
  c.model.init.vocab_size = 128;
  c.model.init.hidden_size = 64;
  c.model.init.intermediate_size = 128;
  c.model.init.num_hidden_layers = 2;
  c.model.init.num_attention_heads = 4;
  c.model.init.num_key_value_heads = 2;
  c.model.init.max_position_embeddings = 64;
  c.lora.r = 8;
  c.lora.alpha = 16;
  c.optimizer.lr = 2e-2;
  c.schedule.warmup_steps = 2;
  c.data.train = data;
  c.data.max_seq_len = 32;
  c.batch.global_batch_size = 12;
  c.batch.micro_batch_size = 1;
  c.steps = 20;
  c.data.eval_fraction = 0.1;
  c.logging.eval_every_steps = 10;
  c.logging.every_steps = 1000;
  c.checkpoint.dir = "";
  return c;
}

// Instruction data: `docs` instruction records (9 to 25 tokens: BOS, a prompt, a response decided by the prompt's
// first token, EOS) in a version 3 file written by rank 0; every rank returns once it is there.
inline std::string instruction_file(const std::string& name, int docs, uint32_t seed) {
  const std::string path = tmp_path(name);
  if (World::get().rank() == 0) {
    std::mt19937 rng(seed);
    TokenFileWriter w(path, 128, /*loss_mask=*/true, /*doc_starts=*/true);
    for (int d = 0; d < docs; ++d) {
      const uint32_t key = rng() % 40;  // the prompt's topic decides the response
      const int np = 4 + static_cast<int>(rng() % 8), nr = 3 + static_cast<int>(rng() % 10);
      std::vector<uint32_t> t;
      t.push_back(1 | kTokenNoLoss | kTokenDocStart);  // BOS
      for (int i = 0; i < np; ++i) t.push_back((i == 0 ? 60 + key : 100 + rng() % 20) | kTokenNoLoss);
      for (int i = 0; i < nr; ++i) t.push_back(2 + (key * 3 + static_cast<uint32_t>(i)) % 50);
      t.push_back(2);  // EOS, a target
      w.append(t);
    }
    w.finish();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

// Instruction data (600 training records, 60 in a separate eval file, `name` naming both files)
// with a learning rate too small to move the model: 2 steps, the eval loss measured once at the
// end, so runs that differ only in how they present the data compare by their eval loss.
inline TrainConfig eval_only_instruction_config(const std::string& name) {
  TrainConfig c = small_config(instruction_file(name + "_train.tok", 600, 11));
  c.data.eval = instruction_file(name + "_eval.tok", 60, 12);
  c.data.eval_fraction = 0;
  c.steps = 2;
  c.logging.eval_every_steps = 2;
  c.optimizer.lr = 1e-30;
  return c;
}

// One job on `device` in this process's world (a GPU test beside the CPU reference's run).
inline TrainSummary train_on(DeviceChoice device, const TrainConfig& cfg) {
  JobRuntime jr(World::get(), device, "device");
  return train(cfg, jr.get());
}

}  // namespace qshard
