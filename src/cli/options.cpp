#include "cli/options.hpp"

#include <fmt/format.h>

#include <unistd.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <string_view>

#include "bench/projection.hpp"
#include "cli/help.hpp"
#include "data/records.hpp"
#include "tensor/error.hpp"

namespace stepbench::cli {
namespace {
constexpr double kFloatMax = std::numeric_limits<float>::max();
}  // namespace

bool Options::given(const std::string& flag) const {
  return std::find(explicitly_set.begin(), explicitly_set.end(), flag) != explicitly_set.end();
}

std::optional<int> parse(int argc, const char* const* argv, Options& o) {
  BenchConfig& b = o.bench;
  CLI::App app{
      "stepbench: forward, backward, gradient sync and the whole training step of a CNN, timed on the device.\n"
      "Flags can also come from a TOML file (--config), e.g. configs/*.toml; flags given on the command line win.\n"
      "Google Benchmark's own flags pass through as --benchmark_<flag>=<value>.",
      "stepbench"};
  app.set_config("--config", "", "TOML file of flags (key = value, keys are the long flag names)");
  app.allow_extras();
  add_model_flags(app, o.model);
  app.add_option("--gpus", o.gpus, "model replicas (towers); on the cpu backend, CPU towers")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  auto* bs = app.add_option("--batch-size", o.batch_size,
                            "images per step per GPU (tf_cnn_benchmarks' convention) [default: 32 on cuda; "
                            "the reduced CPU default otherwise]")
                 ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
  auto* gbs = app.add_option("--global-batch-size", o.global_batch_size,
                             "images per step over all GPUs; must divide evenly by --gpus")
                  ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
  bs->excludes(gbs);
  add_enum(app, "--optimizer", b.run.optimizer.kind, "momentum (0.9), sgd or rmsprop");
  app.add_option("--learning-rate", o.learning_rate, "optimizer learning rate")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            // the optimizer keeps it in a float: a larger one would become infinity unsaid, one below
            // the smallest float 0
            return *end == '\0' && x <= kFloatMax && static_cast<float>(x) > 0
                       ? ""
                       : "give a learning rate above 0 that a float holds (1.4e-45 to 3.4e38), not " + v;
          },
          "", "positive"));
  app.add_option("--weight-decay", o.weight_decay, "L2 weight decay")
      ->capture_default_str()
      ->check(CLI::Range(0.0, kFloatMax));  // a float in the optimizer, as the learning rate
  app.add_option("--warmup", b.warmup, "untimed training steps (and inference passes) before any timing, >= 1")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--repetitions", b.repetitions, "repetitions of every benchmark; median, stddev and cv over them")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  add_sync_flags(app, o);
  app.add_option("--workspace-mb", o.workspace_mb,
                 "cuda: the most scratch memory one convolution's cuDNN algorithm may use; the fastest algorithm "
                 "within it is picked")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--device-memory-mb", o.device_memory_mb,
                 "plan as if each device had at most this much free memory for the graph's buffers (size a run "
                 "for a smaller GPU; the largest batch of --sweep-*; the CUDA context, cuDNN/cuBLAS/NCCL buffers "
                 "come on top); 0: what it has")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--sweep-gpus", b.sweep_gpus,
                 "instead of the phase fixtures, time the step at each of these GPU (tower) counts, e.g. 1,2,4,8: a "
                 "table of step time, images/s and scaling efficiency, and the largest batch per GPU that fits")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  app.add_option("--sweep-batch", b.sweep_batch,
                 "with or without --sweep-gpus: time the step at each of these batch sizes per GPU, e.g. 32,64,128")
      ->delimiter(',')
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
  app.add_option("--project-gpus", b.project_gpus,
                 "project the step time and scaling efficiency to these GPU counts (e.g. 64,256,1024) from this run's "
                 "one-GPU step (with --sweep-*: each batch's one-GPU point, checked against the counts measured) and "
                 "an alpha-beta model of ring and tree all-reduce over --link-gbps / --link-latency-us or --fabric")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--link-gbps", b.link_gbps, "--project-gpus: each GPU's link bandwidth, one direction, Gbit/s")
      ->check(CLI::Range(1e-3, 1e7));
  app.add_option("--link-latency-us", b.link_latency_us, "--project-gpus: the link's latency per hop, microseconds")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--fabric", b.fabric,
                 "--project-gpus: a link preset with nominal figures instead of --link-gbps/--link-latency-us")
      ->check(CLI::IsMember(fabric_names()));
  add_straggler_flags(app, o);
  add_peak_flags(app, o);
  add_fabric_flags(app, o);
  app.add_option("--plan-cache", b.plan_cache,
                 "cuda: keep cuDNN's algorithm choices (cudnnFind) in this file between runs on this machine: a "
                 "convolution found there is not searched again (keyed by shapes, type, layout, math, workspace, GPU, "
                 "driver and cuDNN version); written after planning and at the end");
  app.add_flag("--own-kernels", b.run.own_kernels,
               "cuda: batch norm and pooling on stepbench's kernels instead of cuDNN's (the path taken where cuDNN "
               "declines a configuration), to time one against the other");
  app.add_flag("--cuda-graph", b.cuda_graph,
               "cuda: also capture the step and the forward as CUDA Graphs after warm-up and time their replays "
               "(rows step:cuda_graph, forward:cuda_graph); one GPU per process, synthetic data");
  app.add_option("--data", o.data,
                 "input: synthetic (a constant batch on the device), synthetic-host (a host batch copied every "
                 "step on a copy stream, double-buffered), a folder of JPEG and PNG images, one subfolder per "
                 "class, or a record file written by stepbench make-records")
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--cache",
         [&b](const std::string& v) {
           if (v != "none" && v != "memory") throw UsageError(fmt::format("--cache {}: give none or memory", v));
           b.cache = v == "memory" ? InputCache::memory : InputCache::none;
         },
         "memory: decode and resize every image of the --data folder once, at start, and keep it in memory; each "
         "step then only crops, flips and normalises (refused, with the bytes, when it does not fit)")
      ->type_name("none|memory");
  app.add_option_function<std::string>(
         "--decode", [&b](const std::string& v) { b.decode = *try_parse_enum<DecodeOn>(v); },
         "where a --data folder's JPEG files are decoded, resized, cropped and normalised: cpu (the "
         "--data-threads) or gpu (nvJPEG and stepbench's kernels on each GPU; the threads only read the files)")
      ->check(CLI::IsMember(names_of<DecodeOn>()))
      ->type_name("cpu|gpu");
  app.add_option("--cache-limit-mb", b.cache_limit_mb,
                 "the most --cache memory may use (default: 80% of the memory the kernel reports available)")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 30));
  app.add_flag("--suggest", b.suggest,
               "with --data: after the benchmarks, run the input pipeline a few batches as it is and with each "
               "remedy (--cache memory, a record file, twice the --data-threads, --decode gpu on the cuda backend) "
               "and print the images/s of each beside the step's");
  app.add_option("--data-threads", b.data_threads, "decoding threads of the input pipeline")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--prefetch", b.prefetch, "decoded batches kept ready ahead of the step")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option_function<std::vector<std::string>>(
         "--phases",
         [&b](const std::vector<std::string>& v) {
           b.phases.clear();
           for (const auto& s : v) b.phases.push_back(*try_parse_enum<Phase>(s));
         },
         "comma-separated subset of: forward, forward_train, forward_backward, step, grad_sync, update, "
         "input_pipeline [default: all]")
      ->delimiter(',')
      ->check(CLI::IsMember(names_of<Phase>()));
  app.add_option("--json", b.json, "write Google Benchmark's JSON (with the configuration in its context) here");
  app.add_option("--history", b.history,
                 "append this run (machine fingerprint, revision, configuration, every repetition) as one JSON line "
                 "to this file, for stepbench compare --history");
  app.add_flag("--per-layer", b.per_layer, "also time every distinct conv layer shape: fwd, bwd_data, bwd_filter");
  app.add_flag("--layer-times", b.layer_times,
               "after the timed repetitions, time every layer's pieces inside the real step (conv forward, backward "
               "data and filter, BN+ReLU, pooling, loss, sync, update; medians of --repetitions probed steps, at "
               "least 3): the summary's top layers and kinds of work, every piece under layer_times in --json");
  app.add_option("--trace", b.trace,
                 "after the timed repetitions, write probed steps to this file as Chrome trace-event JSON (open in "
                 "Perfetto or chrome://tracing): per tower the phases, layers and pieces on the device, the host's "
                 "launches, the gradient buckets' syncs; with several processes rank N writes FILE.rankN");
  add_enum(app, "--peer", b.peer,
           "after stepbench, time the same phases, precision and settings in this peer (bench/torch_peer.py: "
           "pytorch eager, or pytorch-compile with torch.compile) and add its medians and the ratios to the summary",
           {"pytorch", "pytorch-compile"});
  app.add_option("--peer-python", o.peer_python,
                 "the Python whose torch and torchvision run the peer [default: the first that imports them (and "
                 "on cuda sees a GPU) of $VIRTUAL_ENV/bin/python, $CONDA_PREFIX/bin/python, python3, "
                 "/usr/bin/python3, /opt/torch/.venv/bin/python]");
  app.add_flag("--list", b.list, "print the benchmark names this configuration registers, then exit");
  app.add_flag("--verbose", b.verbose, "also Google Benchmark's context (the machine, the libraries) and tables");
  app.add_flag("--version", o.version, "print the version and the backends this build has, then exit");
  app.add_flag("--list-models", o.list_models,
               "print the models, their image sizes and tf_cnn_benchmarks' names, then exit");
  use_grouped_help(app);  // every flag in its group with a short line (cli/help.cpp)

  if (auto rc = parse_args(app, argc, argv, 1, "stepbench")) return rc;
  for (const auto& extra : app.remaining()) {
    if (extra.rfind("--benchmark_repetitions", 0) == 0) {
      std::cerr << "stepbench: give --repetitions N instead of --benchmark_repetitions (the summary, the probes "
                   "and --history count them)\n";
      return 2;
    }
    if (extra.rfind("--benchmark_", 0) == 0 && extra.find('=') != std::string::npos) {
      b.benchmark_args.push_back(extra);
    } else {
      std::cerr << fmt::format(
          "stepbench: unknown argument '{}'. Google Benchmark's flags go as --benchmark_<flag>=<value>; run "
          "'stepbench --help' for stepbench's own.\n",
          extra);
      return 2;
    }
  }
  for (const auto* opt : app.get_options())  // by their long names: get_name() is "" for a hidden option
    if (opt->count() > 0)
      for (const auto& l : opt->get_lnames()) o.explicitly_set.push_back("--" + l);
  return std::nullopt;
}

