#!/usr/bin/env python3
"""bitsandbytes' own dequantization of the 4-bit folders in tests/data/hf (made by
scripts/golden/make_hf_golden.py), as float32, for qshard's checkpoint tests.

For every 4-bit weight W of tests/data/hf/<folder>/model.safetensors it stores, under the key W,
the float32 values bitsandbytes' flat dequantization gives (table value * absmax, before any
cast): bitsandbytes.backends.default.ops._dequantize_4bit_compute, the torch implementation that
"matches C++ / CUDA behavior", fed with the absmax bitsandbytes.functional rebuilds
(dequantize_blockwise + offset). Not bitsandbytes' CPU dequantize_4bit: its native CPU kernel works
row by row and indexes absmax wrongly when the last dim is not a multiple of the blocksize (it gives
other values than its CUDA kernel for these 96-column weights).
Output: tests/data/hf/<folder>.dequant_f32.safetensors

Run from the repo root (bitsandbytes 0.50.2, CPU):
    python3 scripts/golden/make_hf_dequant_golden.py
"""
import os

import torch
import bitsandbytes.functional as F
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
from safetensors import safe_open
from safetensors.torch import save_file

FOLDERS = ["tiny_llama_bnb4_nf4_dq", "tiny_llama_bnb4_fp4"]


def main():
    root = os.path.join("tests", "data", "hf")
    for folder in FOLDERS:
        path = os.path.join(root, folder, "model.safetensors")
        f = safe_open(path, "pt")
        keys = list(f.keys())
        out = {}
        for k in keys:
            for qt in ("nf4", "fp4"):
                suffix = ".quant_state.bitsandbytes__" + qt
                if not k.endswith(suffix):
                    continue
                w = k[: -len(suffix)]
                qs = {kk[len(w) + 1:]: f.get_tensor(kk) for kk in keys if kk.startswith(w + ".")}
                state = F.QuantState.from_dict(qs, device=torch.device("cpu"))
                absmax = state.absmax
                if state.nested:
                    absmax = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
                packed = f.get_tensor(w).reshape(-1)
                out[w] = _dequantize_4bit_compute(packed, absmax.float(), state.code, state.blocksize,
                                                  state.shape, torch.float32).reshape(state.shape).contiguous()
        dst = os.path.join(root, folder + ".dequant_f32.safetensors")
        save_file(out, dst, metadata={"bitsandbytes": __import__("bitsandbytes").__version__, "source": path})
        print(dst, len(out), "weights")


if __name__ == "__main__":
    main()
