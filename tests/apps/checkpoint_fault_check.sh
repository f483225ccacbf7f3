#!/usr/bin/env bash
# Checkpoint faults and `qshard export CKPT`, run as a user would (CPU backend, mpirun -np 2):
#  1. a rank killed while saving step 8 (QSHARD_TEST_KILL_DURING_SAVE=1:8): the job fails (no
#     hang), step-00000004 stays complete, step-00000008.partial has no metadata.json and is
#     refused by name; `export` and `--resume auto` take step 4; the resumed run finishes, its
#     next save removes the partial folder, and metrics.jsonl holds each step once;
#  2. `qshard export` of the final checkpoint under mpirun -np 1, 2 and 3: byte-identical folders
#     (merged and peft);
#  3. a corrupted (one flipped byte) and a truncated rank file are refused naming the file, and
#     no output folder is left;
#     metadata.json's optimizer.type, rng.kind, optimizer.step, a tensor offset or the data
#     position changed: the resume is refused naming the file and the field;
#  4. an unwritable checkpoint.dir (below a regular file) fails before training with a message;
#     a missing --resume path is named.
# Usage: checkpoint_fault_check.sh QSHARD SOURCE_DIR WORK_DIR MPIEXEC [mpiexec flags...]
set -euo pipefail
qshard=$1 src=$2 work=$3
shift 3
mpi=("$@")
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
expect_fail() {  # expect_fail NEEDLE CMD...: CMD must fail and print NEEDLE
  local needle=$1 out
  shift
  if out=$("$@" 2>&1); then echo "$out" | tail -5; fail "expected a failure: $*"; fi
  echo "$out" | grep -q -- "$needle" || { echo "$out" | tail -8; fail "the message lacks '$needle'"; }
  echo "refused as expected: $(echo "$out" | grep -m1 -- "$needle" | cut -c1-220)"
}
"$qshard" tokenize "$src"/data/*.txt --out "$work/t.tok" > /dev/null
args=(train --config "$src/configs/tiny.yaml" --set device=cpu --set data.train="$work/t.tok" --set steps=12 --set data.max_seq_len=32
      --set logging.every_steps=4 --set checkpoint.every_steps=4 --set checkpoint.dir="$work/ck"
      --set logging.metrics_jsonl="$work/metrics.jsonl")

# 1. a rank killed during a save
expect_fail "" env QSHARD_TEST_KILL_DURING_SAVE=1:8 "${mpi[@]}" -np 2 "$qshard" "${args[@]}"
[ -f "$work/ck/step-00000004/metadata.json" ] || fail "step 4 is not complete"
[ -d "$work/ck/step-00000008.partial" ] || fail "no partial folder of step 8"
[ ! -e "$work/ck/step-00000008.partial/metadata.json" ] || fail "the partial folder has metadata.json"
[ ! -e "$work/ck/step-00000008" ] || fail "step 8 looks complete"
expect_fail "incomplete" "$qshard" export "$work/ck/step-00000008.partial" --format peft --out "$work/never"
[ ! -e "$work/never" ] || fail "a refused export left $work/never"
"$qshard" export "$work/ck" --format peft --out "$work/p4" 2>&1 | grep -E "step-00000004 \(step 4" \
  || fail "export of the checkpoint root did not take step 4"
out=$("${mpi[@]}" -np 2 "$qshard" "${args[@]}" --resume auto 2>&1) || { echo "$out" | tail; fail "resume failed"; }
echo "$out" | grep -E "resumed from .*step-00000004 \(step 4" || fail "did not resume from step 4"
echo "$out" | grep -E "^trained 12 steps" || fail "the resumed run did not finish"
[ ! -e "$work/ck/step-00000008.partial" ] || fail "the stale partial folder is still there"
[ -f "$work/ck/step-00000012/metadata.json" ] || fail "no final checkpoint"
# the metrics file holds every logged step once (the killed run's step-8 line was dropped)
steps=$(grep -o '"step": *[0-9]*' "$work/metrics.jsonl" | tr -dc '0-9\n' | tr '\n' ' ')
[ "$steps" = "1 4 8 12 " ] || fail "metrics.jsonl steps are '$steps', expected '1 4 8 12 '"

# 2. exports are byte-identical at 1, 2 and 3 ranks
for np in 1 2 3; do
  "${mpi[@]}" -np $np "$qshard" export "$work/ck" --format merged --out "$work/m$np" > /dev/null 2>&1 || fail "export np $np"
  "${mpi[@]}" -np $np "$qshard" export "$work/ck" --format peft --out "$work/a$np" > /dev/null 2>&1 || fail "peft np $np"
done
for np in 2 3; do
  diff -r "$work/m1" "$work/m$np" > /dev/null || fail "merged export at np $np differs from np 1"
  diff -r "$work/a1" "$work/a$np" > /dev/null || fail "peft export at np $np differs from np 1"
done
echo "exports at np 1, 2, 3: byte-identical"
"$qshard" inspect --check --quiet "$work/m1" | tail -1

# 3. corrupted and truncated checkpoints
cp -r "$work/ck" "$work/bad"
f="$work/bad/step-00000012/rank-00001-of-00002.safetensors"
size=$(stat -c %s "$f")
printf '\x5a' | dd of="$f" bs=1 seek=$((size - 7)) conv=notrunc status=none
expect_fail "rank-00001-of-00002.safetensors: CRC-32" "$qshard" export "$work/bad" --format peft --out "$work/never"
truncate -s -100 "$f"
expect_fail "truncated" "${mpi[@]}" -np 2 "$qshard" export "$work/bad" --format bnb4 --out "$work/never"
[ ! -e "$work/never" ] || fail "a refused export left $work/never"

# 3b. metadata.json fields the resume used to ignore, changed (the tensors' CRCs still match):
# each refused naming the file and the field, before a step runs and without writing a checkpoint.
tamper() {  # tamper NAME PYTHON-EXPR-ON-m NEEDLE
  rm -rf "$work/t_$1" && mkdir -p "$work/t_$1" && cp -r "$work/ck/step-00000008" "$work/t_$1/"
  python3 - "$work/t_$1/step-00000008/metadata.json" "$2" <<'PY'
import json, sys
p = sys.argv[1]
m = json.load(open(p))
exec(sys.argv[2])
json.dump(m, open(p, "w"), indent=1)
PY
  expect_fail "$3" "$qshard" "${args[@]}" --set checkpoint.dir="$work/t_$1" --set logging.metrics_jsonl= --resume auto
  [ "$(ls "$work/t_$1")" = "step-00000008" ] || fail "the refused resume ($1) wrote into $work/t_$1: $(ls "$work/t_$1")"
}
tamper optimizer_type 'm["trainer"]["optimizer"]["type"] = "sgd"' "trainer.optimizer.type is 'sgd', this job's optimizer is 'adamw'"
tamper rng_kind 'm["trainer"]["rng"]["kind"] = "philox"' "trainer.rng.kind is 'philox'"
tamper optimizer_step 'm["trainer"]["optimizer"]["step"] = 4' "trainer.optimizer.step is 4, expected 8"
tamper offset 'm["units"][1]["tensors"][1]["offset"] += 4' "offset .* differs from this model's"
tamper data_step 'm["trainer"]["data"]["step"] = 3' "trainer.data is at batch 3 .*expected the start of batch 8"

# 4. bad destinations and paths
echo x > "$work/a_file"
expect_fail "cannot create" "${mpi[@]}" -np 2 "$qshard" train --config "$src/configs/tiny.yaml" \
  --set data.train="$work/t.tok" --set steps=2 --set schedule.warmup_steps=0 --set data.max_seq_len=32 \
  --set checkpoint.dir="$work/a_file/ck"
expect_fail "no_such_ckpt: no such" "$qshard" export "$work/no_such_ckpt" --format peft --out "$work/never"
# 5. the test hooks read strictly (issue 25): a value that could never fire is refused by name
expect_fail "QSHARD_TEST_KILL_DURING_SAVE='1-8': expected RANK:STEP" env QSHARD_TEST_KILL_DURING_SAVE=1-8 \
  "$qshard" train --config "$src/configs/tiny.yaml" --set device=cpu --set data.train="$work/t.tok" --set steps=2 \
  --set schedule.warmup_steps=0 --set data.max_seq_len=32 --set checkpoint.every_steps=1 --set checkpoint.dir="$work/hook"
expect_fail "QSHARD_TEST_KILL_DURING_EXPORT='bnb-4': expected bnb4, peft or merged" env QSHARD_TEST_KILL_DURING_EXPORT=bnb-4 \
  "$qshard" export "$work/ck" --format peft --out "$work/never"
[ ! -e "$work/never" ] || fail "the refused export wrote $work/never"
echo "checkpoint faults: ok"
