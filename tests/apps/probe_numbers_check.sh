#!/usr/bin/env bash
# Every number from a user (issue 25): command-line numbers of generate, quantize, dequantize,
# export, init-model, eval and bench, and the environment variables QSHARD_COLLECTIVE_TIMEOUT_S and
# QSHARD_HOST_MEMORY_BYTES - junk, fractions or exponents for integers, NaN, infinity, overflow
# and values outside the range are refused with exit 2 and a message naming the flag or variable,
# the value and the range (runtime/numbers.h), before anything is written (no output folder);
# a bad command line (unknown flag, missing value, missing required option) exits 2 with CLI11's
# message and its --help hint. A temperature below 1e-4 is greedy (the same ids as 0). Every probe
# runs under a 4 GiB address-space limit (ulimit -v) and a 60 s timeout, as
# tests/apps/probe_suite_check.sh's do; the parser's unit test: tests/runtime/numbers_test.cpp.
# Usage: probe_numbers_check.sh QSHARD SOURCE_DIR WORK_DIR
set -uo pipefail
qshard=$1 src=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fails=0

# probe NAME EXPECTED_EXIT PATTERN -- command...: runs the command under the limits (probe_lib.sh),
# its output joined into one line: a pattern may span CLI11's message and its hint.
PROBE_ONE_LINE=1
source "$(dirname "$0")/probe_lib.sh"
# absent PATH: the refused command left nothing there.
absent() { [ ! -e "$1" ] || { echo "FAIL: $1 was written by a refused command"; fails=$((fails + 1)); }; }

hf=$src/tests/data/hf
echo '[[1, 5, 3, 7]]' > "$work/ids.json"
gen=("$qshard" generate --model "$hf/tiny_llama_bf16" --prompt-ids 1,5,3 --device cpu)

# ---- generate: --max-new-tokens, sampling ----
for v in abc 1.5 1e12 9223372036854775807 -1 ""; do
  probe "generate --max-new-tokens '$v'" 2 "--max-new-tokens '$v': .*expected an integer in \[0, 1073741824\]" -- \
    "${gen[@]}" --max-new-tokens "$v"
done
for v in -1 101 nan inf 1e999 0.5x; do
  probe "generate --temperature '$v'" 2 "--temperature '$v': .*expected a number in \[0, 100\]" -- \
    "${gen[@]}" --temperature "$v"
done
for v in -1 1.5 abc 16777217; do
  probe "generate --top-k '$v'" 2 "--top-k '$v': .*expected an integer in \[0, 16777216\]" -- "${gen[@]}" --top-k "$v"
done
for v in 0 -0.1 1.5 nan; do
  probe "generate --top-p '$v'" 2 "--top-p '$v': .*expected a number in \(0, 1\]" -- "${gen[@]}" --top-p "$v"
done
probe "generate --prompt-ids 1,x" 2 "--prompt-ids \(ids like 1,2,3\) 'x': not an integer" -- \
  "$qshard" generate --model "$hf/tiny_llama_bf16" --prompt-ids 1,x --device cpu
probe "generate --prompt-ids 1,99999999999999999999" 2 "'99999999999999999999': out of range" -- \
  "$qshard" generate --model "$hf/tiny_llama_bf16" --prompt-ids 1,99999999999999999999 --device cpu
probe "generate --seed -1" 2 "--seed '-1': expected an integer in \[0, 9223372036854775807\]" -- "${gen[@]}" --seed -1
# A temperature far below float's range is greedy: the same ids as temperature 0 (not the last id).
probe "generate --temperature 0" 0 "new tokens" -- "${gen[@]}" --max-new-tokens 6 --json "$work/t0.json"
probe "generate --temperature 1e-39" 0 "new tokens" -- "${gen[@]}" --max-new-tokens 6 --temperature 1e-39 \
  --json "$work/t_tiny.json"
# ids FILE: the "ids" list of a --json file, on one line (the file spreads it over lines).
ids() { tr -d ' \n' < "$1" | grep -o '"ids":\[[0-9,]*\]'; }
if [ -z "$(ids "$work/t0.json")" ] || [ "$(ids "$work/t0.json")" != "$(ids "$work/t_tiny.json")" ]; then
  echo "FAIL: --temperature 1e-39 did not give the greedy ids: $(ids "$work/t_tiny.json") vs $(ids "$work/t0.json")"
  fails=$((fails + 1))
else
  echo "ok   --temperature 1e-39 gives the greedy ids $(ids "$work/t0.json")"
fi

# More new tokens than the model has positions: the stop is said (it was silent), naming
# max_position_embeddings; --json records it.
probe "generate past max_position_embeddings" 0 \
  "stopped after 126 of --max-new-tokens 500 new tokens: the model's max_position_embeddings \(128\) is reached" -- \
  "${gen[@]}" --max-new-tokens 500 --ignore-eos --json "$work/maxpos.json"
grep -q '"stopped_at_max_positions": true' "$work/maxpos.json" ||
  { echo "FAIL: --json lacks stopped_at_max_positions: true"; fails=$((fails + 1)); }

# init-model's folder loads in generate at any vocabulary: no end token (2) outside a vocabulary of
# 2 (generate refuses an eos_token_id that is not a token id).
"$qshard" init-model --vocab-size 2 --layers 1 --hidden-size 16 --intermediate-size 32 --heads 2 --kv-heads 1 \
  --out "$work/vocab2" > /dev/null
probe "generate, init-model --vocab-size 2" 0 "2 new tokens" -- \
  "$qshard" generate --model "$work/vocab2" --prompt-ids 1 --max-new-tokens 2 --device cpu

