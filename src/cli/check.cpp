// stepbench check: numerics against a reference. Runs given weights (torchvision's names) on a given
// input and writes the logits, and in train mode the loss and every parameter gradient.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "backend/registry.hpp"
#include "cli/commands.hpp"
#include "cli/flags.hpp"
#include "io/io.hpp"
#include "models/models.hpp"
#include "tensor/error.hpp"

namespace stepbench::cli {
namespace {

// A damaged or mismatched file the user gave is a usage error (exit 2) naming the flag and file.
template <class F>
auto from_user_file(const std::string& flag, const std::string& path, F read) {
  try {
    return read();
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(fmt::format("{} '{}': {}", flag, path, e.what()));
  }
}

// STEPBENCH_EMULATE_BF16=1 (tests only: tests/parity/torch_parity.py --emulate-bf16): bf16
// convolution and inner product emulated on fp32 where the CPU has no native bf16
// (BackendOptions::emulate_bf16), so that bf16 parity runs on CI's AVX2 machines. The benchmark
// itself never emulates.
bool emulate_bf16_for_tests() {
  const char* v = std::getenv("STEPBENCH_EMULATE_BF16");
  if (!v || !*v || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  throw UsageError(fmt::format("STEPBENCH_EMULATE_BF16={}: set it to 1 (tests only) or unset it", v));
}

int check(const ModelFlags& c, const std::string& weights, const std::string& input, const std::string& labels_path,
          const std::string& mode, const std::string& output, bool dropout) {
  const HostArray x = from_user_file("--input", input, [&] { return read_npy(input); });
  if (x.dtype != "F32" || x.shape.size() != 4 || x.shape[1] != 3)
    throw UsageError(fmt::format("--input '{}' must be a float32 array of shape N x 3 x H x W", input));
  for (std::int64_t i = 0; i < x.numel(); ++i)
    if (!std::isfinite(x.as<float>()[i])) {
      const std::int64_t hw = x.shape[2] * x.shape[3], chw = 3 * hw;
      throw UsageError(fmt::format("--input '{}': element [{}, {}, {}, {}] is {}; the images must be finite", input,
                                   i / chw, i % chw / hw, i % hw / x.shape[3], i % x.shape[3], x.as<float>()[i]));
    }
  if (x.shape[2] != x.shape[3])
    throw UsageError(fmt::format("--input '{}': images must be square, got {}x{}", input, x.shape[2], x.shape[3]));
  const bool train = mode == "train";
  if (train && labels_path.empty()) throw UsageError("--mode train needs --labels Y.npy (int64, N entries)");
  const std::int64_t n = x.shape[0];
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n), 0);
  if (!labels_path.empty()) {
    const HostArray y = from_user_file("--labels", labels_path, [&] { return read_npy(labels_path); });
    if ((y.dtype != "I64" && y.dtype != "I32") || y.numel() != n)
      throw UsageError(fmt::format("--labels '{}' must be an int64 array of {} entries", labels_path, n));
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t v = y.dtype == "I64" ? y.as<std::int64_t>()[i] : y.as<std::int32_t>()[i];
      if (v < 0 || v > std::numeric_limits<std::int32_t>::max())  // the model's range is checked below
        throw UsageError(fmt::format("--labels '{}': label {} of sample {} is not a class index", labels_path, v, i));
      labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(v);
    }
  }
  BackendOptions bo;
  bo.kind = c.backend;
  bo.precision = c.precision;  // tf32: tensor-op math on, as in the benchmark run
  bo.emulate_bf16 = emulate_bf16_for_tests();
  auto be = make_backend(bo);
  if (c.precision == Precision::bf16 && be->versions()["bf16"].rfind("emulated", 0) == 0)
    fmt::print(stderr,
               "stepbench check: bf16 convolutions and inner products emulated on fp32 "
               "(STEPBENCH_EMULATE_BF16=1, tests only)\n");
  if (c.backend == BackendKind::automatic)
    fmt::print(stderr, "stepbench: --backend auto picked {} ({}){}\n", be->name(), be->device_name(),
               be->kind() == DeviceKind::cpu ? fmt::format(": {}", cuda_unavailable_reason()) : "");
  GraphConfig gc{n, c.layout, storage_dtype(c.precision), 1};
  gc.recompute = c.recompute;
  gc.fuse = c.fuse;
  Graph g(*be, gc);
  ModelOptions mo;
  mo.image_size = x.shape[2];
  mo.aux_logits = c.aux_logits;
  mo.dropout = dropout ? 0.5 : 0.0;
  build_model(g, c.model, mo);
  g.plan();
  from_user_file("--weights", weights, [&] {
    import_weights(g, read_safetensors(weights));
    return 0;
  });
  g.set_input_nchw(x.as<float>());
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
  fmt::print("stepbench check: {} mode, {} images of {}x{} on {} ({}, {}, tensor math {}), wrote {} tensors to {}\n",
             mode, n, x.shape[2], x.shape[3], be->name(), to_string(c.layout), to_string(c.precision),
             be->tensor_math() ? "tf32" : "off", out.size(), output);
  return 0;
}

}  // namespace

int check_main(int argc, char** argv) {
  CLI::App app{
      "stepbench check: run given weights and input; write logits, and in train mode the loss and every "
      "parameter gradient, to a safetensors file",
      "stepbench check"};
  ModelFlags cc;
  std::string weights, input, labels, mode = "eval", output;
  bool dropout = false;
  add_model_flags(app, cc);
  app.add_option("--weights", weights, "safetensors file with torchvision's state_dict names")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--input", input, "float32 .npy, N x 3 x H x W (NCHW)")->required()->check(CLI::ExistingFile);
  app.add_option("--labels", labels, "int64 .npy of N labels (train mode)")->check(CLI::ExistingFile);
  app.add_option("--mode", mode, "eval (running statistics) or train (batch statistics, gradients)")
      ->capture_default_str()
      ->check(CLI::IsMember({"eval", "train"}));
  app.add_option("--output", output, "safetensors file to write")->required();
  app.add_flag("--dropout", dropout, "apply dropout in train mode (off by default, for comparisons)");
  if (auto rc = parse_args(app, argc, argv, 2, "stepbench check")) return *rc;
  if (cc.precision == Precision::tf32 && resolve(cc.backend) != BackendKind::cuda)
    throw UsageError("--precision tf32 needs the cuda backend; use --precision fp32 on the cpu");
  return check(cc, weights, input, labels, mode, output, dropout);
}

}  // namespace stepbench::cli
