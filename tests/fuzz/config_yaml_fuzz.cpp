// libFuzzer target for the job YAML (train/train_config.h): parse_train_config then validate at
// 1-4 ranks and to_yaml. Property: any byte string gives a TrainConfig or an InputError; nothing
// else (no crash, no other exception, no undefined behaviour under ASan/UBSan).
#include <cstdint>
#include <string>

#include "runtime/error.h"
#include "train/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const qshard::TrainConfig c = qshard::parse_train_config(text, "fuzz.yaml");
    for (int world = 1; world <= 4; ++world) {
      try {
        c.validate(world);
        (void)c.max_steps(1000);
      } catch (const qshard::InputError&) {
      }
    }
    (void)c.to_yaml();
  } catch (const qshard::InputError&) {
  }
  return 0;
}
