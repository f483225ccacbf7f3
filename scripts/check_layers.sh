#!/usr/bin/env bash
# The include structure of src/: dependencies point down only, and no include cycles.
#   layers, bottom up: runtime < quant < shard < checkpoint < model < train (apps/ above all)
# A file in src/<layer>/ may include "<other>/..." only for an <other> at or below <layer>.
# Cycles: every quoted include between files of src/ is an edge; tsort(1) reports a loop.
# Exit 0 when clean; 1 with every offending include (file:line) printed. Used by CTest.
set -euo pipefail
cd "$(dirname "$0")/../src"
order=(runtime quant shard checkpoint model train)
rank() { local i; for i in "${!order[@]}"; do [ "${order[$i]}" = "$1" ] && { echo "$i"; return; }; done; echo -1; }
bad=0
edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
for layer in "${order[@]}"; do
  mine=$(rank "$layer")
  while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$rest")
    target=${inc%%/*}
    [ "$target" = "$inc" ] && continue  # a sibling without a folder
    theirs=$(rank "$target")
    if [ "$theirs" -lt 0 ]; then continue; fi
    echo "$file $inc" >>"$edges"
    if [ "$theirs" -gt "$mine" ]; then
      echo "layering: src/$file:$line includes \"$inc\" ($target is above $layer)"
      bad=1
    fi
  done < <(grep -Hn '^#include "' "$layer"/*.h "$layer"/*.cpp "$layer"/*.cu 2>/dev/null || true)
done
if ! tsort "$edges" >/dev/null 2>"$edges.err"; then
  echo "include cycle(s) in src/:"
  cat "$edges.err"
  bad=1
fi
rm -f "$edges.err"
n=$(wc -l <"$edges")
[ "$bad" -eq 0 ] && echo "check_layers: $n includes across src/ follow runtime < quant < shard < checkpoint < model < train; no cycles"
exit "$bad"
