#!/usr/bin/env bash
# Hostile tokenizer files and text through `qshard tokenize --tokenizer` (issue 25): Sequences nested
# 100k deep (each component) and 33 deep, vocabulary / added-token / post-processor ids out of
# range or duplicated, merges naming unknown tokens, a catastrophic Split pattern, 100k added tokens
# sharing a first byte on 1 MB of text, a FIFO as tokenizer.json or tokenizer_config.json, a
# folder as tokenizer.json, a folder without one, a missing folder - each refused with exit 2 and a
# message naming the file and the construct, key or pattern (or, for the 100k added tokens, a
# clean run); no crash, no hang. Every probe runs under a 4 GiB address-space limit (ulimit -v)
# and a 60 s timeout, as tests/apps/probe_suite_check.sh's do; the unit tests with the mutations
# they catch: tests/text/hf_tokenizer_limits_test.cpp.
# Usage: probe_tokenizer_check.sh QSHARD WORK_DIR
set -uo pipefail
qshard=$1 work=$2 src=${3:-}
rm -rf "$work" && mkdir -p "$work"
fails=0

source "$(dirname "$0")/probe_lib.sh"
# tprobe NAME EXPECTED_EXIT PATTERN -- command...: probe (probe_lib.sh), where the command
# `run_tok NAME [INPUT]` is qshard tokenize with the folder $work/NAME as the tokenizer.
tprobe() {
  [ "$5" = run_tok ] && set -- "$1" "$2" "$3" "$4" "$qshard" tokenize --tokenizer "$work/$6" "${7:-$work/in.txt}" --out "$work/$6.tok"
  probe "$@"
}

echo "some text to tokenize" > "$work/in.txt"
model='"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}'
# tok NAME JSON: a tokenizer folder $work/NAME holding that tokenizer.json.
tok() { mkdir -p "$work/$1" && printf '%s' "$2" > "$work/$1/tokenizer.json"; }
# nest KEY LIST N LEAF: KEY's component, N Sequences deep around LEAF.
nest() {
  local open close
  open=$(printf "{\"type\": \"Sequence\", \"$2\": [%.0s" $(seq "$3"))
  close=$(printf ']}%.0s' $(seq "$3"))
  printf '{"%s": %s%s%s, %s}' "$1" "$open" "$4" "$close" "$model"
}

# ---- recursion: Sequences 100k deep (the bounded JSON parse) and 33 deep (the Sequence bound) ----
for c in "normalizer normalizers {\"type\": \"Prepend\", \"prepend\": \"x\"}" \
         "pre_tokenizer pretokenizers {\"type\": \"ByteLevel\"}" \
         "decoder decoders {\"type\": \"Fuse\"}" \
         "post_processor processors {\"type\": \"ByteLevel\"}"; do
  read -r key list leaf <<< "$c"
  tok "deep_$key" "$(nest "$key" "$list" 100000 "$leaf")"
  tprobe "$key Sequence 100k deep" 2 "deep_$key/tokenizer.json: JSON nested more than 256 levels" -- run_tok "deep_$key"
  tok "seq33_$key" "$(nest "$key" "$list" 33 "$leaf")"
  tprobe "$key Sequence 33 deep" 2 "seq33_$key/tokenizer.json: $key Sequence nested more than 32 deep" -- run_tok "seq33_$key"
done

# ---- ids ----
for id in -1 4294967295 4194304 1.5; do
  tok "vocab_$id" "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": $id}, \"merges\": []}}"
  tprobe "vocab id $id" 2 "vocab_$id/tokenizer.json: model.vocab\[\"b\"\]: expected a token id \(an integer from 0 to 4194303.*got $id" -- run_tok "vocab_$id"
  tok "added_$id" "{\"added_tokens\": [{\"content\": \"<x>\", \"id\": $id}], $model}"
  tprobe "added token id $id" 2 "added_$id/tokenizer.json: added_tokens\[0\].id: expected a token id.*got $id" -- run_tok "added_$id"
done
tok vocab_dup '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": []}}'
tprobe "vocab id given twice" 2 'vocab_dup/tokenizer.json: model.vocab gives id 0 to both "a" and "b"' -- run_tok vocab_dup
tok added_dup "{\"added_tokens\": [{\"content\": \"<x>\", \"id\": 9}, {\"content\": \"<y>\", \"id\": 9}], $model}"
tprobe "added token id given twice" 2 'added_dup/tokenizer.json: added_tokens\[1\].id 9 is also the id of added token "<x>"' -- \
  run_tok added_dup
tok merge_unknown '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a zz"]}}'
tprobe "merge naming an unknown token" 2 "merge_unknown/tokenizer.json: model.merges\[0\] \('a' 'zz'\) names a token missing" -- \
  run_tok merge_unknown
tok post_id "{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"<s>\": {\"ids\": [4294967295]}}}, $model}"
tprobe "post-processor id 2^32-1" 2 'post_id/tokenizer.json: post_processor.special_tokens\["<s>"\].ids\[0\]: expected a token id.*got 4294967295' -- run_tok post_id

