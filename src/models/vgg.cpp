// torchvision.models.vgg16 and alexnet: convolutions with a bias and a ReLU (no batch norm), max
// pools, the adaptive average pool to the classifier's size (7 x 7, 6 x 6), the flatten in PyTorch's
// order and the classifier of three fully connected layers with dropout. torchvision's state_dict
// names (features.<i>, classifier.<i>) and initialisation: VGG's kaiming_normal_ (fan_out) for the
// convolutions with zero biases, N(0, 0.01) for the fully connected weights with zero biases;
// AlexNet's PyTorch defaults (every weight and bias uniform(+-1/sqrt(fan_in))).
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "models/models.hpp"

namespace stepbench {
namespace {

ValueId vgg_conv(Graph& g, int index, ValueId x, std::int64_t cout) {
  const std::string at = fmt::format("features.{}", index);
  const auto std = static_cast<float>(std::sqrt(2.0 / static_cast<double>(cout * 9)));  // fan_out, relu
  return g.conv(at, x, cout, {3, 3, 1, 1, 1, 1}, {at + ".weight", at + ".bias", true, ParamInit::normal, std});
}

ValueId alexnet_conv(Graph& g, int index, ValueId x, std::int64_t cout, ConvParams p) {
  const std::string at = fmt::format("features.{}", index);
  return g.conv(at, x, cout, p,
                {at + ".weight", at + ".bias", true, ParamInit::uniform_fan_in, 0.0f, ParamInit::uniform_fan_in});
}

// classifier.<i>: Linear, then (unless last) ReLU; dropout where torchvision has it and it is on
ValueId fc(Graph& g, int index, ValueId x, std::int64_t out, bool relu, bool vgg_init) {
  const std::string at = fmt::format("classifier.{}", index);
  x = vgg_init ? g.linear(at, x, out, 0.01f, ParamInit::normal, ParamInit::zeros)
               : g.linear(at, x, out, 0.0f, ParamInit::uniform_fan_in, ParamInit::uniform_fan_in);
  return relu ? g.relu(x, kNoClip, fmt::format("classifier.{}", index + 1)) : x;
}
ValueId dropout(Graph& g, int index, ValueId x, const ModelOptions& o) {
  return o.dropout > 0 ? g.dropout(x, o.dropout, fmt::format("classifier.{}", index)) : x;
}

}  // namespace

ModelInfo build_vgg16(Graph& g, const ModelOptions& o) {
  require_image_size(ModelKind::vgg16, o.image_size);
  auto x = g.input(3, o.image_size, o.image_size);
  // cfg "D": 64 64 M 128 128 M 256 256 256 M 512 512 512 M 512 512 512 M; each conv and its ReLU take
  // two indices of features, each pool one
  int i = 0;
  for (const int stage : {0, 1, 2, 3, 4}) {
    const std::int64_t width = stage == 0 ? 64 : stage == 1 ? 128 : stage == 2 ? 256 : 512;
    for (int k = 0; k < (stage < 2 ? 2 : 3); ++k, i += 2) x = vgg_conv(g, i, x, width);
    x = g.pool(x, {PoolKind::max, 2, 2, 2, 2, 0, 0}, fmt::format("features.{}", i++));
  }
  x = g.adaptive_avg_pool(x, 7, 7, "avgpool");
  x = g.flatten(x, "flatten");
  x = dropout(g, 2, fc(g, 0, x, 4096, true, true), o);
  x = dropout(g, 5, fc(g, 3, x, 4096, true, true), o);
  ModelInfo info{std::string(model_entry(ModelKind::vgg16).name), o.image_size};
  info.logits = fc(g, 6, x, o.num_classes, false, true);
  g.cross_entropy(info.logits, 1.0f, "logits");
  return info;
}

ModelInfo build_alexnet(Graph& g, const ModelOptions& o) {
  require_image_size(ModelKind::alexnet, o.image_size);
  auto x = g.input(3, o.image_size, o.image_size);
  const PoolParams pool{PoolKind::max, 3, 3, 2, 2, 0, 0};
  x = alexnet_conv(g, 0, x, 64, {11, 11, 4, 4, 2, 2});
  x = g.pool(x, pool, "features.2");
  x = alexnet_conv(g, 3, x, 192, {5, 5, 1, 1, 2, 2});
  x = g.pool(x, pool, "features.5");
  x = alexnet_conv(g, 6, x, 384, {3, 3, 1, 1, 1, 1});
  x = alexnet_conv(g, 8, x, 256, {3, 3, 1, 1, 1, 1});
  x = alexnet_conv(g, 10, x, 256, {3, 3, 1, 1, 1, 1});
  x = g.pool(x, pool, "features.12");
  x = g.adaptive_avg_pool(x, 6, 6, "avgpool");
  x = g.flatten(x, "flatten");
  x = fc(g, 1, dropout(g, 0, x, o), 4096, true, false);
  x = fc(g, 4, dropout(g, 3, x, o), 4096, true, false);
  ModelInfo info{std::string(model_entry(ModelKind::alexnet).name), o.image_size};
  info.logits = fc(g, 6, x, o.num_classes, false, false);
  g.cross_entropy(info.logits, 1.0f, "logits");
  return info;
}

}  // namespace stepbench
