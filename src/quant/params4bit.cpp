#include "quant/params4bit.h"

#include <cstring>

#include "quant/blockwise.h"

namespace qshard {
namespace {

Tensor to_cpu(const Tensor& t) { return t.device() == Device::kCpu ? t : t.to(Device::kCpu); }

Tensor code_tensor(QuantType t) {
  const auto& c = code_table(t);
  return Tensor::from_bytes({16}, DType::kF32,
                            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(c.data()), sizeof(float) * 16));
}

Tensor dynamic_map_tensor() {
  const auto& m = dynamic_map_signed();
  return Tensor::from_bytes({256}, DType::kF32,
                            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(m.data()), sizeof(float) * 256));
}

// `t` on `device` (shared when it is there already).
Tensor on(const Tensor& t, Device device) { return t.device() == device ? t : t.to(device); }

}  // namespace

Params4bit quantize_4bit(const Tensor& x, const QuantizeOptions& o) {
  validate_blocksize(o.blocksize);
  if (!dtype_is_float(x.dtype()))
    throw InputError(std::string("quantize_4bit: input dtype ") + dtype_torch_name(x.dtype()) +
                     " is not float32, bfloat16 or float16");
  if (x.numel() == 0) throw InputError("quantize_4bit: input " + shape_str(x.shape()) + " has no elements");
  // Every tensor on x's device, the kernels its twins (on CUDA: the default stream; reading the
  // absmax back for the offset waits for them).
  const Device d = x.device();
  const int64_t n = x.numel();
  const int64_t nb = (n + o.blocksize - 1) / o.blocksize;
  Tensor packed = Tensor::empty({(n + 1) / 2, 1}, DType::kU8, d);
  Tensor absmax = Tensor::empty({nb}, DType::kF32, d);
  quant::quantize_4bit(d, x.raw(), x.dtype(), n, o.blocksize, o.quant_type, packed.data<uint8_t>(),
                       absmax.data<float>(), nullptr);
  return params4bit_from_blocks(std::move(packed), std::move(absmax), x.shape(), x.dtype(), o);
}

Params4bit params4bit_from_blocks(Tensor packed, Tensor absmax, const Shape& shape, DType dtype,
                                  const QuantizeOptions& o) {
  const int64_t n = shape_numel(shape);
  const int64_t nb = (n + o.blocksize - 1) / o.blocksize;
  QS_CHECK(packed.dtype() == DType::kU8 && packed.numel() == (n + 1) / 2, "params4bit_from_blocks: packed size");
  QS_CHECK(absmax.dtype() == DType::kF32 && absmax.numel() == nb && absmax.device() == packed.device(),
           "params4bit_from_blocks: absmax size or device");
  const Device d = absmax.device();
  Params4bit p;
  p.data = std::move(packed);
  QuantState& st = p.quant_state;
  st.quant_type = o.quant_type;
  st.blocksize = o.blocksize;
  st.dtype = dtype;
  st.shape = shape;
  st.code = on(code_tensor(o.quant_type), d);
  if (!o.compress_statistics) {
    st.absmax = std::move(absmax);
    return p;
  }
  // The offset is a mean over nblocks floats: computed on the host with the reference's exact
  // summation so CPU and CUDA quantization agree bit for bit.
  NestedQuantState n2;
  n2.offset = cpu::absmax_mean(to_cpu(absmax).data<float>(), nb);
  const int64_t nb2 = (nb + n2.blocksize - 1) / n2.blocksize;
  n2.code = on(dynamic_map_tensor(), d);
  n2.absmax = Tensor::empty({nb2}, DType::kF32, d);
  st.absmax = Tensor::empty({nb}, DType::kU8, d);
  quant::subtract_offset(d, absmax.data<float>(), nb, n2.offset, nullptr);  // the absmax, centred in place
  quant::quantize_8bit(d, absmax.data<float>(), nb, n2.blocksize, n2.code.data<float>(), st.absmax.data<uint8_t>(),
                       n2.absmax.data<float>(), nullptr);
  st.state2 = n2;
  return p;
}

