#!/usr/bin/env python3
"""`qshard generate` against transformers (+ PEFT, + bitsandbytes for a 4-bit folder): the same
prompt tokens (tokenizer and chat template), and greedy generation of the same new tokens.

Runs `qshard generate ... --json` once, then transformers' model.generate(do_sample=False) on the
prompt ids qshard used, and compares:
  - the prompt ids with transformers' own encoding (tokenizer(prompt) or apply_chat_template);
  - the generated ids, token by token (the first difference is reported);
  - with --speed, transformers' decode tokens/s at batch 1 (the peer) next to qshard's.
On the CPU both sides compute in float32 (the comparison that must agree exactly: greedy chains
only split at a near-tie of the top two logits); on CUDA both use bfloat16 and the report is
informational (how many tokens agree).

Usage:
  scripts/interop/check_generate_interop.py --qshard build/qshard --model DIR [--adapter DIR] [--tokenizer DIR]
      (--prompt TEXT [--chat] | --prompt-ids 1,2,3) [--max-new-tokens 32] [--device cpu|cuda]
      [--require-equal] [--speed] [--json OUT]
Exit status 1 with --require-equal when prompt ids or generated ids differ.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qshard", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", default="")
    ap.add_argument("--tokenizer", default="")
    ap.add_argument("--prompt", default="")
    ap.add_argument("--prompt-ids", default="")
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--require-equal", action="store_true")
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok_dir = a.tokenizer or a.model
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [a.qshard, "generate", "--model", a.model, "--max-new-tokens", str(a.max_new_tokens),
               "--device", a.device, "--json", out.name]
        if a.adapter:
            cmd += ["--adapter", a.adapter]
        if a.tokenizer:
            cmd += ["--tokenizer", a.tokenizer]
        if a.prompt_ids:
            cmd += ["--prompt-ids", a.prompt_ids]
        else:
            cmd += ["--prompt", a.prompt] + (["--chat"] if a.chat else [])
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout, p.stderr, file=sys.stderr)
            return 2
        q = json.load(open(out.name))
    report = {"device": a.device, "qshard_stats": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""}

    prompt_ids = q["prompt_ids"]
    if not a.prompt_ids:
        tok = AutoTokenizer.from_pretrained(tok_dir)
        if a.chat:
            theirs = tok.apply_chat_template([{"role": "user", "content": a.prompt}], add_generation_prompt=True,
                                             tokenize=True)
            if isinstance(theirs, dict) or hasattr(theirs, "input_ids"):
                theirs = theirs["input_ids"]
        else:
            theirs = tok(a.prompt)["input_ids"]
        report["prompt_ids_equal"] = list(theirs) == list(prompt_ids)
        if not report["prompt_ids_equal"]:
            report["prompt_ids_transformers"] = list(theirs)[:40]
            report["prompt_ids_qshard"] = prompt_ids[:40]

    dtype = torch.float32 if a.device == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, device_map=a.device)
    if a.adapter:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, a.adapter)
    model.eval()
    ids = torch.tensor([prompt_ids], device=a.device)
    n_new = len(q["ids"])
    with torch.no_grad():
        g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new, do_sample=False,
                           temperature=None, top_p=None, top_k=None)
    theirs = g[0, len(prompt_ids):].tolist()
    mine = q["ids"]
    first_diff = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y), None)
    if first_diff is None and len(mine) != len(theirs):
        first_diff = min(len(mine), len(theirs))
    report.update({"new_tokens": n_new, "generated_equal": first_diff is None,
                   "agreeing_prefix": n_new if first_diff is None else first_diff,
                   "qshard_text": q["text"][:300]})
    if first_diff is not None:
        report["qshard_ids"] = mine[: first_diff + 5]
        report["transformers_ids"] = theirs[: first_diff + 5]
    if a.speed:  # the peer's decode speed at batch 1 (greedy, n_new tokens after a one-token warm-up)
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False)
            if a.device == "cuda":
                torch.cuda.synchronize()
            t = time.time()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new, min_new_tokens=n_new,
                           do_sample=False)
            if a.device == "cuda":
                torch.cuda.synchronize()
        report["transformers_tokens_per_s"] = n_new / (time.time() - t)
        report["qshard_tokens_per_s"] = (n_new - 1) / max(q["decode_seconds"], 1e-9)
    print(json.dumps(report, indent=1, ensure_ascii=False))
    if a.json:
        json.dump(report, open(a.json, "w"), indent=1, ensure_ascii=False)
    ok = report["generated_equal"] and report.get("prompt_ids_equal", True)
    return 0 if ok or not a.require_equal else 1


if __name__ == "__main__":
    sys.exit(main())
