// error.h: the exception types of qshard and the check helpers used at every call site.
//
// What: `Error` is any failure (a library call, a broken invariant); `InputError` is a failure
// caused by the user's input (a config, a file, a shape) and its message names the file, key or
// value and what was expected. Both carry the process rank (set once by the World; -1 before)
// and the source file:line of the check that fired.
// The CUDA / cuBLAS / NCCL / MPI check macros live in their own headers (cuda_check.h,
// mpi_check.h) so that this header stays free of those libraries.
// Thread safety: throwing is thread safe; set_error_rank() is called once at start-up.
#pragma once

#include <stdexcept>
#include <string>

namespace qshard {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Raised for bad user input. The message already names the offending file/key/value.
class InputError : public Error {
 public:
  explicit InputError(const std::string& what) : Error(what) {}
};

// Rank used to prefix error messages and log lines (-1: not yet known).
void set_error_rank(int rank);
int error_rank();

// Builds "[rank R] file:line: message" and throws Error.
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
// Throws for a failing library call: "[rank R] file:line: LIB call `expr` failed: detail".
[[noreturn]] void throw_library_error(const char* lib, const char* expr, const std::string& detail,
                                      const char* file, int line);

}  // namespace qshard

// Internal invariant: throws qshard::Error with file:line when `cond` is false.
#define QS_CHECK(cond, msg)                                                        \
  do {                                                                             \
    if (!(cond)) ::qshard::throw_error(__FILE__, __LINE__, std::string("check `" #cond "` failed: ") + (msg)); \
  } while (0)
