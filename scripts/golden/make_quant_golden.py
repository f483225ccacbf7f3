#!/usr/bin/env python3
"""Golden test data for qshard's NF4/FP4 blockwise quantization, made with the REAL bitsandbytes.

Produces
  tests/data/quant/bnb_golden_<device>.safetensors   (or --out PATH)
      One safetensors file holding ~100 quantization cases.  For a case named C:
        C.input          input tensor (original dtype and shape)
        C.weight         packed 4-bit data exactly as bnb returns it (uint8, ((n+1)//2, 1))
        C.weight.<key>   every tensor of quant_state.as_dict(packed=True): absmax, quant_map,
                         [nested_absmax, nested_quant_map,] quant_state.bitsandbytes__nf4|__fp4
                         (dtypes exactly as bnb gives them)
        C.dequant        bnb.functional.dequantize_4bit(packed, state)        (original dtype)
        C.dequant_f32    the same with state.dtype = float32 (table*absmax before the cast)
        C.absmax_f32     (double quant only) dequantize_blockwise(qabsmax, state2) + offset,
                         the float32 absmax exactly as dequantize_4bit rebuilds it
      __metadata__ (all strings): cases (JSON list), skipped (JSON list), bitsandbytes, torch,
      device, created, plus "checks": JSON with independent numpy cross-checks (how many codes
      differ from the CUDA-kernel rule described in /work/shared/FORMATS.md, etc.).
  tests/data/quant/bnb_tables.json  (only with --tables, on by default for cpu)
      NF4/FP4 quant_map, the 256-entry signed dynamic map used for double quant, and
      (float32 offset, json.dumps string) pairs showing how nested_offset is printed.

Run (from the repo root):
  python3 scripts/golden/make_quant_golden.py --device cpu
  python3 scripts/golden/make_quant_golden.py --device cuda     # on a GPU machine with CUDA bnb
All inputs are generated on the CPU from fixed seeds (one generator per case, seeded from the
case index), then moved to the device, so every device sees bit-identical inputs.
"""

import argparse
import copy
import datetime
import json
import os
import struct
import sys

import numpy as np
import torch

import bitsandbytes
import bitsandbytes.functional as F
from safetensors.torch import save_file

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
ALL_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)

# Thresholds of the CUDA kernel (csrc/kernels.cu dQuantizeNF4 / dQuantizeFP4), as float32.
# They are only used for (a) the "thresholds" input pattern and (b) the cross-check that counts
# codes differing from the CUDA rule.  They are not written as golden data.
CUDA_NF4_THRESHOLDS = np.array(
    [-0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544,
     -0.23460740596055984, -0.13791173323988914, -0.045525018125772476, 0.03979014977812767,
     0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
     0.5016634166240692, 0.6427869200706482, 0.8614784181118011], dtype=np.float32)
CUDA_FP4_THRESHOLDS = np.array(
    [0.00260417, 0.0859375, 0.20833333, 0.29166667, 0.4166667, 0.583333, 0.8333333],
    dtype=np.float32)


# --------------------------------------------------------------------------------------------
# Input patterns.  Every generator gets its own torch.Generator (CPU) so inputs do not depend on
# the order in which cases are built or on the device.
# --------------------------------------------------------------------------------------------

def _blocks_of(n, bs):
    return [(s, min(s + bs, n)) for s in range(0, n, bs)]


