// "The frozen base comes back as it came in", under mpirun -np 1 and 2 (CPU backend): a training
// job whose base (model.path) is a bitsandbytes 4-bit folder written by transformers +
// bitsandbytes (tests/data/hf, scripts/golden/make_hf_golden.py: bf16 and f32 originals x NF4 with double
// quant and FP4) exports bnb4 equal to that folder:
//  - the same tensor names, and for each the same dtype, shape and bytes (the frozen embeddings,
//    norms and lm_head in the folder's dtype, the 4-bit weights and statistics as stored);
//  - config.json equal as parsed JSON, every key (quantization_config with its compute dtype and
//    quant storage, dtype); the folders differ in two bf16 / f32 x compute-dtype combinations, so
//    a compute dtype or dtype derived from anything but the folder's config fails here;
//  - the same file names, and the other files (generation_config.json) byte for byte.
// One legitimate difference, not compared: the order of the tensors inside model.safetensors
// (transformers' writer sorts them by dtype size, then name; qshard writes bitsandbytes'
// state-dict order, shared/FORMATS.md), so tensors are matched by name.
// Three paths, all real: build_qlora_model + export_model (what `qshard export` runs) with and
// without parameter offload; the trainer's end-of-run export CKPT/final/base_bnb4 after a 1-step
// job; and export_checkpoint (`qshard export CKPT --format bnb4`) of that job's checkpoint.
// Also: a job on a float folder (quantized on load) exports what `qshard quantize` writes for it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "checkpoint/bnb_folder.h"
#include "checkpoint/export.h"
#include "checkpoint/safetensors_index.h"
#include "runtime/mpi_communicator.h"
#include "runtime/world.h"
#include "train/qlora_model.h"
#include "train/train_checkpoint.h"
#include "train/trainer.h"
#include "train/trainer_fixture.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;

const std::string kHf = std::string(QSHARD_TEST_DATA_DIR) + "/hf";
const char* const kFolders[] = {"tiny_llama_bnb4_nf4_dq", "tiny_llama_bnb4_fp4", "tiny_llama_f32_bnb4_nf4_dq",
                                "tiny_llama_f32_bnb4_fp4"};

std::vector<std::string> file_names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Rank 0: `got` (an export) against `want` (the folder the job's base came from).
void expect_same_folder(const std::string& got, const std::string& want) {
  SCOPED_TRACE(got + " vs " + want);
  EXPECT_EQ(file_names(got), file_names(want));
  const SafetensorsFolder g = SafetensorsFolder::open(got), w = SafetensorsFolder::open(want);
  std::vector<std::string> gn = g.names(), wn = w.names();
  std::sort(gn.begin(), gn.end());
  std::sort(wn.begin(), wn.end());
  ASSERT_EQ(gn, wn);
  uint64_t bytes = 0;
  int frozen_float = 0;
  for (const std::string& name : wn) {
    const SafetensorsEntry* a = g.find(name);
    const SafetensorsEntry* b = w.find(name);
    EXPECT_EQ(a->dtype_name, b->dtype_name) << name;
    EXPECT_EQ(a->shape, b->shape) << name;
    const auto x = g.bytes(name), y = w.bytes(name);
    EXPECT_TRUE(x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin())) << name << ": bytes differ";
    bytes += y.size();
    frozen_float += name.find("_proj.weight") == std::string::npos;
  }
  EXPECT_EQ(frozen_float, 7) << "embed_tokens, 2 norms in each of 2 layers, model.norm, lm_head";
  const nlohmann::json gc = nlohmann::json::parse(read_file(fs::path(got) / "config.json"));
  const nlohmann::json wc = nlohmann::json::parse(read_file(fs::path(want) / "config.json"));
  EXPECT_EQ(gc, wc) << "config.json differs:\n" << nlohmann::json::diff(wc, gc).dump(1);
  for (const std::string& f : file_names(want)) {
    if (f != "config.json" && !f.ends_with(".safetensors")) {
      EXPECT_EQ(read_file(fs::path(got) / f), read_file(fs::path(want) / f)) << f;
    }
  }
  std::printf("%s: %zu tensors (%llu bytes) equal to %s; config.json equal (dtype %s, compute dtype %s)\n",
              got.c_str(), wn.size(), static_cast<unsigned long long>(bytes), want.c_str(), wc["dtype"].dump().c_str(),
              wc["quantization_config"]["bnb_4bit_compute_dtype"].dump().c_str());
}

