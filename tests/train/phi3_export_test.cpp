// Phi-3's fused projections through a QLoRA job and every export, under mpirun -np 1 and 2 (CPU):
//  - bnb4: a job whose base is a 4-bit Phi-3 folder written by transformers + bitsandbytes
//    (tests/data/family/phi3_bnb4, phi3_odd_bnb4: scripts/golden/make_phi3_golden.py; in phi3_odd
//    the 4-bit blocks straddle the q/k/v and gate/up split points) exports that folder back: the
//    same tensor names (qkv_proj, gate_up_proj), dtypes, shapes and bytes, config.json equal; a job
//    on the float folder (quantized on load) exports what `qshard quantize` writes for it (the fused
//    weight quantized whole, as bitsandbytes quantizes the fused Linear);
//  - PEFT: a job started from PEFT's adapter (lora.init_adapter: one lora_A shared by q, k, v)
//    exports one adapter per fused module of rank 3r / 2r, lora_A the parts' A stacked, lora_B
//    block-diagonal, rank_pattern / alpha_pattern keeping PEFT's scaling at alpha / r (rsLoRA:
//    alpha * sqrt(n)); that adapter loads back into the same LoRA weights bit for bit and
//    evaluates to PEFT's logits (tests/data/family/phi3_golden.safetensors "phi3_peft");
//  - merged: a bf16 Phi-3 folder with fused weights that loads strictly and evaluates, within bf16
//    rounding, to the job's model (its bnb4 export with its PEFT export: the base was quantized on
//    load, so not PEFT's float logits);
//  - a 16-step job on the float Phi-3 folder with targets [qkv_proj, o_proj, gate_up_proj,
//    down_proj]: the loss goes down and its end-of-run exports load (strict base, adapter in eval).
// scripts/interop/check_phi3_interop.py loads these exports with transformers + bitsandbytes + PEFT.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "checkpoint/bnb_folder.h"
#include "checkpoint/export.h"
#include "checkpoint/llama_loader.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_index.h"
#include "infer/evaluate.h"
#include "runtime/mpi_communicator.h"
#include "runtime/world.h"
#include "train/qlora_model.h"
#include "train/trainer.h"
#include "train/trainer_fixture.h"
#include "common/test_util.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;

const std::string kFamily = std::string(QSHARD_TEST_DATA_DIR) + "/family";
const std::vector<std::string> kPhi3Targets = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"};

using testing_util::max_abs_diff;
std::string read_file(const fs::path& p) { return testing_util::read_bytes(p.string()); }

void remove_on_rank0(const std::string& path) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (World::get().rank() == 0) fs::remove_all(path);
}

// Rank 0: every tensor of `want` in `got` under the same name, dtype, shape and bytes, and nothing else.
void expect_same_tensors(const std::string& got, const std::string& want) {
  SCOPED_TRACE(got + " vs " + want);
  const SafetensorsFolder g = SafetensorsFolder::open(got), w = SafetensorsFolder::open(want);
  std::vector<std::string> gn = g.names(), wn = w.names();
  std::sort(gn.begin(), gn.end());
  std::sort(wn.begin(), wn.end());
  ASSERT_EQ(gn, wn);
  int fused = 0;
  for (const std::string& name : wn) {
    const SafetensorsEntry* a = g.find(name);
    const SafetensorsEntry* b = w.find(name);
    EXPECT_EQ(a->dtype_name, b->dtype_name) << name;
    EXPECT_EQ(a->shape, b->shape) << name;
    const auto x = g.bytes(name), y = w.bytes(name);
    EXPECT_TRUE(x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin())) << name << ": bytes differ";
    fused += name.find("qkv_proj") != std::string::npos || name.find("gate_up_proj") != std::string::npos;
  }
  EXPECT_GT(fused, 0) << "the fused Phi-3 names";
  EXPECT_EQ(g.names().size(), w.names().size());
  std::printf("%s: %zu tensors equal to %s (%d of the fused projections)\n", got.c_str(), wn.size(), want.c_str(), fused);
}

TrainConfig phi3_job(const std::string& folder, const std::string& data) {
  TrainConfig c = small_config(data);
  c.model.path = kFamily + "/" + folder;
  c.lora.r = 4;
  c.lora.alpha = 8;
  c.lora.target_modules = kPhi3Targets;
  return c;
}

std::vector<float> eval_logits(const std::string& model, const std::string& adapter) {
  EvalOptions o;
  o.device = DeviceChoice::kCpu;
  o.model_dir = model;
  o.adapter_dir = adapter;
  o.data = kFamily + "/ids.json";
  o.dump_logits = tmp_path("phi3_logits.safetensors");
  evaluate_model(o);
  auto logits = SafetensorsFile::open(o.dump_logits).get("logits").to_f32_vector();
  fs::remove(o.dump_logits);
  return logits;
}


std::vector<float> golden(const std::string& key) {
  return SafetensorsFile::open(kFamily + "/phi3_golden.safetensors").get(key).to_f32_vector();
}

