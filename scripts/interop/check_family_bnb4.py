#!/usr/bin/env python3
"""transformers + bitsandbytes load qshard's bnb 4-bit folder of each model family (CPU).

For each of tests/data/family/{qwen2,qwen3,mistral,gemma2,gemma3}: `qshard quantize` writes a bnb4 folder; this
script loads it with AutoModelForCausalLM (bitsandbytes' Linear4bit from qshard's bytes), checks
that its config keeps the family (model_type, biases, q/k norms, sliding_window) and that every
4-bit weight, dequantized by bitsandbytes, equals the one dequantized by qshard (`qshard
dequantize` of the same folder), then runs a forward where bitsandbytes' CPU path allows it and
compares its logits with a float32 model holding the dequantized weights.
On an AVX-512 CPU bitsandbytes 0.50.2's native CPU dequant reads the absmax per row (wrong where a
row is not a whole number of blocks: docs/FORMATS_NOTES.md item 8), and its AVX512-BF16 repacking
fails on these widths; so the weights are dequantized with bitsandbytes' own torch implementation
(backends/default/ops.py), Linear4bit's CPU gemm_4bit is routed to it, the repacking is off, and the
native kernel must agree wherever rows are whole blocks. Measured 2026-12-06 (7b03e7c, transformers
5.25.0, bitsandbytes 0.50.2, AVX-512 host): all five families' 4-bit weights equal qshard's
dequantization and the forward equals the dequantized f32 model's (0.0); transformers + bitsandbytes'
own folder of qwen2 has qshard's bytes but for a one-ulp nested_offset on 4 of 14 weights.
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
FAMILIES = ("qwen2", "qwen3", "mistral", "gemma2", "gemma3")
MODEL_TYPE = {"gemma3": "gemma3_text"}  # folder -> config.json's model_type where they differ

import bitsandbytes.functional as F  # noqa: E402
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute  # noqa: E402
from bitsandbytes.backends.utils import _get_4bit_code  # noqa: E402

# bitsandbytes 0.50.2's native CPU 4-bit dequant (csrc/cpu_ops.cpp dequantizeBlockwise4bitCpu), on a CPU
# with AVX-512F and a last dim that is a multiple of 16, indexes absmax per row
# (absmax[row * (K / blocksize) + col / blocksize]): wrong unless K % blocksize == 0 (K = 32, 48, 96 with
# blocksize 64: every tiny-family projection but down_proj). Its flat torch implementation
# (backends/default/ops.py _dequantize_4bit_compute, the format's rule) is the reference; the CPU
# kernel is routed to it for the forward.
NATIVE_DQ = torch.ops.bitsandbytes.dequantize_4bit.default


def absmax_of(st):
    if st.nested:  # as dequantize_4bit / gemm_4bit rebuild it: f32(f32(code8 * nested_absmax) + offset)
        return (F.dequantize_blockwise(st.absmax, st.state2) + st.offset,)
    return (st.absmax,)


def flat_dq(A, absmax, blocksize, quant_type, shape, dtype):
    A = A.view(torch.uint8) if A.dtype != torch.uint8 else A
    return _dequantize_4bit_compute(A.reshape(-1), absmax.float(), _get_4bit_code(quant_type, A.device),
                                    blocksize, shape, dtype)


def flat_gemm_4bit(A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None, absmax_code=None,
                   absmax_offset=None):  # backends/default/ops.py _gemm_4bit_default_impl, its dequant flat
    if absmax_8bit is not None:
        absmax = torch.ops.bitsandbytes.dequantize_blockwise.default(absmax_8bit, absmax, absmax_code, 256,
                                                                     torch.float32) + absmax_offset
    return torch.nn.functional.linear(A, flat_dq(B, absmax, blocksize, quant_type, shapeB, A.dtype), bias)


torch.library.register_kernel("bitsandbytes::gemm_4bit", "cpu", flat_gemm_4bit)  # Linear4bit's CPU forward


def flat_dequantize(packed, st):
    return flat_dq(packed, *absmax_of(st), st.blocksize, st.quant_type, st.shape, st.dtype).reshape(st.shape)


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
            assert cfg.model_type == MODEL_TYPE.get(fam, fam), (fam, cfg.model_type)
            model = AutoModelForCausalLM.from_pretrained(q, device_map="cpu", attn_implementation="eager").eval()
            sd = model.state_dict()
            stored = safe_open(os.path.join(deq, "model.safetensors"), "pt")
            worst = 0.0
            native_bad = []
            for name, mod in model.named_modules():
                if mod.__class__.__name__ == "Linear4bit":
                    mod.support_avx512bf16_for_cpu = False  # no AVX512-BF16 repacking (needs K % blocksize == 0, N % 32 == 0)
                    st = mod.weight.quant_state
                    w = flat_dequantize(mod.weight.data, st).float()
                    ref = stored.get_tensor(name + ".weight").float()
                    worst = max(worst, (w - ref).abs().max().item())
                    native = NATIVE_DQ(mod.weight.data, *absmax_of(st), st.blocksize, st.quant_type, st.shape, st.dtype).float()
                    if not torch.equal(native.reshape(w.shape), w):
                        native_bad.append(f"{name}{list(st.shape)}")
                        assert st.shape[-1] % st.blocksize != 0, ("CPU kernel disagrees on an aligned weight", name)
            names = set(sd)
            if fam == "qwen3":
                assert any(n.endswith("self_attn.q_norm.weight") for n in names)
            if fam == "qwen2":
                assert any(n.endswith("self_attn.q_proj.bias") for n in names)
            if fam.startswith("gemma"):  # the four norms of a Gemma layer
                for norm in ("pre_feedforward_layernorm", "post_feedforward_layernorm", "post_attention_layernorm"):
                    assert any(n.endswith(norm + ".weight") for n in names), norm
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
                  f"4-bit weights vs qshard's dequantization max |diff| {worst:.3e} ({'ok' if ok else 'MISMATCH'}); {fwd}; "
                  f"bnb's native CPU dequant differs (rows not a multiple of the blocksize) on {len(native_bad)} weights")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
