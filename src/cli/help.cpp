#include "cli/help.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "bench/text.hpp"
#include "models/models.hpp"

namespace stepbench::cli {
namespace {

constexpr std::size_t kColumn = 30;  // where the descriptions start; lines end by kWidth (bench/text.hpp)

// `text` broken at spaces into lines of at most kWidth columns, the first after `first`, the rest
// indented to kColumn.
std::string wrap(const std::string& first, const std::string& text) {
  return stepbench::wrap(text, kColumn, kWidth, first);
}

// What the option takes: the value name its type_name gives, before CLI11's validator text.
std::string value_name(const CLI::Option& o) {
  if (o.get_items_expected_max() == 0) return "";  // a flag
  std::string t = o.get_type_name();
  t = t.substr(0, t.find(':'));
  if (t == "INT" || t == "UINT") return "N";
  if (t == "FLOAT") return "X";
  if (t == "TEXT") return "VALUE";
  return t;
}

std::string option_line(const CLI::Option& o) {
  std::string names;
  for (const auto& s : o.get_snames()) names += "-" + s + ", ";
  for (const auto& l : o.get_lnames()) names += (names.empty() || names.back() == ' ' ? "--" : ", --") + l;
  const std::string v = value_name(o);
  std::string first = "  " + names + (v.empty() ? "" : " " + v);
  std::string text = o.get_description();
  if (!v.empty() && !o.get_default_str().empty()) text += " [" + o.get_default_str() + "]";
  if (first.size() + 1 > kColumn) return first + "\n" + wrap(std::string(kColumn, ' '), text);  // a long value list
  return wrap(first + std::string(kColumn - first.size(), ' '), text);
}

struct FlagHelp {
  const char* flag;
  const char* group;
  const char* value;  // the value's name ("" for a flag)
  const char* help;
};

// One line per flag, in the order --help lists them within each group.
const FlagHelp kFlags[] = {
    {"--phases", "What to run", "LIST",
     "the phases to time [all]: forward, forward_train, forward_backward, step, grad_sync, update, input_pipeline"},
    {"--per-layer", "What to run", "", "also time each distinct convolution shape alone: fwd, bwd_data, bwd_filter"},
    {"--layer-times", "What to run", "", "after the timing, split the real step into every layer's pieces"},
    {"--sweep-gpus", "What to run", "LIST", "instead: time the step at these GPU counts, e.g. 1,2,4,8"},
    {"--sweep-batch", "What to run", "LIST", "instead: time the step at these batch sizes per GPU, e.g. 32,64,128"},
    {"--project-gpus", "What to run", "LIST", "project the step to these GPU counts from this one-GPU run"},
    {"--link-gbps", "What to run", "X", "--project-gpus: each GPU's link bandwidth, Gbit/s"},
    {"--link-latency-us", "What to run", "X", "--project-gpus: the link's latency per hop, microseconds"},
    {"--fabric", "What to run", "NAME", "--project-gpus: a named link instead of the two above"},
    {"--gpus-per-node", "What to run", "G", "--project-gpus: two levels, G GPUs per node, then between nodes"},
    {"--node-fabric", "What to run", "NAME", "--gpus-per-node: the link within a node, a named one"},
    {"--node-link-gbps", "What to run", "X", "--gpus-per-node: the link within a node, Gbit/s"},
    {"--node-link-latency-us", "What to run", "X", "--gpus-per-node: its latency per hop, microseconds"},
    {"--fabric-from", "What to run", "FILE", "--project-gpus: the link fitted to an nccl-tests -J run, or run"},
    {"--peer", "What to run", "pytorch|pytorch-compile", "also time the same in PyTorch: ratios in the summary"},
    {"--peer-python", "What to run", "PATH", "the Python whose torch runs --peer [the first that imports it]"},
    {"--list", "What to run", "", "print the benchmark names and run nothing"},
    {"--list-models", "What to run", "", "print the models: image sizes, tf_cnn_benchmarks' names"},
    {"--config", "What to run", "FILE", "read flags from a TOML file (configs/*.toml); the command line wins"},
    {"--backend", "Model and precision", "auto|cpu|cuda", "where to run; auto: cuda when a GPU is visible"},
    {"--model", "Model and precision", "", "the network (torchvision's; --list-models)"},  // names: models.hpp
    {"--image-size", "Model and precision", "N", "input height and width [the model's training size: --list-models]"},
    {"--no-aux-logits", "Model and precision", "", "leave out Inception's auxiliary head (needed below 299)"},
    {"--precision", "Model and precision", "fp32|tf32|bf16|fp16", "the math (tf32: cuda only)"},
    {"--format", "Model and precision", "nchw|nhwc", "the activations' layout"},
    {"--recompute", "Model and precision", "auto|on|off",
     "remake conv+BN outputs in backward, not keep them: less memory; auto: on the cpu only"},
    {"--fuse", "Model and precision", "off|on",
     "fused conv+BN units: outputs that feed only convs or a residual add not stored"},
    {"--optimizer", "Model and precision", "momentum|sgd|rmsprop", "the update (momentum 0.9)"},
    {"--learning-rate", "Model and precision", "X", "the optimizer's learning rate"},
    {"--weight-decay", "Model and precision", "X", "L2 weight decay"},
    {"--gpus", "Towers and sync", "N", "model replicas (towers) per process; CPU towers with --backend cpu"},
    {"--batch-size", "Towers and sync", "N", "images per step per GPU [32; 4 in the reduced CPU run]"},
    {"--global-batch-size", "Towers and sync", "N", "images per step over every GPU (a multiple of --gpus)"},
    {"--variable-update", "Towers and sync", "MODE",
     "how gradients are shared: replicated, parameter_server, independent, distributed_all_reduce, "
     "distributed_replicated"},
    {"--cross-replica-sync", "Towers and sync", "on|off",
     "the parameter-server modes: off, workers push and pull on their own"},
    {"--ps-ranks", "Towers and sync", "K", "distributed_replicated: parameter servers, one per node at most"},
    {"--ps-device", "Towers and sync", "device|cpu", "parameter_server: where the variables live"},
    {"--bucket-mb", "Towers and sync", "X", "gradient sync bucket size, MiB"},
    {"--no-overlap", "Towers and sync", "", "sync the gradients after backward, not bucket by bucket during it"},
    {"--sync-timeout-s", "Towers and sync", "X", "end the run when a sync takes longer; 0 waits forever"},
    {"--rendezvous", "Towers and sync", "SPEC",
     "where processes without MPI meet: file:PATH or tcp://HOST:PORT [the launcher's]"},
    {"--procs-per-node", "Towers and sync", "K", "K consecutive ranks act as one node (pose as nodes on one machine)"},
    {"--ranks-per-gpu", "Towers and sync", "N", "cuda: NCCL ranks sharing each GPU, to test the multi-rank path"},
    {"--straggler-top", "Towers and sync", "K", "with two towers or more: list the K slowest in the summary [3]"},
    {"--slow-tower", "Towers and sync", "T:FACTOR|T:Nms", "make tower T slower, to see what a straggler costs"},
    {"--data", "Data", "SOURCE", "synthetic, synthetic-host, a folder of JPEG/PNG images, or a .records"},
    {"--data-threads", "Data", "N", "threads reading and decoding the images"},
    {"--prefetch", "Data", "N", "batches kept ready ahead of the step"},
    {"--cache", "Data", "none|memory", "memory: decode and resize the folder once, at start"},
    {"--cache-limit-mb", "Data", "N", "the most --cache memory may use [80% of the available memory]"},
    {"--decode", "Data", "cpu|gpu", "where JPEG files are decoded and transformed (gpu: nvJPEG)"},
    {"--suggest", "Data", "", "after the benchmarks, measure the remedies for a slow input pipeline"},
    {"--warmup", "Timing", "N", "untimed training steps first"},
    {"--repetitions", "Timing", "N", "repetitions of every benchmark (the summary's medians)"},
    {"--peak", "Timing", "auto|measure|off|TFLOPS", "the device's GEMM peak the step's FLOP/s are a share of [auto]"},
    {"--peak-cache", "Timing", "FILE|none", "where measured peaks are kept [~/.cache/stepbench/peak.json]"},
    {"--json", "Output", "FILE", "write every repetition, counter and the context as JSON"},
    {"--history", "Output", "FILE", "append this run as one line, for stepbench compare --history"},
    {"--trace", "Output", "FILE", "write probed steps as a Chrome trace (Perfetto, chrome://tracing)"},
    {"--verbose", "Output", "", "also Google Benchmark's context (machine, libraries) and tables"},
    {"--version", "Output", "", "print the version and the backends this build has, then exit"},
    {"--help", "Output", "", "print this help, then exit"},
    {"--workspace-mb", "GPU", "N", "the most scratch memory a convolution's cuDNN algorithm may use"},
    {"--device-memory-mb", "GPU", "N", "plan as if each GPU had this much memory free; 0: what it has"},
    {"--plan-cache", "GPU", "FILE", "keep cuDNN's algorithm choices in this file between runs"},
    {"--own-kernels", "GPU", "", "batch norm and pooling on stepbench's kernels instead of cuDNN's"},
    {"--cuda-graph", "GPU", "", "also time the step and the forward replayed as CUDA Graphs"},
};

}  // namespace

void describe_flags(CLI::App& app) {
  for (const auto& f : kFlags) {
    CLI::Option* o = app.get_option_no_throw(f.flag);
    if (!o || o->get_group().empty()) continue;  // not a flag of this app, or hidden
    o->group(f.group)->description(f.help);
    if (*f.value) o->type_name(f.value);
  }
  if (CLI::Option* o = app.get_option_no_throw("--model"))  // the names from the models' one list
    o->type_name(fmt::format("{}", fmt::join(user_models(), "|")));
}

const std::vector<std::string>& help_groups() {
  static const std::vector<std::string> groups = {
      "What to run", "Model and precision", "Towers and sync", "Data", "Timing", "Output", "GPU"};
  return groups;
}

std::string grouped_help(const CLI::App& app, const std::string& intro,
                         const std::vector<std::pair<std::string, std::string>>& subcommands,
                         const std::string& outro) {
  std::string s = intro + "\n";
  std::vector<std::string> groups = help_groups();
  std::vector<const CLI::Option*> other;
  for (const CLI::Option* o : app.get_options()) {
    const std::string& g = o->get_group();
    if (!g.empty() && std::find(groups.begin(), groups.end(), g) == groups.end()) other.push_back(o);
  }
  if (!other.empty()) groups.emplace_back("Other");
  for (const auto& g : groups) {
    std::string lines;
    if (g == "Other") {
      for (const CLI::Option* o : other) lines += option_line(*o);
    } else {
      std::vector<const CLI::Option*> listed;
      for (const auto& f : kFlags)  // the table's order, then the group's others
        if (const CLI::Option* o = app.get_option_no_throw(f.flag); o && o->get_group() == g) listed.push_back(o);
      for (const CLI::Option* o : app.get_options())
        if (o->get_group() == g && std::find(listed.begin(), listed.end(), o) == listed.end()) listed.push_back(o);
      for (const CLI::Option* o : listed) lines += option_line(*o);
    }
    if (!lines.empty()) s += "\n" + g + ":\n" + lines;
  }
  s += "\nSubcommands (stepbench SUBCOMMAND --help for their flags):\n";
  for (const auto& [name, what] : subcommands) {
    const std::string first = "  " + name;
    s += wrap(first + std::string(kColumn - first.size(), ' '), what);
  }
  return s + "\n" + outro;
}

void use_grouped_help(CLI::App& app) {
  describe_flags(app);
  app.formatter_fn([](const CLI::App* a, const std::string&, CLI::AppFormatMode) {
    return grouped_help(
        *a,
        "stepbench: the forward, backward, gradient sync and whole training step of a CNN, timed.\n\n"
        "Usage: stepbench [flags]             time the phases (default: Inception-v3 on the device found)\n"
        "       stepbench SUBCOMMAND [flags]  see Subcommands",
        {{"launch", "--nproc N -- [flags]: start N processes of this run on this host (no mpirun)"},
         {"check", "run given weights and input; write the logits, loss and gradients (safetensors)"},
         {"compare", "BASE.json HEAD.json: the regression gate (exit 1 on a regression)"},
         {"make-dataset", "DIR: write a synthetic folder of JPEG or PNG images for --data DIR"},
         {"make-records", "DIR OUT.records: decode and resize a folder once, for --data OUT.records"}},
        "Google Benchmark's own flags pass through as --benchmark_<flag>=<value>, e.g.\n"
        "--benchmark_min_time=2. Booleans are bare flags (--per-layer; --no-overlap turns a default off).\n"
        "docs/flags.md maps tf_cnn_benchmarks' flags to these.\n");
  });
}

}  // namespace stepbench::cli
