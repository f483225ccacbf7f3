#!/usr/bin/env bash
# Installs what is missing, builds and runs every test (CTest). Non-zero on any failure.
# GPU tests (label `cuda`) run on a machine with a GPU and skip themselves elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "test.sh: setup done at ${SECONDS}s"
scripts/build.sh
echo "test.sh: build done at ${SECONDS}s"
jobs=$(nproc 2>/dev/null || echo 2)
ctest --test-dir build --output-on-failure -j "$jobs"
echo "test.sh: tests done at ${SECONDS}s"
