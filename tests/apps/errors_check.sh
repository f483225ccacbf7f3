#!/usr/bin/env bash
# Errors as one clear line (issue 26). Under `mpirun -np 2`, a bad job value and a missing input
# file are each reported once (by rank 0: one "qshard: error:" line naming the key), with exit
# code 2, no config dump, no MPI_Abort banner ("fatal", "MPI_ABORT"), and - with mpirun -q, as
# scripts/launch/ runs it - as the last line printed. The missing data file, a model folder
# without config.json and an adapter path that is a file are refused before anything loads (no
# "model build" line before the error). A run with a checkpoint.dir writes the resolved config to
# <checkpoint.dir>/config.resolved.yaml (which reads back) and never prints it; --print-config does.
# runtime.host_memory_bytes (a former environment variable) takes effect; the variable wins.
# Usage: errors_check.sh QSHARD SOURCE_DIR WORK_DIR MPIEXEC [mpiexec flags...]
set -uo pipefail
qshard=$1 src=$2 work=$3
shift 3
mpi=("$@")
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
"$qshard" tokenize "$src"/data/*.txt --out "$work/tiny.tok" > /dev/null || fail "tokenize"
job=(train --config "$src/configs/tiny.yaml" --set device=cpu --set data.train="$work/tiny.tok" --set steps=2
     --set schedule.warmup_steps=0 --set data.max_seq_len=32 --set batch.global_batch_size=4
     --set data.eval_fraction=0 --set logging.metrics_jsonl= --set checkpoint.dir=none)

# expect_one_error NAME PATTERN OUTPUT RC: exit 2, exactly one error line matching PATTERN, no dump.
expect_one_error() {
  local name=$1 pattern=$2 out=$3 rc=$4
  [ "$rc" = 2 ] || { echo "$out"; fail "$name: exit $rc, expected 2"; }
  local n
  n=$(grep -c "qshard: error: " <<< "$out")
  [ "$n" = 1 ] || { echo "$out"; fail "$name: $n 'qshard: error:' lines, expected exactly 1"; }
  grep -q "qshard: error: .*$pattern" <<< "$out" || { echo "$out"; fail "$name: the error does not match '$pattern'"; }
  if grep -Eq "resolved config|^optimizer:|^  lr: |fatal|MPI_ABORT" <<< "$out"; then
    echo "$out"; fail "$name: a config dump or an abort banner was printed"
  fi
  echo "$name: one line, exit 2: ok"
}

# 1. A bad value on 2 ranks.
out=$("${mpi[@]}" -np 2 "$qshard" "${job[@]}" --set schedule.warmup_steps=10 2>&1); rc=$?
expect_one_error "bad value (np 2)" "schedule.warmup_steps = 10: expected <= steps (2)" "$out" "$rc"
# ... the last line printed with mpirun -q (the launcher scripts' flag): nothing after it.
out=$("${mpi[@]}" -q -np 2 "$qshard" "${job[@]}" --set lora.targets=[q_proj] 2>&1); rc=$?
expect_one_error "unknown key (np 2, -q)" "unknown key 'lora.targets' (did you mean 'lora.target_modules'?)" "$out" "$rc"
tail -1 <<< "$out" | grep -q "^qshard: error: " || { echo "$out"; fail "the error is not the last line"; }

# ... ranks started with different jobs (mpirun's MPMD form: rank 1 another lora.r / target list):
# refused by rank 1 naming the key and both values, before anything loads (it corrupted the heap
# or hung a collective), and no run folder is made.
for extra in "lora.r=4" "lora.target_modules=[q_proj]" "optimizer.lr=0.5"; do
  out=$("${mpi[@]}" -np 1 "$qshard" "${job[@]}" --set checkpoint.dir="$work/mpmd" : \
        -np 1 "$qshard" "${job[@]}" --set checkpoint.dir="$work/mpmd" --set "$extra" 2>&1); rc=$?
  expect_one_error "ranks with different jobs ($extra)" "rank 1 was started with another job than rank 0: '${extra%%=*}: " \
    "$out" "$rc"
  [ ! -e "$work/mpmd" ] || fail "ranks with different jobs: $work/mpmd was made"
done

# ... --print-config checks the values before it prints them (it printed a job that could not
# run); a number written as a quoted YAML string is refused naming the key (it was converted).
out=$("$qshard" "${job[@]}" --set schedule.warmup_steps=10 --print-config 2>&1); rc=$?
expect_one_error "--print-config, bad value" "schedule.warmup_steps = 10: expected <= steps (2)" "$out" "$rc"
printf 'optimizer:\n  lr: "1e-4"\n' > "$work/quoted.yaml"
out=$("$qshard" train --config "$work/quoted.yaml" --print-config 2>&1); rc=$?
expect_one_error "quoted number" "quoted.yaml: key 'optimizer.lr': expected a number, got the quoted string '1e-4'" "$out" "$rc"

# 2. Inputs checked before anything loads: no "model build" line, on 2 ranks and on 1.
out=$("${mpi[@]}" -np 2 "$qshard" "${job[@]}" --set data.train="$work/none.tok" 2>&1); rc=$?
expect_one_error "missing data file (np 2)" "data.train: cannot open token file $work/none.tok: No such file" "$out" "$rc"
! grep -q "model build" <<< "$out" || { echo "$out"; fail "the model was built before the missing data file was named"; }
mkdir -p "$work/empty_model"
out=$("$qshard" "${job[@]}" --set model.path="$work/empty_model" 2>&1); rc=$?
expect_one_error "model folder without config.json" "model.path: cannot open model config $work/empty_model/config.json" "$out" "$rc"
out=$("$qshard" "${job[@]}" --set lora.init_adapter="$work/tiny.tok" 2>&1); rc=$?
expect_one_error "adapter given as a file" "lora.init_adapter: adapter folder $work/tiny.tok is a regular file, not a folder" \
  "$out" "$rc"
! grep -q "model build" <<< "$out" || { echo "$out"; fail "the model was built before the adapter was checked"; }

# 3. The resolved config goes to the run folder, not the screen; --print-config shows it.
out=$("$qshard" "${job[@]}" --set checkpoint.dir="$work/run" 2>&1) || { echo "$out"; fail "the 2-step run failed"; }
! grep -Eq "^optimizer:|resolved config \(from" <<< "$out" || { echo "$out"; fail "the run printed the config"; }
[ -f "$work/run/config.resolved.yaml" ] || fail "no $work/run/config.resolved.yaml"
back=$("$qshard" train --config "$work/run/config.resolved.yaml" --print-config) || fail "config.resolved.yaml does not read back"
grep -q "^  max_seq_len: 32$" <<< "$back" || { echo "$back"; fail "config.resolved.yaml lost data.max_seq_len = 32"; }
echo "resolved config in the run folder, read back: ok"

# 4. An environment knob as a key: runtime.host_memory_bytes caps the memory the job counts on
# (named in the refusal); QSHARD_HOST_MEMORY_BYTES, when set, wins over it.
# Found while the model builds, on one rank: still one line, no abort banner.
out=$("$qshard" "${job[@]}" --set runtime.host_memory_bytes=1000 2>&1); rc=$?
expect_one_error "runtime.host_memory_bytes (np 1)" "needs at least .* of host memory .*runtime.host_memory_bytes leaves" \
  "$out" "$rc"
out=$(QSHARD_HOST_MEMORY_BYTES=1e12 "$qshard" "${job[@]}" --set runtime.host_memory_bytes=1000 2>&1) ||
  { echo "$out"; fail "QSHARD_HOST_MEMORY_BYTES did not win over runtime.host_memory_bytes"; }
echo "runtime.host_memory_bytes, overridden by its variable: ok"
echo "errors check ok"
