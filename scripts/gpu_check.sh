#!/usr/bin/env bash
# One batch on a GPU machine: build with the CUDA backend and run every test (scripts/test.sh),
# make the CUDA golden vectors with real bitsandbytes when it is importable and re-run the golden
# tests against them, then run the benchmarks (qshard and the bitsandbytes peer).
# Results go to $OUT (default build/gpu_out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
scripts/test.sh > "$OUT/test.log" 2>&1
echo "test.sh exit $?" | tee -a "$OUT/test.log"
tail -5 "$OUT/test.log"
if python3 -c "import bitsandbytes" 2>/dev/null; then
  python3 scripts/make_quant_golden.py --device cuda --tables none \
    --out tests/data/quant/bnb_golden_cuda.safetensors > "$OUT/golden.log" 2>&1
  cp tests/data/quant/bnb_golden_cuda.safetensors "$OUT/"
  ctest --test-dir build -R Golden --output-on-failure -V >> "$OUT/golden.log" 2>&1
  echo "golden ctest exit $?" | tee -a "$OUT/golden.log"
  grep -E "codes differ|bit-exactly|tests passed|FAILED" "$OUT/golden.log"
  python3 scripts/bench_bnb_dequant.py --json "$OUT/bnb_dequant.json" > "$OUT/bench_bnb.log" 2>&1
fi
build/bench/bench_dequant --json "$OUT/bench_dequant.json" | tee "$OUT/bench.log"
if [ -x build/bench/bench_gather ]; then
  root=""; [ "$(id -u)" = 0 ] && root="--allow-run-as-root"
  mpirun $root -np 1 build/bench/bench_gather --units 8 --json "$OUT/bench_gather.json" | tee -a "$OUT/bench.log"
fi
cat "$OUT/bench_bnb.log" 2>/dev/null
