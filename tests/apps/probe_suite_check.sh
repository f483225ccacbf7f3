#!/usr/bin/env bash
# The hostile-input probe suite (issue 13): special files, deep JSON, second YAML documents,
# out-of-range options and config values, adapter features qshard does not implement, truncated
# weights, models this machine cannot hold and configs that do not describe their weights - each
# refused with its exit code (2 = bad input; inspect --check 3) and a message naming the file,
# key or value (and the bytes, for resources); no crash, no hang, no out-of-memory kill. Every
# probe runs under a 4 GiB address-space limit (ulimit -v) and a timeout; the wrong exit code
# (124 = timeout, >= 128 = a signal) or a missing pattern fails the probe. Also here: a NaN
# weight, state-dict keys no module tree can hold. Other cases have their own tests: 1.3M-tensor
# headers, the malformed safetensors files (safetensors_test), SIGXFSZ, killed / stopped ranks
# (failure_*, collective timeout), and the fuzzers (scripts/ci_extra.sh).
# Usage: probe_suite_check.sh QSHARD SOURCE_DIR WORK_DIR MPIEXEC [mpiexec flags...]
set -uo pipefail
qshard=$1 src=$2 work=$3
shift 3
rm -rf "$work" && mkdir -p "$work"
fails=0

# st_file NAME HEADER [DATA-printf]: a safetensors file with that header (padded to 8 bytes).
st_file() {
  local h=$2
  while [ $((${#h} % 8)) != 0 ]; do h="$h "; done
  { printf "$(printf '\\x%02x' $((${#h} & 255)) $(((${#h} >> 8) & 255)) 0 0 0 0 0 0)"; printf '%s' "$h"
    printf "${3:-}"; } > "$work/$1"
}

# probe NAME EXPECTED_EXIT PATTERN -- command...: runs the command under the limits (probe_lib.sh).
PROBE_TIMEOUT=120
source "$(dirname "$0")/probe_lib.sh"

hf=$src/tests/data/hf
echo '[[1, 5, 3, 7]]' > "$work/ids.json"

# ---- special files, deep JSON, YAML documents, options ----
mkfifo "$work/fifo"
probe "train --config FIFO" 2 "qshard: error: config file .*fifo is a FIFO" -- "$qshard" train --config "$work/fifo"
probe "tokenize /dev/zero" 2 "/dev/zero is a character device, not a regular file" -- \
  "$qshard" tokenize /dev/zero --out "$work/z.tok"
probe "tokenize a folder" 2 "is a folder, not a regular file" -- "$qshard" tokenize "$work" --out "$work/z.tok"
echo "some text" > "$work/same.txt"
probe "tokenize X --out X" 2 "--out .*same.txt is also an input" -- "$qshard" tokenize "$work/same.txt" --out "$work/same.txt"
grep -q "some text" "$work/same.txt" || { echo "FAIL: tokenize X --out X changed its input"; fails=$((fails + 1)); }
mkdir -p "$work/deep"
cp "$hf/tiny_llama_bf16/model.safetensors" "$work/deep/"
{ head -c 100000 /dev/zero | tr '\0' '['; head -c 100000 /dev/zero | tr '\0' ']'; } > "$work/deep/config.json"
probe "config.json nested 100k deep" 2 "config.json: JSON nested more than 256 levels" -- \
  "$qshard" eval --model "$work/deep" --data "$work/ids.json" --device cpu
{ cat "$src/configs/tiny.yaml"; printf -- '---\nsteps: 5\n'; } > "$work/two.yaml"
probe "job YAML with a second document" 2 "two.yaml: holds 2 YAML documents" -- \
  "$qshard" train --config "$work/two.yaml" --set device=cpu
probe "eval --seq-len -5" 2 "--seq-len '-5': expected an integer in \\[1, " -- \
  "$qshard" eval --model "$hf/tiny_llama_bf16" --data "$work/ids.json" --seq-len -5 --device cpu
probe "quantize --max-shard-size-gb nan" 2 "--max-shard-size-gb 'nan': not a finite number; expected a number in" -- \
  "$qshard" quantize "$hf/tiny_llama_bf16" "$work/q_nan" --max-shard-size-gb nan
cp -r "$src/tests/data/model/nf4_adapter" "$work/adapter"
sed -i 's/"alpha_pattern": {}/"alpha_pattern": {"q_proj": 3}/' "$work/adapter/adapter_config.json"
probe "eval --adapter with alpha_pattern" 2 "adapter_config.json: key \"alpha_pattern\"" -- \
  "$qshard" eval --model "$hf/tiny_llama_bnb4_nf4_dq" --adapter "$work/adapter" --data "$work/ids.json" --device cpu
# lora_alpha 0 silences an adapter and a negative one flips it (issue 25: both were taken).
for alpha in 0 -16; do
  cp -r "$src/tests/data/model/nf4_adapter" "$work/adapter_alpha$alpha"
  sed -i "s/\"lora_alpha\": [0-9.]*/\"lora_alpha\": $alpha/" "$work/adapter_alpha$alpha/adapter_config.json"
  probe "eval --adapter with lora_alpha $alpha" 2 "adapter_config.json: lora_alpha: expected a number in \\(0, 1000000\\], got $alpha" -- \
    "$qshard" eval --model "$hf/tiny_llama_bnb4_nf4_dq" --adapter "$work/adapter_alpha$alpha" --data "$work/ids.json" --device cpu
done
# A config.json with fewer layers than the weights: eval and generate dropped layer 1 in silence.
cp -r "$hf/tiny_llama_bf16" "$work/one_layer"
sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 1/' "$work/one_layer/config.json"
probe "eval of weights with more layers than config.json" 2 "one_layer: the weights hold decoder layer 1 .*num_hidden_layers is 1" -- \
  "$qshard" eval --model "$work/one_layer" --data "$work/ids.json" --device cpu
probe "quantize of weights with more layers than config.json" 2 "one_layer: the weights hold decoder layer 1" -- \
  "$qshard" quantize "$work/one_layer" "$work/one_layer_q"
[ ! -e "$work/one_layer_q" ] || { echo "FAIL: the refused quantize left $work/one_layer_q"; fails=$((fails + 1)); }
mkdir -p "$work/trunc"
cp "$hf/tiny_llama_bf16/config.json" "$work/trunc/"
cp "$src/tests/data/safetensors/truncated.safetensors" "$work/trunc/model.safetensors"
probe "eval of a truncated model.safetensors" 2 "trunc/model.safetensors: header length .* the file has only" -- \
  "$qshard" eval --model "$work/trunc" --data "$work/ids.json" --device cpu
# A NaN in a bf16 projection (bytes C0 7F at element 3 of layer 0's up_proj): quantize refuses,
# naming the tensor and index, instead of reporting a 0% error.
cp -r "$hf/tiny_llama_bf16" "$work/nan"
st=$work/nan/model.safetensors
hlen=$(od -An -t u8 -N8 "$st" | tr -d ' ')
off=$(head -c $((8 + hlen)) "$st" | tail -c "$hlen" | grep -o '"model.layers.0.mlp.up_proj.weight":{[^}]*}' |
  grep -o 'data_offsets":\[[0-9]*' | grep -o '[0-9]*$')
printf '\xc0\x7f' | dd of="$st" bs=1 seek=$((8 + hlen + off + 6)) conv=notrunc status=none
probe "quantize, a NaN weight" 2 "tensor 'model.layers.0.mlp.up_proj.weight' holds 1 NaN/Inf values \(the first at flat index 3\)" -- \
  "$qshard" quantize "$work/nan" "$work/nan_out"
[ ! -e "$work/nan_out" ] || { echo "FAIL: quantize left output for NaN weights"; fails=$((fails + 1)); }
# A bitsandbytes folder whose q_proj weights lost their quant state (the key renamed in the header,
# same length): every command names the file, the weight and the missing key - not "expected F32
# to quantize, got U8", "a tensor and a module path" or a wrong shape.
cp -r "$hf/tiny_llama_bnb4_nf4_dq" "$work/noqs"
LC_ALL=C sed -i 's/q_proj\.weight\.quant_state\.bitsandbytes__nf4"/q_proj.weight.quant_state.bitsandbytes__xx4"/g' \
  "$work/noqs/model.safetensors"
noqs="noqs/model.safetensors: 4-bit weight 'model.layers.0.self_attn.q_proj.weight' \(U8 \[2048, 1\]\) has no quant state: neither 'model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__nf4' nor"
probe "eval, 4-bit weight without quant state" 2 "$noqs" -- \
  "$qshard" eval --model "$work/noqs" --data "$work/ids.json" --device cpu
probe "generate, 4-bit weight without quant state" 2 "$noqs" -- \
  "$qshard" generate --model "$work/noqs" --prompt-ids 1,2 --device cpu
probe "dequantize, 4-bit weight without quant state" 2 "$noqs" -- "$qshard" dequantize "$work/noqs" "$work/noqs_out"
probe "inspect --check, 4-bit weight without quant state" 3 "problem: .*$noqs" -- "$qshard" inspect --check --quiet "$work/noqs"
[ ! -e "$work/noqs_out" ] || { echo "FAIL: dequantize left its output folder"; fails=$((fails + 1)); }
# Sizes read whole (sparse files, nothing on disk): a 6 GB model.safetensors.index.json and a 70 MB
# JSON ids file are refused by size before they are read (an internal error, std::bad_alloc, and a
# SIGABRT); a 300M-token file (1.2 GB) is read one sequence at a time (its ids and targets were
# copied whole: bad_alloc), so eval --dump-logits gets as far as naming the memory its logits need.
mkdir -p "$work/bigidx"
cp "$hf/tiny_llama_bf16/config.json" "$work/bigidx/"
truncate -s 6G "$work/bigidx/model.safetensors.index.json"
probe "eval, 6 GB safetensors index" 2 "safetensors index .*model.safetensors.index.json is 6442450944 bytes, more than the 67108864" -- \
  "$qshard" eval --model "$work/bigidx" --data "$work/ids.json" --device cpu
probe "inspect --check, 6 GB safetensors index" 3 "model.safetensors.index.json is 6442450944 bytes" -- \
  "$qshard" inspect --check --quiet "$work/bigidx"
truncate -s 70M "$work/big_ids.json"
probe "eval, 70 MB JSON ids" 2 "big_ids.json: a JSON data file of 73400320 bytes, more than the 67108864 bytes .*qshard tokenize" -- \
  "$qshard" eval --model "$hf/tiny_llama_bf16" --data "$work/big_ids.json" --device cpu
echo "some text for a token file" > "$work/few.txt"
"$qshard" tokenize "$work/few.txt" --out "$work/huge.tok" > /dev/null
printf '\x80\x00\x00\x00\x00\xa3\xe1\x11\x00\x00\x00\x00' |  # vocab_size 128, 300M tokens, all 0
  dd of="$work/huge.tok" bs=1 seek=12 conv=notrunc status=none
truncate -s 64 "$work/huge.tok"
truncate -s $((64 + 4 * 300000000)) "$work/huge.tok"
probe "eval --dump-logits, 300M tokens" 2 "eval --dump-logits needs at least .* of host memory" -- \
  "$qshard" eval --model "$hf/tiny_llama_bf16" --data "$work/huge.tok" --device cpu --dump-logits "$work/logits.st"
[ ! -e "$work/logits.st" ] || { echo "FAIL: eval left $work/logits.st"; fails=$((fails + 1)); }
# Valid safetensors with state-dict keys no module tree can hold ("a..b", ""): problems, not a crash.
st_file odd.safetensors '{"a..b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}' \
  '\x00\x00\x80\x3f\x00\x00\x00\x40'
probe "inspect --check, keys 'a..b' and ''" 3 "problem: key 'a..b' has an empty name part" -- \
  "$qshard" inspect --check "$work/odd.safetensors"

# Malformed safetensors files (more in safetensors_test and the fuzzer): inspect --check names
# the problem; nothing is allocated from a hostile length or shape.
printf '\xff\xff\xff\xff\xff\xff\xff\x7f{}' > "$work/hlen.safetensors"
probe "safetensors header length 2^63-1" 3 "header length 9223372036854775807 exceeds the limit" -- \
  "$qshard" inspect --check "$work/hlen.safetensors"
st_file bad_json.safetensors '{"w":{"dtype":"F32","shape":[4]'
probe "safetensors header not JSON" 3 "bad_json.safetensors: header: not valid JSON" -- \
  "$qshard" inspect --check "$work/bad_json.safetensors"
st_file span.safetensors '{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,1600]}}' '\x00\x00\x00\x00'
probe "safetensors offsets past the data" 3 "tensor \"w\": data_offsets \[0, 1600\]" -- \
  "$qshard" inspect --check "$work/span.safetensors"
st_file shape.safetensors '{"w":{"dtype":"F32","shape":[4000000000,4000000000],"data_offsets":[0,4]}}' '\x00\x00\x00\x00'
probe "safetensors shape overflowing int64" 3 "element count of shape \[4000000000, 4000000000\] overflows" -- \
  "$qshard" inspect --check "$work/shape.safetensors"

probe "train np2, micro_batch_size 2^62" 2 "qshard: error: .*batch.(micro|global)_batch_size = 4611686018427387904" -- \
  "$@" -np 2 "$qshard" train --config "$src/configs/tiny.yaml" --set device=cpu \
  --set batch.micro_batch_size=4611686018427387904 --set batch.global_batch_size=4611686018427387904
probe "train np2, epochs 1e12" 2 "qshard: error: .*epochs = 1000000000000" -- \
  "$@" -np 2 "$qshard" train --config "$src/configs/tiny.yaml" --set device=cpu --set steps=0 --set epochs=1000000000000

# ---- resources: a folder whose config.json says 10^9 layers over the 2-layer test model's weights ----
mkdir -p "$work/liar"
cp "$hf/tiny_llama_bf16/"* "$work/liar/"
sed -i 's/"num_hidden_layers": 2,/"num_hidden_layers": 1000000000,/' "$work/liar/config.json"
grep -q '"num_hidden_layers": 1000000000' "$work/liar/config.json" || { echo "could not edit the config"; exit 1; }
liar="num_hidden_layers = 1000000000.*does not describe these weights"
probe "quantize, config 1e9 layers" 2 "$liar" -- "$qshard" quantize "$work/liar" "$work/q_out"
probe "dequantize, config 1e9 layers" 2 "$liar" -- "$qshard" dequantize "$work/liar" "$work/d_out"
probe "eval, config 1e9 layers" 2 "$liar" -- "$qshard" eval --model "$work/liar" --data "$work/liar/config.json" --device cpu
probe "inspect --check, config 1e9 layers" 3 "problem: .*$liar" -- "$qshard" inspect --check --quiet "$work/liar"
[ ! -e "$work/q_out" ] && [ ! -e "$work/d_out" ] || { echo "FAIL: a refused command left its output folder"; fails=$((fails + 1)); }

# init-model: 10^9 layers (hundreds of TB on disk), and 70B widths (a 4.2 GB embedding tensor
# drawn in f32 does not fit in 4 GiB; on a small disk the disk check may speak first).
probe "init-model 1e9 layers" 2 "init-model .*num_hidden_layers = 1000000000.* writes about .* free" -- \
  "$qshard" init-model --layers 1000000000 --out "$work/i_out"
probe "init-model 70B widths" 2 "init-model (needs at least .* of host memory|.* writes about)" -- \
  "$qshard" init-model --layers 8 --hidden-size 8192 --intermediate-size 28672 --heads 64 --kv-heads 8 \
  --vocab-size 128256 --dtype bfloat16 --out "$work/i70_out"
# init-model --config of a job whose base is drawn in 4-bit (model.init.draw_4bit): no float model to write.
printf 'model:\n  init:\n    draw_4bit: true\n' > "$work/draw_4bit.yaml"
probe "init-model --config, draw_4bit" 2 "init-model --config .*draw_4bit.yaml: model.init.draw_4bit is true" -- \
  "$qshard" init-model --config "$work/draw_4bit.yaml" --out "$work/i_draw"
[ ! -e "$work/i_out" ] && [ ! -e "$work/i70_out" ] && [ ! -e "$work/i_draw" ] ||
  { echo "FAIL: init-model left its output folder"; fails=$((fails + 1)); }

# train on 2 ranks: a Llama-70B-shaped model.init, and model.path pointing at the lying folder.
"$qshard" tokenize "$src"/data/*.txt --out "$work/tiny.tok" > /dev/null
job=(train --config "$src/configs/tiny.yaml" --set device=cpu --set data.train="$work/tiny.tok" --set checkpoint.dir=none)
probe "train np2, 70B model.init" 2 "bad input: the job's model \(model.init\) needs at least .* of host memory" -- \
  "$@" -np 2 "$qshard" "${job[@]}" --set model.init.num_hidden_layers=80 --set model.init.hidden_size=8192 \
  --set model.init.intermediate_size=28672 --set model.init.num_attention_heads=64 --set model.init.num_key_value_heads=8
probe "train np2, CPU attention over 65536-token sequences" 2 \
  "bad input: the job's model \(model.init\) needs at least .* of host memory .*activations for micro_batch_size 4 x max_seq_len 65536" -- \
  "$@" -np 2 "$qshard" "${job[@]}" --set model.init.max_position_embeddings=65536 --set data.max_seq_len=65536 \
  --set batch.micro_batch_size=4
probe "train np2, model.path config 1e9 layers" 2 "bad input: .*$liar" -- \
  "$@" -np 2 "$qshard" "${job[@]}" --set model.path="$work/liar"
# lora.r 65536 (in range) on the tiny model: 612M LoRA parameters with AdamW's state do not fit in
# 4 GiB; the check counts them (the build failed an allocation: exit 1 and an abort banner).
probe "train, lora.r 65536" 2 "qshard: error: the job's model \(model.init\) needs at least .* of host memory .*LoRA r 65536 on 7 projections" -- \
  "$qshard" "${job[@]}" --set lora.r=65536

probe_summary "all probes refused cleanly"
