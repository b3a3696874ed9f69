// The per-image transforms of the input pipeline, as separate stages so that each can be timed
// and the remedies (a memory cache, pre-resized records) can skip the ones they make unnecessary:
//   resize: any W x H image to the stored size R x R: the shorter side to R with an antialiased
//           triangle (bilinear) filter, the longer side centred. This is what --cache memory keeps
//           and what make-records writes, so all three sources give the same pixels.
//   crop:   torchvision's RandomResizedCrop on the R x R image to S x S (bilinear, pixel centres),
//           as float RGB in 0..255;
//   flip and normalise: the horizontal flip and ImageNet's mean/std into the model's layout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/decode.hpp"
#include "tensor/tensor.hpp"

namespace stepbench {

struct PipelineOptions;

// The stored size for a crop of S: 8/7 of it, rounded (342 for 299, torchvision's eval resize).
int default_store_size(std::int64_t image_size);

// in (W x H RGB) -> out (R x R RGB).
void resize_to_store(const Image8& in, int R, std::vector<unsigned char>& out);

// The crop's box in an R x R image and the flip, drawn from rng_state as torchvision draws them:
// ten tries at a random area and aspect ratio, else the centre crop clamped to the ratio range.
struct CropBox {
  int x = 0, y = 0, w = 0, h = 0;
  bool flip = false;
};
CropBox random_crop_box(int R, const PipelineOptions& o, std::uint64_t rng_state);

// The box of src (R x R RGB) resized to S x S into out (S * S * 3 floats, interleaved RGB, 0..255).
void crop_resize(const unsigned char* src, int R, const CropBox& box, int S, float* out);

// in (S x S interleaved floats) flipped when box.flip, normalised, into dst (3 x S x S dense, in the layout).
void flip_normalise(const float* in, int S, bool flip, Layout layout, const PipelineOptions& o, float* dst);

// All stages for one file, as the plain pipeline runs them: read, decode, resize, crop, flip and
// normalise into dst. false with the reason for a file that cannot be read or decoded.
bool decode_crop_normalise(const std::string& path, float* dst, const PipelineOptions& o, std::uint64_t rng_state,
                           std::string& why);

}  // namespace stepbench
