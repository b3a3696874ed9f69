// The configuration and the machine in Google Benchmark's JSON context, so that a result file says
// what produced it.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <map>
#include <string>

#include "bench/report.hpp"

namespace stepbench {

void add_context(const BenchConfig& c, const Towers& t) {
  const auto& r = c.run;
  const int gpus = t.global_size();
  Backend& be = t.backend(0);
  benchmark::AddCustomContext("stepbench_version", STEPBENCH_VERSION);
  benchmark::AddCustomContext("backend", be.name());
  benchmark::AddCustomContext("device", be.device_name());
  for (const auto& [k, v] : be.versions()) benchmark::AddCustomContext(k, v);
  benchmark::AddCustomContext("model", std::string(to_string(r.model)));
  benchmark::AddCustomContext("image_size", std::to_string(r.model_options.image_size));
  benchmark::AddCustomContext("aux_logits", r.model_options.aux_logits ? "on" : "off");
  benchmark::AddCustomContext("precision", std::string(to_string(r.precision)));
  benchmark::AddCustomContext("layout", std::string(to_string(r.layout)));
  benchmark::AddCustomContext("gpus", std::to_string(gpus));
  benchmark::AddCustomContext("processes", std::to_string(t.processes()));
  benchmark::AddCustomContext("towers_per_process", std::to_string(t.size()));
  benchmark::AddCustomContext("batch_size_per_gpu", std::to_string(r.batch_per_tower));
  benchmark::AddCustomContext("global_batch_size", std::to_string(r.batch_per_tower * gpus));
  benchmark::AddCustomContext("variable_update", std::string(to_string(r.variable_update)));
  benchmark::AddCustomContext("optimizer", std::string(to_string(r.optimizer.kind)));
  benchmark::AddCustomContext("warmup_steps", std::to_string(c.warmup));
  benchmark::AddCustomContext("gradient_bytes", std::to_string(t.graph(0).param_arena_floats() * sizeof(float)));
  benchmark::AddCustomContext("sync_buckets", std::to_string(t.bucket_count()));
  benchmark::AddCustomContext("sync_overlap", r.overlap ? "on" : "off");
  benchmark::AddCustomContext("collective", t.sync_name());
  benchmark::AddCustomContext("ps_device", r.ps_on_host ? "cpu" : "device");
  benchmark::AddCustomContext("cuda_graph", c.cuda_graph ? "on" : "off");
  benchmark::AddCustomContext("workspace_mb", std::to_string(r.workspace_bytes >> 20));
  benchmark::AddCustomContext("sync_timeout_s", fmt::format("{:g}", r.sync_timeout_s));
  benchmark::AddCustomContext("parameters", std::to_string(t.graph(0).num_parameters()));
  benchmark::AddCustomContext("forward_macs_per_image", std::to_string(t.graph(0).forward_macs_per_image(false)));
  benchmark::AddCustomContext("data", c.data_name());
  if (c.data == DataKind::jpeg_folder) {
    benchmark::AddCustomContext("data_threads", std::to_string(c.data_threads));
    benchmark::AddCustomContext("prefetch", std::to_string(c.prefetch));
  }
  if (c.reduced()) benchmark::AddCustomContext("reduced_configuration", c.reduced_note);
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

}  // namespace stepbench
