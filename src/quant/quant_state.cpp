#include "quant/quant_state.h"

#include <cstdint>
#include <cstring>
#include "runtime/input_file.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>
#include <nlohmann/json.hpp>

#include "quant/blockwise.h"

namespace qshard {

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.4999999621068127e-05"
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t epos = sci.find('e');
  std::string digits = sci.substr(0, epos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(epos + 1));
  if (exp < -4 || exp >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + e;
  }
  if (exp < 0) return sign + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  const size_t int_digits = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_digits) return sign + digits + std::string(int_digits - digits.size(), '0') + ".0";
  return sign + digits.substr(0, int_digits) + "." + digits.substr(int_digits);
}

std::string QuantState::packed_json() const {
  std::string s = "{\"quant_type\": \"";
  s += quant_type_name(quant_type);
  s += "\", \"blocksize\": " + std::to_string(blocksize);
  s += ", \"dtype\": \"" + std::string(dtype_torch_name(dtype)) + "\", \"shape\": [";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  s += "]";
  if (state2) {
    s += ", \"nested_blocksize\": " + std::to_string(state2->blocksize);
    s += ", \"nested_dtype\": \"" + std::string(dtype_torch_name(state2->dtype)) + "\"";
    s += ", \"nested_offset\": " + python_float_repr(static_cast<double>(state2->offset));
  }
  return s + "}";
}

namespace {
const nlohmann::json& require(const nlohmann::json& j, const char* key, const std::string& label) {
  auto it = j.find(key);
  if (it == j.end()) throw InputError(label + ": packed quant state has no \"" + key + "\"");
  return *it;
}

int64_t require_int(const nlohmann::json& j, const char* key, const std::string& label) {
  const auto& v = require(j, key, label);
  if (!v.is_number_integer())
    throw InputError(label + ": packed quant state field \"" + key + "\" must be an integer, got " + v.dump());
  return v.get<int64_t>();
}

DType require_dtype(const nlohmann::json& j, const char* key, const std::string& label) {
  const auto& v = require(j, key, label);
  if (!v.is_string())
    throw InputError(label + ": packed quant state field \"" + key + "\" must be a string, got " + v.dump());
  auto d = parse_dtype(v.get<std::string>());
  if (!d || !dtype_is_float(*d))
    throw InputError(label + ": packed quant state field \"" + key + "\" has unsupported dtype '" +
                     v.get<std::string>() + "' (expected float32, bfloat16 or float16)");
  return *d;
}
}  // namespace

QuantState QuantState::from_packed_json(std::string_view text, const std::string& label) {
  const nlohmann::json j = parse_json_input(text, label + ": packed quant state");
  if (!j.is_object()) throw InputError(label + ": packed quant state is not a JSON object");
  QuantState st;
  const auto& qt = require(j, "quant_type", label);
  if (!qt.is_string()) throw InputError(label + ": packed quant state field \"quant_type\" must be a string");
  try {
    st.quant_type = parse_quant_type(qt.get<std::string>());
  } catch (const InputError& e) {
    throw InputError(label + ": " + e.what());
  }
  st.blocksize = require_int(j, "blocksize", label);
  try {
    validate_blocksize(st.blocksize);
  } catch (const InputError& e) {
    throw InputError(label + ": " + e.what());
  }
  st.dtype = require_dtype(j, "dtype", label);
  const auto& shape = require(j, "shape", label);
  if (!shape.is_array()) throw InputError(label + ": packed quant state field \"shape\" must be a list");
  // Every dimension a non-negative int64 and the product at most kMaxQuantNumel, so that
  // (n + 1) / 2 packed bytes and ceil(n / blocksize) blocks are computed without overflow.
  int64_t numel = 1;
  for (const auto& d : shape) {
    if (!d.is_number_integer() || (d.is_number_unsigned() && d.get<uint64_t>() > uint64_t{INT64_MAX}) ||
        d.get<int64_t>() < 0)
      throw InputError(label + ": packed quant state field \"shape\" " + shape.dump() +
                       " has a bad dimension (expected non-negative integers)");
    const int64_t v = d.get<int64_t>();
    if (v != 0 && numel > kMaxQuantNumel / v)
      throw InputError(label + ": packed quant state field \"shape\" " + shape.dump() + " holds more than " +
                       std::to_string(kMaxQuantNumel) + " elements (overflow)");
    numel *= v;
    st.shape.push_back(v);
  }
  const bool has_nested = j.contains("nested_blocksize") || j.contains("nested_offset") || j.contains("nested_dtype");
  if (has_nested) {
    NestedQuantState n;
    n.blocksize = require_int(j, "nested_blocksize", label);
    try {
      validate_blocksize(n.blocksize);
    } catch (const InputError& e) {
      throw InputError(label + ": packed quant state field \"nested_blocksize\": " + e.what());
    }
    n.dtype = require_dtype(j, "nested_dtype", label);
    const auto& off = require(j, "nested_offset", label);
    if (!off.is_number()) throw InputError(label + ": packed quant state field \"nested_offset\" must be a number");
    n.offset = static_cast<float>(off.get<double>());  // 1e308 becomes Inf: check_values refuses it
    st.state2 = n;
  }
  return st;
}

