// DeviceContext: the device choice in one place, and the workspace arena every op's scratch
// comes from.
#include <gtest/gtest.h>

#include "runtime/device_context.h"
#include "runtime/error.h"

namespace qshard {
namespace {

TEST(DeviceContext, ChoiceAutoCpuCuda) {
  EXPECT_EQ(parse_device_choice("auto"), DeviceChoice::kAuto);
  EXPECT_EQ(parse_device_choice("cuda"), DeviceChoice::kCuda);
  EXPECT_FALSE(parse_device_choice("gpu").has_value());
  // No GPU for this rank: auto is the CPU, cuda is an error naming the setting.
  auto a = make_device_context(DeviceChoice::kAuto, -1, "job.yaml: device");
  EXPECT_EQ(a->backend(), Backend::kCpu);
  EXPECT_EQ(a->activation_dtype(), DType::kF32);
  EXPECT_EQ(a->compute_device(), Device::kCpu);
  EXPECT_EQ(a->describe(), "cpu");
  EXPECT_FALSE(a->memory_in_use().has_value()) << "the CPU backend has no device memory to measure";
  try {
    make_device_context(DeviceChoice::kCuda, -1, "job.yaml: device");
    FAIL() << "cuda without a GPU must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("job.yaml: device"), std::string::npos) << e.what();
  }
  EXPECT_EQ(make_device_context(DeviceChoice::kCpu, 0, "x")->backend(), Backend::kCpu) << "cpu even with a GPU";
}

TEST(Workspace, TakesAlignedPiecesRewindsAndRefusesOverflow) {
  DeviceContext ctx(Backend::kCpu, -1);
  Workspace& ws = ctx.workspace();
  ws.reserve(4096);
  EXPECT_GE(ws.capacity(), 4096u);
  auto* a = static_cast<uint8_t*>(ws.take(10));
  auto* b = static_cast<uint8_t*>(ws.take(100));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % Workspace::kAlign, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % Workspace::kAlign, 0u);
  EXPECT_EQ(b - a, static_cast<ptrdiff_t>(Workspace::kAlign));
  const size_t mark = ws.used();
  ws.take(300);
  ws.rewind(mark);
  EXPECT_EQ(ws.used(), mark);
  EXPECT_EQ(static_cast<uint8_t*>(ws.take(1)) - a, static_cast<ptrdiff_t>(2 * Workspace::kAlign));
  try {
    ws.take(1 << 20, "LM-head logits chunk");
    FAIL() << "past the capacity";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LM-head logits chunk"), std::string::npos) << e.what();
  }
  EXPECT_GE(ws.high_water(), mark);
  ws.reset();
  EXPECT_EQ(ws.used(), 0u);
  EXPECT_EQ(ws.take(1), a) << "reset gives every piece back";
}

}  // namespace
}  // namespace qshard
