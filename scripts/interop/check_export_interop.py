#!/usr/bin/env python3
"""Loads qshard exports in transformers + bitsandbytes + PEFT (CPU) and compares their logits.

Usage: check_export_interop.py BNB4_DIR PEFT_DIR MERGED_DIR [--tol REL]
       check_export_interop.py KEEP_DIR            (KEEP_DIR/{bnb4,peft,merged})

The folders come from `qshard::export_model`, e.g. kept by the export test:
  QSHARD_EXPORT_KEEP_DIR=/tmp/qx build/exp/tests/checkpoint/export_test --gtest_filter='*KeepForInterop*'
  python3 scripts/interop/check_export_interop.py /tmp/qx

Checks, on the same random token ids:
  1. f32 compute: bnb4 base (bitsandbytes Linear4bit, compute dtype float32, float tensors upcast)
     + PEFT adapter vs the merged bf16 weights upcast to float32. They differ by the bf16 rounding
     of the merged weights and by bitsandbytes' CPU 4-bit matmul precision; the check requires
     max|a - b| <= tol * max|b| (default tol 2e-2).
  0. the merged folder's weights equal bf16(bitsandbytes dequantize_4bit(W) + PEFT's delta
     scaling * B @ A) to within 1 bf16 ulp (f32 summation order of B @ A). The logits of an f32
     model holding the unrounded Python merge are printed too: they show how much of 1.'s
     difference is bitsandbytes' CPU 4-bit forward itself (it rounds like bf16 even with an f32
     compute dtype: measured 6e-3 relative on one layer) rather than the export.
  2. the adapter matters: the same bnb4 model with the adapter disabled is much further away
     (at least 5x the difference of 1.).
  3. bf16 compute (the dtypes the folders declare) is reported for information.
Prints the figures; exits 1 if a check fails. bitsandbytes' CPU forward needs row lengths that are
multiples of 64 (hidden 128 / intermediate 256 in the test model).
"""
import argparse
import os
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def load(path, dtype, **kw):
    """Loads a folder; every tensor of the model must come from the file (no missing or extra keys)."""
    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, output_loading_info=True, **kw)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise SystemExit(f"{path}: {bad}")
    return model.eval()


def load_bnb4(path, compute_dtype):
    # transformers loads a bnb folder in the dtype its config declares (bfloat16 here) whatever
    # `dtype` says; for the f32 comparison the float tensors (embeddings, norms, head) are upcast
    # (exact) and the 4-bit layers compute in f32 (their bf16 weights upcast exactly).
    model = load(path, compute_dtype, device_map="cpu")
    for m in model.modules():
        if type(m).__name__ == "Linear4bit":
            m.compute_dtype = compute_dtype
    for name, p in model.named_parameters():
        if type(p).__name__ != "Params4bit":
            p.data = p.data.to(compute_dtype)
    return model


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


def stats(a, b):
    d = (a - b).abs().max().item()
    return d, d / b.abs().max().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--tol", type=float, default=2e-2)
    args = ap.parse_args()
    if len(args.dirs) == 1:
        bnb4, peft, merged = (os.path.join(args.dirs[0], n) for n in ("bnb4", "peft", "merged"))
    elif len(args.dirs) == 3:
        bnb4, peft, merged = args.dirs
    else:
        ap.error("give KEEP_DIR or BNB4_DIR PEFT_DIR MERGED_DIR")

    torch.manual_seed(0)
    ref = load(merged, torch.float32)
    ids = torch.randint(0, ref.config.vocab_size, (2, 24))
    merged_f32 = logits(ref, ids)

    base = load_bnb4(bnb4, torch.float32)
    n4 = sum(1 for m in base.modules() if type(m).__name__ == "Linear4bit")
    model = PeftModel.from_pretrained(base, peft).eval()
    adapted_f32 = logits(model, ids)
    with model.disable_adapter():
        base_f32 = logits(model, ids)

    print(f"model: {n4} Linear4bit layers, logits {tuple(merged_f32.shape)}, max|merged| {merged_f32.abs().max().item():.4f}")
    # Merge in Python with bitsandbytes' own dequantization and PEFT's delta: the merged folder must
    # equal it rounded to bf16, and the f32 model with these weights must match the adapter path.
    import bitsandbytes.functional as bnbf
    # (A fresh model: bitsandbytes' CPU forward repacks the 4-bit data in place on first use, after
    # which dequantize_4bit no longer reads it right.)
    py = load(merged, torch.float32)
    fresh = PeftModel.from_pretrained(load_bnb4(bnb4, torch.float32), peft).eval()
    mods = dict(fresh.base_model.model.named_modules())
    ulp_off, n_w, n_diff, n_el = 0, 0, 0, 0
    for name, m in py.named_modules():
        if not isinstance(m, torch.nn.Linear) or name == "lm_head":
            continue
        lm = mods[name]
        w = bnbf.dequantize_4bit(lm.base_layer.weight.data, lm.base_layer.weight.quant_state).float()
        w = w + lm.get_delta_weight("default").float()
        stored = m.weight.data  # the merged folder's bf16 values, upcast
        ulp = torch.exp2(torch.floor(torch.log2(stored.abs().clamp_min(2.0**-126))) - 7)
        off = (w.to(torch.bfloat16).float() - stored).abs() / ulp
        ulp_off = max(ulp_off, off.max().item())
        n_diff += int((off > 0).sum().item())
        n_el += off.numel()
        m.weight.data.copy_(w)
        n_w += 1
    x_abs, x_rel = stats(adapted_f32, logits(py, ids))
    print(f"merged folder vs bf16(bitsandbytes dequant + PEFT delta), {n_w} weights: max {ulp_off:g} bf16 ulp apart "
          f"({n_diff} of {n_el} elements differ)")
    print(f"f32  bnb4+adapter vs Python f32 merge: max abs diff {x_abs:.3e}  rel {x_rel:.3e}")
    d_abs, d_rel = stats(adapted_f32, merged_f32)
    b_abs, b_rel = stats(base_f32, merged_f32)
    print(f"f32  bnb4+adapter vs merged : max abs diff {d_abs:.3e}  rel {d_rel:.3e}  (tol {args.tol:g})")
    print(f"f32  bnb4 (adapter off) vs merged: max abs diff {b_abs:.3e}  rel {b_rel:.3e}")

    ref16 = load(merged, torch.bfloat16)
    m16 = PeftModel.from_pretrained(load_bnb4(bnb4, torch.bfloat16), peft).eval()
    e_abs, e_rel = stats(logits(m16, ids), logits(ref16, ids))
    print(f"bf16 bnb4+adapter vs merged : max abs diff {e_abs:.3e}  rel {e_rel:.3e}  (information)")

    ok = n4 > 0 and d_rel <= args.tol and b_abs >= 5 * d_abs and ulp_off <= 1 and x_rel <= args.tol
    print("interop:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
