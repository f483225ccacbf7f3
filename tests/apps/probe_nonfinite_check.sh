#!/usr/bin/env bash
# Non-finite weights and insane quant states through the CLI (issue 25): a NaN in a bf16 projection,
# an Inf in a norm, a NaN nested_absmax, a nested_offset of 1e308 and a quant-state shape of
# [2^40, 2^40] - eval, generate, train (model.path, lora.init_adapter), dequantize and inspect --check refuse each with
# exit 2 (inspect --check: 3) and a message naming the tensor (and field, first index, count);
# --allow-nonfinite lets the NaN weight through eval, generate and dequantize. Every probe runs
# under a 4 GiB address-space limit and a 60 s timeout, as tests/apps/probe_suite_check.sh's do.
# The unit tests, with the mutations they catch: tests/checkpoint/nonfinite_test.cpp.
# Usage: probe_nonfinite_check.sh QSHARD SOURCE_DIR WORK_DIR
set -uo pipefail
qshard=$1 src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
hf=$src/tests/data/hf
fails=0

# probe NAME EXPECTED_EXIT PATTERN -- command...: runs the command under the limits (probe_lib.sh).
source "$(dirname "$0")/probe_lib.sh"

# packed_json FILE JSON: the first packed quant state in FILE replaced by JSON, padded with spaces
# to the same length (so no header changes).
packed_json() {
  NEW=$2 perl -0777 -pi -e 's/\{"quant_type"[^}]*\}/my $o = $&; length($ENV{NEW}) <= length($o) or die "too long"; $ENV{NEW} . " " x (length($o) - length($ENV{NEW}))/e' "$1"
}

echo '[[1, 5, 3, 7]]' > "$work/ids.json"
W=model.layers.0.mlp.up_proj.weight

# ---- a NaN in a bf16 projection (element 3) and an Inf in model.norm.weight (element 0) ----
cp -r "$hf/tiny_llama_bf16" "$work/nan"
poke "$work/nan/model.safetensors" "$W" 6 '\xc0\x7f'
msg="nan/model.safetensors: tensor '$W' holds 1 NaN/Inf values \(the first at flat index 3\)"
probe "eval, a NaN weight" 2 "$msg" -- "$qshard" eval --model "$work/nan" --data "$work/ids.json" --device cpu
probe "generate, a NaN weight" 2 "$msg" -- "$qshard" generate --model "$work/nan" --prompt-ids 1,2 --max-new-tokens 2 --device cpu
probe "inspect --check, a NaN weight" 3 "problem: .*$msg" -- "$qshard" inspect --check --quiet "$work/nan"
# The same file alone, and in a folder without config.json (an adapter's form): checked as well.
probe "inspect --check, a NaN weight's file" 3 "problem: tensor '$W' holds 1 NaN/Inf values \(the first at flat index 3\)" -- \
  "$qshard" inspect --check --quiet "$work/nan/model.safetensors"
mkdir -p "$work/nan_alone" && cp "$work/nan/model.safetensors" "$work/nan_alone/adapter_model.safetensors"
probe "inspect --check, a NaN weight in a folder without config.json" 3 "problem: tensor '$W' holds 1 NaN/Inf" -- \
  "$qshard" inspect --check --quiet "$work/nan_alone"
probe "quantize, a NaN weight" 2 "tensor '$W' holds 1 NaN/Inf values \(the first at flat index 3\)" -- \
  "$qshard" quantize --cpu "$work/nan" "$work/nan_q"
# The inputs are checked before the model loads, so the jobs get a token file that is there but is
# not one (1 byte): the job stops at it after the model build (issue 26).
printf x > "$work/bad.tok"
probe "train model.path, a NaN weight" 2 "$msg" -- "$qshard" train --config "$src/configs/tiny.yaml" \
  --set device=cpu --set model.path="$work/nan" --set steps=10 --set checkpoint.dir="$work/nan_ckpt" \
  --set data.train="$work/bad.tok"
# With the flag the model builds (the line after the load) and the job stops at the bad token file.
probe "train --allow-nonfinite" 2 "model build: load" -- "$qshard" train --config "$src/configs/tiny.yaml" \
  --allow-nonfinite --set device=cpu --set model.path="$work/nan" --set steps=10 --set checkpoint.dir="$work/nan_ckpt" \
  --set data.train="$work/bad.tok"
probe "eval --allow-nonfinite" 0 "eval: 1 sequences" -- \
  "$qshard" eval --model "$work/nan" --data "$work/ids.json" --device cpu --allow-nonfinite
probe "generate --allow-nonfinite" 0 "." -- \
  "$qshard" generate --model "$work/nan" --prompt-ids 1,2 --max-new-tokens 2 --device cpu --allow-nonfinite
cp -r "$hf/tiny_llama_f32" "$work/inf"
poke "$work/inf/model.safetensors" model.norm.weight 0 '\x00\x00\x80\xff'
probe "eval, an Inf norm" 2 "tensor 'model.norm.weight' holds 1 NaN/Inf values \(the first at flat index 0\)" -- \
  "$qshard" eval --model "$work/inf" --data "$work/ids.json" --device cpu

