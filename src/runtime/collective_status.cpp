#include "runtime/collective_status.h"

#include <cstdint>

#include "runtime/error.h"
#include "runtime/failure.h"

namespace qshard {

std::string broadcast_string(Communicator& comm, const std::string& value, int root, void* stream) {
  int64_t n = comm.rank() == root ? static_cast<int64_t>(value.size()) : 0;
  comm.broadcast(&n, &n, 1, DType::kI64, root, stream);
  std::string out = comm.rank() == root ? value : std::string(static_cast<size_t>(n), '\0');
  if (n > 0) comm.broadcast(out.data(), out.data(), static_cast<size_t>(n), DType::kU8, root, stream);
  return out;
}

void throw_if_any_failed(Communicator& comm, const std::string& error, void* stream) {
  const int world = comm.size();
  // max over ranks of (world - rank) for failing ranks: the lowest failing rank wins.
  float mine = error.empty() ? 0.0f : static_cast<float>(world - comm.rank()), worst = 0;
  comm.all_reduce(&mine, &worst, 1, DType::kF32, ReduceOp::kMax, stream);
  if (worst == 0) return;
  const int failed = world - static_cast<int>(worst);
  const std::string msg = broadcast_string(comm, error, failed, stream);
  // Every rank throws here, together: run_job ends the job cleanly, the failing rank reporting.
  if (!error.empty()) throw JobInputError(error, comm.rank() == failed);
  throw JobInputError("rank " + std::to_string(failed) + ": " + msg, false);
}

double sum_over_ranks(Communicator& comm, double value) {
  comm.all_reduce(&value, &value, 1, DType::kF64, ReduceOp::kSum, nullptr);
  return value;
}

int64_t sum_over_ranks(Communicator& comm, int64_t value) {
  comm.all_reduce(&value, &value, 1, DType::kI64, ReduceOp::kSum, nullptr);
  return value;
}

}  // namespace qshard
