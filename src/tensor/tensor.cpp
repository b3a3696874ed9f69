#include "tensor/tensor.hpp"

#include <fmt/format.h>

#include <bit>
#include <cmath>

#include "tensor/error.hpp"

namespace stepbench {

void throw_error(const char* file, int line, const std::string& what) {
  throw Error(fmt::format("{}:{}: {}", file, line, what));
}

std::string join_or(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

void throw_unknown_name(std::string_view what, std::string_view s, const std::vector<std::string>& names) {
  throw UsageError(fmt::format("unknown {} '{}': use {}", what, s, join_or(names)));
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16:
    case DType::f16: return 2;
  }
  return 0;
}

bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }

std::uint16_t float_to_bf16(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

float bf16_to_float(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

std::uint16_t float_to_f16(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return static_cast<std::uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (x >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504: infinity
  if (x < 0x38800000u) {                                                    // below 2^-14: a subnormal half, or zero
    if (x < 0x33000000u) return static_cast<std::uint16_t>(sign);
    const std::uint32_t m = (x & 0x007fffffu) | 0x00800000u;
    const int shift = 126 - static_cast<int>(x >> 23);
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = (x - 0x38000000u) >> 13;  // exponent rebiased from 127 to 15
  const std::uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // a carry into the exponent is right
  return static_cast<std::uint16_t>(sign | r);
}

float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

void convert(const void* src, DType from, void* dst, DType to, std::size_t n) {
  auto load = [&](std::size_t i) -> float {
    switch (from) {
      case DType::f32: return static_cast<const float*>(src)[i];
      case DType::bf16: return bf16_to_float(static_cast<const std::uint16_t*>(src)[i]);
      case DType::f16: return f16_to_float(static_cast<const std::uint16_t*>(src)[i]);
    }
    return 0.0f;
  };
  for (std::size_t i = 0; i < n; ++i) {
    const float v = load(i);
    switch (to) {
      case DType::f32: static_cast<float*>(dst)[i] = v; break;
      case DType::bf16: static_cast<std::uint16_t*>(dst)[i] = float_to_bf16(v); break;
      case DType::f16: static_cast<std::uint16_t*>(dst)[i] = float_to_f16(v); break;
    }
  }
}

std::string to_string(const Shape& s) { return fmt::format("{}x{}x{}x{}", s.n, s.c, s.h, s.w); }

Strides dense_strides(const Shape& s, Layout l) {
  if (l == Layout::nchw) return {s.c * s.h * s.w, s.h * s.w, s.w, 1};
  return {s.h * s.w * s.c, 1, s.w * s.c, s.c};
}

Tensor Tensor::channel_slice(std::int64_t c0, std::int64_t count) const {
  SB_CHECK(c0 >= 0 && count > 0 && c0 + count <= desc.shape.c,
           fmt::format("channel slice [{}, {}) of a tensor with {} channels", c0, c0 + count, desc.shape.c));
  Tensor t = *this;
  t.desc.shape.c = count;
  t.data = static_cast<char*>(data) + c0 * desc.strides.c * static_cast<std::int64_t>(dtype_size(desc.dtype));
  return t;
}

}  // namespace stepbench
