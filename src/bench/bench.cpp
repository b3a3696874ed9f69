#include "bench/bench.hpp"

#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>

#include "bench/feeder.hpp"
#include "bench/gpu_state.hpp"
#include "bench/input_report.hpp"
#include "bench/interrupt.hpp"
#include "bench/layer_times.hpp"
#include "bench/nvtx.hpp"
#include "bench/peer.hpp"
#include "bench/peer_layers.hpp"
#include "bench/per_layer.hpp"
#include "bench/phases.hpp"
#include "bench/projection.hpp"
#include "bench/region_timer.hpp"
#include "bench/report.hpp"
#include "bench/run_parts.hpp"
#include "bench/stats.hpp"
#include "bench/suggest.hpp"

namespace stepbench {

int run_benchmarks(const BenchConfig& c, const ProcessGroup& group, const char* argv0,
                   const std::vector<std::string>& peer_dirs) {
  const auto& r = c.run;
  const bool root = group.rank() == 0;
  // Under mpirun every process builds its towers; names, images/s and the summary count them all.
  const int gpus = r.towers * group.size();
  const std::string prefix = fmt::format("{}/{}/{}/gpus:{}/batch:{}", to_string(r.model), to_string(r.precision),
                                         to_string(r.layout), gpus, r.batch_per_tower);
  BenchmarkArgv benchmark_argv;  // alive until Google Benchmark's run and Shutdown are over
  if (!init_google_benchmark(c, root, argv0, benchmark_argv)) return 2;
  if (!c.history.empty() && root) {  // a path that cannot be appended to fails now, not after the run
    std::ofstream h(c.history, std::ios::app);
    if (!h) {
      std::cerr << "stepbench: --history " << c.history << " cannot be appended to; give a file in a writable folder\n";
      return 2;
    }
  }
  const std::string trace = c.trace.empty() || root ? c.trace : fmt::format("{}.rank{}", c.trace, group.rank());
  if (!trace.empty()) {  // likewise a trace that cannot be written (a test file beside it, removed)
    std::ofstream t(trace + ".partial");
    if (!t) {
      std::cerr << "stepbench: --trace " << trace << " cannot be written; give a file in a writable folder\n";
      return 2;
    }
    std::remove((trace + ".partial").c_str());
  }
  // the peer's Python first too: a missing torch is found before the benchmarks, not after
  std::string peer_python;
  if (!c.project_gpus.empty() && group.size() > 1) {
    if (root)
      std::cerr << "stepbench: --project-gpus starts from one GPU's step in one process; drop it under mpirun\n";
    return 2;
  }
  if (c.peer != PeerKind::none && group.size() > 1) {
    if (root) std::cerr << "stepbench: --peer runs PyTorch in one process; drop it under mpirun\n";
    return 2;
  }
  if (c.peer != PeerKind::none && !c.list) {
    peer_python = choose_peer_python(c);
    if (peer_python.empty()) return 2;
  }

  std::vector<Phase> phases = c.phases;
  if (phases.empty())
    for (const auto& n : names_of<Phase>()) phases.push_back(*try_parse_enum<Phase>(n));
  if (c.data == DataKind::synthetic) std::erase(phases, Phase::input_pipeline);
  if (root)
    std::cerr << fmt::format(
        "stepbench: {} x {} on {}{}, batch {} per tower, {}x{} {} {}{}\n", gpus, to_string(r.model),
        to_string(r.backend),
        group.size() > 1 ? fmt::format(" ({} processes x {} towers, MPI)", group.size(), r.towers) : "",
        r.batch_per_tower, r.model_options.image_size, r.model_options.image_size, to_string(r.precision),
        to_string(r.layout), c.reduced() ? fmt::format(" [{}]", c.reduced_note) : "");
  const ResidentMemory resident_before = resident_memory();
  Towers towers(r);
  if (!c.plan_cache.empty() && r.plans && root) r.plans->save(c.plan_cache);  // kept even if the run fails later
  towers.set_synthetic_batch(42);
  const Graph& g0 = towers.graph(0);
  const Flops fl{2.0 * static_cast<double>(g0.forward_macs_per_image(false)),
                 2.0 * static_cast<double>(g0.forward_macs_per_image(true))};
  const double images = static_cast<double>(r.batch_per_tower * gpus);

  Feeder feeder(c, towers);
  const bool data_step = feeder.active() && has(phases, Phase::step);
  if (c.list) {
    if (root) list_names(c, towers, phases, prefix, feeder, data_step);
    return 0;
  }

  // Warm-up: algorithm choice, first touch of every buffer, caches. Never fewer than one step.
  const Interrupt stop(c.interrupt, group);
  for (int i = 0; i < std::max(c.warmup, 1) && !(group.size() == 1 && stop.local()); ++i) {
    NvtxRange nv("warmup");
    towers.step();
    towers.forward_inference();
  }
  towers.synchronize();
  if (stop.agreed()) {
    if (root) std::cerr << "stepbench: cut short by " << stop.name() << " during warm-up: nothing was measured\n";
    return 128 + stop.signal();
  }
  {  // timing NaN arithmetic measures something else: a blown-up warm-up stops here (every process)
    const std::string bad = numeric_trouble(towers);
    if (group.allreduce_max(bad.empty() ? 0.0 : 1.0) > 0) {
      std::cerr << "stepbench: the numbers stopped being finite during warm-up: "
                << (bad.empty() ? "on another process" : bad) << "; nothing was timed\n";
      return 1;
    }
  }
  add_context(c, towers);

  auto reg = [&](const std::string& name, auto body) {
    benchmark::RegisterBenchmark(name.c_str(),
                                 [&stop, &towers, &group, body, name](benchmark::State& st) {
                                   if (stop.skip(st)) return;  // after a signal or a blow-up: marked, not run
                                   body(st);
                                   // outside the timed loop: did this phase blow the numbers up? Every
                                   // process answers together, so that all of them mark this fixture
                                   // (Google Benchmark then calls it the same number of times on each)
                                   const std::string bad = st.error_occurred() ? "" : numeric_trouble(towers);
                                   if (group.allreduce_max(bad.empty() ? 0.0 : 1.0) > 0 && !st.error_occurred()) {
                                     const std::string why = bad.empty() ? "on another process" : bad;
                                     st.SkipWithError(("not finite: " + why).c_str());
                                     stop.halt(fmt::format("the numbers stopped being finite in {}: {}", name, why));
                                   }
                                 })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Repetitions(c.repetitions);  // mean, median, stddev and cv aggregates
  };

  for (Phase ph : phases) {
    const PhaseDef* def = find_phase(ph);
    if (!def) continue;                                                // input_pipeline: below
    if (ph == Phase::grad_sync && towers.sync_bytes() == 0) continue;  // nothing moves: said in the summary
    const std::string name(to_string(ph));
    reg(prefix + "/" + name, [&, def, name](benchmark::State& st) {
      RegionTimer rt(towers, def->points);
      const bool split = def->points > 2;  // forward_backward, step: forward | backward (| sync | update)
      const int last = def->points - 1;
      double host = 0, dev = 0, f = 0, b = 0, s = 0, u = 0;
      GpuStateProbe gpu;
      gpu.read(towers);
      for (auto _ : st) {
        if (stop.stop_in_loop(st)) break;
        NvtxRange nv(name);
        rt.start();
        def->run(towers, rt);
        rt.stop();
        const double d = rt.device_ms(0, last);
        st.SetIterationTime(group.allreduce_max(d) / 1e3);  // every process agrees: the slowest
        dev += d;
        host += rt.host_ms();
        if (split) {
          f += rt.device_ms(0, 1);
          b += rt.device_ms(1, 2);
        }
        if (def->points == 5) {
          s += rt.device_ms(2, 3);
          u += rt.device_ms(3, 4);
        }
      }
      st.counters["host_ms"] = avg(host);
      st.counters["gap_ms"] = avg(host - dev);
      if (split) {
        st.counters["forward_ms"] = avg(f);
        st.counters["backward_ms"] = avg(b);
      }
      if (def->points == 5) {
        st.counters["sync_ms"] = avg(s);
        st.counters["update_ms"] = avg(u);
      }
      gpu.read(towers);
      gpu.report(st);
      set_rate_counters(st, def->phase, towers, images, fl);
    });
  }

  // CUDA Graphs: the same step and forward, captured once after warm-up and replayed as one launch,
  // so the difference to the rows above is the launch overhead the graph removes.
  if (c.cuda_graph) {
    for (Phase ph : {Phase::forward, Phase::step}) {
      if (!has(phases, ph)) continue;
      const bool is_step = ph == Phase::step;
      const std::string name = std::string(to_string(ph)) + ":cuda_graph";
      towers.capture(is_step);
      towers.replay(is_step);  // once untimed: the first launch uploads the graph
      towers.synchronize();
      reg(prefix + "/" + name, [&, is_step, name](benchmark::State& st) {
        RegionTimer rt(towers, 2);
        double host = 0, dev = 0;
        for (auto _ : st) {
          if (stop.stop_in_loop(st)) break;
          NvtxRange nv(name);
          rt.start();
          towers.replay(is_step);
          rt.stop();
          const double d = rt.device_ms(0, 1);
          st.SetIterationTime(group.allreduce_max(d) / 1e3);
          dev += d;
          host += rt.host_ms();
        }
        st.counters["host_ms"] = avg(host);
        st.counters["gap_ms"] = avg(host - dev);
        st.counters["images/s"] = rate(images);
        st.counters["TFLOP/s"] = rate(images * (is_step ? 3.0 * fl.train_forward : fl.forward) / 1e12);
      });
    }
  }

  // Input: the pipeline alone, then the step fed by it. Both are timed on the host clock: waiting
  // for input is what they measure. (Registered last: afterwards the graphs read staged batches.)
  if (feeder.active() && has(phases, Phase::input_pipeline)) {
    reg(prefix + "/input_pipeline", [&](benchmark::State& st) {
      double host = 0;
      const StageTimes before = feeder.stage_times();
      for (auto _ : st) {
        if (stop.stop_in_loop(st)) break;
        const auto t0 = std::chrono::steady_clock::now();
        feeder.feed();
        towers.synchronize();
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        st.SetIterationTime(group.allreduce_max(ms) / 1e3);
        host += ms;
      }
      feeder.add_measure(feeder.stage_times() - before, host / 1e3,
                         static_cast<std::uint64_t>(st.iterations() * r.batch_per_tower * towers.size()));
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
        if (stop.stop_in_loop(st)) break;
        const auto t0 = std::chrono::steady_clock::now();
        rt.start();
        towers.step();
        rt.mark(1);
        feeder.feed();  // on a GPU the copy overlaps the step just launched; the host waits for the batch
        rt.stop();
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        st.SetIterationTime(group.allreduce_max(ms) / 1e3);
        host += ms;
        dev += rt.device_ms(0, 1);
      }
      st.counters["host_ms"] = avg(host);
      st.counters["device_ms"] = avg(dev);
      st.counters["gap_ms"] = avg(host - dev);
      st.counters["images/s"] = rate(images);
      st.counters["TFLOP/s"] = rate(images * 3.0 * fl.train_forward / 1e12);
    });
  }

