#!/usr/bin/env python3
"""Plots a qshard metrics file (JSONL, src/train/metrics.h) as a PNG.

Top panel: training loss (and eval loss where present) against step; bottom panel: the learning
rate against step.

Usage: scripts/tools/plot_metrics.py build/runs/tiny/metrics.jsonl [-o loss.png] [--title TEXT]
The default output is the metrics file's name with .png. Exit codes: 0 written, 1 bad input,
2 matplotlib is not installed (pip install matplotlib).
"""
import argparse
import json
import math
import os
import sys


def read_metrics(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not valid JSON: {e}")
            if not isinstance(row, dict) or "step" not in row:
                raise SystemExit(f"{path}:{n}: expected an object with a \"step\" key")
            rows.append(row)
    if not rows:
        raise SystemExit(f"{path}: no metrics lines")
    # A resumed run appends: keep the last line written for each step.
    by_step = {}
    for row in rows:
        by_step[row["step"]] = row
    return [by_step[s] for s in sorted(by_step)]


def series(rows, key):
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [p[0] for p in pts], [p[1] for p in pts]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metrics", help="metrics JSONL file")
    ap.add_argument("-o", "--output", help="PNG to write (default: METRICS with .png)")
    ap.add_argument("--title", help="figure title (default: the metrics path)")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_metrics.py: matplotlib is not installed; install it with `pip install matplotlib` "
              "(the metrics file itself is plain JSONL and needs nothing to read)", file=sys.stderr)
        return 2
    try:
        rows = read_metrics(args.metrics)
    except OSError as e:
        print(f"plot_metrics.py: {e}", file=sys.stderr)
        return 1
    out = args.output or os.path.splitext(args.metrics)[0] + ".png"

    fig, (ax_loss, ax_lr) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    x, y = series(rows, "loss")
    ax_loss.plot(x, y, label="train loss", color="tab:blue")
    x, y = series(rows, "eval_loss")
    if x:
        ax_loss.plot(x, y, "o-", label="eval loss", color="tab:orange")
    ax_loss.set_ylabel("loss")
    ax_loss.grid(True, alpha=0.3)
    ax_loss.legend()
    ax_loss.set_title(args.title or args.metrics)
    x, y = series(rows, "lr")
    ax_lr.plot(x, y, color="tab:green")
    ax_lr.set_ylabel("lr")
    ax_lr.set_xlabel("step")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    ax_lr.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out} ({len(rows)} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
