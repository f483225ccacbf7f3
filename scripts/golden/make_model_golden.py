#!/usr/bin/env python3
"""Golden data for tests/model: logits, loss and LoRA gradients of tiny Llamas computed by
transformers + PEFT on the CPU in float32 (qshard's CPU model must reproduce them).

Run from the repo root:  python3 scripts/golden/make_model_golden.py [--out tests/data/model]

Two cases (see tests/data/model/README.md):
  nf4    : tests/data/hf/tiny_llama_bnb4_nf4_dq itself (GQA 4 heads / 2 kv heads, untied) as
           transformers + bitsandbytes load it on the CPU: its Linear4bit modules computing in float32
           (scripts/golden/bnb_reference.py bnb_model), embeddings / norms / lm_head widened to f32.
           So the forward multiplies with the float32 products code * absmax (bitsandbytes 0.50.2's
           gemm_4bit) and the backward with dequantize_4bit's bf16 values (MatMul4Bit.backward).
           The script checks that bnb_reference.emulated_model (those two rules written out) gives
           the same bits, and prints how far the golden is from the other choice of each rule.
  llama3 : a fresh random f32 model saved here as an HF folder (tiny_llama3_tied/): tied embeddings,
           GQA 4 heads / 1 kv head, head_dim 16 != hidden/heads, llama3 rope scaling with all three
           frequency bands present.
Each case: a PEFT LoRA (r=4, alpha=8, dropout 0, all 7 projections) with lora_B set to small random
values, one batch (B=2, T=11, some labels -100), loss = model(input_ids, labels=labels).loss,
loss.backward(). Stored in <case>.golden.safetensors:
  input_ids [B,T] I64, labels [B,T] I64 (raw, as given to transformers), targets [B,T] I64 (labels
  shifted the way transformers' causal-LM loss does: targets[:, t] = labels[:, t+1], last = -100),
  logits [B,T,V] F32, loss [] F32 (mean over non-ignored targets), normalizer [] I64 (their count),
  grad.<adapter key> F32 for every lora_A / lora_B (adapter key = PEFT's file key,
  base_model.model.<module path>.lora_A.weight).
and the adapter as PEFT saves it in <case>_adapter/ (adapter_model.safetensors, adapter_config.json).
The script also reruns each case in float64 and prints the f32-vs-f64 differences (fp32 noise).
"""
import argparse
import json
import os
import shutil
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model

from bnb_reference import bnb_model, emulated_model  # scripts/golden, the script's own folder

HF = "tests/data/hf"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
B, T = 2, 11


NF4_FOLDER = f"{HF}/tiny_llama_bnb4_nf4_dq"


def nf4_base():
    return bnb_model(NF4_FOLDER)  # the real Linear4bit modules, computing in float32


def nf4_others():
    """The same computation with the rules written out (must match bit for bit), in float64 (the
    noise), and with each rule swapped (what the C++ test would see if qshard got it wrong)."""
    return {
        "emulation": emulated_model(NF4_FOLDER),
        "float64": emulated_model(NF4_FOLDER, torch.float64),
        "forward rounded to bf16": emulated_model(NF4_FOLDER, forward_rounded=True),
        "backward not rounded": emulated_model(NF4_FOLDER, backward_rounded=False),
    }


def llama3_base(out_dir):
    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
        rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.1, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32},
    )
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():  # non-trivial norm weights
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    folder = os.path.join(out_dir, "tiny_llama3_tied")
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, safe_serialization=True)
    gen = os.path.join(folder, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    return model


def batch(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100  # a masked prompt
    labels[1, 7] = -100
    labels[1, 10] = -100
    return ids, labels


def add_lora(model, seed):
    torch.manual_seed(seed)
    lcfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    pm = get_peft_model(model, lcfg)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn_like(p))
    return pm


def adapter_key(param_name):
    # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight -> PEFT's file key
    return param_name.replace(".default.", ".")


def run(pm, ids, labels):
    pm.zero_grad()
    out = pm(input_ids=ids, labels=labels)
    out.loss.backward()
    grads = {adapter_key(n): p.grad.detach().clone() for n, p in pm.named_parameters() if p.requires_grad}
    return out.logits.detach(), out.loss.detach(), grads


def make_case(name, model, vocab, out_dir, seed, others=None):
    pm = add_lora(model, seed)
    pm.train()
    ids, labels = batch(vocab, seed)
    logits, loss, grads = run(pm, ids, labels)
    targets = torch.full_like(labels, -100)
    targets[:, :-1] = labels[:, 1:]
    tensors = {
        "input_ids": ids.contiguous(), "labels": labels.contiguous(), "targets": targets.contiguous(),
        "logits": logits.contiguous(), "loss": loss.reshape([]).contiguous(),
        "normalizer": torch.tensor((targets != -100).sum().item(), dtype=torch.int64),
    }
    for k, g in grads.items():
        tensors["grad." + k] = g.contiguous()
    save_file(tensors, os.path.join(out_dir, f"{name}.golden.safetensors"), metadata={"format": "pt"})
    adir = os.path.join(out_dir, f"{name}_adapter")
    shutil.rmtree(adir, ignore_errors=True)
    pm.save_pretrained(adir, safe_serialization=True)
    cfg_path = os.path.join(adir, "adapter_config.json")  # no folder path of this machine in it
    with open(cfg_path) as f:
        acfg = json.load(f)
    acfg["base_model_name_or_path"] = None
    with open(cfg_path, "w") as f:
        f.write(json.dumps(acfg, indent=2, sort_keys=True))
    for extra in os.listdir(adir):
        if extra not in ("adapter_model.safetensors", "adapter_config.json"):
            os.remove(os.path.join(adir, extra))
    if others is None:  # fp32 noise: the same computation in float64
        others = {"float64": None}
    for label, base in others.items():
        pv = pm.double() if base is None else with_lora_of(pm, base)
        logits2, loss2, grads2 = run(pv, ids, labels)
        dl = ((logits.double() - logits2.double()).abs().max() / logits2.abs().max()).item()
        worst = max(((g.double() - grads2[k].double()).abs().max() / grads2[k].abs().max()).item()
                    for k, g in grads.items())
        print(f"{name} vs {label}: loss {loss.item():.7f} / {loss2.item():.9f}, logits max|diff| / max|logit| "
              f"{dl:.3e}, LoRA grads max|diff| / max|g| {worst:.3e} ({len(grads)} grads, normalizer "
              f"{tensors['normalizer'].item()})")
        if label == "emulation" and (dl != 0.0 or worst != 0.0):
            raise SystemExit(f"{name}: bitsandbytes' forward / backward are not the rules bnb_reference states")


def with_lora_of(pm, base):
    """`base` with the LoRA weights of `pm`, in base's dtype, in training mode."""
    pv = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS,
                                         task_type="CAUSAL_LM"))
    src = dict(pm.named_parameters())
    with torch.no_grad():
        for n, p in pv.named_parameters():
            if p.requires_grad:
                p.copy_(src[n].to(p.dtype))
    return pv.train()


def main():
    # PEFT writes target_modules from a Python set: fix the hash seed so reruns give identical files.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONHASHSEED="0"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/model")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    make_case("nf4", nf4_base(), 128, args.out, seed=5, others=nf4_others())
    make_case("llama3", llama3_base(args.out), 96, args.out, seed=6)


if __name__ == "__main__":
    main()
