// The compute stream tests hand to a ShardedParameterManager (the DeviceContext's role in a job).
#pragma once

#include "runtime/stream.h"

namespace qshard {

inline Stream& qshard_test_compute_stream() {
  static Stream s(stream_names::kCompute);
  return s;
}

}  // namespace qshard
