#!/usr/bin/env python3
"""Golden logits of the bf16-original bitsandbytes 4-bit folders as transformers + bitsandbytes 0.50.2
compute them in float32 on the CPU, for `qshard eval` (tests/infer/evaluate_test.cpp,
Eval.Bnb4FoldersMatchBitsandbytes).

For each folder (tests/data/hf/tiny_llama_bnb4_nf4_dq, tests/data/hf/tiny_llama_bnb4_fp4):
  transformers loads it with its bitsandbytes integration on the CPU (scripts/golden/bnb_reference.py
  bnb_model: the Linear4bit modules hold the folder's bytes and bf16 quant states, checked; their
  compute dtype is set to float32; the bf16 embeddings / norms / lm_head are widened to float32,
  exactly); logits = model(input_ids).logits, eager attention, deterministic algorithms, one thread.
  Linear4bit's forward is bitsandbytes' gemm_4bit: each weight is table value * absmax in float32,
  cast straight to the compute dtype (float32: not rounded to the quant state's bf16), then F.linear.
The script checks that bnb_reference.emulated_model (that rule written out) gives the same bits.

Output tests/data/model/bnb4_bf16_logits.golden.safetensors:
  input_ids        I64 [2, 16]   random ids (torch.Generator seed 3), vocab 128
  nf4_dq.logits    F32 [2, 16, 128]
  fp4.logits       F32 [2, 16, 128]
The script also prints, per folder: the float32-vs-float64 noise of the same computation, and the
difference to logits computed with the weights rounded to bf16 first (dequantize_4bit's values:
the rule of qshard before issue 27, and of bitsandbytes' backward), the gap a model with the wrong
forward rule shows.

Run from the repo root: python3 scripts/golden/make_bnb_logits_golden.py
With --check-cuda (on a machine with a GPU and bitsandbytes' CUDA library) it only compares
bitsandbytes' CUDA dequantize_4bit with the CPU reference above, weight by weight, and prints it.
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bnb_reference import bnb_model, dequantize_folder, emulated_model  # noqa: E402

HF = "tests/data/hf"
CASES = [("nf4_dq", "tiny_llama_bnb4_nf4_dq"), ("fp4", "tiny_llama_bnb4_fp4")]
OUT = "tests/data/model/bnb4_bf16_logits.golden.safetensors"
B, T, VOCAB = 2, 16, 128


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def check_cuda():
    for name, folder in CASES:
        ref = dequantize_folder(os.path.join(HF, folder))
        cuda = dequantize_folder(os.path.join(HF, folder), device="cuda")
        for k in sorted(ref):
            same = torch.equal(ref[k], cuda[k].cpu())
            print(f"{folder} {k} {tuple(ref[k].shape)} {ref[k].dtype}: CUDA dequantize_4bit "
                  f"{'==' if same else '!='} CPU reference")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-cuda", action="store_true")
    args = ap.parse_args()
    if args.check_cuda:
        check_cuda()
        return
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (B, T), generator=g)
    out = {"input_ids": ids.contiguous()}
    for name, folder in CASES:
        path = os.path.join(HF, folder)
        logits = logits_of(bnb_model(path), ids).float().contiguous()
        out[name + ".logits"] = logits
        scale = logits.abs().max().item()
        if not torch.equal(logits, logits_of(emulated_model(path), ids)):
            raise SystemExit(f"{folder}: bitsandbytes' forward is not the rule bnb_reference states")
        l64 = logits_of(emulated_model(path, torch.float64), ids)
        l_rounded = logits_of(emulated_model(path, forward_rounded=True), ids)
        gap = (logits - l_rounded).abs().max().item()
        print(f"{folder}: max|logit| {scale:.4f}; f32 vs f64 max|diff|/max|logit| "
              f"{(logits.double() - l64).abs().max().item() / scale:.2e}; weights rounded to bf16 first: "
              f"max|diff| {gap:.3e} = {gap / scale:.2e} of max|logit|")
    # One metadata key: safetensors writes several in no fixed order, and a rerun must give the same bytes.
    versions = "transformers %s, bitsandbytes %s, torch %s" % (
        __import__("transformers").__version__, __import__("bitsandbytes").__version__, torch.__version__)
    save_file(out, OUT, metadata={"versions": versions})
    print(OUT, {k: tuple(v.shape) for k, v in out.items()})


if __name__ == "__main__":
    main()
