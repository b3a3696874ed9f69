// stepbench: times a CNN training step's phases, and checks numerics against a reference.
//   stepbench [flags]          Google Benchmark fixtures of every phase, then a summary (bench.cpp)
//   stepbench check ...        run given weights and input, write logits/loss/gradients
//   stepbench make-dataset DIR  write a synthetic JPEG folder for --data DIR
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <iostream>
#include <optional>
#include <sstream>
#include <vector>

#include "stepbench/backend.hpp"
#include "stepbench/data.hpp"
#include "stepbench/error.hpp"
#include "stepbench/process_group.hpp"
#include "stepbench/io.hpp"
#include "stepbench/models.hpp"
#include "stepbench/trainer.hpp"
#include "bench.hpp"
#include "options.hpp"

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


// Parses a subcommand's flags (argv[2:]). Returns the exit code to return at once (0 after --help,
// 2 after a usage error, printed with the subcommand's name), or nullopt to go on.
std::optional<int> parse_subcommand(CLI::App& app, int argc, char** argv, const char* name) {
  try {
    std::vector<std::string> args;
    for (int i = argc - 1; i >= 2; --i) args.emplace_back(argv[i]);  // CLI11 takes them reversed
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "stepbench {}: {}\nRun 'stepbench {} --help' for its flags.\n", name, e.what(), name);
    return 2;
  }
  return std::nullopt;
}

int check_main(int argc, char** argv) {
  CLI::App app{"stepbench check: run given weights and input; write logits, and in train mode the loss and every "
               "parameter gradient, to a safetensors file",
               "stepbench check"};
  Common cc;
  std::string weights, input, labels, mode = "eval", output;
  bool dropout = false;
  add_common(app, cc);
  app.add_option("--weights", weights, "safetensors file with torchvision's state_dict names")->required()
      ->check(CLI::ExistingFile);
  app.add_option("--input", input, "float32 .npy, N x 3 x H x W (NCHW)")->required()->check(CLI::ExistingFile);
  app.add_option("--labels", labels, "int64 .npy of N labels (train mode)")->check(CLI::ExistingFile);
  app.add_option("--mode", mode, "eval (running statistics) or train (batch statistics, gradients)")
      ->capture_default_str()->check(CLI::IsMember({"eval", "train"}));
  app.add_option("--output", output, "safetensors file to write")->required();
  app.add_flag("--dropout", dropout, "apply dropout in train mode (off by default, for comparisons)");
  if (auto rc = parse_subcommand(app, argc, argv, "check")) return *rc;
  return check(cc, weights, input, labels, mode, output, dropout);
}

int make_dataset_main(int argc, char** argv) {
  CLI::App app{"stepbench make-dataset: write a synthetic JPEG folder in ImageNet's layout (DIR/<class>/<image>.jpg), "
               "to try --data DIR without downloading a data set",
               "stepbench make-dataset"};
  std::string dir, size = "500x375";
  std::size_t images = 1000;
  int classes = 10;
  std::uint64_t seed = 1;
  app.add_option("dir", dir, "the folder to write")->required();
  app.add_option("--images", images, "how many images")->capture_default_str()->check(CLI::Range(std::size_t{1}, std::size_t{100000000}));
  app.add_option("--classes", classes, "class subfolders")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--size", size, "WxH of every image")->capture_default_str();
  app.add_option("--seed", seed, "content seed")->capture_default_str();
  if (auto rc = parse_subcommand(app, argc, argv, "make-dataset")) return *rc;
  int w = 0, h = 0;
  char x = 0;
  std::istringstream in(size);
  if (!(in >> w >> x >> h) || (x != 'x' && x != 'X') || w < 8 || h < 8 || w > 65535 || h > 65535)
    throw UsageError(fmt::format("--size '{}' must be WxH, e.g. 500x375 (each side 8 to 65535)", size));
  const auto t0 = std::chrono::steady_clock::now();
  make_jpeg_dataset(dir, images, classes, w, h, seed);
  fmt::print("stepbench make-dataset: wrote {} JPEGs of {}x{} in {} classes to {} ({:.1f} s)\n", images, w, h,
             classes, dir, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string_view(argv[1]) == "check") return check_main(argc, argv);
    if (argc > 1 && std::string_view(argv[1]) == "make-dataset") return make_dataset_main(argc, argv);
    if (argc == 2 && std::string_view(argv[1]) == "--version") {
      // what this binary was built with; scripts/gpu-check.sh refuses a build without the cuda backend
#ifdef STEPBENCH_HAVE_CUDA
      const std::string cuda = fmt::format("on (architectures {})", STEPBENCH_CUDA_ARCHITECTURES);
#else
      const std::string cuda = "off";
#endif
#ifdef STEPBENCH_HAVE_MPI
      const char* mpi = "on";
#else
      const char* mpi = "off";
#endif
      fmt::print("stepbench {}\ncuda backend: {}\nmpi: {}\n", STEPBENCH_VERSION, cuda, mpi);
      return 0;
    }
    cli::Options o;
    if (auto rc = cli::parse(argc, argv, o)) return *rc;
    cli::resolve(o);
    const int rc = cli::run_benchmarks(o, argv[0]);
    process_group_finalize();
    return rc;
  } catch (const UsageError& e) {  // also UnsupportedError: an impossible combination here
    fmt::print(stderr, "stepbench: {}\n", e.what());
    process_group_abort(2);  // under mpirun: end the other processes instead of leaving them waiting
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "stepbench: error: {}\n", e.what());
    process_group_abort(1);
    return 1;
  }
}
