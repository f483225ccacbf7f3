#!/usr/bin/env bash
# `qshard tokenize --preview` and --format auto as a user runs them (issue 27): the per-file format
# line, the exact preview of a JSON-array prompt/completion file on the byte tokenizer (trained
# tokens between [[ ]], counts), nothing written without --out and the file written with it; with
# the native tokenizer, a ShareGPT file through the guide's chat template; a file of unknown keys and
# a missing --out refused with exit 2.
# Usage: tokenize_preview_check.sh QSHARD SOURCE_DIR WORK_DIR [tokenizer]
set -uo pipefail
qshard=$1 src=$2 work=$3 native=${4:-}
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1

printf '[{"prompt": "2+2=", "completion": "4"},\n {"prompt": "1+1=", "completion": "2"}]\n' > pc.json
out=$("$qshard" tokenize pc.json --preview 1) || fail "--preview exited $?"
want=$'pc.json: format prompt_completion (detected from the first record\'s keys)\n--- sample 1 (pc.json:1 (element 0)): 7 tokens, 2 trained, 5 masked\n<bos>2+2=[[4<eos>]]'
[ "$out" = "$want" ] || fail "preview output:"$'\n'"$out"$'\n'"expected:"$'\n'"$want"
[ -z "$(ls ./*.tok 2>/dev/null)" ] || fail "--preview without --out wrote a file"
out=$("$qshard" tokenize pc.json --preview 2 --out pc.tok) || fail "--preview --out exited $?"
grep -q "^--- sample 2 (pc.json:2 (element 1)): 7 tokens, 2 trained, 5 masked$" <<< "$out" || fail "sample 2: $out"
grep -q "^tokenized 1 files, 2 documents, 10 bytes -> 14 tokens (4 targets) in pc.tok" <<< "$out" || fail "with --out: $out"
[ "$(grep -c "format prompt_completion" <<< "$out")" = 1 ] || fail "the format line is printed once: $out"

if [ "$native" = tokenizer ]; then
  echo '{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}' > sg.jsonl
  out=$("$qshard" tokenize sg.jsonl --tokenizer "$src/data/guide" --preview 1) || fail "sharegpt preview exited $?"
  grep -q "^sg.jsonl: format sharegpt (detected from the first record's keys)$" <<< "$out" || fail "sharegpt: $out"
  grep -q "^<|im_start|>assistant$" <<< "$out" && grep -q "^\[\[Hello<|im_end|>$" <<< "$out" || fail "sharegpt preview: $out"
  grep -q "^--- sample 1 (sg.jsonl:1): [0-9]* tokens, 7 trained, [0-9]* masked$" <<< "$out" || fail "sharegpt counts: $out"
fi

echo '{"question": "q", "answer": "a"}' > qa.jsonl
out=$("$qshard" tokenize qa.jsonl --out qa.tok 2>&1)
rc=$?
[ "$rc" = 2 ] || fail "unknown keys: exit $rc"
grep -q 'qa.jsonl:1: cannot tell the format from the first record.s keys ("question", "answer")' <<< "$out" || fail "unknown keys: $out"
out=$("$qshard" tokenize pc.json 2>&1)
[ $? = 2 ] && grep -q -- "--out is required" <<< "$out" || fail "no --out: $out"
echo "tokenize preview: ok"
