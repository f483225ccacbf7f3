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
(cudaMemGetInfo: CUDA context included, comparable with qshard bench's peak_gpu_bytes) and the process's
peak resident host memory (peak_rss_bytes); or
"oom": true when the step does not fit.

Usage: python3 scripts/bench/bench_peer.py --preset 8b --batch 4 --seq 2048 [--no-checkpointing]
         [--rank 16] [--steps 4] [--warmup 2] [--jsonl FILE]
The bitsandbytes wheel (0.50.2) may come from PYTHONPATH (see docs/PERFORMANCE.md).

--peer unsloth: Unsloth's documented QLoRA flow on the same shapes. A random bf16 Llama of the preset
(tie_word_embeddings False, rope_theta 500000) and a tiny tokenizer are saved once with
save_pretrained into --model-dir (default /tmp/qshard-unsloth-PRESET; reused when it already holds
config.json and weights; saved by a child process so this one starts clean), then
FastLanguageModel.from_pretrained(dir, max_seq_length, bf16, load_in_4bit=True) (NF4, double
quant), FastLanguageModel.get_peft_model (r, alpha 2r, dropout 0, all seven projections,
use_gradient_checkpointing "unsloth" or False), torch AdamW lr 1e-4, the same random batch every
step (labels = inputs). --points "1x2048,2x2048" runs several batch x seq points on one model load,
one after the other (optimizer and gradients freed, caches emptied and peak statistics reset
between them), one JSON line each ("model_loaded_once": true). Offline: HF_HUB_OFFLINE,
TRANSFORMERS_OFFLINE, HF_DATASETS_OFFLINE and UNSLOTH_DISABLE_STATISTICS are set unless already set.
The packages come from scripts/bench/fetch_peer_wheels.sh's tree on PYTHONPATH.
"""
import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
import traceback

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


def emit(out, jsonl):
    # the process's peak resident host memory so far (Linux: ru_maxrss in KiB)
    out.setdefault("peak_rss_bytes", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    line = json.dumps(out)
    print(line, flush=True)
    if jsonl:
        with open(jsonl, "a") as f:
            f.write(line + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", default="hf", choices=["hf", "unsloth"])
    ap.add_argument("--preset", default="8b", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-checkpointing", dest="checkpointing", action="store_false")
    ap.add_argument("--jsonl", default="")
    ap.add_argument("--points", default="", help="unsloth: batch x seq points on one model load, e.g. 1x2048,4x2048")
    ap.add_argument("--model-dir", default="", help="unsloth: where the random model is saved (reused)")
    ap.add_argument("--save-only", action="store_true", help=argparse.SUPPRESS)  # the child that saves the model
    args = ap.parse_args()
    if args.peer == "unsloth":
        return run_unsloth(args)
    return run_hf(args)


def run_hf(args):
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
    emit(out, args.jsonl)
    return 0


# ---------------------------------------------------------------------------------------------
# --peer unsloth

OFFLINE_ENV = {  # the GPU machine has no network: every download, telemetry or stats call is off
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
    "UNSLOTH_DISABLE_STATISTICS": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1",
    "HF_HUB_ENABLE_HF_TRANSFER": "0", "TOKENIZERS_PARALLELISM": "false",
    "UNSLOTH_COMPILE_LOCATION": "/tmp/unsloth_compiled_cache",
}


def parse_points(args):
    if not args.points:
        return [(args.batch, args.seq)]
    pts = []
    for p in args.points.replace(" ", ",").split(","):
        if p:
            b, s = p.lower().split("x")
            pts.append((int(b), int(s)))
    return pts


def model_dir_ready(d):
    """config.json, a tokenizer and every weight file (a save cut short leaves shards missing)."""
    j = lambda f: os.path.join(d, f)
    if not (os.path.isfile(j("config.json")) and os.path.isfile(j("tokenizer.json"))):
        return False
    if os.path.isfile(j("model.safetensors")):
        return True
    if not os.path.isfile(j("model.safetensors.index.json")):
        return False
    with open(j("model.safetensors.index.json")) as f:
        shards = set(json.load(f)["weight_map"].values())
    return all(os.path.isfile(j(s)) for s in shards)


def save_random_model(args):
    """The child process: a random bf16 Llama of the preset's shape and a tiny tokenizer, saved."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    V, C, I, L, H, Hkv = PRESETS[args.preset]
    d = args.model_dir
    if os.path.isdir(d):  # whatever a cut-short save left
        for f in os.listdir(d):
            if f.endswith((".safetensors", ".json")):
                os.remove(os.path.join(d, f))
    os.makedirs(d, exist_ok=True)
    # A word-level tokenizer over a few hundred words, built here offline; the ids fed are random.
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {t: i for i, t in enumerate(specials + [f"w{i}" for i in range(min(V, 256) - len(specials))])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>", model_max_length=max(131072, args.seq))
    tok.save_pretrained(d)
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=I, num_hidden_layers=L,
                      num_attention_heads=H, num_key_value_heads=Hkv,
                      max_position_embeddings=max(131072, args.seq), rope_theta=500000.0,
                      tie_word_embeddings=False, bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"],
                      pad_token_id=vocab["<pad>"])
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):
        model = LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    t0 = time.perf_counter()
    model.save_pretrained(d, safe_serialization=True, max_shard_size="5GB")
    print(f"saved {args.preset} to {d} in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return 0


def run_unsloth(args):
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    args.model_dir = os.path.abspath(args.model_dir or f"/tmp/qshard-unsloth-{args.preset}")
    if args.jsonl:
        args.jsonl = os.path.abspath(args.jsonl)
    points = parse_points(args)
    max_seq = max(s for _, s in points)
    if args.save_only:
        return save_random_model(args)
    base = {"peer": "unsloth", "preset": args.preset, "lora_rank": args.rank, "checkpointing": args.checkpointing,
            "gradient_checkpointing": "unsloth" if args.checkpointing else False, "steps_timed": args.steps,
            "warmup": args.warmup, "max_seq_length": max_seq, "model_dir": args.model_dir}
    if model_dir_ready(args.model_dir):
        base["model_saved_s"] = 0.0
    else:
        # A child process saves the model, so this one's CUDA context and allocator start clean.
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, os.path.abspath(__file__), "--peer", "unsloth", "--save-only",
                              "--preset", args.preset, "--seq", str(max_seq), "--model-dir", args.model_dir])
        if rc != 0 or not model_dir_ready(args.model_dir):
            base.update({"error": f"saving the random model failed (exit {rc})", "oom": False})
            for b, s in points:
                emit(dict(base, batch=b, seq=s), args.jsonl)
            return 1
        base["model_saved_s"] = time.perf_counter() - t0
    # Unsloth writes compiled modules and temporary buffers into the working directory.
    os.makedirs("/tmp/qshard-unsloth-work", exist_ok=True)
    os.chdir("/tmp/qshard-unsloth-work")

    import unsloth  # before transformers, as Unsloth requires
    from unsloth import FastLanguageModel
    import torch
    import bitsandbytes
    import peft
    import transformers
    import trl

    base["versions"] = {"unsloth": unsloth.__version__, "unsloth_zoo": _version("unsloth_zoo"),
                        "transformers": transformers.__version__, "torch": torch.__version__,
                        "bitsandbytes": bitsandbytes.__version__, "peft": peft.__version__,
                        "trl": trl.__version__, "triton": _version("triton")}
    V = PRESETS[args.preset][0]
    try:
        base["device"] = torch.cuda.get_device_name(0)
        t0 = time.perf_counter()
        model, _tokenizer = FastLanguageModel.from_pretrained(model_name=args.model_dir, max_seq_length=max_seq,
                                                              dtype=torch.bfloat16, load_in_4bit=True)
        model = FastLanguageModel.get_peft_model(
            model, r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0, target_modules=PROJECTIONS,
            bias="none", use_gradient_checkpointing="unsloth" if args.checkpointing else False, random_state=0)
        FastLanguageModel.for_training(model)
        torch.cuda.synchronize()
        base["load_s"] = time.perf_counter() - t0
        base["trainable_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        emb = model.get_input_embeddings().weight
        base["embed_device"] = str(emb.device)
        base["model_resident_bytes"] = torch.cuda.memory_allocated()
        free, total = torch.cuda.mem_get_info()
        base["device_in_use_after_load_bytes"] = total - free
    except torch.OutOfMemoryError as e:
        for b, s in points:
            emit(dict(base, batch=b, seq=s, oom=True, error="load: " + str(e).splitlines()[0][:300]), args.jsonl)
        return 0
    except Exception as e:  # a JSON line per point all the same, the traceback on stderr
        traceback.print_exc()
        for b, s in points:
            emit(dict(base, batch=b, seq=s, oom=False, error=f"load: {type(e).__name__}: {e}"[:500]), args.jsonl)
        return 1
    if len(points) > 1:
        # Memory per point: peak statistics are reset before each point, but the quantized model,
        # LoRA weights and compiled kernels stay loaded from the first point on.
        base["model_loaded_once"] = True
    params = [p for p in model.parameters() if p.requires_grad]
    rc = 0
    for i, (b, s) in enumerate(points):
        out = dict(base, batch=b, seq=s, point=i)
        opt = ids = loss = None
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
            g = torch.Generator(device="cuda").manual_seed(1)
            ids = torch.randint(0, V, (b, s), device="cuda", generator=g)  # the same batch every step
            losses, t0 = [], None
            for step in range(args.warmup + args.steps):
                if step == args.warmup:
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.item())
            torch.cuda.synchronize()
            secs = time.perf_counter() - t0
            free, total = torch.cuda.mem_get_info()
            out.update({"tokens_per_s": b * s * args.steps / secs, "step_s": secs / args.steps,
                        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                        "device_in_use_bytes": total - free, "losses": losses, "oom": False})
        except torch.OutOfMemoryError as e:
            out.update({"oom": True, "error": str(e).splitlines()[0][:300],
                        "peak_allocated_bytes": torch.cuda.max_memory_allocated()})
        except Exception as e:
            traceback.print_exc()
            out.update({"oom": False, "error": f"{type(e).__name__}: {e}"[:500]})
            rc = 1
        # Free this point's optimizer state and gradients before the next one.
        del opt, ids, loss
        for p in params:
            p.grad = None
        gc.collect()
        torch.cuda.empty_cache()
        emit(out, args.jsonl)
    return rc


def _version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
