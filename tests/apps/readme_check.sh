#!/usr/bin/env bash
# The README's commands, verbatim: every ```bash tested block of README.md runs in page order in a
# stand-in checkout (tests/apps/doc_check_lib.sh: the source tree's files linked, build/qshard the
# binary under test), on the CPU, as CI's user (root: the launcher adds --allow-run-as-root). A
# bash block that is neither tested nor marked not-run with a reason fails the check.
# Usage: readme_check.sh QSHARD SOURCE_DIR WORK_DIR
set -euo pipefail
qshard=$1 src=$2 work=$3
. "$src/tests/apps/doc_check_lib.sh"
doc_setup "$src" "$work" "$qshard"
doc_run "$src/README.md"
# What the commands must have left: the resumed run's exports and the merged folder.
for f in build/runs/tiny/ckpt/final/adapter/adapter_model.safetensors build/runs/tiny/merged/config.json \
         build/demo/tiny_llama_nf4_dequantized/config.json; do
  [ -f "$f" ] || { echo "readme check: $f was not written"; exit 1; }
done
echo "readme commands: ok"
