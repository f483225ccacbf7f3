"""transformers + bitsandbytes 0.50.2 on the CPU, and what their arithmetic is, for the golden
scripts (make_bnb_logits_golden.py, make_model_golden.py, make_eval_golden.py).

The rules (bitsandbytes 0.50.2 source: autograd/_functions.py matmul_4bit / MatMul4Bit,
backends/default/ops.py _gemm_4bit_default_impl and _dequantize_4bit_compute, backends/cpu/ops.py,
csrc/cpu_ops.cpp):
  absmax   plain: the stored f32. Nested: f32(f32(code8[q] * nested_absmax[b // 256]) + offset)
           (dequantize_blockwise into float32, then a torch add: two roundings).
  forward  Linear4bit -> matmul_4bit -> gemm_4bit: W = code4[nibble] * absmax in float32, cast
           STRAIGHT to the compute dtype A.dtype (float32: no rounding at all), then F.linear.
  backward MatMul4Bit.backward: grad_A = grad @ dequantize_4bit(B, state).to(grad.dtype), i.e. the
           same float32 product rounded to the quant state's dtype first (bf16 for a bf16-made
           folder), then widened.
On this CPU (no AVX-512) the CPU dequant kernel is the scalar loop of csrc/cpu_ops.cpp over flat
blocks; its AVX-512 branch indexes absmax per row and gives other values for the 96-column
down_proj weights. `bnb_model` therefore checks, weight by weight, that the CPU kernel agrees with
bitsandbytes' flat torch implementation (backends/default/ops._dequantize_4bit_compute) and refuses
to make a golden where it does not.

dequantize_folder(folder)                -> {weight: quant_state.dtype tensor} (dequantize_4bit)
dequantize_folder(folder, dtype=float32) -> the float32 products (what gemm_4bit multiplies with
                                            in float32)
bnb_model(folder)                        -> the real thing: AutoModelForCausalLM with bitsandbytes'
                                            Linear4bit modules computing in float32
emulated_model(folder, dtype)            -> a plain LlamaForCausalLM whose 4-bit projections follow
                                            the two rules above (any dtype: float64 for the noise)
"""
import json
import os

import torch
import bitsandbytes as bnb
import bitsandbytes.functional as F
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
from safetensors import safe_open


def _quant_states(folder, device):
    f = safe_open(os.path.join(folder, "model.safetensors"), "pt")
    keys = list(f.keys())
    for k in keys:
        for qt in ("nf4", "fp4"):
            suffix = ".quant_state.bitsandbytes__" + qt
            if k.endswith(suffix):
                w = k[: -len(suffix)]
                qs = {kk[len(w) + 1:]: f.get_tensor(kk).to(device) for kk in keys if kk.startswith(w + ".")}
                yield w, f.get_tensor(w).to(device), F.QuantState.from_dict(qs, device=torch.device(device))


def dequantize_folder(folder, device="cpu", report=None, dtype=None):
    """`report`, if a dict, gets per weight whether the native CPU kernel agreed (CPU only);
    `dtype` replaces the stored dtype of the result (CPU only)."""
    out = {}
    for w, packed, st in _quant_states(folder, device):
        if device == "cuda":
            out[w] = F.dequantize_4bit(packed, st).reshape(st.shape)
            continue
        absmax = st.absmax
        if st.nested:  # as F.dequantize_4bit and gemm_4bit rebuild it
            absmax = F.dequantize_blockwise(st.absmax, st.state2) + st.offset
        ref = _dequantize_4bit_compute(packed.reshape(-1), absmax.float(), st.code, st.blocksize, st.shape,
                                       dtype or st.dtype).reshape(st.shape).contiguous()
        native = F.dequantize_4bit(packed, st).reshape(st.shape)
        same = torch.equal(native, _dequantize_4bit_compute(packed.reshape(-1), absmax.float(), st.code,
                                                            st.blocksize, st.shape, st.dtype).reshape(st.shape))
        if st.shape[-1] % st.blocksize == 0 and not same:
            raise SystemExit(f"{folder}: {w}: bitsandbytes' CPU and default dequantize_4bit disagree on a "
                             f"blocksize-aligned weight; the reference is in doubt")
        if report is not None:
            report[w] = same
        out[w] = ref
    return out