def make_input(pattern, n, bs, qtype, dtype, gen):
    """Return a float32 CPU tensor of n elements for `pattern` (cast to dtype by the caller)."""
    f16_max = 65504.0
    if pattern == "normal":
        x = torch.randn(n, generator=gen)
    elif pattern == "large":
        if dtype == torch.float16:
            # near the float16 maximum, with +-65504 exactly present
            x = (torch.rand(n, generator=gen) * 2 - 1) * f16_max
            x[0] = f16_max
            if n > 1:
                x[n // 2] = -f16_max
        else:
            x = torch.randn(n, generator=gen) * 1e4
    elif pattern == "tiny":
        x = torch.randn(n, generator=gen) * 1e-6
    elif pattern == "subnormal":
        # float32 values whose block absmax is below 1e-38 (bnb's CPU path clamps absmax to 1e-38
        # for the scale, the CUDA kernel uses 1/absmax directly).
        x = torch.randn(n, generator=gen) * 1e-39
    elif pattern == "zeroblocks":
        # normal data with all-zero blocks in the middle (and the last, partial, block zero too)
        x = torch.randn(n, generator=gen)
        blocks = _blocks_of(n, bs)
        for bi in (1, 2, len(blocks) // 2, len(blocks) - 1):
            if 0 < bi < len(blocks):
                s, e = blocks[bi]
                x[s:e] = 0.0
    elif pattern == "allzero":
        x = torch.zeros(n)
    elif pattern in ("codepoints_pow2", "codepoints_scaled"):
        # every element is table[k] * absmax of its block; element 0 of each block carries the
        # code for +1.0 or -1.0 so the block absmax is exactly the chosen scale.
        table = F.get_4bit_type(qtype, device="cpu")
        idx = torch.randint(0, 16, (n,), generator=gen)
        x = torch.empty(n)
        for bi, (s, e) in enumerate(_blocks_of(n, bs)):
            if pattern == "codepoints_pow2":
                scale = float(2.0 ** (bi % 7 - 3))
            else:
                scale = float(torch.rand(1, generator=gen) * 3 + 0.1)
            scale = float(np.float32(scale))
            x[s:e] = table[idx[s:e]] * scale
            x[s] = scale if bi % 2 == 0 else -scale
    elif pattern == "thresholds":
        # values exactly on the encoder thresholds, and one float32 ulp either side, times a
        # power-of-two block absmax (so x * (1/absmax) is exact).  Both the float32 midpoints of
        # the table (what bnb's CPU/default path uses) and the CUDA literals are included.
        table = F.get_4bit_type(qtype, device="cpu").numpy()
        srt = np.sort(table)
        mids = ((srt[:-1] + srt[1:]) / np.float32(2)).astype(np.float32)
        cuda = CUDA_NF4_THRESHOLDS if qtype == "nf4" else np.concatenate(
            [CUDA_FP4_THRESHOLDS, -CUDA_FP4_THRESHOLDS])
        pts = np.unique(np.concatenate([mids, cuda]).astype(np.float32))
        pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)),
                              np.nextafter(pts, np.float32(-np.inf))]).astype(np.float32)
        vals = []
        for bi, (s, e) in enumerate(_blocks_of(n, bs)):
            scale = np.float32(2.0 ** (bi % 5 - 2))
            blk = np.resize(np.roll(pts, bi * 7), e - s).astype(np.float32) * scale
            blk[0] = scale  # absmax of this block
            vals.append(blk)
        x = torch.from_numpy(np.concatenate(vals).astype(np.float32))
    elif pattern == "constant":
        # every block holds one repeated value (different per block, both signs)
        consts = [0.37, -2.5, 1.0, -1e-3, 123.0, -0.0625]
        x = torch.empty(n)
        for bi, (s, e) in enumerate(_blocks_of(n, bs)):
            x[s:e] = consts[bi % len(consts)]
    elif pattern == "signed_small":
        # absmax 1 per block; many values close to zero of both signs (FP4 sign-bit behaviour)
        small = torch.tensor([0.0, -0.0, 1e-4, -1e-4, 0.0026041667, -0.0026041667, 0.00260417,
                              -0.00260417, 0.003, -0.003, 0.04, -0.04, 0.045525018, -0.045525018,
                              1e-30, -1e-30])
        x = small[torch.randint(0, len(small), (n,), generator=gen)]
        for s, e in _blocks_of(n, bs):
            x[s] = 1.0
    else:
        raise ValueError(pattern)
    return x.to(torch.float32)


