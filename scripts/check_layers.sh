#!/usr/bin/env bash
# The include structure of src/: what each layer may include, and no include cycles.
#   runtime      runtime only
#   quant        runtime
#   shard        runtime (it moves bytes and knows nothing of NF4: not quant/)
#   checkpoint   runtime quant shard
#   model        runtime quant, and of checkpoint/ only the tree and the config (module_tree.h,
#                hf_config.h): no checkpoint I/O
#   optim        runtime
#   text         runtime (it builds, tests and fuzzes without MPI collectives, CUDA or the model)
#   infer        runtime quant shard checkpoint model text (not train/)
#   train        runtime quant shard checkpoint model optim text (not infer/)
# (apps/ sits above all.) A quoted include "<layer>/..." from src/<mine>/ must name a layer on
# <mine>'s list or <mine> itself; an include without a folder is a sibling. Cycles: every quoted
# include between files of src/ is an edge; tsort(1) reports a loop.
# Exit 0 when clean; 1 with every offending include (file:line) printed. Used by CTest.
set -euo pipefail
cd "$(dirname "$0")/../src"
declare -A allowed=(
  [runtime]=""
  [quant]="runtime"
  [shard]="runtime"
  [checkpoint]="runtime quant shard"
  [model]="runtime quant checkpoint/module_tree.h checkpoint/hf_config.h"
  [optim]="runtime"
  [text]="runtime"
  [infer]="runtime quant shard checkpoint model text"
  [train]="runtime quant shard checkpoint model optim text"
)
layers=(runtime quant shard checkpoint model optim text infer train)
for d in */; do
  d=${d%/}
  [ -n "${allowed[$d]+x}" ] || { echo "check_layers: src/$d is not in the layer table of scripts/check_layers.sh"; exit 1; }
done
# may_include MINE INCLUDE: 0 when INCLUDE ("layer/file.h") is on MINE's list (a layer or one file).
may_include() {
  local mine=$1 inc=$2 target=${2%%/*} entry
  [ "$target" = "$mine" ] && return 0
  for entry in ${allowed[$mine]}; do
    [ "$entry" = "$target" ] || [ "$entry" = "$inc" ] && return 0
  done
  return 1
}
bad=0
edges=$(mktemp)
trap 'rm -f "$edges" "$edges.err"' EXIT
for layer in "${layers[@]}"; do
  while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$rest")
    target=${inc%%/*}
    [ "$target" = "$inc" ] && continue  # a sibling without a folder
    [ -n "${allowed[$target]+x}" ] || continue  # not a folder of src/
    echo "$file $inc" >>"$edges"
    if ! may_include "$layer" "$inc"; then
      echo "layering: src/$file:$line includes \"$inc\" ($layer may include: ${allowed[$layer]:-nothing else})"
      bad=1
    fi
  done < <(grep -Hn '^#include "' "$layer"/*.h "$layer"/*.cpp "$layer"/*.cu 2>/dev/null || true)
done
if ! tsort "$edges" >/dev/null 2>"$edges.err"; then
  echo "include cycle(s) in src/:"
  cat "$edges.err"
  bad=1
fi
n=$(wc -l <"$edges")
[ "$bad" -eq 0 ] && echo "check_layers: $n includes across src/ follow the layer table (${layers[*]}); no cycles"
exit "$bad"
