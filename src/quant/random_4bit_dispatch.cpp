// The dispatch of random_4bit's twins (random_4bit_block.h): the CPU's for host memory, CUDA's for
// device memory (runtime/dispatch.h: a CPU build has no CUDA twins). Beside blockwise_dispatch.cpp,
// the quant layer's other dispatch, so random_4bit keeps to its own files.
#include "quant/random_4bit.h"
#include "quant/random_4bit_block.h"
#include "runtime/dispatch.h"

namespace qshard {

namespace quant {
void random_4bit_blocks(Device on, const Random4bitArgs& args, int64_t first_block, int64_t count, uint8_t* packed,
                        float* absmax, void* stream) {
  QS_DISPATCH_TWIN(on == Device::kCpu, "random_4bit_blocks",
                   cpu::random_4bit_blocks(args, first_block, count, packed, absmax, stream),
                   cuda::random_4bit_blocks(args, first_block, count, packed, absmax, stream));
}
}  // namespace quant

void random_4bit_to_host(std::span<const Random4bitJob> jobs, Device draw_on, int threads) {
  QS_DISPATCH_TWIN(draw_on == Device::kCpu, "random_4bit_to_host", cpu::random_4bit_to_host(jobs, threads),
                   cuda::random_4bit_to_host(jobs, threads));
}

}  // namespace qshard