TEST(Phi3Export, Bnb4FolderComesBackUnchanged) {
  MpiCommunicator comm(World::get().comm());
  DeviceContext ctx(Backend::kCpu, -1);
  Runtime rt{ctx, comm, comm};
  for (const char* folder : {"phi3_bnb4", "phi3_odd_bnb4"}) {
    SCOPED_TRACE(folder);
    std::unique_ptr<QloraModel> m = build_qlora_model(phi3_job(folder, ""), rt);
    const std::string out = tmp_path(std::string("phi3_base_") + folder);
    remove_on_rank0(out);
    ExportOptions o;
    o.out_dir = out;
    o.format = ExportFormat::kBnb4;
    export_model(comm, *m->tree, m->config, *m->mgr, m->units, o);
    if (World::get().rank() == 0) {
      expect_same_tensors(out, kFamily + "/" + folder);
      EXPECT_EQ(nlohmann::json::parse(read_file(fs::path(out) / "config.json")),
                nlohmann::json::parse(read_file(fs::path(kFamily) / folder / "config.json")));
    }
    remove_on_rank0(out);
  }
  // A float folder quantized on load: the fused weights quantized whole, as `qshard quantize` does.
  std::unique_ptr<QloraModel> m = build_qlora_model(phi3_job("phi3_odd", ""), rt);
  const std::string out = tmp_path("phi3_base_from_float"), want = tmp_path("phi3_quantized");
  remove_on_rank0(out);
  remove_on_rank0(want);
  ExportOptions o;
  o.out_dir = out;
  o.format = ExportFormat::kBnb4;
  export_model(comm, *m->tree, m->config, *m->mgr, m->units, o);
  if (World::get().rank() == 0) {
    QuantizeFolderOptions qo;
    qo.use_cuda = false;
    quantize_model_folder(kFamily + "/phi3_odd", want, qo);
    expect_same_tensors(out, want);
  }
  remove_on_rank0(out);
  remove_on_rank0(want);
}

