#include "stepbench/tensor.hpp"

#include <fmt/format.h>

#include "stepbench/error.hpp"

namespace stepbench {

void throw_error(const char* file, int line, const std::string& what) {
  throw Error(fmt::format("{}:{}: {}", file, line, what));
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  return 0;
}

std::string_view to_string(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::f16: return "fp16";
  }
  return "?";
}

std::string_view to_string(Layout l) { return l == Layout::nchw ? "nchw" : "nhwc"; }

DType parse_dtype(std::string_view s) {
  if (s == "fp32" || s == "f32" || s == "float32") return DType::f32;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "fp16" || s == "f16" || s == "float16") return DType::f16;
  throw UsageError(fmt::format("unknown precision '{}': use fp32, bf16 or fp16", s));
}

Layout parse_layout(std::string_view s) {
  if (s == "nchw" || s == "NCHW") return Layout::nchw;
  if (s == "nhwc" || s == "NHWC") return Layout::nhwc;
  throw UsageError(fmt::format("unknown layout '{}': use nchw or nhwc", s));
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
