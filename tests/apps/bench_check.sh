#!/usr/bin/env bash
# qshard bench on the CPU backend (ctest cli_bench_tiny): the tiny preset on 1 rank with kept
# layers, on 2 ranks with the MLP in chunks, and on 1 rank with every second layer input kept in
# (pinned) host memory; the table and the JSON carry tokens/s, the plan as asked and a loss per step.
# Usage: bench_check.sh QSHARD WORK_DIR MPIEXEC [mpiexec flags...]
set -euo pipefail
q=$1 w=$2 mpiexec=$3
shift 3
rm -rf "$w" && mkdir -p "$w"
fail() { echo "FAIL: $*"; exit 1; }
"$q" bench --preset tiny --device cpu --batch 2 --seq 32 --steps 2 --warmup 1 --keep-layers 3 --json "$w/b1.json" | tee "$w/b1.txt"
grep -Eq 'tokens/s +[1-9]' "$w/b1.txt" || fail "no tokens/s in the table"
grep -q 'layers 1-3 of 4 keep their activations' "$w/b1.txt" || fail "plan not printed"
grep -Eq '"keep_layers": 3' "$w/b1.json" || fail "plan not in the JSON"
grep -Eq '"tokens_per_s": [1-9]' "$w/b1.json" || fail "no tokens/s in the JSON"
[ "$(grep -A4 '"losses"' "$w/b1.json" | grep -Ec '^ +[0-9]')" = 3 ] || fail "not 3 losses"
# no profiler on the CPU: no profiled step after the timed ones (--profile-steps' default 1 is CUDA's)
grep -Eq '"profile_steps": 0' "$w/b1.json" || fail "a profiled step on the CPU"
"$mpiexec" "$@" -np 2 "$q" bench --preset tiny --device cpu --seq 32 --steps 2 --warmup 1 --mlp-chunk-tokens 8 \
  --json "$w/b2.json" > "$w/b2.txt"
grep -Eq '"ranks": 2' "$w/b2.json" || fail "np 2: ranks not 2"
grep -Eq '"mlp_chunk_rows": 8' "$w/b2.json" || fail "np 2: MLP chunks not in the plan"
"$q" bench --preset tiny --device cpu --batch 2 --seq 32 --steps 2 --warmup 1 --set memory.checkpoint_every=2 \
  --set memory.host_checkpoints=true --json "$w/b3.json" > "$w/b3.txt"
grep -q 'every second layer input kept' "$w/b3.txt" || fail "every second checkpoint: not in the plan"
grep -Eq '"checkpoint_every": 2' "$w/b3.json" || fail "every second checkpoint: not in the JSON"
grep -Eq '"host_checkpoints": true' "$w/b3.json" || fail "host checkpoints: not in the JSON"
grep -Eq '"checkpoint_slots": 3' "$w/b3.json" || fail "checkpoint slots: not in the JSON"
# --try-plans: 5 of the plan's plans (micro-batches 4, 2, 1, then the base offloaded at 4 and 2) for a GPU budget, each pinned and run; the fastest as measured
# named with the overrides that pin it; every trial ran as listed
"$q" bench --preset tiny --device cpu --batch 4 --micro-batch 0 --seq 32 --steps 1 --warmup 1 --gpu-budget-gb 1 \
  --try-plans 5 --json "$w/b4.json" > "$w/b4.txt"
[ "$(grep -c '"tokens_per_s": [1-9]' "$w/b4.json")" = 5 ] || fail "try-plans: not 5 trials with tokens/s"
[ "$(grep -c '"as_listed": true' "$w/b4.json")" = 5 ] || fail "try-plans: a trial did not run as listed"
grep -Eq '"fastest": [0-4],' "$w/b4.json" || fail "try-plans: no fastest trial"
grep -q 'Pin it with:' "$w/b4.txt" || fail "try-plans: no pins printed"
grep -q 'losses: each plan.s the same' "$w/b4.txt" || fail "try-plans: losses differ between plans of one micro-batch"
grep -Eq '"losses_compared": [1-9]' "$w/b4.json" || fail "try-plans: no two plans of one micro-batch compared"
grep -Eq -- '--set batch.micro_batch_size=[124] --set (memory.base=gpu|offload.params=true)' "$w/b4.txt" || fail "try-plans: pins"
if "$q" bench --preset tiny --device cpu --try-plans 2 > "$w/b5.txt" 2>&1; then fail "try-plans without a budget ran"; fi
grep -q 'needs --gpu-budget-gb' "$w/b5.txt" || fail "try-plans without a budget: not named"
echo "bench ok"
