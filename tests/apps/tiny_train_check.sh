#!/usr/bin/env bash
# CI run of the embedded default (configs/tiny.yaml), shortened: tokenize the shipped text, train
# 30 steps with sequences of 64 tokens on 2 ranks (CPU backend), and require the final training
# loss to be at least MARGIN below the first (measured: 5.58 -> ~5.0 in 30 steps); then check
# the exported 4-bit base and PEFT adapter; a bad job value must end both ranks with exit 2.
# Usage: tiny_train_check.sh QSHARD SOURCE_DIR WORK_DIR MPIEXEC [mpiexec flags...]
set -euo pipefail
qshard=$1 src=$2 work=$3
shift 3
margin=0.3
rm -rf "$work" && mkdir -p "$work"
"$qshard" tokenize "$src"/data/*.txt --out "$work/tiny.tok"
out=$("$@" -np 2 "$qshard" train --config "$src/configs/tiny.yaml" --set device=cpu --set data.train="$work/tiny.tok" \
  --set steps=30 --set data.max_seq_len=64 --set logging.every_steps=10 --set logging.eval_every_steps=0 \
  --set logging.metrics_jsonl="$work/metrics.jsonl" --set checkpoint.dir="$work/ckpt" 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep -E "step|trained"
line=$(echo "$out" | grep -E "^trained [0-9]+ steps: loss" || true)
[ -n "$line" ] || { echo "no 'trained ... loss A -> B' line"; exit 1; }
first=$(echo "$line" | sed -E 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\1/')
last=$(echo "$line" | sed -E 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\2/')
[ "$(wc -l < "$work/metrics.jsonl")" -ge 3 ] || { echo "metrics.jsonl has too few lines"; exit 1; }
# The end-of-training exports: the 4-bit base resolves and the adapter loads onto it.
"$qshard" inspect --check --quiet "$work/ckpt/final/base_bnb4"
head -c 1000 "$src"/data/persuasion_vol1.txt > "$work/sample.txt"
"$qshard" tokenize "$work/sample.txt" --out "$work/sample.tok" > /dev/null
"$qshard" eval --model "$work/ckpt/final/base_bnb4" --adapter "$work/ckpt/final/adapter" --data "$work/sample.tok" \
  --seq-len 64 | grep -E "^eval: "
if awk -v f="$first" -v l="$last" -v m="$margin" 'BEGIN { exit !(l < f - m) }'; then
  echo "loss fell from $first to $last (margin $margin): ok"
else
  echo "loss $first -> $last did not fall by $margin"
  exit 1
fi

# A bad value in the job ends every rank with exit code 2 and a message naming the key.
set +e
bad=$("$@" -np 2 "$qshard" train --config "$src/configs/tiny.yaml" --set device=cpu --set data.train="$work/tiny.tok" \
  --set steps=3 --set schedule.warmup_steps=10 --set checkpoint.dir=none 2>&1)
rc=$?
set -e
echo "$bad" | grep -q "qshard: error: .*schedule.warmup_steps = 10" || { echo "$bad"; echo "no 'qshard: error:' naming the key"; exit 1; }
[ "$rc" = 2 ] || { echo "$bad" | tail -5; echo "bad config: exit $rc, expected 2"; exit 1; }
echo "bad config: exit 2, key named: ok"
