#!/usr/bin/env bash
# A/B on a GPU machine, which gets a copy of the working tree but not its git history: builds the
# tree with some changes taken back, so that "before" and "after" run in one machine session, on
# one card, alternately (docs/PERFORMANCE.md compares only runs made that way).
#
# On the development machine, write each change to take back as a patch at the repository root:
#   git diff BEFORE AFTER -- src/model/llama_model.cpp > ab_model.patch
# (ab_*.patch at the root are untracked and not ignored, so they travel with the tree). On the GPU
# machine:
#   scripts/gpu/ab_build.sh [TARGET...]     (default targets: qshard bench_attention)
# copies the tree (without build/ and .whl/) to $AB_DIR (default /tmp/ab_before), reverses every
# ab_*.patch there and builds the targets in $AB_DIR/build. Run the "before" binaries from there and
# the "after" ones from build/. Exit status: non-zero when a patch does not reverse or the build fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${AB_DIR:-/tmp/ab_before}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(qshard bench_attention)
shopt -s nullglob
patches=(ab_*.patch)
[ ${#patches[@]} -gt 0 ] || { echo "ab_build.sh: no ab_*.patch at the repository root" >&2; exit 2; }
t0=$SECONDS
rm -rf "$dir" && mkdir -p "$dir"
tar --exclude=./build --exclude=./.whl -cf - . | tar -xf - -C "$dir"
cd "$dir"
for p in "${patches[@]}"; do
  patch -s -R -p1 < "$p" || { echo "ab_build.sh: $p does not reverse on this tree" >&2; exit 1; }
  echo "ab_build.sh: reversed $p"
done
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$dir/ab_configure.log" 2>&1 ||
  { tail -20 "$dir/ab_configure.log"; exit 1; }
args=()
for t in "${targets[@]}"; do args+=(--target "$t"); done
cmake --build build -j "$(nproc)" "${args[@]}" > "$dir/ab_build.log" 2>&1 || { tail -40 "$dir/ab_build.log"; exit 1; }
echo "ab_build.sh: before-build of ${targets[*]} in $dir/build ($((SECONDS - t0)) s)"
