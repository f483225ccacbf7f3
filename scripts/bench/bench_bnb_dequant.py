"""Peer measurement for bench/dequant: bitsandbytes' own NF4 -> bf16 dequantization (double
quant, blocksize 64) on the Llama-3-8B weight shapes, timed with CUDA events on the same GPU.

Run on the GPU machine (bitsandbytes wheel installed):
    python3 scripts/bench/bench_bnb_dequant.py --json OUT.json
Effective GB/s counts bytes read (packed + uint8 absmax + nested absmax) + bytes written (bf16),
the same accounting as bench/dequant.
"""
import argparse
import json

import torch
import bitsandbytes.functional as F

SHAPES = [("q_proj", 4096, 4096), ("k_proj", 1024, 4096), ("v_proj", 1024, 4096), ("o_proj", 4096, 4096),
          ("gate_proj", 14336, 4096), ("up_proj", 14336, 4096), ("down_proj", 4096, 14336)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    total_bytes = total_ms = 0.0
    for name, r, c in SHAPES:
        w = (torch.randn(r, c, device="cuda") * 0.02).to(torch.bfloat16)
        q, st = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
        out = torch.empty_like(w)
        for _ in range(3):
            F.dequantize_4bit(q, st, out=out)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(args.iters):
            F.dequantize_4bit(q, st, out=out)
        b.record()
        torch.cuda.synchronize()
        ms = a.elapsed_time(b) / args.iters
        nbytes = q.numel() + st.absmax.numel() * st.absmax.element_size() + st.state2.absmax.numel() * 4 + out.numel() * 2
        gbs = nbytes / (ms * 1e-3) / 1e9
        total_bytes += nbytes
        total_ms += ms
        rows.append({"name": name, "rows": r, "cols": c, "us": ms * 1e3, "gbs": gbs})
        print(f"| {name} | {r}x{c} | {ms*1e3:.1f} | {gbs:.1f} |")
    res = {"device": torch.cuda.get_device_name(), "bitsandbytes": __import__("bitsandbytes").__version__,
           "torch": torch.__version__, "shapes": rows, "layer_us": total_ms * 1e3,
           "layer_gbs": total_bytes / (total_ms * 1e-3) / 1e9}
    print(f"| whole layer | 7 weights | {total_ms*1e3:.1f} | {res['layer_gbs']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
