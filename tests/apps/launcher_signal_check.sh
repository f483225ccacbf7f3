#!/usr/bin/env bash
# scripts/launch/single_node.sh turns a SIGTERM it receives into exit status 143 (128 + 15), as
# docs/LAUNCH.md says: the signal goes to mpirun, the ranks log it and abort the job, the launcher
# reports 128 + signal (mpirun alone would exit 1). Bounded: the job must end within 60 s.
# Usage: launcher_signal_check.sh QSHARD SOURCE_DIR WORK_DIR
set -uo pipefail
qshard=$1 src=$2 work=$3
if [ "$(readlink -f "$qshard")" != "$(readlink -f "$src/build/qshard")" ]; then
  echo "skipped: the launcher runs build/qshard, this build is elsewhere ($qshard)"; exit 0
fi
rm -rf "$work" && mkdir -p "$work"
"$qshard" tokenize "$src"/data/*.txt --out "$work/t.tok" > /dev/null
cd "$src"
scripts/launch/single_node.sh 2 train --config configs/tiny.yaml --set device=cpu --set data.train="$work/t.tok" \
  --set checkpoint.dir=none --set logging.metrics_jsonl= --set logging.every_steps=1 > "$work/log" 2>&1 &
pid=$!
for _ in $(seq 120); do grep -q "trainable LoRA parameters" "$work/log" && break; sleep 0.5; done
sleep 2  # into the training loop
grep -q "trainable LoRA parameters" "$work/log" || { echo "the job did not start"; cat "$work/log"; kill -9 $pid; exit 1; }
kill -TERM $pid
for _ in $(seq 120); do kill -0 $pid 2>/dev/null || break; sleep 0.5; done
if kill -0 $pid 2>/dev/null; then echo "the job did not end within 60 s of SIGTERM"; kill -9 $pid; exit 1; fi
wait $pid; rc=$?
grep -m1 "received SIGTERM" "$work/log"
[ "$rc" = 143 ] || { echo "exit status $rc, expected 143"; tail -5 "$work/log"; exit 1; }
echo "launcher: SIGTERM -> exit 143: ok"