namespace {
// `t` on the host at an address its element type may be read from: a view into a file's bytes (a
// safetensors payload at any offset) is copied first.
Tensor host_aligned(const Tensor& t) {
  Tensor h = t.device() == Device::kCpu ? t : t.to(Device::kCpu);
  if (reinterpret_cast<uintptr_t>(h.raw()) % dtype_size(h.dtype()) == 0) return h;
  Tensor copy = Tensor::empty(h.shape(), h.dtype());
  std::memcpy(copy.raw(), h.raw(), h.nbytes());
  return copy;
}
}  // namespace

std::vector<float> QuantState::absmax_f32() const {
  const int64_t nb = num_blocks();
  std::vector<float> out(static_cast<size_t>(nb));
  Tensor a = host_aligned(absmax);
  if (!state2) {
    std::copy_n(a.data<float>(), nb, out.begin());
    return out;
  }
  Tensor na = host_aligned(state2->absmax);
  Tensor nc = host_aligned(state2->code);
  cpu::decode_nested_absmax(a.data<uint8_t>(), na.data<float>(), nc.data<float>(), nb, state2->blocksize,
                            state2->offset, out.data());
  return out;
}

void QuantState::validate(const std::string& label) const {
  const int64_t nb = num_blocks();
  auto fail = [&](const std::string& what) { throw InputError(label + ": " + what); };
  if (!code.defined() || code.dtype() != DType::kF32 || code.numel() != 16)
    fail("quant_map must be 16 float32 values");
  if (!absmax.defined() || absmax.numel() != nb)
    fail("absmax has " + std::to_string(absmax.defined() ? absmax.numel() : 0) + " entries, expected " +
         std::to_string(nb) + " for shape " + shape_str(shape) + " and blocksize " + std::to_string(blocksize));
  if (state2) {
    if (absmax.dtype() != DType::kU8) fail("absmax must be uint8 with double quantization");
    const int64_t nb2 = (nb + state2->blocksize - 1) / state2->blocksize;
    if (!state2->absmax.defined() || state2->absmax.dtype() != DType::kF32 || state2->absmax.numel() != nb2)
      fail("nested_absmax must be " + std::to_string(nb2) + " float32 values");
    if (!state2->code.defined() || state2->code.dtype() != DType::kF32 || state2->code.numel() != 256)
      fail("nested_quant_map must be 256 float32 values");
  } else if (absmax.dtype() != DType::kF32) {
    fail("absmax must be float32 without double quantization");
  }
}

