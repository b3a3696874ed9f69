// GPU tests: built always, skipped with the reason when no GPU is visible (or CUDA is not built).
// Every op of the cuda backend is also in test_ops.cpp (typed over backend x layout x precision,
// against the oracle); here: whole training steps on the GPU against the CPU backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "stepbench/backend.hpp"
#include "stepbench/error.hpp"
#include "stepbench/io.hpp"
#include "stepbench/models.hpp"
#include "test_util.hpp"

namespace stepbench {
namespace {

TEST(Cuda, ExplicitCudaWithoutGpuIsAClearError) {
  if (cuda_unavailable_reason().empty()) GTEST_SKIP() << "a GPU is visible";
  try {
    make_backend("cuda");
    FAIL() << "no error";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("--backend cpu"), std::string::npos) << e.what();
  }
  EXPECT_EQ(make_backend("auto")->name(), "cpu");
}

struct StepResult {
  std::vector<float> logits_eval, logits_train;
  float loss = 0;
  TensorMap grads;
};

StepResult one_step(Backend& be, const std::string& model, Layout l, std::int64_t batch, std::int64_t image) {
  Graph g(be, GraphConfig{batch, l, DType::f32, 3});
  ModelOptions o;
  o.image_size = image;
  o.dropout = 0;
  o.aux_logits = model == "inception_v3" && image >= 299;
  build_model(g, model, o);
  g.plan();
  init_parameters(g, 21);
  const auto img = test::random_vec(static_cast<std::size_t>(batch * 3 * image * image), 8);
  const std::vector<float> f(img.begin(), img.end());
  g.set_input_nchw(f.data());
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i * 7 % 10);
  g.set_labels(labels.data());
  auto& s = be.default_stream();
  StepResult r;
  g.forward(s, false);
  r.logits_eval = g.read_output("logits");
  g.forward(s, true);
  g.backward(s);
  r.logits_train = g.read_output("logits");
  r.loss = g.loss(s);
  r.grads = export_gradients(g);
  return r;
}

std::vector<double> as_vec(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<double> as_vec(const HostArray& a) {
  return {a.as<float>(), a.as<float>() + a.numel()};
}

struct GpuCase {
  std::string model;
  Layout layout;
  bool tf32;
};
class CudaStep : public testing::TestWithParam<GpuCase> {};

// Tiny model: well conditioned, so every gradient must match the CPU backend tightly.
// Inception-v3 at batch 2: its fp32 gradients are ill-conditioned (see docs/architecture.md,
// "Numerics"), so outputs and loss are held tightly and gradients by their median error.
TEST_P(CudaStep, MatchesTheCpuBackend) {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const auto& c = GetParam();
  auto gpu = make_backend("cuda");
  if (c.tf32) gpu->set_tensor_math(true);
  auto cpu = make_cpu_backend();
  const bool inc = c.model == "inception_v3";
  const std::int64_t batch = inc ? 2 : 8, image = inc ? 299 : 32;
  const auto a = one_step(*gpu, c.model, c.layout, batch, image);
  const auto b = one_step(*cpu, c.model, c.layout, batch, image);
  const double out_tol = c.tf32 ? 2e-2 : 1e-4, grad_tol = c.tf32 ? 5e-2 : 1e-3;
  EXPECT_CLOSE(as_vec(a.logits_eval), as_vec(b.logits_eval), out_tol);
  EXPECT_CLOSE(as_vec(a.logits_train), as_vec(b.logits_train), out_tol);
  EXPECT_NEAR(a.loss, b.loss, out_tol * std::abs(b.loss));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  std::vector<double> errs;
  for (const auto& [name, ga] : a.grads) {
    const double e = test::rel_error(as_vec(ga), as_vec(b.grads.at(name)));
    errs.push_back(e);
    if (!inc) EXPECT_LE(e, grad_tol) << name;
    EXPECT_LE(e, 0.5) << name;  // a wrong or missing gradient shows as ~1
  }
  std::sort(errs.begin(), errs.end());
  if (inc) EXPECT_LE(errs[errs.size() / 2], c.tf32 ? 0.2 : 0.05) << "median gradient error";
}
INSTANTIATE_TEST_SUITE_P(Models, CudaStep,
                         testing::Values(GpuCase{"tiny", Layout::nchw, false}, GpuCase{"tiny", Layout::nhwc, false},
                                         GpuCase{"tiny", Layout::nchw, true},
                                         GpuCase{"inception_v3", Layout::nchw, false},
                                         GpuCase{"inception_v3", Layout::nhwc, false},
                                         GpuCase{"inception_v3", Layout::nhwc, true}),
                         [](const auto& i) {
                           return i.param.model + "_" + std::string(to_string(i.param.layout)) +
                                  (i.param.tf32 ? "_tf32" : "_fp32");
                         });

}  // namespace
}  // namespace stepbench
