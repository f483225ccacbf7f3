#!/usr/bin/env bash
# Configures and builds qshard into build/ (CUDA backend when nvcc is found, else CPU only).
# Usage: scripts/build.sh [TARGET...] [-DCMAKE_OPTION=... ...]
#   scripts/build.sh           every target (the binary, tests, benchmarks): scripts/test.sh
#   scripts/build.sh qshard    the binary build/qshard alone: scripts/demo.sh
# Arguments starting with '-' go to cmake's configure step, the others are build targets.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
targets=() cmake_args=()
for a in "$@"; do
  case "$a" in
    -*) cmake_args+=("$a") ;;
    *) targets+=(--target "$a") ;;
  esac
done
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cmake_args[@]}"
elif [ ${#cmake_args[@]} -gt 0 ]; then
  cmake -S . -B build "${cmake_args[@]}"
fi
cmake --build build -j "$jobs" "${targets[@]}"
