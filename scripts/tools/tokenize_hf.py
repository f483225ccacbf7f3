#!/usr/bin/env python3
"""Tokenizes text / JSONL files with a local Hugging Face tokenizer into a qshard token file.

The output is the token-file format of src/text/token_file.h (32-byte header "QSTOKENS",
u32 version 3, u32 vocab_size, u64 num_tokens, u32 dtype 4 = uint32, u32 reserved 0, then
little-endian uint32 tokens, the first token of each document with bit 30 set), the same that
`qshard tokenize` writes.
Documents are split as the C++ tokenizer does (src/text/byte_tokenizer.h): text files are one
document each (or paragraphs with --split blank-lines), JSONL lines give the string field
--field (default "text"); by default --format auto picks jsonl for .jsonl/.json files. Each
document is encoded without special tokens and wrapped as BOS + ids + EOS with the tokenizer's
bos/eos token ids where it has them (--no-bos / --no-eos to leave them out).
vocab_size in the header is len(tokenizer) (base vocabulary plus added tokens).

The tokenizer is loaded from a local folder only (local_files_only=True): no network.
Usage: scripts/tools/tokenize_hf.py --tokenizer /models/llama data/*.txt -o build/data/train.tok
Needs: pip install transformers (and tokenizers / sentencepiece as the tokenizer requires).
"""
import argparse
import json
import os
import struct
import sys

MAGIC = b"QSTOKENS"
HEADER = struct.Struct("<8sIIQII")  # 32 bytes
DOC_START = 1 << 30  # version 3: the first token of a document
assert HEADER.size == 32


def documents(path, fmt, field, split):
    if fmt == "auto":
        fmt = "jsonl" if path.endswith((".jsonl", ".json")) else "text"
    with open(path, "rb") as f:
        data = f.read()
    if fmt == "text":
        text = data.decode("utf-8")
        if split == "file":
            if text:
                yield text
            return
        para = []
        for line in text.split("\n"):
            if line.strip(" \t\r") == "":
                if para:
                    yield "\n".join(para)
                para = []
            else:
                para.append(line)
        if para:
            yield "\n".join(para)
        return
    for n, line in enumerate(data.decode("utf-8").split("\n"), 1):
        if line.strip(" \t\r") == "":
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"{path}:{n}: not valid JSON: {e}")
        if not isinstance(obj, dict):
            raise SystemExit(f"{path}:{n}: expected a JSON object per line")
        if field not in obj:
            raise SystemExit(f"{path}:{n}: no field \"{field}\" (choose it with --field)")
        if not isinstance(obj[field], str):
            raise SystemExit(f"{path}:{n}: field \"{field}\" is not a string")
        if obj[field]:
            yield obj[field]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--tokenizer", required=True, help="local folder with the Hugging Face tokenizer files")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--format", choices=["auto", "text", "jsonl"], default="auto")
    ap.add_argument("--field", default="text", help="JSONL field holding the document (default: text)")
    ap.add_argument("--split", choices=["file", "blank-lines"], default="file")
    ap.add_argument("--no-bos", action="store_true")
    ap.add_argument("--no-eos", action="store_true")
    args = ap.parse_args()
    try:
        from transformers import AutoTokenizer
    except ImportError:
        print("tokenize_hf.py: transformers is not installed (pip install transformers)", file=sys.stderr)
        return 2
    if not os.path.isdir(args.tokenizer):
        print(f"tokenize_hf.py: {args.tokenizer}: not a local folder (this script never downloads)", file=sys.stderr)
        return 1
    tok = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
    vocab = len(tok)
    bos = None if args.no_bos else tok.bos_token_id
    eos = None if args.no_eos else tok.eos_token_id

    tmp = f"{args.output}.tmp.{os.getpid()}"
    count = docs = 0
    try:
        with open(tmp, "wb") as out:
            out.write(HEADER.pack(MAGIC, 3, vocab, 0, 4, 0))  # version 3: document starts flagged
            for path in args.inputs:
                for doc in documents(path, args.format, args.field, args.split):
                    ids = tok.encode(doc, add_special_tokens=False)
                    ids = ([bos] if bos is not None else []) + ids + ([eos] if eos is not None else [])
                    bad = [i for i in ids if not 0 <= i < vocab]
                    if bad:
                        raise SystemExit(f"{path}: token id {bad[0]} outside [0, {vocab})")
                    if ids:
                        ids[0] |= DOC_START
                    out.write(struct.pack(f"<{len(ids)}I", *ids))
                    count += len(ids)
                    docs += 1
            out.seek(16)
            out.write(struct.pack("<Q", count))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, args.output)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    print(f"wrote {args.output}: {docs} documents, {count} tokens, vocab_size {vocab}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
