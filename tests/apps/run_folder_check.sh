#!/usr/bin/env bash
# Defaults that cannot lose work (issue 26), run as a user would (CPU backend):
#  1. a job file without checkpoint.dir trains into runs/<the file's stem> under the working
#     directory and says so at start;
#  2. while that job runs, a second job on the same folder (mpirun -np 2) is refused by both ranks
#     with exit 2, naming the holder's pid and host;
#  3. the first job killed (SIGKILL: its lock file stays), the next job takes the lock over (a log
#     line names the dead pid), trains, and ends with the run folder, the exports and the commands
#     that load them; the printed `qshard generate` command runs verbatim from another directory,
#     and the adapter names its base by an absolute path;
#  4. tokens/s counts every token, target tokens/s the loss targets (padded data: fewer);
#  5. a resume that changes the LR schedule (steps) is refused naming old and new values, and
#     runs with --allow-schedule-change (the run extended: exports next to final/);
#  6. checkpoint.dir none saves nothing and says so.
# Usage: run_folder_check.sh QSHARD SOURCE_DIR WORK_DIR MPIEXEC [mpiexec flags...]
set -euo pipefail
qshard=$1 src=$2 work=$3
shift 3
mpi=("$@")
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
cd "$work"
head -c 60000 "$src"/data/persuasion_vol1.txt > book.txt
"$qshard" tokenize book.txt --split blank-lines --out t.tok > /dev/null  # paragraphs: padded sequences have padding
# The shipped default without its checkpoint.dir and metrics lines: the job file a user writes.
grep -v "dir: build\|metrics_jsonl" "$src/configs/tiny.yaml" > myjob.yaml
grep -q "checkpoint:" myjob.yaml && ! grep -q "  dir:" myjob.yaml || fail "myjob.yaml still sets checkpoint.dir"
args=(train --config myjob.yaml --set device=cpu --set data.train=t.tok --set data.max_seq_len=32
      --set schedule.warmup_steps=1 --set logging.every_steps=1 --set checkpoint.every_steps=0 --set data.packing=padded)
lock=runs/myjob/.qshard.lock

# 1-2. a long job holds runs/myjob; a second one is refused on every rank.
"$qshard" "${args[@]}" --set steps=100000 > long.log 2>&1 &
long=$!
for _ in $(seq 1 600); do [ -s "$lock" ] && break; sleep 0.1; done
[ -s "$lock" ] || { kill -9 "$long"; tail long.log; fail "the first job took no lock in $lock"; }
grep -q "run folder $work/runs/myjob (checkpoint.dir)" long.log || { kill -9 "$long"; fail "the start does not name the run folder"; }
rc=0
out=$(timeout 120 "${mpi[@]}" -np 2 "$qshard" "${args[@]}" --set steps=2 2>&1) || rc=$?
kill -9 "$long"
wait "$long" 2>/dev/null || true
[ "$rc" = 2 ] || { echo "$out" | tail; fail "the second job: exit $rc, expected 2"; }
echo "$out" | grep -q "is in use by another job: pid $long on host $(uname -n)" ||
  { echo "$out" | tail; fail "the refusal does not name pid $long on host $(uname -n)"; }
echo "second job refused (exit 2): $(echo "$out" | grep -o 'is in use by another job: [^(]*' | head -1)"

# 3. the killed job's lock is taken over; the end names the exports and how to load them.
[ -s "$lock" ] || fail "the killed job's lock file is gone (expected it left behind)"
out=$("$qshard" "${args[@]}" --set steps=2 --set logging.metrics_jsonl=m.jsonl 2>&1) ||
  { echo "$out" | tail; fail "the job after the kill failed"; }
echo "$out" | grep -q "took over the lock left by pid $long on host $(uname -n)" || { echo "$out" | tail; fail "no take-over line"; }
[ ! -e "$lock" ] || fail "the lock file is left after a job that ended"
echo "$out" | grep -q "^run folder: $work/runs/myjob$" || { echo "$out" | tail; fail "the end does not name the run folder"; }
echo "$out" | grep -q "exported LoRA adapter (PEFT): *$work/runs/myjob/final/adapter$" || fail "no adapter path at the end"
gen=$(echo "$out" | grep -E "^  .*qshard generate --model " | sed 's/^  //')
[ -n "$gen" ] || { echo "$out" | tail; fail "no qshard generate command at the end"; }
echo "$out" | grep -q "^  python3 -c .*PeftModel.from_pretrained" || fail "no transformers + PEFT command at the end"
(cd / && eval "$gen --max-new-tokens 4" > "$work/gen.log" 2>&1) || { tail "$work/gen.log"; fail "the printed command failed: $gen"; }
grep -q '"base_model_name_or_path": "/' runs/myjob/final/adapter/adapter_config.json ||
  fail "base_model_name_or_path is not an absolute path"

# 4. padded sequences: every token processed, beside the loss targets (fewer).
python_free_check=$(awk -F'[:,}]' '{ for (i = 1; i < NF; i++) { if ($i ~ /"tokens_per_s"/) t = $(i+1);
  if ($i ~ /"target_tokens_per_s"/) g = $(i+1) } } END { print (t + 0 > g + 0 && g + 0 > 0) ? "ok" : "bad " t " " g }' m.jsonl)
[ "$python_free_check" = ok ] || { cat m.jsonl; fail "tokens_per_s is not above target_tokens_per_s: $python_free_check"; }
echo "$out" | grep -Eq "tok/s \([0-9]+ target\)" || fail "the progress line has no target tok/s"

# 5. the LR schedule is part of the checkpoint.
rc=0
out=$("$qshard" "${args[@]}" --set steps=3 --resume auto 2>&1) || rc=$?
[ "$rc" = 2 ] || { echo "$out" | tail; fail "a resume with another steps: exit $rc, expected 2"; }
echo "$out" | grep -q "the LR schedule differs from the checkpoint's (checkpoint -> this job): steps 2 -> 3" ||
  { echo "$out" | tail; fail "the refusal does not list steps 2 -> 3"; }
out=$("$qshard" "${args[@]}" --set steps=3 --resume auto --allow-schedule-change 2>&1) ||
  { echo "$out" | tail; fail "the extension with --allow-schedule-change failed"; }
echo "$out" | grep -q "the LR schedule changes (checkpoint.allow_schedule_change): steps 2 -> 3" || fail "no schedule-change warning"
[ -d runs/myjob/final-step-3/adapter ] || fail "the extended run did not export next to final/"
echo "schedule change refused, then allowed: ok"

# 6. saving nothing is a choice, and said.
out=$("$qshard" train --config myjob.yaml --set device=cpu --set data.train=t.tok --set data.max_seq_len=32 \
  --set steps=1 --set schedule.warmup_steps=0 --set checkpoint.dir=none --set data.eval_fraction=0 2>&1) ||
  { echo "$out" | tail; fail "checkpoint.dir none failed"; }
echo "$out" | grep -q "^nothing was saved (checkpoint.dir: none)" || { echo "$out" | tail; fail "none: not said"; }
[ ! -e runs/none ] || fail "checkpoint.dir none made a folder"
echo "run folder: ok"