# ---- --max-shard-size-gb: quantize, dequantize, export; nothing written ----
for v in 0 -1 nan inf 1e-12 2e6 abc; do
  probe "quantize --max-shard-size-gb '$v'" 2 "--max-shard-size-gb '$v': .*expected a number in \[1e-06, 1e\+06\]" -- \
    "$qshard" quantize "$hf/tiny_llama_bf16" "$work/q_$v" --max-shard-size-gb "$v"
  absent "$work/q_$v"
  probe "dequantize --max-shard-size-gb '$v'" 2 "--max-shard-size-gb '$v': .*expected a number in \[1e-06, 1e\+06\]" -- \
    "$qshard" dequantize "$hf/tiny_llama_bnb4_nf4_dq" "$work/dq_$v" --max-shard-size-gb "$v"
  absent "$work/dq_$v"
  probe "export --max-shard-size-gb '$v'" 2 "--max-shard-size-gb '$v': .*expected a number in \[1e-06, 1e\+06\]" -- \
    "$qshard" export "$work/no_ckpt" --out "$work/ex_$v" --max-shard-size-gb "$v"
  absent "$work/ex_$v"
done
probe "export --max-shard-size 0 (the older name)" 2 "--max-shard-size-gb '0': expected a number" -- \
  "$qshard" export "$work/no_ckpt" --out "$work/ex_old" --max-shard-size 0
# The smallest cap works: each tensor in a file of its own.
probe "dequantize --max-shard-size-gb 1e-6" 0 "" -- \
  "$qshard" dequantize "$hf/tiny_llama_bnb4_nf4_dq" "$work/dq_small" --max-shard-size-gb 1e-6
[ -f "$work/dq_small/model.safetensors.index.json" ] || { echo "FAIL: no index for 1e-6 GB shards"; fails=$((fails + 1)); }

# ---- other command-line numbers ----
probe "quantize --blocksize 1.5" 2 "--blocksize '1.5': not an integer; expected an integer in \[32, 4096\]" -- \
  "$qshard" quantize "$hf/tiny_llama_bf16" "$work/q_bs" --blocksize 1.5
probe "quantize --threads 0" 2 "--threads '0': expected an integer in \[1, 256\]" -- \
  "$qshard" quantize "$hf/tiny_llama_bf16" "$work/q_th" --threads 0
absent "$work/q_bs"
probe "init-model --layers 0" 2 "--layers '0': expected an integer in \[1, 2147483647\]" -- "$qshard" init-model --out "$work/im" --layers 0
probe "init-model --heads 2147483648" 2 "--heads '2147483648': expected an integer in \[1, 2147483647\]" -- \
  "$qshard" init-model --out "$work/im" --heads 2147483648
probe "init-model --vocab-size 1e3" 2 "--vocab-size '1e3': not an integer" -- "$qshard" init-model --out "$work/im" --vocab-size 1e3
absent "$work/im"
probe "eval --seq-len 0x10" 2 "--seq-len '0x10': not an integer" -- \
  "$qshard" eval --model "$hf/tiny_llama_bf16" --data "$work/ids.json" --seq-len 0x10
for o in "--vocab-size -5" "--hidden-size -1" "--batch 0" "--seq-len 1.5" "--steps nan" "--warmup -1" "--micro-batch -2" \
         "--keep-layers -2" "--mlp-chunk-tokens -3" "--gpu-budget-gb inf" "--rank 0"; do
  set -- $o
  probe "bench $o" 2 "$1 '$2': .*expected (an integer|a number) in" -- "$qshard" bench --preset tiny --device cpu "$1" "$2"
done

# ---- environment variables ----
for v in 0.001 -1 nan 1e9 10s; do
  probe "QSHARD_COLLECTIVE_TIMEOUT_S=$v" 2 "QSHARD_COLLECTIVE_TIMEOUT_S '$v': .*expected a number in \[1, 86400\] \(or 0: the watchdog off\)" -- \
    env QSHARD_COLLECTIVE_TIMEOUT_S="$v" "$qshard" bench --preset tiny --device cpu --steps 1 --warmup 0 --seq 32
done
probe "QSHARD_COLLECTIVE_TIMEOUT_S=0 (off)" 0 "tokens/s" -- \
  env QSHARD_COLLECTIVE_TIMEOUT_S=0 "$qshard" bench --preset tiny --device cpu --steps 1 --warmup 0 --seq 32
probe "QSHARD_HOST_MEMORY_BYTES=12abc" 2 "QSHARD_HOST_MEMORY_BYTES '12abc': not a number" -- \
  env QSHARD_HOST_MEMORY_BYTES=12abc "$qshard" eval --model "$hf/tiny_llama_bf16" --data "$work/ids.json" --device cpu

# ---- a bad command line: exit 2 with CLI11's message and the --help hint ----
probe "unknown flag" 2 "--bogus.*Run with --help" -- "${gen[@]}" --bogus
probe "missing value" 2 "--max-new-tokens.*Run with --help" -- "${gen[@]}" --max-new-tokens
probe "missing required" 2 "--model is required.*|--model.*required" -- "$qshard" generate --prompt hi
probe "bad --device" 2 "--device.*Run with --help" -- "${gen[@]}" --device tpu
probe "no subcommand" 2 "subcommand.*Run with --help|Run with --help" -- "$qshard"
probe "unknown command" 2 "qshard: error: unknown command 'frobnicate' \(one of version, .*\).*Run with --help" -- \
  "$qshard" --log-level warn frobnicate --x
probe "--prompt-ids 1, (a trailing comma)" 2 "--prompt-ids \(ids like 1,2,3\) '': empty" -- \
  "$qshard" generate --model "$hf/tiny_llama_bf16" --prompt-ids 1, --device cpu
probe "--help" 0 "--max-new-tokens INT .*\[0, 1073741824\]" -- "$qshard" generate --help

probe_summary "number probes ok"
