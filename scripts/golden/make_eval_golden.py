#!/usr/bin/env python3
"""Golden logits for `qshard eval --dump-logits`, made with transformers (+ peft) in float32.

Reuses the inputs of tests/data/model/*.golden.safetensors (scripts/golden/make_model_golden.py) and
writes tests/data/model/eval_golden.safetensors with, under these keys, logits [B, T, V]:
  f32_plain        tests/data/model/tiny_llama3_tied (a float32 folder), no adapter
  f32_adapter      the same + tests/data/model/llama3_adapter (PEFT)
  bnb_plain        tests/data/hf/tiny_llama_bnb4_nf4_dq as bitsandbytes computes it in float32: its
                   4-bit weights dequantized by bitsandbytes in their stored dtype (bf16,
                   scripts/golden/bnb_reference.py), widened to float32, in a float32 LlamaForCausalLM
                   (bitsandbytes' CPU forward cannot run these 96-column weights, see
                   docs/FORMATS_NOTES.md)
  bnb_adapter      the same + tests/data/model/nf4_adapter
and the token ids as JSON lists (tests/data/model/eval_ids_{f32,bnb}.json) for `qshard eval --data`.
Run from the repo root: python3 scripts/golden/make_eval_golden.py
"""
import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, LlamaForCausalLM
from peft import PeftModel

from bnb_reference import dequantize_folder  # scripts/, the script's own folder

D = "tests/data/model"


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float().contiguous()


def bnb_as_f32():
    folder = "tests/data/hf/tiny_llama_bnb4_nf4_dq"
    cfg = AutoConfig.from_pretrained(folder)
    cfg.quantization_config = None
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).float().eval()
    deq = dequantize_folder(folder)  # bf16, as bitsandbytes' dequantize_4bit gives it
    stored = safe_open(os.path.join(folder, "model.safetensors"), "pt")
    sd = {}
    for name, _ in model.state_dict().items():
        sd[name] = deq[name].float() if name in deq else stored.get_tensor(name).float()
    model.load_state_dict(sd, strict=True)
    return model


def main():
    torch.manual_seed(0)
    out = {}
    ids_f32 = safe_open(f"{D}/llama3.golden.safetensors", "pt").get_tensor("input_ids")
    ids_bnb = safe_open(f"{D}/nf4.golden.safetensors", "pt").get_tensor("input_ids")
    m = LlamaForCausalLM.from_pretrained(f"{D}/tiny_llama3_tied", dtype=torch.float32, attn_implementation="eager").eval()
    out["f32_plain"] = logits_of(m, ids_f32)
    out["f32_adapter"] = logits_of(PeftModel.from_pretrained(m, f"{D}/llama3_adapter").eval(), ids_f32)
    b = bnb_as_f32()
    out["bnb_plain"] = logits_of(b, ids_bnb)
    out["bnb_adapter"] = logits_of(PeftModel.from_pretrained(b, f"{D}/nf4_adapter").eval(), ids_bnb)
    save_file(out, f"{D}/eval_golden.safetensors", metadata={"transformers": __import__("transformers").__version__})
    for name, ids in (("f32", ids_f32), ("bnb", ids_bnb)):
        with open(f"{D}/eval_ids_{name}.json", "w") as f:
            json.dump(ids.tolist(), f)
    print({k: tuple(v.shape) for k, v in out.items()})


if __name__ == "__main__":
    main()
