// Non-finite weights and quant-state sanity (issue 25), on copies of the golden folders of
// tests/data/hf with values corrupted in the safetensors payload:
//  - count_nonfinite finds NaN / Inf in f32, bf16 and f16 by their bits, across chunk borders,
//    the same count and first index on 1 or 4 threads;
//  - load_llama_folder refuses a NaN / Inf float weight (as stored, f32, quantized on load),
//    naming the file, tensor, first flat index and count; allow_nonfinite loads it;
//  - a 4-bit folder whose nested_absmax is NaN, nested_offset 1e308, plain absmax Inf or quant_map
//    NaN is refused by tensor and field (load and dequantize); allow_nonfinite lets it through;
//  - a packed quant state whose shape overflows (or holds a negative or > int64 dimension, or a
//    bad nested_blocksize) is an InputError naming the label and field, never an internal Error.
#include "checkpoint/nonfinite.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>

#include "checkpoint/bnb_folder.h"
#include "checkpoint/llama_loader.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_index.h"
#include "common/test_util.h"
#include "runtime/parallel.h"

namespace qshard {
namespace {
namespace fs = std::filesystem;
using testing_util::error_of;
using testing_util::TempDir;

const std::string kHf = std::string(QSHARD_TEST_DATA_DIR) + "/hf";
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

bool has(const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; }

// Every tensor of `dir`, as owned copies (so a test can change their bytes).
NamedTensors owned_tensors(const std::string& dir) {
  const SafetensorsFolder folder = SafetensorsFolder::open(dir);
  NamedTensors out;
  for (const auto& name : folder.names()) {
    const Tensor t = folder.get(name);
    out.emplace_back(name, Tensor::from_bytes(t.shape(), t.dtype(), t.bytes()));
  }
  return out;
}

Tensor& find(NamedTensors& ts, const std::string& name) {
  for (auto& [k, t] : ts)
    if (k == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  static Tensor none;
  return none;
}

// `src`'s side files and `tensors` as a folder `name` under tmp.
std::string write_folder(const TempDir& tmp, const std::string& name, const std::string& src, const NamedTensors& tensors) {
  const std::string dir = tmp.file(name);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "generation_config.json"}) fs::copy_file(fs::path(src) / f, fs::path(dir) / f);
  save_safetensors((fs::path(dir) / "model.safetensors").string(), tensors);
  return dir;
}

// Sets element i of a float tensor (any float dtype) to v, as that dtype stores it.
void set_value(Tensor& t, int64_t i, float v) {
  std::vector<float> all = t.to_f32_vector();
  all[static_cast<size_t>(i)] = v;
  t = Tensor::from_f32(t.shape(), t.dtype(), all);
}

TEST(CountNonfinite, FindsNanAndInfByTheirBitsInEveryFloatDtype) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<float> v(1000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;  // finite, non-zero
    Tensor t = Tensor::from_f32({10, 100}, dt, v);
    EXPECT_EQ(count_nonfinite(t).count, 0) << dtype_torch_name(dt);
    EXPECT_EQ(count_nonfinite(t).first, -1);
    v[17] = kNaN;
    v[500] = -kInf;
    v[999] = kInf;
    t = Tensor::from_f32({10, 100}, dt, v);
    const NonfiniteCount r = count_nonfinite(t);
    EXPECT_EQ(r.count, 3) << dtype_torch_name(dt);
    EXPECT_EQ(r.first, 17) << dtype_torch_name(dt);
  }
  // The largest finite values are not flagged.
  const Tensor big = Tensor::from_f32({2}, DType::kF32, std::vector<float>{std::numeric_limits<float>::max(), -3e38f});
  EXPECT_EQ(count_nonfinite(big).count, 0);
  // Integers hold no NaN.
  EXPECT_EQ(count_nonfinite(Tensor::zeros({8}, DType::kU8)).count, 0);
}

