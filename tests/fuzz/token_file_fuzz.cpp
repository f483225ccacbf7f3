// libFuzzer target for token files (text/token_file.h): the bytes are written to a file, opened,
// validated against a 258-token vocabulary and packed into sequences of 16 read back in full.
// Property: an InputError, or sequences whose ids are all < 258; no crash, nothing else.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "text/data_loader.h"
#include "text/token_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/qshard_token_fuzz_" + std::to_string(::getpid()) + ".tok";
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    if (size) std::fwrite(data, 1, size, f);
    std::fclose(f);
  } else {
    std::abort();
  }
  try {
    const qshard::TokenFile t = qshard::TokenFile::open(path);
    t.validate(258);
    const qshard::PackedDataset d(t, 16);
    std::vector<int32_t> in(16), tg(16);
    for (int64_t i = 0; i < d.num_sequences(); ++i) {
      d.get(i, in.data(), tg.data());
      for (int k = 0; k < 16; ++k)
        if (in[k] < 0 || in[k] >= 258) std::abort();
    }
  } catch (const qshard::InputError&) {
  }
  return 0;
}
