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
flags=(--bind-to none)
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
exec mpirun -np "$np" "${flags[@]}" build/qshard "$@"