TEST(Phi3Export, PeftAndMergedExportsOfPeftsAdapter) {
  MpiCommunicator comm(World::get().comm());
  DeviceContext ctx(Backend::kCpu, -1);
  Runtime rt{ctx, comm, comm};
  TrainConfig cfg = phi3_job("phi3", "");
  cfg.lora.init_adapter = kFamily + "/phi3_adapter";
  std::unique_ptr<QloraModel> m = build_qlora_model(cfg, rt, BuildFor::kTraining);
  const std::string peft = tmp_path("phi3_peft"), rs = tmp_path("phi3_peft_rslora"), merged = tmp_path("phi3_merged");
  const std::string base = tmp_path("phi3_job_base");
  for (const std::string& d : {peft, rs, merged, base}) remove_on_rank0(d);
  ExportOptions o;
  o.format = ExportFormat::kPeft;
  o.r = 4;
  o.lora_alpha = 8;
  o.target_modules = kPhi3Targets;
  o.out_dir = peft;
  export_model(comm, *m->tree, m->config, *m->mgr, m->units, o);
  o.out_dir = rs;
  o.use_rslora = true;
  export_model(comm, *m->tree, m->config, *m->mgr, m->units, o);
  o.out_dir = merged;
  o.use_rslora = false;
  o.format = ExportFormat::kMerged;
  export_model(comm, *m->tree, m->config, *m->mgr, m->units, o);
  o.out_dir = base;
  o.format = ExportFormat::kBnb4;
  export_model(comm, *m->tree, m->config, *m->mgr, m->units, o);
  if (World::get().rank() == 0) {
    const nlohmann::json pc = nlohmann::json::parse(read_file(fs::path(peft) / "adapter_config.json"));
    EXPECT_EQ(pc["r"], 4);
    EXPECT_EQ(pc["rank_pattern"], nlohmann::json({{"qkv_proj", 12}, {"gate_up_proj", 8}}));
    EXPECT_EQ(pc["alpha_pattern"], nlohmann::json({{"qkv_proj", 24}, {"gate_up_proj", 16}}));
    EXPECT_EQ(pc["target_modules"], nlohmann::json(kPhi3Targets));
    const nlohmann::json rc = nlohmann::json::parse(read_file(fs::path(rs) / "adapter_config.json"));
    EXPECT_DOUBLE_EQ(rc["alpha_pattern"]["qkv_proj"].get<double>(), 8 * std::sqrt(3.0));
    EXPECT_DOUBLE_EQ(rc["alpha_pattern"]["gate_up_proj"].get<double>(), 8 * std::sqrt(2.0));
    // lora_A: the parts' A stacked; lora_B block-diagonal (zeros outside each part's block).
    const SafetensorsFile f = SafetensorsFile::open(peft + "/adapter_model.safetensors");
    const std::string p = "base_model.model.model.layers.1.self_attn.qkv_proj.";
    EXPECT_EQ(f.find(p + "lora_A.weight")->shape, (Shape{12, 32}));
    EXPECT_EQ(f.find(p + "lora_B.weight")->shape, (Shape{64, 12}));
    const std::vector<float> b = f.get(p + "lora_B.weight").to_f32_vector();
    int64_t off_block_nonzero = 0, in_block_nonzero = 0;
    for (int64_t row = 0; row < 64; ++row)
      for (int64_t k = 0; k < 12; ++k) {
        const int part = row < 32 ? 0 : row < 48 ? 1 : 2;
        (k / 4 == part ? in_block_nonzero : off_block_nonzero) += b[row * 12 + k] != 0.0f;
      }
    EXPECT_EQ(off_block_nonzero, 0);
    EXPECT_EQ(in_block_nonzero, 64 * 4);
    EXPECT_FALSE(f.find("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"));
    // Loaded back (the block-diagonal form), the tree's LoRA weights are PEFT's split, bit for bit.
    LlamaLoadOptions lo;
    lo.adapter_dir = kFamily + "/phi3_adapter";
    const LoadedLlama from_peft = load_llama_folder(kFamily + "/phi3", lo);
    lo.adapter_dir = peft;
    const LoadedLlama from_export = load_llama_folder(kFamily + "/phi3", lo);
    const NamedTensors want = state_dict(*from_peft.tree, {true, false, true}), got = state_dict(*from_export.tree, {true, false, true});
    ASSERT_EQ(want.size(), got.size());
    ASSERT_EQ(want.size(), 2u * 2u * 7u);  // A and B of the 7 parts in each of 2 layers
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(want[i].first, got[i].first);
      EXPECT_EQ(want[i].second.to_f32_vector(), got[i].second.to_f32_vector()) << want[i].first;
    }
    // Evaluated: PEFT's logits, through qshard's export as through PEFT's own adapter.
    const double d_export = max_abs_diff(eval_logits(kFamily + "/phi3", peft), golden("phi3_peft"));
    const double d_rslora = max_abs_diff(eval_logits(kFamily + "/phi3", rs), eval_logits(kFamily + "/phi3", peft));
    std::printf("phi3 + qshard's PEFT export: max |logit - PEFT| %.2e; rsLoRA export vs plain %.2e\n", d_export, d_rslora);
    EXPECT_LE(d_export, 1e-5);
    // The rsLoRA export's scaling is alpha / sqrt(r) = 4, not alpha / r = 2: other logits.
    EXPECT_GT(d_rslora, 1e-1);
    // Merged: fused bf16 weights, a strict load, PEFT's logits within bf16 rounding of the weights.
    const LoadedLlama mm = load_llama_folder(merged);
    EXPECT_EQ(mm.config.family, ModelFamily::kPhi3);
    EXPECT_EQ(SafetensorsFolder::open(merged).find("model.layers.0.mlp.gate_up_proj.weight")->shape, (Shape{128, 32}));
    const std::vector<float> ref = eval_logits(base, peft), merged_logits = eval_logits(merged, "");
    double scale = 0;
    for (float x : ref) scale = std::max(scale, double(std::fabs(x)));
    const double d_merged = max_abs_diff(merged_logits, ref);
    std::printf("phi3 merged export: max |logit - 4-bit base + adapter| %.3e (largest logit %.3f)\n", d_merged, scale);
    EXPECT_LE(d_merged, 0.03 * scale);
    EXPECT_GT(max_abs_diff(merged_logits, eval_logits(base, "")), 0.1) << "the adapter was merged";
  }
  for (const std::string& d : {peft, rs, merged, base}) remove_on_rank0(d);
}

TEST(Phi3Export, JobLearnsAndItsExportsLoad) {
  MpiCommunicator all(World::get().comm());
  const std::string data = make_token_file("phi3.tok", 128, 4000, 0);
  TrainConfig c = phi3_job("phi3", data);
  c.steps = 16;
  c.optimizer.lr = 1e-2;
  c.checkpoint.dir = tmp_path("phi3_job");
  remove_on_rank0(c.checkpoint.dir);
  const TrainSummary s = train(c, all);
  ASSERT_EQ(s.losses.size(), 16u);
  double first = 0, last = 0;
  for (int i = 0; i < 4; ++i) first += s.losses[i], last += s.losses[12 + i];
  if (all.rank() == 0) {
    std::printf("phi3 job: mean loss steps 1-4 %.4f, 13-16 %.4f\n", first / 4, last / 4);
    EXPECT_LT(last, 0.9 * first) << "the loss must go down";
    const std::string base = s.exported_base, adapter = s.exported_adapter;
    const LoadedLlama b = load_llama_folder(base);  // strict: fused 4-bit names with their statistics
    EXPECT_TRUE(b.config.quantized);
    EXPECT_TRUE(SafetensorsFolder::open(base).contains("model.layers.1.self_attn.qkv_proj.weight.nested_absmax"));
    const nlohmann::json pc = nlohmann::json::parse(read_file(fs::path(adapter) / "adapter_config.json"));
    EXPECT_EQ(pc["rank_pattern"]["qkv_proj"], 12);
    // The trained adapter changes the logits of the exported base.
    EXPECT_GT(max_abs_diff(eval_logits(base, adapter), eval_logits(base, "")), 1e-3);
  }
  remove_on_rank0(c.checkpoint.dir);
  if (all.rank() == 0) fs::remove(data);
}

}  // namespace
}  // namespace qshard
