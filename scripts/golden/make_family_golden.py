#!/usr/bin/env python3
"""Tiny Qwen2, Qwen3 and Mistral models and their logits, made with transformers in float32.

For each family a random-weight model is built from the family's own config class (fixed seed,
float32), its biases and q/k norms made non-trivial (random, not the init's zeros / ones), and
saved with save_pretrained(safe_serialization=True) into tests/data/family/<family>/ (config.json
+ model.safetensors, tens of KB). Then the logits of fixed input ids are written:
  tests/data/family/ids.json               the ids [B, T] as JSON lists (`qshard eval --data`)
  tests/data/family/golden.safetensors     "<family>" -> logits [B, T, V] f32 (eager attention)
Families:
  qwen2    q/k/v biases, no o_proj bias, tied embeddings, use_sliding_window false
  qwen3    q_norm / k_norm, an explicit head_dim (16) that differs from hidden / heads (8),
           attention_bias true (biases on all four attention projections), untied
  mistral  sliding_window 4 < T = 12 (the window masks), an explicit head_dim, untied
Run from the repo root: python3 scripts/golden/make_family_golden.py
"""
import json
import os

import torch
from safetensors.torch import save_file
from transformers import (MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

D = "tests/data/family"
B, T, V = 2, 12, 128
COMMON = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=V, max_position_embeddings=64, rms_norm_eps=1e-6,
              bos_token_id=1, eos_token_id=2)


def families():
    return {
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(**COMMON, rope_theta=1000000.0, tie_word_embeddings=True,
                                                 use_sliding_window=False, sliding_window=None,
                                                 max_window_layers=2)),
        "qwen3": (Qwen3ForCausalLM, Qwen3Config(**COMMON, head_dim=16, rope_theta=1000000.0, attention_bias=True,
                                                 tie_word_embeddings=False, use_sliding_window=False)),
        "mistral": (MistralForCausalLM, MistralConfig(**COMMON, head_dim=8, rope_theta=10000.0, sliding_window=4,
                                                       tie_word_embeddings=False)),
    }


def main():
    ids = torch.randint(3, V, (B, T), generator=torch.Generator().manual_seed(7))
    out = {}
    for seed, (name, (cls, cfg)) in enumerate(families().items()):
        torch.manual_seed(100 + seed)
        cfg._attn_implementation = "eager"
        model = cls(cfg).float().eval()
        with torch.no_grad():
            for key, p in model.named_parameters():
                if key.endswith(".bias"):
                    p.copy_(torch.randn_like(p) * 0.5)  # non-trivial biases
                elif key.endswith("norm.weight"):
                    p.copy_(1.0 + torch.randn_like(p) * 0.3)  # every RMSNorm, q_norm / k_norm included
                else:
                    p.copy_(torch.randn_like(p) * 0.2)  # larger than the init's 0.02: logits ~1
        folder = os.path.join(D, name)
        os.makedirs(folder, exist_ok=True)
        model.save_pretrained(folder, safe_serialization=True)
        gen = os.path.join(folder, "generation_config.json")
        if os.path.exists(gen):
            os.remove(gen)  # not needed by the tests: keep the folders small
        with torch.no_grad():
            out[name] = model(input_ids=ids).logits.float().contiguous()
    save_file(out, os.path.join(D, "golden.safetensors"),
              metadata={"transformers": __import__("transformers").__version__})
    with open(os.path.join(D, "ids.json"), "w") as f:
        json.dump(ids.tolist(), f)
    print({k: (tuple(v.shape), float(v.abs().max())) for k, v in out.items()})


if __name__ == "__main__":
    main()
