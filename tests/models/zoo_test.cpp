// VGG-16, AlexNet, DenseNet-121 and MobileNet-v2 (torchvision's): their shapes, names and initialisation, and
// DenseNet's concatenation planned without copies (each layer reading its block's prefix) with the
// pre-activations recomputed.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "graph/memory_plan.hpp"
#include "models/models.hpp"
#include "support/test_util.hpp"

namespace stepbench {
namespace {

std::vector<double> read_param(Backend& be, const Graph& g, const std::string& name) {  // in PyTorch's order
  const auto& e = g.param(name);
  if (e.is_filter) return test::read_filter(be, g.data_of(e), e);
  std::vector<float> h(e.count);
  be.copy(be.default_stream(), h.data(), g.data_of(e), e.count * sizeof(float));
  be.synchronize(be.default_stream());
  return {h.begin(), h.end()};
}
double rms(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s / static_cast<double>(v.size()));
}
double largest(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Figures from torchvision 0.14: sum(p.numel() for p in model.parameters()), the multiply-adds of
// its convolutions and fully connected layers at 224x224 (forward hooks), and len(state_dict())
// less the num_batches_tracked (DenseNet's 121, MobileNet-v2's 52).
TEST(Zoo, ParameterCountsMacsAndTensorsMatchTorchvision) {
  struct Case {
    ModelKind kind;
    std::int64_t params, macs;
    std::size_t tensors;
  };
  auto be = make_cpu_backend();
  for (const Case& c :
       {Case{ModelKind::vgg16, 138357544, 15470264320, 32}, Case{ModelKind::alexnet, 61100840, 714188480, 16},
        Case{ModelKind::densenet121, 7978856, 2834161664, 727 - 121},
        Case{ModelKind::mobilenet_v2, 3504872, 300774272, 314 - 52}}) {
    SCOPED_TRACE(std::string(to_string(c.kind)));
    Graph g(*be, GraphConfig{1});
    ModelOptions o;
    o.image_size = default_image_size(c.kind);
    ASSERT_EQ(o.image_size, 224);
    build_model(g, c.kind, o);
    EXPECT_EQ(g.num_parameters(), c.params);
    EXPECT_EQ(g.forward_macs_per_image(false), c.macs);
    EXPECT_EQ(g.params().size(), c.tensors);
  }
}

TEST(Zoo, NamesShapesAndLayersAreTorchvisions) {
  auto be = make_cpu_backend();
  {
    Graph g(*be, GraphConfig{1});
    ModelOptions o;
    o.image_size = 224;
    build_model(g, ModelKind::vgg16, o);
    EXPECT_EQ(g.param("features.28.weight").shape, (std::vector<std::int64_t>{512, 512, 3, 3}));
    EXPECT_EQ(g.param("features.0.bias").shape, (std::vector<std::int64_t>{64}));
    EXPECT_EQ(g.param("classifier.0.weight").shape, (std::vector<std::int64_t>{4096, 25088}));
    EXPECT_EQ(g.param("classifier.6.weight").shape, (std::vector<std::int64_t>{1000, 4096}));
    std::map<std::string, int> kinds;
    for (const auto& l : g.layers()) ++kinds[l.kind];
    EXPECT_EQ(kinds["conv"], 13);
    EXPECT_EQ(kinds["pool"], 5);
    EXPECT_EQ(kinds["linear"], 3);
    EXPECT_EQ(kinds["relu"], 2);  // the classifier's; each convolution's is fused into its bias
    EXPECT_EQ(kinds["dropout"], 2);
    EXPECT_EQ(kinds["flatten"], 1);
    EXPECT_EQ(kinds["adaptive_avg_pool"], 1);
  }
  {
    Graph g(*be, GraphConfig{1});
    ModelOptions o;
    o.image_size = 224;
    o.dropout = 0;
    build_model(g, ModelKind::alexnet, o);
    EXPECT_EQ(g.param("features.0.weight").shape, (std::vector<std::int64_t>{64, 3, 11, 11}));
    EXPECT_EQ(g.param("classifier.1.weight").shape, (std::vector<std::int64_t>{4096, 9216}));
    for (const auto& l : g.layers()) EXPECT_NE(l.kind, "dropout") << "dropout 0 leaves it out";
  }
  {
    Graph g(*be, GraphConfig{1});
    ModelOptions o;
    o.image_size = 224;
    build_model(g, ModelKind::mobilenet_v2, o);
    EXPECT_EQ(g.param("features.2.conv.1.0.weight").shape, (std::vector<std::int64_t>{96, 1, 3, 3}));  // depthwise
    EXPECT_EQ(g.param("features.1.conv.1.weight").shape, (std::vector<std::int64_t>{16, 32, 1, 1}));   // t = 1
    EXPECT_EQ(g.param("features.17.conv.3.running_var").shape, (std::vector<std::int64_t>{320}));
    EXPECT_EQ(g.param("features.18.0.weight").shape, (std::vector<std::int64_t>{1280, 320, 1, 1}));
    EXPECT_EQ(g.param("classifier.1.weight").shape, (std::vector<std::int64_t>{1000, 1280}));
    std::map<std::string, int> kinds;
    int depthwise = 0;
    for (const auto& l : g.layers()) {
      ++kinds[l.kind];
      depthwise += l.is_conv_bn() && l.conv.groups > 1;
      if (l.label == "features.3.conv.1.0") {
        EXPECT_EQ(l.conv.groups, 144);
      }
    }
    EXPECT_EQ(depthwise, 17) << "one depthwise convolution a block";
    EXPECT_EQ(kinds["relu6"], 35);  // the stem, 16 expansions, 17 depthwise, the last 1x1
    EXPECT_EQ(kinds["add"], 10);    // the blocks of stride 1 whose widths agree
    EXPECT_EQ(kinds["dropout"], 1);
  }
  Graph g(*be, GraphConfig{1});
  ModelOptions o;
  o.image_size = 224;
  build_model(g, ModelKind::densenet121, o);
  EXPECT_EQ(g.param("features.denseblock1.denselayer1.norm1.weight").shape, (std::vector<std::int64_t>{64}));
  EXPECT_EQ(g.param("features.denseblock1.denselayer6.norm1.weight").shape, (std::vector<std::int64_t>{224}));
  EXPECT_EQ(g.param("features.denseblock3.denselayer24.conv2.weight").shape,
            (std::vector<std::int64_t>{32, 128, 3, 3}));
  EXPECT_EQ(g.param("features.transition3.conv.weight").shape, (std::vector<std::int64_t>{512, 1024, 1, 1}));
  EXPECT_EQ(g.param("features.norm5.running_var").shape, (std::vector<std::int64_t>{1024}));
  EXPECT_EQ(g.param("classifier.weight").shape, (std::vector<std::int64_t>{1000, 1024}));
  for (const auto& l : g.layers())
    if (l.kind == "bn_relu") {
      EXPECT_EQ(l.bn_eps, 1e-5) << l.label;
    }
}

TEST(Zoo, InitialisationIsTorchvisions) {
  auto be = make_cpu_backend();
  auto load = [&](Graph& g, ModelKind k) {
    ModelOptions o;
    o.image_size = k == ModelKind::alexnet ? 63 : 32;
    build_model(g, k, o);
    g.plan();
    init_parameters(g, 5);
  };
  {
    Graph g(*be, GraphConfig{1});
    load(g, ModelKind::vgg16);
    // kaiming_normal_(fan_out, relu) and zero biases; N(0, 0.01) fully connected weights, zero biases
    // (2.4M and 103M draws: 1% is many standard errors of the sample's rms)
    EXPECT_NEAR(rms(read_param(*be, g, "features.28.weight")), std::sqrt(2.0 / (512 * 9)),
                0.01 * std::sqrt(2.0 / (512 * 9)));
    EXPECT_NEAR(rms(read_param(*be, g, "classifier.0.weight")), 0.01, 1e-4);
    EXPECT_EQ(largest(read_param(*be, g, "features.0.bias")), 0.0);
    EXPECT_EQ(largest(read_param(*be, g, "classifier.6.bias")), 0.0);
  }
  {
    Graph g(*be, GraphConfig{1});
    load(g, ModelKind::alexnet);
    // PyTorch's defaults: every weight and bias uniform in +-1/sqrt(fan_in)
    for (const auto& [name, fan_in] : {std::pair{"features.3.weight", 64 * 25}, std::pair{"features.3.bias", 64 * 25},
                                       std::pair{"classifier.4.weight", 4096}, std::pair{"classifier.4.bias", 4096}}) {
      const double bound = 1 / std::sqrt(static_cast<double>(fan_in)), m = largest(read_param(*be, g, name));
      EXPECT_LE(m, bound) << name;
      EXPECT_GT(m, 0.9 * bound) << name;
    }
  }
  {
    Graph g(*be, GraphConfig{1});
    load(g, ModelKind::mobilenet_v2);
    // kaiming_normal_ (fan_out: O KH KW, not divided by the groups) for the depthwise filter too
    EXPECT_NEAR(rms(read_param(*be, g, "features.16.conv.1.0.weight")), std::sqrt(2.0 / (960 * 9)),
                0.1 * std::sqrt(2.0 / (960 * 9)));
    EXPECT_NEAR(rms(read_param(*be, g, "classifier.1.weight")), 0.01, 2e-4);
    EXPECT_EQ(largest(read_param(*be, g, "classifier.1.bias")), 0.0);
  }
  Graph g(*be, GraphConfig{1});
  load(g, ModelKind::densenet121);
  // kaiming_normal_ (fan_in) for the convolutions; the classifier's bias 0
  EXPECT_NEAR(rms(read_param(*be, g, "features.denseblock3.denselayer5.conv2.weight")), std::sqrt(2.0 / (128 * 9)),
              0.02 * std::sqrt(2.0 / (128 * 9)));
  EXPECT_EQ(largest(read_param(*be, g, "classifier.bias")), 0.0);
  for (double x : read_param(*be, g, "features.norm5.weight")) ASSERT_EQ(x, 1.0);
}

// Every dense layer reads the concatenation so far, a prefix of its block's one buffer: no copy of
// it anywhere (one activation buffer a block for the features, not one a layer), and with recompute
// the BN + ReLU outputs are freed after the forward and made again in backward.
TEST(Zoo, DenseNetReadsPrefixesOfOneBufferAndRecomputesItsPreActivations) {
  auto be = make_cpu_backend();
  std::size_t backward_peak[2] = {};
  for (const Recompute r : {Recompute::off, Recompute::on}) {
    SCOPED_TRACE(std::string(to_string(r)));
    GraphConfig cfg{2};
    cfg.recompute = r;
    Graph g(*be, cfg);
    ModelOptions o;
    o.image_size = 64;
    build_model(g, ModelKind::densenet121, o);
    g.plan();
    const auto ls = g.layers();
    int prefix_reads = 0;
    for (const auto& l : ls)
      if (l.label.find(".norm1") != std::string::npos && l.label.find("denselayer1.") == std::string::npos) {
        const auto parts = g.concat_parts(l.in[0]);
        EXPECT_GE(parts.size(), 2u) << l.label << " reads the block's input and the layers before it";
        const Tensor t = g.value(l.in[0]);
        EXPECT_FALSE(t.desc.is_dense()) << l.label << " reads a channel slice, not a copy";
        ++prefix_reads;
      }
    EXPECT_EQ(prefix_reads, 6 + 12 + 24 + 16 - 4);
    std::size_t concats = 0, recomputed = 0;
    for (const auto& b : g.memory_plan().buffers) {
      concats += b.name.rfind("concat(", 0) == 0;
      recomputed += b.recomputed;
    }
    EXPECT_EQ(concats, 4u) << "one buffer a block";
    // every BN + ReLU output with recompute on (121: norm0.s and norm5.s read by their pools' backward too)
    EXPECT_EQ(recomputed, r == Recompute::on ? 121u : 0u);
    backward_peak[r == Recompute::on] = memory_peaks(g.memory_plan())[static_cast<int>(MemoryPhase::backward)].bytes;
  }
  EXPECT_LT(backward_peak[1], backward_peak[0]);
}

}  // namespace
}  // namespace stepbench
