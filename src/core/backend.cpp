#include "stepbench/backend.hpp"

#include <fmt/format.h>

#include "stepbench/error.hpp"

namespace stepbench {

#ifdef STEPBENCH_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int device);  // src/cuda/cuda_backend.cpp
int cuda_device_count_impl();
std::string cuda_unavailable_reason_impl();
#endif

Shape conv_output_shape(const Shape& x, std::int64_t cout, const ConvParams& p) {
  const std::int64_t oh = (x.h + 2 * p.pad_h - p.kh) / p.stride_h + 1;
  const std::int64_t ow = (x.w + 2 * p.pad_w - p.kw) / p.stride_w + 1;
  if (oh <= 0 || ow <= 0 || x.h + 2 * p.pad_h < p.kh || x.w + 2 * p.pad_w < p.kw)
    throw UsageError(fmt::format("a {}x{} convolution does not fit a {}x{} input; use a larger image size", p.kh,
                                 p.kw, x.h, x.w));
  return {x.n, cout, oh, ow};
}

Shape pool_output_shape(const Shape& x, const PoolParams& p) {
  if (x.h + 2 * p.pad_h < p.kh || x.w + 2 * p.pad_w < p.kw)
    throw UsageError(fmt::format("a {}x{} pool does not fit a {}x{} input; use a larger image size", p.kh, p.kw,
                                 x.h, x.w));
  return {x.n, x.c, (x.h + 2 * p.pad_h - p.kh) / p.stride_h + 1, (x.w + 2 * p.pad_w - p.kw) / p.stride_w + 1};
}

std::string_view to_string(FilterFormat f) {
  switch (f) {
    case FilterFormat::oihw: return "oihw";
    case FilterFormat::hwio: return "hwio";
    case FilterFormat::ohwi: return "ohwi";
  }
  return "?";
}

std::string_view to_string(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::momentum: return "momentum";
    case OptimizerKind::rmsprop: return "rmsprop";
  }
  return "?";
}

OptimizerKind parse_optimizer(std::string_view s) {
  if (s == "sgd") return OptimizerKind::sgd;
  if (s == "momentum") return OptimizerKind::momentum;
  if (s == "rmsprop") return OptimizerKind::rmsprop;
  throw UsageError(fmt::format("unknown optimizer '{}': use momentum, sgd or rmsprop", s));
}

void Backend::begin_capture(Stream&) {
  throw UnsupportedError(fmt::format("--cuda-graph: the {} backend cannot capture work; use --backend cuda", name()));
}
std::unique_ptr<CapturedWork> Backend::end_capture(Stream&) {
  throw UnsupportedError(fmt::format("--cuda-graph: the {} backend cannot capture work", name()));
}

int cuda_device_count() {
#ifdef STEPBENCH_HAVE_CUDA
  return cuda_device_count_impl();
#else
  return 0;
#endif
}

std::string cuda_unavailable_reason() {
#ifdef STEPBENCH_HAVE_CUDA
  return cuda_unavailable_reason_impl();
#else
  return "stepbench was built without CUDA support (configure with -DSTEPBENCH_CUDA=ON)";
#endif
}

std::unique_ptr<Backend> make_backend(std::string_view kind, int device) {
  if (kind == "cpu") return make_cpu_backend();
  if (kind == "cuda" || kind == "auto") {
    const std::string why = cuda_unavailable_reason();
    if (!why.empty()) {
      if (kind == "auto") return make_cpu_backend();
      throw UnsupportedError(fmt::format("--backend cuda: {}; use --backend cpu or auto", why));
    }
#ifdef STEPBENCH_HAVE_CUDA
    return make_cuda_backend(device);
#endif
  }
  throw UsageError(fmt::format("unknown backend '{}': use auto, cpu or cuda", kind));
}

}  // namespace stepbench
