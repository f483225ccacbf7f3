#!/usr/bin/env bash
# `--help` is complete for every subcommand (issue 26): `qshard <command> --help` exits 0, ends
# with an "Example:" footer, shows the default of every option that takes a number (and of the
# others that have one: "(default: X)"), and names the same things the same way everywhere: a
# device is --device, a sequence length --seq-len, model sizes --vocab-size / --hidden-size /
# --intermediate-size; the older names (bench --seq / --vocab / --hidden / --intermediate,
# quantize --cpu) still work but are not listed.
# Usage: help_check.sh QSHARD
set -uo pipefail
qshard=$1
fail() { echo "FAIL: $*"; exit 1; }
top=$("$qshard" --help) || fail "qshard --help exited non-zero"
grep -q "^Example:" <<< "$top" || fail "qshard --help has no Example"
subs=$(awk '/^Subcommands:/ { on = 1; next } on && /^  [a-z]/ { print $1 } on && /^$/ { on = 0 }' <<< "$top")
[ "$(wc -w <<< "$subs")" -ge 11 ] || fail "fewer than 11 subcommands listed: $subs"
for sub in $subs; do
  out=$("$qshard" "$sub" --help) || fail "qshard $sub --help exited non-zero"
  grep -q "^Example:" <<< "$out" || { echo "$out"; fail "qshard $sub --help has no 'Example:'"; }
  sed -n '/^Example:/,$p' <<< "$out" | grep -q "qshard $sub" || fail "qshard $sub: the example does not run $sub"
  # Every option taking a number shows its default (the description may wrap onto the next line).
  joined=$(awk '/^  +-/ { if (line != "") print line; line = $0; next } /^   +/ { line = line " " $0; next }
                { if (line != "") print line; line = "" } END { if (line != "") print line }' <<< "$out")
  while IFS= read -r line; do
    grep -q "default" <<< "$line" || fail "qshard $sub --help: no default shown for: $line"
  done < <(grep -E "^ +--[a-z0-9-]+ (INT|NUMBER)" <<< "$joined")
  for old in --seq --vocab --hidden --intermediate --cpu; do
    ! grep -Eq "^ +$old( |,|$)" <<< "$out" || fail "qshard $sub --help lists the old name $old"
  done
  echo "qshard $sub --help: example, defaults: ok"
done
"$qshard" bench --help | grep -Eq "^ +--seq-len INT .*\(default: 2048\)" || fail "bench --seq-len's default"
"$qshard" quantize --help | grep -Eq "^ +--blocksize INT .*\(default: 64\)" || fail "quantize --blocksize's default"
"$qshard" quantize --help | grep -Eq "^ +--device" || fail "quantize has no --device"
"$qshard" eval --help | grep -Eq "^ +--seq-len INT" || fail "eval has no --seq-len"
"$qshard" --help | grep -Eq "^ +--log-level TEXT .*\(default: info\)" || fail "--log-level's default"
# The old names still parse, checked like the new ones (messages name the new one).
msg=$("$qshard" bench --preset tiny --device cpu --seq 0 2>&1)
grep -q -- "--seq-len '0': expected an integer in \[1, " <<< "$msg" || fail "bench --seq is no longer parsed: $msg"
msg=$("$qshard" bench --preset tiny --device cpu --vocab -5 2>&1)
grep -q -- "--vocab-size '-5': expected an integer in \[0, " <<< "$msg" || fail "bench --vocab's range: $msg"
msg=$("$qshard" quantize --cpu /nonexistent/model /nonexistent/out 2>&1)
grep -q "/nonexistent/model" <<< "$msg" || fail "quantize --cpu is no longer parsed: $msg"
echo "help check ok"
