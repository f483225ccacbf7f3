// random_4bit drawn on the GPU against the CPU draw (label `cuda`; skips without a GPU).
// Tolerance: zero. Both run the same per-block functions (quant/random_4bit_block.h) with the same
// IEEE operations (no FMA contraction, own log / expm1, the Phi table computed on the host and
// uploaded), so codes, absmax and nested statistics must be bitwise equal.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <string>

#include "checkpoint/llama_tree.h"
#include "checkpoint/model_init.h"
#include "checkpoint/random_llama.h"
#include "quant/params4bit.h"
#include "quant/random_4bit.h"
#include "runtime/parallel.h"
#include "runtime/stream.h"

namespace qshard {
namespace {

struct Case {
  Shape shape;
  QuantType type;
  int64_t blocksize;
  DType dtype;
  bool dq;
};

std::string name(const Case& c) {
  return std::string(quant_type_name(c.type)) + " bs" + std::to_string(c.blocksize) + (c.dq ? " dq " : " ") +
         dtype_torch_name(c.dtype) + " " + shape_str(c.shape);
}

// Counts differing bytes, prints the first pair and the count, expects none.
void expect_same(const Tensor& cpu, const Tensor& gpu, const std::string& what) {
  const Tensor g = gpu.device() == Device::kCpu ? gpu : gpu.to(Device::kCpu);
  ASSERT_EQ(cpu.dtype(), g.dtype()) << what;
  ASSERT_EQ(cpu.shape(), g.shape()) << what;
  const auto a = cpu.bytes(), b = g.bytes();
  size_t differ = 0, first = a.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) {
      if (!differ) first = i;
      ++differ;
    }
  std::printf("  %-44s %zu bytes: cpu[0] 0x%02x gpu[0] 0x%02x, cpu[-1] 0x%02x gpu[-1] 0x%02x; %zu differ (tolerance 0)\n",
              what.c_str(), a.size(), a[0], b[0], a[a.size() - 1], b[b.size() - 1], differ);
  EXPECT_EQ(differ, 0u) << what << ": first difference at byte " << first;
}

void expect_same(const Params4bit& cpu, const Params4bit& gpu, const std::string& what) {
  expect_same(cpu.data, gpu.data, what + " codes");
  expect_same(cpu.quant_state.absmax, gpu.quant_state.absmax, what + " absmax");
  ASSERT_EQ(cpu.quant_state.nested(), gpu.quant_state.nested()) << what;
  if (cpu.quant_state.nested()) {
    EXPECT_EQ(cpu.quant_state.state2->offset, gpu.quant_state.state2->offset) << what;
    expect_same(cpu.quant_state.state2->absmax, gpu.quant_state.state2->absmax, what + " nested_absmax");
  }
  if (cpu.quant_state.absmax.dtype() == DType::kF32) {
    const float* a = cpu.quant_state.absmax.data<float>();
    const std::vector<float> b = (gpu.quant_state.absmax.device() == Device::kCpu ? gpu.quant_state.absmax
                                                                                  : gpu.quant_state.absmax.to(Device::kCpu))
                                     .to_f32_vector();
    std::printf("    absmax[0]: cpu %.9g gpu %.9g\n", a[0], b[0]);
  }
}

class Random4bitCuda : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// random_4bit on the GPU (device tensors, on a named stream) and random_4bit_to_host on the GPU
// (chunks through pinned staging) against the CPU draw on several threads.
TEST_P(Random4bitCuda, BytesEqualTheCpuDraw) {
  const Case c = GetParam();
  const QuantizeOptions o{c.type, c.blocksize, c.dq};
  const uint64_t key = 0xabc + static_cast<uint64_t>(shape_numel(c.shape));
  const Params4bit cpu = random_4bit(c.shape, c.dtype, o, 0.02, key, host_threads(16));
  const Stream stream("random_4bit_test");
  const Params4bit dev = random_4bit(c.shape, c.dtype, o, 0.02, key, Device::kCuda, stream.handle());
  ASSERT_EQ(dev.data.device(), Device::kCuda);
  expect_same(cpu, dev, name(c) + " device");
  Params4bit host;
  const Random4bitJob job{c.shape, c.dtype, o, 0.02, key, &host};
  random_4bit_to_host({&job, 1}, Device::kCuda, 2);
  ASSERT_EQ(host.data.device(), Device::kCpu);
  expect_same(cpu, host, name(c) + " to_host");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Random4bitCuda,
    testing::Values(Case{{1}, QuantType::kNf4, 64, DType::kBF16, false},              // one value
                    Case{{37, 129}, QuantType::kNf4, 64, DType::kBF16, true},         // odd, last block short
                    Case{{37, 129}, QuantType::kFp4, 64, DType::kF16, false},
                    Case{{37, 129}, QuantType::kFp4, 32, DType::kF32, true},
                    Case{{1000, 1001}, QuantType::kNf4, 4096, DType::kF32, false},    // odd, 245 blocks of 4096
                    Case{{1000, 1001}, QuantType::kFp4, 4096, DType::kBF16, true},
                    Case{{1000, 1001}, QuantType::kNf4, 256, DType::kF16, true},
                    Case{{4097, 4099}, QuantType::kNf4, 4096, DType::kBF16, true},    // 2 staging chunks, odd
                    Case{{4097, 4099}, QuantType::kFp4, 64, DType::kF16, false},
                    Case{{8192, 28672}, QuantType::kNf4, 64, DType::kBF16, true}),   // a 70B MLP projection
    [](const testing::TestParamInfo<Case>& i) {
      std::string s = name(i.param);
      for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return s;
    });

// A batch of many tensors over several worker threads, and init_random_base with draw_on = kCuda:
// the tree's every tensor equals the CPU draw's.
TEST(Random4bitCudaBatch, InitRandomBaseOnTheGpuEqualsTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  LlamaSizes sizes;
  sizes.vocab_size = 300;
  sizes.hidden_size = 256;
  sizes.intermediate_size = 688;
  sizes.num_hidden_layers = 3;
  sizes.num_attention_heads = 4;
  sizes.num_key_value_heads = 2;
  const LlamaConfig mc = LlamaConfig::from_json(llama_config_json(sizes, DType::kBF16), "test");
  LlamaTreeOptions to;
  to.dtype = DType::kBF16;
  to.quant = QuantizeOptions{};
  to.shapes_only_4bit = true;  // as qlora_model.cpp builds a random base
  auto on_cpu = build_llama_tree(mc, to), on_gpu = build_llama_tree(mc, to);
  init_random_base(*on_cpu, 5, 0.02, /*draw_4bit=*/true, Device::kCpu);
  init_random_base(*on_gpu, 5, 0.02, /*draw_4bit=*/true, Device::kCuda);
  const NamedTensors a = state_dict(*on_cpu), b = state_dict(*on_gpu);
  ASSERT_EQ(a.size(), b.size());
  int compared = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    ASSERT_EQ(b[i].second.device(), Device::kCpu) << b[i].first;
    EXPECT_TRUE(bitwise_equal(a[i].second, b[i].second)) << a[i].first;
    ++compared;
  }
  std::printf("  %d state-dict tensors compared byte for byte\n", compared);
  EXPECT_GT(compared, 3 * 7 * 5);
}

}  // namespace
}  // namespace qshard
