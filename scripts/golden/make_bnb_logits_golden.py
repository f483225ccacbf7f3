#!/usr/bin/env python3
"""Golden logits of the bf16-original bitsandbytes 4-bit folders as transformers + bitsandbytes
compute them, for `qshard eval` (tests/infer/evaluate_test.cpp, Eval.Bnb4FoldersMatchBitsandbytes).

For each folder (tests/data/hf/tiny_llama_bnb4_nf4_dq, tests/data/hf/tiny_llama_bnb4_fp4):
  1. transformers loads it with its bitsandbytes integration on the CPU (AutoModelForCausalLM,
     device_map="cpu"): Linear4bit modules holding the stored bytes and quant states;
  2. every 4-bit weight W = bitsandbytes' dequantize_4bit in its stored dtype (bfloat16), see
     scripts/golden/bnb_reference.py (bitsandbytes' default-backend kernel; its native CPU kernel gives
     other values for the 96-column down_proj weights and is checked equal on the others);
     the script checks that the Linear4bit modules of step 1 hold exactly the folder's quant states;
  3. a float32 LlamaForCausalLM of the folder's config (attn_implementation="eager") gets
     float32(W) for the projections and the folder's bf16 embeddings / norms / lm_head widened to
     float32; logits = model(input_ids).logits, deterministic algorithms, one thread.
So the reference is "dequantize_4bit + float32 matmul": what bitsandbytes' forward multiplies with,
computed in float32 (its compute dtype only changes the precision of the matmul, not the weight).

Output tests/data/model/bnb4_bf16_logits.golden.safetensors:
  input_ids        I64 [2, 16]   random ids (torch.Generator seed 3), vocab 128
  nf4_dq.logits    F32 [2, 16, 128]
  fp4.logits       F32 [2, 16, 128]
The script also prints, per folder: the float32-vs-float64 noise of the same computation, and the
difference to logits computed with the weights dequantized to float32 instead (no bf16 rounding),
which is the gap a model that skips the rounding shows.

Run from the repo root: python3 scripts/golden/make_bnb_logits_golden.py
With --check-cuda (on a machine with a GPU and bitsandbytes' CUDA library) it only compares
bitsandbytes' CUDA dequantize_4bit with the CPU reference above, weight by weight, and prints it.
"""
import argparse
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bnb_reference import dequantize_folder  # noqa: E402

HF = "tests/data/hf"
CASES = [("nf4_dq", "tiny_llama_bnb4_nf4_dq"), ("fp4", "tiny_llama_bnb4_fp4")]
OUT = "tests/data/model/bnb4_bf16_logits.golden.safetensors"
B, T, VOCAB = 2, 16, 128


def check_transformers_load(folder, weights):
    """transformers' Linear4bit modules hold the folder's bytes and the quant states' dtype."""
    import bitsandbytes as bnb
    m = AutoModelForCausalLM.from_pretrained(folder, device_map="cpu")
    n = 0
    for name, mod in m.named_modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            key = name + ".weight"
            st = mod.weight.quant_state
            assert key in weights, key
            assert st.dtype == weights[key].dtype, (key, st.dtype)
            assert tuple(st.shape) == tuple(weights[key].shape), key
            n += 1
    assert n == len(weights), (n, len(weights))
    return m


def f32_model(folder, weights, dtype=torch.float32):
    cfg = json.load(open(os.path.join(folder, "config.json")))
    cfg.pop("quantization_config")
    cfg["dtype"] = "float32"
    config = LlamaConfig(**cfg)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).to(dtype).eval()
    sd = {}
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            if t.dtype in (torch.bfloat16, torch.float16, torch.float32) and k in model.state_dict():
                sd[k] = t.to(dtype)
    for k, w in weights.items():
        sd[k] = w.to(dtype)
    model.load_state_dict(sd, strict=True)
    return model


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
        native_ok = {}
        weights = dequantize_folder(path, report=native_ok)
        check_transformers_load(path, weights)
        logits = logits_of(f32_model(path, weights), ids).float().contiguous()
        out[name + ".logits"] = logits
        scale = logits.abs().max().item()
        l64 = logits_of(f32_model(path, weights, torch.float64), ids)
        f32w = dequantize_folder(path, dtype=torch.float32)
        l_f32w = logits_of(f32_model(path, f32w), ids)
        bad = sorted(k for k, ok in native_ok.items() if not ok)
        print(f"{folder}: {len(weights)} weights {sorted({str(w.dtype) for w in weights.values()})}; "
              f"max|logit| {scale:.4f}; f32 vs f64 max|diff|/max|logit| "
              f"{(logits.double() - l64).abs().max().item() / scale:.2e}; weights not rounded to bf16: "
              f"max|diff| {(logits - l_f32w).abs().max().item():.3e} = "
              f"{(logits - l_f32w).abs().max().item() / scale:.2e} of max|logit|; "
              f"bitsandbytes' native CPU kernel differs on {bad}")
    # One metadata key: safetensors writes several in no fixed order, and a rerun must give the same bytes.
    versions = "transformers %s, bitsandbytes %s, torch %s" % (
        __import__("transformers").__version__, __import__("bitsandbytes").__version__, torch.__version__)
    save_file(out, OUT, metadata={"versions": versions})
    print(OUT, {k: tuple(v.shape) for k, v in out.items()})


if __name__ == "__main__":
    main()
