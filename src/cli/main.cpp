// stepbench: times a CNN training step's phases, and checks numerics against a reference.
//   stepbench [run flags]            forward, forward+backward and step timing (default)
//   stepbench check ...              run given weights and input, write logits/loss/gradients
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <iostream>
#include <vector>

#include "stepbench/backend.hpp"
#include "stepbench/error.hpp"
#include "stepbench/io.hpp"
#include "stepbench/models.hpp"
#include "stepbench/trainer.hpp"

using namespace stepbench;

namespace {

struct Common {
  std::string backend = "auto";
  std::string model = "inception_v3";
  std::string format = "nchw";
  std::string precision = "fp32";
  std::string aux = "on";
  std::int64_t image_size = 299;
};

void add_common(CLI::App& app, Common& c) {
  app.add_option("--backend", c.backend, "auto, cpu or cuda")->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--model", c.model, "inception_v3 or tiny")->capture_default_str()
      ->check(CLI::IsMember({"inception_v3", "tiny"}));
  app.add_option("--format", c.format, "activation layout: nchw or nhwc")->capture_default_str()
      ->check(CLI::IsMember({"nchw", "nhwc"}));
  app.add_option("--precision", c.precision, "fp32, tf32, bf16 or fp16")->capture_default_str()
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  app.add_option("--aux-logits", c.aux, "Inception's auxiliary head: on or off")->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--image-size", c.image_size, "input height and width")->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
}

std::unique_ptr<Backend> open_backend(const Common& c) {
  auto be = make_backend(c.backend);
  if (c.backend == "auto")
    fmt::print(stderr, "stepbench: --backend auto picked {} ({}){}\n", be->name(), be->device_name(),
               be->kind() == DeviceKind::cpu ? fmt::format(": {}", cuda_unavailable_reason()) : "");
  return be;
}

DType precision(const std::string& p) { return p == "tf32" ? DType::f32 : parse_dtype(p); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---- run: phase timing -----------------------------------------------------------------------------
int run(const Common& c, std::int64_t batch, int warmup, int iters, const std::string& optimizer) {
  if (warmup < 1) throw UsageError("--warmup must be at least 1 (the first step includes one-time costs)");
  if (iters < 1) throw UsageError("--iterations must be at least 1");
  auto be = open_backend(c);
  if (c.precision == "tf32" && be->kind() == DeviceKind::cpu)
    throw UnsupportedError("--precision tf32 needs the cuda backend; use --precision fp32");
  Graph g(*be, GraphConfig{batch, parse_layout(c.format), precision(c.precision), 1});
  ModelOptions mo;
  mo.image_size = c.image_size;
  mo.aux_logits = c.aux == "on";
  build_model(g, c.model, mo);
  g.plan();
  init_parameters(g, 1);
  std::vector<float> img(static_cast<std::size_t>(batch * 3 * c.image_size * c.image_size));
  for (std::size_t i = 0; i < img.size(); ++i) img[i] = static_cast<float>((i * 2654435761u) % 1000) / 500.0f - 1;
  g.set_input_nchw(img.data());
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch));
  for (std::int64_t i = 0; i < batch; ++i) labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i % 1000);
  g.set_labels(labels.data());
  OptimizerConfig oc;
  oc.kind = parse_optimizer(optimizer);
  Trainer tr(g, oc);
  auto& s = be->default_stream();
  auto t0 = be->create_event(), t1 = be->create_event();

  fmt::print("stepbench {} | backend {} ({}) | {} {} {} | batch {} | image {}x{} | {:.2f}M parameters | "
             "{:.3f} GMAC/image forward\n",
             STEPBENCH_VERSION, be->name(), be->device_name(), c.model, c.precision, c.format, batch, c.image_size,
             c.image_size, g.num_parameters() / 1e6, g.forward_macs_per_image(false) / 1e9);
  struct Phase {
    const char* name;
    std::function<void()> body;
  };
  const std::vector<Phase> phases = {
      {"forward (inference)", [&] { g.forward(s, false); }},
      {"forward (training)", [&] { tr.forward(s); }},
      {"forward+backward", [&] { tr.forward(s); tr.backward(s); }},
      {"step (fwd+bwd+update)", [&] { tr.step(s); }},
  };
  fmt::print("{:<24} {:>10} {:>10} {:>12}\n", "phase", "median ms", "min ms", "images/s");
  double fwd_train = 0, fwd_bwd = 0;
  for (const auto& ph : phases) {
    for (int i = 0; i < warmup; ++i) ph.body();
    be->synchronize(s);
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
      be->record(*t0, s);
      ph.body();
      be->record(*t1, s);
      be->synchronize(s);
      ms.push_back(be->elapsed_ms(*t0, *t1));
    }
    const double med = median(ms);
    if (std::string(ph.name) == "forward (training)") fwd_train = med;
    if (std::string(ph.name) == "forward+backward") fwd_bwd = med;
    fmt::print("{:<24} {:>10.2f} {:>10.2f} {:>12.1f}\n", ph.name, med, *std::min_element(ms.begin(), ms.end()),
               1000.0 * static_cast<double>(batch) / med);
  }
  fmt::print("backward ~ {:.2f} ms (forward+backward minus training forward), backward:forward = {:.2f}\n",
             fwd_bwd - fwd_train, (fwd_bwd - fwd_train) / fwd_train);
  fmt::print("loss after {} steps: {:.4f}\n", g.step_counter(), g.loss(s));
  return 0;
}