def bnb_model(folder, compute_dtype=torch.float32):
    """transformers' bitsandbytes integration on the CPU: Linear4bit modules holding the folder's bytes
    and quant states (checked), computing in `compute_dtype`; every other weight widened to it (the
    folder's bf16 embeddings / norms / lm_head are exact in float32). Eager attention."""
    report = {}
    weights = dequantize_folder(folder, report=report)
    bad = sorted(k for k, ok in report.items() if not ok)
    if bad:
        raise SystemExit(f"{folder}: bitsandbytes' CPU dequant kernel gives other values than its flat "
                         f"reference for {bad} (its AVX-512 branch?): its forward is not the release's rule here")
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(folder, device_map="cpu", attn_implementation="eager")
    n = 0
    for name, mod in m.named_modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            key = name + ".weight"
            st = mod.weight.quant_state
            assert key in weights and st.dtype == weights[key].dtype, (key, st.dtype)
            assert tuple(st.shape) == tuple(weights[key].shape), key
            mod.compute_dtype = compute_dtype
            mod.compute_type_is_set = True
            n += 1
    assert n == len(weights), (n, len(weights))
    for p in m.parameters():
        if p.dtype in (torch.bfloat16, torch.float16, torch.float32):
            p.data = p.data.to(compute_dtype)
    return m.eval()


class _Linear4bitRules(torch.autograd.Function):
    """y = x W_fwd^T; dx = dy W_bwd (bitsandbytes' forward and backward operands)."""

    @staticmethod
    def forward(ctx, x, w_fwd, w_bwd):
        ctx.save_for_backward(w_bwd)
        return torch.nn.functional.linear(x, w_fwd)

    @staticmethod
    def backward(ctx, dy):
        (w_bwd,) = ctx.saved_tensors
        return dy @ w_bwd, None, None


def emulated_model(folder, dtype=torch.float32, forward_rounded=False, backward_rounded=True):
    """A plain LlamaForCausalLM of the folder's config in `dtype` whose 4-bit projections multiply with
    the float32 products (forward) and the quant-state-dtype values (backward), each widened to
    `dtype`; forward_rounded / backward_rounded choose the other rule (to show what a test catches)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = json.load(open(os.path.join(folder, "config.json")))
    cfg.pop("quantization_config")
    cfg["dtype"] = "float32"
    config = LlamaConfig(**cfg)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).to(dtype).eval()
    direct = dequantize_folder(folder, dtype=torch.float32)
    rounded = dequantize_folder(folder)
    sd = {}
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        for k in f.keys():
            if k in model.state_dict():
                sd[k] = f.get_tensor(k).to(dtype)
    for k in direct:
        sd[k] = (rounded if forward_rounded else direct)[k].to(dtype)
    model.load_state_dict(sd, strict=True)
    for k in direct:
        lin = model.get_submodule(k[: -len(".weight")])
        w_bwd = (rounded if backward_rounded else direct)[k].to(dtype)
        lin.weight.requires_grad_(False)
        lin.forward = (lambda lin, w_bwd: lambda x: _Linear4bitRules.apply(x, lin.weight, w_bwd))(lin, w_bwd)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def forward_rule_model(folder):
    """The folder's model class (AutoModelForCausalLM from its config.json, any family: Phi-3's fused
    qkv_proj / gate_up_proj included) in float32, eager attention, holding the 4-bit weights as
    bitsandbytes' forward multiplies with them (float32 products, unrounded) and every other weight
    widened (exact). For shapes where the CPU Linear4bit itself is not the release's rule (an AVX-512
    CPU and rows that are not a multiple of 64: see the module docstring)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = json.load(open(os.path.join(folder, "config.json")))
    cfg.pop("quantization_config")
    cfg["dtype"] = "float32"
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config).float().eval()
    sd = {}
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        for k in f.keys():
            if k in model.state_dict():
                sd[k] = f.get_tensor(k).float()
    sd.update(dequantize_folder(folder, dtype=torch.float32))
    if not cfg.get("tie_word_embeddings"):
        model.load_state_dict(sd, strict=True)
        return model
    # A tied folder stores no lm_head.weight (the head is embed_tokens.weight).
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected, (missing, unexpected)
    model.tie_weights()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model
