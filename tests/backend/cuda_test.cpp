// GPU tests: built always, skipped with the reason when no GPU is visible (or CUDA is not built).
// Every op of the cuda backend is also in test_ops.cpp (typed over backend x layout x precision,
// against the oracle); here: whole training steps on the GPU against the CPU backend.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iostream>

#include <unistd.h>

#include <filesystem>

#include "backend/backend.hpp"
#include "data/data.hpp"
#include "io/io.hpp"
#include "models/models.hpp"
#include "support/chain_oracle.hpp"
#include "support/test_util.hpp"
#include "tensor/error.hpp"
#include "train/towers.hpp"

namespace stepbench {
namespace {

TEST(Cuda, ExplicitCudaWithoutGpuIsAClearError) {
  if (cuda_unavailable_reason().empty()) GTEST_SKIP() << "a GPU is visible";
  try {
    make_backend(test::gpu_options());
    FAIL() << "no error";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("--backend cpu"), std::string::npos) << e.what();
  }
  EXPECT_EQ(make_backend(BackendKind::automatic)->name(), "cpu");
}

struct StepResult {
  std::vector<float> logits_eval, logits_train;
  float loss = 0;
  TensorMap grads;
};

// x rounded to `bits` significant bits (24: fp32, 11: fp16 and TF32, 8: bf16).
double round_bits(double x, int bits) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  const double m = std::frexp(x, &e);
  return std::ldexp(std::nearbyint(std::ldexp(m, bits)), e - bits);
}

// One training step from fixed weights and input. round_bits > 0: the weights and the input are
// first rounded to that many significant bits (a reference perturbed as a reduced-precision
// backend's storage perturbs them).
StepResult one_step(Backend& be, const std::string& model, Layout l, std::int64_t batch, std::int64_t image,
                    DType t = DType::f32, int round_to_bits = 0) {
  GraphConfig cfg{batch, l, t, 3};
  // fp16, Inception-v3: start the loss scale low enough that no scaled gradient overflows in this
  // one step (the stem's filter gradient reaches ~100 at initialisation; 100 x 2^16 is far past
  // fp16's 65504). The tiny model keeps the default 2^16: lower, its small gradients underflow.
  if (model == "inception_v3") cfg.initial_loss_scale = 256.0f;
  Graph g(be, cfg);
  ModelOptions o;
  o.image_size = image;
  o.dropout = 0;
  o.aux_logits = model == "inception_v3" && image >= 299;
  build_model(g, *try_parse_enum<ModelKind>(model), o);
  g.plan();
  init_parameters(g, 21);
  auto img = test::random_vec(static_cast<std::size_t>(batch * 3 * image * image), 8);
  if (round_to_bits > 0) {
    auto w = export_weights(g);
    for (auto& [name, a] : w)
      if (a.dtype == "F32")
        for (std::int64_t i = 0; i < a.numel(); ++i)
          a.as<float>()[i] = static_cast<float>(round_bits(a.as<float>()[i], round_to_bits));
    import_weights(g, w);
    for (auto& v : img) v = round_bits(v, round_to_bits);
  }
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
  if (const float scale = g.loss_scale(s); scale != 1.0f)  // fp16: the arena holds gradients x the loss scale
    for (auto& [name, a] : r.grads)
      for (std::int64_t i = 0; i < a.numel(); ++i) a.as<float>()[i] /= scale;
  return r;
}

