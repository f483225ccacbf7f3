#!/usr/bin/env python3
"""Compare training loss curves from qshard metrics JSONL files against a reference run.

Usage: compare_loss_curves.py REF.jsonl RUN.jsonl [RUN.jsonl ...] [--tol 0.02] [--json OUT]
Per run: the steps both logged, the largest |loss - ref| and |loss - ref| / ref, the final losses.
Exit 1 when a run's largest relative difference is above --tol (or it logged no common step).
"""
import argparse
import json
import sys


def read(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                j = json.loads(line)
                out[j["step"]] = j
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--tol", type=float, default=0.02)
    ap.add_argument("--json")
    a = ap.parse_args()
    ref = read(a.ref)
    ok = True
    report = {"reference": a.ref, "tolerance_rel": a.tol, "runs": []}
    for run in a.runs:
        r = read(run)
        common = sorted(set(ref) & set(r))
        if not common:
            print(f"{run}: no step in common with {a.ref}")
            ok = False
            continue
        diffs = [(s, abs(r[s]["loss"] - ref[s]["loss"]), abs(r[s]["loss"] - ref[s]["loss"]) / abs(ref[s]["loss"]))
                 for s in common]
        worst_abs = max(d[1] for d in diffs)
        worst_rel = max(d[2] for d in diffs)
        at = max(diffs, key=lambda d: d[2])[0]
        last = common[-1]
        good = worst_rel <= a.tol
        ok &= good
        print(f"{run}: {len(common)} steps; max |dloss| {worst_abs:.4f}, max rel {worst_rel:.4f} (step {at}); "
              f"final {r[last]['loss']:.4f} vs {ref[last]['loss']:.4f}; {'ok' if good else 'ABOVE TOLERANCE'}")
        report["runs"].append({"run": run, "steps": len(common), "max_abs": worst_abs, "max_rel": worst_rel,
                               "final": r[last]["loss"], "final_ref": ref[last]["loss"], "ok": good})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
