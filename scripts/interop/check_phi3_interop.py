#!/usr/bin/env python3
"""transformers + bitsandbytes + PEFT load qshard's exports of a Phi-3 QLoRA job (CPU) and give
qshard's logits.

A 1-rank job (`qshard train`) on tests/data/family/phi3_bnb4 (the 4-bit Phi-3 folder transformers
+ bitsandbytes wrote; fused qkv_proj / gate_up_proj) starts from PEFT's adapter
tests/data/family/phi3_adapter (lora.init_adapter), trains 4 steps and exports: the bnb4 base, the
PEFT adapter (qkv_proj / gate_up_proj of rank 3r / 2r with block-diagonal lora_B and
rank_pattern / alpha_pattern), and `qshard export --format merged`. This script then checks:
  - the base is byte for byte the input folder (every tensor: the fused 4-bit weights as stored);
  - PEFT loads the adapter on Phi3ForCausalLM (float32 model holding the base's 4-bit weights as
    bitsandbytes' forward multiplies with them: scripts/golden/bnb_reference.dequantize_folder;
    the CPU Linear4bit of bitsandbytes 0.50.2 is not used, its AVX-512 dequant is wrong for rows
    shorter than 64) and its logits equal `qshard eval --adapter` within 1e-4 (1e-5 measured);
  - transformers loads the merged bf16 folder and its logits equal `qshard eval` of it.
Usage (repo root, after building; QSHARD defaults to build-cpu/qshard):
  python3 scripts/interop/check_phi3_interop.py
Versions: torch 2.15, transformers 5.25, peft 0.21.2, bitsandbytes 0.50.2 (as make_phi3_golden.py).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden"))
import bnb_reference  # noqa: E402

QSHARD = os.environ.get("QSHARD", "build-cpu/qshard")
FAM = "tests/data/family"
TOL = 1e-4


def run(*args):
    subprocess.run([QSHARD, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def qshard_logits(tmp, model, adapter=None):
    out = os.path.join(tmp, "logits.safetensors")
    args = ["eval", "--device", "cpu", "--model", model, "--data", os.path.join(FAM, "ids.json"), "--dump-logits", out]
    if adapter:
        args += ["--adapter", adapter]
    run(*args)
    with safe_open(out, "pt") as f:
        return f.get_tensor("logits")


def main():
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    ids = torch.tensor(json.load(open(os.path.join(FAM, "ids.json"))))
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "d.tok")
        tokens = [(i * 7 + (i // 5) % 3) % 50 for i in range(4000)]  # a token file of version 1 (text/token_file.h)
        with open(data, "wb") as f:
            f.write(b"QSTOKENS" + struct.pack("<IIQII", 1, 128, len(tokens), 4, 0) + struct.pack(f"<{len(tokens)}I", *tokens))
        run_dir = os.path.join(tmp, "run")
        cfg = os.path.join(tmp, "job.yaml")
        with open(cfg, "w") as f:
            f.write(f"""model:
  path: {FAM}/phi3_bnb4
lora:
  r: 4
  alpha: 8
  target_modules: [qkv_proj, o_proj, gate_up_proj, down_proj]
  init_adapter: {FAM}/phi3_adapter
data:
  train: {data}
  max_seq_len: 32
batch:
  global_batch_size: 4
  micro_batch_size: 1
steps: 4
optimizer:
  lr: 0.01
checkpoint:
  dir: {run_dir}
device: cpu
""")
        run("train", "--config", cfg)
        base, adapter = os.path.join(run_dir, "final", "base_bnb4"), os.path.join(run_dir, "final", "adapter")
        merged = os.path.join(tmp, "merged")
        ckpts = sorted(d for d in os.listdir(run_dir) if d.startswith("step-"))
        run("export", os.path.join(run_dir, ckpts[-1]), "--format", "merged", "--out", merged)

        # The base: the input folder's tensors, byte for byte.
        with safe_open(os.path.join(base, "model.safetensors"), "pt") as a, \
                safe_open(os.path.join(FAM, "phi3_bnb4", "model.safetensors"), "pt") as b:
            same = sorted(a.keys()) == sorted(b.keys()) and all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in b.keys())
            count = len(list(b.keys()))
        print(f"bnb4 base: {count} tensors, byte-identical to the input folder: {same}")
        failed += not same

        # PEFT on the 4-bit base's weights.
        ac = json.load(open(os.path.join(adapter, "adapter_config.json")))
        pm = PeftModel.from_pretrained(bnb_reference.forward_rule_model(base), adapter).eval()
        with torch.no_grad():
            theirs = pm(input_ids=ids).logits.float()
        mine = qshard_logits(tmp, base, adapter)
        d = float((theirs - mine).abs().max())
        print(f"PEFT adapter (rank_pattern {ac['rank_pattern']}, alpha_pattern {ac['alpha_pattern']}): "
              f"max |PEFT - qshard eval| {d:.3e} (largest logit {float(theirs.abs().max()):.3f})")
        failed += not d <= TOL

        # transformers on the merged bf16 folder (fused names), computing in float32.
        m = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32, attn_implementation="eager").eval()
        assert m.config.model_type == "phi3" and hasattr(m.model.layers[0].self_attn, "qkv_proj")
        with torch.no_grad():
            theirs = m(input_ids=ids).logits.float()
        d = float((theirs - qshard_logits(tmp, merged)).abs().max())
        print(f"merged bf16 folder: max |transformers - qshard eval| {d:.3e}")
        failed += not d <= TOL
    print("FAILED" if failed else "ok")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