std::vector<double> as_vec(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<double> as_vec(const HostArray& a) { return {a.as<float>(), a.as<float>() + a.numel()}; }

struct GpuCase {
  std::string model;
  Layout layout;
  bool tf32;
  DType dtype = DType::f32;
};
class CudaStep : public testing::TestWithParam<GpuCase> {};

// Tiny model: well conditioned, so every gradient must match the CPU backend tightly.
// Inception-v3 at batch 2: its fp32 gradients are ill-conditioned (see docs/architecture.md,
// "Numerics"), so outputs and loss are held tightly and gradients by their median error.
TEST_P(CudaStep, MatchesTheCpuBackend) {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const auto& c = GetParam();
  BackendOptions go = test::gpu_options();
  go.precision = c.tf32 ? Precision::tf32 : Precision::fp32;  // 16-bit: the graph's dtype
  auto gpu = make_backend(go);
  auto cpu = make_cpu_backend();
  const bool inc = c.model == "inception_v3";
  // Inception-v3 in reduced precision at batch 8: at batch 2 its training-mode batch norms (the aux
  // head's sees 2 values per channel) amplify TF32's and 16-bit rounding into O(1) gradient errors
  const bool reduced = c.tf32 || c.dtype != DType::f32;
  const std::int64_t batch = inc ? (reduced ? 8 : 2) : 8, image = inc ? 299 : 32;
  try {
    gpu->require(c.dtype);
  } catch (const UnsupportedError& e) {
    GTEST_SKIP() << e.what();
  }
  const auto a = one_step(*gpu, c.model, c.layout, batch, image, c.dtype);
  const auto b = one_step(*cpu, c.model, c.layout, batch, image);  // the fp32 CPU step is the reference
  ASSERT_EQ(a.grads.size(), b.grads.size());
  if (!reduced) {
    // fp32: the same arithmetic up to summation order
    const double out_tol = 1e-4, grad_tol = 1e-3;
    EXPECT_CLOSE(as_vec(a.logits_eval), as_vec(b.logits_eval), out_tol);
    EXPECT_CLOSE(as_vec(a.logits_train), as_vec(b.logits_train), out_tol);
    EXPECT_NEAR(a.loss, b.loss, out_tol * std::abs(b.loss));
    std::vector<double> errs;
    for (const auto& [name, ga] : a.grads) {
      const double e = test::rel_error(as_vec(ga), as_vec(b.grads.at(name)));
      errs.push_back(e);
      if (!inc) {
        EXPECT_LE(e, grad_tol) << name;
      }
      EXPECT_LE(e, 0.5) << name;  // a wrong or missing gradient shows as ~1
    }
    std::sort(errs.begin(), errs.end());
    if (inc) {
      EXPECT_LE(errs[errs.size() / 2], 0.05) << "median gradient error";
    }
    return;
  }
  // TF32, bf16, fp16: how far each output moves is set by how sensitive it is to rounding. The CPU
  // step run again on weights and input rounded to the GPU's significand (p) measures that per
  // tensor; the GPU, which also rounds every activation, may differ from the reference by a
  // multiple of it, or by the precision's floor where the tensor is insensitive. A wrong gradient
  // (zero, doubled, transposed) is off by ~1 and fails wherever rounding alone moves it by < 10%.
  const int bits = c.dtype == DType::bf16 ? 8 : 11;
  const auto p = one_step(*cpu, c.model, c.layout, batch, image, DType::f32, bits);
  const double floor = c.dtype == DType::bf16 ? 5e-2 : 2e-2, k = 10;
  auto check = [&](const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& moved,
                   const std::string& what) {
    const double e = test::rel_error(got, want), es = test::rel_error(moved, want);
    EXPECT_LE(e, std::max(floor, k * es)) << what << ": rounding the inputs alone moves it by " << es;
    return std::pair{e, es};
  };
  // Inference at initialisation uses untrained running statistics (mean 0, variance 1): Inception's
  // activations then grow past fp16's range before the logits, which only says that fp16 needs
  // normalised activations. The training forward, with batch statistics, is always compared.
  double max_eval = 0;
  for (float v : b.logits_eval) max_eval = std::max(max_eval, static_cast<double>(std::abs(v)));
  if (c.dtype != DType::f16 || max_eval < 1e3)
    check(as_vec(a.logits_eval), as_vec(b.logits_eval), as_vec(p.logits_eval), "eval logits");
  else
    std::cout << "fp16 eval logits not compared: the fp32 reference reaches |logit| = " << max_eval << "\n";
  check(as_vec(a.logits_train), as_vec(b.logits_train), as_vec(p.logits_train), "train logits");
  EXPECT_NEAR(a.loss, b.loss, std::max(floor, k * std::abs(p.loss - b.loss) / std::abs(b.loss)) * std::abs(b.loss));
  std::vector<double> ratios;
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, ga] : a.grads) {
    const auto [e, es] = check(as_vec(ga), as_vec(b.grads.at(name)), as_vec(p.grads.at(name)), name);
    ratios.push_back(e / std::max(es, 1e-3));
    if (ratios.back() > worst) {
      worst = ratios.back();
      worst_name = name;
    }
  }
  std::sort(ratios.begin(), ratios.end());
  const double median = ratios[ratios.size() / 2];
  std::cout << "gradient error / error from rounding the inputs: median " << median << ", largest " << worst << " ("
            << worst_name << ")\n";
  EXPECT_LE(median, 5.0) << "median over tensors of the GPU's gradient error / the error from rounding the inputs";
}
INSTANTIATE_TEST_SUITE_P(
    Models, CudaStep,
    testing::Values(GpuCase{"tiny", Layout::nchw, false}, GpuCase{"tiny", Layout::nhwc, false},
                    GpuCase{"tiny", Layout::nchw, true}, GpuCase{"inception_v3", Layout::nchw, false},
                    GpuCase{"inception_v3", Layout::nhwc, false}, GpuCase{"inception_v3", Layout::nhwc, true},
                    GpuCase{"tiny", Layout::nhwc, false, DType::bf16}, GpuCase{"tiny", Layout::nchw, false, DType::f16},
                    GpuCase{"inception_v3", Layout::nhwc, false, DType::bf16},
                    GpuCase{"inception_v3", Layout::nhwc, false, DType::f16}),
    [](const auto& i) {
      return i.param.model + "_" + std::string(to_string(i.param.layout)) +
             (i.param.dtype != DType::f32 ? "_" + std::string(to_string(i.param.dtype))
              : i.param.tf32              ? "_tf32"
                                          : "_fp32");
    });

