// `qshard generate` (infer/generate.h): the KV-cache path against the full forward, the first
// step against `qshard eval`, the sampler's rules, and bad input.
// On the CPU (f32, row-independent GEMMs, attention_cached_fwd with attention_fwd's arithmetic) a
// cached step is the full forward's row bit for bit; on the GPU (bf16; cuBLASLt picks per shape,
// a different attention kernel) within 3% of the largest logit, eval's GPU tolerance.
#include "infer/generate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "model/llama_model.h"
#include "runtime/error.h"
#include "infer/evaluate.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;

const std::string kData = QSHARD_TEST_DATA_DIR;
const std::vector<int64_t> kSeq = {74, 9, 3, 20, 10, 45, 47, 42, 16, 30, 89};  // eval_ids_f32.json's first

struct Case {
  const char* key;
  const char* model;
  const char* adapter;
};
const Case kCases[] = {{"f32", "/model/tiny_llama3_tied", ""},
                       {"f32_adapter", "/model/tiny_llama3_tied", "/model/llama3_adapter"},
                       {"bnb_adapter", "/hf/tiny_llama_bnb4_nf4_dq", "/model/nf4_adapter"}};

// Logits of every position of kSeq: by the full forward, and by the cache (a 4-token prompt, then
// one token per step, as generate runs), on `device`.
void cached_and_full(const Case& c, DeviceChoice device, std::vector<float>& full, std::vector<float>& cached) {
  InferenceModel im = load_inference_model(kData + c.model, *c.adapter ? kData + c.adapter : "");
  auto ctx = inference_context(device, "test", kData + c.model);
  move_tree_to(*im.tree, ctx->compute_device());
  LlamaModelOptions mo = im.options;
  const int64_t S = static_cast<int64_t>(kSeq.size()), V = im.config.vocab_size, P = 4;
  mo.max_seq = S;
  mo.kv_cache_tokens = S;
  LlamaModel model(im.config, *im.tree, *ctx, mo);
  model.set_training(false);
  full = model.forward_logits(kSeq, 1, S);
  cached.assign(full.size(), NAN);
  const std::vector<float> first = model.forward_cached(std::span(kSeq).first(P), 0);
  std::copy(first.begin(), first.end(), cached.begin() + (P - 1) * V);
  for (int64_t t = P; t < S; ++t) {
    const std::vector<float> l = model.forward_cached(std::span(kSeq).subspan(t, 1), t);
    std::copy(l.begin(), l.end(), cached.begin() + t * V);
  }
  // Rewinding: the prompt again gives its logits again (positions past it are overwritten).
  const std::vector<float> again = model.forward_cached(std::span(kSeq).first(P), 0);
  EXPECT_EQ(0, std::memcmp(again.data(), first.data(), first.size() * 4)) << c.key << ": a rewound prompt differs";
  // Rows before the prompt's last have no cached logits: compare from P - 1 on.
  full.erase(full.begin(), full.begin() + (P - 1) * V);
  cached.erase(cached.begin(), cached.begin() + (P - 1) * V);
}

TEST(Generate, CachedStepsAreTheFullForwardBitwiseOnCpu) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.key);
    std::vector<float> full, cached;
    cached_and_full(c, DeviceChoice::kCpu, full, cached);
    ASSERT_EQ(full.size(), cached.size());
    size_t differ = 0;
    for (size_t i = 0; i < full.size(); ++i) differ += std::memcmp(&full[i], &cached[i], 4) != 0;
    std::printf("%s: %zu logits compared, %zu differ\n", c.key, full.size(), differ);
    EXPECT_EQ(differ, 0u);
  }
}

