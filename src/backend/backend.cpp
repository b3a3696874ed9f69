#include "backend/backend.hpp"

#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "tensor/error.hpp"

namespace stepbench {

Shape conv_output_shape(const Shape& x, std::int64_t cout, const ConvParams& p) {
  const std::int64_t oh = (x.h + 2 * p.pad_h - p.kh) / p.stride_h + 1;
  const std::int64_t ow = (x.w + 2 * p.pad_w - p.kw) / p.stride_w + 1;
  if (oh <= 0 || ow <= 0 || x.h + 2 * p.pad_h < p.kh || x.w + 2 * p.pad_w < p.kw)
    throw UsageError(
        fmt::format("a {}x{} convolution does not fit a {}x{} input; use a larger image size", p.kh, p.kw, x.h, x.w));
  SB_CHECK(
      p.groups >= 1 && x.c % p.groups == 0 && cout % p.groups == 0,
      fmt::format("a convolution of {} groups from {} to {} channels: both must divide by it", p.groups, x.c, cout));
  return {x.n, cout, oh, ow};
}

Shape pool_output_shape(const Shape& x, const PoolParams& p) {
  if (x.h + 2 * p.pad_h < p.kh || x.w + 2 * p.pad_w < p.kw)
    throw UsageError(
        fmt::format("a {}x{} pool does not fit a {}x{} input; use a larger image size", p.kh, p.kw, x.h, x.w));
  return {x.n, x.c, (x.h + 2 * p.pad_h - p.kh) / p.stride_h + 1, (x.w + 2 * p.pad_w - p.kw) / p.stride_w + 1};
}

void Backend::delay(Stream& s, double ms) {
  synchronize(s);
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

void Backend::begin_capture(Stream&) {
  throw UnsupportedError(fmt::format("--cuda-graph: the {} backend cannot capture work; use --backend cuda", name()));
}
void Backend::start_activity() { throw UnsupportedError(activity_unavailable()); }
std::unique_ptr<ImageDecodeOp> Backend::make_image_decoder(const ImageDecodeParams&) {
  throw UnsupportedError(fmt::format(
      "--decode gpu decodes JPEG files on a GPU (nvJPEG); the {} backend has no GPU decoder: use --backend cuda where "
      "a GPU is visible",
      name()));
}
std::unique_ptr<ConvOp> Backend::make_conv_stored(const TensorDesc&, const TensorDesc&, const ConvParams&,
                                                  const FilterStorage& w) {
  throw Error(fmt::format("the {} backend keeps no filter in a storage of its own (asked for {})", name(), w.name()));
}
std::unique_ptr<CapturedWork> Backend::end_capture(Stream&) {
  throw UnsupportedError(fmt::format("--cuda-graph: the {} backend cannot capture work", name()));
}

}  // namespace stepbench
