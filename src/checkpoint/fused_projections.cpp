#include "checkpoint/fused_projections.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "runtime/error.h"

namespace qshard {
namespace {

// The largest power of two dividing v (v > 0); `cap` (a power of two) for v == 0.
int64_t low_power_of_two(int64_t v, int64_t cap) { return v == 0 ? cap : std::min(cap, v & -v); }

// Entry `i` of a 1-D host tensor of `esize`-byte elements, copied (file views may be unaligned).
void copy_entry(const Tensor& src, int64_t i, Tensor& dst, int64_t j) {
  const size_t es = dtype_size(src.dtype());
  std::memcpy(static_cast<uint8_t*>(dst.raw()) + static_cast<size_t>(j) * es,
              static_cast<const uint8_t*>(src.raw()) + static_cast<size_t>(i) * es, es);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

Tensor host_copy(const Tensor& t) { return t.device() == Device::kCpu ? t : t.to(Device::kCpu); }

// The part's block sizes for a part starting at element e0 of a tensor of block size bs (and, when
// nested, nested block size nbs): see the header.
struct PartBlocks {
  int64_t bs = 0, nbs = 0;
};
PartBlocks part_blocks(int64_t e0, int64_t bs, int64_t nbs) {
  PartBlocks p;
  p.bs = low_power_of_two(e0, bs);
  if (nbs > 0) p.nbs = low_power_of_two(e0, bs * nbs) / p.bs;
  return p;
}

}  // namespace

std::string FusedProjection::short_name() const { return fused.substr(fused.rfind('.') + 1); }

int64_t FusedProjection::total_rows() const { return std::accumulate(rows.begin(), rows.end(), int64_t{0}); }

std::vector<FusedProjection> fused_projections(const LlamaConfig& c) {
  if (c.family != ModelFamily::kPhi3) return {};
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  return {{"self_attn.qkv_proj", {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, {q, kv, kv}},
          {"mlp.gate_up_proj", {"mlp.gate_proj", "mlp.up_proj"}, {c.intermediate_size, c.intermediate_size}}};
}

std::optional<FusedPartRef> fused_part_of(const std::vector<FusedProjection>& fused, const std::string& key) {
  static const std::string kLayers = "model.layers.";
  if (fused.empty() || key.compare(0, kLayers.size(), kLayers) != 0) return std::nullopt;
  const size_t dot = key.find('.', kLayers.size());
  if (dot == std::string::npos) return std::nullopt;
  const std::string layer = key.substr(0, dot + 1);  // "model.layers.<l>."
  for (const FusedProjection& f : fused) {
    int64_t row0 = 0;
    for (size_t i = 0; i < f.parts.size(); row0 += f.rows[i], ++i) {
      const std::string path = layer + f.parts[i];
      if (key.compare(0, path.size(), path) != 0 || (key.size() > path.size() && key[path.size()] != '.')) continue;
      return FusedPartRef{&f, i, row0, layer + f.fused, path, key.substr(path.size())};
    }
  }
  return std::nullopt;
}

Tensor take_rows(const Tensor& t, int64_t row0, int64_t rows) {
  QS_CHECK(t.ndim() == 2 && row0 >= 0 && rows >= 0 && row0 + rows <= t.dim(0), "take_rows: rows out of range");
  const Tensor h = host_copy(t);
  Tensor out = Tensor::empty({rows, t.dim(1)}, t.dtype());
  const size_t row_bytes = static_cast<size_t>(t.dim(1)) * dtype_size(t.dtype());
  std::memcpy(out.raw(), static_cast<const uint8_t*>(h.raw()) + static_cast<size_t>(row0) * row_bytes,
              static_cast<size_t>(rows) * row_bytes);
  return out;
}

Tensor concat_rows(const std::vector<Tensor>& parts) {
  QS_CHECK(!parts.empty(), "concat_rows: no parts");
  int64_t rows = 0;
  for (const Tensor& p : parts) {
    QS_CHECK(p.ndim() == 2 && p.dim(1) == parts[0].dim(1) && p.dtype() == parts[0].dtype(), "concat_rows: parts differ");
    rows += p.dim(0);
  }
  Tensor out = Tensor::empty({rows, parts[0].dim(1)}, parts[0].dtype());
  size_t at = 0;
  for (const Tensor& p : parts) {
    const Tensor h = host_copy(p);
    std::memcpy(static_cast<uint8_t*>(out.raw()) + at, h.raw(), h.nbytes());
    at += h.nbytes();
  }
  return out;
}

std::vector<Params4bit> split_params4bit(const Params4bit& fused, const std::vector<int64_t>& rows,
                                         const std::string& label) {
  const QuantState& st = fused.quant_state;
  st.validate(label);
  const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  if (st.shape.size() != 2 || st.shape[0] != total)
    throw InputError(label + ": a 4-bit weight of shape " + shape_str(st.shape) + " does not split into rows " +
                     shape_str(rows));
  const int64_t C = st.shape[1];
  const Tensor data = host_copy(fused.data), absmax = host_copy(st.absmax);
  const Tensor nested = st.nested() ? host_copy(st.state2->absmax) : Tensor();
  std::vector<Params4bit> out;
  int64_t e0 = 0;
  for (int64_t r : rows) {
    const int64_t n = r * C;
    if (e0 % 2 != 0)
      throw InputError(label + ": the part of rows from " + std::to_string(e0 / C) + " starts at element " +
                       std::to_string(e0) + ", inside a packed byte (two 4-bit codes a byte); qshard splits a "
                       "4-bit weight only at even element offsets");
    const PartBlocks pb = part_blocks(e0, st.blocksize, st.nested() ? st.state2->blocksize : 0);
    Params4bit p;
    QuantState& ps = p.quant_state;
    ps.quant_type = st.quant_type;
    ps.blocksize = pb.bs;
    ps.dtype = st.dtype;
    ps.shape = {r, C};
    ps.code = st.code;
    p.data = Tensor::empty({(n + 1) / 2, 1}, DType::kU8);
    std::memcpy(p.data.raw(), static_cast<const uint8_t*>(data.raw()) + e0 / 2, static_cast<size_t>((n + 1) / 2));
    if (n % 2 != 0)  // the last byte's low nibble is the next part's first code: the pad code here
      p.data.data<uint8_t>()[n / 2] =
          static_cast<uint8_t>((p.data.data<uint8_t>()[n / 2] & 0xF0) | (st.quant_type == QuantType::kNf4 ? 0x7 : 0x0));
    const int64_t nb = (n + pb.bs - 1) / pb.bs;
    ps.absmax = Tensor::empty({nb}, absmax.dtype());
    for (int64_t j = 0; j < nb; ++j) copy_entry(absmax, (e0 + j * pb.bs) / st.blocksize, ps.absmax, j);
    if (st.nested()) {
      NestedQuantState n2 = *st.state2;
      n2.blocksize = pb.nbs;
      const int64_t span = st.blocksize * st.state2->blocksize, part_span = pb.bs * pb.nbs;  // elements
      const int64_t nb2 = (nb + pb.nbs - 1) / pb.nbs;
      n2.absmax = Tensor::empty({nb2}, DType::kF32);
      for (int64_t m = 0; m < nb2; ++m) copy_entry(nested, (e0 + m * part_span) / span, n2.absmax, m);
      ps.state2 = n2;
    }
    ps.validate(label + " (rows " + std::to_string(e0 / C) + " to " + std::to_string(e0 / C + r) + ")");
    out.push_back(std::move(p));
    e0 += n;
  }
  return out;
}

QuantState fused_quant_state_scalars(const std::vector<const QuantState*>& parts, const std::string& label) {
  QS_CHECK(!parts.empty(), "fused_quant_state_scalars: no parts");
  const QuantState& first = *parts[0];
  auto refuse = [&](const std::string& why) {
    throw InputError(label + ": its parts cannot be fused into one 4-bit weight without requantizing (" + why +
                     "); they were not split from one bitsandbytes weight");
  };
  QuantState st;
  st.quant_type = first.quant_type;
  st.blocksize = first.blocksize;
  st.dtype = first.dtype;
  if (first.shape.size() != 2) refuse("part shape " + shape_str(first.shape) + " is not 2-D");
  int64_t rows = 0;
  for (const QuantState* p : parts) {
    if (p->quant_type != first.quant_type) refuse("quant types differ");
    if (p->dtype != first.dtype) refuse("original dtypes differ");
    if (p->shape.size() != 2 || p->shape[1] != first.shape[1]) refuse("column counts differ");
    if (p->nested() != first.nested()) refuse("double quantization differs");
    if (p->nested() && (p->state2->offset != first.state2->offset || p->state2->dtype != first.state2->dtype))
      refuse("nested offsets differ");
    rows += p->shape[0];
  }
  st.shape = {rows, first.shape[1]};
  if (first.nested()) {
    NestedQuantState n2;
    n2.blocksize = first.state2->blocksize;
    n2.dtype = first.state2->dtype;
    n2.offset = first.state2->offset;
    st.state2 = n2;
  }
  return st;
}

Params4bit fuse_params4bit(const std::vector<Params4bit>& parts, const std::string& label) {
  std::vector<const QuantState*> states;
  for (const Params4bit& p : parts) states.push_back(&p.quant_state);
  Params4bit out;
  QuantState& st = out.quant_state;
  st = fused_quant_state_scalars(states, label);
  auto refuse = [&](const std::string& why) {
    throw InputError(label + ": its parts cannot be fused into one 4-bit weight without requantizing (" + why +
                     "); they were not split from one bitsandbytes weight");
  };
  const int64_t n = st.numel(), bs = st.blocksize, nb = st.num_blocks();
  const Params4bit& first = parts[0];
  st.code = host_copy(first.quant_state.code);
  out.data = Tensor::empty({(n + 1) / 2, 1}, DType::kU8);
  const bool nested = st.nested();
  const int64_t nbs = nested ? st.state2->blocksize : 0, nb2 = nested ? (nb + nbs - 1) / nbs : 0;
  Tensor absmax = Tensor::empty({nb}, nested ? DType::kU8 : DType::kF32);
  Tensor nested_absmax = nested ? Tensor::empty({nb2}, DType::kF32) : Tensor();
  std::vector<char> set(static_cast<size_t>(nb), 0), set2(static_cast<size_t>(nb2), 0);
  // Entry `i` of src into dst[j], or, when dst[j] is already set, a check that it is the same value.
  auto place = [&](const Tensor& src, int64_t i, Tensor& dst, int64_t j, std::vector<char>& done, const char* what) {
    const size_t w = dtype_size(dst.dtype());
    const uint8_t* s = static_cast<const uint8_t*>(src.raw()) + static_cast<size_t>(i) * w;
    uint8_t* d = static_cast<uint8_t*>(dst.raw()) + static_cast<size_t>(j) * w;
    if (!done[static_cast<size_t>(j)]) {
      std::memcpy(d, s, w);
      done[static_cast<size_t>(j)] = 1;
    } else if (std::memcmp(d, s, w) != 0) {
      refuse(std::string("the parts disagree on the ") + what + " of block " + std::to_string(j));
    }
  };
  int64_t e0 = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const QuantState& ps = parts[k].quant_state;
    const std::string part_label = label + " part " + std::to_string(k);
    ps.validate(part_label);
    const int64_t pn = ps.numel();
    if (k + 1 < parts.size() && pn % 2 != 0) refuse("part " + std::to_string(k) + " ends inside a packed byte");
    if (!same_bytes(host_copy(ps.code), st.code)) refuse("quant maps differ");
    if (ps.blocksize > bs || bs % ps.blocksize != 0 || e0 % ps.blocksize != 0)
      refuse("part " + std::to_string(k) + "'s blocksize " + std::to_string(ps.blocksize) + " does not tile the fused blocks of " +
             std::to_string(bs));
    const Tensor pd = host_copy(parts[k].data), pa = host_copy(ps.absmax);
    std::memcpy(static_cast<uint8_t*>(out.data.raw()) + e0 / 2, pd.raw(), static_cast<size_t>((pn + 1) / 2));
    for (int64_t j = 0; j < ps.num_blocks(); ++j) place(pa, j, absmax, (e0 + j * ps.blocksize) / bs, set, "absmax");
    if (nested) {
      const int64_t span = bs * nbs, part_span = ps.blocksize * ps.state2->blocksize;
      if (span % part_span != 0 || e0 % part_span != 0)
        refuse("part " + std::to_string(k) + "'s nested blocks do not tile the fused nested blocks");
      if (!same_bytes(host_copy(ps.state2->code), host_copy(first.quant_state.state2->code)))
        refuse("nested quant maps differ");
      const Tensor pna = host_copy(ps.state2->absmax);
      for (int64_t m = 0; m < pna.numel(); ++m) place(pna, m, nested_absmax, (e0 + m * part_span) / span, set2, "nested absmax");
    }
    e0 += pn;
  }
  st.absmax = absmax;
  if (nested) {
    st.state2->absmax = nested_absmax;
    st.state2->code = host_copy(first.quant_state.state2->code);
  }
  st.validate(label);
  return out;
}

std::vector<std::string> tree_lora_targets(const LlamaConfig& c, const std::vector<std::string>& targets,
                                           const std::string& label) {
  const std::vector<FusedProjection> fused = fused_projections(c);
  auto short_of = [](const std::string& p) { return p.substr(p.rfind('.') + 1); };
  std::vector<std::string> names;  // the family's target names, for messages
  for (const std::string& p : stored_projection_names(c)) names.push_back(short_of(p));
  std::string listed;
  for (const std::string& n : names) listed += (listed.empty() ? "" : ", ") + n;
  // Every projection named as Llama names them (the default lora.target_modules, or a config written
  // for another family): every projection of this one too, the fused ones' parts included.
  if (!fused.empty()) {
    std::vector<std::string> all, given = targets;
    for (const std::string& p : llama_projection_names()) all.push_back(short_of(p));
    std::sort(all.begin(), all.end());
    std::sort(given.begin(), given.end());
    if (given == all) return targets;
  }
  std::vector<std::string> out;
  for (const std::string& t : targets) {
    bool done = false;
    for (const FusedProjection& f : fused) {
      if (t == f.short_name()) {
        for (const std::string& p : f.parts) out.push_back(short_of(p));
        done = true;
      }
      for (const std::string& p : f.parts)
        if (t == short_of(p))
          throw InputError(label + ": LoRA target '" + t + "': a " + model_family_name(c.family) +
                           " model stores it fused in " + f.short_name() + " (PEFT's name); its targets are " + listed);
    }
    if (done) continue;
    if (t == "qkv_proj" || t == "gate_up_proj")
      throw InputError(label + ": LoRA target '" + t + "' is Phi-3's fused projection; a " + model_family_name(c.family) +
                       " model's targets are " + listed);
    out.push_back(t);
  }
  return out;
}

}  // namespace qshard