TEST(GenerateGpu, CachedStepsMatchTheFullForward) {
  if (!cuda_available() || !ops::has_backend(Backend::kCuda, "attention_fwd")) GTEST_SKIP() << "no GPU / CUDA attention";
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.key);
    std::vector<float> full, cached, cpu_full, cpu_cached;
    cached_and_full(c, DeviceChoice::kCuda, full, cached);
    cached_and_full(c, DeviceChoice::kCpu, cpu_full, cpu_cached);
    double worst = 0, worst_cpu = 0, scale = 0;
    for (size_t i = 0; i < full.size(); ++i) {
      worst = std::max(worst, std::fabs(double(full[i]) - cached[i]));
      worst_cpu = std::max(worst_cpu, std::fabs(double(cpu_full[i]) - cached[i]));
      scale = std::max(scale, std::fabs(double(cpu_full[i])));
    }
    std::printf("%s: GPU cached vs GPU full max |diff| %.3e, vs CPU %.3e (largest logit %.3f)\n", c.key, worst,
                worst_cpu, scale);
    EXPECT_LE(worst, 0.03 * scale);
    EXPECT_LE(worst_cpu, 0.03 * scale);
  }
}

// The first step's logits (generate --dump-logits) are `qshard eval --dump-logits`'s last row.
TEST(Generate, FirstStepIsEvalsLogits) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.key);
    const fs::path dir = fs::temp_directory_path();
    const std::string ids_json = (dir / "qshard_gen_ids.json").string();
    {
      std::ofstream f(ids_json);
      f << "[[";
      for (size_t i = 0; i < kSeq.size(); ++i) f << (i ? "," : "") << kSeq[i];
      f << "]]";
    }
    EvalOptions eo;
    eo.device = DeviceChoice::kCpu;
    eo.model_dir = kData + c.model;
    if (*c.adapter) eo.adapter_dir = kData + c.adapter;
    eo.data = ids_json;
    eo.dump_logits = (dir / "qshard_gen_eval.safetensors").string();
    evaluate_model(eo);
    GenerateOptions go;
    go.device = DeviceChoice::kCpu;
    go.model_dir = eo.model_dir;
    go.adapter_dir = eo.adapter_dir;
    go.prompt_ids = kSeq;
    go.max_new_tokens = 3;
    go.dump_logits = (dir / "qshard_gen_first.safetensors").string();
    const GenerateResult r = generate_text(go);
    EXPECT_EQ(r.prompt_ids, kSeq);
    EXPECT_EQ(r.ids.size(), 3u);
    const auto eval = SafetensorsFile::open(eo.dump_logits).get("logits").to_f32_vector();
    const auto first = SafetensorsFile::open(go.dump_logits).get("logits").to_f32_vector();
    const size_t V = first.size();
    ASSERT_EQ(eval.size(), kSeq.size() * V);
    EXPECT_EQ(0, std::memcmp(first.data(), eval.data() + (kSeq.size() - 1) * V, V * 4));
    // Greedy: the first new token is the argmax of those logits.
    int64_t best = 0;
    for (size_t i = 1; i < V; ++i)
      if (first[i] > first[static_cast<size_t>(best)]) best = static_cast<int64_t>(i);
    EXPECT_EQ(r.ids[0], best);
    for (const auto& p : {ids_json, eo.dump_logits, go.dump_logits}) fs::remove(p);
  }
}

// Greedy generation of n tokens is the argmax chain of the full forward (no cache involved).
TEST(Generate, GreedyIsTheArgmaxChain) {
  const Case& c = kCases[2];
  GenerateOptions go;
  go.device = DeviceChoice::kCpu;
  go.model_dir = kData + c.model;
  go.adapter_dir = kData + c.adapter;
  go.prompt_ids = {5, 6, 7};
  go.max_new_tokens = 6;
  go.ignore_eos = true;
  const GenerateResult r = generate_text(go);
  ASSERT_EQ(r.ids.size(), 6u);
  InferenceModel im = load_inference_model(go.model_dir, go.adapter_dir);
  DeviceContext ctx(Backend::kCpu, -1);
  LlamaModelOptions mo = im.options;
  mo.max_seq = 9;
  LlamaModel model(im.config, *im.tree, ctx, mo);
  model.set_training(false);
  std::vector<int64_t> seq = go.prompt_ids;
  for (int64_t want : r.ids) {
    const std::vector<float> l = model.forward_logits(seq, 1, static_cast<int64_t>(seq.size()));
    const int64_t V = im.config.vocab_size;
    const float* last = l.data() + (seq.size() - 1) * V;
    const int64_t best = std::max_element(last, last + V) - last;
    EXPECT_EQ(want, best) << "at position " << seq.size();
    seq.push_back(best);
  }
}

