#!/usr/bin/env python3
"""Tiny Gemma 2 and Gemma 3 (text) models, their logits, and a LoRA training golden for each, made with
transformers + PEFT on the CPU in float32 (the reference qshard's Gemma support must reproduce).

Run from the repo root:  python3 scripts/golden/make_gemma_golden.py
Versions the files were made with: torch 2.15.0+cu132 (CPU only), transformers 5.25.0, peft 0.21.2.
Float32, eager attention, deterministic algorithms, one thread. The script re-executes itself with
PYTHONHASHSEED=0 so that PEFT's target_modules order (a set) is the same on a rerun.

Families (each from its own config class; random weights, fixed seeds):
  gemma2  Gemma2ForCausalLM, Gemma2Config (model_type "gemma2")
  gemma3  Gemma3ForCausalLM, Gemma3TextConfig (model_type "gemma3_text")
Sizes, chosen so that every Gemma feature is exercised and changes the logits visibly (the script
switches each feature off in turn and prints how far the logits move):
  hidden 32, intermediate 64, 4 heads, 2 kv heads (GQA), vocab 128, max_position_embeddings 64,
  rms_norm_eps 1e-6, bos 1, eos 2, pad 0, hidden_activation gelu_pytorch_tanh.
  head_dim 16: differs from hidden / heads = 8 (q_proj is [64, 32]); a multiple of 8 for the GPU.
  4 layers with explicit layer_types so that sliding and full layers both occur:
    gemma2 [sliding, full, sliding, full] (Gemma2Config's own default alternation),
    gemma3 [sliding, sliding, full, sliding] (a full layer between sliding ones, not last).
  sliding_window 4 < T (12 for ids.json, 11 for the training batch): the window masks.
  query_pre_attn_scalar 24 != head_dim 16: scale 24**-0.5 instead of 16**-0.5.
  gemma2: final_logit_softcapping 2.0, attn_logit_softcapping 1.5 (small, so both caps bind: the
          script prints the largest logit before the cap and the share of visible attention scores
          beyond 1.5); rope_theta 10000 on every layer; tied embeddings (no lm_head.weight).
  gemma3: no soft-capping (None, as Gemma 3 ships); rope_parameters per layer type:
          full_attention {rope_type linear, factor 2.0, rope_theta 1e6}, sliding_attention {default,
          rope_theta 1e4} (transformers 5.25 takes these nested keys; the old rope_theta /
          rope_local_base_freq / rope_scaling kwargs are folded into them by
          Gemma3TextConfig.convert_rope_params_to_dict); the script checks both inverse-frequency
          buffers of the loaded model; untied lm_head (so tied and untied are both covered).
Weights: every RMSNorm weight (Gemma multiplies by 1 + weight) 0.3 randn, centred at zero; every
other parameter 0.2 randn (embeddings included; the pad row too, it is only a row to the forward).

Files:
  tests/data/family/gemma2/, gemma3/   save_pretrained(safe_serialization=True), float32
                                       (generation_config.json removed)
  tests/data/family/gemma_golden.safetensors  "gemma2", "gemma3" -> logits [2, 12, 128] F32 of the
                                       ids of tests/data/family/ids.json (read, not written), eval mode;
                                       metadata {"transformers": version}
  tests/data/model/gemma2.golden.safetensors, gemma3.golden.safetensors, gemma2_adapter/,
  gemma3_adapter/                      training goldens in make_model_golden.py's format, made by its
                                       own make_case (imported): PEFT LoRA r=4, alpha=8, dropout 0 on
                                       q,k,v,o,gate,up,down_proj, lora_B = 0.1 randn, B=2, T=11 random
                                       ids with some labels -100, loss = model(ids, labels=labels).loss,
                                       loss.backward(); input_ids, labels, targets, logits, loss,
                                       normalizer, grad.<adapter key>. Also its float32-vs-float64 print.
                                       (Importing make_model_golden imports bitsandbytes through
                                       bnb_reference; nothing of it is used here.)
The float64 rerun (make_case's) keeps the float32 casts written in transformers' code (RMSNorm,
softmax, RoPE cos / sin, the loss), so it bounds the rest of the float32 noise only; a fully float64
run (those four patched, tried once while writing this script, not part of it) gave the same figures
within 10%: logits 1.5e-6 / 6.9e-7 of max |logit|, LoRA grads 1.9e-6 / 3.2e-6 of max |g| (gemma2 / gemma3).
The saved gemma3 config.json carries "_sliding_window_pattern": 6 (Gemma3TextConfig.__post_init__
stores it; unused once layer_types is given), and use_bidirectional_attention (null / false).

What transformers 5.25 computes (read in transformers/models/gemma{2,3}/modeling_gemma{2,3}.py unless
another file is named; Gemma3 = Gemma2 where not said otherwise):
  RMSNorm: Gemma2RMSNorm.forward / Gemma3RMSNorm.forward: x.float() * rsqrt(mean(x^2) + eps), times
    (1.0 + weight.float()), computed in float32, cast back to x's dtype at the end; weight inits at 0.
  Four norms per layer: Gemma2DecoderLayer.forward: h = x + post_attention_layernorm(attn(
    input_layernorm(x))); out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))).
    The post norms act on the sublayer outputs before the residual add. Then a final model.norm.
  Embedding scale: Gemma2TextScaledWordEmbedding.forward: embedding * embed_scale.to(weight.dtype),
    embed_scale = hidden_size**0.5 (Gemma2Model.__init__) as a float32 buffer: sqrt(32) rounded to
    float32 here (to bf16 for a bf16 model: sqrt(3072) -> 55.5, says the comment there).
  MLP: Gemma2MLP.forward: down(act(gate(x)) * up(x)); act = ACT2FN["gelu_pytorch_tanh"] =
    activations.py GELUTanh = torch gelu(approximate="tanh").
  Attention scale: Gemma2Attention.__init__: scaling = query_pre_attn_scalar**-0.5 (not head_dim).
  Attention soft-capping: eager_attention_forward: s = q k^T * scaling; s = tanh(s / cap) * cap; then
    s + mask; softmax in float32. Gemma2Attention.forward passes softcap=attn_logit_softcapping;
    Gemma3Attention.forward passes no softcap at all (Gemma 3 ignores attn_logit_softcapping).
  Final logit soft-capping: Gemma2ForCausalLM.forward / Gemma3ForCausalLM.forward: logits =
    tanh(logits / cap) * cap when final_logit_softcapping is not None, before the loss.
  Gemma3 q_norm / k_norm: Gemma3Attention.forward: Gemma3RMSNorm(head_dim) over each head's q and k,
    after the projections and before RoPE. Gemma 2 has none.
  RoPE: Gemma2RotaryEmbedding (one theta) / Gemma3RotaryEmbedding (one inverse-frequency buffer per
    layer type: full_attention_inv_freq, sliding_attention_inv_freq); linear scaling is
    modeling_rope_utils.py _compute_linear_scaling_rope_parameters: inv_freq / factor. Rotate-half
    (NeoX) layout, cos / sin computed in float32.
  Sliding mask: masking_utils.py sliding_window_overlay and causal_mask_function: key j is visible
    from query i iff i - sliding_window < j <= i (the window includes the query: 4 keys here).
    Checked by the script on the masks the eager path receives.
  Which layers slide: Gemma2Attention.__init__ / Gemma3Attention.__init__: sliding_window only where
    config.layer_types[i] == "sliding_attention"; Gemma2Model.forward picks each layer's mask (and
    Gemma3TextModel.forward its RoPE) by layer_types[i]. Defaults: Gemma2Config.__post_init__ slides
    every even layer (0, 2, ...); Gemma3TextConfig.__post_init__ every layer but each 6th.
  Loss: loss/loss_utils.py ForCausalLMLoss: on the soft-capped logits, upcast to float32, labels
    shifted by one, mean over the targets != -100.
"""
import json
import math
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig  # noqa: E402
from transformers.models.gemma2 import modeling_gemma2  # noqa: E402
from transformers.models.gemma3 import modeling_gemma3  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_model_golden import make_case  # noqa: E402  the training golden's format, written once

