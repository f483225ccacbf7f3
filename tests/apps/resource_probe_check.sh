#!/usr/bin/env bash
# Resource probes (issue 13): models this machine cannot hold, and configs that do not describe
# their weights, are refused up front with exit 2 and a message naming the keys and the bytes -
# no crash, no hang, no out-of-memory kill. Every probe runs under a 4 GiB address-space limit
# (ulimit -v) and a timeout; exit 124 (timeout) or >= 128 (a signal) fails the probe.
# Usage: resource_probe_check.sh QSHARD SOURCE_DIR WORK_DIR MPIEXEC [mpiexec flags...]
set -uo pipefail
qshard=$1 src=$2 work=$3
shift 3
rm -rf "$work" && mkdir -p "$work"
fails=0

# probe NAME EXPECTED_EXIT PATTERN -- command...: runs the command under the limits.
probe() {
  local name=$1 want=$2 pattern=$3
  shift 4
  local out rc
  out=$( (ulimit -v 4194304; timeout 120 "$@") 2>&1)
  rc=$?
  if [ "$rc" != "$want" ] || ! grep -Eq "$pattern" <<< "$out"; then
    echo "FAIL $name: exit $rc (want $want), pattern '$pattern'"
    echo "$out" | grep -v "^  " | tail -8
    fails=$((fails + 1))
  else
    echo "ok   $name: exit $rc: $(grep -Eo "$pattern.{0,80}" <<< "$out" | head -1)"
  fi
}

# A folder whose config.json says 10^9 layers over the 2-layer test model's weights.
mkdir -p "$work/liar"
cp "$src/tests/data/hf/tiny_llama_bf16/"* "$work/liar/"
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
[ ! -e "$work/i_out" ] && [ ! -e "$work/i70_out" ] || { echo "FAIL: init-model left its output folder"; fails=$((fails + 1)); }

# train on 2 ranks: a Llama-70B-shaped model.init, and model.path pointing at the lying folder.
"$qshard" tokenize "$src"/data/*.txt --out "$work/tiny.tok" > /dev/null
job=(train --config "$src/configs/tiny.yaml" --set device=cpu --set data.train="$work/tiny.tok" --set checkpoint.dir="")
probe "train np2, 70B model.init" 2 "bad input: the job's model \(model.init\) needs at least .* of host memory" -- \
  "$@" -np 2 "$qshard" "${job[@]}" --set model.init.num_hidden_layers=80 --set model.init.hidden_size=8192 \
  --set model.init.intermediate_size=28672 --set model.init.num_attention_heads=64 --set model.init.num_key_value_heads=8
probe "train np2, model.path config 1e9 layers" 2 "bad input: .*$liar" -- \
  "$@" -np 2 "$qshard" "${job[@]}" --set model.path="$work/liar"

[ "$fails" = 0 ] || { echo "$fails probe(s) failed"; exit 1; }
echo "all resource probes refused cleanly"