TrainConfig job_on(const std::string& folder, const std::string& data) {
  TrainConfig c = small_config(data);
  c.model.path = kHf + "/" + folder;
  c.lora.r = 4;
  return c;
}

void remove_on_rank0(const std::string& path) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (World::get().rank() == 0) fs::remove_all(path);
}

TEST(ExportBase, BuildAndExportGivesTheFolderBack) {
  MpiCommunicator comm(World::get().comm());
  DeviceContext ctx(Backend::kCpu, -1);
  Runtime rt{ctx, comm, comm};
  for (const char* folder : kFolders) {
    for (const int mode : {0, 1, 2}) {  // as is; the base offloaded; the embedding whole in host memory
      const bool offload = mode == 1;
      SCOPED_TRACE(std::string(folder) + (offload ? " offload" : mode == 2 ? " embedding on the host" : ""));
      TrainConfig cfg = job_on(folder, "");
      cfg.offload.params = offload;
      if (mode == 2) cfg.memory.embedding = "host";
      const std::string out = tmp_path(std::string("base_") + folder + "_" + std::to_string(mode));
      std::unique_ptr<QloraModel> m = build_qlora_model(cfg, rt);
      // The frozen float tensors are held in the folder's dtype (before any export).
      const std::string dtype = std::string(folder).find("_f32_") != std::string::npos ? "float32" : "bfloat16";
      for (const char* k : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                            "model.layers.1.post_attention_layernorm.weight"})
        EXPECT_EQ(dtype_torch_name(resolve(*m->tree, k).tensor.dtype()), dtype) << k;
      ExportOptions o;
      o.out_dir = out;
      o.format = ExportFormat::kBnb4;
      export_model(comm, *m->tree, m->config, *m->mgr, m->units, o);
      if (World::get().rank() == 0) expect_same_folder(out, kHf + "/" + folder);
      remove_on_rank0(out);
    }
  }
}

// A job on a float folder quantizes it on load; its bnb4 export equals what `qshard quantize`
// writes for that folder with the job's quantization options (frozen tensors in the folder's
// dtype, config.json as read + transformers' default quantization_config, other files copied).
TEST(ExportBase, FloatFolderJobExportsWhatQuantizeWrites) {
  MpiCommunicator comm(World::get().comm());
  DeviceContext ctx(Backend::kCpu, -1);
  Runtime rt{ctx, comm, comm};
  for (const char* folder : {"tiny_llama_bf16", "tiny_llama_f32"}) {
    SCOPED_TRACE(folder);
    const TrainConfig cfg = job_on(folder, "");
    const std::string out = tmp_path(std::string("float_base_") + folder), ref = out + "_quantized";
    std::unique_ptr<QloraModel> m = build_qlora_model(cfg, rt);
    ExportOptions o;
    o.out_dir = out;
    o.format = ExportFormat::kBnb4;
    export_model(comm, *m->tree, m->config, *m->mgr, m->units, o);
    if (World::get().rank() == 0) {
      QuantizeFolderOptions q;
      q.quant = {cfg.model.quant_type, cfg.model.blocksize, cfg.model.double_quant};
      q.use_cuda = false;
      quantize_model_folder(kHf + "/" + folder, ref, q);
      expect_same_folder(out, ref);
    }
    remove_on_rank0(out);
    remove_on_rank0(ref);
  }
}

TEST(ExportBase, TrainerAndCheckpointExportsGiveTheFolderBack) {
  MpiCommunicator comm(World::get().comm());
  DeviceContext ctx(Backend::kCpu, -1);
  Runtime rt{ctx, comm, comm};
  const std::string data = make_token_file("export_base.tok", 128, 4000, 0);
  for (const char* folder : kFolders) {
    SCOPED_TRACE(folder);
    TrainConfig cfg = job_on(folder, data);
    cfg.steps = 1;
    cfg.schedule.warmup_steps = 0;
    cfg.checkpoint.dir = tmp_path(std::string("ckpt_") + folder);
    const TrainSummary s = train(cfg, comm);
    ASSERT_EQ(s.losses.size(), 1u);
    ASSERT_FALSE(s.exported_base.empty());
    if (World::get().rank() == 0) expect_same_folder(s.exported_base, kHf + "/" + folder);
    ExportOptions o;
    o.out_dir = tmp_path(std::string("cli_export_") + folder);
    o.format = ExportFormat::kBnb4;
    export_checkpoint(cfg.checkpoint.dir, o, rt);
    if (World::get().rank() == 0) expect_same_folder(o.out_dir, kHf + "/" + folder);
    remove_on_rank0(o.out_dir);
    remove_on_rank0(cfg.checkpoint.dir);
  }
  remove_on_rank0(data);
}

}  // namespace
}  // namespace qshard

