# probe_lib.sh: the helper the probe scripts (tests/apps/probe_*_check.sh) share; sourced, not run.
#
# probe NAME EXPECTED_EXIT PATTERN -- command...
#   Runs the command under an address-space limit (ulimit -v PROBE_VMEM_KB, default 4 GiB) and a
#   timeout (PROBE_TIMEOUT seconds, default 60), stdout and stderr together. It passes when the exit
#   code is EXPECTED_EXIT and the output matches PATTERN (grep -E); else it prints FAIL with the
#   exit code and the output's end, and counts one in $fails. A hang (timeout: 124) or a signal
#   (>= 128) is a wrong exit code like any other. PROBE_ONE_LINE=1 joins the output's lines first
#   (a pattern may then span lines, CLI11's message and its hint).
# poke FILE TENSOR BYTE_OFFSET PRINTF_BYTES: overwrites bytes inside one safetensors tensor's payload
#   (a NaN or Inf put into a weight); counts a failure when FILE has no such tensor.
# probe_summary OK_LINE: exits 1 with the count when a probe failed, else prints OK_LINE (what the
#   CTest PASS_REGULAR_EXPRESSION waits for).
# The sourcing script sets fails=0 first (and may set the PROBE_* variables before any probe).

PROBE_TIMEOUT=${PROBE_TIMEOUT:-60}
PROBE_VMEM_KB=${PROBE_VMEM_KB:-4194304}
PROBE_ONE_LINE=${PROBE_ONE_LINE:-0}

probe() {
  local name=$1 want=$2 pattern=$3
  shift 4
  local out rc
  out=$( (ulimit -v "$PROBE_VMEM_KB"; timeout "$PROBE_TIMEOUT" "$@") 2>&1)
  rc=$?
  [ "$PROBE_ONE_LINE" = 1 ] && out=$(tr '\n' ' ' <<< "$out")
  if [ "$rc" != "$want" ] || ! grep -Eq -e "$pattern" <<< "$out"; then
    echo "FAIL $name: exit $rc (want $want), pattern '$pattern'"
    echo "$out" | grep -v "^  " | tail -8 | cut -c1-600
    fails=$((fails + 1))
  else
    echo "ok   $name: exit $rc: $(grep -Eo -e "$pattern.{0,60}" <<< "$out" | head -1)"
  fi
}

probe_summary() {
  if [ "$fails" != 0 ]; then
    echo "$fails probe(s) failed"
    exit 1
  fi
  echo "$1"
}

poke() {
  local st=$1 hlen off
  hlen=$(od -An -t u8 -N8 "$st" | tr -d ' ')
  off=$(head -c $((8 + hlen)) "$st" | tail -c "$hlen" | grep -o "\"$2\":{[^}]*}" |
    grep -o 'data_offsets":\[[0-9]*' | grep -o '[0-9]*$')
  [ -n "$off" ] || { echo "FAIL: no tensor $2 in $st"; fails=$((fails + 1)); return; }
  printf "$4" | dd of="$st" bs=1 seek=$((8 + hlen + off + $3)) conv=notrunc status=none
}
