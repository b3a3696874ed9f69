#include "bench.hpp"

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <tuple>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "stepbench/error.hpp"
#include "stepbench/data.hpp"
#include "stepbench/process_group.hpp"
#include "stepbench/towers.hpp"

#if defined(STEPBENCH_HAVE_CUDA) && __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define STEPBENCH_NVTX 1
#endif

namespace stepbench::cli {
namespace {

// An NVTX range for Nsight Systems and Nsight Compute (`ncu --nvtx --nvtx-include "step/"`): the
// warm-up and every timed iteration of a phase, named after it. Nothing without CUDA.
struct NvtxRange {
  explicit NvtxRange(const std::string& name) {
#ifdef STEPBENCH_NVTX
    nvtxRangePushA(name.c_str());
#else
    (void)name;
#endif
  }
  ~NvtxRange() {
#ifdef STEPBENCH_NVTX
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double mean(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / v.size(); }
double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / (v.size() - 1));
}

// Every repetition of every benchmark, for the summary; Google Benchmark's console output as usual.
class SummaryReporter final : public benchmark::ConsoleReporter {
 public:
  explicit SummaryReporter(OutputOptions opts) : ConsoleReporter(opts) {}
  struct Rep {
    double device_ms;
    std::map<std::string, double> counters;
  };
  std::map<std::string, std::vector<Rep>> reps;  // by registered name
  std::vector<std::string> errors;

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      if (r.error_occurred) {
        errors.push_back(fmt::format("{}: {}", r.run_name.function_name, r.error_message));
        continue;
      }
      if (r.run_type != Run::RT_Iteration) continue;
      Rep rep{r.GetAdjustedRealTime(), {}};  // manual time, in the benchmark's unit (ms)
      for (const auto& [k, c] : r.counters) rep.counters[k] = c.value;
      reps[r.run_name.function_name].push_back(std::move(rep));
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

std::string prefix_of(const Options& o, std::int64_t batch) {
  return fmt::format("{}/{}/{}/gpus:{}/batch:{}", o.model, o.precision, o.format, o.gpus, batch);
}

// A distinct convolution shape of the model, DeepBench style.
struct ConvShape {
  Shape x;
  std::int64_t cout;
  ConvParams p;
  int count = 0;
  auto key() const {
    return std::make_tuple(x.n, x.c, x.h, x.w, cout, p.kh, p.kw, p.stride_h, p.stride_w, p.pad_h, p.pad_w);
  }
  std::string name() const {
    return fmt::format("conv:{}x{}x{}x{}>{}:k{}x{}:s{}x{}:p{}x{}", x.n, x.c, x.h, x.w, cout, p.kh, p.kw, p.stride_h,
                       p.stride_w, p.pad_h, p.pad_w);
  }
};

std::vector<ConvShape> distinct_convs(const Graph& g) {
  std::vector<ConvShape> v;
  for (const auto& l : g.layers()) {
    if (l.kind != "conv_bn_relu") continue;
    ConvShape s{g.shape_of(l.in[0]), g.shape_of(l.out).c, l.conv};
    auto it = std::find_if(v.begin(), v.end(), [&](const ConvShape& o) { return o.key() == s.key(); });
    if (it == v.end()) {
      s.count = 1;
      v.push_back(s);
    } else {
      ++it->count;
    }
  }
  return v;
}

// Buffers and the op for timing one conv shape alone.
struct ConvRig {
  std::unique_ptr<ConvOp> op;
  Buffer x, y, w, dw, ws;
  TensorDesc xd, yd;
  ConvRig(Backend& be, const ConvShape& s, Layout l, DType t) {
    xd = TensorDesc::dense(s.x, t, l);
    yd = TensorDesc::dense(conv_output_shape(s.x, s.cout, s.p), t, l);
    op = be.make_conv(xd, yd, s.p);
    x = Buffer(be, xd.bytes());
    y = Buffer(be, yd.bytes());
    const std::size_t wn = static_cast<std::size_t>(s.cout * s.x.c * s.p.kh * s.p.kw);
    w = Buffer(be, wn * sizeof(float));
    dw = Buffer(be, wn * sizeof(float));
    ws = Buffer(be, std::max<std::size_t>(op->workspace_bytes(), 1));
    auto& st = be.default_stream();
    if (t == DType::f32) {
      be.fill(st, x.as<float>(), 0.5f, static_cast<std::size_t>(xd.numel()));
      be.fill(st, y.as<float>(), 0.25f, static_cast<std::size_t>(yd.numel()));
    } else {
      be.memset_zero(st, x.get(), xd.bytes());
      be.memset_zero(st, y.get(), yd.bytes());
    }
    be.fill(st, w.as<float>(), 0.01f, wn);
    be.synchronize(st);
  }
};

void add_context(const Options& o, const Towers& t) {
  Backend& be = t.backend(0);
  benchmark::AddCustomContext("stepbench_version", STEPBENCH_VERSION);
  benchmark::AddCustomContext("backend", be.name());
  benchmark::AddCustomContext("device", be.device_name());
  for (const auto& [k, v] : be.versions()) benchmark::AddCustomContext(k, v);
  benchmark::AddCustomContext("model", o.model);
  benchmark::AddCustomContext("image_size", std::to_string(o.image_size));
  benchmark::AddCustomContext("aux_logits", o.aux_logits);
  benchmark::AddCustomContext("precision", o.precision);
  benchmark::AddCustomContext("layout", o.format);
  benchmark::AddCustomContext("gpus", std::to_string(o.gpus));
  benchmark::AddCustomContext("processes", std::to_string(t.processes()));
  benchmark::AddCustomContext("towers_per_process", std::to_string(t.size()));
  benchmark::AddCustomContext("batch_size_per_gpu", std::to_string(o.batch_size));
  benchmark::AddCustomContext("global_batch_size", std::to_string(o.batch_size * o.gpus));
  benchmark::AddCustomContext("variable_update", o.variable_update);
  benchmark::AddCustomContext("optimizer", o.optimizer);
  benchmark::AddCustomContext("warmup_steps", std::to_string(o.warmup));
  benchmark::AddCustomContext("gradient_bytes", std::to_string(t.graph(0).param_arena_floats() * sizeof(float)));
  benchmark::AddCustomContext("sync_buckets", std::to_string(t.bucket_count()));
  benchmark::AddCustomContext("sync_overlap", o.no_overlap ? "off" : "on");
  benchmark::AddCustomContext("collective", t.sync_name());
  benchmark::AddCustomContext("ps_device", o.ps_device);
  benchmark::AddCustomContext("cuda_graph", o.cuda_graph ? "on" : "off");
  benchmark::AddCustomContext("workspace_mb", std::to_string(o.workspace_mb));
  benchmark::AddCustomContext("sync_timeout_s", fmt::format("{:g}", o.sync_timeout_s));
  benchmark::AddCustomContext("parameters", std::to_string(t.graph(0).num_parameters()));
  benchmark::AddCustomContext("forward_macs_per_image", std::to_string(t.graph(0).forward_macs_per_image(false)));
  benchmark::AddCustomContext("data", o.data);
  if (o.data != "synthetic" && o.data != "synthetic-host") {
    benchmark::AddCustomContext("data_threads", std::to_string(o.data_threads));
    benchmark::AddCustomContext("prefetch", std::to_string(o.prefetch));
  }
  if (o.reduced) benchmark::AddCustomContext("reduced_configuration", o.reduced_note);
  // what ran the convolutions, batch norm and pooling, counted per distinct choice (after warm-up:
  // a library that declined a configuration has been replaced by then)
  const auto layers = t.graph(0).layers();
  auto tally = [&](const char* key, const char* kind, std::string LayerInfo::*what) {
    std::map<std::string, int> n;
    for (const auto& l : layers)
      if (l.kind == kind) ++n[l.*what];
    std::string v;
    for (const auto& [impl, count] : n) v += fmt::format("{}{} x {}", v.empty() ? "" : "; ", count, impl);
    if (!v.empty()) benchmark::AddCustomContext(key, v);
  };
  tally("conv_algorithms", "conv_bn_relu", &LayerInfo::conv_algorithm);
  tally("batch_norm_kernels", "conv_bn_relu", &LayerInfo::implementation);
  tally("pool_kernels", "pool", &LayerInfo::implementation);
}

// Where the step's input comes from when it is not the constant device batch.
class Feeder {
 public:
  Feeder(const Options& o, Towers& t) : o_(o), t_(t) {
    if (o.data == "synthetic") return;
    t.enable_staging();
    const Shape s = t.graph(0).input_tensor().shape();
    if (o.data == "synthetic-host") {
      // one host batch, staged to every tower; pinned where the backend pins
      fixed_ = std::make_unique<HostBatch>(static_cast<std::size_t>(s.numel()), static_cast<std::size_t>(s.n),
                                           &t.backend(0));
      std::uint64_t x = 12345;
      for (auto& v : fixed_->images) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        v = static_cast<float>(static_cast<double>(x >> 40) / (1ull << 24) * 2.0 - 1.0);
      }
      for (std::size_t i = 0; i < fixed_->labels.size(); ++i) fixed_->labels[i] = static_cast<std::int32_t>(i % 1000);
      return;
    }
    JpegFolder folder = scan_jpeg_folder(o.data);
    if (folder.classes.size() > 1000)
      throw UsageError(fmt::format("--data {}: {} classes, but the model has 1000 outputs", o.data,
                                   folder.classes.size()));
    files_ = folder.files.size();
    classes_ = folder.classes.size();
    PipelineOptions po;
    po.batch = s.n;
    po.image_size = s.h;
    po.layout = t.options().layout;
    po.threads = o.data_threads;
    po.prefetch = o.prefetch;
    po.pin = &t.backend(0);  // pinned batches: the staging copies are asynchronous DMA on a GPU
    pipe_ = std::make_unique<JpegPipeline>(std::move(folder), po);
  }
  bool active() const { return fixed_ || pipe_; }
  std::string name() const { return pipe_ ? "jpeg" : "synthetic-host"; }
  // Stage the next batch for every tower and make the next step read it.
  void feed() {
    for (int i = 0; i < t_.size(); ++i) {
      if (fixed_) {
        t_.stage(i, fixed_->images.data(), fixed_->labels.data());
      } else {
        auto b = pipe_->next();
        t_.stage(i, b->images.data(), b->labels.data());
        pipe_->recycle(std::move(b));
      }
    }
    t_.flip();
  }
  std::string describe() const {
    if (fixed_) return "synthetic-host (one host batch, copied every step on a copy stream)";
    return fmt::format("{} ({} JPEG files, {} classes; {} decoding thread{}, prefetch {})", o_.data, files_, classes_,
                       o_.data_threads, o_.data_threads == 1 ? "" : "s", o_.prefetch);
  }
  std::string skipped() const {
    if (!pipe_ || pipe_->skipped() == 0) return "";
    std::string ex;
    for (const auto& e : pipe_->skipped_examples()) ex += "\n  " + e;
    return fmt::format("{} unreadable or corrupt file{} skipped (of {} decoded), e.g.:{}", pipe_->skipped(),
                       pipe_->skipped() == 1 ? "" : "s", pipe_->decoded(), ex);
  }