// ---- check: numerics against a reference -------------------------------------------------------
int check(const Common& c, const std::string& weights, const std::string& input, const std::string& labels_path,
          const std::string& mode, const std::string& output, bool dropout) {
  const HostArray x = read_npy(input);
  if (x.dtype != "F32" || x.shape.size() != 4 || x.shape[1] != 3)
    throw UsageError(fmt::format("--input '{}' must be a float32 array of shape N x 3 x H x W", input));
  if (x.shape[2] != x.shape[3])
    throw UsageError(fmt::format("--input '{}': images must be square, got {}x{}", input, x.shape[2], x.shape[3]));
  const bool train = mode == "train";
  if (train && labels_path.empty()) throw UsageError("--mode train needs --labels Y.npy (int64, N entries)");
  auto be = open_backend(c);
  const std::int64_t n = x.shape[0];
  Graph g(*be, GraphConfig{n, parse_layout(c.format), precision(c.precision), 1});
  ModelOptions mo;
  mo.image_size = x.shape[2];
  mo.aux_logits = c.aux == "on";
  mo.dropout = dropout ? 0.5 : 0.0;
  build_model(g, c.model, mo);
  g.plan();
  import_weights(g, read_safetensors(weights));
  g.set_input_nchw(x.as<float>());
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n), 0);
  if (!labels_path.empty()) {
    const HostArray y = read_npy(labels_path);
    if ((y.dtype != "I64" && y.dtype != "I32") || y.numel() != n)
      throw UsageError(fmt::format("--labels '{}' must be an int64 array of {} entries", labels_path, n));
    for (std::int64_t i = 0; i < n; ++i)
      labels[static_cast<std::size_t>(i)] =
          static_cast<std::int32_t>(y.dtype == "I64" ? y.as<std::int64_t>()[i] : y.as<std::int32_t>()[i]);
  }
  g.set_labels(labels.data());
  auto& s = be->default_stream();
  TensorMap out;
  g.forward(s, train);
  const auto logits = g.read_output("logits");
  const std::int64_t classes = static_cast<std::int64_t>(logits.size()) / n;
  out.emplace("logits", HostArray::f32({n, classes}, logits.data()));
  if (train) {
    g.backward(s);
    if (g.has_output("aux_logits"))
      out.emplace("aux_logits", HostArray::f32({n, classes}, g.read_output("aux_logits").data()));
    const float loss = g.loss(s);
    out.emplace("loss", HostArray::f32({}, &loss));
    for (auto& [name, a] : export_gradients(g)) out.emplace(name, std::move(a));
  }
  write_safetensors(output, out);
  fmt::print("stepbench check: {} mode, {} images of {}x{} on {} ({}), wrote {} tensors to {}\n", mode, n,
             x.shape[2], x.shape[3], be->name(), c.format, out.size(), output);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stepbench: precise forward, backward and step timing of CNN training"};
  app.set_help_all_flag("--help-all", "every subcommand's flags");
  Common common;
  std::int64_t batch = 4;
  int warmup = 2, iters = 5;
  std::string optimizer = "momentum";
  add_common(app, common);
  app.add_option("--batch-size", batch, "images per step")->capture_default_str()->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--warmup", warmup, "untimed steps before timing each phase (at least 1)")->capture_default_str();
  app.add_option("--iterations", iters, "timed repetitions of each phase")->capture_default_str();
  app.add_option("--optimizer", optimizer, "momentum, sgd or rmsprop")->capture_default_str()
      ->check(CLI::IsMember({"momentum", "sgd", "rmsprop"}));

  auto* chk = app.add_subcommand("check", "run given weights and input; write logits, loss and gradients");
  Common cc;
  std::string weights, input, labels, mode = "eval", output;
  bool dropout = false;
  add_common(*chk, cc);
  chk->add_option("--weights", weights, "safetensors file with torchvision's state_dict names")->required()
      ->check(CLI::ExistingFile);
  chk->add_option("--input", input, "float32 .npy, N x 3 x H x W (NCHW)")->required()->check(CLI::ExistingFile);
  chk->add_option("--labels", labels, "int64 .npy of N labels (train mode)")->check(CLI::ExistingFile);
  chk->add_option("--mode", mode, "eval (running statistics) or train (batch statistics, gradients)")
      ->capture_default_str()->check(CLI::IsMember({"eval", "train"}));
  chk->add_option("--output", output, "safetensors file to write")->required();
  chk->add_flag("--dropout", dropout, "apply dropout in train mode (off by default, for comparisons)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    if (*chk) return check(cc, weights, input, labels, mode, output, dropout);
    return run(common, batch, warmup, iters, optimizer);
  } catch (const UsageError& e) {
    fmt::print(stderr, "stepbench: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "stepbench: error: {}\n", e.what());
    return 1;
  }
}
