#!/usr/bin/env bash
# The main job on the embedded default. Until the training loop lands this is the quantization
# path end to end: make a small random Llama folder, quantize it to the bitsandbytes 4-bit format
# transformers loads, print the quantization error, and dequantize it back to bf16.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
out=${QSHARD_DEMO_DIR:-build/demo}
rm -rf "$out"
mkdir -p "$out"
build/qshard version
build/qshard init-model --out "$out/tiny_llama" --layers 4 --hidden-size 256 --intermediate-size 768 --seed 1
build/qshard quantize "$out/tiny_llama" "$out/tiny_llama_nf4"
build/qshard dequantize "$out/tiny_llama_nf4" "$out/tiny_llama_nf4_dequantized"
echo "demo: folders under $out"
