// torchvision.models.resnet50, resnet101 and resnet152 (v1.5: the stride on each bottleneck's 3x3
// convolution), layer by layer, the three differing only in their stages' block counts: torchvision's state_dict names
// and initialisation (kaiming_normal_, fan_out, for the convolutions; BN weight 1 and bias 0; the fc as nn.Linear's
// default; zero_init_residual off).
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <string>

#include "models/models.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

// Conv2d(bias=False) -> BatchNorm2d(eps 1e-5, momentum 0.1) -> ReLU if relu: `conv` and `bn` are
// torchvision's module names ("layer1.0.conv1", "layer1.0.bn1"), `label` what reports call the unit.
ValueId conv_bn(Graph& g, const std::string& label, const std::string& conv, const std::string& bn, ValueId x,
                std::int64_t cout, ConvParams p, bool relu) {
  // kaiming_normal_(mode='fan_out', nonlinearity='relu'): std = sqrt(2 / (cout * kh * kw))
  const auto std = static_cast<float>(std::sqrt(2.0 / static_cast<double>(cout * p.kh * p.kw)));
  return g.conv_bn(label, x, cout, p, {conv + ".weight", bn, relu, 1e-5, ParamInit::normal, std});
}

ConvParams k1(int stride = 1) { return {1, 1, stride, stride, 0, 0}; }
ConvParams k3(int stride) { return {3, 3, stride, stride, 1, 1}; }

// torchvision's Bottleneck (expansion 4): 1x1 -> 3x3 (stride) -> 1x1 to 4 x width, plus the
// shortcut (the input, or the downsample: a strided 1x1 convolution and a batch norm), then the ReLU.
ValueId bottleneck(Graph& g, const std::string& name, ValueId x, std::int64_t width, int stride) {
  const std::string at = name + ".";
  const std::int64_t cin = g.shape_of(x).c, cout = 4 * width;
  auto y = conv_bn(g, at + "conv1", at + "conv1", at + "bn1", x, width, k1(), true);
  y = conv_bn(g, at + "conv2", at + "conv2", at + "bn2", y, width, k3(stride), true);
  y = conv_bn(g, at + "conv3", at + "conv3", at + "bn3", y, cout, k1(), false);
  ValueId identity = x;
  if (stride != 1 || cin != cout)
    identity = conv_bn(g, at + "downsample", at + "downsample.0", at + "downsample.1", x, cout, k1(stride), false);
  // torchvision: out += identity; out = self.relu(out)
  return g.add_relu(y, identity, at + "add_relu");
}

ValueId layer(Graph& g, const std::string& name, ValueId x, std::int64_t width, int blocks, int stride) {
  for (int i = 0; i < blocks; ++i) x = bottleneck(g, fmt::format("{}.{}", name, i), x, width, i == 0 ? stride : 1);
  return x;
}

}  // namespace

ModelInfo build_resnet(Graph& g, ModelKind depth, const ModelOptions& o) {
  // torchvision's resnet50/101/152: Bottleneck, [3, 4, 6, 3] / [3, 4, 23, 3] / [3, 8, 36, 3]
  const std::array<int, 4> blocks = depth == ModelKind::resnet152   ? std::array<int, 4>{3, 8, 36, 3}
                                    : depth == ModelKind::resnet101 ? std::array<int, 4>{3, 4, 23, 3}
                                                                    : std::array<int, 4>{3, 4, 6, 3};
  SB_CHECK(depth == ModelKind::resnet50 || depth == ModelKind::resnet101 || depth == ModelKind::resnet152,
           "build_resnet: resnet50, resnet101 or resnet152");
  require_image_size(depth, o.image_size);
  auto x = g.input(3, o.image_size, o.image_size);
  x = conv_bn(g, "conv1", "conv1", "bn1", x, 64, {7, 7, 2, 2, 3, 3}, true);
  x = g.pool(x, {PoolKind::max, 3, 3, 2, 2, 1, 1}, "maxpool");
  x = layer(g, "layer1", x, 64, blocks[0], 1);
  x = layer(g, "layer2", x, 128, blocks[1], 2);
  x = layer(g, "layer3", x, 256, blocks[2], 2);
  x = layer(g, "layer4", x, 512, blocks[3], 2);
  x = g.global_avg_pool(x, "avgpool");  // AdaptiveAvgPool2d((1, 1))
  ModelInfo info{std::string(model_entry(depth).name), o.image_size};
  info.logits = g.linear("fc", x, o.num_classes, 0, ParamInit::uniform_fan_in);
  g.cross_entropy(info.logits, 1.0f, "logits");
  return info;
}

}  // namespace stepbench
