"""bitsandbytes' dequantize_4bit of a 4-bit Hugging Face folder, in each weight's stored dtype
(the quant state's "dtype", which is what bitsandbytes.functional.dequantize_4bit returns and what
Linear4bit's forward multiplies with after widening to the compute dtype). Shared by the golden
scripts (make_bnb_logits_golden.py, make_model_golden.py, make_eval_golden.py).

dequantize_folder(folder, device="cpu") -> {weight name: tensor of quant_state.shape, quant_state.dtype}
dequantize_folder(folder, dtype=torch.float32): the same float32 products without the final cast
(what a dequantization that skips the rounding to the stored dtype gives; CPU only).

On the CPU the values come from bitsandbytes' own "default" backend kernel of
bitsandbytes::dequantize_4bit (backends/default/ops.py: table value * absmax in float32, then cast
to the dtype, "matches C++ / CUDA behavior"), fed with the absmax that dequantize_4bit itself
rebuilds (dequantize_blockwise + offset for double quant). Not the native CPU kernel that
F.dequantize_4bit dispatches to there: it works row by row and indexes absmax wrongly when the last
dim is not a multiple of the blocksize (the 96-column down_proj weights of tests/data/hf, see
docs/FORMATS_NOTES.md); for every other weight this module checks that the two are bit-identical.
On "cuda", F.dequantize_4bit itself (bitsandbytes' CUDA kernel).
"""
import os

import torch
import bitsandbytes.functional as F
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
from safetensors import safe_open


def _quant_states(folder, device):
    f = safe_open(os.path.join(folder, "model.safetensors"), "pt")
    keys = list(f.keys())
    for k in keys:
        for qt in ("nf4", "fp4"):
            suffix = ".quant_state.bitsandbytes__" + qt
            if k.endswith(suffix):
                w = k[: -len(suffix)]
                qs = {kk[len(w) + 1:]: f.get_tensor(kk).to(device) for kk in keys if kk.startswith(w + ".")}
                yield w, f.get_tensor(w).to(device), F.QuantState.from_dict(qs, device=torch.device(device))


def dequantize_folder(folder, device="cpu", report=None, dtype=None):
    """`report`, if a dict, gets per weight whether the native CPU kernel agreed (CPU only);
    `dtype` replaces the stored dtype of the result (CPU only)."""
    out = {}
    for w, packed, st in _quant_states(folder, device):
        if device == "cuda":
            out[w] = F.dequantize_4bit(packed, st).reshape(st.shape)
            continue
        absmax = st.absmax
        if st.nested:  # as F.dequantize_4bit rebuilds it
            absmax = F.dequantize_blockwise(st.absmax, st.state2) + st.offset
        ref = _dequantize_4bit_compute(packed.reshape(-1), absmax.float(), st.code, st.blocksize, st.shape,
                                       dtype or st.dtype).reshape(st.shape).contiguous()
        if dtype is not None:
            out[w] = ref
            continue
        native = F.dequantize_4bit(packed, st).reshape(st.shape)
        same = torch.equal(native, ref)
        if st.shape[-1] % st.blocksize == 0 and not same:
            raise SystemExit(f"{folder}: {w}: bitsandbytes' CPU and default dequantize_4bit disagree on a "
                             f"blocksize-aligned weight; the reference is in doubt")
        if report is not None:
            report[w] = same
        out[w] = ref
    return out
