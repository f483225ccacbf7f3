#!/usr/bin/env python3
"""Interop check: folders qshard writes load in the Hugging Face stack as they are.

1. `qshard quantize` of tests/data/hf/tiny_llama_bf16 -> a temp folder; every tensor loads with
   safetensors.torch.load_file; transformers.AutoModelForCausalLM loads the folder with
   bitsandbytes (Linear4bit modules, quant states rebuilt from the packed JSON); each 4-bit
   weight's dequantized values (bitsandbytes' flat reference) equal the bf16 input within the
   NF4 bucket bound, and the model's logits are finite and close to the bf16 model's.
2. `qshard dequantize` of that folder loads in plain transformers.
3. `qshard init-model` folders load in plain transformers with the config's sizes.
Writes the outcome to tests/data/interop/result.json (checked in, with the versions used).

Run from the repo root after building (bitsandbytes, transformers, torch on the machine):
    python3 scripts/interop/check_interop.py [--qshard build/qshard]
"""
import argparse
import json
import os
import subprocess
import tempfile

import torch
from safetensors.torch import load_file


def run(cmd):
    print("+", " ".join(cmd))
    subprocess.run(cmd, check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qshard", default="build/qshard")
    ap.add_argument("--out", default="tests/data/interop/result.json")
    args = ap.parse_args()
    import bitsandbytes
    import transformers
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    import bitsandbytes.functional as F
    from transformers import AutoModelForCausalLM

    result = {"bitsandbytes": bitsandbytes.__version__, "transformers": transformers.__version__,
              "torch": torch.__version__, "checks": {}}
    src = "tests/data/hf/tiny_llama_bf16"
    with tempfile.TemporaryDirectory() as tmp:
        q, d, r = os.path.join(tmp, "q"), os.path.join(tmp, "d"), os.path.join(tmp, "r")
        run([args.qshard, "quantize", src, q])
        tensors = load_file(os.path.join(q, "model.safetensors"))
        result["checks"]["safetensors_load"] = len(tensors)
        model = AutoModelForCausalLM.from_pretrained(q)
        lin = model.model.layers[0].self_attn.q_proj
        assert type(lin).__name__ == "Linear4bit", type(lin)
        ref = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
        worst = 0.0
        for name, mod in model.named_modules():
            if type(mod).__name__ != "Linear4bit":
                continue
            st = mod.weight.quant_state
            absmax = st.absmax
            if st.nested:
                absmax = F.dequantize_blockwise(st.absmax, st.state2) + st.offset
            deq = _dequantize_4bit_compute(mod.weight.data.reshape(-1), absmax.float(), st.code, st.blocksize,
                                           st.shape, torch.float32)
            orig = ref.get_submodule(name).weight.float()
            # NF4 bucket bound: half the widest gap (0.1385) times the block absmax, plus the
            # double-quantized absmax error.
            err = (deq - orig).abs().max().item() / orig.abs().max().item()
            worst = max(worst, err)
            assert err < 0.2, (name, err)
        result["checks"]["linear4bit_modules_dequant_rel_err_max"] = round(worst, 4)
        run([args.qshard, "dequantize", q, d])
        plain = AutoModelForCausalLM.from_pretrained(d)
        result["checks"]["dequantized_loads"] = type(plain).__name__
        # A forward pass through bitsandbytes' CPU kernels needs every row length to be a multiple
        # of the blocksize (its packed CPU layout), so the logits check uses an init-model folder.
        rq = os.path.join(tmp, "rq")
        run([args.qshard, "init-model", "--out", r, "--layers", "2", "--hidden-size", "128",
             "--intermediate-size", "256", "--vocab-size", "128"])
        rm = AutoModelForCausalLM.from_pretrained(r, dtype=torch.bfloat16)
        assert rm.config.hidden_size == 128 and rm.config.num_hidden_layers == 2
        result["checks"]["init_model_loads"] = type(rm).__name__
        run([args.qshard, "quantize", r, rq])
        qm = AutoModelForCausalLM.from_pretrained(rq)
        ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            a = qm(ids).logits.float()
            b = rm(ids).logits.float()
        assert torch.isfinite(a).all()
        result["checks"]["logits_max_abs_diff_4bit_vs_bf16"] = round((a - b).abs().max().item(), 4)
        result["checks"]["logits_max_abs_bf16"] = round(b.abs().max().item(), 4)
    result["ok"] = True
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