// Tiny-model towers for the GPU tests (no dropout, so replicas and backends agree; many buckets).
TowerOptions gpu_towers(BackendKind backend, int n, VariableUpdate mode, bool on_host) {
  TowerOptions o;
  o.backend = backend;
  o.own_kernels = test::own_kernels();
  o.towers = n;
  o.batch_per_tower = 4;
  o.model = ModelKind::tiny;
  o.model_options.image_size = 32;
  o.model_options.num_classes = 10;
  o.model_options.dropout = 0;
  o.variable_update = mode;
  o.ps_on_host = on_host;
  o.bucket_bytes = 16384;  // many buckets: several NCCL launches during backward
  return o;
}

// ---- input pipelines on the GPU ------------------------------------------------------------------------
// JPEG batches come in pinned memory from the cuda backend, and a step fed through the staging
// double buffer on the GPU matches the same staged batch on the CPU.
TEST(CudaData, PinnedJpegBatchesStagedToTheGpuMatchTheCpu) {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("stepbench_cudadata_{}", ::getpid());
  make_jpeg_dataset(dir.string(), 16, 2, 80, 60);
  Towers g(gpu_towers(BackendKind::cuda, 1, VariableUpdate::replicated, false)),
      c(gpu_towers(BackendKind::cpu, 1, VariableUpdate::replicated, false));
  PipelineOptions po;
  po.batch = 4;
  po.image_size = 32;
  po.pin = &g.backend(0);
  JpegPipeline p(scan_jpeg_folder(dir.string()), po);
  auto b = p.next();
  EXPECT_TRUE(b->pinned());
  float loss[2];
  int k = 0;
  for (Towers* t : {&g, &c}) {
    t->enable_staging();
    t->stage(0, b->images.data(), b->labels.data());
    t->flip();
    t->forward_train();
    t->synchronize();
    loss[k++] = t->loss(0);
  }
  p.recycle(std::move(b));
  std::filesystem::remove_all(dir);
  EXPECT_NEAR(loss[0], loss[1], 1e-4 * std::abs(loss[1]));
}