void resolve(Options& o, int local_processes, bool share_gpus) {
  ModelFlags& m = o.model;
  // asking for GPUs where there are none is an error, not a quiet run on CPU towers
  if (m.backend == BackendKind::automatic && (o.given("--gpus") || o.given("--sweep-gpus"))) {
    if (const std::string why = cuda_unavailable_reason(); !why.empty()) {
      const std::string flag = o.given("--gpus") ? fmt::format("--gpus {}", o.gpus) : "--sweep-gpus";
      throw UsageError(
          fmt::format("{} asks for GPUs: {}. Add --backend cpu to run {} on CPU towers instead", flag, why, flag));
    }
  }
  if (m.backend == BackendKind::automatic) {
    std::string why = cuda_unavailable_reason();
    m.backend = resolve(BackendKind::automatic);
    // the CUDA error's name, not its sentence: one short line (--backend cuda says it all)
    if (const auto colon = why.find(": "), close = why.rfind(')'); colon != std::string::npos && close > colon)
      why.erase(colon, close - colon);
    if (why.rfind("stepbench was built without CUDA", 0) == 0) why = "built without CUDA (-DSTEPBENCH_CUDA=ON)";
    fmt::print(stderr, "stepbench: --backend auto picked {}{}\n", to_string(m.backend),
               why.empty() ? "" : fmt::format(": {}", why));
  }
  const bool cuda = m.backend == BackendKind::cuda;
  if (cuda && o.procs_per_node > 0)
    throw UsageError(
        "--procs-per-node poses nodes for CPU ranks; on GPUs the launcher's local ranks choose each process's GPU: "
        "use --backend cpu, or launch real nodes");
  if (cuda) {
    const std::string why = cuda_unavailable_reason();
    if (!why.empty()) throw UsageError(fmt::format("--backend cuda: {}; use --backend cpu or auto", why));
    const int visible = std::max(cuda_device_count(), 1), towers = o.gpus * local_processes;
    int& k = o.bench.run.ranks_per_gpu;
    k = o.ranks_per_gpu > 0 ? o.ranks_per_gpu : share_gpus ? (towers + visible - 1) / visible : 1;
    if ((towers + k - 1) / k > visible)
      throw UsageError(fmt::format(
          "{} need{} {} GPUs at {} per GPU, but {} {} visible; use fewer, or share them (a test of the multi-rank "
          "path, not scaling figures): {}",
          local_processes > 1 ? fmt::format("{} processes with --gpus {} each", local_processes, o.gpus)
                              : fmt::format("--gpus {}", o.gpus),
          local_processes > 1 ? "" : "s", (towers + k - 1) / k, k, visible, visible == 1 ? "is" : "are",
          o.gpus > 1 ? fmt::format("stepbench launch --nproc {} -- --gpus 1 (one rank per process)", towers)
                     : fmt::format("--ranks-per-gpu {}", (towers + visible - 1) / visible)));
  } else if (o.ranks_per_gpu > 0) {
    throw UsageError("--ranks-per-gpu shares GPUs between NCCL ranks; the cpu backend has none: drop it");
  }
  if (o.global_batch_size > 0) {
    if (o.global_batch_size % o.gpus != 0)
      throw UsageError(
          fmt::format("--global-batch-size {} does not divide evenly by --gpus {}; use a multiple of {} "
                      "(e.g. {}) or --batch-size per GPU",
                      o.global_batch_size, o.gpus, o.gpus, (o.global_batch_size / o.gpus + 1) * o.gpus));
    o.batch_size = o.global_batch_size / o.gpus;
  }
  BenchConfig& b = o.bench;
  TowerOptions& r = b.run;
  // --ps-device with a mode other than parameter_server, fp16 with parameter_server: the Towers
  // constructor refuses them (UsageError naming the flags), before anything is built.
  if (o.data == "synthetic" || o.data == "synthetic-host") {
    b.data = *try_parse_enum<DataKind>(o.data);
  } else {
    std::error_code ec;
    b.data_dir = o.data;
    if (RecordFile::looks_like_records(o.data))
      b.data = DataKind::records;
    else if (std::filesystem::is_regular_file(o.data, ec))
      throw UsageError(fmt::format(
          "--data {}: a file, but not a stepbench record file; give a folder of class subfolders of JPEG or PNG "
          "images, or a record file (stepbench make-records DIR OUT.records)",
          o.data));
    else
      b.data = DataKind::image_folder;
  }
  if (b.cache == InputCache::memory && b.data != DataKind::image_folder)
    throw UsageError(b.data == DataKind::records
                         ? "--cache memory: a record file is already decoded and resized; drop --cache"
                         : "--cache memory caches the images of a --data folder; give --data DIR or drop --cache");
  if (b.decode == DecodeOn::gpu && b.data != DataKind::image_folder)
    throw UsageError(b.data == DataKind::records
                         ? "--decode gpu: a record file is already decoded and resized; drop --decode gpu"
                         : "--decode gpu decodes the JPEG files of a --data folder; give --data DIR or drop it");
  if (b.decode == DecodeOn::gpu && !cuda)
    throw UsageError("--decode gpu decodes on a GPU (nvJPEG); the cpu backend decodes on the --data-threads: drop it");
  if (b.decode == DecodeOn::gpu && b.cache == InputCache::memory)
    throw UsageError("--decode gpu decodes every step on the GPU; --cache memory decodes once on the CPU: give one");
  if (o.given("--cache-limit-mb") && b.cache != InputCache::memory)
    throw UsageError("--cache-limit-mb caps --cache memory: add --cache memory or drop it");
  if (b.suggest && !b.data_files())
    throw UsageError("--suggest tries remedies for an input pipeline: give --data DIR (or a record file)");
  if (b.cuda_graph && !cuda) throw UsageError("--cuda-graph needs the cuda backend (CUDA Graphs); drop it on the cpu");
  if (b.cuda_graph && o.gpus > 1)
    throw UsageError(
        fmt::format("--cuda-graph captures one GPU per process: use --gpus 1 (and stepbench launch --nproc {} "
                    "for {} GPUs)",
                    o.gpus, o.gpus));
  if (b.cuda_graph && b.data != DataKind::synthetic)
    throw UsageError("--cuda-graph replays the synthetic batch on the device: use --data synthetic with it");
  if (b.cuda_graph && o.ps_on_cpu)
    throw UsageError("--cuda-graph cannot capture the host parameter server's CPU work; use --ps-device device");
  if (b.run.own_kernels && !cuda)
    throw UsageError("--own-kernels chooses between cuDNN's and stepbench's GPU kernels; drop it on the cpu");
  if (!b.plan_cache.empty() && !cuda)
    throw UsageError("--plan-cache keeps cuDNN's convolution plans; the cpu backend has none: drop it on the cpu");
  if (!b.plan_cache.empty()) {
    b.run.plans = std::make_shared<ConvPlanCache>();
    b.run.plans->load(b.plan_cache);  // a damaged file: UsageError naming it
  }
  if (b.sweep()) {
    for (const char* f : {"--phases", "--per-layer", "--layer-times", "--trace", "--peer", "--cuda-graph", "--history",
                          "--list", "--data", "--cache", "--cache-limit-mb", "--suggest", "--decode"})
      if (o.given(f))
        throw UsageError(fmt::format(
            "{} does not go with --sweep-gpus / --sweep-batch (the sweep times the training step over its grid, on "
            "synthetic data, and nothing else): drop it",
            f));
    if (o.given("--global-batch-size"))
      throw UsageError(
          "--global-batch-size does not go with a sweep: give the batch per GPU (--batch-size or "
          "--sweep-batch)");
    if (!b.benchmark_args.empty())
      throw UsageError(
          fmt::format("{} does not go with a sweep (it times its grid itself, not through Google "
                      "Benchmark): drop it",
                      b.benchmark_args.front()));
    if (o.given("--gpus") && !b.sweep_gpus.empty())
      throw UsageError("--gpus and --sweep-gpus both give the GPU count: drop --gpus");
    if ((o.given("--batch-size") || o.given("--global-batch-size")) && !b.sweep_batch.empty())
      throw UsageError("--batch-size (or --global-batch-size) and --sweep-batch both give the batch: drop one");
    auto distinct = [](auto v, const char* flag) {
      std::sort(v.begin(), v.end());
      if (std::adjacent_find(v.begin(), v.end()) != v.end())
        throw UsageError(fmt::format("{} lists a value twice; give each once", flag));
    };
    distinct(b.sweep_gpus, "--sweep-gpus");
    distinct(b.sweep_batch, "--sweep-batch");
    const int most = b.sweep_gpus.empty() ? 0 : *std::max_element(b.sweep_gpus.begin(), b.sweep_gpus.end());
    if (cuda && most > cuda_device_count())
      throw UsageError(fmt::format("--sweep-gpus {} but {} GPU(s) are visible; list counts up to {}", most,
                                   cuda_device_count(), cuda_device_count()));
  }
  resolve_stragglers(o);
  resolve_peak_flags(o);
  const bool fitted = resolve_fabric(o);
  const bool link_given = o.given("--link-gbps") || o.given("--link-latency-us");
  if (b.project_gpus.empty() && (link_given || o.given("--fabric")))
    throw UsageError(
        "--link-gbps, --link-latency-us and --fabric describe the link for --project-gpus: add it or drop them");
  if (!b.project_gpus.empty()) {
    if (link_given && o.given("--fabric"))
      throw UsageError("--fabric and --link-gbps/--link-latency-us both describe the link: give one");
    if (!fitted && !o.given("--fabric") && !(o.given("--link-gbps") && o.given("--link-latency-us")))
      throw UsageError(
          fmt::format("--project-gpus needs the link: --link-gbps G --link-latency-us L, --fabric "
                      "NAME (one of {}), or --fabric-from an nccl-tests -J file",
                      fmt::join(fabric_names(), ", ")));
    if (o.given("--fabric")) {
      const LinkModel l = fabric_preset(b.fabric);
      b.link_gbps = l.gbps;
      b.link_latency_us = l.latency_us;
    }
    const bool one = b.sweep() ? b.sweep_gpus.empty()
                                     ? o.gpus == 1
                                     : std::find(b.sweep_gpus.begin(), b.sweep_gpus.end(), 1) != b.sweep_gpus.end()
                               : o.gpus == 1;
    if (!one)
      throw UsageError(b.sweep() ? "--project-gpus starts from one GPU's step: add 1 to --sweep-gpus"
                                 : "--project-gpus starts from one GPU's step: use --gpus 1");
    if (b.run.variable_update != VariableUpdate::replicated &&
        b.run.variable_update != VariableUpdate::distributed_all_reduce)
      throw UsageError(
          fmt::format("--project-gpus models replicated all-reduce (and distributed_all_reduce's, in a run of "
                      "several processes); --variable-update {} moves gradients otherwise: use replicated or drop "
                      "--project-gpus",
                      to_string(b.run.variable_update)));
    if (b.list) throw UsageError("--list prints names and runs nothing to project from: drop --project-gpus");
  }
  if (m.precision == Precision::tf32 && !cuda)
    throw UsageError("--precision tf32 needs the cuda backend; use --precision fp32 on the cpu");
  if (b.peer != PeerKind::none && !cuda && m.precision != Precision::fp32 && m.precision != Precision::bf16)
    throw UsageError(
        "--peer on the cpu backend compares fp32 or bf16 (PyTorch's CPU autocast); use one of them or drop --peer");
  if (o.given("--peer-python")) {
    if (o.peer_python.empty()) throw UsageError("--peer-python is empty; give the path of a python interpreter");
    b.peer_pythons = {o.peer_python};
  }
  // The CPU is ~100x slower than a GPU: unless told otherwise, run a reduced configuration that
  // finishes in about a minute on two cores, and say so.
  if (!cuda) {
    std::vector<std::string> changed;
    if (o.batch_size == 0) {
      o.batch_size = m.model == ModelKind::tiny ? 32 : 4;
      changed.push_back(fmt::format("--batch-size {}", o.batch_size));
    }
    if (!o.given("--warmup")) {
      b.warmup = 2;
      changed.emplace_back("--warmup 2");
    }
    if (!o.given("--repetitions")) {  // enough for stepbench compare: Holm over the 5 phases needs 5 a side
      b.repetitions = 5;
      changed.emplace_back("--repetitions 5");
    }
    if (!changed.empty())
      b.reduced_note = fmt::format("reduced CPU run: {} (give these flags to change it)", fmt::join(changed, " "));
  }
  if (o.batch_size == 0) o.batch_size = 32;
  // the live progress line: on a terminal only (never into a log, a pipe or CI's output)
  const char* term = std::getenv("TERM");
  b.progress = isatty(fileno(stderr)) && !(term && std::string_view(term) == "dumb");
  if (!o.given("--image-size")) m.image_size = default_image_size(m.model);
  if (m.model != ModelKind::inception_v3) {
    if (o.given("--aux-logits") && m.aux_logits)
      throw UsageError(
          fmt::format("--aux-logits is Inception-v3's auxiliary head; {} has none: drop it", to_string(m.model)));
    m.aux_logits = false;
  }

  r.backend = m.backend;
  r.towers = o.gpus;
  r.batch_per_tower = o.batch_size;
  r.model = m.model;
  r.model_options.image_size = m.image_size;
  r.model_options.aux_logits = m.aux_logits;
  r.layout = m.layout;
  r.precision = m.precision;
  r.recompute = m.recompute;
  r.fuse = m.fuse;
  r.optimizer.lr = static_cast<float>(o.learning_rate);
  r.optimizer.weight_decay = static_cast<float>(o.weight_decay);
  r.bucket_bytes = static_cast<std::size_t>(o.bucket_mb * (1 << 20));
  r.overlap = !o.no_overlap;
  r.ps_on_host = o.ps_on_cpu;
  r.ps_ranks = o.ps_ranks;
  r.cross_replica_sync = o.cross_replica_sync;
  r.sync_timeout_s = o.sync_timeout_s;
  r.workspace_bytes = static_cast<std::size_t>(o.workspace_mb) << 20;
  r.memory_limit_bytes = static_cast<std::size_t>(o.device_memory_mb) << 20;
}

}  // namespace stepbench::cli
