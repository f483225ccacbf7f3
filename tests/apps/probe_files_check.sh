#!/usr/bin/env bash
# Every file a qshard command reads, swapped for the wrong kind (issue 25): each command (eval,
# generate, tokenize, train, init-model, export, quantize, dequantize, inspect) and each file role it
# reads (model folder, config.json, model.safetensors, the sharded index and a shard, the adapter
# folder and its two files, lora.init_adapter, --resume's checkpoint folder, metadata.json and rank
# file, token and ids data, text / jsonl / alpaca inputs, the YAML job, generation_config.json,
# tokenizer.json, tokenizer_config.json, chat_template.jinja, special_tokens_map.json) is made, one
# at a time in a copy of valid inputs, a FIFO, a folder (for a folder role: a regular file) and a
# symbolic link to /dev/zero. Each run must exit 2 with a message naming the role and the path and
# what it is ("... is a FIFO (named pipe), not a regular file"): no hang (a 20 s timeout: 124 fails),
# no signal, no read of /dev/zero for ever. bench and version read no file.
# Also: records over --max-record-bytes (a 300 MB line of jsonl, alpaca and text, under a 512 MiB
# address-space limit) are refused naming file:line, and a 64 MB one-line text file streams
# through the byte tokenizer in that limit. Unit tests: tests/runtime/input_file_test.cpp,
# tests/text/byte_tokenizer_test.cpp (RecordLimit*).
# Usage: probe_files_check.sh QSHARD SOURCE_DIR WORK_DIR [tokenizer]
#   (4th argument "tokenizer": the build has the native tokenizer; its roles are probed too)
set -uo pipefail
qshard=$1 src=$2 work=$3 native=${4:-}
rm -rf "$work" && mkdir -p "$work"
fails=0
PROBE_TIMEOUT=20
source "$(dirname "$0")/probe_lib.sh"

hf=$src/tests/data/hf
n=0

# make_bad KIND PATH: PATH (removed first) becomes a FIFO, a folder, a regular file or a link to /dev/zero.
make_bad() {
  rm -rf "$2"
  case $1 in
    fifo) mkfifo "$2" ;;
    folder) mkdir -p "$2" ;;
    file) echo "not a folder" > "$2" ;;
    zero) ln -s /dev/zero "$2" ;;
  esac
}
# what_is KIND WANTED: the end of the message for KIND where WANTED (regular file | folder) belongs.
what_is() {
  case $1 in
    fifo) echo "is a FIFO \(named pipe\), not a $2" ;;
    folder) echo "is a folder, not a $2" ;;
    file) echo "is a regular file, not a $2" ;;
    zero) echo "is a character device, not a $2" ;;
  esac
}
ere() { sed 's/[][\.*^$()+?{}|]/\\&/g' <<< "$1"; }

# role WHAT VALID REL -- COMMAND...: for each wrong kind, a copy of the folder VALID (same name, in
# a fresh parent) whose REL (a file in it; "." for the folder itself) is that kind; COMMAND, with
# every @@ replaced by the copy's path, must exit 2 naming WHAT and the path.
role() {
  local what=$1 valid=$2 rel=$3 kinds wanted
  shift 4
  if [ "$rel" = . ]; then kinds="fifo file zero" wanted=folder; else kinds="fifo folder zero" wanted="regular file"; fi
  for kind in $kinds; do
    n=$((n + 1))
    local d=$work/c$n/$(basename "$valid")
    mkdir -p "$work/c$n" && cp -r "$valid" "$d"
    local bad=$d
    [ "$rel" = . ] || bad=$d/$rel
    make_bad "$kind" "$bad"
    probe "$2 [$what $rel: $kind]" 2 "$what $(ere "$bad") $(what_is "$kind" "$wanted")" -- "${@//@@/$d}"
    rm -rf "$work/c$n"
  done
}

