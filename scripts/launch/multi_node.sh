#!/usr/bin/env bash
# Several nodes from a hostfile: scripts/launch/multi_node.sh HOSTFILE NP [qshard arguments...]
#   scripts/launch/multi_node.sh scripts/launch/hostfile.example 16 version
# The hostfile lists one node a line with its slots (ranks), normally its GPU count. The repository
# (and build/qshard) must be at the same path on every node, e.g. a shared filesystem.
# `-x` forwards environment variables to the remote ranks (Open MPI only forwards what is named).
set -euo pipefail
cd "$(dirname "$0")/../.."
hostfile=${1:?hostfile}
np=${2:?number of ranks}
shift 2
[ $# -gt 0 ] || set -- version
# mpirun -q (below) would hide its own "cannot execute" report: say it here.
[ -x build/qshard ] || { echo "$0: build/qshard not found or not executable (build it first: scripts/build.sh)" >&2; exit 2; }
flags=(--hostfile "$hostfile" --map-by ppr:"${RANKS_PER_NODE:-8}":node --bind-to none -q)
# -q: a bad input's one "qshard: error:" line stays the last line printed (see single_node.sh).
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
for v in NCCL_NVLS_ENABLE NCCL_DEBUG NCCL_SOCKET_IFNAME NCCL_IB_HCA QSHARD_COLLECTIVE_TIMEOUT_S \
         CUDA_VISIBLE_DEVICES PATH LD_LIBRARY_PATH; do
  [ -n "${!v+x}" ] && flags+=(-x "$v")
done
exec mpirun -np "$np" "${flags[@]}" build/qshard "$@"