 private:
  const Options& o_;
  Towers& t_;
  std::unique_ptr<HostBatch> fixed_;
  std::unique_ptr<JpegPipeline> pipe_;
  std::size_t files_ = 0, classes_ = 0;
};

benchmark::Counter avg(double total) { return benchmark::Counter(total, benchmark::Counter::kAvgIterations); }
benchmark::Counter rate(double per_iteration) {
  return benchmark::Counter(per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

// The peer's medians by phase (ms), or empty with the reason printed.
std::map<std::string, double> run_peer(const Options& o) {
  std::map<std::string, double> out;
  if (o.peer.empty()) return out;
  // beside the binary in a bundle (bin/../bench), else in the source tree it was built from
  std::string script = std::string(STEPBENCH_SOURCE_DIR) + "/bench/torch_peer.py";
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && std::filesystem::exists(exe.parent_path().parent_path() / "bench" / "torch_peer.py", ec))
    script = (exe.parent_path().parent_path() / "bench" / "torch_peer.py").string();
  const std::string cmd = fmt::format(
      "'{}' '{}' --model {} --batch-size {} --image-size {} --format {} --aux-logits {} --device {} --warmup {} "
      "--repetitions {} --precision {}",
      o.peer_python, script, o.model, o.batch_size, o.image_size, o.format, o.aux_logits,
      o.backend == "cuda" ? "cuda" : "cpu", o.warmup, o.repetitions, o.precision);
  std::cerr << "stepbench: timing the peer: " << cmd << "\n";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) {
    std::cerr << "stepbench: the peer did not start\n";
    return out;
  }
  std::string text;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) text.append(buf, n);
  const int rc = pclose(f);
  if (rc != 0) {
    std::cerr << fmt::format("stepbench: the peer exited with status {} (77: torch missing); no ratios\n",
                             WIFEXITED(rc) ? WEXITSTATUS(rc) : rc);
    return out;
  }
  try {
    // the peer prints one JSON object on its last line
    const auto nl = text.find_last_of('\n', text.size() >= 2 ? text.size() - 2 : 0);
    const auto j = nlohmann::json::parse(nl == std::string::npos ? text : text.substr(nl + 1));
    for (const auto& [k, v] : j.items())
      if (v.is_number() && k != "threads") out[k] = v.get<double>();
    std::cerr << "stepbench: peer: PyTorch " << j.value("torch", std::string("?")) << ", "
              << j.value("threads", 0) << " threads\n";
  } catch (const std::exception& e) {
    std::cerr << "stepbench: the peer's output was not JSON (" << e.what() << ")\n";
  }
  return out;
}

void print_summary(const Options& o, const Towers& t, const SummaryReporter& rep, const std::string& prefix,
                   const std::map<std::string, double>& peer, const Feeder& feeder) {
  auto find = [&](const std::string& phase) -> const std::vector<SummaryReporter::Rep>* {
    auto it = rep.reps.find(prefix + "/" + phase);
    return it == rep.reps.end() ? nullptr : &it->second;
  };
  auto med = [&](const std::vector<SummaryReporter::Rep>& r, const std::string& counter) {
    std::vector<double> v;
    for (const auto& x : r) {
      if (counter.empty()) {
        v.push_back(x.device_ms);
      } else {
        auto it = x.counters.find(counter);
        if (it != x.counters.end()) v.push_back(it->second);
      }
    }
    return median(v);
  };
  const auto* step = find("step");
  const double step_ms = step ? med(*step, "") : NAN;
  const std::int64_t images = o.batch_size * o.gpus;
  std::cout << fmt::format("\nstepbench summary: {} on {} ({}), {} {} {}, {} x batch {} = {} images per step, "
                           "variable update {}\n",
                           o.model, t.backend(0).name(), t.backend(0).device_name(), o.precision, o.format,
                           o.image_size == 0 ? "" : fmt::format("{}x{}", o.image_size, o.image_size), o.gpus,
                           o.batch_size, images, o.variable_update);
  std::cout << fmt::format("medians of {} repetitions, device time, after {} warm-up steps\n", o.repetitions,
                           o.warmup);
  std::cout << fmt::format("{:<24} {:>11} {:>11} {:>11} {:>9} {:>7} {:>11}{}\n", "phase", "median ms", "images/s",
                           "host ms", "gap ms", "cv %", "% of step",
                           peer.empty() ? "" : fmt::format(" {:>11} {:>14}", "PyTorch ms", "stepbench/PT"));
  std::vector<std::string> warnings;
  std::vector<std::string> rows = all_phases();
  if (feeder.active()) rows.push_back("step:data=" + feeder.name());
  if (o.cuda_graph) {
    rows.push_back("forward:cuda_graph");
    rows.push_back("step:cuda_graph");
  }
  for (const auto& ph : rows) {
    const auto* r = find(ph);
    if (!r || r->empty()) continue;
    std::vector<double> ms;
    for (const auto& x : *r) ms.push_back(x.device_ms);
    const double m = median(ms), cv = ms.size() > 1 ? 100.0 * stddev(ms) / mean(ms) : 0.0;
    if (cv > 5.0) warnings.push_back(fmt::format("{}: cv {:.1f}% over {} repetitions", ph, cv, ms.size()));
    const bool per_image = ph != "grad_sync" && ph != "update";  // input_pipeline: images delivered per second
    std::string peer_cols;
    if (!peer.empty()) {
      auto it = peer.find(ph);
      peer_cols = it == peer.end() || o.gpus != 1
                      ? fmt::format(" {:>11} {:>14}", "-", "-")
                      : fmt::format(" {:>11.3f} {:>14.2f}", it->second, m / it->second);
    }
    std::cout << fmt::format("{:<24} {:>11.3f} {:>11} {:>11.3f} {:>9.3f} {:>7.1f} {:>11}{}\n", ph, m,
                             per_image ? fmt::format("{:.1f}", 1000.0 * images / m) : "-", med(*r, "host_ms"),
                             med(*r, "gap_ms"), cv,
                             std::isnan(step_ms) ? "-" : fmt::format("{:.1f}", 100.0 * m / step_ms), peer_cols);
  }
  if (step) {
    const double f = med(*step, "forward_ms"), b = med(*step, "backward_ms"), s = med(*step, "sync_ms"),
                 u = med(*step, "update_ms");
    std::cout << fmt::format(
        "inside the step: forward {:.3f} ms, backward {:.3f} ms, sync {:.3f} ms, update {:.3f} ms; "
        "backward:forward {:.2f}, sync share {:.1f}% of the step\n",
        f, b, s, u, b / f, 100.0 * s / step_ms);
  }
  if (const auto* fb = find("forward_backward")) {
    const double f = med(*fb, "forward_ms"), b = med(*fb, "backward_ms");
    std::cout << fmt::format("forward_backward alone: forward {:.3f} ms, backward {:.3f} ms, backward:forward {:.2f}\n",
                             f, b, b / f);
  }
  if (const auto* gs = find("grad_sync")) {
    std::cout << fmt::format("grad_sync: {:.1f} MB in {} buckets over {} ({}); algbw {:.2f} GB/s, busbw {:.2f} GB/s; "
                             "in the step, overlap with backward {}\n",
                             t.sync_bytes() / 1e6, t.bucket_count(), t.sync_name(), o.variable_update,
                             med(*gs, "algbw_GB/s"), med(*gs, "busbw_GB/s"), o.no_overlap ? "off" : "on");
  } else if (t.sync_bytes() == 0) {
    std::cout << fmt::format("grad_sync: nothing to synchronise ({}), not timed\n",
                             t.global_size() < 2 ? "one tower" : "independent towers");
  }
  if (feeder.active()) {
    std::cout << "input: " << feeder.describe() << "\n";
    const auto* pipe = find("input_pipeline");
    const auto* fed = find("step:data=" + feeder.name());
    const double S = step ? 1000.0 * images / step_ms : NAN;
    const double P = pipe ? 1000.0 * images / med(*pipe, "") : NAN;
    const double D = fed ? 1000.0 * images / med(*fed, "") : NAN;
    if (!std::isnan(P) && !std::isnan(S)) {
      if (P < S)
        std::cout << fmt::format(
            "verdict: INPUT-BOUND. The input pipeline delivers {:.1f} images/s; the step could take {:.1f} images/s "
            "(synthetic data). Fed by the pipeline the step ran at {:.1f} images/s, {:.2f}x slower than with "
            "synthetic data. More --data-threads, smaller JPEGs or a faster decoder would help.\n",
            P, S, D, S / D);
      else
        std::cout << fmt::format(
            "verdict: not input-bound. The input pipeline delivers {:.1f} images/s, {:.2f}x what the step takes "
            "({:.1f} images/s with synthetic data); fed by it the step ran at {:.1f} images/s ({:.2f}x the "
            "synthetic step time).\n",
            P, P / S, S, D, S / D);
    } else {
      std::cout << "verdict: needs both the step and input_pipeline phases\n";
    }
    if (o.backend == "cpu")
      std::cout << "note: on the cpu backend the decoding threads share the cores with the model, so the fed step "
                   "is slower than the synthetic one even when the pipeline alone keeps up\n";
    if (const std::string sk = feeder.skipped(); !sk.empty()) std::cout << "input: " << sk << "\n";
  }
  for (const auto& w : warnings) std::cout << "WARNING: " << w << " (> 5%: the machine is noisy; more --repetitions "
                                                             "or a quieter machine)\n";
  for (const auto& e : rep.errors) std::cout << "ERROR: " << e << "\n";
  if (o.reduced) std::cout << "note: " << o.reduced_note << "\n";
}

}  // namespace

