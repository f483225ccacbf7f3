#!/usr/bin/env bash
# The performance runs of docs/PERFORMANCE.md on a GPU machine: qshard bench and its peer
# (scripts/bench/bench_peer.py: transformers + PEFT + bitsandbytes) in the same call; results under $OUT
# (default build/bench_out) as JSON lines and logs. Stages:
#   build      scripts/setup.sh + a Ninja build in build/ (BUILD_TARGETS: only those targets)
#   validate   ctest -L cuda (every CUDA kernel against its CPU reference, the CUDA trainer tests)
#   q8b        qshard bench, Llama-3.1-8B shape, LoRA r 16 on all seven projections, seq 2048:
#              full recompute and every layer kept at 4 x 2048, then the memory plan at the
#              budgets the peer reaches (10, 20, 27, 90 GB) -> q8b.jsonl
#   peer       bench_peer.py at the shapes of the issue's table (checkpointing on / off) -> peer.jsonl
#   long       the longest 8B sequences at batch 1 (LONG_SEQS, default "131072 262144"), one timed
#              step each -> long.jsonl (no profiled step unless LONG_PROFILE=1); PEER_LONG_SEQS for the
#              peer (default none)
#   b70        the Llama-3.1-70B shape at 1 x 2048: base offloaded to pinned host memory, then
#              resident on the GPU (B70_RUNS: other modes, batches, flags) -> b70.jsonl
#   plan8b     the 8B shape at 8 sequences a step under budgets (PLAN_BUDGETS), the plan choosing the
#              micro-batch, offload and kept layers -> plan8b.jsonl
#   unsloth    the Unsloth peer (bench_peer.py --peer unsloth), one process, one model load, the points
#              UNSLOTH_POINTS (default "1x2048,2x2048,4x2048,8x2048") of preset UNSLOTH_PRESET (default
#              8b), checkpointing "unsloth" (UNSLOTH_ARGS=--no-checkpointing for off) -> unsloth.jsonl.
#              Needs .whl/peer/site (scripts/bench/fetch_peer_wheels.sh), copied to /tmp/site-peer.
#              The random model is saved once to /tmp/qshard-unsloth-PRESET and reused while the
#              machine stays warm. UNSLOTH_TIMEOUT (default 540 s) bounds the whole stage.
#   unsloth_smoke  the same on the tiny preset, 1x256 and 2x256, 1 timed step -> unsloth_smoke.jsonl
# GPU lanes: GPU=<index> pins a stage to one GPU (CUDA_VISIBLE_DEVICES); run two stages at once on a
# two-GPU machine with `GPU=0 scripts/gpu/gpu_bench.sh q8b & GPU=1 scripts/gpu/gpu_bench.sh peer`.
# The bitsandbytes wheel is installed from .whl/ into /tmp/site when it is there; without one, the
# peer stage takes bitsandbytes (only) from .whl/peer/site.
# Usage: scripts/gpu/gpu_bench.sh stage...
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/bench_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -n "${GPU:-}" ] && export CUDA_VISIBLE_DEVICES=$GPU
Q=${QSHARD:-build/qshard}  # QSHARD: another binary (a prebuilt one carried in)
LOGS=build/bench_logs  # per-run logs stay on the machine: $OUT holds few files (JSON lines, summaries)
mkdir -p "$LOGS"
STEPS=${STEPS:-4}
WARMUP=${WARMUP:-2}

qbench() {  # out.jsonl label args...: one qshard bench run, its JSON appended with a label
  local out=$1 label=$2
  shift 2
  local j="$LOGS/$label.json"
  rm -f "$j"
  timeout "${RUN_TIMEOUT:-400}" $Q bench --device cuda --json "$j" "$@" > "$LOGS/$label.log" 2>&1
  local rc=$?
  echo "== qshard $label ($*): exit $rc"
  grep -E "^memory plan|model build|tokens/s|launch to first|MFU|peak GPU|peak pinned|^  step  |    [a-zA-Z]" "$LOGS/$label.log" | sed 's/^/   /'
  [ $rc = 0 ] || grep -v "^step " "$LOGS/$label.log" | tail -6
  if [ -f "$j" ]; then
    python3 -c "import json,sys; d=json.load(open('$j')); d['label']='$label'; d['exit']=$rc; print(json.dumps(d))" >> "$out"
  else
    echo "{\"label\": \"$label\", \"exit\": $rc, \"args\": \"$*\"}" >> "$out"
  fi
}

