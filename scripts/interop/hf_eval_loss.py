#!/usr/bin/env python3
"""The loss `qshard eval` reports, computed by the Hugging Face stack: transformers (+ bitsandbytes
for a 4-bit folder, + PEFT for an adapter) on a .json list of token-id lists.

Each sequence's targets are its ids shifted by one (the last position has none), as qshard eval
and transformers' causal-LM loss do; the result is the mean over every target of every sequence.
Prints one JSON line: {"loss": ..., "tokens": ..., "model": ..., "adapter": ..., "device": ...}.

Usage: scripts/interop/hf_eval_loss.py --model DIR [--adapter DIR] --data X.json [--device cpu|cuda]
       [--dtype float32|bfloat16] [--compare-qshard LOSS --tol REL]
With --compare-qshard, exits 1 when |hf - qshard| > tol * hf (default tol 1e-2).
Needs: torch, transformers, bitsandbytes (4-bit folders), peft (adapters).
"""
import argparse
import json
import sys

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter")
    ap.add_argument("--data", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--compare-qshard", type=float)
    ap.add_argument("--tol", type=float, default=1e-2)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, args.dtype)
    model, info = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, output_loading_info=True,
                                                       device_map=args.device)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise SystemExit(f"{args.model}: {bad}")
    if args.adapter:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, args.adapter)
    model.eval()
    with open(args.data) as f:
        seqs = json.load(f)
    total, count = 0.0, 0
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s], device=args.device)
            logits = model(input_ids=ids).logits.float()[0, :-1]
            tgt = ids[0, 1:]
            total += torch.nn.functional.cross_entropy(logits, tgt, reduction="sum").item()
            count += tgt.numel()
    loss = total / count
    out = {"loss": loss, "tokens": count, "model": args.model, "adapter": args.adapter, "device": args.device,
           "dtype": args.dtype}
    rc = 0
    if args.compare_qshard is not None:
        rel = abs(loss - args.compare_qshard) / abs(loss)
        out.update({"qshard_loss": args.compare_qshard, "rel_diff": rel, "tol": args.tol, "ok": rel <= args.tol})
        rc = 0 if rel <= args.tol else 1
    print(json.dumps(out))
    return rc


if __name__ == "__main__":
    sys.exit(main())