// ---- CUDA Graphs -------------------------------------------------------------------------------------
// A captured step replayed twice ends where two launched steps do; a captured forward gives the
// launched forward's logits.
TEST(CudaGraph, ReplayedStepsEqualLaunchedSteps) {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const TowerOptions o = gpu_towers(BackendKind::cuda, 1, VariableUpdate::replicated, false);
  Towers a(o), b(o);
  a.set_synthetic_batch(4);
  b.set_synthetic_batch(4);
  // both against the same three steps in double, under cuda fp32's error model
  const auto want = test::oracle_steps(test::ChainOracle(a.graph(0)), o.optimizer, 3,
                                       test::error_model({"cuda", o.layout, DType::f32}));
  a.step();  // warm-up outside the capture, as the bench does
  b.step();
  a.synchronize();
  b.capture(true);  // recording does not run the step
  b.synchronize();
  for (int k = 0; k < 2; ++k) {
    a.step();
    b.replay(true);
  }
  a.synchronize();
  b.synchronize();
  EXPECT_TRUE(test::params_within(a.graph(0), want)) << "launched";
  EXPECT_TRUE(test::params_within(b.graph(0), want)) << "replayed";
  b.capture(false);
  b.replay(false);
  a.forward_inference();
  b.synchronize();
  a.synchronize();
  EXPECT_CLOSE(as_vec(b.graph(0).read_output("logits")), as_vec(a.graph(0).read_output("logits")), 1e-5);
  auto cpu = o;
  cpu.backend = BackendKind::cpu;
  Towers c(cpu);
  EXPECT_THROW(c.capture(true), UsageError);
}

// ---- NCCL and GPU towers ----------------------------------------------------------------------------
// With one GPU the NCCL path still runs, with one rank: every collective leaves the buffer as it was.
TEST(Nccl, OneRankCollectivesRunOnTheCommunicationStream) {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  auto be = make_backend(test::gpu_options());
  auto cs = be->create_stream();
  auto coll = make_nccl_collective({be.get()}, {cs.get()}, ProcessGroup{});
  EXPECT_TRUE(coll->asynchronous());
  EXPECT_NE(coll->name().find("NCCL"), std::string::npos);
  std::vector<float> h(1000);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = 0.25f * static_cast<float>(i) - 7.0f;
  Buffer d(*be, h.size() * sizeof(float));
  be->copy(*cs, d.get(), h.data(), d.bytes());
  const std::vector<float*> bufs = {d.as<float>()};
  coll->allreduce_average(bufs, 10, 500);
  coll->reduce_average(bufs, 0, 1000);
  coll->broadcast(bufs, 100, 900);
  std::vector<float> back(h.size());
  be->copy(*cs, back.data(), d.get(), d.bytes());
  be->synchronize(*cs);
  coll->check();
  EXPECT_EQ(back, h);
}

std::vector<double> tower_params(const Towers& t, int i) {
  std::vector<float> v(t.graph(i).param_arena_floats());
  t.backend(i).copy(t.stream(i), v.data(), t.graph(i).param_arena(), v.size() * sizeof(float));
  t.backend(i).synchronize(t.stream(i));
  return {v.begin(), v.end()};
}

// N GPU towers synchronised by NCCL (or through the host) end two steps where N CPU towers do.
TEST(Nccl, GpuTowersEqualCpuTowers) {
  const int gpus = cuda_device_count();
  if (gpus < 1) GTEST_SKIP() << cuda_unavailable_reason();
  struct Case {
    VariableUpdate mode;
    bool on_host;
  };
  for (int n : {1, 2, 3}) {
    for (Case c : {Case{VariableUpdate::replicated, false}, Case{VariableUpdate::parameter_server, false},
                   Case{VariableUpdate::parameter_server, true}}) {
      if (n > gpus) continue;
      if (n == 1 && !c.on_host) continue;  // nothing to sync
      SCOPED_TRACE(fmt::format("{} GPUs, {}{}", n, to_string(c.mode), c.on_host ? " on the host" : ""));
      Towers g(gpu_towers(BackendKind::cuda, n, c.mode, c.on_host)),
          h(gpu_towers(BackendKind::cpu, n, c.mode, c.on_host));
      EXPECT_EQ(g.sync_bytes(), h.sync_bytes());
      g.set_synthetic_batch(3);
      h.set_synthetic_batch(3);
      for (int k = 0; k < 2; ++k) {
        g.step();
        h.step();
      }
      g.synchronize();
      h.synchronize();
      EXPECT_GT(g.overlapped_buckets(), 0u);
      const auto want = tower_params(h, 0);
      for (int i = 0; i < n; ++i) EXPECT_CLOSE(tower_params(g, i), want, 1e-4);
    }
  }
  if (gpus < 2) GTEST_SKIP() << "NCCL between towers needs 2 or more GPUs; " << gpus << " visible (1 rank ran)";
}

}  // namespace
}  // namespace stepbench
