#!/usr/bin/env python3
"""Makes data/guide/ (docs/GUIDE.md's CPU path): a tiny chat tokenizer and a small chat JSONL.

tokenizer.json: a byte-level BPE with no merges (every UTF-8 byte one token) and SmolLM2's special
tokens in SmolLM2's places: 0 <|endoftext|>, 1 <|im_start|>, 2 <|im_end|>, then byte b at 3 + b
(vocab 259), so `qshard init-model --vocab-size 259` makes a model for it whose config.json
(bos_token_id 1, eos_token_id 2) already agrees. The layout `tokenizers` writes (GPT-2's byte to
unicode map, ByteLevel pre-tokenizer and decoder), so transformers' PreTrainedTokenizerFast and
qshard's native tokenizer read it alike.
tokenizer_config.json: bos <|im_start|>, eos <|im_end|>, pad <|endoftext|> and SmolLM2-Instruct's
chat template (ChatML; tests/data/chat_template/templates/HuggingFaceTB-SmolLM2-Instruct.jinja).
chat_train.jsonl / chat_eval.jsonl: the first 48 and the last 8 records of
scripts/tools/make_chat_data.py's chat_train.jsonl (conversations cut from data/persuasion_vol1.txt).

Deterministic; nothing fetched. Usage: scripts/tools/make_guide_data.py [--out data/guide]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def bytes_to_unicode():
    """GPT-2's map from bytes to printable unicode characters (what ByteLevel pre-tokenizes into)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tokenizer_json():
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for b, ch in sorted(bytes_to_unicode().items()):
        vocab[ch] = len(SPECIALS) + b
    added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, tok in enumerate(SPECIALS)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }


def tokenizer_config():
    with open(os.path.join(HERE, "tests/data/chat_template/templates/HuggingFaceTB-SmolLM2-Instruct.jinja"),
              encoding="utf-8") as f:
        template = f.read()
    return {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "clean_up_tokenization_spaces": False,
        "model_max_length": 1024, "chat_template": template,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "data", "guide"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False, indent=2)
        f.write("\n")
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(), f, ensure_ascii=False, indent=2)
        f.write("\n")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, os.path.join(HERE, "scripts/tools/make_chat_data.py"), "--out", tmp], check=True)
        with open(os.path.join(tmp, "chat_train.jsonl"), encoding="utf-8") as f:
            records = f.readlines()
    for name, part in (("chat_train.jsonl", records[:48]), ("chat_eval.jsonl", records[-8:])):
        with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
            f.writelines(part)
    print(f"wrote {a.out}: tokenizer.json, tokenizer_config.json, chat_train.jsonl (48), chat_eval.jsonl (8)")


if __name__ == "__main__":
    main()
