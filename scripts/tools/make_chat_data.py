#!/usr/bin/env python3
"""Makes chat fine-tuning data (JSONL `messages` records, `qshard tokenize --format chat`) from the
shipped novel text data/persuasion_vol1.txt: a small, real instruction task with nothing fetched.

Each paragraph of at least MIN_CHARS characters is cut at the sentence end nearest its middle:
  user:      "Continue this passage from Jane Austen's Persuasion:\n\n" + the first half
  assistant: the second half
Every third record also has a system message, and every fifth one a second turn (the user asks
"What comes next?" and the assistant answers with the next paragraph's first sentence), so the
data exercises system prompts and multi-turn masking. Paragraphs in order; the last 10% of the
records go to the held-out file. Deterministic: no randomness.

Usage: scripts/tools/make_chat_data.py [--text data/persuasion_vol1.txt] --out DIR
Writes DIR/chat_train.jsonl and DIR/chat_heldout.jsonl.
"""
import argparse
import json
import os
import re

MIN_CHARS = 300
SYSTEM = "You are a literary assistant who writes in the style of Jane Austen."
ASK = "Continue this passage from Jane Austen's Persuasion:\n\n"


def paragraphs(text):
    out, cur = [], []
    for line in text.splitlines():
        if line.strip():
            cur.append(line.strip())
        elif cur:
            out.append(" ".join(cur))
            cur = []
    if cur:
        out.append(" ".join(cur))
    return out


def cut(p):
    ends = [m.end() for m in re.finditer(r'[.!?]["\u201d\']?\s', p)]
    if not ends:
        return None
    mid = len(p) / 2
    at = min(ends, key=lambda e: abs(e - mid))
    a, b = p[:at].strip(), p[at:].strip()
    return (a, b) if a and b else None


def first_sentence(p):
    m = re.search(r'[.!?]["\u201d\']?(\s|$)', p)
    return p[: m.end()].strip() if m else p


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--text", default=os.path.join(here, "data", "persuasion_vol1.txt"))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.text, encoding="utf-8") as f:
        paras = paragraphs(f.read())
    records = []
    for i, p in enumerate(paras):
        if len(p) < MIN_CHARS:
            continue
        c = cut(p)
        if not c:
            continue
        k = len(records)
        msgs = []
        if k % 3 == 2:
            msgs.append({"role": "system", "content": SYSTEM})
        msgs += [{"role": "user", "content": ASK + c[0]}, {"role": "assistant", "content": c[1]}]
        if k % 5 == 4 and i + 1 < len(paras):
            msgs += [{"role": "user", "content": "What comes next?"},
                     {"role": "assistant", "content": first_sentence(paras[i + 1])}]
        records.append({"messages": msgs})
    n_held = max(1, len(records) // 10)
    os.makedirs(a.out, exist_ok=True)
    for name, part in (("chat_train.jsonl", records[:-n_held]), ("chat_heldout.jsonl", records[-n_held:])):
        with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
            for r in part:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(records) - n_held} training and {n_held} held-out conversations in {a.out}")


if __name__ == "__main__":
    main()
