#!/usr/bin/env python3
"""Where the compute stream idles, from an nsys GPU trace.

Input: the CSV of `nsys stats -r cuda_gpu_trace -f csv -o PREFIX REPORT.nsys-rep`. Looks at the
last --seconds of the trace (default 1.3: one 8 x 2048 step at 8B), takes the stream with the most
kernel time as the compute stream, and prints:
  - per stream: kernels / copies, busy time, bytes copied;
  - the compute stream's idle gaps (longer than --min-gap-us), summed by the op that follows them
    and by the op before them (what the stream waited for is usually on another stream, so the
    op after a gap names who waited);
  - the copies on the compute stream (each a copy engine's queue).
Usage: stream_gaps.py TRACE.csv [--seconds S] [--min-gap-us U] [--top N]
"""
import argparse
import collections
import csv
import re


def col(header, *prefixes):
    for p in prefixes:
        for i, h in enumerate(header):
            if h.startswith(p):
                return i
    raise SystemExit(f"no column starting with {prefixes} in {header}")


def short(name):
    name = re.sub(r"\(.*", "", name)  # drop argument lists
    name = re.sub(r"<.*>", "<>", name)
    return name[:90]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--seconds", type=float, default=1.3)
    ap.add_argument("--min-gap-us", type=float, default=2.0)
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    with open(a.trace, newline="") as f:
        rows = list(csv.reader(f))
    header, rows = rows[0], rows[1:]
    i_start, i_dur = col(header, "Start"), col(header, "Duration")
    i_strm, i_name = col(header, "Strm"), col(header, "Name")
    i_bytes = col(header, "Bytes")
    ev = []
    for r in rows:
        try:
            s, d = float(r[i_start]), float(r[i_dur])
        except ValueError:
            continue
        name = r[i_name]
        copy = name.startswith("[CUDA")
        b = float(r[i_bytes]) if copy and r[i_bytes] else 0.0
        ev.append((s, s + d, r[i_strm], name, copy, b))
    if not ev:
        raise SystemExit("no events")
    end = max(e[1] for e in ev)
    t0 = end - a.seconds * 1e9
    ev = sorted(e for e in ev if e[0] >= t0)
    busy = collections.Counter()
    count = collections.Counter()
    copied = collections.Counter()
    kern = collections.Counter()
    for s, e, strm, name, copy, b in ev:
        busy[strm] += e - s
        count[(strm, copy)] += 1
        copied[strm] += b
        if not copy:
            kern[strm] += e - s
    compute = kern.most_common(1)[0][0]
    print(f"window: the last {a.seconds:.3f} s of the trace; compute stream = {compute}")
    for strm in sorted(busy, key=lambda k: -busy[k]):
        print(f"  stream {strm:>4}: {count[(strm, False)]:6d} kernels, {count[(strm, True)]:5d} copies, "
              f"busy {busy[strm] / 1e6:8.2f} ms, copied {copied[strm]:9.1f} MB")
    cs = [e for e in ev if e[2] == compute]
    first, last = cs[0][0], cs[-1][1]
    gaps_after = collections.defaultdict(lambda: [0, 0.0])
    gaps_before = collections.defaultdict(lambda: [0, 0.0])
    total_gap = 0.0
    big = []
    for prev, nxt in zip(cs, cs[1:]):
        g = nxt[0] - prev[1]
        if g < a.min_gap_us * 1e3:
            continue
        total_gap += g
        k = short(nxt[3])
        gaps_after[k][0] += 1
        gaps_after[k][1] += g
        k = short(prev[3])
        gaps_before[k][0] += 1
        gaps_before[k][1] += g
        big.append((g, short(prev[3]), short(nxt[3]), (nxt[0] - first) / 1e6))
    span = (last - first) / 1e6
    print(f"compute stream: span {span:.2f} ms, busy {busy[compute] / 1e6:.2f} ms, "
          f"idle gaps > {a.min_gap_us} us: {total_gap / 1e6:.2f} ms")
    for title, table in (("gaps by the op after them", gaps_after), ("gaps by the op before them", gaps_before)):
        print(f"  {title} (count, total ms, mean us):")
        for k, (n, g) in sorted(table.items(), key=lambda kv: -kv[1][1])[: a.top]:
            print(f"    {n:6d} {g / 1e6:8.2f} {g / n / 1e3:8.1f}  {k}")
    print("  the longest gaps (us, before -> after, at ms):")
    for g, p, n, at in sorted(big, reverse=True)[: a.top]:
        print(f"    {g / 1e3:8.1f}  {p[:40]} -> {n[:40]}  at {at:.1f}")
    cc = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for s, e, strm, name, copy, b in cs:
        if copy:
            cc[name][0] += 1
            cc[name][1] += e - s
            cc[name][2] += b
    if cc:
        print("  copies on the compute stream (count, total ms, MB):")
        for k, (n, d, b) in sorted(cc.items(), key=lambda kv: -kv[1][1]):
            print(f"    {n:6d} {d / 1e6:8.2f} {b:9.2f}  {k}")


if __name__ == "__main__":
    main()
