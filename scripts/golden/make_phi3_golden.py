#!/usr/bin/env python3
"""Tiny Phi-3 models (Phi3ForCausalLM: fused qkv_proj and gate_up_proj), their bitsandbytes 4-bit
folders and a PEFT adapter, with the logits transformers / bitsandbytes / PEFT compute, for
tests/infer/family_test.cpp (Phi3.*) and tests/train/phi3_export_test.cpp.

Versions the files were made with: torch 2.15.0+cu132 (CPU only), transformers 5.25.0, peft 0.21.2,
bitsandbytes 0.50.2 (its CPU backend), safetensors 0.8.0. Float32, eager attention, deterministic
algorithms, one thread. The script re-executes itself with PYTHONHASHSEED=0 so that PEFT's
target_modules order (a set) is the same on a rerun.

Cases (random weights of transformers' Phi3Config, scaled to give logits ~1, RMSNorm weights
1 + 0.3 randn):
  phi3      hidden 32, 4 heads, 2 kv heads, head_dim 8, intermediate 64, vocab 128, 2 layers,
            sliding_window 5 < T = 12 (as Phi-3-mini-4k sets one), rope_theta 10000.
            qkv_proj [64, 32]: q rows 0-31, k 32-47, v 48-63; gate_up_proj [128, 32].
            4-bit split: blocks of 64 align with every split point; the nested blocks of 256 absmax
            values do not (qkv_proj has 32 absmax values; k starts at absmax 16, v at 24).
  phi3_odd  hidden 20, 2 heads, 1 kv head, head_dim 10, intermediate 36, vocab 128, 2 layers, no
            window: qkv_proj [40, 20], k starts at element 400 and v at 600, gate_up's up at 720:
            none of them a multiple of 64 (the 4-bit blocks straddle the split points).
Files (tests/data/family/):
  <case>/               save_pretrained(safe_serialization=True), float32 (generation_config.json removed)
  <case>_bnb4/          <case> loaded in bfloat16 with BitsAndBytesConfig(load_in_4bit=True, nf4,
                        double quant, compute dtype float32) on the CPU, then save_pretrained: the
                        4-bit folder transformers + bitsandbytes write (qkv_proj.weight packed, with
                        .absmax, .quant_map, .nested_absmax, .nested_quant_map, .quant_state...)
  phi3_adapter/         PEFT LoraConfig(r=4, lora_alpha=8, target_modules=[qkv_proj, o_proj,
                        gate_up_proj, down_proj], lora_dropout 0) on the float32 phi3, lora_A as PEFT
                        inits it, lora_B = 0.1 randn; save_pretrained (README.md removed)
  phi3_golden.safetensors  logits [2, 12, 128] f32 for ids.json (made by make_family_golden.py):
     "phi3", "phi3_odd"            the float32 models
     "phi3_bnb4", "phi3_odd_bnb4"  the 4-bit folders by bitsandbytes 0.50.2's forward rule in float32
                                   (gemm_4bit: each weight code4 * absmax in float32, unrounded, then
                                   F.linear): bnb_reference.forward_rule_model, a Phi3ForCausalLM
                                   holding bitsandbytes' flat _dequantize_4bit_compute products.
                                   Not the CPU Linear4bit itself: on this AVX-512 CPU its native
                                   dequant indexes absmax per row of shape[-1] and is wrong for rows
                                   shorter than or not a multiple of 64 (all of these; FORMATS_NOTES 8).
     "phi3_peft"                   phi3 + phi3_adapter (PeftModel)
Run from the repo root: python3 scripts/golden/make_phi3_golden.py
No GPU is needed (bitsandbytes 0.50.2 quantizes on the CPU; device_map="cpu" on any machine).
With --check-cuda (a machine with a GPU and bitsandbytes' CUDA library) it makes nothing and
compares bitsandbytes' CUDA dequantize_4bit of every 4-bit weight of the <case>_bnb4 folders with
the CPU reference the golden logits use, printing the largest difference (0 expected).
"""
import json
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from safetensors.torch import save_file
from transformers import BitsAndBytesConfig, Phi3Config, Phi3ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bnb_reference  # noqa: E402

D = "tests/data/family"
V = 128
CASES = {
    "phi3": dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                 sliding_window=5),
    "phi3_odd": dict(hidden_size=20, intermediate_size=36, num_attention_heads=2, num_key_value_heads=1,
                     sliding_window=None),
}


