// The channel padding rule of the cuda convolution (conv.cpp), apart so that a test checks it
// without a GPU. Internal to src/backend/cuda.
#pragma once
#include "tensor/tensor.hpp"

namespace stepbench::cuda {

// Tensor cores want the input channel count of 16-bit NHWC data a multiple of 8; the 3-channel stem
// is padded with zero channels: the input (and its gradient) and the filter (and its gradient) get
// padded copies, and cuDNN runs on those. Output channel counts are not padded: cuDNN 9.19 found
// algorithms for 16-bit NHWC convolutions with 3, 5 and 7 output channels on an H100 (the op tests'
// cases), and planning says which convolution it could not plan if one ever has none.
// A grouped convolution is never padded (its groups would split differently).
inline bool needs_channel_pad(const TensorDesc& x, int groups = 1) {
  return groups == 1 && x.dtype != DType::f32 && x.layout == Layout::nhwc && x.shape.c % 8 != 0;
}
// x as cuDNN sees it: dense with the channels rounded up to a multiple of 8, or x itself.
inline TensorDesc channel_padded(const TensorDesc& x, int groups = 1) {
  if (!needs_channel_pad(x, groups)) return x;
  Shape s = x.shape;
  s.c = (s.c + 7) / 8 * 8;
  return TensorDesc::dense(s, x.dtype, x.layout);
}

}  // namespace stepbench::cuda
