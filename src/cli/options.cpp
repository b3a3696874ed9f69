#include "options.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>

#include "stepbench/backend.hpp"
#include "stepbench/error.hpp"

namespace stepbench::cli {

const std::vector<std::string>& all_phases() {
  static const std::vector<std::string> p = {"forward", "forward_train", "forward_backward", "step", "grad_sync",
                                             "update", "input_pipeline"};
  return p;
}

bool Options::given(const std::string& flag) const {
  return std::find(explicitly_set.begin(), explicitly_set.end(), flag) != explicitly_set.end();
}

std::optional<int> parse(int argc, const char* const* argv, Options& o) {
  CLI::App app{
      "stepbench: forward, backward, gradient sync and the whole training step of a CNN, timed on the device.\n"
      "Flags can also come from a TOML file (--config), e.g. configs/*.toml; flags given on the command line win.\n"
      "Google Benchmark's own flags pass through as --benchmark_<flag>=<value>.",
      "stepbench"};
  app.set_config("--config", "", "TOML file of flags (key = value, keys are the long flag names)");
  app.allow_extras();
  auto* backend = app.add_option("--backend", o.backend, "auto (cuda when a GPU is visible, else cpu), cpu or cuda")
                      ->capture_default_str()->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--gpus", o.gpus, "model replicas (towers); on the cpu backend, CPU towers")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  auto* bs = app.add_option("--batch-size", o.batch_size,
                            "images per step per GPU (tf_cnn_benchmarks' convention) [default: 32 on cuda; "
                            "the reduced CPU default otherwise]")
                 ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
  auto* gbs = app.add_option("--global-batch-size", o.global_batch_size,
                             "images per step over all GPUs; must divide evenly by --gpus")
                  ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
  bs->excludes(gbs);
  app.add_option("--model", o.model, "inception_v3 or tiny")->capture_default_str()
      ->check(CLI::IsMember({"inception_v3", "tiny"}));
  app.add_option("--image-size", o.image_size, "input height and width (inception_v3: >= 75, 299 with the aux head)")
      ->capture_default_str()->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));
  app.add_option("--aux-logits", o.aux_logits, "Inception's auxiliary head in training: on or off")
      ->capture_default_str()->check(CLI::IsMember({"on", "off"}));
  app.add_option("--precision", o.precision, "fp32, tf32 (cuda), bf16 or fp16")->capture_default_str()
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  app.add_option("--format", o.format, "activation layout: nchw or nhwc")->capture_default_str()
      ->check(CLI::IsMember({"nchw", "nhwc"}));
  app.add_option("--variable-update", o.variable_update, "replicated, parameter_server or independent")
      ->capture_default_str()->check(CLI::IsMember({"replicated", "parameter_server", "independent"}));
  app.add_option("--optimizer", o.optimizer, "momentum (0.9), sgd or rmsprop")->capture_default_str()
      ->check(CLI::IsMember({"momentum", "sgd", "rmsprop"}));
  app.add_option("--learning-rate", o.learning_rate, "optimizer learning rate")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--weight-decay", o.weight_decay, "L2 weight decay")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", o.warmup, "untimed training steps (and inference passes) before any timing, >= 1")
      ->capture_default_str()->check(CLI::Range(1, 1000000));
  app.add_option("--repetitions", o.repetitions, "repetitions of every benchmark; median, stddev and cv over them")
      ->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--bucket-mb", o.bucket_mb, "gradient sync bucket size in MiB")->capture_default_str()
      ->check(CLI::Range(0.001, 65536.0));
  app.add_flag("--no-overlap", o.no_overlap,
               "in the step, sync the gradients after backward instead of bucket by bucket during it");
  app.add_option("--ps-device", o.ps_device,
                 "parameter_server: where the variables live and the update runs: device (tower 0, GPU 0) or cpu "
                 "(host memory, as tf_cnn_benchmarks' --local_parameter_device=cpu)")
      ->capture_default_str()->check(CLI::IsMember({"device", "cpu"}));
  app.add_option("--sync-timeout-s", o.sync_timeout_s,
                 "a gradient sync not done after this many seconds (a failed or stalled peer) ends the run with a "
                 "message; 0 waits forever")
      ->capture_default_str()->check(CLI::Range(0.0, 1e9));
  app.add_option("--workspace-mb", o.workspace_mb,
                 "cuda: the most scratch memory one convolution's cuDNN algorithm may use; the fastest algorithm "
                 "within it is picked")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  app.add_flag("--cuda-graph", o.cuda_graph,
               "cuda: also capture the step and the forward as CUDA Graphs after warm-up and time their replays "
               "(rows step:cuda_graph, forward:cuda_graph); one GPU per process, synthetic data");
  app.add_option("--data", o.data,
                 "input: synthetic (a constant batch on the device), synthetic-host (a host batch copied every "
                 "step on a copy stream, double-buffered) or a folder of JPEGs, one subfolder per class")
      ->capture_default_str();
  app.add_option("--data-threads", o.data_threads, "JPEG decoding threads")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--prefetch", o.prefetch, "decoded batches kept ready ahead of the step")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--phases", o.phases, "comma-separated subset of: forward, forward_train, forward_backward, step, "
                                       "grad_sync, update, input_pipeline [default: all]")
      ->delimiter(',')->check(CLI::IsMember(all_phases()));
  app.add_option("--json", o.json, "write Google Benchmark's JSON (with the configuration in its context) here");
  app.add_flag("--per-layer", o.per_layer, "also time every distinct conv layer shape: fwd, bwd_data, bwd_filter");
  app.add_option("--peer", o.peer, "after stepbench, time the same phases in this peer (pytorch: bench/torch_peer.py, "
                                   "Debian's python3-torch) and add its medians and the ratios to the summary")
      ->check(CLI::IsMember({"pytorch"}));
  app.add_option("--peer-python", o.peer_python, "the Python that has torch and torchvision")->capture_default_str();
  app.add_flag("--list", o.list, "print the benchmark names this configuration registers, then exit");
  (void)backend;

  try {
    std::vector<std::string> args;
    for (int i = argc - 1; i >= 1; --i) args.emplace_back(argv[i]);  // CLI11 takes them reversed
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "stepbench: " << e.what() << "\nRun 'stepbench --help' for every flag and its accepted values.\n";
    return 2;
  }
  for (const auto& extra : app.remaining()) {
    if (extra.rfind("--benchmark_", 0) == 0 && extra.find('=') != std::string::npos) {
      o.benchmark_args.push_back(extra);
    } else {
      std::cerr << fmt::format(
          "stepbench: unknown argument '{}'. Google Benchmark's flags go as --benchmark_<flag>=<value>; run "
          "'stepbench --help' for stepbench's own.\n",
          extra);
      return 2;
    }
  }
  for (const auto* opt : app.get_options())
    if (opt->count() > 0) o.explicitly_set.push_back(opt->get_name());
  return std::nullopt;
}