TEST(CountNonfinite, ChunksOnThreadsGiveTheSameCountAndFirstIndex) {
  const int64_t n = 2 * kNonfiniteChunk + 5;  // three chunks, the last one short
  Tensor t = Tensor::zeros({n}, DType::kBF16);
  uint16_t* p = t.data<uint16_t>();
  const int64_t bad[] = {kNonfiniteChunk + 7, kNonfiniteChunk + 8, 2 * kNonfiniteChunk + 4};
  for (int64_t i : bad) p[i] = 0x7fc0;  // bf16 NaN
  p[2 * kNonfiniteChunk] = 0xff80;      // bf16 -Inf
  for (int threads : {1, 4}) {
    const NonfiniteCount r = count_nonfinite(t, threads);
    EXPECT_EQ(r.count, 4) << threads;
    EXPECT_EQ(r.first, kNonfiniteChunk + 7) << threads;
  }
}

// The check's cost (not a test of time; run with --gtest_also_run_disabled_tests): 1 GiB of bf16
// (finite, the common case: every element read once), on 1 thread and on the host's threads.
TEST(CountNonfinite, DISABLED_ThroughputOnOneGiBOfBf16) {
  const int64_t n = int64_t{1} << 29;
  Tensor t = Tensor::empty({n}, DType::kBF16);
  uint16_t* p = t.data<uint16_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint16_t>(0x3c00 + (i & 0xff));  // finite
  for (int threads : {1, 2, host_threads(16)}) {
    count_nonfinite(t, threads);  // warm
    const auto t0 = std::chrono::steady_clock::now();
    const int reps = 3;
    for (int r = 0; r < reps; ++r) EXPECT_EQ(count_nonfinite(t, threads).count, 0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    std::printf("count_nonfinite, 1 GiB bf16, %d thread(s): %.3f s, %.2f GB/s\n", threads, s, 2.0 * n / s / 1e9);
  }
}

TEST(NonfiniteLoad, NanInABf16WeightIsRefusedNamingTensorIndexAndCount) {
  const std::string src = kHf + "/tiny_llama_bf16";
  TempDir tmp;
  NamedTensors ts = owned_tensors(src);
  Tensor& up = find(ts, "model.layers.0.mlp.up_proj.weight");
  set_value(up, 3, kNaN);
  set_value(up, 40, kInf);
  const std::string dir = write_folder(tmp, "nan", src, ts);
  const std::string want = "tensor 'model.layers.0.mlp.up_proj.weight' holds 2 NaN/Inf values (the first at flat index 3)";

  LlamaLoadOptions as_stored, f32, quantized;
  f32.floats = LlamaLoadOptions::Floats::kF32;  // eval / generate
  f32.strict = false;
  quantized.quantize = QuantizeOptions{};       // training's model.path
  quantized.strict = false;
  for (const LlamaLoadOptions& o : {as_stored, f32, quantized}) {
    const std::string msg = error_of([&] { load_llama_folder(dir, o); });
    EXPECT_TRUE(has(msg, dir + "/model.safetensors: " + want)) << msg;
    EXPECT_TRUE(has(msg, "--allow-nonfinite")) << msg;
  }
  // allow_nonfinite: the folder loads, the NaN where it was.
  as_stored.allow_nonfinite = true;
  const LoadedLlama m = load_llama_folder(dir, as_stored);
  const Tensor got = try_resolve(*m.tree, "model.layers.0.mlp.up_proj.weight")->tensor;
  EXPECT_TRUE(std::isnan(got.to_f32_vector()[3]));
  quantized.allow_nonfinite = true;
  EXPECT_NO_THROW(load_llama_folder(dir, quantized));
}

TEST(NonfiniteLoad, InfInANormIsRefusedToo) {
  const std::string src = kHf + "/tiny_llama_f32";
  TempDir tmp;
  NamedTensors ts = owned_tensors(src);
  set_value(find(ts, "model.norm.weight"), 0, -kInf);
  const std::string dir = write_folder(tmp, "inf", src, ts);
  const std::string msg = error_of([&] { load_llama_folder(dir); });
  EXPECT_TRUE(has(msg, "tensor 'model.norm.weight' holds 1 NaN/Inf values (the first at flat index 0)")) << msg;
}

// The tiny nf4 double-quant folder with one change to q_proj's statistics.
constexpr const char* kW = "model.layers.0.self_attn.q_proj.weight";

std::string packed_json_of(const Tensor& t) {
  const auto b = t.bytes();
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}
Tensor json_tensor(const std::string& s) {
  return Tensor::from_bytes({static_cast<int64_t>(s.size())}, DType::kU8,
                            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

void expect_refused_then_allowed(const std::string& dir, const std::string& field_part) {
  const std::string msg = error_of([&] { load_llama_folder(dir); });
  EXPECT_TRUE(has(msg, "model.safetensors: '" + std::string(kW) + "': " + field_part)) << msg;
  EXPECT_TRUE(has(msg, "--allow-nonfinite")) << msg;
  LlamaLoadOptions f32;
  f32.floats = LlamaLoadOptions::Floats::kF32;
  f32.strict = false;
  EXPECT_TRUE(has(error_of([&] { load_llama_folder(dir, f32); }), field_part));
  LlamaLoadOptions allow;
  allow.allow_nonfinite = true;
  EXPECT_NO_THROW(load_llama_folder(dir, allow));
  // dequantize refuses before writing anything; with the flag it writes the folder.
  TempDir out;
  const std::string dmsg = error_of([&] { dequantize_model_folder(dir, out.file("d")); });
  EXPECT_TRUE(has(dmsg, std::string(kW) + "': " + field_part)) << dmsg;
  EXPECT_FALSE(fs::exists(out.file("d")));
  EXPECT_NO_THROW(dequantize_model_folder(dir, out.file("d2"), std::nullopt, 5'000'000'000ULL, true));
}

TEST(NonfiniteQuantState, NanNestedAbsmaxIsRefused) {
  const std::string src = kHf + "/tiny_llama_bnb4_nf4_dq";
  TempDir tmp;
  NamedTensors ts = owned_tensors(src);
  set_value(find(ts, std::string(kW) + ".nested_absmax"), 0, kNaN);
  expect_refused_then_allowed(write_folder(tmp, "nested_nan", src, ts), "nested_absmax[0] = NaN (1 such values)");
}

TEST(NonfiniteQuantState, HugeNestedOffsetIsRefused) {
  const std::string src = kHf + "/tiny_llama_bnb4_nf4_dq";
  TempDir tmp;
  NamedTensors ts = owned_tensors(src);
  Tensor& js = find(ts, std::string(kW) + ".quant_state.bitsandbytes__nf4");
  const std::string text = std::regex_replace(packed_json_of(js), std::regex("\"nested_offset\": [^}]*"), "\"nested_offset\": 1e308");
  ASSERT_TRUE(has(text, "1e308")) << text;
  js = json_tensor(text);
  expect_refused_then_allowed(write_folder(tmp, "offset", src, ts), "nested_offset = Infinity");
  // A finite offset past float16's range, for a float16 weight, decodes past what the dtype holds.
  QuantState st = QuantState::from_packed_json(
      "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float16\", \"shape\": [64], \"nested_blocksize\": 256, "
      "\"nested_dtype\": \"float32\", \"nested_offset\": 70000.0}",
      "x");
  st.code = Tensor::from_f32({16}, DType::kF32, std::vector<float>(16, 0.5f));
  st.absmax = Tensor::zeros({1}, DType::kU8);
  st.state2->absmax = Tensor::from_f32({1}, DType::kF32, std::vector<float>{1.0f});
  st.state2->code = Tensor::from_f32({256}, DType::kF32, std::vector<float>(256, 0.0f));
  st.validate("x");
  EXPECT_TRUE(has(error_of([&] { st.check_values("x"); }), "nested_offset = 70000.0 (packed quant state): expected a finite value of magnitude < 65520.0"));
  // 65510 still rounds to float16's largest finite value (bitsandbytes' own data decodes to 65509).
  st.state2->offset = 65510.0f;
  EXPECT_NO_THROW(st.check_values("x"));
}

TEST(NonfiniteQuantState, InfPlainAbsmaxAndNanQuantMapAreRefused) {
  const std::string src = kHf + "/tiny_llama_bnb4_fp4";  // no double quant: absmax f32
  TempDir tmp;
  NamedTensors ts = owned_tensors(src);
  set_value(find(ts, std::string(kW) + ".absmax"), 5, kInf);
  const std::string dir = write_folder(tmp, "absmax", src, ts);
  EXPECT_TRUE(has(error_of([&] { load_llama_folder(dir); }), std::string(kW) + "': absmax[5] = Infinity (1 such values)"));
  NamedTensors ts2 = owned_tensors(src);
  set_value(find(ts2, std::string(kW) + ".quant_map"), 2, kNaN);
  const std::string dir2 = write_folder(tmp, "qmap", src, ts2);
  EXPECT_TRUE(has(error_of([&] { load_llama_folder(dir2); }), std::string(kW) + "': quant_map[2] = NaN"));
}

std::string json_with_shape(const std::string& shape, const std::string& nested_bs = "256") {
  return "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"bfloat16\", \"shape\": " + shape +
         ", \"nested_blocksize\": " + nested_bs + ", \"nested_dtype\": \"float32\", \"nested_offset\": 0.5}";
}

TEST(QuantStateShape, OverflowingOrBadShapesAreInputErrorsNamingTheField) {
  const std::string label = "f.safetensors: 'w.quant_state.bitsandbytes__nf4'";
  for (const char* shape : {"[1099511627776, 1099511627776]", "[4611686018427387904, 2]", "[2, 3, -1]",
                            "[18446744073709551615]", "[1.5]"}) {
    const std::string msg = error_of([&] { QuantState::from_packed_json(json_with_shape(shape), label); });
    EXPECT_TRUE(has(msg, label + ": packed quant state field \"shape\"")) << shape << ": " << msg;
  }
  EXPECT_EQ(QuantState::from_packed_json(json_with_shape("[4611686018427387904]"), label).numel(), kMaxQuantNumel);
  for (const char* bs : {"0", "-256", "4611686018427387904", "100"}) {
    const std::string msg = error_of([&] { QuantState::from_packed_json(json_with_shape("[64]", bs), label); });
    EXPECT_TRUE(has(msg, label + ": packed quant state field \"nested_blocksize\"")) << bs << ": " << msg;
  }
}

TEST(QuantStateShape, AFolderWithAnOverflowingShapeIsAnInputErrorOnLoadAndDequantize) {
  const std::string src = kHf + "/tiny_llama_bnb4_nf4_dq";
  TempDir tmp;
  int k = 0;
  for (const char* shape : {"[1099511627776, 1099511627776]", "[1099511627776, 4194304]"}) {  // overflow; 2^62
    NamedTensors ts = owned_tensors(src);
    Tensor& js = find(ts, std::string(kW) + ".quant_state.bitsandbytes__nf4");
    js = json_tensor(std::regex_replace(packed_json_of(js), std::regex("\"shape\": \\[[^\\]]*\\]"), std::string("\"shape\": ") + shape));
    const std::string dir = write_folder(tmp, "shape" + std::to_string(k++), src, ts);
    const std::string msg = error_of([&] { load_llama_folder(dir); });
    EXPECT_TRUE(has(msg, kW)) << msg;
    EXPECT_TRUE(has(msg, "\"shape\"") || has(msg, "packed bytes, but shape")) << msg;
    TempDir out;
    const std::string dmsg = error_of([&] { dequantize_model_folder(dir, out.file("d")); });
    EXPECT_TRUE(has(dmsg, kW)) << dmsg;
  }
}

TEST(QuantStateShape, StatisticCountsMustMatchTheShape) {
  const std::string src = kHf + "/tiny_llama_bnb4_nf4_dq";
  TempDir tmp;
  NamedTensors ts = owned_tensors(src);
  Tensor& a = find(ts, std::string(kW) + ".absmax");
  a = Tensor::zeros({a.numel() - 1}, DType::kU8);
  const std::string dir = write_folder(tmp, "count", src, ts);
  const std::string msg = error_of([&] { load_llama_folder(dir); });
  EXPECT_TRUE(has(msg, std::string(kW) + "': absmax has")) << msg;
}

}  // namespace
}  // namespace qshard