# --------------------------------------------------------------------------------------------
# Case list
# --------------------------------------------------------------------------------------------

def build_case_specs():
    """List of dicts (quant_type, blocksize, double_quant, dtype, shape, pattern)."""
    specs = []

    def add(qt, bs, dq, dt, shape, pattern):
        if isinstance(shape, int):
            shape = (shape,)
        specs.append(dict(quant_type=qt, blocksize=bs, double_quant=dq, dtype=dt,
                          shape=list(shape), pattern=pattern))

    # A. blocksize sweep: every blocksize x quant type x double quant, partial last block.
    dts = ["f32", "bf16", "f16"]
    i = 0
    for qt in ("nf4", "fp4"):
        for bs in ALL_BLOCKSIZES:
            for dq in (False, True):
                n = 1029 if bs <= 512 else 4097
                add(qt, bs, dq, dts[i % 3], n, "normal")
                i += 1

    # B. element counts 1, 63, 64, 65 (bs 64) and 2-D shapes (odd and even last dim).
    i = 0
    for n in (1, 63, 64, 65):
        for qt in ("nf4", "fp4"):
            for dq in (False, True):
                add(qt, 64, dq, dts[i % 3], n, "normal")
                i += 1
    add("nf4", 64, True, "bf16", (33, 65), "normal")
    add("fp4", 64, False, "f32", (33, 65), "normal")
    add("nf4", 128, False, "f16", (33, 65), "normal")
    add("nf4", 64, True, "f32", (16, 64), "normal")
    add("fp4", 64, True, "bf16", (7, 130), "normal")
    add("nf4", 32, True, "bf16", (5, 3, 22), "normal")

    # C. many blocks: > 256 absmax values, so the nested blocksize 256 matters; last nested
    #    block partial (301 blocks -> 256 + 45; 257 blocks -> 256 + 1).
    add("nf4", 64, True, "bf16", 64 * 300 + 17, "normal")
    add("fp4", 64, True, "f16", 64 * 300 + 17, "normal")
    add("nf4", 64, True, "f32", 64 * 256 + 1, "zeroblocks")
    add("nf4", 32, True, "bf16", 32 * 600 + 5, "large")

    # D. value patterns at bs 64 (n = 657 = 10 full blocks + 17), several combos each.
    combos = [("nf4", False, "f32"), ("nf4", True, "bf16"), ("fp4", False, "f16"),
              ("fp4", True, "f32"), ("nf4", True, "f16"), ("fp4", True, "bf16")]
    for pattern in ("large", "tiny", "zeroblocks", "constant", "signed_small"):
        for qt, dq, dt in combos:
            add(qt, 64, dq, dt, 657, pattern)
    # exact-value patterns: mostly float32 (bf16/f16 cannot hold table*scale exactly)
    for pattern in ("codepoints_pow2", "codepoints_scaled", "thresholds"):
        for qt, dq, dt in [("nf4", False, "f32"), ("nf4", True, "f32"), ("fp4", False, "f32"),
                           ("fp4", True, "f32"), ("nf4", True, "bf16")]:
            add(qt, 64, dq, dt, 657, pattern)
    add("nf4", 64, False, "f16", 657, "large")  # f16 near max without double quant (nf4)
    for qt, dq in (("nf4", False), ("fp4", False), ("nf4", True)):
        add(qt, 64, dq, "f32", 200, "subnormal")
    for qt, dq in (("nf4", True), ("fp4", True), ("nf4", False)):
        add(qt, 64, dq, "f32", 130, "allzero")
    # zero blocks with the other blocksizes and double quant
    add("nf4", 128, True, "bf16", 1029, "zeroblocks")
    add("nf4", 4096, True, "f32", 4097 * 3, "zeroblocks")
    return specs


