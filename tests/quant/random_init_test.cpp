// The random base's float tensors (checkpoint/random_llama.h, checkpoint/model_init.h): the
// counter-based random_normal split over threads, and random_normal_into's direct fill, give
// exactly the bytes of the one-thread draw converted by Tensor::from_f32 (tolerance: none; the
// values are a pure function of (seed, name, index), the rounding is from_f32's).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "checkpoint/llama_tree.h"
#include "checkpoint/model_init.h"
#include "checkpoint/random_llama.h"

namespace qshard {
namespace {

const std::string kName = "model.embed_tokens.weight";

TEST(RandomNormal, SameValuesAtAnyThreadCount) {
  const int64_t n = kFastNormalElements + 3 * (int64_t{1} << 22) + 5;  // counter-based: 8 chunks, a short one last
  const std::vector<float> one = random_normal(7, kName, n, 0.02, 1);
  for (int threads : {2, 5}) {
    const std::vector<float> many = random_normal(7, kName, n, 0.02, threads);
    ASSERT_EQ(one.size(), many.size());
    EXPECT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float))) << threads << " threads";
  }
  // Against the generator as random_llama.h states it, at chunk edges: splitmix64(h + i * golden)
  // as four 16-bit uniforms, (sum - 131070) * std * sqrt(3) / 65536, h = FNV-1a(name) ^ seed mixing.
  uint64_t h = 1469598103934665603ull ^ 7;
  for (unsigned char c : kName) h = (h ^ c) * 1099511628211ull;
  for (int64_t i : {int64_t{0}, int64_t{1}, (int64_t{1} << 22) - 1, int64_t{1} << 22, n - 1}) {
    uint64_t z = h + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const double sum = double(z & 0xffff) + double((z >> 16) & 0xffff) + double((z >> 32) & 0xffff) + double(z >> 48);
    const float want = static_cast<float>((sum - 131070.0) * (0.02 * std::sqrt(3.0) / 65536.0));
    std::printf("  value %lld: reference %.9g  random_normal %.9g\n", static_cast<long long>(i), want, one[i]);
    EXPECT_EQ(want, one[static_cast<size_t>(i)]) << i;
  }
  // The Box-Muller path (small tensors) ignores threads.
  EXPECT_EQ(random_normal(7, "x", 1001, 1.0, 1), random_normal(7, "x", 1001, 1.0, 4));
}

TEST(RandomNormal, IntoTensorIsFromF32OfRandomNormal) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t n : {int64_t{1001}, kFastNormalElements + 7}) {
      const Shape shape{n};
      const Tensor want = Tensor::from_f32(shape, dt, random_normal(3, kName, n, 0.5, 1));
      Tensor got = Tensor::empty(shape, dt);
      random_normal_into(got, 3, kName, 0.5, 3);
      EXPECT_TRUE(bitwise_equal(want, got)) << dtype_torch_name(dt) << " n=" << n;
    }
  }
  Tensor ints = Tensor::empty({4}, DType::kI32);
  EXPECT_THROW(random_normal_into(ints, 3, kName, 0.5), Error);
}

// init_random_base fills a float tensor past kFastNormalElements (here the embedding and LM head,
// 8200 x 2048 = 16.8 M values) over every core, with the bytes of the one-thread draw.
TEST(RandomNormal, InitRandomBaseLargeFloatTensors) {
  LlamaSizes sizes;
  sizes.vocab_size = 8200;
  sizes.hidden_size = 2048;
  sizes.intermediate_size = 64;
  sizes.num_hidden_layers = 1;
  sizes.num_attention_heads = 16;
  sizes.num_key_value_heads = 16;
  const LlamaConfig mc = LlamaConfig::from_json(llama_config_json(sizes, DType::kBF16), "test");
  LlamaTreeOptions to;
  to.dtype = DType::kBF16;
  to.quant = QuantizeOptions{};
  auto tree = build_llama_tree(mc, to);
  init_random_base(*tree, 11, 0.02, /*draw_4bit=*/true);
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight"}) {
    const Tensor& t = resolve(*tree, name).tensor;
    ASSERT_GT(t.numel(), kFastNormalElements) << name;
    EXPECT_TRUE(bitwise_equal(t, Tensor::from_f32(t.shape(), DType::kBF16, random_normal(11, name, t.numel(), 0.02, 1))))
        << name;
  }
  const Tensor& norm = resolve(*tree, "model.norm.weight").tensor;
  EXPECT_EQ(norm.to_f32_vector(), std::vector<float>(static_cast<size_t>(norm.numel()), 1.0f));
}

}  // namespace
}  // namespace qshard
