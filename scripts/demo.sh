#!/usr/bin/env bash
# The main job on the embedded default: a tiny Llama (4-bit NF4 base, LoRA adapters) trained on the
# shipped public-domain text (data/, Jane Austen's Persuasion vol. 1) on the GPU when there is one
# (configs/tiny.yaml: device auto; two ranks share it through MPI), else the CPU backend, with
# `mpirun -np 2`, loss falling, metrics in build/runs/tiny/metrics.jsonl; then the quantization
# path: a random Llama folder quantized to the bitsandbytes 4-bit format transformers loads.
# The trained job exports the 4-bit base and the PEFT adapter; eval shows the adapter's effect;
# `qshard export` turns the newest resumable checkpoint (build/runs/tiny/ckpt/step-N) into merged
# bf16 weights. `--resume auto` continues a stopped run.
# QSHARD_DEMO_STEPS overrides the number of steps (default: configs/tiny.yaml's 200).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/qshard version

mkdir -p build/data
build/qshard tokenize data/*.txt --out build/data/tiny_train.tok
steps=()
[ -n "${QSHARD_DEMO_STEPS:-}" ] && steps=(--set "steps=${QSHARD_DEMO_STEPS}")
rm -rf build/runs/tiny
scripts/launch/single_node.sh 2 train --config configs/tiny.yaml "${steps[@]}"
echo "demo: training metrics in build/runs/tiny/metrics.jsonl (python3 scripts/plot_metrics.py draws them)"
# The exports: the bitsandbytes 4-bit base and the PEFT adapter, checked and evaluated.
final=build/runs/tiny/ckpt/final
build/qshard inspect --check --quiet "$final/base_bnb4"
head -c 2000 data/persuasion_vol1.txt > build/data/eval_sample.txt
build/qshard tokenize build/data/eval_sample.txt --out build/data/eval_sample.tok
build/qshard eval --model "$final/base_bnb4" --data build/data/eval_sample.tok --seq-len 128
build/qshard eval --model "$final/base_bnb4" --adapter "$final/adapter" --data build/data/eval_sample.tok --seq-len 128
echo "demo: base model in $final/base_bnb4, adapter in $final/adapter (transformers + peft load them)"
# The newest resumable checkpoint as merged bf16 weights (plain transformers loads them).
rm -rf build/runs/tiny/merged
scripts/launch/single_node.sh 2 export build/runs/tiny/ckpt --format merged --out build/runs/tiny/merged
build/qshard inspect --check --quiet build/runs/tiny/merged
build/qshard eval --model build/runs/tiny/merged --data build/data/eval_sample.tok --seq-len 128

out=${QSHARD_DEMO_DIR:-build/demo}
rm -rf "$out"
mkdir -p "$out"
build/qshard init-model --out "$out/tiny_llama" --layers 4 --hidden-size 256 --intermediate-size 768 --seed 1
build/qshard quantize "$out/tiny_llama" "$out/tiny_llama_nf4"
build/qshard inspect --check --quiet "$out/tiny_llama_nf4"
build/qshard dequantize "$out/tiny_llama_nf4" "$out/tiny_llama_nf4_dequantized"
echo "demo: folders under $out"