void resolve(Options& o) {
  if (o.backend == "auto") {
    const std::string why = cuda_unavailable_reason();
    o.backend = why.empty() ? "cuda" : "cpu";
    fmt::print(stderr, "stepbench: --backend auto picked {}{}\n", o.backend,
               why.empty() ? "" : fmt::format(" ({})", why));
  }
  if (o.backend == "cuda") {
    const std::string why = cuda_unavailable_reason();
    if (!why.empty()) throw UsageError(fmt::format("--backend cuda: {}; use --backend cpu or auto", why));
    const int visible = cuda_device_count();
    if (o.gpus > visible)
      throw UsageError(fmt::format("--gpus {} but {} GPU{} visible; use --gpus {} or fewer", o.gpus, visible,
                                   visible == 1 ? " is" : "s are", visible));
  }
  if (o.global_batch_size > 0) {
    if (o.global_batch_size % o.gpus != 0)
      throw UsageError(fmt::format("--global-batch-size {} does not divide evenly by --gpus {}; use a multiple of {} "
                                   "(e.g. {}) or --batch-size per GPU",
                                   o.global_batch_size, o.gpus, o.gpus,
                                   (o.global_batch_size / o.gpus + 1) * o.gpus));
    o.batch_size = o.global_batch_size / o.gpus;
  }
  if (o.ps_device == "cpu" && o.variable_update != "parameter_server")
    throw UsageError(fmt::format("--ps-device cpu applies to --variable-update parameter_server only (not {}); drop "
                                 "it or add --variable-update parameter_server",
                                 o.variable_update));
  if (o.cuda_graph && o.backend != "cuda")
    throw UsageError("--cuda-graph needs the cuda backend (CUDA Graphs); drop it on the cpu");
  if (o.cuda_graph && o.gpus > 1)
    throw UsageError(fmt::format("--cuda-graph captures one GPU per process: use --gpus 1 (and mpirun -np {} for {} "
                                 "GPUs)",
                                 o.gpus, o.gpus));
  if (o.cuda_graph && o.data != "synthetic")
    throw UsageError("--cuda-graph replays the synthetic batch on the device: use --data synthetic with it");
  if (o.precision == "tf32" && o.backend != "cuda")
    throw UsageError("--precision tf32 needs the cuda backend; use --precision fp32 on the cpu");
  // The CPU is ~100x slower than a GPU: unless told otherwise, run a reduced configuration that
  // finishes in about a minute on two cores, and say so.
  if (o.backend == "cpu") {
    std::vector<std::string> changed;
    if (o.batch_size == 0) {
      o.batch_size = o.model == "tiny" ? 32 : 4;
      changed.push_back(fmt::format("--batch-size {}", o.batch_size));
    }
    if (!o.given("--warmup")) {
      o.warmup = 2;
      changed.push_back("--warmup 2");
    }
    if (!o.given("--repetitions")) {
      o.repetitions = 3;
      changed.push_back("--repetitions 3");
    }
    if (!changed.empty()) {
      o.reduced = true;
      o.reduced_note = fmt::format("cpu backend: reduced configuration {} (set these flags to change it)",
                                   fmt::join(changed, " "));
    }
  }
  if (o.batch_size == 0) o.batch_size = 32;
  if (o.model == "tiny" && o.image_size == 299 && !o.given("--image-size")) o.image_size = 64;
}


}  // namespace stepbench::cli
