// cuda_check.h: check macros for CUDA runtime and cuBLAS calls.
//
// Every CUDA / cuBLAS call is wrapped at its call site; a failure throws qshard::Error with the
// rank, file:line, the call's text and the library's own message. Include only from sources
// compiled with the CUDA backend (QSHARD_WITH_CUDA).
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <string>

#include "runtime/error.h"

#define QS_CUDA_CHECK(expr)                                                                    \
  do {                                                                                         \
    cudaError_t qs_err_ = (expr);                                                              \
    if (qs_err_ != cudaSuccess)                                                                \
      ::qshard::throw_library_error("CUDA", #expr,                                             \
                                    std::string(cudaGetErrorName(qs_err_)) + ": " +            \
                                        cudaGetErrorString(qs_err_),                           \
                                    __FILE__, __LINE__);                                       \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the launch site.
#define QS_CUDA_CHECK_LAUNCH() QS_CUDA_CHECK(cudaGetLastError())

// The status's name and number (cublasGetStatusString, e.g. "CUBLAS_STATUS_NOT_SUPPORTED (15)").
#define QS_CUBLAS_CHECK(expr)                                                                  \
  do {                                                                                         \
    cublasStatus_t qs_st_ = (expr);                                                            \
    if (qs_st_ != CUBLAS_STATUS_SUCCESS)                                                       \
      ::qshard::throw_library_error("cuBLAS", #expr,                                           \
                                    std::string(cublasGetStatusString(qs_st_)) + " (" +        \
                                        std::to_string(static_cast<int>(qs_st_)) + ")",        \
                                    __FILE__, __LINE__);                                       \
  } while (0)

#define QS_NCCL_CHECK(expr)                                                                    \
  do {                                                                                         \
    ncclResult_t qs_res_ = (expr);                                                             \
    if (qs_res_ != ncclSuccess && qs_res_ != ncclInProgress)                                   \
      ::qshard::throw_library_error("NCCL", #expr, ncclGetErrorString(qs_res_), __FILE__,     \
                                    __LINE__);                                                 \
  } while (0)
