// The models and the training step.
#include <limits>

#include "io/io.hpp"
#include "models/models.hpp"
#include "support/test_util.hpp"
#include "train/trainer.hpp"

namespace stepbench {
namespace {

TEST(InceptionV3, ParameterCountsAndMacsMatchTorchvision) {
  auto be = make_cpu_backend();
  for (bool aux : {true, false}) {
    Graph g(*be, GraphConfig{1});
    ModelOptions o;
    o.aux_logits = aux;
    build_inception_v3(g, o);
    EXPECT_EQ(g.num_parameters(), aux ? 27161264 : 23834568);
    EXPECT_EQ(g.forward_macs_per_image(false), 5713216096);
    // 94 BasicConv2d units (96 with the aux head): weight, bn weight/bias/mean/var each, + 2 fc (+2 aux fc)
    EXPECT_EQ(g.params().size(), static_cast<std::size_t>((aux ? 96 : 94) * 5 + (aux ? 4 : 2)));
  }
}

TEST(InceptionV3, TooSmallImagesAreUsageErrors) {
  auto be = make_cpu_backend();
  Graph g(*be, GraphConfig{1});
  ModelOptions o;
  o.image_size = 74;
  EXPECT_THROW(build_inception_v3(g, o), UsageError);
  Graph g2(*be, GraphConfig{1});
  EXPECT_THROW(parse_enum<ModelKind>("vgg19", "model"), UsageError);
  Graph g3(*be, GraphConfig{1});
  o.image_size = 298;  // the aux head's 5x5 conv needs Mixed_6e at 17x17 (torchvision fails too)
  EXPECT_THROW(build_inception_v3(g3, o), UsageError);
  o.aux_logits = false;
  Graph g4(*be, GraphConfig{1});
  EXPECT_NO_THROW(build_inception_v3(g4, o));
}

TEST(InceptionV3, SmallestImagePlansAndRuns) {
  auto be = make_cpu_backend();
  Graph g(*be, GraphConfig{2}), g0(*be, GraphConfig{2});
  ModelOptions o;
  o.image_size = 75;
  o.num_classes = 10;
  EXPECT_THROW(build_inception_v3(g0, o), UsageError);  // the aux head needs a larger image
  o.aux_logits = false;
  build_inception_v3(g, o);
  g.plan();
  init_parameters(g, 3);
  std::vector<float> img(2 * 3 * 75 * 75, 0.5f);
  g.set_input_nchw(img.data());
  const std::int32_t labels[2] = {1, 7};
  g.set_labels(labels);
  g.forward(be->default_stream(), true);
  g.backward(be->default_stream());
  const float loss = g.loss(be->default_stream());
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_GT(loss, 0.0f);
}

// Every conv-BN-ReLU unit of the whole network, checked in place against the oracle after one
// forward and backward (NCHW and NHWC): a wrong gradient anywhere in the graph's plumbing (fan-out
// accumulation, concat slices, shared scratch) shows as a unit whose gradients disagree.
class InceptionUnits : public testing::TestWithParam<Layout> {};
TEST_P(InceptionUnits, EveryUnitMatchesTheOracleInPlace) {
  auto be = make_cpu_backend();
  GraphConfig cfg{2, GetParam()};
  cfg.sharing = BufferSharing::keep_values;  // the values and gradients are read after the step
  Graph g(*be, cfg);
  ModelOptions o;
  o.image_size = 75;
  o.num_classes = 10;
  o.aux_logits = false;
  o.dropout = 0;
  build_inception_v3(g, o);
  g.plan();
  init_parameters(g, 11);
  const auto img = test::random_vec(2 * 3 * 75 * 75, 5);
  const std::vector<float> imgf(img.begin(), img.end());
  g.set_input_nchw(imgf.data());
  const std::int32_t labels[2] = {3, 8};
  g.set_labels(labels);
  g.forward(be->default_stream(), true);
  g.backward(be->default_stream());
  test::expect_units_match_oracle(g, test::error_model(test::Config{"cpu", GetParam(), DType::f32}));
}
// The aux head (training only, 299x299 alone builds it), its units checked in place the same way.
TEST_P(InceptionUnits, EveryAuxHeadUnitMatchesTheOracleInPlace) {
  auto be = make_cpu_backend();
  GraphConfig cfg{2, GetParam()};
  cfg.sharing = BufferSharing::keep_values;
  Graph g(*be, cfg);
  ModelOptions o;
  o.image_size = 299;
  o.num_classes = 10;
  o.aux_logits = true;
  o.dropout = 0;
  build_inception_v3(g, o);
  g.plan();
  init_parameters(g, 12);
  const auto img = test::random_vec(2 * 3 * 299 * 299, 6);
  const std::vector<float> imgf(img.begin(), img.end());
  g.set_input_nchw(imgf.data());
  const std::int32_t labels[2] = {1, 7};
  g.set_labels(labels);
  g.forward(be->default_stream(), true);
  g.backward(be->default_stream());
  int aux = 0;
  for (const auto& l : g.layers()) aux += l.training_only && l.kind == "conv_bn_relu";
  ASSERT_EQ(aux, 2) << "AuxLogits.conv0 and conv1";
  test::expect_units_match_oracle(g, test::error_model(test::Config{"cpu", GetParam(), DType::f32}),
                                  [](const LayerInfo& l) { return l.training_only; });
}
INSTANTIATE_TEST_SUITE_P(Layouts, InceptionUnits, testing::Values(Layout::nchw, Layout::nhwc),
                         [](const auto& i) { return std::string(to_string(i.param)); });

struct TinyRun {
  std::vector<float> losses;
};
TinyRun train_tiny(Layout layout, OptimizerKind kind, int steps) {
  auto be = make_cpu_backend();
  Graph g(*be, GraphConfig{8, layout, DType::f32, 11});
  ModelOptions o;
  o.image_size = 24;
  o.num_classes = 4;
  o.dropout = 0;
  build_tiny(g, o);
  g.plan();
  init_parameters(g, 21);
  const auto img = test::random_vec(8 * 3 * 24 * 24, 5);
  std::vector<float> f(img.begin(), img.end());
  g.set_input_nchw(f.data());
  const std::int32_t labels[8] = {0, 1, 2, 3, 3, 2, 1, 0};
  g.set_labels(labels);
  OptimizerConfig oc;
  oc.kind = kind;
  oc.lr = 0.1f;
  Trainer tr(g, oc);
  TinyRun r;
  auto& s = be->default_stream();
  for (int i = 0; i < steps; ++i) {
    tr.step(s);
    r.losses.push_back(g.loss(s));
  }
  return r;
}

TEST(Training, ThirtyStepsOnOneBatchDriveTheLossDownTenfold) {
  for (auto kind : {OptimizerKind::momentum, OptimizerKind::sgd, OptimizerKind::rmsprop}) {
    SCOPED_TRACE(std::string(to_string(kind)));
    const auto r = train_tiny(Layout::nchw, kind, 30);
    EXPECT_LT(r.losses.back() * 10, r.losses.front()) << "first " << r.losses.front() << " last " << r.losses.back();
  }
}

TEST(Training, SameSeedGivesBitIdenticalLosses) {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    const auto a = train_tiny(l, OptimizerKind::momentum, 10), b = train_tiny(l, OptimizerKind::momentum, 10);
    EXPECT_EQ(a.losses, b.losses);
  }
}

// Dynamic loss scaling (on by default for fp16) in fp32 on the CPU: the scale is a power of two, so
// scaling the loss gradient and dividing it out again changes nothing, bit for bit; an overflow
// skips the update and halves the scale.
TEST(Training, LossScalingLeavesStepsUnchangedAndSkipsOverflows) {
  auto be = make_cpu_backend();
  auto run = [&](bool scaling, Graph*& out, std::unique_ptr<Graph>& keep, std::unique_ptr<Trainer>& tr) {
    GraphConfig gc{8, Layout::nchw, DType::f32, 11};
    gc.loss_scaling = scaling;
    keep = std::make_unique<Graph>(*be, gc);
    ModelOptions o;
    o.image_size = 24;
    o.num_classes = 4;
    o.dropout = 0;
    build_tiny(*keep, o);
    keep->plan();
    init_parameters(*keep, 21);
    const auto img = test::random_vec(8 * 3 * 24 * 24, 5);
    std::vector<float> f(img.begin(), img.end());
    keep->set_input_nchw(f.data());
    const std::int32_t labels[8] = {0, 1, 2, 3, 3, 2, 1, 0};
    keep->set_labels(labels);
    tr = std::make_unique<Trainer>(*keep, OptimizerConfig{});
    out = keep.get();
  };
  Graph *plain = nullptr, *scaled = nullptr;
  std::unique_ptr<Graph> k1, k2;
  std::unique_ptr<Trainer> t1, t2;
  run(false, plain, k1, t1);
  run(true, scaled, k2, t2);
  auto& s = be->default_stream();
  EXPECT_EQ(plain->loss_scaler(), nullptr);
  ASSERT_NE(scaled->loss_scaler(), nullptr);
  EXPECT_EQ(scaled->loss_scale(s), LossScaler::kInitialScale);
  auto arena = [](const Graph& g, const float* p) { return std::vector<float>(p, p + g.param_arena_floats()); };
  for (int i = 0; i < 5; ++i) {
    t1->step(s);
    t2->forward(s);
    t2->backward(s);
    if (i == 0) {  // the gradients are the plain ones times the scale
      const auto g1 = arena(*plain, plain->grad_arena()), g2 = arena(*scaled, scaled->grad_arena());
      for (std::size_t j = 0; j < g1.size(); j += 97) ASSERT_EQ(g2[j], g1[j] * LossScaler::kInitialScale) << j;
    }
    t2->update(s);
  }
  EXPECT_EQ(arena(*scaled, scaled->param_arena()), arena(*plain, plain->param_arena()));
  EXPECT_EQ(plain->loss(s), scaled->loss(s));
  // an overflow in one gradient: the step is skipped and the scale halves
  const auto before = arena(*scaled, scaled->param_arena());
  t2->forward(s);
  t2->backward(s);
  scaled->grad_arena()[3] = std::numeric_limits<float>::infinity();
  t2->update(s);
  EXPECT_EQ(arena(*scaled, scaled->param_arena()), before);
  EXPECT_EQ(scaled->loss_scale(s), LossScaler::kInitialScale / 2);
  t2->step(s);  // and the next step goes through again
  EXPECT_NE(arena(*scaled, scaled->param_arena()), before);
}

TEST(Weights, RoundTripAndErrorsNameTheTensor) {
  auto be = make_cpu_backend();
  Graph g(*be, GraphConfig{2, Layout::nhwc});
  ModelOptions o;
  o.image_size = 20;
  o.num_classes = 3;
  build_tiny(g, o);
  g.plan();
  init_parameters(g, 9);
  const std::string path = testing::TempDir() + "/w.safetensors";
  const TensorMap w = export_weights(g);
  EXPECT_EQ(w.at("conv2.conv.weight").shape, (std::vector<std::int64_t>{24, 16, 3, 3}));
  write_safetensors(path, w);
  Graph g2(*be, GraphConfig{2, Layout::nchw});
  build_tiny(g2, o);
  g2.plan();
  import_weights(g2, read_safetensors(path));
  EXPECT_EQ(export_weights(g2).at("conv2.conv.weight").bytes, w.at("conv2.conv.weight").bytes);

  auto expect_error = [&](TensorMap m, const std::string& needle) {
    try {
      import_weights(g2, m);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TensorMap missing = w;
  missing.erase("fc.bias");
  expect_error(missing, "'fc.bias' is missing");
  TensorMap extra = w;
  extra.emplace("fc2.weight", w.at("fc.bias"));
  expect_error(extra, "'fc2.weight'");
  TensorMap shaped = w;
  shaped.at("fc.bias").shape = {1, 3};
  expect_error(shaped, "'fc.bias' has shape");
  TensorMap typed = w;
  typed.at("fc.bias").dtype = "I32";
  expect_error(typed, "'fc.bias' is I32");
  TensorMap counter = w;
  std::int64_t zero = 0;
  HostArray nbt{"I64", {}, std::vector<char>(reinterpret_cast<char*>(&zero), reinterpret_cast<char*>(&zero) + 8)};
  counter.emplace("conv1.bn.num_batches_tracked", nbt);
  EXPECT_NO_THROW(import_weights(g2, counter));

  EXPECT_THROW(read_safetensors(testing::TempDir() + "/does-not-exist"), Error);
  {
    std::ofstream f(testing::TempDir() + "/corrupt.safetensors", std::ios::binary);
    f << "garbage that is not a safetensors file";
  }
  EXPECT_THROW(read_safetensors(testing::TempDir() + "/corrupt.safetensors"), Error);
}

}  // namespace
}  // namespace stepbench