# ---- missing or mistyped fields: named by their path in the file (nlohmann's own text before) ----
tok no_model '{"added_tokens": []}'
tprobe "no model" 2 'no_model/tokenizer.json: model: missing \(expected an object' -- run_tok no_model
tok model_string '{"model": "BPE"}'
tprobe "model a string" 2 'model_string/tokenizer.json: model: expected an object, got "BPE"' -- run_tok model_string
tok merges_object '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": {"a": "b"}}}'
tprobe "merges an object" 2 'merges_object/tokenizer.json: model.merges: expected an array' -- run_tok merges_object
tok split_behavior "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": 1}, $model}"
tprobe "Split behavior a number" 2 'split_behavior/tokenizer.json: pre_tokenizer.behavior: expected a string, got 1' -- \
  run_tok split_behavior
tok bos_number "$(cat "$work/no_model/tokenizer.json" | sed "s/\"added_tokens\": \[\]/$model/")"
printf '{"bos_token": 5}' > "$work/bos_number/tokenizer_config.json"
tprobe "tokenizer_config bos_token a number" 2 'bos_number/tokenizer_config.json: bos_token: expected a token' -- run_tok bos_number

# ---- a catastrophic Split pattern on 28 characters ----
tok regex "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a+)+\$\"}, \"behavior\": \"Isolated\"}, $model}"
printf 'xy%s!' "$(head -c 28 /dev/zero | tr '\0' a)" > "$work/a28.txt"
tprobe "catastrophic regex (a+)+\$" 2 "regex/tokenizer.json pre_tokenizer Split: regular expression '\(a\+\)\+\\$' gave up searching from byte 0 .*PCRE2 match limit" -- \
  run_tok regex "$work/a28.txt"

# ---- 100k added tokens sharing a first byte, on 1 MB of text: finishes (linear matching) ----
{ printf '{"added_tokens": ['
  seq 0 99999 | awk '{printf "{\"content\": \"a%d\", \"id\": %d},", $1, $1 + 3}'
  printf '{"content": "ab", "id": 100003}], %s}' "$model"; } > "$work/added.json"
tok added100k "$(cat "$work/added.json")"
head -c 1048576 /dev/zero | tr '\0' a > "$work/a1m.txt"
tprobe "100k added tokens on 1 MB" 0 "tokenized 1 files, 1 documents, 1048576 bytes -> 1048576 tokens" -- \
  run_tok added100k "$work/a1m.txt"

# ---- special files, folders, missing paths ----
mkdir -p "$work/fifo_json" && mkfifo "$work/fifo_json/tokenizer.json"
tprobe "FIFO tokenizer.json" 2 "fifo_json/tokenizer.json is a FIFO \(named pipe\), not a regular file" -- run_tok fifo_json
tok fifo_cfg "{$model}" && mkfifo "$work/fifo_cfg/tokenizer_config.json"
tprobe "FIFO tokenizer_config.json" 2 "fifo_cfg/tokenizer_config.json is a FIFO \(named pipe\), not a regular file" -- run_tok fifo_cfg
tok deep_cfg "{$model}"
{ head -c 100000 /dev/zero | tr '\0' '['; head -c 100000 /dev/zero | tr '\0' ']'; } > "$work/deep_cfg/tokenizer_config.json"
tprobe "tokenizer_config.json nested 100k deep" 2 "deep_cfg/tokenizer_config.json: JSON nested more than 256 levels" -- run_tok deep_cfg
mkdir -p "$work/dir_json/tokenizer.json"
tprobe "folder as tokenizer.json" 2 "dir_json/tokenizer.json is a folder, not a regular file" -- run_tok dir_json
mkdir -p "$work/empty"
tprobe "folder without tokenizer.json" 2 "empty: cannot read the tokenizer: the folder has no tokenizer.json" -- run_tok empty
tprobe "missing folder" 2 "no_such_model: cannot read the tokenizer" -- run_tok no_such_model
tprobe "/dev/zero as the tokenizer" 2 "/dev/zero is a character device, not a regular file" -- \
  "$qshard" tokenize --tokenizer /dev/zero "$work/in.txt" --out "$work/z.tok"

# generate --tokenizer names its tokenizer: a missing one, a folder without tokenizer.json or a FIFO
# is an error, not a quiet fall back to the byte tokenizer; a FIFO in the model folder likewise.
if [ -n "$src" ]; then
  m=$src/tests/data/hf/tiny_llama_bf16
  tprobe "generate --tokenizer missing" 2 "no_such_tok: cannot read the tokenizer" -- "$qshard" generate --model "$m" --prompt hi --tokenizer "$work/no_such_tok"
  tprobe "generate --tokenizer without tokenizer.json" 2 "empty: cannot read the tokenizer: the folder has no tokenizer.json" \
    -- "$qshard" generate --model "$m" --prompt hi --tokenizer "$work/empty"
  tprobe "generate --tokenizer FIFO" 2 "fifo_json/tokenizer.json is a FIFO" -- "$qshard" generate --model "$m" --prompt hi --tokenizer "$work/fifo_json"
  mkdir -p "$work/fifo_model" && cp "$m"/* "$work/fifo_model/" && mkfifo "$work/fifo_model/tokenizer.json"
  tprobe "generate, a FIFO tokenizer.json in the model folder" 2 "fifo_model/tokenizer.json is a FIFO" -- \
    "$qshard" generate --model "$work/fifo_model" --prompt-ids 1,2
fi

probe_summary "tokenizer probes ok"