def case_name(idx, spec):
    n = int(np.prod(spec["shape"]))
    shp = "n%d" % n if len(spec["shape"]) == 1 else "s" + "x".join(map(str, spec["shape"]))
    return "c%02d_%s_bs%d_%s_%s_%s_%s" % (
        idx, spec["quant_type"], spec["blocksize"], "dq" if spec["double_quant"] else "nodq",
        spec["dtype"], shp, spec["pattern"])


# --------------------------------------------------------------------------------------------
# Independent numpy cross-checks (informational; stored in metadata, printed in the summary)
# --------------------------------------------------------------------------------------------

def unpack_nibbles(packed_u8, n):
    b = packed_u8.reshape(-1)
    out = np.empty(b.size * 2, dtype=np.uint8)
    out[0::2] = b >> 4
    out[1::2] = b & 0xF
    return out[:n]


def cuda_rule_codes(x32, bs, qtype):
    """Codes per the CUDA kernel as described in FORMATS.md: scaled = x * (1/absmax) in float32,
    NF4: count of thresholds strictly below (NaN -> 0), FP4: sign bit + decision tree."""
    n = x32.size
    codes = np.empty(n, dtype=np.uint8)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for s in range(0, n, bs):
            blk = x32[s:s + bs]
            am = np.max(np.abs(blk)).astype(np.float32)
            sc = (blk * (np.float32(1) / am)).astype(np.float32)
            if qtype == "nf4":
                c = (sc[:, None] > CUDA_NF4_THRESHOLDS[None, :]).sum(1)
                c[np.isnan(sc)] = 0
            else:
                t = CUDA_FP4_THRESHOLDS
                a = np.abs(sc)
                c = np.where(a > t[3],
                             np.where(a > t[5], np.where(a > t[6], 3, 2), np.where(a > t[4], 5, 4)),
                             np.where(a > t[1], np.where(a > t[2], 7, 6), np.where(a > t[0], 1, 0)))
                c = c + np.where(sc < 0, 8, 0)
            codes[s:s + bs] = c
    return codes