  std::unique_ptr<PerLayerBench> per_layer;
  if (c.per_layer)
    per_layer = std::make_unique<PerLayerBench>(towers.backend(0), g0, r.layout, r.dtype(), prefix, c.repetitions,
                                                group, r.fault_slow_conv, stop);

  // Colour only on a terminal: logs and CI output stay plain text.
  SummaryReporter reporter(isatty(fileno(stdout)) ? benchmark::ConsoleReporter::OO_ColorTabular
                                                  : benchmark::ConsoleReporter::OO_Tabular);
  std::ofstream devnull("/dev/null");
  if (!root) {  // one report, from process 0 (every process times the same, slowest-rank figures)
    reporter.SetOutputStream(&devnull);
    reporter.SetErrorStream(&devnull);
  }
  PartialJson partial;
  const bool json_in_place = !c.json.empty() && json_partial(c) == c.json;  // a FIFO or /dev/stdout
  if (!c.json.empty() && root && !json_in_place) partial.path = json_partial(c);
  // A section added to --json once it is in place (said instead where --json is a FIFO or /dev/stdout).
  auto add_json = [&](const char* key, const std::function<nlohmann::json()>& make) {
    if (c.json.empty() || !root) return;
    if (json_in_place)
      std::cerr << "stepbench: --json " << c.json << " is not a regular file: its " << key << " section is not in it\n";
    else
      add_to_json_file(c.json, key, make());
  };
  const std::size_t ran = benchmark::RunSpecifiedBenchmarks(&reporter);  // its --json file is closed on return
  if (ran == 0) {
    if (root) std::cerr << "stepbench: no benchmark ran: --benchmark_filter matched none of them (see --list)\n";
    benchmark::Shutdown();
    return 2;
  }
  if (!partial.path.empty()) {
    if (std::rename(partial.path.c_str(), c.json.c_str()) != 0) {
      std::cerr << "stepbench: could not write --json " << c.json << " (rename of " << partial.path
                << " failed: " << std::strerror(errno) << ")\n";
      benchmark::Shutdown();
      return 1;
    }
    partial.path.clear();
  }
  // --layer-times, --trace: probed steps after the timed repetitions (every process together), once
  // the measured --json is in place: nothing here can take it away. A signal that came after the
  // last benchmark skips them without counting as agreed (the summary says it came after them).
  std::optional<LayerTimes> layer_times;
  std::optional<ProjectionInput> projection;
  const LinkModel link{c.fabric.empty() ? "given" : c.fabric, c.link_gbps, c.link_latency_us};
  bool probe_failed = false;
  const bool late_signal = group.allreduce_max(stop.local() ? 1.0 : 0.0) > 0;
  const bool probe = c.layer_times || !trace.empty() || !c.project_gpus.empty();
  if (probe && !late_signal && !stop.signal() && stop.halted().empty()) {
    const bool activity = (c.layer_times || !trace.empty()) && towers.backend(0).name() != "cpu";  // CUPTI
    std::string activity_note;
    try {
      const int n = c.layer_times || !c.project_gpus.empty() ? std::max(c.repetitions, 3) : 1;
      const auto steps = run_probed_steps(towers, n, activity, &activity_note, &feeder);
      if (activity && root && activity_note != "CUPTI activity records")
        std::cerr << "stepbench: no kernel names in the probed steps: " << activity_note << "\n";
      if (!c.project_gpus.empty()) {
        projection = projection_input(steps, towers, r.overlap);
        add_json("projection",
                 [&] { return projection_json(*projection, link, project(*projection, link, c.project_gpus)); });
      }
      if (c.layer_times) {
        layer_times = summarize_layer_times(
            steps, towers, device_peak_tflops(towers.backend(0).device_name(), std::string(to_string(r.precision))));
        layer_times->activity = activity_note;
        summarize_activity(*layer_times, steps, towers);
        add_json("layer_times", [&] { return layer_times_json(*layer_times); });
      }
      if (!trace.empty())
        write_json_file(trace,
                        trace_json(steps, towers,
                                   {{"stepbench", prefix},
                                    {"revision", c.revision},
                                    {"backend", towers.backend(0).name()},
                                    {"device", towers.backend(0).device_name()},
                                    {"steps", steps.size()},
                                    {"clock", towers.backend(0).name() == "cpu" ? "steady clock" : "device events"},
                                    {"kernels", activity ? activity_note : "none on the cpu backend"}}));
    } catch (const Error& e) {      // the measured rows stay as written; the run's status says it
      if (group.size() > 1) throw;  // the other processes would wait in the probed steps' syncs: end the run
      std::cerr << "stepbench: " << e.what() << "\n";
      probe_failed = true;
    }
  }
  if (!root) {
    benchmark::Shutdown();
    return stop.signal()                                                       ? 128 + stop.signal()
           : reporter.errors.empty() && stop.halted().empty() && !probe_failed ? 0
                                                                               : 1;
  }
  if (!stop.signal() && stop.local()) {  // after the last benchmark's check: all measured, but stop here
    print_summary(c, towers, reporter, prefix, PeerResult{}, feeder, memory_report(towers, resident_before));
    std::cout << fmt::format(
        "interrupted by signal {} after the benchmarks: every row above was measured; no peer "
        "ran{}\n",
        stop.local(), c.history.empty() ? "" : " and nothing was appended to --history");
    benchmark::Shutdown();
    return 128 + stop.local();
  }
  if (stop.signal() || !stop.halted().empty()) {  // what was measured, said as such; no history record, no peer
    print_summary(c, towers, reporter, prefix, PeerResult{}, feeder, memory_report(towers, resident_before));
    int cut = 0;
    for (const auto& [name, n] : reporter.cut_short) cut += n;
    std::cout << fmt::format(
        "{}. The rows above are the repetitions measured before it; {} repetitions of {} benchmarks were not run "
        "(marked \"{}\"{}){}\n",
        stop.signal() ? "cut short by " + stop.name() : stop.halted(), cut, reporter.cut_short.size(),
        stop.signal() ? stop.message() : "not run: ...", c.json.empty() ? "" : " in --json " + c.json,
        c.history.empty() ? "" : "; nothing was appended to --history");
    benchmark::Shutdown();
    return stop.signal() ? 128 + stop.signal() : 1;
  }
  if (!c.history.empty()) append_history(c, towers, reporter);
  if (!c.plan_cache.empty() && r.plans) r.plans->save(c.plan_cache);  // with the per-layer rigs' plans
  if (c.suggest && feeder.pipeline()) feeder.set_remedies(run_suggest(feeder, towers.backend(0)));
  if (feeder.pipeline() && (feeder.measure().images > 0 || c.suggest)) {
    try {
      add_json("input_stages", [&] { return input_stages_json(feeder); });
    } catch (const Error& e) {
      std::cerr << "stepbench: " << e.what() << "\n";
    }
  }
  PeerResult peer;
  if (!peer_python.empty()) {
    const auto v = towers.backend(0).versions();
    const auto th = v.find("omp_threads");
    // per layer on the CPU only: on a GPU PyTorch's CPU profiler would time the launches
    const bool peer_layers = layer_times && towers.backend(0).name() == "cpu";
    peer = run_peer(c, peer_dirs, peer_python, th == v.end() ? 0 : std::atoi(th->second.c_str()),
                    peer_layers ? std::max(c.repetitions, 3) : 0);
    if (peer_layers && !peer.layers.empty()) {
      try {
        add_json("peer_layer_times", [&] { return peer_layers_json(match_peer_layers(*layer_times, peer), peer); });
      } catch (const Error& e) {
        std::cerr << "stepbench: " << e.what() << "\n";
      }
    }
  }
  const MemoryReport memory = memory_report(towers, resident_before);
  add_json("memory_plan", [&] { return memory_json(memory); });
  print_summary(c, towers, reporter, prefix, peer, feeder, memory);
  if (layer_times) {
    const auto it = reporter.reps.find(prefix + "/step");
    std::vector<double> v;
    if (it != reporter.reps.end())
      for (const auto& x : it->second) v.push_back(x.device_ms);
    print_layer_times(*layer_times, 12, v.empty() ? NAN : median(v));
    if (!peer.layers.empty()) print_peer_layers(match_peer_layers(*layer_times, peer), peer, 12);
  }
  if (projection)
    print_projection(*projection, link, project(*projection, link, c.project_gpus), {}, r.batch_per_tower);
  if (!trace.empty() && root)
    std::cout << fmt::format("trace: {} (open it in https://ui.perfetto.dev or chrome://tracing){}\n", trace,
                             group.size() > 1 ? "; the other processes wrote theirs as FILE.rankN" : "");
  if (!peer.empty())
    std::cout << fmt::format(
        "peer: PyTorch {}{} (bench/torch_peer.py, {}), same model, batch, layout, precision, dropout, threads and "
        "warm-up; stepbench/PT compares {}; < 1 means stepbench is faster{}\npeer settings: {}\n",
        peer.torch, c.peer == PeerKind::pytorch_compile ? " with torch.compile" : "", peer.python,
        peer.timing == "cuda events"
            ? "device time between events on both sides (the host ratio: host wall time per call on both)"
            : "host wall time on both sides",
        gpus != 1 ? "; ratios only for --gpus 1" : "", peer.settings);
  benchmark::Shutdown();
  if (!peer_python.empty() && peer.empty()) {
    std::cerr << "stepbench: --peer " << to_string(c.peer)
              << " gave no figures (the reason is above); stepbench's own are complete, the exit status is 1\n";
    return 1;
  }
  return reporter.errors.empty() && !probe_failed ? 0 : 1;
}

}  // namespace stepbench
