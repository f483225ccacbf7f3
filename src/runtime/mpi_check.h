// mpi_check.h: check macro for MPI calls.
//
// MPI calls are wrapped at the call site; a failure throws qshard::Error with the rank,
// file:line, the call's text and MPI's error string. The communicators must use
// MPI_ERRORS_RETURN for this to see errors instead of MPI aborting on its own.
#pragma once

#include <mpi.h>

#include <string>

#include "runtime/error.h"

#define QS_MPI_CHECK(expr)                                                                     \
  do {                                                                                         \
    int qs_rc_ = (expr);                                                                       \
    if (qs_rc_ != MPI_SUCCESS) {                                                               \
      char qs_msg_[MPI_MAX_ERROR_STRING];                                                      \
      int qs_len_ = 0;                                                                         \
      MPI_Error_string(qs_rc_, qs_msg_, &qs_len_);                                             \
      ::qshard::throw_library_error("MPI", #expr, std::string(qs_msg_, qs_len_), __FILE__,    \
                                    __LINE__);                                                 \
    }                                                                                          \
  } while (0)