peer_site() {  # the Unsloth peer's packages (fetch_peer_wheels.sh) into /tmp/site-peer, on PYTHONPATH
  if [ ! -d /tmp/site-peer/unsloth ]; then
    if [ -d .whl/peer/site ]; then
      rm -rf /tmp/site-peer && cp -a .whl/peer/site /tmp/site-peer
    elif ls .whl/peer/*.whl > /dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-peer \
        .whl/peer/*.whl
    else
      echo "no .whl/peer: run scripts/bench/fetch_peer_wheels.sh on the development machine and carry .whl"
      return 1
    fi
  fi
  export PYTHONPATH=/tmp/site-peer${PYTHONPATH:+:$PYTHONPATH}
}

ubench() {  # out.jsonl label args...: one Unsloth peer process (several points on one model load)
  local out=$1 label=$2
  shift 2
  peer_site || return 1
  local t0=$SECONDS
  PYTHONUNBUFFERED=1 timeout "${UNSLOTH_TIMEOUT:-540}" python3 scripts/bench/bench_peer.py --peer unsloth \
    --jsonl "$out" "$@" > "$LOGS/unsloth_$label.log" 2>&1
  local rc=$?
  echo "== unsloth $label ($*): exit $rc, $((SECONDS - t0)) s"
  grep -v '^{' "$LOGS/unsloth_$label.log" | grep -v -i "warn" | tail -${UNSLOTH_TAIL:-15} | cut -c1-300 | sed 's/^/   /'
  grep '^{' "$LOGS/unsloth_$label.log" | python3 -c "
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    if d.get('oom') or 'error' in d:
        print('   %sx%s: oom=%s %s' % (d.get('batch'), d.get('seq'), d.get('oom'), d.get('error', '')[:200]))
    else:
        print('   %sx%s: %.0f tokens/s, peak allocated %.2f GiB, reserved %.2f GiB, in use %.2f GiB, losses %s' % (
            d['batch'], d['seq'], d['tokens_per_s'], d['peak_allocated_bytes'] / 2**30,
            d['peak_reserved_bytes'] / 2**30, d['device_in_use_bytes'] / 2**30, d['losses'][-2:]))
"
}

pbench() {  # label args...: one peer run
  local label=$1
  shift
  timeout "${RUN_TIMEOUT:-400}" python3 scripts/bench/bench_peer.py --jsonl "$OUT/peer.jsonl" --steps "$STEPS" \
    --warmup "$WARMUP" "$@" > "$LOGS/peer_$label.log" 2>&1
  echo "== peer $label ($*): exit $? $(tail -1 "$LOGS/peer_$label.log" | cut -c1-600)"
}

for stage in "$@"; do
  case "$stage" in
    build)
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      scripts/setup.sh > "$LOGS/build.log" 2>&1
      [ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >> "$LOGS/build.log" 2>&1
      cmake --build build -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} >> "$LOGS/build.log" 2>&1
      rc=$?; echo "build exit $rc"; [ $rc = 0 ] || { tail -30 "$LOGS/build.log"; exit 1; }
      ;;
    validate)
      timeout "${VALIDATE_TIMEOUT:-300}" ctest --test-dir build -L cuda --output-on-failure -j 4 --timeout 300 > "$OUT/validate.log" 2>&1
      echo "ctest -L cuda exit $?"; grep -E "tests passed|\(Failed\)|Timeout|Test +#" "$OUT/validate.log" | tail -40
      ;;
    q8b)
      f="$OUT/q8b.jsonl"
      qbench "$f" 8b_4x2048_recompute --preset 8b --batch 4 --keep-layers 0 --steps "$STEPS" --warmup "$WARMUP"
      qbench "$f" 8b_4x2048_keepall --preset 8b --batch 4 --keep-layers 32 --steps "$STEPS" --warmup "$WARMUP"
      qbench "$f" 8b_budget10 --preset 8b --batch 1 --gpu-budget-gb 10 --steps "$STEPS" --warmup "$WARMUP"
      qbench "$f" 8b_budget20 --preset 8b --batch 4 --gpu-budget-gb 20 --steps "$STEPS" --warmup "$WARMUP"
      qbench "$f" 8b_budget27 --preset 8b --batch 4 --gpu-budget-gb 27 --steps "$STEPS" --warmup "$WARMUP"
      qbench "$f" 8b_budget90_b8 --preset 8b --batch 8 --gpu-budget-gb 90 --steps "$STEPS" --warmup "$WARMUP"
      qbench "$f" 8b_1x8192 --preset 8b --batch 1 --seq 8192 --gpu-budget-gb 20 --steps "$STEPS" --warmup "$WARMUP"
      ;;
    q8b_more)  # the rest of the budgets, and the 10 GB budget with only the base offloaded
      f="$OUT/q8b.jsonl"
      qbench "$f" 8b_budget27 --preset 8b --batch 4 --gpu-budget-gb 27 --steps "$STEPS" --warmup "$WARMUP"
      qbench "$f" 8b_budget90_b8 --preset 8b --batch 8 --gpu-budget-gb 90 --steps "$STEPS" --warmup "$WARMUP"
      qbench "$f" 8b_1x2048_offload_params --preset 8b --batch 1 --set offload.params=true --gpu-budget-gb 10 \
        --steps "$STEPS" --warmup "$WARMUP"
      ;;
    peer)
      if ls .whl/*.whl > /dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
          && export PYTHONPATH=/tmp/site
      elif [ -d .whl/peer/site/bitsandbytes ]; then  # bitsandbytes alone from the Unsloth peer's tree
        mkdir -p /tmp/site-bnb && cp -a .whl/peer/site/bitsandbytes .whl/peer/site/bitsandbytes-*.dist-info /tmp/site-bnb/ \
          && export PYTHONPATH=/tmp/site-bnb
      fi
      # PEER_RUNS: batch x seq : ckpt | nockpt (default: the issue's table)
      for r in ${PEER_RUNS:-1x2048:ckpt 4x2048:ckpt 8x2048:ckpt 1x8192:ckpt 1x2048:nockpt 4x2048:nockpt}; do
        bs=${r%%:*}; mode=${r##*:}; b=${bs%%x*}; sq=${bs##*x}
        pbench "8b_${bs}_$mode" --preset 8b --batch "$b" --seq "$sq" $([ "$mode" = nockpt ] && echo --no-checkpointing)
      done
      for s in ${PEER_LONG_SEQS:-}; do
        STEPS=1 WARMUP=1 pbench "8b_1x${s}_ckpt" --preset 8b --batch 1 --seq "$s"
      done
      ;;
    long)
      for s in ${LONG_SEQS:-131072 262144}; do
        qbench "$OUT/long.jsonl" "8b_1x$s" --preset 8b --batch 1 --seq "$s" --steps 1 --warmup "${LONG_WARMUP:-0}" --profile-steps "${LONG_PROFILE:-0}"
      done
      ;;
    b70)  # B70_RUNS: mode:batch[:extra bench flags, comma-separated], mode offload | resident
      for r in ${B70_RUNS:-offload:1 resident:1}; do
        mode=${r%%:*}; rest=${r#*:}; b=${rest%%:*}; extra=""
        [ "$rest" != "$b" ] && extra=$(echo "${rest#*:}" | tr ',' ' ')
        qbench "$OUT/b70.jsonl" "70b_${mode}_b$b" --preset 70b --batch "$b" $([ "$mode" = offload ] && echo --offload) \
          --steps "${STEPS70:-3}" --warmup 1 $extra
      done
      ;;
    plan8b)  # the memory plan's choice at each budget (PLAN_BUDGETS GB): 8 sequences a step, the micro-batch,
             # offload and kept layers left to the plan -> plan8b.jsonl
      for g in ${PLAN_BUDGETS:-6 8 10 15 20 40}; do
        qbench "$OUT/plan8b.jsonl" "8b_plan_${g}gb" --preset 8b --batch "${PLAN_BATCH:-8}" --micro-batch 0 \
          --gpu-budget-gb "$g" --steps "$STEPS" --warmup "$WARMUP"
      done
      ;;
    unsloth)
      ubench "$OUT/unsloth.jsonl" "${UNSLOTH_PRESET:-8b}" --preset "${UNSLOTH_PRESET:-8b}" \
        --points "${UNSLOTH_POINTS:-1x2048,2x2048,4x2048,8x2048}" --steps "$STEPS" --warmup "$WARMUP" ${UNSLOTH_ARGS:-}
      ;;
    unsloth_smoke)
      ubench "$OUT/unsloth_smoke.jsonl" smoke_tiny --preset tiny --points 1x256,2x256 --steps 1 --warmup 1
      ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
