// Images decoded on the device (--decode gpu): the op a backend makes with
// Backend::make_image_decoder, and what it takes. Included by backend.hpp.
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.hpp"

namespace stepbench {

class Stream;

// The input pipeline's per-image transforms (src/data/augment.hpp) in the R x R image its resize
// makes: torchvision's RandomResizedCrop box, resized to S x S, and the horizontal flip.
struct ImageCrop {
  int x = 0, y = 0, w = 0, h = 0;
  bool flip = false;
};
struct ImageDecodeParams {
  int batch = 1;  // images per call, at most
  int store = 0;  // R: the shorter side resized to it, the longer centred
  int size = 0;   // S: the crop's output
  float mean[3] = {0, 0, 0}, stddev[3] = {1, 1, 1};
  bool hardware = true;  // cuda: nvJPEG's hardware decoder where the GPU has one (else its hybrid backend)
};
// An 8-bit RGB image in host memory, rows packed.
struct HostRgb {
  const unsigned char* px = nullptr;
  int w = 0, h = 0;
};
// Decodes JPEG files on the device and runs the pipeline's transforms there with its arithmetic
// (from the same decoded pixels, the same floats as src/data/augment.cpp), writing image i into
// slot i of a batch tensor (N x 3 x S x S, f32, NCHW or NHWC, dense). Planned once: device buffers
// grow to the largest images seen, and then stay.
class ImageDecodeOp {
 public:
  virtual ~ImageDecodeOp() = default;
  virtual std::string library() const = 0;  // what decodes, for reports ("nvJPEG 13.0.4, hybrid backend")
  // files[i] (host memory, JPEG) into slot i of out; per file "" or why the device could not decode
  // it (that slot is left as it was). Returns when out is written (s synchronised).
  virtual std::vector<std::string> decode(Stream& s,
                                          const std::vector<std::pair<const unsigned char*, std::size_t>>& files,
                                          const std::vector<ImageCrop>& crops, const Tensor& out) = 0;
  // The same transforms from images already decoded (host memory, read before it returns) into the
  // slots given: a file the device refused, decoded on the CPU; the check against the CPU's transforms.
  virtual void transform(Stream& s, const std::vector<HostRgb>& images, const std::vector<ImageCrop>& crops,
                         const std::vector<int>& slots, const Tensor& out) = 0;
};

}  // namespace stepbench
