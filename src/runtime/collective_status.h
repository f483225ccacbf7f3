// collective_status.h: agreeing on success across ranks, so that an error on one rank ends the
// call on every rank (with a message) instead of leaving peers waiting in the next collective.
//
// broadcast_string: `root`'s string to every rank (two broadcasts: length, then bytes).
// throw_if_any_failed: every rank passes its own error ("" = fine). If any rank failed, every
//   rank throws JobInputError (failure.h: run_job then ends the job cleanly with exit code 2, the
//   lowest failing rank printing its message once): a failing rank its own message, the others
//   the message of the lowest failing rank, prefixed "rank k: ". Costs one all_reduce when
//   nobody failed.
// Host-side values only (MPI communicator or a world of one); `stream` as in communicator.h.
// REQUIRES: every rank of `comm` makes the same calls in the same order.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/communicator.h"

namespace qshard {

std::string broadcast_string(Communicator& comm, const std::string& value, int root, void* stream = nullptr);
void throw_if_any_failed(Communicator& comm, const std::string& error, void* stream = nullptr);
// The sum of a host scalar over the ranks, in its own precision (f64 for loss sums and squared
// norms, i64 for token counts): the same bits on every rank.
double sum_over_ranks(Communicator& comm, double value);
int64_t sum_over_ranks(Communicator& comm, int64_t value);

}  // namespace qshard