int run_benchmarks(Options& o, const char* argv0) {
  TowerOptions to;
  to.backend = o.backend;
  to.towers = o.gpus;
  to.batch_per_tower = o.batch_size;
  to.model = o.model;
  to.model_options.image_size = o.image_size;
  to.model_options.aux_logits = o.aux_logits == "on";
  to.layout = parse_layout(o.format);
  to.dtype = o.precision == "tf32" ? DType::f32 : parse_dtype(o.precision);
  to.tf32 = o.precision == "tf32";
  to.optimizer.kind = parse_optimizer(o.optimizer);
  to.optimizer.lr = static_cast<float>(o.learning_rate);
  to.optimizer.weight_decay = static_cast<float>(o.weight_decay);
  to.variable_update = parse_variable_update(o.variable_update);
  to.bucket_bytes = static_cast<std::size_t>(o.bucket_mb * (1 << 20));
  to.overlap = !o.no_overlap;
  to.ps_on_host = o.ps_device == "cpu";
  to.sync_timeout_s = o.sync_timeout_s;
  to.workspace_bytes = static_cast<std::size_t>(o.workspace_mb) << 20;
  // Under mpirun every process builds --gpus towers; names, images/s and the summary count them all.
  const ProcessGroup& pg = process_group();
  const bool root = pg.rank == 0;
  o.gpus *= pg.size;
  const std::string prefix = prefix_of(o, o.batch_size);

  // Google Benchmark's flags first, so a bad one fails before minutes of set-up.
  std::vector<std::string> gb_args = {argv0};
  for (const auto& a : o.benchmark_args) gb_args.push_back(a);
  if (!o.json.empty() && root) {
    gb_args.push_back("--benchmark_out=" + o.json);
    gb_args.push_back("--benchmark_out_format=json");
  }
  std::vector<char*> gb_argv;
  for (auto& a : gb_args) gb_argv.push_back(a.data());
  int gb_argc = static_cast<int>(gb_argv.size());
  benchmark::Initialize(&gb_argc, gb_argv.data());
  if (benchmark::ReportUnrecognizedArguments(gb_argc, gb_argv.data())) return 2;

  std::vector<std::string> phases = o.phases.empty() ? all_phases() : o.phases;
  if (o.data == "synthetic") phases.erase(std::remove(phases.begin(), phases.end(), "input_pipeline"), phases.end());
  if (root)
    std::cerr << fmt::format("stepbench: {} x {} on {}{}, batch {} per tower, {}x{} {} {}{}\n", o.gpus, o.model,
                             o.backend,
                             pg.size > 1 ? fmt::format(" ({} processes x {} towers, MPI)", pg.size, to.towers) : "",
                             o.batch_size, o.image_size, o.image_size, o.precision, o.format,
                             o.reduced ? fmt::format(" [{}]", o.reduced_note) : "");
  Towers towers(to);
  towers.set_synthetic_batch(42);
  const Graph& g0 = towers.graph(0);
  const double fwd_flops = 2.0 * static_cast<double>(g0.forward_macs_per_image(false));
  const double train_fwd_flops = 2.0 * static_cast<double>(g0.forward_macs_per_image(true));
  const double images = static_cast<double>(o.batch_size * o.gpus);

  Feeder feeder(o, towers);
  const bool data_step = feeder.active() && std::find(phases.begin(), phases.end(), "step") != phases.end();
  if (o.list) {
    if (!root) return 0;
    for (const auto& p : phases)
      if (p != "grad_sync" || towers.sync_bytes() > 0) std::cout << prefix << "/" << p << "\n";
    if (data_step) std::cout << prefix << "/step:data=" << feeder.name() << "\n";
    if (o.cuda_graph)
      for (const char* p : {"forward", "step"})
        if (std::find(phases.begin(), phases.end(), p) != phases.end()) std::cout << prefix << "/" << p << ":cuda_graph\n";
    if (o.per_layer)
      for (const auto& c : distinct_convs(g0))
        for (const char* k : {"fwd", "bwd_data", "bwd_filter"}) std::cout << prefix << "/" << c.name() << "/" << k << "\n";
    return 0;
  }

  // Warm-up: algorithm choice, first touch of every buffer, caches. Never fewer than one step.
  for (int i = 0; i < std::max(o.warmup, 1); ++i) {
    NvtxRange r("warmup");
    towers.step();
    towers.forward_inference();
  }
  towers.synchronize();
  if (!std::isfinite(towers.loss(0)))
    std::cerr << "stepbench: warning: the loss is not finite after warm-up (" << towers.loss(0) << ")\n";
  add_context(o, towers);

  auto reg = [&](const std::string& name, auto body) {
    benchmark::RegisterBenchmark(name.c_str(), body)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Repetitions(o.repetitions);  // mean, median, stddev and cv aggregates
  };

  for (const auto& ph : phases) {
    if (ph == "grad_sync" && towers.sync_bytes() == 0) continue;  // nothing moves: reported in the summary
    if (ph == "input_pipeline") continue;                          // registered below, after the model phases
    reg(prefix + "/" + ph, [&, ph](benchmark::State& st) {
      const bool fb = ph == "forward_backward", step = ph == "step";
      RegionTimer rt(towers, step ? 5 : fb ? 3 : 2);
      double host = 0, dev = 0, f = 0, b = 0, s = 0, u = 0;
      for (auto _ : st) {
        NvtxRange r(ph);
        rt.start();
        if (ph == "forward") {
          towers.forward_inference();
        } else if (ph == "forward_train") {
          towers.forward_train();
        } else if (fb) {
          towers.forward_train();
          rt.mark(1);
          towers.backward();
        } else if (step) {
          towers.forward_train();
          rt.mark(1);
          towers.backward(/*start_sync=*/true);  // buckets sync as backward produces them (unless --no-overlap)
          rt.mark(2);
          towers.grad_sync();
          rt.mark(3);
          towers.update();
        } else if (ph == "grad_sync") {
          towers.grad_sync();
        } else if (ph == "update") {
          towers.update();
        }
        rt.stop();
        const int last = step ? 4 : fb ? 2 : 1;
        const double d = rt.device_ms(0, last);
        st.SetIterationTime(allreduce_max(d) / 1e3);  // every process agrees: the slowest
        dev += d;
        host += rt.host_ms();
        if (fb || step) {
          f += rt.device_ms(0, 1);
          b += rt.device_ms(1, 2);
        }
        if (step) {
          s += rt.device_ms(2, 3);
          u += rt.device_ms(3, 4);
        }
      }
      st.counters["host_ms"] = avg(host);
      st.counters["gap_ms"] = avg(host - dev);
      if (fb || step) {
        st.counters["forward_ms"] = avg(f);
        st.counters["backward_ms"] = avg(b);
      }
      if (step) {
        st.counters["sync_ms"] = avg(s);
        st.counters["update_ms"] = avg(u);
      }
      if (ph == "forward") {
        st.counters["images/s"] = rate(images);
        st.counters["TFLOP/s"] = rate(images * fwd_flops / 1e12);
      } else if (ph == "forward_train") {
        st.counters["images/s"] = rate(images);
        st.counters["TFLOP/s"] = rate(images * train_fwd_flops / 1e12);
      } else if (fb || step) {
        st.counters["images/s"] = rate(images);
        st.counters["TFLOP/s"] = rate(images * 3.0 * train_fwd_flops / 1e12);  // backward ~ 2x forward
      } else if (ph == "grad_sync") {
        const double gb = static_cast<double>(towers.sync_bytes()) / 1e9;
        st.counters["algbw_GB/s"] = rate(gb);
        st.counters["busbw_GB/s"] = rate(gb * towers.bus_factor());
        st.counters["bytes"] = static_cast<double>(towers.sync_bytes());
        st.counters["buckets"] = static_cast<double>(towers.bucket_count());
      } else if (ph == "update") {
        st.counters["params/s"] = rate(static_cast<double>(g0.num_parameters()) * towers.size());
      }
    });
  }

  // CUDA Graphs: the same step and forward, captured once after warm-up and replayed as one launch,
  // so the difference to the rows above is the launch overhead the graph removes.
  if (o.cuda_graph) {
    for (const std::string ph : {"forward", "step"}) {
      if (std::find(phases.begin(), phases.end(), ph) == phases.end()) continue;
      const bool is_step = ph == "step";
      towers.capture(is_step);
      towers.replay(is_step);  // once untimed: the first launch uploads the graph
      towers.synchronize();
      reg(prefix + "/" + ph + ":cuda_graph", [&, is_step, ph](benchmark::State& st) {
        RegionTimer rt(towers, 2);
        double host = 0, dev = 0;
        for (auto _ : st) {
          NvtxRange r(ph + ":cuda_graph");
          rt.start();
          towers.replay(is_step);
          rt.stop();
          const double d = rt.device_ms(0, 1);
          st.SetIterationTime(allreduce_max(d) / 1e3);
          dev += d;
          host += rt.host_ms();
        }
        st.counters["host_ms"] = avg(host);
        st.counters["gap_ms"] = avg(host - dev);
        st.counters["images/s"] = rate(images);
        st.counters["TFLOP/s"] = rate(images * (is_step ? 3.0 * train_fwd_flops : fwd_flops) / 1e12);
      });
    }
  }

  // Input: the pipeline alone, then the step fed by it. Both are timed on the host clock: waiting
  // for input is what they measure. (Registered last: afterwards the graphs read staged batches.)
  if (feeder.active() && std::find(phases.begin(), phases.end(), "input_pipeline") != phases.end()) {
    reg(prefix + "/input_pipeline", [&](benchmark::State& st) {
      double host = 0;
      for (auto _ : st) {
        const auto t0 = std::chrono::steady_clock::now();
        feeder.feed();
        towers.synchronize();
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        st.SetIterationTime(allreduce_max(ms) / 1e3);
        host += ms;
      }
      st.counters["host_ms"] = avg(host);
      st.counters["gap_ms"] = avg(0.0);
      st.counters["images/s"] = rate(images);
    });
  }
  if (data_step) {
    reg(prefix + "/step:data=" + feeder.name(), [&](benchmark::State& st) {
      feeder.feed();  // the first batch
      RegionTimer rt(towers, 3);
      double host = 0, dev = 0;
      for (auto _ : st) {
        const auto t0 = std::chrono::steady_clock::now();
        rt.start();
        towers.step();
        rt.mark(1);
        feeder.feed();  // on a GPU the copy overlaps the step just launched; the host waits for the batch
        rt.stop();
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        st.SetIterationTime(allreduce_max(ms) / 1e3);
        host += ms;
        dev += rt.device_ms(0, 1);
      }
      st.counters["host_ms"] = avg(host);
      st.counters["device_ms"] = avg(dev);
      st.counters["gap_ms"] = avg(host - dev);
      st.counters["images/s"] = rate(images);
      st.counters["TFLOP/s"] = rate(images * 3.0 * train_fwd_flops / 1e12);
    });
  }

  std::vector<std::unique_ptr<ConvRig>> rigs;
  if (o.per_layer) {
    Backend& be = towers.backend(0);
    for (const auto& c : distinct_convs(g0)) {
      rigs.push_back(std::make_unique<ConvRig>(be, c, to.layout, to.dtype));
      ConvRig* rig = rigs.back().get();
      const double macs = static_cast<double>(conv_output_shape(c.x, c.cout, c.p).numel()) * c.p.kh * c.p.kw * c.x.c;
      for (const std::string kind : {"fwd", "bwd_data", "bwd_filter"}) {
        reg(prefix + "/" + c.name() + "/" + kind, [&be, rig, kind, macs, count = c.count](benchmark::State& st) {
          auto& s = be.default_stream();
          auto run = [&] {
            const Tensor x{rig->x.get(), rig->xd}, y{rig->y.get(), rig->yd};
            if (kind == "fwd") rig->op->forward(s, x, rig->w.get(), y, rig->ws.get());
            else if (kind == "bwd_data") rig->op->backward_data(s, y, rig->w.get(), x, 0.0f, rig->ws.get());
            else rig->op->backward_filter(s, x, y, rig->dw.get(), rig->ws.get());
          };
          run();  // warm-up
          be.synchronize(s);
          auto e0 = be.create_event(), e1 = be.create_event();
          for (auto _ : st) {
            be.record(*e0, s);
            run();
            be.record(*e1, s);
            be.synchronize(s);
            st.SetIterationTime(allreduce_max(be.elapsed_ms(*e0, *e1)) / 1e3);
          }
          st.counters["MACs"] = macs;
          st.counters["GFLOP/s"] = rate(2.0 * macs / 1e9);
          st.counters["layers"] = count;
        });
      }
    }
  }

  // Colour only on a terminal: logs and CI output stay plain text.
  SummaryReporter reporter(isatty(fileno(stdout)) ? benchmark::ConsoleReporter::OO_ColorTabular
                                                  : benchmark::ConsoleReporter::OO_Tabular);
  std::ofstream devnull("/dev/null");
  if (!root) {  // one report, from process 0 (every process times the same, slowest-rank figures)
    reporter.SetOutputStream(&devnull);
    reporter.SetErrorStream(&devnull);
  }
  benchmark::RunSpecifiedBenchmarks(&reporter);
  if (!root) {
    benchmark::Shutdown();
    return reporter.errors.empty() ? 0 : 1;
  }
  const auto peer = pg.size > 1 ? std::map<std::string, double>{} : run_peer(o);
  print_summary(o, towers, reporter, prefix, peer, feeder);
  if (!peer.empty())
    std::cout << "peer: PyTorch (bench/torch_peer.py), same model, batch, layout and warm-up, timed on the host with "
                 "a device synchronise; stepbench/PT < 1 means stepbench is faster"
              << (o.gpus != 1 ? "; ratios only for --gpus 1" : "") << "\n";
  benchmark::Shutdown();
  return reporter.errors.empty() ? 0 : 1;
}

}  // namespace stepbench::cli