// Generation stops when the next token would need a position past max_position_embeddings (64
// here) and says so; a run that ends at --max-new-tokens or below the limit does not.
TEST(Generate, StopAtMaxPositionsIsReported) {
  GenerateOptions go;
  go.device = DeviceChoice::kCpu;
  go.model_dir = kData + "/model/tiny_llama3_tied";
  go.prompt_ids.assign(60, 5);
  go.max_new_tokens = 10;
  go.ignore_eos = true;
  GenerateResult r = generate_text(go);
  EXPECT_TRUE(r.stopped_at_max_positions);
  EXPECT_EQ(r.max_positions, 64);
  EXPECT_EQ(r.ids.size(), 5u);  // positions 60..63 fed, the token after the last one sampled
  go.max_new_tokens = 5;        // exactly what fits: an ordinary end
  r = generate_text(go);
  EXPECT_FALSE(r.stopped_at_max_positions);
  EXPECT_EQ(r.ids.size(), 5u);
  go.prompt_ids.assign(3, 5);
  go.max_new_tokens = 4;
  r = generate_text(go);
  EXPECT_FALSE(r.stopped_at_max_positions);
  EXPECT_EQ(r.ids.size(), 4u);
}

// eos_token_id of a wrong type or outside the vocabulary (96) was skipped in silence and
// generation ran past the end it meant: refused naming the file and the value; null means none.
TEST(Generate, BadEosTokenIdIsNamed) {
  const fs::path dir = fs::temp_directory_path() / ("qshard_gen_eos_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(kData + "/model/tiny_llama3_tied/" + f, dir / f);
  GenerateOptions go;
  go.device = DeviceChoice::kCpu;
  go.model_dir = dir.string();
  go.prompt_ids = {5, 6};
  go.max_new_tokens = 2;
  auto with = [&](const std::string& generation_config) {
    std::ofstream(dir / "generation_config.json") << generation_config;
    try {
      generate_text(go);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string file = (dir / "generation_config.json").string();
  for (const char* bad : {"\"x\"", "1.5", "-5", "96", "[2, [3]]", "[2, 1e30]", "18446744073709551615"})
    EXPECT_EQ(with(std::string("{\"eos_token_id\": ") + bad + "}"),
              file + ": key \"eos_token_id\" must be a token id in [0, 96) or a list of them, got " +
                  nlohmann::json::parse(bad).dump())
        << bad;
  EXPECT_EQ(with("[2]"), file + ": expected a JSON object, got array");
  EXPECT_EQ(with("{\"eos_token_id\": null}"), "no error");  // none here: config.json's 2
  EXPECT_EQ(with("{\"eos_token_id\": [95, 0]}"), "no error");
  fs::remove_all(dir);
}

TEST(Sampler, GreedyTopKAndTopP) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  Sampler greedy({});
  EXPECT_EQ(greedy.next(logits), 1);  // the first largest
  SamplingOptions k1;
  k1.temperature = 5.0;
  k1.top_k = 1;
  Sampler s1(k1);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s1.next(logits), 1);  // ties: the lower id
  SamplingOptions p_small;
  p_small.temperature = 1.0;
  p_small.top_p = 1e-6;
  Sampler s2(p_small);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s2.next(logits), 1);
  // top-k 3 of 5: only ids 1, 3, 4 ever come.
  SamplingOptions k3;
  k3.temperature = 1.0;
  k3.top_k = 3;
  k3.seed = 7;
  Sampler s3(k3);
  std::map<int64_t, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[s3.next(logits)];
  EXPECT_EQ(seen.count(0) + seen.count(2), 0u);
  EXPECT_GT(seen[4], 100);
}

