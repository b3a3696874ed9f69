// The public library (include/stepbench/stepbench.hpp) over the layers: models and graph to build
// and plan, the backend registry, the trainer to step, compare's reader for run files.
#include "stepbench/stepbench.hpp"

#include <algorithm>
#include <chrono>
#include <random>

#include "backend/registry.hpp"
#include "compare/compare.hpp"
#include "models/models.hpp"
#include "tensor/error.hpp"
#include "train/trainer.hpp"

namespace stepbench {
namespace {

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::string version() { return STEPBENCH_VERSION; }

std::vector<std::string> backends() {
#ifdef STEPBENCH_HAVE_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

struct Model::Impl {
  ModelSpec spec;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Graph> g;
  std::unique_ptr<Trainer> trainer;
  ModelOptions options;

  explicit Impl(const ModelSpec& s) : spec(s) {
    if (spec.batch < 1) throw UsageError("ModelSpec::batch must be 1 or more");
    if (spec.image_size < 0) throw UsageError("ModelSpec::image_size must be 0 (the model's own) or more");
    BackendOptions bo;
    bo.kind = resolve(parse_enum<BackendKind>(spec.backend, "backend"));
    bo.precision = parse_enum<Precision>(spec.precision, "precision");
    be = make_backend(bo);
    const auto kind = parse_enum<ModelKind>(spec.model, "model");
    if (!model_entry(kind).offered)
      throw UsageError(std::string("unknown model '") + spec.model + "': use " + join_or(user_models()));
    options.image_size = spec.image_size > 0 ? spec.image_size : default_image_size(kind);
    options.aux_logits = spec.aux_logits && kind == ModelKind::inception_v3;
    g = std::make_unique<Graph>(
        *be, GraphConfig{spec.batch, parse_enum<Layout>(spec.layout, "layout"), storage_dtype(bo.precision), 0});
    build_model(*g, kind, options);
  }

  // A fixed batch of normal noise and random labels, as the benchmark's synthetic data.
  void set_synthetic_batch() {
    const Shape s = g->input_tensor().shape();
    std::mt19937_64 rng(42);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> img(static_cast<std::size_t>(s.numel()));
    for (auto& v : img) v = nd(rng);
    g->set_input_nchw(img.data());
    std::vector<std::int32_t> labels(static_cast<std::size_t>(s.n));
    for (auto& l : labels) l = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(options.num_classes));
    g->set_labels(labels.data());
  }
};

Model::Model(const ModelSpec& spec) : impl_(std::make_unique<Impl>(spec)) {}
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

const ModelSpec& Model::spec() const { return impl_->spec; }
std::string Model::backend() const { return impl_->be->name(); }
std::string Model::device() const { return impl_->be->device_name(); }
std::int64_t Model::parameters() const { return static_cast<std::int64_t>(impl_->g->num_parameters()); }
double Model::forward_gflop_per_image() const {
  return 2.0 * static_cast<double>(impl_->g->forward_macs_per_image(false)) / 1e9;
}

std::size_t Model::plan() {
  Impl& m = *impl_;
  if (!m.g->planned()) {
    m.g->plan();
    init_parameters(*m.g, 1);
    m.set_synthetic_batch();
    m.trainer = std::make_unique<Trainer>(*m.g, OptimizerConfig{});
  }
  return m.g->device_bytes();
}

bool Model::planned() const { return impl_->g->planned(); }

StepTimes Model::time_step(int warmup, int steps) {
  plan();
  Impl& m = *impl_;
  Backend& be = *m.be;
  Stream& s = be.default_stream();
  for (int i = 0; i < std::max(warmup, 1); ++i) m.trainer->step(s);
  be.synchronize(s);
  auto e0 = be.create_event(), e1 = be.create_event(), e2 = be.create_event(), e3 = be.create_event();
  std::vector<double> f, b, u, all;
  for (int i = 0; i < steps; ++i) {
    be.record(*e0, s);
    m.trainer->forward(s);
    be.record(*e1, s);
    m.trainer->backward(s);
    be.record(*e2, s);
    m.trainer->update(s);
    be.record(*e3, s);
    be.synchronize(s);
    f.push_back(be.elapsed_ms(*e0, *e1));
    b.push_back(be.elapsed_ms(*e1, *e2));
    u.push_back(be.elapsed_ms(*e2, *e3));
    all.push_back(be.elapsed_ms(*e0, *e3));
  }
  StepTimes t;
  t.forward_ms = median_of(f);
  t.backward_ms = median_of(b);
  t.update_ms = median_of(u);
  t.step_ms = median_of(all);
  t.steps = steps;
  t.images = m.spec.batch;
  return t;
}

RunFile read_run_file(const std::string& path) {
  compare::Run run;
  try {
    run = compare::load_run(path);
  } catch (const compare::CompareError& e) {
    throw UsageError(e.what());
  }
  RunFile f;
  f.context = run.context;
  for (const auto& key : run.order) {
    const auto& series = run.benchmarks.at(key);
    f.benchmarks.push_back({key, series.ms, median_of(series.ms)});
  }
  return f;
}

}  // namespace stepbench