namespace qshard {
namespace {

// lora.init_adapter: a job started from a PEFT adapter (tests/data/model/nf4_adapter, written by
// PEFT's save_pretrained for the tiny NF4 folder) holds the adapter's weights before any step: the
// PEFT export gives every tensor back with the same name, dtype, shape and bytes. Settings that
// differ from the adapter's (r, alpha, rsLoRA, target modules) are refused naming both values.
TEST(ExportBase, JobFromAPeftAdapterExportsItBack) {
  MpiCommunicator comm(World::get().comm());
  DeviceContext ctx(Backend::kCpu, -1);
  Runtime rt{ctx, comm, comm};
  const std::string adapter = std::string(QSHARD_TEST_DATA_DIR) + "/model/nf4_adapter";
  TrainConfig cfg = job_on("tiny_llama_bnb4_nf4_dq", "");
  cfg.lora.init_adapter = adapter;
  cfg.lora.alpha = 8;
  std::unique_ptr<QloraModel> m = build_qlora_model(cfg, rt);
  ExportOptions o;
  o.out_dir = tmp_path("from_adapter");
  o.format = ExportFormat::kPeft;
  o.r = cfg.lora.r;
  o.lora_alpha = cfg.lora.alpha;
  o.target_modules = cfg.lora.target_modules;
  export_model(comm, *m->tree, m->config, *m->mgr, m->units, o);
  if (World::get().rank() == 0) {
    const SafetensorsFolder g = SafetensorsFolder::open_file(o.out_dir + "/adapter_model.safetensors"),
                            w = SafetensorsFolder::open_file(adapter + "/adapter_model.safetensors");
    std::vector<std::string> gn = g.names(), wn = w.names();
    std::sort(gn.begin(), gn.end());
    std::sort(wn.begin(), wn.end());
    ASSERT_EQ(gn, wn);
    for (const std::string& name : wn) {
      EXPECT_EQ(g.find(name)->dtype_name, w.find(name)->dtype_name) << name;
      EXPECT_EQ(g.find(name)->shape, w.find(name)->shape) << name;
      const auto x = g.bytes(name), y = w.bytes(name);
      EXPECT_TRUE(x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin())) << name << ": bytes differ";
    }
    const bool same_file = read_file(fs::path(o.out_dir) / "adapter_model.safetensors") ==
                           read_file(fs::path(adapter) / "adapter_model.safetensors");
    std::printf("adapter export: %zu tensors equal to PEFT's; the whole file %s\n", wn.size(),
                same_file ? "byte for byte" : "differs (header or order)");
    EXPECT_TRUE(same_file);
  }
  remove_on_rank0(o.out_dir);

  auto expect_refused = [&](TrainConfig c, const std::string& needle) {
    try {
      build_qlora_model(c, rt);
      ADD_FAILURE() << needle;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TrainConfig bad = cfg;
  bad.lora.r = 8;
  expect_refused(bad, "the adapter's r (lora.r) is 4 but this job's is 8");
  bad = cfg;
  bad.lora.alpha = 16;
  expect_refused(bad, "lora_alpha (lora.alpha) is 8 but this job's is 16");
  bad = cfg;
  bad.lora.target_modules = {"q_proj", "v_proj"};
  expect_refused(bad, "target_modules (lora.target_modules)");
  bad = cfg;
  bad.lora.rslora = true;
  expect_refused(bad, "use_rslora");
  bad = cfg;
  bad.lora.init_adapter = std::string(QSHARD_TEST_DATA_DIR) + "/model/no_such_adapter";
  expect_refused(bad, "no_such_adapter");
}

}  // namespace
}  // namespace qshard
