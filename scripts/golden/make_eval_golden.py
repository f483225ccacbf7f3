#!/usr/bin/env python3
"""Golden logits for `qshard eval --dump-logits`, made with transformers (+ peft) in float32.

Reuses the inputs of tests/data/model/*.golden.safetensors (scripts/golden/make_model_golden.py) and
writes tests/data/model/eval_golden.safetensors with, under these keys, logits [B, T, V]:
  f32_plain        tests/data/model/tiny_llama3_tied (a float32 folder), no adapter
  f32_adapter      the same + tests/data/model/llama3_adapter (PEFT)
  bnb_plain        tests/data/hf/tiny_llama_bnb4_nf4_dq as transformers + bitsandbytes 0.50.2 compute it
                   in float32 on the CPU: its real Linear4bit modules with compute dtype float32
                   (scripts/golden/bnb_reference.py bnb_model; gemm_4bit multiplies with the float32
                   products code * absmax, not rounded to the quant state's bf16). bitsandbytes 0.50.2's
                   CPU dequant runs these 96-column down_proj weights over flat blocks (its scalar
                   kernel; bnb_model refuses a machine where its AVX-512 branch would index absmax
                   per row), so no emulation is needed any more
  bnb_adapter      the same + tests/data/model/nf4_adapter
and the token ids as JSON lists (tests/data/model/eval_ids_{f32,bnb}.json) for `qshard eval --data`.
Run from the repo root: python3 scripts/golden/make_eval_golden.py
"""
import json

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LlamaForCausalLM
from peft import PeftModel

from bnb_reference import bnb_model  # scripts/golden, the script's own folder

D = "tests/data/model"


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float().contiguous()


def main():
    torch.manual_seed(0)
    out = {}
    ids_f32 = safe_open(f"{D}/llama3.golden.safetensors", "pt").get_tensor("input_ids")
    ids_bnb = safe_open(f"{D}/nf4.golden.safetensors", "pt").get_tensor("input_ids")
    m = LlamaForCausalLM.from_pretrained(f"{D}/tiny_llama3_tied", dtype=torch.float32, attn_implementation="eager").eval()
    out["f32_plain"] = logits_of(m, ids_f32)
    out["f32_adapter"] = logits_of(PeftModel.from_pretrained(m, f"{D}/llama3_adapter").eval(), ids_f32)
    b = bnb_model("tests/data/hf/tiny_llama_bnb4_nf4_dq")
    out["bnb_plain"] = logits_of(b, ids_bnb)
    out["bnb_adapter"] = logits_of(PeftModel.from_pretrained(b, f"{D}/nf4_adapter").eval(), ids_bnb)
    save_file(out, f"{D}/eval_golden.safetensors", metadata={"transformers": __import__("transformers").__version__,
                                                              "bitsandbytes": __import__("bitsandbytes").__version__})
    for name, ids in (("f32", ids_f32), ("bnb", ids_bnb)):
        with open(f"{D}/eval_ids_{name}.json", "w") as f:
            json.dump(ids.tolist(), f)
    print({k: tuple(v.shape) for k, v in out.items()})


if __name__ == "__main__":
    main()
