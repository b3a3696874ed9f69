// ResNet-50 v1.5 (torchvision's resnet50): its shape, names and initialisation, and every unit of
// the network against the oracle in place.
#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

#include "models/models.hpp"
#include "support/test_util.hpp"

namespace stepbench {
namespace {

const LayerInfo& layer_named(const std::vector<LayerInfo>& ls, const std::string& label) {
  for (const auto& l : ls)
    if (l.label == label) return l;
  throw std::invalid_argument("no layer " + label);
}

// Figures from torchvision 0.14: sum(p.numel() for p in resnet50().parameters()), and the
// multiply-adds of its convolutions and fc at 224x224 (forward hooks), 53 convolutions.
TEST(ResNet50, ParameterCountsMacsAndNamesMatchTorchvision) {
  auto be = make_cpu_backend();
  Graph g(*be, GraphConfig{1});
  ModelOptions o;
  o.image_size = default_image_size(ModelKind::resnet50);
  ASSERT_EQ(o.image_size, 224);
  build_resnet50(g, o);
  EXPECT_EQ(g.num_parameters(), 25557032);
  EXPECT_EQ(g.forward_macs_per_image(false), 4089184256);
  EXPECT_EQ(g.params().size(), 53u * 5 + 2);  // weight, bn weight/bias/mean/var per convolution; fc
  const auto ls = g.layers();
  std::map<std::string, int> kinds;
  for (const auto& l : ls) ++kinds[l.kind];
  EXPECT_EQ(kinds["conv_bn_relu"], 33);  // conv1 and each block's conv1, conv2
  EXPECT_EQ(kinds["conv_bn"], 20);       // each block's conv3, the four downsamples
  EXPECT_EQ(kinds["add_relu"], 16);
  for (const auto& l : ls)
    if (l.is_conv_bn()) {
      EXPECT_EQ(l.bn_eps, 1e-5) << l.label;
    }
  // v1.5: the stride on the 3x3 convolution; the downsample a strided 1x1 convolution and a BN
  EXPECT_EQ(layer_named(ls, "layer2.0.conv1").conv.stride_h, 1);
  EXPECT_EQ(layer_named(ls, "layer2.0.conv2").conv.stride_h, 2);
  const auto& ds = layer_named(ls, "layer2.0.downsample");
  EXPECT_EQ(ds.kind, "conv_bn");
  EXPECT_EQ(ds.conv.stride_h, 2);
  EXPECT_EQ(ds.weight, "layer2.0.downsample.0.weight");
  EXPECT_EQ(ds.bn, "layer2.0.downsample.1");
  EXPECT_EQ(g.param("layer1.0.downsample.1.running_var").shape, (std::vector<std::int64_t>{256}));
  EXPECT_EQ(g.param("layer4.2.conv3.weight").shape, (std::vector<std::int64_t>{2048, 512, 1, 1}));
  EXPECT_EQ(g.param("bn1.weight").shape, (std::vector<std::int64_t>{64}));
  EXPECT_EQ(g.param("fc.weight").shape, (std::vector<std::int64_t>{1000, 2048}));
  EXPECT_EQ(layer_named(ls, "layer3.5.add_relu").in.size(), 2u);
  EXPECT_THROW(g.param("layer1.0.downsample.0.bn.weight"), Error);
}

TEST(ResNet50, InitialisationIsTorchvisions) {
  auto be = make_cpu_backend();
  Graph g(*be, GraphConfig{1});
  ModelOptions o;
  o.image_size = 32;
  build_resnet50(g, o);
  g.plan();
  init_parameters(g, 3);
  auto read = [&](const std::string& name) {  // in PyTorch's order
    const auto& e = g.param(name);
    if (e.is_filter) return test::read_filter(*be, g.data_of(e), e);
    std::vector<float> h(e.count);
    be->copy(be->default_stream(), h.data(), g.data_of(e), e.count * sizeof(float));
    be->synchronize(be->default_stream());
    return std::vector<double>(h.begin(), h.end());
  };
  auto rms = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x * x;
    return std::sqrt(s / static_cast<double>(v.size()));
  };
  // kaiming_normal_(mode='fan_out', nonlinearity='relu'): std sqrt(2 / (cout kh kw)); 2.4M and
  // 9408 draws: 1% and 5% are over 10 standard errors of the sample's rms
  EXPECT_NEAR(rms(read("layer4.0.conv2.weight")), std::sqrt(2.0 / (512 * 9)), 0.01 * std::sqrt(2.0 / (512 * 9)));
  EXPECT_NEAR(rms(read("conv1.weight")), std::sqrt(2.0 / (64 * 49)), 0.05 * std::sqrt(2.0 / (64 * 49)));
  // nn.Linear's default: weight and bias uniform in +-1/sqrt(fan_in)
  const double bound = 1 / std::sqrt(2048.0);
  for (const char* name : {"fc.weight", "fc.bias"}) {
    const auto v = read(name);
    double largest = 0;
    for (double x : v) largest = std::max(largest, std::abs(x));
    EXPECT_LE(largest, bound) << name;
    EXPECT_GT(largest, 0.9 * bound) << name;
  }
  EXPECT_NEAR(rms(read("fc.weight")), bound / std::sqrt(3.0), 0.01 * bound);
  for (const auto& x : read("layer1.0.bn3.weight")) ASSERT_EQ(x, 1.0);  // zero_init_residual off
  for (const auto& x : read("layer1.0.bn3.bias")) ASSERT_EQ(x, 0.0);
}

// ResNet-101 and ResNet-152: torchvision's stage block counts, [3, 4, 23, 3] and [3, 8, 36, 3].
// Figures from torchvision 0.14 as above: parameters, the convolutions' and fc's multiply-adds at
// 224x224, and the count of parameter tensors (161, 314, 467 for 50, 101, 152).
TEST(ResNet50, ResNet101And152MatchTorchvisionsCountsAndNames) {
  struct Case {
    ModelKind kind;
    std::int64_t params, macs;
    std::size_t tensors;
    int blocks;
    const char* last;
  };
  for (const Case& c : {Case{ModelKind::resnet101, 44549160, 7801405440, 314, 33, "layer3.22.conv3.weight"},
                        Case{ModelKind::resnet152, 60192808, 11513626624, 467, 50, "layer3.35.conv3.weight"}}) {
    SCOPED_TRACE(std::string(to_string(c.kind)));
    auto be = make_cpu_backend();
    Graph g(*be, GraphConfig{1});
    ModelOptions o;
    o.image_size = default_image_size(c.kind);
    ASSERT_EQ(o.image_size, 224);
    const ModelInfo info = build_model(g, c.kind, o);
    EXPECT_EQ(info.name, to_string(c.kind));
    EXPECT_EQ(g.num_parameters(), c.params);
    EXPECT_EQ(g.forward_macs_per_image(false), c.macs);
    EXPECT_EQ(g.params().size(), 3u * c.blocks * 5 + 4 * 5 + 5 + 2);  // 3 convs a block, 4 downsamples, the stem
    std::size_t learnt = 0;  // torchvision's parameters(): the BN's running statistics are buffers
    for (const auto& p : g.params()) learnt += p.trainable ? 1 : 0;
    EXPECT_EQ(learnt, c.tensors);
    std::map<std::string, int> kinds;
    for (const auto& l : g.layers()) ++kinds[l.kind];
    EXPECT_EQ(kinds["conv_bn_relu"], 1 + 2 * c.blocks);
    EXPECT_EQ(kinds["conv_bn"], c.blocks + 4);
    EXPECT_EQ(kinds["add_relu"], c.blocks);
    EXPECT_EQ(g.param(c.last).shape, (std::vector<std::int64_t>{1024, 256, 1, 1}));
    EXPECT_EQ(layer_named(g.layers(), "layer2.0.conv2").conv.stride_h, 2);  // v1.5
  }
}

TEST(ResNet50, TooSmallImagesAreUsageErrors) {
  auto be = make_cpu_backend();
  Graph g(*be, GraphConfig{1});
  ModelOptions o;
  o.image_size = 31;
  EXPECT_THROW(build_resnet50(g, o), UsageError);
  EXPECT_THROW(build_model(g, ModelKind::resnet152, o), UsageError);
}

// Every unit of the network in place, after one training step at 32x32 and batch 4 (the smallest
// image; layer4's batch norms see 4 values per channel, where 2 would pass them no gradient): conv +
// BN with and without the ReLU, and the gradient each value receives, the sum over its consumers,
// the residual additions and the shortcuts included, against the oracle, NCHW and NHWC.
// (The chain oracle's end-to-end bounds grow about 4x per batch norm: through ResNet-50's 50 they
// exceed the gradients by 1e25 and more, so the whole network is checked end to end against
// PyTorch instead: ctest parity.resnet50.)
class ResNet50Units : public testing::TestWithParam<Layout> {};
TEST_P(ResNet50Units, EveryUnitMatchesTheOracleInPlace) {
  auto be = make_cpu_backend();
  GraphConfig cfg{4, GetParam()};
  cfg.sharing = BufferSharing::keep_values;  // the values and gradients are read after the step
  Graph g(*be, cfg);
  ModelOptions o;
  o.image_size = 32;
  o.num_classes = 10;
  build_resnet50(g, o);
  g.plan();
  init_parameters(g, 11);
  const auto img = test::random_vec(4 * 3 * 32 * 32, 5);
  const std::vector<float> imgf(img.begin(), img.end());
  g.set_input_nchw(imgf.data());
  const std::int32_t labels[4] = {3, 8, 0, 5};
  g.set_labels(labels);
  g.forward(be->default_stream(), true);
  g.backward(be->default_stream());
  test::expect_units_match_oracle(g, test::error_model(test::Config{"cpu", GetParam(), DType::f32}));
}
INSTANTIATE_TEST_SUITE_P(Layouts, ResNet50Units, testing::Values(Layout::nchw, Layout::nhwc),
                         [](const auto& i) { return std::string(to_string(i.param)); });

}  // namespace
}  // namespace stepbench
