#!/usr/bin/env python3
"""The peer of `qshard bench`: the same QLoRA step with the Python stack, on the same GPU.

transformers LlamaForCausalLM (random weights of a preset's shape, bf16) with every decoder
projection replaced by a bitsandbytes Linear4bit (NF4, double quantization, blocksize 64, bf16
compute), PEFT LoRA (rank r, alpha 2r, no dropout) on all seven projections, SDPA attention,
optionally gradient checkpointing (non-reentrant), labels = inputs (HF's shifted loss), AdamW
(torch, lr 1e-4) over the LoRA weights. `warmup` untimed steps, then `steps` timed with
torch.cuda.synchronize() around them.

Prints one JSON line per run (and appends it to --jsonl): tokens/s, peak memory as
torch.cuda.max_memory_allocated / max_memory_reserved, and the device memory in use at the end
(cudaMemGetInfo: CUDA context included, comparable with qshard bench's peak_gpu_bytes); or
"oom": true when the step does not fit.

Usage: python3 scripts/bench/bench_peer.py --preset 8b --batch 4 --seq 2048 [--no-checkpointing]
         [--rank 16] [--steps 4] [--warmup 2] [--jsonl FILE]
The bitsandbytes wheel (0.50.2) may come from PYTHONPATH (see docs/PERFORMANCE.md).
"""
import argparse
import json
import sys
import time

PRESETS = {  # vocab, hidden, intermediate, layers, heads, kv heads (as qshard bench's presets)
    "tiny": (258, 128, 352, 4, 4, 2),
    "1b": (128256, 2048, 8192, 16, 32, 8),
    "8b": (128256, 4096, 14336, 32, 32, 8),
    "70b": (128256, 8192, 28672, 80, 64, 8),
}
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build(args, torch):
    import bitsandbytes as bnb
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    V, C, I, L, H, Hkv = PRESETS[args.preset]
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=I, num_hidden_layers=L,
                      num_attention_heads=H, num_key_value_heads=Hkv,
                      max_position_embeddings=max(131072, args.seq), rope_theta=500000.0,
                      tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    # Every decoder projection as bitsandbytes NF4 with double quantization (quantized on the GPU
    # when the Params4bit moves there), one layer at a time so the bf16 copies go as they are replaced.
    for layer in model.model.layers:
        for parent, names in ((layer.self_attn, PROJECTIONS[:4]), (layer.mlp, PROJECTIONS[4:])):
            for n in names:
                lin = getattr(parent, n)
                q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=False, compute_dtype=torch.bfloat16,
                                      compress_statistics=True, quant_type="nf4", device="cpu")
                q.weight = bnb.nn.Params4bit(lin.weight.data.cpu(), requires_grad=False, compress_statistics=True,
                                             quant_type="nf4", blocksize=64)
                q = q.to("cuda")
                setattr(parent, n, q)
                del lin
        torch.cuda.empty_cache()
    model.config.use_cache = False
    for p in model.parameters():
        p.requires_grad_(False)
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    lcfg = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules=PROJECTIONS,
                      task_type="CAUSAL_LM")
    model = get_peft_model(model, lcfg)
    model.train()
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="8b", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-checkpointing", dest="checkpointing", action="store_false")
    ap.add_argument("--jsonl", default="")
    args = ap.parse_args()

    import torch
    import bitsandbytes
    import peft
    import transformers

    out = {"peer": "transformers+peft+bitsandbytes", "preset": args.preset, "batch": args.batch, "seq": args.seq,
           "lora_rank": args.rank, "checkpointing": args.checkpointing, "steps_timed": args.steps,
           "warmup": args.warmup, "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                                "peft": peft.__version__, "bitsandbytes": bitsandbytes.__version__},
           "device": torch.cuda.get_device_name(0)}
    try:
        model = build(args, torch)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0)
        out["trainable_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        V = PRESETS[args.preset][0]
        g = torch.Generator(device="cuda").manual_seed(1)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        losses, t0 = [], None
        for step in range(args.warmup + args.steps):
            if step == args.warmup:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            ids = torch.randint(0, V, (args.batch, args.seq), device="cuda", generator=g)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        free, total = torch.cuda.mem_get_info()
        out.update({"tokens_per_s": args.batch * args.seq * args.steps / secs, "step_s": secs / args.steps,
                    "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                    "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                    "device_in_use_bytes": total - free, "losses": losses, "oom": False})
    except torch.OutOfMemoryError as e:
        out.update({"oom": True, "error": str(e).splitlines()[0][:300]})
    line = json.dumps(out)
    print(line, flush=True)
    if args.jsonl:
        with open(args.jsonl, "a") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
