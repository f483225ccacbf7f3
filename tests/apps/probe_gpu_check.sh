#!/usr/bin/env bash
# Hostile input on the GPU path (issue 25): what the CPU probes check, where the CUDA backend is the
# one that meets it - shapes the fused attention cannot take, budgets no plan fits or that are not
# numbers, NaN weights and a non-finite loss on the GPU, a tied model asked to keep its embedding
# table in host memory, a sequence longer than the model's positions, a device that is not there,
# a checkpoint cut short and resumed on the GPU. Each is refused with exit 2 (bad input) and a
# message naming the file, key or value (and the bytes, for memory); no crash, no hang, no
# "internal error". Every probe runs under a timeout (probe_lib.sh; no address-space limit: the
# CUDA driver reserves far more than it uses). Skips (exit 77) where no GPU answers.
# Usage: probe_gpu_check.sh QSHARD SOURCE_DIR WORK_DIR
set -uo pipefail
qshard=$1 src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fails=0
if ! "$qshard" version 2>/dev/null | grep -q "GPU present"; then
  echo "no CUDA device: skipped"
  exit 77
fi

PROBE_TIMEOUT=180
PROBE_VMEM_KB=unlimited
source "$(dirname "$0")/probe_lib.sh"

hf=$src/tests/data/hf
echo '[[1, 5, 3, 7, 2, 9, 4, 6]]' > "$work/ids.json"
"$qshard" tokenize "$src"/data/*.txt --out "$work/tiny.tok" > /dev/null || { echo "FAIL: tokenize"; exit 1; }
job=(train --config "$src/configs/tiny.yaml" --set device=cuda --set data.train="$work/tiny.tok"
     --set logging.metrics_jsonl="" --set data.eval_fraction=0 --set schedule.warmup_steps=0)

# ---- shapes the fused attention cannot take: refused up front, naming head_dim ----
"$qshard" init-model --out "$work/hd14" --hidden-size 56 --heads 4 --kv-heads 2 --intermediate-size 96 \
  --vocab-size 256 > /dev/null
probe "eval --device cuda, head_dim 14" 2 "head_dim.* 14 .*multiple of 8" -- \
  "$qshard" eval --model "$work/hd14" --data "$work/ids.json" --device cuda
probe "generate --device cuda, head_dim 14" 2 "head_dim.* 14 .*multiple of 8" -- \
  "$qshard" generate --model "$work/hd14" --prompt-ids 1,2 --max-new-tokens 2 --device cuda
probe "train device=cuda, head_dim 14" 2 "head_dim.* 14 .*multiple of 8" -- \
  "$qshard" "${job[@]}" --set model.path="$work/hd14" --set steps=2 --set checkpoint.dir=none
probe "bench --device cuda, head_dim 14" 2 "head_dim.* 14 .*multiple of 8" -- \
  "$qshard" bench --device cuda --preset tiny --hidden-size 56 --heads 4 --kv-heads 2 --steps 1 --warmup 0

# ---- memory budgets: none fits, or not a number ----
probe "train, a GPU budget no plan fits" 2 "memory.gpu_budget_gb = 0.01: no plan of this job fits 10.0 MB" -- \
  "$qshard" "${job[@]}" --set memory.gpu_budget_gb=0.01 --set steps=2 --set checkpoint.dir=none
for v in nan inf -1 1e300 abc; do
  probe "train, memory.gpu_budget_gb=$v" 2 "memory.gpu_budget_gb.*${v/e300/e\\+?300}" -- \
    "$qshard" "${job[@]}" --set memory.gpu_budget_gb=$v --set steps=2 --set checkpoint.dir=none
done
for v in nan -1 abc 1e300; do
  probe "bench --gpu-budget-gb $v" 2 "gpu-budget-gb.*$v" -- \
    "$qshard" bench --device cuda --preset tiny --steps 1 --warmup 0 --gpu-budget-gb $v
done
probe "train, a sequence no GPU holds" 2 "[0-9.]+ GB" -- \
  "$qshard" "${job[@]}" --set data.max_seq_len=16777216 --set model.init.max_position_embeddings=16777216 \
  --set steps=1 --set checkpoint.dir=none
probe "bench, a batch no GPU holds" 2 "[0-9.]+ GB" -- \
  "$qshard" bench --device cuda --preset 8b --batch 4096 --steps 1 --warmup 0

# ---- the embedding table in host memory on a tied model ----
"$qshard" init-model --out "$work/tied" --tie-embeddings --vocab-size 258 --max-positions 128 > /dev/null
probe "train, memory.embedding=host on a tied model" 2 "memory.embedding.*tie" -- \
  "$qshard" "${job[@]}" --set model.path="$work/tied" --set memory.embedding=host --set steps=2 --set checkpoint.dir=none
probe "train, memory.embedding=sideways" 2 "memory.embedding.*sideways" -- \
  "$qshard" "${job[@]}" --set memory.embedding=sideways --set steps=2 --set checkpoint.dir=none

# ---- NaN weights and a non-finite loss, on the GPU ----
cp -r "$hf/tiny_llama_bf16" "$work/nan"
W=model.layers.0.mlp.up_proj.weight
poke "$work/nan/model.safetensors" "$W" 6 '\xc0\x7f'
probe "eval --device cuda, a NaN weight" 2 "tensor '$W' holds 1 NaN/Inf" -- \
  "$qshard" eval --model "$work/nan" --data "$work/ids.json" --device cuda
# --allow-nonfinite lets the weight through and prints the loss as it comes (NaN: documented).
probe "eval --device cuda --allow-nonfinite, a NaN weight" 0 "loss nan" -- \
  "$qshard" eval --model "$work/nan" --data "$work/ids.json" --device cuda --allow-nonfinite
probe "generate --device cuda, a NaN weight" 2 "tensor '$W' holds 1 NaN/Inf" -- \
  "$qshard" generate --model "$work/nan" --prompt-ids 1,2 --max-new-tokens 2 --device cuda

# ---- generation and evaluation lengths ----
# generation stops at the model's last position and says so (exit 0: what it made is the answer)
probe "generate --device cuda past the positions" 0 "max_position_embeddings \\(128\\) is reached" -- \
  "$qshard" generate --model "$hf/tiny_llama_bf16" --prompt-ids 1,2 --max-new-tokens 100000000 --device cuda
probe "eval --device cuda --seq-len past the positions" 2 "seq-len.*1073741824|1073741824.*position" -- \
  "$qshard" eval --model "$work/tied" --data "$work/tiny.tok" --seq-len 1073741824 --device cuda

# ---- a device that is not there ----
probe "train, CUDA_VISIBLE_DEVICES empty" 2 "no CUDA GPU is visible" -- \
  env CUDA_VISIBLE_DEVICES= "$qshard" "${job[@]}" --set steps=2 --set checkpoint.dir=none
probe "eval, CUDA_VISIBLE_DEVICES empty" 2 "no CUDA GPU is visible" -- \
  env CUDA_VISIBLE_DEVICES= "$qshard" eval --model "$hf/tiny_llama_bf16" --data "$work/ids.json" --device cuda

# ---- a checkpoint cut short, resumed on the GPU: refused naming the file, the earlier one kept ----
ck=$work/ckpt
"$qshard" "${job[@]}" --set steps=4 --set checkpoint.dir="$ck" --set checkpoint.every_steps=2 > "$work/ck.log" 2>&1 ||
  { echo "FAIL: the checkpointed job"; tail -5 "$work/ck.log"; fails=$((fails + 1)); }
last=$(ls -d "$ck"/step-* 2>/dev/null | sort | tail -1)
if [ -n "$last" ]; then
  f=$(ls "$last"/*.safetensors 2>/dev/null | head -1)
  [ -n "$f" ] && truncate -s $(($(stat -c %s "$f") / 2)) "$f"
  probe "resume on the GPU from a truncated checkpoint" 2 "$(basename "$last")" -- \
    "$qshard" "${job[@]}" --set steps=6 --set checkpoint.dir="$ck" --set checkpoint.every_steps=2 --set checkpoint.resume=auto
else
  echo "FAIL: no checkpoint folder under $ck"; ls -R "$ck" | head; fails=$((fails + 1))
fi

probe_summary "gpu probes ok"
