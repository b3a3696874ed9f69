// torchvision.models.densenet121: growth 32, bn_size 4, blocks of 6, 12, 24 and 16 dense layers,
// each a pre-activation unit twice (BN -> ReLU -> 1x1 conv to 128, BN -> ReLU -> 3x3 conv to 32)
// over the concatenation of everything before it in its block; transitions halve the channels (BN ->
// ReLU -> 1x1 conv) and the map (2x2 average pool). The concatenation is never copied: every layer's
// new features are written into the block's buffer, and each layer reads the prefix so far
// (Graph::concat of a concat). torchvision's state_dict names and initialisation (kaiming_normal_,
// fan_in, for the convolutions; BN weight 1 and bias 0; the classifier's bias 0, its weight
// nn.Linear's default); memory_efficient's trade is --recompute (the BN + ReLU outputs made again).
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <string>

#include "models/models.hpp"

namespace stepbench {
namespace {

ValueId conv(Graph& g, const std::string& name, ValueId x, std::int64_t cout, ConvParams p) {
  const std::int64_t fan_in = g.shape_of(x).c * p.kh * p.kw;
  const auto std = static_cast<float>(std::sqrt(2.0 / static_cast<double>(fan_in)));
  return g.conv(name, x, cout, p, {name + ".weight", "", false, ParamInit::normal, std});
}
ValueId bn_relu(Graph& g, const std::string& name, ValueId x) { return g.batch_norm(name, x, {name, true, 1e-5}); }

constexpr std::int64_t kGrowth = 32, kBottleneck = 4 * kGrowth;

}  // namespace

ModelInfo build_densenet121(Graph& g, const ModelOptions& o) {
  require_image_size(ModelKind::densenet121, o.image_size);
  auto x = g.input(3, o.image_size, o.image_size);
  x = conv(g, "features.conv0", x, 64, {7, 7, 2, 2, 3, 3});
  x = bn_relu(g, "features.norm0", x);
  x = g.pool(x, {PoolKind::max, 3, 3, 2, 2, 1, 1}, "features.pool0");
  const std::array<int, 4> layers{6, 12, 24, 16};
  for (int b = 0; b < 4; ++b) {
    ValueId features = x;  // the block's concatenation so far
    for (int l = 1; l <= layers[b]; ++l) {
      const std::string at = fmt::format("features.denseblock{}.denselayer{}.", b + 1, l);
      auto y = bn_relu(g, at + "norm1", features);
      y = conv(g, at + "conv1", y, kBottleneck, {1, 1, 1, 1, 0, 0});
      y = bn_relu(g, at + "norm2", y);
      y = conv(g, at + "conv2", y, kGrowth, {3, 3, 1, 1, 1, 1});
      features = g.concat({features, y});
    }
    x = features;
    if (b == 3) break;
    const std::string at = fmt::format("features.transition{}.", b + 1);
    x = bn_relu(g, at + "norm", x);
    x = conv(g, at + "conv", x, g.shape_of(x).c / 2, {1, 1, 1, 1, 0, 0});
    x = g.pool(x, {PoolKind::avg_include_pad, 2, 2, 2, 2, 0, 0}, at + "pool");
  }
  x = bn_relu(g, "features.norm5", x);  // and forward()'s F.relu
  x = g.global_avg_pool(x, "avgpool");  // adaptive_avg_pool2d((1, 1))
  ModelInfo info{std::string(model_entry(ModelKind::densenet121).name), o.image_size};
  info.logits = g.linear("classifier", x, o.num_classes, 0.0f, ParamInit::uniform_fan_in, ParamInit::zeros);
  g.cross_entropy(info.logits, 1.0f, "logits");
  return info;
}

}  // namespace stepbench
