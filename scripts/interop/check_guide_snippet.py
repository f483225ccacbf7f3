#!/usr/bin/env python3
"""Runs docs/GUIDE.md's Python loading snippet (its ```python interop block) verbatim, after the
guide's CPU commands: transformers + PEFT load the adapter qshard exported and generate a reply.

The guide's ```bash tested blocks are run first (as tests/apps/guide_check.sh runs them, in a
stand-in checkout: configs, data, docs, scripts linked, build/qshard the given binary) unless
--workdir names a folder where they already ran. The snippet then runs in that folder; the check
passes when it exits 0 and prints a reply. Needs torch, transformers and peft (not in CI: the C++
tests never need Python); on a GPU, bitsandbytes too (the snippet loads the 4-bit base there).

Usage: scripts/interop/check_guide_snippet.py [--qshard build/qshard] [--workdir DIR]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDE = os.path.join(HERE, "docs", "GUIDE.md")


def blocks(text, info):
    """The bodies of the fenced blocks whose info string is `info`, in page order."""
    return [m.group(1) for m in re.finditer(r"^```" + re.escape(info) + r"[ \t]*\n(.*?)^```[ \t]*$", text, re.S | re.M)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qshard", default=os.path.join(HERE, "build", "qshard"))
    ap.add_argument("--workdir", help="a folder where the guide's bash blocks already ran")
    a = ap.parse_args()
    for module in ("torch", "transformers", "peft"):
        try:
            __import__(module)
        except ImportError:
            sys.exit(f"check_guide_snippet: needs the Python module {module} (pip install torch transformers peft)")
    text = open(GUIDE, encoding="utf-8").read()
    snippets = blocks(text, "python interop")
    if len(snippets) != 1:
        sys.exit(f"{GUIDE}: expected one ```python interop block, found {len(snippets)}")
    work = a.workdir
    if work is None:
        work = tempfile.mkdtemp(prefix="qshard_guide_")
        os.makedirs(os.path.join(work, "build"))
        for d in ("configs", "data", "docs", "scripts", "tests"):
            os.symlink(os.path.join(HERE, d), os.path.join(work, d))
        os.symlink(os.path.abspath(a.qshard), os.path.join(work, "build", "qshard"))
        for i, body in enumerate(blocks(text, "bash tested")):
            print(f"check_guide_snippet: bash block {i + 1}", flush=True)
            subprocess.run(["bash", "-euo", "pipefail", "-x", "-c", body], cwd=work, check=True)
    print("check_guide_snippet: the Python snippet", flush=True)
    r = subprocess.run([sys.executable, "-c", snippets[0]], cwd=work, capture_output=True, text=True)
    sys.stderr.write(r.stderr[-4000:])
    print(r.stdout)
    if r.returncode != 0:
        sys.exit(f"check_guide_snippet: the snippet failed with exit {r.returncode} (in {work})")
    if not r.stdout.strip():
        sys.exit("check_guide_snippet: the snippet printed no reply")
    print(f"check_guide_snippet: ok (in {work})")


if __name__ == "__main__":
    main()
