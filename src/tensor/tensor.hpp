// Shapes, element types, layouts and tensor views. No backend headers leak out of here.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tensor/names.hpp"

namespace stepbench {

enum class DType { f32, bf16, f16 };
constexpr auto enum_names(DType) {
  return std::array<EnumName<DType>, 7>{{{DType::f32, "fp32"},
                                         {DType::bf16, "bf16"},
                                         {DType::f16, "fp16"},
                                         {DType::f32, "f32"},
                                         {DType::f32, "float32"},
                                         {DType::bf16, "bfloat16"},
                                         {DType::f16, "float16"}}};
}
enum class Layout { nchw, nhwc };
constexpr auto enum_names(Layout) {
  return std::array<EnumName<Layout>, 4>{
      {{Layout::nchw, "nchw"}, {Layout::nhwc, "nhwc"}, {Layout::nchw, "NCHW"}, {Layout::nhwc, "NHWC"}}};
}

// What a run computes in (--precision): the storage type of activations and weights, and whether
// fp32 convolutions and GEMMs may use TF32 tensor-op math.
enum class Precision { fp32, tf32, bf16, fp16 };
constexpr auto enum_names(Precision) {
  return std::array<EnumName<Precision>, 4>{
      {{Precision::fp32, "fp32"}, {Precision::tf32, "tf32"}, {Precision::bf16, "bf16"}, {Precision::fp16, "fp16"}}};
}
constexpr DType storage_dtype(Precision p) {
  return p == Precision::bf16 ? DType::bf16 : p == Precision::fp16 ? DType::f16 : DType::f32;
}
constexpr bool tensor_math(Precision p) { return p == Precision::tf32; }

std::size_t dtype_size(DType t);
bool is_half(DType t);  // bf16 or f16: 16-bit storage with fp32 master weights

// Host conversions, round to nearest even (as CUDA's __float2bfloat16 / __float2half_rn): NaN stays
// NaN, values beyond the format's range become infinity.
std::uint16_t float_to_bf16(float f);
float bf16_to_float(std::uint16_t h);
std::uint16_t float_to_f16(float f);
float f16_to_float(std::uint16_t h);
// n elements from `src` of type `from` to `dst` of type `to` (any of f32, bf16, f16).
void convert(const void* src, DType from, void* dst, DType to, std::size_t n);

// Logical 4-D shape; every activation in a CNN is N x C x H x W whatever its memory layout.
struct Shape {
  std::int64_t n = 0, c = 0, h = 0, w = 0;
  std::int64_t numel() const { return n * c * h * w; }
  bool operator==(const Shape&) const = default;
};
std::string to_string(const Shape& s);

// Element strides of the logical dimensions.
struct Strides {
  std::int64_t n = 0, c = 0, h = 0, w = 0;
  bool operator==(const Strides&) const = default;
};
Strides dense_strides(const Shape& s, Layout l);

struct TensorDesc {
  Shape shape;
  DType dtype = DType::f32;
  Layout layout = Layout::nchw;
  Strides strides;  // dense_strides(shape, layout) unless this is a slice of a larger tensor

  static TensorDesc dense(Shape s, DType t, Layout l) { return {s, t, l, dense_strides(s, l)}; }
  bool is_dense() const { return strides == dense_strides(shape, layout); }
  std::int64_t numel() const { return shape.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  // Element offset of (n, c, h, w).
  std::int64_t offset(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) const {
    return n * strides.n + c * strides.c + h * strides.h + w * strides.w;
  }
  bool operator==(const TensorDesc&) const = default;
};

// A non-owning view over host or device memory.
struct Tensor {
  void* data = nullptr;
  TensorDesc desc;

  const Shape& shape() const { return desc.shape; }
  // Channels [c0, c0 + count) of this tensor: same strides, shifted base. This is how a concat's
  // branches write straight into their part of the block output.
  Tensor channel_slice(std::int64_t c0, std::int64_t count) const;
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

}  // namespace stepbench
