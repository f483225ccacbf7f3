#!/usr/bin/env python3
"""Training and held-out data for the real-model check (issue 11): a text file split by paragraphs,
the first part for training, the last --heldout fraction held out, both tokenized with a model
folder's Hugging Face tokenizer.

Writes into --out:
  train.txt, heldout.txt    the split text (paragraphs kept whole, in order)
  heldout.json              the held-out paragraphs, each wrapped BOS + ids + EOS as
                            scripts/tools/tokenize_hf.py does, concatenated and cut into --seq-len
                            token-id lists (the `qshard eval --data X.json` form; the last
                            partial sequence dropped)
Token files (train.tok / heldout.tok) are made from the .txt files with scripts/tools/tokenize_hf.py.

Usage: scripts/tools/real_model_data.py --tokenizer MODEL_DIR data/persuasion_vol1.txt --out DIR
Needs: transformers (for the tokenizer; the folder is read locally, nothing is downloaded).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenize_hf import documents  # noqa: E402  (the same paragraph split as the token files)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("text")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--heldout", type=float, default=0.1, help="fraction of paragraphs held out (default 0.1)")
    ap.add_argument("--seq-len", type=int, default=256)
    args = ap.parse_args()
    if not 0 < args.heldout < 1:
        raise SystemExit(f"--heldout {args.heldout}: expected a fraction in (0, 1)")
    from transformers import AutoTokenizer

    paras = list(documents(args.text, "text", None, "blank-lines"))
    if len(paras) < 10:
        raise SystemExit(f"{args.text}: {len(paras)} paragraphs; need at least 10 to hold some out")
    cut = len(paras) - max(1, int(len(paras) * args.heldout))
    os.makedirs(args.out, exist_ok=True)
    for name, part in (("train.txt", paras[:cut]), ("heldout.txt", paras[cut:])):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            f.write("\n\n".join(part) + "\n")
    tok = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
    ids = []
    for p in paras[cut:]:  # wrapped as scripts/tools/tokenize_hf.py wraps a document: BOS + ids + EOS
        if tok.bos_token_id is not None:
            ids.append(tok.bos_token_id)
        ids += tok.encode(p, add_special_tokens=False)
        if tok.eos_token_id is not None:
            ids.append(tok.eos_token_id)
    T = args.seq_len
    seqs = [ids[i:i + T] for i in range(0, len(ids) - T + 1, T)]
    if not seqs:
        raise SystemExit(f"held-out text has {len(ids)} tokens, fewer than --seq-len {T}")
    with open(os.path.join(args.out, "heldout.json"), "w") as f:
        json.dump(seqs, f)
    print(f"{args.text}: {len(paras)} paragraphs, {cut} for training, {len(paras) - cut} held out "
          f"({len(ids)} tokens -> {len(seqs)} sequences of {T})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
