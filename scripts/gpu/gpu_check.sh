#!/usr/bin/env bash
# One batch on a GPU machine: build with the CUDA backend and run every test (scripts/test.sh),
# make the CUDA golden vectors with real bitsandbytes when it is importable and re-run the golden
# tests against them, then run the benchmarks (qshard and the bitsandbytes peer).
# Last, the export benchmark (bench_export on a Llama-3-8B shape + the transformers peer).
# Results go to $OUT (default build/gpu_out).
# Usage: scripts/gpu/gpu_check.sh [all|export]
#   export: only the export benchmark (builds just bench_export). It takes about 6-9 minutes on an
#   H200 host (the merged bf16 export of 8B alone is ~4-5), so give it a 10-minute command of its
#   own rather than running it after the other steps. EXPORT_FORMATS (default merged,peft,bnb4)
#   picks the formats, e.g. EXPORT_FORMATS=merged then EXPORT_FORMATS=peft,bnb4 in two commands;
#   EXPORT_SHAPE=tiny (default 8b) tries the step in seconds on any machine.
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-all}
case "$mode" in all | export) ;; *) echo "usage: scripts/gpu/gpu_check.sh [all|export]" >&2; exit 2 ;; esac
OUT=${OUT:-build/gpu_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

# bench/export: time and rank-0 peak host memory of export_model() on a Llama-3-8B-shaped model,
# formats one at a time (merged bf16 ~16 GB, peft, bnb4 ~5.7 GB; each folder is deleted before the
# next is written, bnb4 last and kept for the peer), then transformers + bitsandbytes loading that
# bnb4 folder on the GPU and timing save_pretrained. The big folders live under build/ (on disk,
# not a tmpfs) and are deleted at the end. Writes bench_export.json, bench_export_peer.json and
# bench_export.log to $OUT.
export_step() {
  local work=${EXPORT_WORK:-build/bench_export_work}
  rm -rf "$work" "$work.peer_save"
  build/bench/bench_export --shape "${EXPORT_SHAPE:-8b}" --formats "${EXPORT_FORMATS:-merged,peft,bnb4}" \
    --keep-only bnb4 --out "$work" --json "$OUT/bench_export.json" 2>&1 | tee "$OUT/bench_export.log"
  local rc=${PIPESTATUS[0]}
  echo "bench_export exit $rc" | tee -a "$OUT/bench_export.log"
  if [ -d "$work/bnb4" ] && python3 -c "import bitsandbytes" 2>/dev/null; then
    PYTHONUNBUFFERED=1 python3 scripts/bench/bench_export_peer.py "$work/bnb4" --out "$work.peer_save" --device cuda \
      --json "$OUT/bench_export_peer.json" 2>&1 | tee -a "$OUT/bench_export.log"
  fi
  rm -rf "$work" "$work.peer_save"
  return "$rc"
}
if [ "$mode" = export ]; then
  scripts/setup.sh
  [ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  cmake --build build -j "$(nproc)" --target bench_export
  export_step
  exit $?
fi

scripts/test.sh > "$OUT/test.log" 2>&1
echo "test.sh exit $?" | tee -a "$OUT/test.log"
tail -5 "$OUT/test.log"
if python3 -c "import bitsandbytes" 2>/dev/null; then
  python3 scripts/golden/make_quant_golden.py --device cuda --tables none \
    --out tests/data/quant/bnb_golden_cuda.safetensors > "$OUT/golden.log" 2>&1
  cp tests/data/quant/bnb_golden_cuda.safetensors "$OUT/"
  ctest --test-dir build -R Golden --output-on-failure -V >> "$OUT/golden.log" 2>&1
  echo "golden ctest exit $?" | tee -a "$OUT/golden.log"
  grep -E "codes differ|bit-exactly|tests passed|FAILED" "$OUT/golden.log"
  python3 scripts/bench/bench_bnb_dequant.py --json "$OUT/bnb_dequant.json" > "$OUT/bench_bnb.log" 2>&1
fi
build/bench/bench_dequant --json "$OUT/bench_dequant.json" | tee "$OUT/bench.log"
if [ -x build/bench/bench_gather ]; then
  root=""; [ "$(id -u)" = 0 ] && root="--allow-run-as-root"
  mpirun $root -np 1 build/bench/bench_gather --units 8 --json "$OUT/bench_gather.json" | tee -a "$OUT/bench.log"
fi
cat "$OUT/bench_bnb.log" 2>/dev/null
export_step
