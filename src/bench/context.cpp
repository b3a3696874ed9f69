// The configuration and the machine in Google Benchmark's JSON context, so that a result file says
// what produced it; the same with every repetition as one line of a --history file.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>

#include "bench/report.hpp"
#include "compare/compare.hpp"

namespace stepbench {

std::vector<std::pair<std::string, std::string>> run_context(const BenchConfig& c, const Towers& t) {
  std::vector<std::pair<std::string, std::string>> ctx;
  auto add = [&](const std::string& k, const std::string& v) { ctx.emplace_back(k, v); };
  const auto& r = c.run;
  const int gpus = t.global_size();
  Backend& be = t.backend(0);
  add("stepbench_version", STEPBENCH_VERSION);
  if (!c.revision.empty()) add("revision", c.revision);
  add("backend", be.name());
  add("device", be.device_name());
  for (const auto& [k, v] : be.versions()) add(k, v);
  add("model", std::string(to_string(r.model)));
  add("image_size", std::to_string(r.model_options.image_size));
  add("aux_logits", r.model_options.aux_logits ? "on" : "off");
  add("precision", std::string(to_string(r.precision)));
  add("layout", std::string(to_string(r.layout)));
  add("recompute", recomputes(r.recompute, be.kind()) ? "on" : "off");
  add("fuse", std::string(to_string(r.fuse)));
  add("gpus", std::to_string(gpus));
  add("processes", std::to_string(t.processes()));
  add("towers_per_process", std::to_string(t.size()));
  add("batch_size_per_gpu", std::to_string(r.batch_per_tower));
  add("global_batch_size", std::to_string(r.batch_per_tower * gpus));
  add("variable_update", std::string(to_string(r.variable_update)));
  add("optimizer", std::string(to_string(r.optimizer.kind)));
  add("warmup_steps", std::to_string(c.warmup));
  add("gradient_bytes", std::to_string(t.graph(0).param_arena_floats() * sizeof(float)));
  add("sync_buckets", std::to_string(t.bucket_count()));
  add("sync_overlap", r.overlap ? "on" : "off");
  add("collective", t.sync_name());
  add("ps_device", r.ps_on_host ? "cpu" : "device");
  add("cuda_graph", c.cuda_graph ? "on" : "off");
  add("workspace_mb", std::to_string(r.workspace_bytes >> 20));
  add("sync_timeout_s", fmt::format("{:g}", r.sync_timeout_s));
  add("parameters", std::to_string(t.graph(0).num_parameters()));
  add("forward_macs_per_image", std::to_string(t.graph(0).forward_macs_per_image(false)));
  add("data", c.data_name());
  if (c.data_files()) {
    add("data_kind", std::string(to_string(c.data)));
    add("data_threads", std::to_string(c.data_threads));
    add("prefetch", std::to_string(c.prefetch));
    add("data_cache", c.cache == InputCache::memory ? "memory" : "none");
    add("data_decode", std::string(to_string(c.decode)));
  }
  if (c.reduced()) add("reduced_configuration", c.reduced_note);
  // what ran the convolutions, batch norm and pooling, counted per distinct choice (after warm-up:
  // a library that declined a configuration has been replaced by then)
  const auto layers = t.graph(0).layers();
  auto tally = [&](const char* key, auto counted, std::string LayerInfo::*what) {
    std::map<std::string, int> n;
    for (const auto& l : layers)
      if (counted(l)) ++n[l.*what];
    std::string v;
    for (const auto& [impl, count] : n) v += fmt::format("{}{} x {}", v.empty() ? "" : "; ", count, impl);
    if (!v.empty()) add(key, v);
  };
  const auto conv = [](const LayerInfo& l) { return l.is_conv_bn() || l.kind == "conv"; };
  const auto bn = [](const LayerInfo& l) { return l.is_conv_bn() || l.kind == "bn_relu" || l.kind == "bn"; };
  tally("conv_algorithms", conv, &LayerInfo::conv_algorithm);
  tally("batch_norm_kernels", bn, &LayerInfo::implementation);
  tally(
      "pool_kernels", [](const LayerInfo& l) { return l.kind == "pool"; }, &LayerInfo::implementation);
  tally(
      "linear_kernels", [](const LayerInfo& l) { return l.kind == "linear" && !l.implementation.empty(); },
      &LayerInfo::implementation);
  if (r.fuse == Fuse::on) {  // --fuse: which units' outputs are not stored, who loads them, what runs them
    int units = 0, unstored = 0, convs = 0, adds = 0;
    for (const auto& l : layers) {
      units += l.is_conv_bn();
      unstored += l.is_conv_bn() && !l.stored;
      for (const auto& from : l.loads) (l.kind == "add_relu" ? adds : convs) += !from.empty();
    }
    add("fused_units", fmt::format("{} of {} conv + BN outputs not stored, loaded through their batch norm by {} "
                                   "convolutions and {} residual-add inputs",
                                   unstored, units, convs, adds));
    tally(
        "fused_pieces", [](const LayerInfo& l) { return !l.fused.empty(); }, &LayerInfo::fused);
  }
  return ctx;
}

void add_context(const BenchConfig& c, const Towers& t) {
  for (const auto& [k, v] : run_context(c, t)) benchmark::AddCustomContext(k, v);
}

void append_history(const BenchConfig& c, const Towers& t, const SummaryReporter& rep) {
  compare::Run run;
  for (const auto& [k, v] : run_context(c, t)) run.context[k] = v;
  // Google Benchmark's own context keys of the machine, which the fingerprint includes
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) run.context["host_name"] = host;
  run.context["num_cpus"] = std::to_string(benchmark::CPUInfo::Get().num_cpus);
  for (const auto& name : rep.order) {
    compare::Series& s = run.benchmarks[name];
    run.order.push_back(name);
    for (const auto& r : rep.reps.at(name)) {
      s.ms.push_back(r.device_ms);
      if (auto it = r.counters.find("throttled"); it != r.counters.end() && it->second > 0) ++s.throttled;
      if (auto it = r.counters.find("layers"); it != r.counters.end()) s.layers = it->second;
    }
    if (auto it = rep.labels.find(name); it != rep.labels.end()) s.label = it->second;
  }
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::ofstream f(c.history, std::ios::app);
  if (!(f << compare::history_record(run, when) << "\n"))
    throw std::runtime_error(fmt::format("cannot append to the history {}", c.history));
}

}  // namespace stepbench