# ---- a NaN in lora.init_adapter (the adapter a training job starts from; element 2 of a lora_A) ----
cp -r "$src/tests/data/model/nf4_adapter" "$work/nan_adapter"
A=model.layers.0.self_attn.q_proj.lora_A.weight
poke "$work/nan_adapter/adapter_model.safetensors" "base_model.model.$A" 8 '\x00\x00\xc0\x7f'
adapter_job=(train --config "$src/configs/tiny.yaml" --set device=cpu --set model.path="$hf/tiny_llama_bnb4_nf4_dq"
             --set lora.r=4 --set lora.alpha=8 --set lora.init_adapter="$work/nan_adapter"
             --set checkpoint.dir="$work/adapter_ckpt" --set data.train="$work/bad.tok")
probe "train lora.init_adapter, a NaN" 2 \
  "nan_adapter/adapter_model.safetensors: tensor '$A' holds 1 NaN/Inf values \(the first at flat index 2\)" -- \
  "$qshard" "${adapter_job[@]}"
probe "train lora.init_adapter --allow-nonfinite" 2 "model build: load" -- "$qshard" "${adapter_job[@]}" --allow-nonfinite

# ---- 4-bit statistics: a NaN nested_absmax, a nested_offset of 1e308 ----
Q=model.layers.0.self_attn.q_proj.weight
cp -r "$hf/tiny_llama_bnb4_nf4_dq" "$work/nested"
poke "$work/nested/model.safetensors" "$Q.nested_absmax" 0 '\x00\x00\xc0\x7f'
msg="'$Q': nested_absmax\[0\] = NaN"
probe "eval, a NaN nested_absmax" 2 "$msg" -- "$qshard" eval --model "$work/nested" --data "$work/ids.json" --device cpu
probe "generate, a NaN nested_absmax" 2 "$msg" -- "$qshard" generate --model "$work/nested" --prompt-ids 1,2 --device cpu
probe "dequantize, a NaN nested_absmax" 2 "$msg" -- "$qshard" dequantize "$work/nested" "$work/nested_d"
[ ! -e "$work/nested_d" ] || { echo "FAIL: dequantize left output for a NaN nested_absmax"; fails=$((fails + 1)); }
probe "inspect --check, a NaN nested_absmax" 3 "problem: .*$msg" -- "$qshard" inspect --check --quiet "$work/nested"
probe "dequantize --allow-nonfinite" 0 "dequantized 14 weights" -- \
  "$qshard" dequantize --allow-nonfinite "$work/nested" "$work/nested_d2"
cp -r "$hf/tiny_llama_bnb4_nf4_dq" "$work/offset"
packed_json "$work/offset/model.safetensors" \
  '{"quant_type":"nf4","blocksize":64,"dtype":"bfloat16","shape":[64,96],"nested_blocksize":256,"nested_dtype":"float32","nested_offset":1e308}'
probe "eval, nested_offset 1e308" 2 "nested_offset = Infinity" -- \
  "$qshard" eval --model "$work/offset" --data "$work/ids.json" --device cpu
probe "dequantize, nested_offset 1e308" 2 "nested_offset = Infinity" -- "$qshard" dequantize "$work/offset" "$work/offset_d"

# ---- a quant-state shape of [2^40, 2^40]: an input error naming the field, not an internal one ----
cp -r "$hf/tiny_llama_bnb4_nf4_dq" "$work/shape"
packed_json "$work/shape/model.safetensors" \
  '{"quant_type":"nf4","blocksize":64,"dtype":"bfloat16","shape":[1099511627776,1099511627776],"nested_blocksize":256,"nested_dtype":"float32","nested_offset":0.5}'
msg="packed quant state field \"shape\" \[1099511627776,1099511627776\] holds more than"
probe "eval, shape [2^40, 2^40]" 2 "$msg" -- "$qshard" eval --model "$work/shape" --data "$work/ids.json" --device cpu
probe "dequantize, shape [2^40, 2^40]" 2 "$msg" -- "$qshard" dequantize "$work/shape" "$work/shape_d"
probe "inspect --check, shape [2^40, 2^40]" 3 "problem: .*$msg" -- "$qshard" inspect --check --quiet "$work/shape"

# ---- finite weights and config values whose numbers overflow: refused, not a NaN loss with exit 0 ----
cp -r "$hf/tiny_llama_bf16" "$work/huge"
poke "$work/huge/model.safetensors" model.norm.weight 0 '\x7f\x7f'  # 3.39e38 in the last norm and the head:
poke "$work/huge/model.safetensors" lm_head.weight 0 '\x7f\x7f'     # finite, and their product overflows f32
probe "eval, finite weights giving a non-finite loss" 2 "the evaluation loss over 3 tokens .* is -?(nan|inf).*non-finite logits" -- \
  "$qshard" eval --model "$work/huge" --data "$work/ids.json" --device cpu
cp -r "$hf/tiny_llama_bf16" "$work/theta"
sed -i 's/"rope_theta": 10000.0/"rope_theta": 1e-300/' "$work/theta/config.json"
probe "eval, rope_theta 1e-300" 2 "config.json.*rope_theta.* is 1e-300; expected a finite number of at least 1" -- \
  "$qshard" eval --model "$work/theta" --data "$work/ids.json" --device cpu
cp -r "$hf/tiny_llama_bf16" "$work/eos"
sed -i 's/"eos_token_id": [0-9]*/"eos_token_id": 1099511627776/' "$work/eos/config.json"
probe "generate, eos_token_id outside the vocabulary" 2 "eos_token_id.* holds 1099511627776, outside the vocabulary" -- \
  "$qshard" generate --model "$work/eos" --prompt-ids 1,2 --max-new-tokens 2 --device cpu

probe_summary "nonfinite probes ok"