FAMILY_DIR = "tests/data/family"
MODEL_DIR = "tests/data/model"
V = 128
WINDOW = 4
WEIGHT_SCALE = 0.2  # every parameter but the norms: logits ~1 before the caps
NORM_SCALE = 0.3  # RMSNorm weights, centred at zero (the norm multiplies by 1 + weight)
COMMON = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, vocab_size=V, max_position_embeddings=64, rms_norm_eps=1e-6,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, hidden_activation="gelu_pytorch_tanh",
              sliding_window=WINDOW, query_pre_attn_scalar=24, attention_bias=False)
GEMMA2 = dict(COMMON, layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
              final_logit_softcapping=2.0, attn_logit_softcapping=1.5, tie_word_embeddings=True,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
GEMMA3 = dict(COMMON, layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
              final_logit_softcapping=None, attn_logit_softcapping=None, tie_word_embeddings=False,
              rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
# name -> (model class, config class, config kwargs, modeling module, model seed, training-case seed)
FAMILIES = {
    "gemma2": (Gemma2ForCausalLM, Gemma2Config, GEMMA2, modeling_gemma2, 200, 11),
    "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig, GEMMA3, modeling_gemma3, 201, 12),
}


def build(cls, config_cls, kwargs, state=None):
    """A float32 eager model of `kwargs`; with `state`, those weights (a variant of a built model)."""
    cfg = config_cls(**json.loads(json.dumps(kwargs)))  # a deep copy: the config keeps the dicts
    cfg._attn_implementation = "eager"
    model = cls(cfg).float().eval()
    if state is not None:
        model.load_state_dict(state)
    return model


def randomize(model):
    with torch.no_grad():
        for key, p in model.named_parameters():  # a tied lm_head is the embedding: listed once
            scale = NORM_SCALE if key.endswith("norm.weight") else WEIGHT_SCALE
            p.copy_(torch.randn_like(p) * scale)


def save_folder(model, folder):
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, safe_serialization=True)
    gen = os.path.join(folder, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)  # not needed by the tests: keep the folders small


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float().contiguous()


def attention_probe(model, module, ids):
    """Runs the model with the module's eager attention wrapped: records, per layer, the scores
    q k^T * scaling before any cap, and checks the mask each layer gets against the sliding rule.
    Returns (largest |score|, share of visible scores with |s| > 1.5)."""
    original = module.eager_attention_forward
    seen = []

    def probe(attn, query, key, value, attention_mask, scaling=None, **kwargs):
        k = module.repeat_kv(key, attn.num_key_value_groups)
        s = torch.matmul(query, k.transpose(2, 3)) * scaling
        t = query.shape[2]
        i = torch.arange(t)[:, None]
        j = torch.arange(t)[None, :]
        expect = j <= i
        if attn.sliding_window is not None:
            expect &= j > i - attn.sliding_window
        visible = (attention_mask[:, :, :, :t] == 0)
        if not torch.equal(visible, expect.expand_as(visible)):
            raise SystemExit(f"layer {attn.layer_idx}: the mask is not the rule i - window < j <= i")
        seen.append(s[expect.expand_as(s)])
        return original(attn, query, key, value, attention_mask, scaling=scaling, **kwargs)

    module.eager_attention_forward = probe
    try:
        logits_of(model, ids)
    finally:
        module.eager_attention_forward = original
    s = torch.cat(seen)
    return s.abs().max().item(), (s.abs() > 1.5).float().mean().item()


def feature_effects(name, cls, config_cls, kwargs, model, ids, logits):
    """Max |logit change| / max |logit| when each feature is switched off in turn: each must show."""
    state = model.state_dict()
    variants = {
        "window off (sliding_window 64)": dict(sliding_window=64),
        "scale head_dim**-0.5": dict(query_pre_attn_scalar=kwargs["head_dim"]),
        "all layers full": dict(layer_types=["full_attention"] * 4),
    }
    if name == "gemma2":
        variants["no attention cap"] = dict(attn_logit_softcapping=None)
        variants["no final cap"] = dict(final_logit_softcapping=None)
    else:
        rp = kwargs["rope_parameters"]
        variants["full layers: no linear factor"] = dict(rope_parameters=dict(
            rp, full_attention={"rope_type": "default", "rope_theta": 1000000.0}))
        variants["sliding layers: theta 1e6"] = dict(rope_parameters=dict(
            rp, sliding_attention={"rope_type": "default", "rope_theta": 1000000.0}))
        variants["sliding layers rotated as full (swap thetas)"] = dict(rope_parameters=dict(
            full_attention=rp["sliding_attention"], sliding_attention=rp["full_attention"]))
    out = {}
    for label, change in variants.items():
        other = build(cls, config_cls, dict(kwargs, **change), state)
        out[label] = ((logits_of(other, ids) - logits).abs().max() / logits.abs().max()).item()
    if name == "gemma3":
        other = build(cls, config_cls, kwargs, state)
        for layer in other.model.layers:
            layer.self_attn.q_norm = torch.nn.Identity()
            layer.self_attn.k_norm = torch.nn.Identity()
        out["no q_norm / k_norm"] = ((logits_of(other, ids) - logits).abs().max() / logits.abs().max()).item()
    other = build(cls, config_cls, kwargs, {k: v + 1.0 if k.endswith("norm.weight") else v for k, v in state.items()})
    out["norm weights 1 + w -> 2 + w"] = ((logits_of(other, ids) - logits).abs().max() / logits.abs().max()).item()
    for label, rel in out.items():
        print(f"  {name} {label:45s} logits move {rel:.3e} of max |logit|")
        if rel < 1e-3:
            raise SystemExit(f"{name}: '{label}' does not change the logits visibly")


def check_rope(model):
    """Gemma3's two inverse-frequency buffers: theta 1e6 / factor 2 (full), theta 1e4 (sliding)."""
    rot = model.model.rotary_emb
    d = COMMON["head_dim"]
    base = torch.arange(0, d, 2, dtype=torch.float) / d
    full = 1.0 / (1000000.0 ** base) / 2.0
    sliding = 1.0 / (10000.0 ** base)
    df = (rot.full_attention_inv_freq - full).abs().max().item()
    ds = (rot.sliding_attention_inv_freq - sliding).abs().max().item()
    print(f"  gemma3 rope: rope_type {rot.rope_type}, full inv_freq vs 1e6**(-2i/d) / 2: {df:.1e}, "
          f"sliding vs 1e4**(-2i/d): {ds:.1e}, attention_scaling {rot.full_attention_attention_scaling} / "
          f"{rot.sliding_attention_attention_scaling}")
    if df > 1e-9 or ds > 1e-9 or rot.rope_type != {"full_attention": "linear", "sliding_attention": "default"}:
        raise SystemExit("gemma3: the rotary embeddings are not the configured ones")


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    with open(os.path.join(FAMILY_DIR, "ids.json")) as f:
        ids = torch.tensor(json.load(f), dtype=torch.int64)  # [2, 12]
    golden = {}
    for name, (cls, config_cls, kwargs, module, seed, case_seed) in FAMILIES.items():
        torch.manual_seed(seed)
        model = build(cls, config_cls, kwargs)
        randomize(model)
        folder = os.path.join(FAMILY_DIR, name)
        save_folder(model, folder)
        logits = logits_of(model, ids)
        golden[name] = logits
        with torch.no_grad():
            raw = model.lm_head(model.model(input_ids=ids).last_hidden_state)
        smax, share = attention_probe(model, module, ids)
        cap = model.config.final_logit_softcapping
        bind = "" if cap is None else f"; share of |raw| > cap / 2: {(raw.abs() > cap / 2).float().mean().item():.3f}"
        print(f"{name}: logits {tuple(logits.shape)}, max |logit| {logits.abs().max().item():.4f} (before the "
              f"final cap {raw.abs().max().item():.4f}; cap {cap}{bind}), visible attention scores before any cap: "
              f"max |s| {smax:.3f}, share |s| > 1.5 {share:.3f} (cap {model.config.attn_logit_softcapping})")
        if name == "gemma2" and (raw.abs().max() < 2.0 * cap or share < 0.05):
            raise SystemExit("gemma2: the soft-caps hardly bind; raise WEIGHT_SCALE")
        if name == "gemma3":
            check_rope(model)
        feature_effects(name, cls, config_cls, kwargs, model, ids, logits)
        reloaded = cls.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
        if reloaded.config.layer_types != kwargs["layer_types"] or reloaded.config.sliding_window != WINDOW:
            raise SystemExit(f"{name}: the saved config.json does not reload as built")
        if name == "gemma3":
            check_rope(reloaded)
        diff = (logits_of(reloaded, ids) - logits).abs().max().item()
        print(f"  {name}: from_pretrained({folder}) logits max |diff| {diff:.1e}")
        if diff != 0.0:
            raise SystemExit(f"{name}: the saved folder does not give the same logits")
        make_case(name, model, V, MODEL_DIR, seed=case_seed)  # wraps `model` in PEFT, then makes it float64
    save_file(golden, os.path.join(FAMILY_DIR, "gemma_golden.safetensors"),
              metadata={"transformers": transformers.__version__})
    print("embed scale sqrt(32) as float32:", float(torch.tensor(math.sqrt(32.0), dtype=torch.float32)))
    for path in sorted([os.path.join(FAMILY_DIR, n) for n in ("gemma2", "gemma3", "gemma_golden.safetensors")] +
                       [os.path.join(MODEL_DIR, n) for n in ("gemma2.golden.safetensors", "gemma3.golden.safetensors",
                                                              "gemma2_adapter", "gemma3_adapter")]):
        files = [os.path.join(path, f) for f in sorted(os.listdir(path))] if os.path.isdir(path) else [path]
        for f in files:
            print(f"  {f}: {os.path.getsize(f)} bytes")


if __name__ == "__main__":
    main()
