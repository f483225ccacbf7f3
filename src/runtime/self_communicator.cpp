#include "runtime/self_communicator.h"

#include <string>

#include "runtime/error.h"
#include "runtime/tensor.h"

namespace qshard {
namespace {

// send -> recv, count elements of dtype, ordered on `stream`; nothing when in place.
void copy(const void* send, void* recv, size_t count, DType dtype, void* stream) {
  if (send == recv || count == 0) return;
  copy_bytes_anywhere_async(recv, send, count * dtype_size(dtype), stream);
}

}  // namespace

void SelfCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) {
  copy(send, recv, count, dtype, stream);
}

void SelfCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp, void* stream) {
  copy(send, recv, count, dtype, stream);  // sum, average or max of one rank's value: the value
}

void SelfCommunicator::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp, void* stream) {
  copy(send, recv, count, dtype, stream);
}

void SelfCommunicator::broadcast(const void* send, void* recv, size_t count, DType dtype, int root, void* stream) {
  if (root != 0) throw Error("self communicator: broadcast from root " + std::to_string(root) + " of a 1-rank job");
  copy(send, recv, count, dtype, stream);
}

}  // namespace qshard
