// What the oneDNN ops share: convolution (conv.cpp) and fully connected (linear.cpp) on oneDNN 2.6
// (v2 API), on the one engine and stream the backend creates (backend.cpp). All primitives are
// created at planning time; execute calls re-point memory objects at the caller's buffers and run.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>

#include "backend/backend.hpp"
#include "tensor/error.hpp"

namespace stepbench::cpu {

using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;

std::unique_ptr<ConvOp> make_dnnl_conv(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x, const TensorDesc& y,
                                       const ConvParams& p, FilterFormat ff);  // conv.cpp
// The filter format oneDNN's forward runs fastest on where it is not `ff` (a direct kernel on
// blocked weights), else null; and the convolution that keeps its filter in it.
std::string dnnl_conv_key(const TensorDesc& x, const TensorDesc& y, const ConvParams& p);  // the shapes, as text
std::shared_ptr<const FilterStorage> dnnl_filter_storage(const dnnl::engine& eng, const TensorDesc& x,
                                                         const TensorDesc& y, const ConvParams& p, FilterFormat ff);
std::unique_ptr<ConvOp> make_dnnl_conv_stored(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x,
                                              const TensorDesc& y, const ConvParams& p, FilterFormat ff,
                                              const FilterStorage& w);
// Batch norm on oneDNN (batch_norm_dnnl.cpp) where it beats the hand-written kernel: NHWC, fp32,
// dense input and output, at least kDnnlBatchNormMinPixels pixels per image; `fallback` (the
// hand-written op) runs what oneDNN's kernels do not take (strided views, the inference forward).
inline constexpr std::int64_t kDnnlBatchNormMinPixels = 64 * 64;
bool dnnl_batch_norm_wins(const TensorDesc& x, const TensorDesc& y);
std::unique_ptr<BatchNormOp> make_dnnl_batch_norm(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x,
                                                  const BatchNormParams& p, std::unique_ptr<BatchNormOp> fallback);
// Average pooling on oneDNN (pool_dnnl.cpp): NHWC, fp32, dense input and output; `fallback` (the
// hand-written op) runs the strided views and the backward that adds to dx.
bool dnnl_pool_wins(const TensorDesc& x, const TensorDesc& y, const PoolParams& p);
std::unique_ptr<PoolOp> make_dnnl_pool(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x, const TensorDesc& y,
                                       const PoolParams& p, std::unique_ptr<PoolOp> fallback);
std::unique_ptr<LinearOp> make_dnnl_linear(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x,
                                           const TensorDesc& y);  // linear.cpp
// For tests only (bf16_emulation.cpp, BackendOptions::emulate_bf16): bf16 convolution and inner
// product on oneDNN's fp32 ones, for CPUs whose oneDNN has no bf16 kernel. The filter stays plain.
std::unique_ptr<ConvOp> make_emulated_bf16_conv(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x,
                                                const TensorDesc& y, const ConvParams& p, FilterFormat ff);
std::unique_ptr<LinearOp> make_emulated_bf16_linear(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x,
                                                    const TensorDesc& y);

inline tag act_tag(Layout l) { return l == Layout::nchw ? tag::nchw : tag::nhwc; }
// The filter's format; grouped, oneDNN's 5-D G x O/G x I/G x KH x KW in the same memory order as
// PyTorch's O x I/G x KH x KW (goihw), and as its hwio and ohwi (hwigo, gohwi).
inline tag filter_tag(FilterFormat f, int groups = 1) {
  switch (f) {
    case FilterFormat::oihw: return groups > 1 ? tag::goihw : tag::oihw;
    case FilterFormat::hwio: return groups > 1 ? tag::hwigo : tag::hwio;
    case FilterFormat::ohwi: return groups > 1 ? tag::gohwi : tag::ohwi;
  }
  return tag::oihw;
}
// A convolution's filter dimensions for oneDNN: O, I, KH, KW, or G, O/G, I/G, KH, KW.
inline memory::dims filter_dims(std::int64_t cout, std::int64_t cin, const ConvParams& p) {
  if (p.groups <= 1) return {cout, cin, p.kh, p.kw};
  return {p.groups, cout / p.groups, cin / p.groups, p.kh, p.kw};
}
inline memory::dims dims4(const Shape& s) { return {s.n, s.c, s.h, s.w}; }

// oneDNN's element type of a tensor the cpu backend takes: fp32, or bf16 (--precision bf16)
inline dt dnnl_type(DType t) { return t == DType::bf16 ? dt::bf16 : dt::f32; }
inline void require_dense(const TensorDesc& d, const char* op) {
  if (d.dtype != DType::f32 && d.dtype != DType::bf16)
    throw UnsupportedError(fmt::format("{}: the cpu backend computes in fp32 or bf16", op));
  SB_CHECK(d.is_dense(),
           fmt::format("{}: the cpu backend needs a dense {} tensor, got a strided view", op, to_string(d.layout)));
}

// Re-points a memory object (created with DNNL_MEMORY_NONE) at the caller's buffer.
inline void point(memory& m, const void* p) { m.set_data_handle(const_cast<void*>(p)); }

// A memory object for a user-managed scratchpad of `bytes` (at least one), pointed at the
// workspace when the primitive runs.
inline memory scratchpad_memory(dnnl::engine& eng, std::size_t bytes) {
  return memory(memory::desc({static_cast<memory::dim>(std::max<std::size_t>(bytes, 1))}, dt::u8, tag::a), eng,
                DNNL_MEMORY_NONE);
}

}  // namespace stepbench::cpu
