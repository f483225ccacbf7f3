#!/usr/bin/env python3
"""Golden Hugging Face folders for qshard's checkpoint reader/writer, made with REAL transformers
and bitsandbytes on the CPU.

Produces (under --out, default tests/data/hf):
  tiny_llama_f32/              random tiny LlamaForCausalLM, save_pretrained(safe_serialization=True), float32
  tiny_llama_bf16/             the same weights cast to bfloat16
  tiny_llama_bf16_sharded/     the bf16 model saved with a small max_shard_size (several shards +
                               model.safetensors.index.json)
  tiny_llama_bnb4_nf4_dq/      tiny_llama_bf16 loaded with BitsAndBytesConfig(load_in_4bit, nf4,
                               double quant, compute dtype bf16) on CPU, then save_pretrained
  tiny_llama_bnb4_fp4/         likewise, fp4 without double quant
  tiny_llama_f32_bnb4_nf4_dq/  tiny_llama_f32 loaded (dtype float32) with BitsAndBytesConfig(load_in_4bit,
                               nf4, double quant) and transformers' default compute dtype (float32)
  tiny_llama_f32_bnb4_fp4/     tiny_llama_f32 loaded (dtype float32) with fp4, no double quant and
                               compute dtype bfloat16 (a compute dtype that differs from the weights')
  layout.json                  for every folder: config.json quantization_config (if any) and the
                               safetensors key order with dtype and shape, as read from the files;
                               for the 4-bit folders also the in-memory state_dict order of one
                               layer and whether transformers' bytes equal a direct
                               bitsandbytes.functional.quantize_4bit of the bf16 weights

Model: vocab 128, hidden 64, intermediate 96, 2 layers, 4 heads, 2 kv heads, max_pos 128,
untied embeddings, rms_norm_eps 1e-5, rope_theta 10000.  Weights come from torch.manual_seed(0)
(transformers' own init), so the script is reproducible.

Run (from the repo root):   python3 scripts/golden/make_hf_golden.py [--out tests/data/hf]
"""

import argparse
import json
import os
import shutil
import struct

import torch
import transformers
import bitsandbytes
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM


def tiny_config():
    return LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
    )


def safetensors_layout(path):
    """Key order (as stored in the header, i.e. file order by data offset), dtype, shape."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    meta = header.pop("__metadata__", None)
    keys = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    return {"metadata": meta,
            "tensors": [[k, header[k]["dtype"], header[k]["shape"]] for k in keys]}


def folder_layout(folder):
    out = {"files": sorted(os.listdir(folder))}
    cfg = json.load(open(os.path.join(folder, "config.json")))
    out["quantization_config"] = cfg.get("quantization_config")
    out["safetensors"] = {fn: safetensors_layout(os.path.join(folder, fn))
                          for fn in sorted(os.listdir(folder)) if fn.endswith(".safetensors")}
    return out


def fresh(folder):
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join("tests", "data", "hf"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config()).eval()

    # 1. plain float32 and bfloat16 folders, plus a sharded bf16 folder
    d_f32 = os.path.join(args.out, "tiny_llama_f32")
    fresh(d_f32)
    model.to(torch.float32).save_pretrained(d_f32, safe_serialization=True)
    f32_sd = {k: v.clone() for k, v in model.state_dict().items()}

    d_bf16 = os.path.join(args.out, "tiny_llama_bf16")
    fresh(d_bf16)
    model_bf16 = model.to(torch.bfloat16)
    model_bf16.save_pretrained(d_bf16, safe_serialization=True)

    d_shard = os.path.join(args.out, "tiny_llama_bf16_sharded")
    fresh(d_shard)
    # bf16 total is ~156 KB; 70 KB shards give 3 files
    model_bf16.save_pretrained(d_shard, safe_serialization=True, max_shard_size="70KB")
    bf16_sd = {k: v.clone() for k, v in model_bf16.state_dict().items()}

    # 2. 4-bit folders: load the bf16 or f32 folder through transformers' bitsandbytes integration
    # (folder, source folder, load dtype, source weights, BitsAndBytesConfig arguments); a
    # compute dtype left out is transformers' default (float32).
    variants = [
        ("tiny_llama_bnb4_nf4_dq", d_bf16, torch.bfloat16, bf16_sd,
         dict(bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)),
        ("tiny_llama_bnb4_fp4", d_bf16, torch.bfloat16, bf16_sd,
         dict(bnb_4bit_quant_type="fp4", bnb_4bit_use_double_quant=False, bnb_4bit_compute_dtype=torch.bfloat16)),
        ("tiny_llama_f32_bnb4_nf4_dq", d_f32, torch.float32, f32_sd,
         dict(bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)),
        ("tiny_llama_f32_bnb4_fp4", d_f32, torch.float32, f32_sd,
         dict(bnb_4bit_quant_type="fp4", bnb_4bit_use_double_quant=False, bnb_4bit_compute_dtype=torch.bfloat16)),
    ]
    extra = {}
    for name, src, dtype, src_sd, kw in variants:
        qcfg = BitsAndBytesConfig(load_in_4bit=True, **kw)
        torch.manual_seed(0)
        qmodel = AutoModelForCausalLM.from_pretrained(
            src, quantization_config=qcfg, device_map="cpu", dtype=dtype)
        d = os.path.join(args.out, name)
        fresh(d)
        qmodel.save_pretrained(d, safe_serialization=True)

        # Record the in-memory state_dict order of one 4-bit layer (the file order differs:
        # the safetensors writer sorts by dtype size, then name) and check that transformers'
        # bytes equal a direct bitsandbytes.functional.quantize_4bit of the source weight.
        sd = qmodel.state_dict()
        prefix = "model.layers.0.self_attn.q_proj."
        info = {"state_dict_order_q_proj": [
            [k, str(v.dtype).replace("torch.", ""), list(v.shape)]
            for k, v in sd.items() if k.startswith(prefix)]}
        match = {}
        for k in sd:
            if k.endswith("_proj.weight"):
                p, st = bitsandbytes.functional.quantize_4bit(
                    src_sd[k], blocksize=64, quant_type=kw["bnb_4bit_quant_type"],
                    compress_statistics=kw["bnb_4bit_use_double_quant"])
                same = torch.equal(p, sd[k])
                for qk, qv in st.as_dict(packed=True).items():
                    same = same and torch.equal(qv, sd[k + "." + qk])
                match[k] = same
        info["all_4bit_layers_equal_direct_quantize_4bit"] = all(match.values())
        info["n_4bit_layers"] = len(match)
        extra[name] = info
        del qmodel

    layout = {
        "transformers": transformers.__version__,
        "bitsandbytes": bitsandbytes.__version__,
        "torch": torch.__version__,
        "folders": {fn: folder_layout(os.path.join(args.out, fn))
                    for fn in sorted(os.listdir(args.out))
                    if os.path.isdir(os.path.join(args.out, fn))},
        "bnb4_checks": extra,
    }
    with open(os.path.join(args.out, "layout.json"), "w") as f:
        json.dump(layout, f, indent=1)
        f.write("\n")

    for fn, lay in layout["folders"].items():
        size = sum(os.path.getsize(os.path.join(args.out, fn, x)) for x in lay["files"])
        print("%-26s %8d bytes  files=%s" % (fn, size, lay["files"]))
    print(json.dumps(extra, indent=1))


if __name__ == "__main__":
    main()
