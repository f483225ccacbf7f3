#include "quant/quant_state.h"
#include "runtime/input_file.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
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
  for (const auto& d : shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      throw InputError(label + ": packed quant state shape " + shape.dump() + " has a bad dimension");
    st.shape.push_back(d.get<int64_t>());
  }
  const bool has_nested = j.contains("nested_blocksize") || j.contains("nested_offset") || j.contains("nested_dtype");
  if (has_nested) {
    NestedQuantState n;
    n.blocksize = require_int(j, "nested_blocksize", label);
    if (n.blocksize <= 0) throw InputError(label + ": nested_blocksize must be positive");
    n.dtype = require_dtype(j, "nested_dtype", label);
    const auto& off = require(j, "nested_offset", label);
    if (!off.is_number()) throw InputError(label + ": packed quant state field \"nested_offset\" must be a number");
    n.offset = static_cast<float>(off.get<double>());
    st.state2 = n;
  }
  return st;
}

std::vector<float> QuantState::absmax_f32() const {
  const int64_t nb = num_blocks();
  std::vector<float> out(static_cast<size_t>(nb));
  Tensor a = absmax.device() == Device::kCpu ? absmax : absmax.to(Device::kCpu);
  if (!state2) {
    std::copy_n(a.data<float>(), nb, out.begin());
    return out;
  }
  Tensor na = state2->absmax.device() == Device::kCpu ? state2->absmax : state2->absmax.to(Device::kCpu);
  Tensor nc = state2->code.device() == Device::kCpu ? state2->code : state2->code.to(Device::kCpu);
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

}  // namespace qshard
