# Helpers for tests that run under mpirun (included by the test folders that need them).
#
# qshard_add_mpi_test_binary(TARGET SOURCES... LIBS...)
#   A gtest executable whose main (tests/mpi/gtest_mpi_main.cpp) starts the World, runs the tests
#   on every rank, and exits non-zero on every rank when any rank failed.
# qshard_add_mpi_run(NAME TARGET NP n [ARGS ...] [LABELS ...] [TIMEOUT s])
#   Registers `NAME` = mpirun -np n <flags> $<TARGET_FILE:TARGET> ARGS. NP 0 registers the binary
#   without mpirun (an MPI singleton). PROCESSORS is set to n so `ctest -j` does not pile ranks up.
# QSHARD_MPIEXEC_PREFLAGS: flags placed before the program. With Open MPI they default to
#   --oversubscribe (more ranks than cores on CI), --bind-to none (oversubscribed ranks must not
#   share a pinned core) and --allow-run-as-root (containers and CI run tests as root).
include_guard(GLOBAL)

if(NOT DEFINED QSHARD_MPIEXEC_PREFLAGS)
  set(_qs_flags "")
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _qs_mpi_version ERROR_QUIET)
  if(_qs_mpi_version MATCHES "Open MPI|OpenRTE")
    set(_qs_flags --oversubscribe --bind-to none --allow-run-as-root)
  endif()
  set(QSHARD_MPIEXEC_PREFLAGS "${_qs_flags}" CACHE STRING "mpiexec flags for the MPI tests")
endif()

function(qshard_add_mpi_test_binary target)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${target} ${T_SOURCES} ${PROJECT_SOURCE_DIR}/tests/mpi/gtest_mpi_main.cpp)
  target_link_libraries(${target} PRIVATE ${T_LIBS} GTest::gtest)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${target} PRIVATE QSHARD_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
endfunction()

function(qshard_mpi_command out_var np)
  if(np EQUAL 0)
    set(${out_var} "" PARENT_SCOPE)
  else()
    set(${out_var} ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${QSHARD_MPIEXEC_PREFLAGS}
        ${MPIEXEC_PREFLAGS} PARENT_SCOPE)
  endif()
endfunction()

function(qshard_add_mpi_run name)
  cmake_parse_arguments(T "" "TARGET;NP;TIMEOUT" "ARGS;LABELS;ENVIRONMENT" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  qshard_mpi_command(launcher ${T_NP})
  add_test(NAME ${name} COMMAND ${launcher} $<TARGET_FILE:${T_TARGET}> ${MPIEXEC_POSTFLAGS} ${T_ARGS})
  set(procs ${T_NP})
  if(procs EQUAL 0)
    set(procs 1)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} PROCESSORS ${procs}
                                          LABELS "mpi;${T_LABELS}")
  if(T_ENVIRONMENT)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${T_ENVIRONMENT}")
  endif()
endfunction()
