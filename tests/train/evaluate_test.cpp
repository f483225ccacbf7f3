// `qshard eval` against transformers' logits (scripts/make_eval_golden.py): an f32 folder, a
// bitsandbytes 4-bit folder (as bitsandbytes computes it in float32), each with and without a
// PEFT adapter. Tolerance 2e-5 absolute on logits of magnitude ~1: both sides are float32 and
// differ only in summation order (measured 2.7e-6 at worst).
#include "train/evaluate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors.h"
#include "runtime/error.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;

const std::string kData = QSHARD_TEST_DATA_DIR;
constexpr double kLogitTol = 2e-5;

struct Case {
  const char* key;
  const char* model;
  const char* adapter;
  const char* ids;
};

TEST(Eval, LogitsMatchTransformers) {
  const SafetensorsFile golden = SafetensorsFile::open(kData + "/model/eval_golden.safetensors");
  for (const Case& c : {Case{"f32_plain", "/model/tiny_llama3_tied", "", "f32"},
                        Case{"f32_adapter", "/model/tiny_llama3_tied", "/model/llama3_adapter", "f32"},
                        Case{"bnb_plain", "/hf/tiny_llama_bnb4_nf4_dq", "", "bnb"},
                        Case{"bnb_adapter", "/hf/tiny_llama_bnb4_nf4_dq", "/model/nf4_adapter", "bnb"}}) {
    SCOPED_TRACE(c.key);
    EvalOptions o;
    o.model_dir = kData + c.model;
    if (*c.adapter) o.adapter_dir = kData + c.adapter;
    o.data = kData + "/model/eval_ids_" + c.ids + ".json";
    o.dump_logits = (fs::temp_directory_path() / (std::string("qshard_eval_") + c.key + ".safetensors")).string();
    const EvalResult r = evaluate_model(o);
    EXPECT_EQ(r.sequences, 2);
    EXPECT_EQ(r.tokens, 20);
    EXPECT_NEAR(r.perplexity, std::exp(r.loss), 1e-9 * r.perplexity);
    const auto mine = SafetensorsFile::open(o.dump_logits).get("logits").to_f32_vector();
    const auto theirs = golden.get(c.key).to_f32_vector();
    ASSERT_EQ(mine.size(), theirs.size());
    double worst = 0;
    for (size_t i = 0; i < mine.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(mine[i] - theirs[i])));
    std::printf("%s: max |logit - transformers| = %.2e (tolerance %.0e)\n", c.key, worst, kLogitTol);
    EXPECT_LE(worst, kLogitTol);
    fs::remove(o.dump_logits);
  }
}

TEST(Eval, BadInputIsNamed) {
  EvalOptions o;
  o.model_dir = kData + "/model/tiny_llama3_tied";
  o.data = kData + "/model/missing.json";
  EXPECT_THROW(evaluate_model(o), InputError);
  const std::string bad = (fs::temp_directory_path() / "qshard_eval_bad.json").string();
  std::ofstream(bad) << "[[1, 2, 100000]]";
  o.data = bad;
  try {
    evaluate_model(o);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("token 100000"), std::string::npos) << e.what();
  }
  o.data = kData + "/model/eval_ids_f32.json";
  o.adapter_dir = kData + "/model/nf4_adapter";  // an adapter for another model
  EXPECT_THROW(evaluate_model(o), InputError);
  fs::remove(bad);
}

}  // namespace
}  // namespace qshard