def nested_rule_codes(absmax32, offset32, dyn_map):
    """8-bit nested codes per FORMATS.md: (absmax-offset) * (1/nested_absmax), nearest map entry
    (compare with float32 midpoints).  A nested block whose values are all 0 (nested_absmax 0,
    0 * inf = NaN) has no defined rule here and counts as differing."""
    v = (absmax32 - offset32).astype(np.float32)
    out = np.empty(v.size, dtype=np.uint8)
    mids = ((dyn_map[:-1] + dyn_map[1:]) / np.float32(2)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        for s in range(0, v.size, 256):
            blk = v[s:s + 256]
            am = np.max(np.abs(blk)).astype(np.float32)
            sc = (blk * (np.float32(1) / am)).astype(np.float32)
            out[s:s + 256] = np.searchsorted(mids, sc, side="left")
    return out


# --------------------------------------------------------------------------------------------

def run_case(idx, spec, device):
    dtype = DTYPES[spec["dtype"]]
    shape = tuple(spec["shape"])
    n = int(np.prod(shape))
    gen = torch.Generator().manual_seed(1000 + idx)
    x32 = make_input(spec["pattern"], n, spec["blocksize"], spec["quant_type"], dtype, gen)
    x_cpu = x32.to(dtype).reshape(shape).contiguous()
    x = x_cpu.to(device)

    packed, qs = F.quantize_4bit(x, blocksize=spec["blocksize"],
                                 compress_statistics=spec["double_quant"],
                                 quant_type=spec["quant_type"])
    deq = F.dequantize_4bit(packed, qs)
    qs32 = copy.copy(qs)          # shallow copy; only the output dtype changes
    qs32.dtype = torch.float32
    deq32 = F.dequantize_4bit(packed, qs32)

    tensors = {"input": x_cpu, "weight": packed}
    for k, v in qs.as_dict(packed=True).items():
        tensors["weight." + k] = v
    tensors["dequant"] = deq
    tensors["dequant_f32"] = deq32
    if qs.nested:
        # exactly what dequantize_4bit does internally
        am = F.dequantize_blockwise(qs.absmax, qs.state2)
        am += qs.offset
        if am.dtype != torch.float32:
            am = am.float()
        tensors["absmax_f32"] = am
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}

    # ---- cross-checks (informational)
    chk = {}
    pk = tensors["weight"].numpy()
    codes = unpack_nibbles(pk, n)
    am32 = (tensors["absmax_f32"] if qs.nested else tensors["weight.absmax"]).numpy()
    table = tensors["weight.quant_map"].numpy()
    ref32 = (table[codes] * np.repeat(am32, spec["blocksize"])[:n]).astype(np.float32)
    d32 = tensors["dequant_f32"].reshape(-1).numpy()
    # value compare (+0.0 == -0.0); signed-zero differences counted separately (bnb's native
    # CPU dequant kernel returns -0.0 for FP4 code 0b1000 where table[8] * absmax gives +0.0)
    chk["dequant_f32_vs_table_x_absmax_mismatch"] = int(np.sum(
        (ref32 != d32) & ~(np.isnan(ref32) & np.isnan(d32))))
    chk["dequant_f32_vs_table_x_absmax_signed_zero_diff"] = int(np.sum(
        (ref32 == d32) & (ref32.view(np.uint32) != d32.view(np.uint32))))
    chk["dequant_vs_dequant_f32_cast_mismatch"] = int(torch.sum(
        tensors["dequant"].reshape(-1).view(torch.int16 if dtype != torch.float32 else torch.int32)
        != tensors["dequant_f32"].reshape(-1).to(dtype).view(
            torch.int16 if dtype != torch.float32 else torch.int32)).item())
    chk["dequant_shape"] = list(tensors["dequant"].shape)
    if n % 2:
        chk["pad_nibble"] = int(pk.reshape(-1)[-1] & 0xF)
    xin = x_cpu.reshape(-1).float().numpy()
    cref = cuda_rule_codes(xin, spec["blocksize"], spec["quant_type"])
    chk["codes_differing_from_cuda_rule"] = int(np.sum(cref != codes))
    if qs.nested:
        # plain float32 absmax recomputed from the input
        raw_am = np.array([np.max(np.abs(xin[s:s + spec["blocksize"]]))
                           for s in range(0, n, spec["blocksize"])], dtype=np.float32)
        off = np.float32(qs.offset.item())
        nq = nested_rule_codes(raw_am, off, tensors["weight.nested_quant_map"].numpy())
        chk["nested_codes_differing_from_rule"] = int(np.sum(nq != tensors["weight.absmax"].numpy()))
        chk["offset_vs_np_float32_mean"] = repr(float(np.mean(raw_am, dtype=np.float32)) - float(off))
    return tensors, chk