namespace {
// v[i] of a float32 array that may sit at any byte offset (a view into a file's bytes).
float load_f32(const float* v, int64_t i) {
  float x;
  std::memcpy(&x, reinterpret_cast<const unsigned char*>(v) + i * static_cast<int64_t>(sizeof(float)), sizeof x);
  return x;
}

// The first index and count of the values of v[0..n) that fail ok(); {-1, 0} when all pass.
template <typename Ok>
std::pair<int64_t, int64_t> first_bad(const float* v, int64_t n, Ok ok) {
  int64_t first = -1, bad = 0;
  for (int64_t i = 0; i < n; ++i)
    if (!ok(load_f32(v, i))) {
      if (first < 0) first = i;
      ++bad;
    }
  return {first, bad};
}

std::string value_str(float v) { return python_float_repr(static_cast<double>(v)); }
Tensor aligned_on_host(const Tensor& t) { return host_aligned(t); }
}  // namespace

void QuantState::check_values(const std::string& label) const {
  // The bound on |absmax| past which code 1.0 dequantizes to Inf in `dtype`: float16 rounds values
  // below 65520 to its largest finite 65504 (bitsandbytes' own double quant can decode an absmax
  // of 65504 to 65509, seen in tests/data/quant), so the bound is 65520, exclusive; f32 / bf16:
  // any finite float32 (bf16 rounds values below its threshold the same way; the f32 product is
  // what is cast).
  const bool f16 = dtype == DType::kF16;
  const double dtype_max = f16 ? 65520.0 : static_cast<double>(std::numeric_limits<float>::max());
  auto in_range = [f16, dtype_max](double x) { return f16 ? x < dtype_max : x <= dtype_max; };
  auto fail = [&](const std::string& field, const float* v, std::pair<int64_t, int64_t> b, const std::string& want) {
    throw InputError(label + ": " + field + "[" + std::to_string(b.first) + "] = " + value_str(load_f32(v, b.first)) + " (" +
                     std::to_string(b.second) + " such values): expected " + want +
                     "; refusing these statistics (--allow-nonfinite to load anyway)");
  };
  auto in_unit = [](float x) { return std::isfinite(x) && std::fabs(x) <= 1.0f; };
  const Tensor c = aligned_on_host(code);
  if (auto b = first_bad(c.data<float>(), c.numel(), in_unit); b.second) fail("quant_map", c.data<float>(), b, "a finite value in [-1, 1]");
  if (state2) {
    const Tensor nc = aligned_on_host(state2->code), na = aligned_on_host(state2->absmax);
    if (auto b = first_bad(nc.data<float>(), nc.numel(), in_unit); b.second)
      fail("nested_quant_map", nc.data<float>(), b, "a finite value in [-1, 1]");
    auto finite = [](float x) { return std::isfinite(x); };
    if (auto b = first_bad(na.data<float>(), na.numel(), finite); b.second) fail("nested_absmax", na.data<float>(), b, "a finite value");
    if (!std::isfinite(state2->offset) || !in_range(std::fabs(static_cast<double>(state2->offset))))
      throw InputError(label + ": nested_offset = " + value_str(state2->offset) + " (packed quant state): expected a finite value of magnitude " +
                       (f16 ? "< " : "<= ") + python_float_repr(dtype_max) + "; refusing these statistics (--allow-nonfinite to load anyway)");
  }
  // What dequantization multiplies by: absmax, decoded as code256[q] * nested_absmax + offset when nested.
  const std::vector<float> a = absmax_f32();
  auto usable = [&in_range](float x) { return std::isfinite(x) && in_range(std::fabs(static_cast<double>(x))); };
  if (auto b = first_bad(a.data(), static_cast<int64_t>(a.size()), usable); b.second)
    fail(state2 ? "absmax (decoded: nested_quant_map[q] * nested_absmax + nested_offset)" : "absmax", a.data(), b,
         std::string("a finite value of magnitude ") + (f16 ? "< " : "<= ") + python_float_repr(dtype_max) + " (past it " +
             dtype_torch_name(dtype) + " holds Inf)");
}

}  // namespace qshard
