// dispatch.h: the one rule by which every layer chooses between a kernel's CPU and CUDA twins.
//
// The twin rule (model/llama_ops.h, quant/blockwise.h, runtime/accumulate.h, optim/adamw.h): each
// kernel is `cpu::name` (the reference: plain loops, written to be read) and `cuda::name` (the
// kernels), with the same name and parameters and a trailing DeviceContext& or stream (cudaStream_t
// as void*; the CPU twin ignores it). Headers declare both unconditionally; the CUDA twins are
// defined only in CUDA builds (the layer's .cu files), which is fine because only the layer's
// dispatch file calls them.
// The dispatch: one `<layer>_dispatch.cpp` per layer (model/llama_ops_dispatch.cpp,
// quant/blockwise_dispatch.cpp, runtime/accumulate_dispatch.cpp, optim/optim_dispatch.cpp) picks the
// twin from where the work runs - the DeviceContext's backend, or the Device of the tensors or
// pointers it is given - with QS_DISPATCH_TWIN below. Code outside the dispatch files calls the
// dispatch, never a cuda:: twin, so it needs no `#if QSHARD_WITH_CUDA`: that test appears only in
// src/runtime/ (this header included) and in the dispatch files.
//
// QS_DISPATCH_TWIN(on_cpu, op, cpu_call, cuda_call): runs `cpu_call` when `on_cpu` is true. Else,
// in a CUDA build, `cuda_call`; in a CPU build (where `cuda_call` is not even compiled, so its
// twin need not exist) throws Error "op <op>: no cuda implementation in this build".
#pragma once

#include <string>

#include "runtime/error.h"

namespace qshard {

// True in a CUDA build: the CUDA twins exist (whether a GPU is visible is cuda_available()'s).
constexpr bool cuda_twins_built() {
#if QSHARD_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// The error of a twin this build does not have: "op <op>: no <backend> implementation in this build".
[[noreturn]] inline void missing_twin(const char* op, const char* backend = "cuda") {
  throw Error(std::string("op ") + op + ": no " + backend + " implementation in this build");
}

}  // namespace qshard

#if QSHARD_WITH_CUDA
#define QS_DISPATCH_TWIN(on_cpu, op, cpu_call, cuda_call) \
  do {                                                     \
    if (on_cpu) {                                          \
      cpu_call;                                            \
    } else {                                               \
      cuda_call;                                           \
    }                                                      \
  } while (0)
#else
#define QS_DISPATCH_TWIN(on_cpu, op, cpu_call, cuda_call) \
  do {                                                     \
    if (!(on_cpu)) ::qshard::missing_twin(op);             \
    cpu_call;                                              \
  } while (0)
#endif