Params4bit empty_params4bit(const Shape& shape, DType dtype, const QuantizeOptions& o, bool shapes_only) {
  validate_blocksize(o.blocksize);
  const int64_t n = shape_numel(shape), nb = (n + o.blocksize - 1) / o.blocksize;
  auto make = [shapes_only](const Shape& s, DType d) { return shapes_only ? Tensor::meta(s, d) : Tensor::zeros(s, d); };
  Params4bit p;
  p.data = make({(n + 1) / 2, 1}, DType::kU8);
  QuantState& st = p.quant_state;
  st.quant_type = o.quant_type;
  st.blocksize = o.blocksize;
  st.dtype = dtype;
  st.shape = shape;
  st.code = code_tensor(o.quant_type);
  st.absmax = make({nb}, o.compress_statistics ? DType::kU8 : DType::kF32);
  if (o.compress_statistics) {
    NestedQuantState n2;
    n2.absmax = make({(nb + n2.blocksize - 1) / n2.blocksize}, DType::kF32);
    n2.code = dynamic_map_tensor();
    st.state2 = n2;
  }
  return p;
}

Params4bit Params4bit::to(Device device) const {
  auto move = [device](Tensor& t) {
    if (t.defined() && t.device() != device) t = t.to(device);
  };
  Params4bit p = *this;
  move(p.data);
  move(p.quant_state.absmax);
  move(p.quant_state.code);
  if (p.quant_state.state2) {
    move(p.quant_state.state2->absmax);
    move(p.quant_state.state2->code);
  }
  return p;
}

Dequant4bitArgs dequant_args(const Params4bit& p) {
  const QuantState& st = p.quant_state;
  Dequant4bitArgs a;
  a.packed = static_cast<const uint8_t*>(p.data.raw());
  a.n = st.numel();
  a.blocksize = st.blocksize;
  // The fixed decode table of the quant type, as bitsandbytes' CUDA kernel uses (it does not read
  // the stored quant_map either).
  std::memcpy(a.code, decode_table(st.quant_type), sizeof(a.code));
  if (st.state2) {
    a.absmax_q8 = static_cast<const uint8_t*>(st.absmax.raw());
    a.nested_absmax = static_cast<const float*>(st.state2->absmax.raw());
    a.nested_code = static_cast<const float*>(st.state2->code.raw());
    a.nested_blocksize = st.state2->blocksize;
    a.offset = st.state2->offset;
  } else {
    a.absmax = static_cast<const float*>(st.absmax.raw());
  }
  return a;
}

Tensor dequantize_4bit(const Params4bit& p, std::optional<DType> out_dtype) {
  const QuantState& st = p.quant_state;
  const DType dt = out_dtype.value_or(st.dtype);
  if (!dtype_is_float(dt)) throw InputError(std::string("dequantize_4bit: output dtype ") + dtype_torch_name(dt) + " is not a float type");
  const int64_t n = st.numel();
  if (p.data.nbytes() != static_cast<size_t>((n + 1) / 2))
    throw InputError("dequantize_4bit: packed data has " + std::to_string(p.data.nbytes()) + " bytes, shape " +
                     shape_str(st.shape) + " needs " + std::to_string((n + 1) / 2));
  st.validate("dequantize_4bit");
  const Dequant4bitArgs a = dequant_args(p);
  Tensor out = Tensor::empty(st.shape, dt, p.data.device());
  quant::dequantize_4bit(p.data.device(), a, out.raw(), dt, nullptr);
  return out;
}

Tensor packed_quant_state_tensor(const QuantState& st) {
  const std::string js = st.packed_json();
  return Tensor::from_bytes({static_cast<int64_t>(js.size())}, DType::kU8,
                            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(js.data()), js.size()));
}

std::vector<std::string> quant_state_key_suffixes(const QuantState& st) {
  std::vector<std::string> s = {".absmax", ".quant_map"};
  if (st.nested()) {
    s.push_back(".nested_absmax");
    s.push_back(".nested_quant_map");
  }
  s.push_back(std::string(".quant_state.bitsandbytes__") + quant_type_name(st.quant_type));
  return s;
}

