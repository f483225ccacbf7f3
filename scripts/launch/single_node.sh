#!/usr/bin/env bash
# One node, N ranks: scripts/launch/single_node.sh [NP] [qshard arguments...]
#   scripts/launch/single_node.sh 4 version
# Each rank takes GPU local_rank % (visible GPUs); with no GPU the ranks run the CPU backend.
#   scripts/launch/single_node.sh 2 train --config configs/tiny.yaml
set -euo pipefail
cd "$(dirname "$0")/../.."
np=${1:-4}
shift || true
[ $# -gt 0 ] || set -- version
# mpirun -q (below) would hide its own "cannot execute" report: say it here.
[ -x build/qshard ] || { echo "$0: build/qshard not found or not executable (build it first: scripts/build.sh)" >&2; exit 2; }
flags=(--bind-to none -q)
# -q: without Open MPI's note on a non-zero exit, a bad input's one "qshard: error:" line (rank 0's)
# is the last line printed; a crashing rank's own report and the exit code are unchanged.
# Open MPI refuses root without this (containers, CI) and more ranks than cores without
# --oversubscribe (fine for the CPU backend and tests; on GPUs use one rank per GPU).
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
flags+=(--oversubscribe)
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# Forward the variables that are set (local ranks inherit the environment anyway; -x keeps the
# line the same as multi_node.sh).
for v in NCCL_NVLS_ENABLE QSHARD_COLLECTIVE_TIMEOUT_S NCCL_DEBUG; do
  [ -n "${!v+x}" ] && flags+=(-x "$v")
done
# A SIGINT/SIGTERM sent to this script goes to mpirun (which forwards it to the ranks; they log it
# and abort the job); the script then exits 128 + signal, as docs/LAUNCH.md says. (mpirun itself
# exits 1 when it is signalled.)
sig=0
mpirun -np "$np" "${flags[@]}" build/qshard "$@" &
child=$!
trap 'sig=2; kill -INT $child 2>/dev/null' INT
trap 'sig=15; kill -TERM $child 2>/dev/null' TERM
rc=0
wait $child || rc=$?
while kill -0 $child 2>/dev/null; do wait $child || rc=$?; done  # wait returns early on a trapped signal
[ "$sig" != 0 ] && exit $((128 + sig))
exit $rc
