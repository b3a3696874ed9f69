// torchvision.models.mobilenet_v2 (width 1.0): a 3x3 stem, 17 inverted residual blocks (a 1x1
// expansion by t, a depthwise 3x3, a 1x1 projection without activation; the input added back where
// the stride is 1 and the widths agree), a 1x1 to 1280, the pool, dropout 0.2 and the classifier.
// Every activation is ReLU6 (a unit without ReLU, then the clipped ReLU). torchvision's state_dict
// names (features.<i>.conv.<j>[.<k>]) and initialisation: kaiming_normal_ (fan_out) for the
// convolutions, BN weight 1 and bias 0, the classifier N(0, 0.01) with a zero bias.
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <string>

#include "models/models.hpp"

namespace stepbench {
namespace {

// Conv2d(bias=False) -> BatchNorm2d -> ReLU6 if relu6 (torchvision's Conv2dNormActivation, or a
// block's projection and its BN): `conv` and `bn` the modules' names
ValueId unit(Graph& g, const std::string& conv, const std::string& bn, ValueId x, std::int64_t cout, ConvParams p,
             bool relu6) {
  const auto std = static_cast<float>(std::sqrt(2.0 / static_cast<double>(cout * p.kh * p.kw)));  // fan_out
  x = g.conv_bn(conv, x, cout, p, {conv + ".weight", bn, false, 1e-5, ParamInit::normal, std});
  return relu6 ? g.relu(x, 6.0f, conv + ".relu6") : x;
}

struct Stage {
  int t, c, n, s;  // expansion, width, blocks, the first block's stride
};
constexpr std::array<Stage, 7> kStages{
    {{1, 16, 1, 1}, {6, 24, 2, 2}, {6, 32, 3, 2}, {6, 64, 4, 2}, {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}}};

ValueId inverted_residual(Graph& g, int index, ValueId x, std::int64_t out, int stride, int t) {
  const std::string at = fmt::format("features.{}.conv.", index);
  const std::int64_t in = g.shape_of(x).c, hidden = in * t;
  int j = 0;
  ValueId y = x;
  if (t != 1) {
    y = unit(g, fmt::format("{}{}.0", at, j), fmt::format("{}{}.1", at, j), y, hidden, {1, 1}, true);
    ++j;
  }
  const ConvParams dw{3, 3, stride, stride, 1, 1, static_cast<int>(hidden)};  // depthwise
  y = unit(g, fmt::format("{}{}.0", at, j), fmt::format("{}{}.1", at, j), y, hidden, dw, true);
  ++j;
  y = unit(g, fmt::format("{}{}", at, j), fmt::format("{}{}", at, j + 1), y, out, {1, 1}, false);
  if (stride == 1 && in == out) y = g.add(x, y, fmt::format("features.{}.add", index));
  return y;
}

}  // namespace

ModelInfo build_mobilenet_v2(Graph& g, const ModelOptions& o) {
  require_image_size(ModelKind::mobilenet_v2, o.image_size);
  auto x = g.input(3, o.image_size, o.image_size);
  x = unit(g, "features.0.0", "features.0.1", x, 32, {3, 3, 2, 2, 1, 1}, true);
  int index = 1;
  for (const Stage& st : kStages)
    for (int i = 0; i < st.n; ++i) x = inverted_residual(g, index++, x, st.c, i == 0 ? st.s : 1, st.t);
  x = unit(g, fmt::format("features.{}.0", index), fmt::format("features.{}.1", index), x, 1280, {1, 1}, true);
  x = g.global_avg_pool(x, "avgpool");                       // adaptive_avg_pool2d((1, 1))
  if (o.dropout > 0) x = g.dropout(x, 0.2, "classifier.0");  // torchvision's own rate
  ModelInfo info{std::string(model_entry(ModelKind::mobilenet_v2).name), o.image_size};
  info.logits = g.linear("classifier.1", x, o.num_classes, 0.01f, ParamInit::normal, ParamInit::zeros);
  g.cross_entropy(info.logits, 1.0f, "logits");
  return info;
}

}  // namespace stepbench
