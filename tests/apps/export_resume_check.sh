#!/usr/bin/env bash
# The final export after a kill -9 and on a full disk, run as a user would (CPU backend, mpirun -np 2):
#  1. rank 0 killed (SIGKILL) halfway through writing the 4-bit base of the final export
#     (QSHARD_TEST_KILL_DURING_EXPORT=bnb4): final/ holds only base_bnb4.partial-<pid>; next to it
#     a partial folder of a live process (a `sleep`) and one of a dead process (pid 999999999);
#     `--resume auto` writes both exports, removes the dead processes' partial folders, keeps the
#     live one's, and the exports are byte-identical to `qshard export` of the final checkpoint;
#  2. killed during the adapter's export (base complete): the resume writes only the adapter and
#     leaves the complete base as it was (same inode and mtime); resumed once more: nothing to do;
#  3. a full disk (QSHARD_TEST_DISK_FULL) on rank 0 during the export, and on rank 1 during a
#     checkpoint save: every run ends with exit 2 (bad input: the write failure, naming the file
#     and "No space left on device"), never 1, never a hang; no partial export folder is left.
# Usage: export_resume_check.sh QSHARD SOURCE_DIR WORK_DIR MPIEXEC [mpiexec flags...]
set -euo pipefail
qshard=$1 src=$2 work=$3
shift 3
mpi=("$@")
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
"$qshard" tokenize "$src"/data/*.txt --out "$work/t.tok" > /dev/null
args=(train --config "$src/configs/tiny.yaml" --set device=cpu --set data.train="$work/t.tok" --set steps=4
      --set schedule.warmup_steps=1 --set data.max_seq_len=32 --set logging.every_steps=4)
job() { timeout 120 "${mpi[@]}" -np 2 "$@"; }

# same_export DIR FORMAT CKPT [flags]: DIR equals `qshard export CKPT --format FORMAT`, byte for byte.
same_export() {
  rm -rf "$work/ref"
  "$qshard" export "$3" --format "$2" --out "$work/ref" "${@:4}" > /dev/null 2>&1 || fail "export $3 as $2"
  diff -r "$1" "$work/ref" > /dev/null || fail "$1 differs from a fresh $2 export of $3"
}

# 1. killed during the 4-bit base export
ck=$work/ck1
if env QSHARD_TEST_KILL_DURING_EXPORT=bnb4 "${mpi[@]}" -np 2 "$qshard" "${args[@]}" --set checkpoint.dir="$ck" \
    > "$work/kill1.log" 2>&1; then
  fail "the killed job exited 0"
fi
grep -q "QSHARD_TEST_KILL_DURING_EXPORT" "$work/kill1.log" || { tail "$work/kill1.log"; fail "the job was not killed in the export"; }
ls -d "$ck"/final/base_bnb4.partial-* > /dev/null 2>&1 || fail "no base_bnb4.partial-<pid> after the kill"
[ ! -e "$ck/final/base_bnb4" ] && [ ! -e "$ck/final/adapter" ] || fail "an export looks complete after the kill"
sleep 300 & live=$!
trap 'kill $live 2> /dev/null || true' EXIT
mkdir -p "$ck/final/adapter.partial-$live" "$ck/final/adapter.partial-999999999"
out=$(job "$qshard" "${args[@]}" --set checkpoint.dir="$ck" --resume auto 2>&1) || { echo "$out" | tail; fail "resume 1 failed"; }
echo "$out" | grep -E "resumed from .*step-00000004" > /dev/null || fail "did not resume from step 4"
ls -d "$ck"/final/base_bnb4.partial-* > /dev/null 2>&1 && fail "the killed job's partial folder is still there"
[ ! -e "$ck/final/adapter.partial-999999999" ] || fail "a dead process's partial folder is still there"
[ -d "$ck/final/adapter.partial-$live" ] || fail "a live process's partial folder was removed"
kill $live 2> /dev/null || true
rmdir "$ck/final/adapter.partial-$live"
same_export "$ck/final/base_bnb4" bnb4 "$ck"
same_export "$ck/final/adapter" peft "$ck" --base-model "$ck/final/base_bnb4"
"$qshard" inspect --check --quiet "$ck/final/base_bnb4" | tail -1
echo "killed in the 4-bit export: resumed, both exports complete and identical to fresh ones"

# 2. killed during the adapter export
ck=$work/ck2
if env QSHARD_TEST_KILL_DURING_EXPORT=peft "${mpi[@]}" -np 2 "$qshard" "${args[@]}" --set checkpoint.dir="$ck" \
    > "$work/kill2.log" 2>&1; then
  fail "the killed job exited 0"
fi
[ -d "$ck/final/base_bnb4" ] || fail "the base export is not complete before the adapter's"
ls -d "$ck"/final/adapter.partial-* > /dev/null 2>&1 || fail "no adapter.partial-<pid> after the kill"
before=$(stat -c '%i %Y' "$ck/final/base_bnb4" "$ck"/final/base_bnb4/*)
sleep 1  # a rewrite would show in the mtimes
out=$(job "$qshard" "${args[@]}" --set checkpoint.dir="$ck" --resume auto 2>&1) || { echo "$out" | tail; fail "resume 2 failed"; }
echo "$out" | grep -q "base_bnb4 is complete from an interrupted run; kept" || { echo "$out" | tail; fail "the base was not kept"; }
[ "$(stat -c '%i %Y' "$ck/final/base_bnb4" "$ck"/final/base_bnb4/*)" = "$before" ] || fail "the complete base was rewritten"
ls -d "$ck"/final/*.partial-* > /dev/null 2>&1 && fail "a partial folder is left"
same_export "$ck/final/adapter" peft "$ck" --base-model "$ck/final/base_bnb4"
same_export "$ck/final/base_bnb4" bnb4 "$ck"
out=$(job "$qshard" "${args[@]}" --set checkpoint.dir="$ck" --resume auto 2>&1) || { echo "$out" | tail; fail "resume 3 failed"; }
echo "$out" | grep -q "are complete; nothing to do" || { echo "$out" | tail; fail "a complete run exported again"; }
echo "killed in the adapter export: only the adapter was written; a complete run: nothing to do"

# 3. a full disk: exit 2 on every run, whichever rank fails
for k in 1 2 3; do
  for where in "final/base_bnb4.partial-:export, rank 0" "rank-00001-of-00002:checkpoint save, rank 1"; do
    ck=$work/full_$k
    rm -rf "$ck"
    rc=0
    out=$(env QSHARD_TEST_DISK_FULL="${where%%:*}" timeout 120 "${mpi[@]}" -np 2 "$qshard" "${args[@]}" \
      --set checkpoint.dir="$ck" 2>&1) || rc=$?
    [ "$rc" = 2 ] || { echo "$out" | tail -5; fail "full disk (${where#*:}), run $k: exit $rc, expected 2"; }
    echo "$out" | grep -q "No space left on device" || { echo "$out" | tail -5; fail "the message lacks ENOSPC"; }
    ls -d "$ck"/final/*.partial-* > /dev/null 2>&1 && fail "full disk (${where#*:}): a partial export folder is left"
  done
done
echo "full disk at 2 ranks (export on rank 0, checkpoint on rank 1): exit 2, three runs each"
echo "export resume: ok"