def config(case):
    cfg = Phi3Config(vocab_size=V, num_hidden_layers=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                     rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                     pad_token_id=0, **CASES[case])
    cfg._attn_implementation = "eager"
    return cfg


def drop_extras(folder):
    for f in ("generation_config.json", "README.md"):
        if os.path.exists(os.path.join(folder, f)):
            os.remove(os.path.join(folder, f))


def check_cuda():
    worst = 0.0
    for case in CASES:
        q = os.path.join(D, case + "_bnb4")
        ref = bnb_reference.dequantize_folder(q)
        got = bnb_reference.dequantize_folder(q, device="cuda")
        for k in ref:
            d = float((got[k].cpu().float() - ref[k].float()).abs().max())
            worst = max(worst, d)
            print(f"{q}: {k}: CUDA dequantize_4bit vs CPU reference max |diff| {d:.3e}")
    print(f"largest difference {worst:.3e}")
    sys.exit(0 if worst == 0.0 else 1)


def main():
    if "--check-cuda" in sys.argv:
        check_cuda()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    ids = torch.tensor(json.load(open(os.path.join(D, "ids.json"))))
    out = {}
    models = {}
    for seed, case in enumerate(CASES):
        torch.manual_seed(300 + seed)
        model = Phi3ForCausalLM(config(case)).float().eval()
        with torch.no_grad():
            for key, p in model.named_parameters():
                p.copy_(1.0 + torch.randn_like(p) * 0.3 if key.endswith("norm.weight") else torch.randn_like(p) * 0.2)
        folder = os.path.join(D, case)
        shutil.rmtree(folder, ignore_errors=True)
        model.save_pretrained(folder, safe_serialization=True)
        drop_extras(folder)
        with torch.no_grad():
            out[case] = model(input_ids=ids).logits.float().contiguous()
        models[case] = model

        # The 4-bit folder transformers + bitsandbytes write for it (from a bfloat16 load).
        q = os.path.join(D, case + "_bnb4")
        shutil.rmtree(q, ignore_errors=True)
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.float32)
        m4 = Phi3ForCausalLM.from_pretrained(folder, quantization_config=bnb, dtype=torch.bfloat16, device_map="cpu")
        m4.save_pretrained(q, safe_serialization=True)
        drop_extras(q)
        with torch.no_grad():
            out[case + "_bnb4"] = bnb_reference.forward_rule_model(q)(input_ids=ids).logits.float().contiguous()

    # PEFT's adapter on the fused projections of phi3.
    from peft import LoraConfig, PeftModel, get_peft_model
    torch.manual_seed(400)
    lc = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
                    task_type="CAUSAL_LM")
    pm = get_peft_model(Phi3ForCausalLM.from_pretrained(os.path.join(D, "phi3"), dtype=torch.float32,
                                                        attn_implementation="eager"), lc)
    with torch.no_grad():
        for key, p in pm.named_parameters():
            if "lora_B" in key:
                p.copy_(torch.randn_like(p) * 0.1)
    ad = os.path.join(D, "phi3_adapter")
    shutil.rmtree(ad, ignore_errors=True)
    pm.save_pretrained(ad)
    drop_extras(ad)
    pm.eval()
    with torch.no_grad():
        out["phi3_peft"] = pm(input_ids=ids).logits.float().contiguous()
    # The saved adapter, loaded back by PEFT, gives the same logits.
    back = PeftModel.from_pretrained(Phi3ForCausalLM.from_pretrained(os.path.join(D, "phi3"), dtype=torch.float32,
                                                                     attn_implementation="eager"), ad).eval()
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, out["phi3_peft"])

    import bitsandbytes
    import peft
    import transformers
    versions = "torch %s, transformers %s, peft %s, bitsandbytes %s" % (
        torch.__version__, transformers.__version__, peft.__version__, bitsandbytes.__version__)
    save_file(out, os.path.join(D, "phi3_golden.safetensors"), metadata={"versions": versions})
    print(versions)
    print({k: (tuple(v.shape), round(float(v.abs().max()), 3)) for k, v in out.items()})
    print("PEFT vs plain phi3 logits max |diff|: %.3e" % float((out["phi3_peft"] - out["phi3"]).abs().max()))


if __name__ == "__main__":
    main()
