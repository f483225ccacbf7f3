#!/usr/bin/env bash
# docs/GUIDE.md's CPU path, verbatim: every ```bash tested block runs in page order in a stand-in
# checkout (tests/apps/doc_check_lib.sh), on the CPU, as CI's user. Then what the guide promises:
# the adapter and the 4-bit base exist, the resumed run continued from its checkpoint, and the
# guide's data trained on another model's tokenizer is refused naming both tokenizers.
# Usage: guide_check.sh QSHARD SOURCE_DIR WORK_DIR
set -euo pipefail
qshard=$1 src=$2 work=$3
. "$src/tests/apps/doc_check_lib.sh"
doc_setup "$src" "$work" "$qshard"
log=$work.log
doc_run "$src/docs/GUIDE.md" | tee "$log"
for f in build/guide/run/final/adapter/adapter_model.safetensors build/guide/run/final/base_bnb4/config.json \
         build/guide/run/final/base_bnb4/tokenizer.json; do
  [ -f "$f" ] || { echo "guide check: $f was not written"; exit 1; }
done
grep -q "resumed from build/guide/run/step-0*8 " "$log" || { echo "guide check: the run did not resume from step 8"; exit 1; }
# The guide's two evals: base + adapter, then the base alone; the adapter must lower the loss.
losses=$(grep -E "^eval: .* loss [0-9.]+" "$log" | sed -E 's/.* loss ([0-9.]+).*/\1/' | tr '\n' ' ')
read -r with_adapter base_only <<< "$losses"
[ -n "${base_only:-}" ] || { echo "guide check: expected two eval lines, got '$losses'"; exit 1; }
awk -v a="$with_adapter" -v b="$base_only" 'BEGIN { exit !(a < b) }' ||
  { echo "guide check: eval with the adapter $with_adapter is not below the base's $base_only"; exit 1; }
echo "eval: base + adapter $with_adapter < base $base_only: ok"
# The guide's token file (made by its chat tokenizer) for a model without tokenizer.json (so the
# byte tokenizer) of the same vocab size: train and eval refuse it, naming both tokenizers.
build/qshard init-model --out build/byte_model --vocab-size 259 --layers 1 --hidden-size 64 --intermediate-size 128 \
  --heads 4 --kv-heads 2 > /dev/null
for cmd in "scripts/launch/single_node.sh 1 train --config configs/chat_qlora.yaml --set model.path=build/byte_model --set checkpoint.dir=build/never" \
           "build/qshard eval --model build/byte_model --data build/guide/eval.tok"; do
  set +e
  bad=$($cmd 2>&1)
  rc=$?
  set -e
  echo "$bad" | grep -q "guide/[a-z]*.tok: made by another tokenizer (fnv64:[0-9a-f]*) than the model's, the byte tokenizer (build/byte_model has no tokenizer.json) (byte)" ||
    { echo "$bad" | tail -5; echo "guide check: '$cmd': the tokenizer mismatch is not named"; exit 1; }
  [ "$rc" = 2 ] || { echo "guide check: '$cmd': exit $rc, expected 2"; exit 1; }
  echo "refused as expected: $cmd"
done
echo "guide commands: ok"