TEST(Sampler, DistributionAndSeed) {
  // Probabilities 0.6, 0.3, 0.1: top-p 0.5 keeps the first only, 0.7 the first two, 1.0 all.
  const std::vector<float> logits = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  for (const auto& [top_p, allowed] : {std::pair{0.5, 1}, std::pair{0.7, 2}, std::pair{1.0, 3}}) {
    SamplingOptions o;
    o.temperature = 1.0;
    o.top_p = top_p;
    o.seed = 11;
    Sampler s(o);
    std::vector<int> n(3);
    const int draws = 20000;
    for (int i = 0; i < draws; ++i) ++n[static_cast<size_t>(s.next(logits))];
    for (int id = allowed; id < 3; ++id) EXPECT_EQ(n[static_cast<size_t>(id)], 0) << "top_p " << top_p;
    if (allowed == 3) {  // the softmax itself
      EXPECT_NEAR(n[0] / double(draws), 0.6, 0.015);
      EXPECT_NEAR(n[1] / double(draws), 0.3, 0.015);
      EXPECT_NEAR(n[2] / double(draws), 0.1, 0.01);
    }
    if (allowed == 2) {
      EXPECT_NEAR(n[0] / double(draws), 0.6 / 0.9, 0.015);  // renormalized
    }
  }
  // Temperature 0.5 squares the odds: 0.6^2 : 0.3^2 : 0.1^2.
  SamplingOptions t;
  t.temperature = 0.5;
  Sampler st(t);
  int first = 0;
  for (int i = 0; i < 20000; ++i) first += st.next(logits) == 0;
  EXPECT_NEAR(first / 20000.0, 0.36 / 0.46, 0.015);
  // The same seed, the same tokens; another seed, others.
  SamplingOptions a;
  a.temperature = 1.0;
  a.seed = 42;
  Sampler x(a), y(a);
  a.seed = 43;
  Sampler z(a);
  int same_xy = 0, same_xz = 0;
  for (int i = 0; i < 200; ++i) {
    const int64_t vx = x.next(logits);
    same_xy += vx == y.next(logits);
    same_xz += vx == z.next(logits);
  }
  EXPECT_EQ(same_xy, 200);
  EXPECT_LT(same_xz, 200);
}

TEST(Generate, BadInputIsNamed) {
  auto message = [](const GenerateOptions& o) {
    try {
      generate_text(o);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  GenerateOptions o;
  o.device = DeviceChoice::kCpu;
  o.model_dir = kData + "/model/tiny_llama3_tied";
  o.prompt_ids = {1, 2, 100000};
  EXPECT_NE(message(o).find("100000"), std::string::npos) << message(o);
  o.prompt_ids = {1, 2};
  o.sampling.top_p = 0.0;
  EXPECT_NE(message(o).find("--top-p"), std::string::npos);
  o.sampling.top_p = 1.0;
  o.sampling.temperature = -1;
  EXPECT_NE(message(o).find("--temperature"), std::string::npos);
  o.sampling.temperature = 0;
  o.prompt = "hello";
  EXPECT_NE(message(o).find("exactly one"), std::string::npos);
  o.prompt_ids.clear();  // text prompt, a vocabulary of 128 and no tokenizer.json
  EXPECT_NE(message(o).find("tokenizer"), std::string::npos) << message(o);
  o.model_dir = kData + "/model/missing";
  EXPECT_NE(message(o).find("missing"), std::string::npos);
}

}  // namespace
}  // namespace qshard