def canonicalize_metadata(path):
    """The safetensors writer emits __metadata__ in hash-map order, which changes from run to run.
    Rewrite the header with the metadata keys sorted so that the file bytes are reproducible.
    Same JSON style as the writer (compact, space padded to a multiple of 8)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__")
    new = {"__metadata__": {k: meta[k] for k in sorted(meta)}}
    new.update(header)  # tensor entries keep their (data-offset) order
    text = json.dumps(new, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    assert len(text) == n, "header length changed"
    with open(path, "wb") as f:
        f.write(data[:8] + text + data[8 + n:])


def write_tables(path):
    """NF4/FP4 tables, the signed dynamic map and nested_offset printing examples."""
    def f32list(t):
        return [repr(float(v)) for v in t.to(torch.float32).reshape(-1).tolist()]

    # float32 values across magnitudes, widened to double exactly as QuantState.as_dict does
    # (self.offset.item() on a float32 tensor gives the widened double).
    raw = [1e-9, 3.3e-9, 1.2345e-8, 5e-7, 1.4999999621068127e-05, 2.5e-5, 9.99e-5, 1e-4,
           1.0001e-4, 0.0001234, 0.00099, 0.001, 0.0123456789, 0.023456700146198273, 0.1, 0.2,
           0.3, 1.0 / 3.0, 0.5, 0.999999, 1.0, 1.5, 2.0, 3.0, 7.0, 10.0, 12.5, 100.0, 123.456,
           999.99, 1000.0, 65504.0, 1e15, 1e16, 1.5e16, 1e17, 3.4028234663852886e38,
           float(np.float32(np.pi)), 2.622196912765503, 1e-38, 1e-45]
    pairs = []
    for v in raw:
        v32 = torch.tensor(v, dtype=torch.float32).item()  # float32 widened to double
        pairs.append({"float32_bits": "0x%08x" % int(np.float32(v32).view(np.uint32)),
                      "value_repr": repr(v32),
                      "json": json.dumps({"nested_offset": v32})})
    tables = {
        "bitsandbytes": bitsandbytes.__version__,
        "torch": torch.__version__,
        "nf4_quant_map": f32list(F.get_4bit_type("nf4", device="cpu")),
        "fp4_quant_map": f32list(F.get_4bit_type("fp4", device="cpu")),
        "dynamic_map_signed": f32list(F.create_dynamic_map(signed=True)),
        "nested_offset_json": pairs,
        "note": "floats are repr() of the float32 value widened to double; json strings are the "
                "exact output of json.dumps({'nested_offset': value})",
    }
    with open(path, "w") as f:
        json.dump(tables, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--tables", default=None,
                    help="path for bnb_tables.json (default: tests/data/quant/bnb_tables.json "
                         "when --device cpu; 'none' to skip)")
    args = ap.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    out = args.out or os.path.join("tests", "data", "quant", "bnb_golden_%s.safetensors" % args.device)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)

    specs = build_case_specs()
    all_tensors, cases, skipped, checks = {}, [], [], {}
    for idx, spec in enumerate(specs):
        name = case_name(idx, spec)
        try:
            tensors, chk = run_case(idx, spec, device)
        except Exception as e:  # bnb refused this blocksize/dtype on this device
            skipped.append(dict(name=name, error="%s: %s" % (type(e).__name__, e), **spec))
            print("SKIP %-48s %s" % (name, e))
            continue
        for k, v in tensors.items():
            all_tensors["%s.%s" % (name, k)] = v
        cases.append(dict(name=name, **{**spec, "dtype": DTYPE_NAMES[DTYPES[spec["dtype"]]]}))
        checks[name] = chk
        print("%-48s codes!=cuda_rule %4d  dq32!=ref %d (+-0: %d)  cast!= %d%s" % (
            name, chk["codes_differing_from_cuda_rule"],
            chk["dequant_f32_vs_table_x_absmax_mismatch"],
            chk["dequant_f32_vs_table_x_absmax_signed_zero_diff"],
            chk["dequant_vs_dequant_f32_cast_mismatch"],
            ("  nested!=rule %d" % chk["nested_codes_differing_from_rule"])
            if "nested_codes_differing_from_rule" in chk else ""))

    meta = {
        "cases": json.dumps(cases),
        "skipped": json.dumps(skipped),
        "checks": json.dumps(checks),
        "bitsandbytes": bitsandbytes.__version__,
        "torch": torch.__version__,
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(0),
        "created": datetime.date.today().isoformat(),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
    }
    save_file(all_tensors, out, metadata=meta)
    canonicalize_metadata(out)
    print("\n%d cases, %d skipped, %d tensors -> %s (%d bytes)" % (
        len(cases), len(skipped), len(all_tensors), out, os.path.getsize(out)))

    tables = args.tables
    if tables is None and args.device == "cpu":
        tables = os.path.join(os.path.dirname(out), "bnb_tables.json")
    if tables and tables != "none":
        write_tables(tables)
        print("tables -> %s" % tables)


if __name__ == "__main__":
    main()