# ---- valid inputs ----
echo '[[1, 5, 3, 7]]' > "$work/ids.json"
mkdir -p "$work/data"
echo '[[1, 5, 3, 7]]' > "$work/data/ids.json"
"$qshard" tokenize "$src"/data/*.txt --out "$work/data/tiny.tok" > /dev/null || { echo "FAIL: tokenize"; exit 1; }
cp "$work/data/tiny.tok" "$work/data/eval.tok"
printf 'some text\n\nmore text\n' > "$work/data/in.txt"
echo '{"text": "some text"}' > "$work/data/in.jsonl"
echo '{"instruction": "say", "output": "some text"}' > "$work/data/alpaca.jsonl"
printf 'model:\n  init:\n    num_hidden_layers: 2\n' > "$work/data/job.yaml"
# A checkpoint (step 4) of a short CPU job, and its LoRA as a PEFT folder (lora.init_adapter).
job=(train --config "$src/configs/tiny.yaml" --set device=cpu --set steps=4 --set data.max_seq_len=32
     --set schedule.warmup_steps=1 --set checkpoint.every_steps=4 --set logging.metrics_jsonl= --set data.train="$work/data/tiny.tok")
"$qshard" "${job[@]}" --set checkpoint.dir="$work/ck" > "$work/train.log" 2>&1 ||
  { echo "FAIL: the valid job"; tail -5 "$work/train.log"; exit 1; }
ck=$work/ck/step-00000004
"$qshard" export "$ck" --format peft --out "$work/adapter" > /dev/null 2>&1 || { echo "FAIL: export peft"; exit 1; }

# ---- eval ----
m=$hf/tiny_llama_bf16
ev=(--data "$work/ids.json" --device cpu)
probe "eval, valid inputs" 0 "eval: 1 sequences" -- "$qshard" eval --model "$m" "${ev[@]}"
role "model folder" "$m" . -- "$qshard" eval --model @@ "${ev[@]}"
role "model config" "$m" config.json -- "$qshard" eval --model @@ "${ev[@]}"
role "safetensors file" "$m" model.safetensors -- "$qshard" eval --model @@ "${ev[@]}"
role "safetensors index" "$hf/tiny_llama_bf16_sharded" model.safetensors.index.json -- "$qshard" eval --model @@ "${ev[@]}"
role "safetensors file" "$hf/tiny_llama_bf16_sharded" model-00002-of-00003.safetensors -- "$qshard" eval --model @@ "${ev[@]}"
a=$src/tests/data/model/nf4_adapter
q=$hf/tiny_llama_bnb4_nf4_dq
role "adapter folder" "$a" . -- "$qshard" eval --model "$q" --adapter @@ "${ev[@]}"
role "adapter config" "$a" adapter_config.json -- "$qshard" eval --model "$q" --adapter @@ "${ev[@]}"
role "safetensors file" "$a" adapter_model.safetensors -- "$qshard" eval --model "$q" --adapter @@ "${ev[@]}"
role "token file" "$work/data" tiny.tok -- "$qshard" eval --model "$m" --data @@/tiny.tok --device cpu
role "data file" "$work/data" ids.json -- "$qshard" eval --model "$m" --data @@/ids.json --device cpu

# ---- generate ----
gen=(--prompt-ids 1,2 --max-new-tokens 1 --device cpu)
role "model folder" "$m" . -- "$qshard" generate --model @@ "${gen[@]}"
role "model config" "$m" config.json -- "$qshard" generate --model @@ "${gen[@]}"
role "safetensors file" "$m" model.safetensors -- "$qshard" generate --model @@ "${gen[@]}"
role "generation config" "$m" generation_config.json -- "$qshard" generate --model @@ "${gen[@]}"
if [ "$native" = tokenizer ]; then
  # A model folder with a tokenizer (a three-token BPE), its config, a chat template and a special tokens map.
  tm=$work/tok_model
  cp -r "$m" "$tm"
  echo '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}' > "$tm/tokenizer.json"
  echo '{}' > "$tm/tokenizer_config.json"
  echo '{}' > "$tm/special_tokens_map.json"
  printf '%s' '{% for m in messages %}{{ m.content }}{% endfor %}' > "$tm/chat_template.jinja"
  chat=(--prompt ab --chat --max-new-tokens 1 --device cpu)
  probe "generate --chat, valid inputs" 0 "generate \(cpu\): 1 prompt tokens" -- "$qshard" generate --model "$tm" "${chat[@]}"
  role "tokenizer file" "$tm" tokenizer.json -- "$qshard" generate --model @@ "${chat[@]}"
  role "tokenizer config" "$tm" tokenizer_config.json -- "$qshard" generate --model @@ "${chat[@]}"
  role "chat template" "$tm" chat_template.jinja -- "$qshard" generate --model @@ "${chat[@]}"
  role "special tokens map" "$tm" special_tokens_map.json -- "$qshard" generate --model @@ "${chat[@]}"
  role "tokenizer file" "$tm" tokenizer.json -- "$qshard" generate --model "$m" --tokenizer @@ "${gen[@]}"
fi

# ---- tokenize ----
role "input file" "$work/data" in.txt -- "$qshard" tokenize @@/in.txt --out "$work/o.tok"
role "input file" "$work/data" in.jsonl -- "$qshard" tokenize @@/in.jsonl --out "$work/o.tok"
role "input file" "$work/data" alpaca.jsonl -- "$qshard" tokenize @@/alpaca.jsonl --format alpaca --out "$work/o.tok"
role "input file" "$work/data" in.txt -- "$qshard" tokenize @@/in.txt --split blank-lines --out "$work/o.tok"
if [ "$native" = tokenizer ]; then
  echo '{"messages": [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "ba"}]}' > "$work/chat.jsonl"
  ct=(--format chat --out "$work/o.tok")
  probe "tokenize --format chat, valid inputs" 0 "tokenized 1 files, 1 documents" -- \
    "$qshard" tokenize "$work/chat.jsonl" --tokenizer "$tm" "${ct[@]}"
  role "tokenizer file" "$tm" tokenizer.json -- "$qshard" tokenize "$work/chat.jsonl" --tokenizer @@ "${ct[@]}"
  role "tokenizer config" "$tm" tokenizer_config.json -- "$qshard" tokenize "$work/chat.jsonl" --tokenizer @@ "${ct[@]}"
  role "chat template" "$tm" chat_template.jinja -- "$qshard" tokenize "$work/chat.jsonl" --tokenizer @@ "${ct[@]}"
  role "input file" "$work/data" in.txt -- "$qshard" tokenize @@/in.txt --tokenizer "$tm" --out "$work/o.tok"
fi
rm -f "$work/o.tok"

# ---- train (a CPU job of one rank), init-model ----
tj=("${job[@]}" --set checkpoint.dir="$work/ck2")
role "config file" "$src/configs" tiny.yaml -- "$qshard" train --config @@/tiny.yaml --set device=cpu
role "model folder" "$m" . -- "$qshard" "${tj[@]}" --set model.path=@@
role "model config" "$m" config.json -- "$qshard" "${tj[@]}" --set model.path=@@
role "safetensors file" "$m" model.safetensors -- "$qshard" "${tj[@]}" --set model.path=@@
role "token file" "$work/data" tiny.tok -- "$qshard" "${tj[@]}" --set data.train=@@/tiny.tok
role "token file" "$work/data" eval.tok -- "$qshard" "${tj[@]}" --set data.eval=@@/eval.tok --set data.eval_fraction=0
role "adapter folder" "$work/adapter" . -- "$qshard" "${tj[@]}" --set lora.init_adapter=@@
role "adapter config" "$work/adapter" adapter_config.json -- "$qshard" "${tj[@]}" --set lora.init_adapter=@@
role "safetensors file" "$work/adapter" adapter_model.safetensors -- "$qshard" "${tj[@]}" --set lora.init_adapter=@@
role "checkpoint" "$ck" . -- "$qshard" "${tj[@]}" --resume @@
role "checkpoint metadata" "$ck" metadata.json -- "$qshard" "${tj[@]}" --resume @@
role "checkpoint file" "$ck" rank-00000-of-00001.safetensors -- "$qshard" "${tj[@]}" --resume @@
role "config file" "$work/data" job.yaml -- "$qshard" init-model --config @@/job.yaml --out "$work/never"

# ---- export ----
role "checkpoint" "$ck" . -- "$qshard" export @@ --format peft --out "$work/never"
role "checkpoint metadata" "$ck" metadata.json -- "$qshard" export @@ --format peft --out "$work/never"
role "checkpoint file" "$ck" rank-00000-of-00001.safetensors -- "$qshard" export @@ --format peft --out "$work/never"

# ---- quantize, dequantize, inspect ----
role "model folder" "$m" . -- "$qshard" quantize --cpu @@ "$work/never"
role "model config" "$m" config.json -- "$qshard" quantize --cpu @@ "$work/never"
role "safetensors file" "$m" model.safetensors -- "$qshard" quantize --cpu @@ "$work/never"
# A side file quantize copies (tokenizer.json): a FIFO or a link to /dev/zero is named (it was left
# out in silence); a subfolder is not a side file.
for kind in fifo zero; do
  n=$((n + 1))
  d=$work/c$n/$(basename "$m")
  mkdir -p "$work/c$n" && cp -r "$m" "$d"
  make_bad "$kind" "$d/tokenizer.json"
  probe "quantize [model folder side file tokenizer.json: $kind]" 2 \
    "model folder side file $(ere "$d/tokenizer.json") $(what_is "$kind" "regular file")" -- "$qshard" quantize --cpu "$d" "$work/never"
  rm -rf "$work/c$n"
done
role "model folder" "$q" . -- "$qshard" dequantize @@ "$work/never"
role "model config" "$q" config.json -- "$qshard" dequantize @@ "$work/never"
role "safetensors file" "$q" model.safetensors -- "$qshard" dequantize @@ "$work/never"
for kind in fifo zero; do  # inspect takes a file or a folder
  make_bad "$kind" "$work/x.safetensors"
  probe "inspect PATH [$kind]" 2 "safetensors file $(ere "$work/x.safetensors") $(what_is "$kind" "regular file")" -- \
    "$qshard" inspect "$work/x.safetensors"
done
role "model config" "$m" config.json -- "$qshard" inspect --check @@
role "safetensors file" "$m" model.safetensors -- "$qshard" inspect --check @@
role "safetensors index" "$hf/tiny_llama_bf16_sharded" model.safetensors.index.json -- "$qshard" inspect --check @@
[ ! -e "$work/never" ] || { echo "FAIL: a refused command wrote $work/never"; fails=$((fails + 1)); }

# ---- files a command writes: a FIFO, a folder or a device there is refused before any work, by
# name, and left as it was (a FIFO blocked the write for ever; a device was renamed over) ----
# out KIND LABEL WHAT -- COMMAND... (@@ the output path): exit 2 naming WHAT and the path, PATH unchanged.
out() {
  local kind=$1 label=$2 what=$3
  shift 4
  n=$((n + 1))
  local p=$work/out$n
  case $kind in
    fifo) mkfifo "$p" ;;
    folder) mkdir -p "$p" ;;
    device) ln -s /dev/null "$p" ;;
  esac
  local is
  case $kind in fifo) is="a FIFO \(named pipe\)" ;; folder) is="a folder" ;; device) is="a character device" ;; esac
  probe "$label [$what: $kind]" 2 "$what $(ere "$p") is $is, not a regular file" -- "${@//@@/$p}"
  case $kind in
    fifo) [ -p "$p" ] ;;
    folder) [ -d "$p" ] ;;
    device) [ -L "$p" ] && [ -c "$p" ] ;;
  esac || { echo "FAIL: $label [$kind]: $p was replaced"; fails=$((fails + 1)); }
  rm -rf "$p"
}
for kind in fifo folder device; do
  out $kind "tokenize --out" "token file" -- "$qshard" tokenize "$work/data/in.txt" --out @@
  out $kind "eval --dump-logits" "--dump-logits" -- "$qshard" eval --model "$m" "${ev[@]}" --dump-logits @@
  out $kind "generate --dump-logits" "--dump-logits" -- "$qshard" generate --model "$m" "${gen[@]}" --dump-logits @@
  out $kind "generate --json" "--json" -- "$qshard" generate --model "$m" "${gen[@]}" --json @@
  out $kind "bench --json" "bench --json" -- "$qshard" bench --preset tiny --device cpu --steps 1 --warmup 0 --seq-len 16 --json @@
  out $kind "train logging.metrics_jsonl" "metrics log" -- "$qshard" "${tj[@]}" --set logging.metrics_jsonl=@@
done
# A symbolic link as an output file or folder is refused (the output is renamed onto the path: the
# link was replaced, its target left as it was); a dangling link, a path under a file and an empty
# path for a folder are named (init-model gave an internal error).
echo x > "$work/target.tok" && ln -sfn "$work/target.tok" "$work/link.tok"
probe "tokenize --out a symbolic link" 2 "token file $(ere "$work/link.tok") is a symbolic link" -- \
  "$qshard" tokenize "$work/data/in.txt" --out "$work/link.tok"
[ -L "$work/link.tok" ] || { echo "FAIL: the link was replaced"; fails=$((fails + 1)); }
mkdir -p "$work/target_dir" && ln -sfn "$work/target_dir" "$work/link_dir" && ln -sfn "$work/nowhere" "$work/dangling"
echo x > "$work/a_file"
for cmd in "init-model --vocab-size 32 --layers 1 --hidden-size 16 --intermediate-size 32 --heads 2 --kv-heads 1 --out" \
           "quantize --cpu $m"; do
  name=${cmd%% *}
  probe "$name, output a link to a folder" 2 "output folder $(ere "$work/link_dir") is a symbolic link" -- $qshard $cmd "$work/link_dir"
  probe "$name, output a dangling link" 2 "output folder $(ere "$work/dangling") is a symbolic link" -- $qshard $cmd "$work/dangling"
  probe "$name, output under a file" 2 "$(ere "$work/a_file") is a regular file, not a folder" -- $qshard $cmd "$work/a_file/sub"
done
[ -L "$work/link_dir" ] && [ -z "$(ls -A "$work/target_dir")" ] || { echo "FAIL: the folder link was replaced or written through"; fails=$((fails + 1)); }
rm -rf "$work/link.tok" "$work/target.tok" "$work/link_dir" "$work/target_dir" "$work/dangling" "$work/a_file"

# Results printed to a full device are an error, not exit 0.
probe "eval, stdout on /dev/full" 2 "writing the standard output failed" -- \
  sh -c "\"$qshard\" eval --model \"$m\" --data \"$work/ids.json\" --device cpu > /dev/full"
# ... and so is a pipe whose reader is gone (qshard ... | head): exit 2 naming it, not SIGPIPE's
# exit 141; generate stops at the first piece of text it cannot deliver, and writes no --json. The reader end is closed
# before the command starts (python's os.pipe), so the failure does not depend on timing.
# closed_pipe CMD...: runs CMD with stdout on a pipe nobody reads; exits with its code.
closed_pipe=(python3 -c 'import os, subprocess, sys
r, w = os.pipe(); os.close(r)
sys.exit(subprocess.call(sys.argv[1:], stdout=w))')
probe "eval, stdout on a closed pipe" 2 "writing the standard output failed: Broken pipe" -- \
  "${closed_pipe[@]}" "$qshard" eval --model "$m" --data "$work/ids.json" --device cpu
probe "generate, stdout on a closed pipe" 2 "writing the standard output failed: Broken pipe" -- \
  "${closed_pipe[@]}" "$qshard" generate --model "$m" --prompt-ids 1,2 --max-new-tokens 5 --device cpu --json "$work/closed.json"
[ ! -e "$work/closed.json" ] || { echo "FAIL: generate wrote --json after its output failed"; fails=$((fails + 1)); }

# ---- records over --max-record-bytes, in bounded memory ----
# A 300 MB file of one line: refused by file:line after reading 16 MiB of it, under 512 MiB of
# address space beyond what the binary and its shared libraries map (a CUDA build maps cuBLASLt,
# cuDNN and NCCL, hundreds of MB, before main) (reading the line whole, as a string and its
# copies, needs several times that).
libs_kb=$(ldd "$qshard" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | xargs -r stat -L -c %s |
          awk '{s += $1} END {print int(s / 1024)}')
PROBE_VMEM_KB=$(( ${libs_kb:-0} + $(stat -L -c %s "$qshard") / 1024 + 524288 ))
big=$work/big.jsonl
{ printf '{"text": "'; head -c 314572800 /dev/zero | tr '\0' a; } > "$big"
lim=(--max-record-bytes 16777216 --out "$work/big.tok")
rec="$(ere "$big"):1: a record longer than 16777216 bytes \(--max-record-bytes\)"
probe "tokenize jsonl, a 300 MB line" 2 "$rec" -- "$qshard" tokenize "$big" "${lim[@]}"
probe "tokenize alpaca, a 300 MB line" 2 "$rec" -- "$qshard" tokenize "$big" --format alpaca "${lim[@]}"
probe "tokenize text --split blank-lines, a 300 MB line" 2 "$rec" -- \
  "$qshard" tokenize "$big" --format text --split blank-lines "${lim[@]}"
if [ "$native" = tokenizer ]; then
  probe "tokenize text --split file --tokenizer, 300 MB" 2 "$rec.*the whole file, 314572810 bytes, is one document" -- \
    "$qshard" tokenize "$big" --format text --tokenizer "$tm" "${lim[@]}"
fi
probe "tokenize --max-record-bytes 0" 2 "--max-record-bytes '0': expected an integer in \[1, 1099511627776\]" -- \
  "$qshard" tokenize "$work/data/in.txt" --max-record-bytes 0 --out "$work/never.tok"
rm -f "$big"
# The byte tokenizer streams a whole-file document (--split file) in pieces: 64 MB of one line
# tokenizes in the same limit (its 256 MB of tokens are never held).
head -c 67108864 /dev/zero | tr '\0' a > "$work/big.txt"
probe "tokenize text --split file, a 64 MB line (streamed)" 0 "tokenized 1 files, 1 documents, 67108864 bytes -> 67108866 tokens" -- \
  "$qshard" tokenize "$work/big.txt" "${lim[@]}"
rm -f "$work/big.txt" "$work/big.tok"
PROBE_VMEM_KB=4194304

probe_summary "file probes ok"
