#!/usr/bin/env python3
"""The memory/speed frontier of docs/PERFORMANCE.md: tokens/s against peak GPU memory for qshard
bench and its peer (scripts/bench/bench_peer.py), from their JSON lines, as an SVG (no dependencies).

qshard's memory is the device memory in use (cudaMemGetInfo, CUDA context included); the peer's is
plotted twice: torch.cuda.max_memory_allocated (what the issue's table quotes) and the device
memory in use at its end (the like-for-like figure). Runs that failed (no tokens_per_s) are skipped.

Usage: scripts/bench/plot_frontier.py --qshard Q.jsonl [--peer P.jsonl] [--extra-peer E.jsonl] -o out.svg
  --extra-peer: peer points measured elsewhere (label them in the file's "source" field).
"""
import argparse
import json

GIB = float(1 << 30)


def load(path):
    rows = []
    if path:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r.get("tokens_per_s")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qshard", required=True)
    ap.add_argument("--peer", default="")
    ap.add_argument("--extra-peer", default="")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--title", default="Llama-3.1-8B shape, QLoRA r=16 on all 7 projections, seq 2048, one H200")
    args = ap.parse_args()

    series = []  # (name, colour, marker, [(x GiB, y tok/s, label)])
    q = load(args.qshard)
    series.append(("qshard (device memory in use)", "#1f77b4", "circle",
                   [(r["peak_gpu_bytes"] / GIB, r["tokens_per_s"], r.get("label", "")) for r in q]))
    p = load(args.peer)
    if p:
        def tag(r):
            return f'{r["batch"]}x{r["seq"]}{"" if r["checkpointing"] else " no ckpt"}'
        series.append(("peer: HF + PEFT + bnb (device memory in use)", "#d62728", "square",
                       [(r["device_in_use_bytes"] / GIB, r["tokens_per_s"], tag(r)) for r in p]))
        series.append(("peer (torch max_memory_allocated)", "#ff9896", "square",
                        [(r["peak_allocated_bytes"] / GIB, r["tokens_per_s"], "") for r in p]))
    e = load(args.extra_peer)
    if e:
        series.append(("peer, the issue's table (max allocated)", "#9467bd", "diamond",
                       [(r["peak_gib"], r["tokens_per_s"], r.get("label", "")) for r in e]))

    W, H, L, R, T, B = 900, 560, 80, 330, 50, 60
    xs = [x for _, _, _, pts in series for x, _, _ in pts] or [1]
    ys = [y for _, _, _, pts in series for _, y, _ in pts] or [1]
    xmax = max(xs) * 1.1
    ymax = max(ys) * 1.15

    def px(x):
        return L + (W - L - R) * x / xmax

    def py(y):
        return H - B - (H - T - B) * y / ymax

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L}" y="24" font-size="14">{args.title}</text>']
    for i in range(6):  # grid and ticks
        yv = ymax * i / 5
        xv = xmax * i / 5
        out.append(f'<line x1="{L}" y1="{py(yv):.1f}" x2="{W - R}" y2="{py(yv):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 8}" y="{py(yv) + 4:.1f}" text-anchor="end">{yv:,.0f}</text>')
        out.append(f'<line x1="{px(xv):.1f}" y1="{T}" x2="{px(xv):.1f}" y2="{H - B}" stroke="#ddd"/>')
        out.append(f'<text x="{px(xv):.1f}" y="{H - B + 18}" text-anchor="middle">{xv:.0f}</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 15}" text-anchor="middle">peak GPU memory (GiB)</text>')
    out.append(f'<text x="18" y="{(T + H - B) / 2}" transform="rotate(-90 18 {(T + H - B) / 2})" '
               f'text-anchor="middle">tokens/s</text>')
    for k, (name, colour, marker, pts) in enumerate(series):
        pts = sorted(pts)
        # The frontier: the best tokens/s at or below each memory.
        best, frontier = 0, []
        for x, y, _ in pts:
            if y > best:
                best = y
                frontier.append((x, y))
        if len(frontier) > 1:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in frontier)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        for x, y, label in pts:
            if marker == "circle":
                out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="5" fill="{colour}"/>')
            elif marker == "square":
                out.append(f'<rect x="{px(x) - 4:.1f}" y="{py(y) - 4:.1f}" width="8" height="8" fill="{colour}"/>')
            else:
                out.append(f'<polygon points="{px(x):.1f},{py(y) - 6:.1f} {px(x) + 6:.1f},{py(y):.1f} '
                           f'{px(x):.1f},{py(y) + 6:.1f} {px(x) - 6:.1f},{py(y):.1f}" fill="{colour}"/>')
            if label:
                out.append(f'<text x="{px(x) + 7:.1f}" y="{py(y) - 6:.1f}" font-size="10" fill="#444">{label}</text>')
        ly = T + 20 + 22 * k
        out.append(f'<rect x="{W - R + 20}" y="{ly - 9}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{W - R + 36}" y="{ly}">{name}</text>')
    out.append("</svg>")
    with open(args.out, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"wrote {args.out}: {sum(len(s[3]) for s in series)} points")


if __name__ == "__main__":
    main()