NamedTensors params4bit_state_dict(const Params4bit& p, const std::string& w) {
  const QuantState& st = p.quant_state;
  NamedTensors out;
  out.emplace_back(w, p.data);
  out.emplace_back(w + ".absmax", st.absmax);
  out.emplace_back(w + ".quant_map", st.code);
  if (st.state2) {
    out.emplace_back(w + ".nested_absmax", st.state2->absmax);
    out.emplace_back(w + ".nested_quant_map", st.state2->code);
  }
  out.emplace_back(w + ".quant_state.bitsandbytes__" + quant_type_name(st.quant_type), packed_quant_state_tensor(st));
  return out;
}

bool is_4bit_weight(const std::string& w, const TensorLookup& lookup) {
  return lookup(w + ".quant_state.bitsandbytes__nf4").has_value() ||
         lookup(w + ".quant_state.bitsandbytes__fp4").has_value();
}

Params4bit params4bit_from_state_dict(const std::string& w, const TensorLookup& lookup, const std::string& source,
                                      bool allow_nonfinite) {
  auto need = [&](const std::string& key) {
    auto t = lookup(key);
    if (!t) throw InputError(source + ": missing tensor '" + key + "'");
    return *t;
  };
  auto nf4 = lookup(w + ".quant_state.bitsandbytes__nf4");
  auto fp4 = lookup(w + ".quant_state.bitsandbytes__fp4");
  if (nf4 && fp4) throw InputError(source + ": both '" + w + ".quant_state.bitsandbytes__nf4' and '__fp4' are present");
  if (!nf4 && !fp4) {
    std::string stored;
    if (const auto t = lookup(w)) stored = " (" + std::string(dtype_safetensors_name(t->dtype())) + " " + shape_str(t->shape()) + ")";
    throw InputError(source + ": 4-bit weight '" + w + "'" + stored + " has no quant state: neither '" + w +
                     ".quant_state.bitsandbytes__nf4' nor '" + w +
                     ".quant_state.bitsandbytes__fp4' is stored (a bitsandbytes folder saves one beside each weight)");
  }
  const std::string js_key = w + ".quant_state.bitsandbytes__" + (nf4 ? "nf4" : "fp4");
  Tensor js = to_cpu(nf4 ? *nf4 : *fp4);
  if (js.dtype() != DType::kU8 || js.ndim() != 1)
    throw InputError(source + ": '" + js_key + "' must be a 1-d uint8 tensor, got " + dtype_torch_name(js.dtype()) +
                     shape_str(js.shape()));
  const auto bytes = js.bytes();
  const std::string label = source + ": '" + js_key + "'";
  QuantState st = QuantState::from_packed_json(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), label);
  if ((st.quant_type == QuantType::kNf4) != static_cast<bool>(nf4))
    throw InputError(label + ": JSON quant_type '" + quant_type_name(st.quant_type) + "' disagrees with the key");
  Params4bit p;
  p.data = need(w);
  const int64_t n = st.numel();
  if (p.data.nbytes() != static_cast<size_t>((n + 1) / 2))
    throw InputError(source + ": '" + w + "' holds " + std::to_string(p.data.nbytes()) + " packed bytes, but shape " +
                     shape_str(st.shape) + " needs " + std::to_string((n + 1) / 2));
  if (p.data.dtype() != DType::kU8) {
    // quant_storage other than uint8: the same bytes, reinterpreted.
    p.data = p.data.view_as(DType::kU8, {(n + 1) / 2, 1});
  }
  st.absmax = need(w + ".absmax");
  st.code = need(w + ".quant_map");
  if (st.state2) {
    st.state2->absmax = need(w + ".nested_absmax");
    st.state2->code = need(w + ".nested_quant_map");
  } else if (lookup(w + ".nested_absmax")) {
    throw InputError(label + ": has no nested fields, but '" + w + ".nested_absmax' is present");
  }
  st.validate(source + ": '" + w + "'");
  if (!allow_nonfinite) st.check_values(source + ": '" + w + "'");
  p.quant_state = std::move(st);
  return p;
}

}  // namespace qshard
