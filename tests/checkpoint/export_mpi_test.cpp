// Exports under mpirun -np 1..3: with parameter offload on and off, the bnb4, PEFT and merged
// folders written over all ranks are byte-identical (every file) to the export rank 0 makes alone
// over MPI_COMM_SELF. An existing non-empty out_dir is refused on every rank (none hangs).
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>

#include "common/test_stream.h"
#include "checkpoint/export.h"
#include "checkpoint/llama_tree.h"
#include "common/random_tree.h"
#include "runtime/mpi_communicator.h"
#include "runtime/world.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;

using testing_util::randn;
using testing_util::randomize;

LlamaConfig tiny_config() {
  const nlohmann::json j = {{"model_type", "llama"}, {"vocab_size", 77}, {"hidden_size", 64},
                            {"intermediate_size", 96}, {"num_hidden_layers", 3}, {"num_attention_heads", 4},
                            {"num_key_value_heads", 2}, {"torch_dtype", "bfloat16"}};
  return LlamaConfig::from_json(j, "tiny");
}

std::unique_ptr<Module> make_tree() {
  LlamaTreeOptions o;
  o.quant = QuantizeOptions{QuantType::kNf4, 64, true};
  o.lora.r = 4;
  auto tree = build_llama_tree(tiny_config(), o);
  uint32_t seed = 3;
  randomize(*tree, seed);
  return tree;
}

// Exports the three formats of a freshly sharded tree into DIR/<format>.
void export_all(Communicator& comm, bool offload, const fs::path& dir, uint64_t max_shard_bytes) {
  auto tree = make_tree();
  ShardOptions so;
  so.offload_params = so.offload_optimizer = offload;
  ShardedParameterManager mgr(comm, qshard_test_compute_stream(), so);
  const ShardedTree units = shard_module_tree(*tree, mgr, "model.layers");
  mgr.finalize();
  for (ExportFormat f : {ExportFormat::kBnb4, ExportFormat::kPeft, ExportFormat::kMerged}) {
    ExportOptions o;
    o.out_dir = (dir / export_format_name(f)).string();
    o.format = f;
    o.r = 4;
    o.lora_alpha = 16;
    o.max_shard_bytes = max_shard_bytes;
    o.base_model_name_or_path = "tiny";
    export_model(comm, *tree, tiny_config(), mgr, units, o);
  }
}

std::map<std::string, std::string> read_folder(const fs::path& dir) {
  std::map<std::string, std::string> files;
  if (!fs::exists(dir)) return files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    files[fs::relative(e.path(), dir).string()] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  return files;
}

TEST(ExportMpi, ByteIdenticalToOneRankAtEveryWorldSizeAndOffload) {
  World& world = World::get();
  MpiCommunicator all(world.comm());
  int pid = world.rank() == 0 ? static_cast<int>(::getpid()) : 0;
  MPI_Bcast(&pid, 1, MPI_INT, 0, world.comm());
  const fs::path base = fs::temp_directory_path() / ("qshard_export_mpi_" + std::to_string(pid));
  constexpr uint64_t kMaxShard = 40'000;  // several files + an index for bnb4 and merged
  if (world.rank() == 0) {
    fs::remove_all(base);
    MpiCommunicator self(MPI_COMM_SELF);
    export_all(self, false, base / "ref", kMaxShard);
  }
  MPI_Barrier(world.comm());
  const auto ref_bnb4 = read_folder(base / "ref" / "bnb4");
  EXPECT_GT(ref_bnb4.size(), 3u);  // shards + index + config
  for (bool offload : {false, true}) {
    const fs::path dir = base / ("np" + std::to_string(world.size()) + (offload ? "_offload" : "_no_offload"));
    export_all(all, offload, dir, kMaxShard);
    if (world.rank() == 0) {
      for (ExportFormat f : {ExportFormat::kBnb4, ExportFormat::kPeft, ExportFormat::kMerged}) {
        const auto want = read_folder(base / "ref" / export_format_name(f));
        const auto got = read_folder(dir / export_format_name(f));
        EXPECT_FALSE(want.empty());
        ASSERT_EQ(got.size(), want.size()) << export_format_name(f);
        for (const auto& [name, bytes] : want) {
          ASSERT_TRUE(got.count(name)) << export_format_name(f) << "/" << name;
          EXPECT_TRUE(got.at(name) == bytes) << "np " << world.size() << " offload " << offload << ": "
                                              << export_format_name(f) << "/" << name << " differs";
        }
        std::printf("np %d offload %d %s: %zu files identical to the 1-rank export\n", world.size(), offload,
                    export_format_name(f), got.size());
      }
    }
    MPI_Barrier(world.comm());
  }
  // A non-empty out_dir: every rank throws InputError, before any gather.
  {
    auto tree = make_tree();
    ShardedParameterManager mgr(all, qshard_test_compute_stream(), {});
    const ShardedTree units = shard_module_tree(*tree, mgr, "model.layers");
    mgr.finalize();
    ExportOptions o;
    o.out_dir = (base / "ref" / "bnb4").string();
    bool refused = false;
    try {
      export_model(all, *tree, tiny_config(), mgr, units, o);
    } catch (const InputError& e) {
      refused = std::string(e.what()).find("not empty") != std::string::npos;
    }
    EXPECT_TRUE(refused) << "rank " << world.rank();
  }
  MPI_Barrier(world.comm());
  if (world.rank() == 0) fs::remove_all(base);
}

}  // namespace
}  // namespace qshard
