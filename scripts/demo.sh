#!/usr/bin/env bash
# The main job on the embedded default: a tiny Llama (4-bit NF4 base, LoRA adapters) trained on the
# shipped public-domain text (data/, Jane Austen's Persuasion vol. 1) on the CPU backend with
# `mpirun -np 2`, loss falling, metrics in build/runs/tiny/metrics.jsonl; then the quantization
# path: a random Llama folder quantized to the bitsandbytes 4-bit format transformers loads.
# (Exporting the trained adapter comes with the checkpoint/export work, issue 6.)
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
scripts/launch/single_node.sh 2 train --config configs/tiny.yaml "${steps[@]}"
echo "demo: training metrics in build/runs/tiny/metrics.jsonl (python3 scripts/plot_metrics.py draws them)"

out=${QSHARD_DEMO_DIR:-build/demo}
rm -rf "$out"
mkdir -p "$out"
build/qshard init-model --out "$out/tiny_llama" --layers 4 --hidden-size 256 --intermediate-size 768 --seed 1
build/qshard quantize "$out/tiny_llama" "$out/tiny_llama_nf4"
build/qshard inspect --check --quiet "$out/tiny_llama_nf4"
build/qshard dequantize "$out/tiny_llama_nf4" "$out/tiny_llama_nf4_dequantized"
echo "demo: folders under $out"
