#!/usr/bin/env python3
"""Golden data for qshard's safetensors reader/writer, made with the REAL safetensors library.

Produces
  tests/data/safetensors/python_written.safetensors   (or --out PATH)
      Written by safetensors.torch.save_file with __metadata__ {"format": "pt"}; the tensors
      (names, dtypes, shapes, values) are those of expected_tensors() below, which
      tests/checkpoint/safetensors_test.cpp (golden_tensors()) rebuilds in C++: keep both in sync.
      All values are exact in their dtype (no rounding involved).

Checks (the other direction)
  python3 scripts/golden/make_safetensors_golden.py --check FILE
      Loads FILE (written by qshard's SafetensorsWriter, e.g. by running
      QSHARD_SAFETENSORS_CHECK_OUT=FILE build/st/tests/checkpoint/checkpoint_test
        --gtest_filter=SafetensorsPython.WritesFileForPythonCheck)
      with safetensors.torch.load_file and safe_open, and verifies names, dtypes, shapes, values
      and metadata against expected_tensors(). Exit status 0 on success, 1 on any mismatch.

Run from the repo root:
  python3 scripts/golden/make_safetensors_golden.py
  python3 scripts/golden/make_safetensors_golden.py --check /tmp/cpp_written.safetensors
"""

import argparse
import os
import sys

import torch
import safetensors
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def expected_tensors():
    i = torch.arange
    return {
        "f32": (i(6, dtype=torch.float32) * 0.5 - 1.0).reshape(2, 3),
        "bf16": ((i(8, dtype=torch.float32) - 4) * 0.25).to(torch.bfloat16).reshape(2, 4),
        "f16": (i(5, dtype=torch.float32) * 0.5 + 1000.0).to(torch.float16),
        "u8": (i(10, dtype=torch.int32) * 25).to(torch.uint8),
        "i32": ((i(6, dtype=torch.int32) - 3) * 1000).reshape(3, 2),
        "i64": i(4, dtype=torch.int64) * (1 << 40) - 7,
        "scalar": torch.tensor(3.25, dtype=torch.float32),
        "empty": torch.zeros(0, 4, dtype=torch.float32),
    }


EXPECTED_METADATA = {"format": "pt"}


def check(path):
    expected = expected_tensors()
    got = load_file(path)
    errors = []
    if sorted(got) != sorted(expected):
        errors.append(f"names differ: got {sorted(got)}, expected {sorted(expected)}")
    for name, want in expected.items():
        if name not in got:
            continue
        t = got[name]
        if t.dtype != want.dtype:
            errors.append(f"{name}: dtype {t.dtype}, expected {want.dtype}")
        elif tuple(t.shape) != tuple(want.shape):
            errors.append(f"{name}: shape {tuple(t.shape)}, expected {tuple(want.shape)}")
        elif not torch.equal(t, want):
            errors.append(f"{name}: values differ: {t.flatten()[:8].tolist()} vs {want.flatten()[:8].tolist()}")
        else:
            print(f"  ok {name:7s} {str(t.dtype):15s} {tuple(t.shape)} first values {t.flatten()[:4].tolist()}")
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
    if meta != EXPECTED_METADATA:
        errors.append(f"metadata {meta}, expected {EXPECTED_METADATA}")
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
    if n % 8:
        errors.append(f"header length {n} is not a multiple of 8")
    if errors:
        print(f"FAIL {path}:")
        for e in errors:
            print("  " + e)
        return 1
    print(f"PASS {path}: {len(expected)} tensors, metadata {meta}, header {n} bytes "
          f"(safetensors {safetensors.__version__}, torch {torch.__version__})")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--out", default=os.path.join(root, "tests/data/safetensors/python_written.safetensors"))
    ap.add_argument("--check", metavar="FILE", help="verify a qshard-written file instead of writing")
    args = ap.parse_args()
    if args.check:
        return check(args.check)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    save_file(expected_tensors(), args.out, metadata=EXPECTED_METADATA)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes, safetensors {safetensors.__version__})")
    return check(args.out)


if __name__ == "__main__":
    sys.exit(main())
