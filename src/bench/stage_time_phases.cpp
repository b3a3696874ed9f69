// The run's third stage (stages.hpp): one Google Benchmark fixture per phase, timed on the device
// (manual time: events on each tower's stream, the slowest tower and process), then
// --cuda-graph's replays, the input's fixtures and --per-layer's convolutions; all of them run, and
// --json is renamed into place once whole.
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>

#include "bench/gpu_state.hpp"
#include "bench/nvtx.hpp"
#include "bench/per_layer.hpp"
#include "bench/phases.hpp"
#include "bench/region_timer.hpp"
#include "bench/stages.hpp"

namespace stepbench {
namespace {

using Body = std::function<void(benchmark::State&)>;
constexpr int kAsyncIterations = 8;  // per repetition, with --cross-replica-sync off

// One fixture: skipped after a signal or a blow-up; after its body, a check that the phase left the
// numbers finite. Every process answers together, so that all of them mark this fixture (Google
// Benchmark then calls it the same number of times on each).
void register_fixture(Run& run, const std::string& name, Body body) {
  Interrupt& stop = run.stop;
  Towers& towers = *run.towers;
  const ProcessGroup& group = run.group;
  Progress& progress = run.progress;
  const std::string shown = name.substr(run.prefix.size() + 1);  // the phase, on the progress line
  const int repetitions = run.c.repetitions;
  ++run.fixtures;
  benchmark::internal::Benchmark* b =
      benchmark::RegisterBenchmark(
          name.c_str(),
          [&stop, &towers, &group, &progress, body = std::move(body), name, shown, repetitions](benchmark::State& st) {
            try {
              if (stop.skip(st)) return;  // after a signal or a blow-up: marked, not run
              progress.repetition(shown, static_cast<long long>(st.max_iterations), repetitions);
              body(st);
              // outside the timed loop: did this phase blow the numbers up?
              const std::string bad = st.error_occurred() ? "" : numeric_trouble(towers);
              if (group.allreduce_max(bad.empty() ? 0.0 : 1.0) > 0 && !st.error_occurred()) {
                const std::string why = bad.empty() ? "on another process" : bad;
                st.SkipWithError(("not finite: " + why).c_str());
                stop.halt(fmt::format("the numbers stopped being finite in {}: {}", name, why));
              }
            } catch (const SyncError& e) {  // a peer gone or silent: what was measured is kept, the rest not run
              progress.clear();
              std::cerr << "stepbench: error: " << e.what() << "\n";
              stop.fail(st, e.what());
            }
          })
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);  // --repetitions: Google Benchmark's flag (run_parts.cpp), not in the name
  // asynchronous workers time themselves, so Google Benchmark's iteration counts would differ between
  // the processes: a fixed count keeps their fixture calls (and the collectives after each) in step
  if (towers.asynchronous()) b->Iterations(kAsyncIterations);
}

// A model phase of the phase table: its device time, split at the table's points (forward |
// backward | sync | update), the host's time around it, the GPUs' state, the rates.
Body phase_body(Run& run, const PhaseDef* def, const std::string& name) {
  return [&run, def, name](benchmark::State& st) {
    Towers& towers = *run.towers;
    RegionTimer rt(towers, def->points);
    const bool split = def->points > 2;  // forward_backward, step: forward | backward (| sync | update)
    const int last = def->points - 1;
    double host = 0, dev = 0, f = 0, b = 0, s = 0, u = 0;
    GpuStateProbe gpu;
    gpu.read(towers);
    StragglerLog& log = run.stragglers;
    const bool timeline = log.on && def->phase == Phase::step;
    if (timeline) {
      towers.set_step_timing(true);
      log.begin_call();
    }
    if (def->phase == Phase::step) {
      run.step_samples.emplace_back();
      run.step_compute_samples.emplace_back();
    }
    const std::vector<SyncLevel> levels_before = towers.sync_levels();
    for (auto _ : st) {
      if (run.stop.stop_in_loop(st)) break;
      NvtxRange nv(name);
      rt.start();
      def->run(towers, rt);
      rt.stop();
      const double d = rt.device_ms(0, last);
      // the slowest process's time, which every process agrees on; asynchronous workers each their own
      const double slowest = towers.asynchronous() ? d : run.group.allreduce_max(d);
      st.SetIterationTime(slowest / 1e3);  // every process agrees: the slowest
      if (timeline) log.record(towers, slowest);
      if (def->phase == Phase::step) {
        run.step_samples.back().push_back(d);
        run.step_compute_samples.back().push_back(def->points == 5 ? d - rt.device_ms(2, 3) : d);
      }
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
    if (timeline) {
      towers.set_step_timing(false);
      towers.set_sync_timing(false);
    }
    gpu.read(towers);
    gpu.report(st);
    set_rate_counters(st, def->phase, towers, run.images, run.flops);
    if (def->phase == Phase::grad_sync || def->phase == Phase::step)
      set_level_counters(st, levels_before, towers.sync_levels(), run.group);
  };
}

void register_phases(Run& run) {
  for (Phase ph : run.phases) {
    const PhaseDef* def = find_phase(ph);
    if (!def) continue;                                                     // input_pipeline: below
    if (ph == Phase::grad_sync && run.towers->sync_bytes() == 0) continue;  // nothing moves: said in the summary
    const std::string name(to_string(ph));
    register_fixture(run, run.prefix + "/" + name, phase_body(run, def, name));
  }
}

// --cuda-graph: the same step and forward, captured once after warm-up and replayed as one launch,
// so the difference to the rows above is the launch overhead the graph removes.
void register_cuda_graphs(Run& run) {
  if (!run.c.cuda_graph) return;
  Towers& towers = *run.towers;
  for (Phase ph : {Phase::forward, Phase::step}) {
    if (!has(run.phases, ph)) continue;
    const bool is_step = ph == Phase::step;
    const std::string name = std::string(to_string(ph)) + ":cuda_graph";
    towers.capture(is_step);
    towers.replay(is_step);  // once untimed: the first launch uploads the graph
    towers.synchronize();
    register_fixture(run, run.prefix + "/" + name, [&run, is_step, name](benchmark::State& st) {
      Towers& towers = *run.towers;
      RegionTimer rt(towers, 2);
      double host = 0, dev = 0;
      for (auto _ : st) {
        if (run.stop.stop_in_loop(st)) break;
        NvtxRange nv(name);
        rt.start();
        towers.replay(is_step);
        rt.stop();
        const double d = rt.device_ms(0, 1);
        st.SetIterationTime(run.group.allreduce_max(d) / 1e3);
        dev += d;
        host += rt.host_ms();
      }
      st.counters["host_ms"] = avg(host);
      st.counters["gap_ms"] = avg(host - dev);
      st.counters["images/s"] = rate(run.images);
      st.counters["TFLOP/s"] = rate(run.images * (is_step ? 3.0 * run.flops.train_forward : run.flops.forward) / 1e12);
    });
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Input: the pipeline alone, then the step fed by it. Both are timed on the host clock: waiting for
// input is what they measure. (Registered last: afterwards the graphs read staged batches.)
void register_input(Run& run) {
  Feeder& feeder = *run.feeder;
  if (feeder.active() && has(run.phases, Phase::input_pipeline)) {
    register_fixture(run, run.prefix + "/input_pipeline", [&run](benchmark::State& st) {
      Feeder& feeder = *run.feeder;
      double host = 0;
      // The threads' times cover every moment between the two snapshots, the time between the
      // timed iterations too (a preempted benchmark thread), so they are judged against that window.
      const StageTimes before = feeder.stage_times();
      const auto w0 = std::chrono::steady_clock::now();
      for (auto _ : st) {
        if (run.stop.stop_in_loop(st)) break;
        const auto t0 = std::chrono::steady_clock::now();
        feeder.feed();
        run.towers->synchronize();
        const double ms = ms_since(t0);
        st.SetIterationTime(run.group.allreduce_max(ms) / 1e3);
        host += ms;
      }
      const double window = ms_since(w0) / 1e3;
      feeder.add_measure(feeder.stage_times() - before, host / 1e3, window,
                         static_cast<std::uint64_t>(st.iterations() * run.c.run.batch_per_tower * run.towers->size()));
      st.counters["host_ms"] = avg(host);
      st.counters["gap_ms"] = avg(0.0);
      st.counters["images/s"] = rate(run.images);
    });
  }
  if (!run.data_step) return;
  register_fixture(run, run.prefix + "/step:data=" + feeder.name(), [&run](benchmark::State& st) {
    Towers& towers = *run.towers;
    run.feeder->feed();  // the first batch
    RegionTimer rt(towers, 3);
    double host = 0, dev = 0;
    for (auto _ : st) {
      if (run.stop.stop_in_loop(st)) break;
      const auto t0 = std::chrono::steady_clock::now();
      rt.start();
      towers.step();
      rt.mark(1);
      run.feeder->feed();  // on a GPU the copy overlaps the step just launched; the host waits for the batch
      rt.stop();
      const double ms = ms_since(t0);
      st.SetIterationTime(run.group.allreduce_max(ms) / 1e3);
      host += ms;
      dev += rt.device_ms(0, 1);
    }
    st.counters["host_ms"] = avg(host);
    st.counters["device_ms"] = avg(dev);
    st.counters["gap_ms"] = avg(host - dev);
    st.counters["images/s"] = rate(run.images);
    st.counters["TFLOP/s"] = rate(run.images * 3.0 * run.flops.train_forward / 1e12);
  });
}

// Runs every registered fixture with the reporter; --json (written beside, as FILE.partial.PID) is
// renamed into place once whole.
Timings run_fixtures(Run& run) {
  const BenchConfig& c = run.c;
  Timings t;
  // Colour only on a terminal: logs and CI output stay plain text.
  t.reporter = std::make_unique<SummaryReporter>(
      isatty(fileno(stdout)) ? benchmark::ConsoleReporter::OO_ColorTabular : benchmark::ConsoleReporter::OO_Tabular,
      c.verbose, &run.progress);
  if (!run.root) {  // one report, from process 0 (every process times the same, slowest-rank figures)
    t.devnull = std::make_unique<std::ofstream>("/dev/null");
    t.reporter->SetOutputStream(t.devnull.get());
    t.reporter->SetErrorStream(t.devnull.get());
  }
  PartialJson partial;
  t.json_in_place = !c.json.empty() && json_partial(c) == c.json;  // a FIFO or /dev/stdout
  if (!c.json.empty() && run.root && !t.json_in_place) partial.path = json_partial(c);
  run.progress.set_total(run.fixtures);
  const std::size_t ran = benchmark::RunSpecifiedBenchmarks(t.reporter.get());  // its --json file is closed on return
  run.progress.clear();
  if (ran == 0) {
    if (run.root) std::cerr << "stepbench: no benchmark ran: --benchmark_filter matched none of them (see --list)\n";
    t.exit = 2;
    return t;
  }
  if (!partial.path.empty()) {
    if (std::rename(partial.path.c_str(), c.json.c_str()) != 0) {
      std::cerr << "stepbench: could not write --json " << c.json << " (rename of " << partial.path
                << " failed: " << std::strerror(errno) << ")\n";
      t.exit = 1;
    } else {
      partial.path.clear();
    }
  }
  if (run.group.size() > 1 && !run.stop.spent()) {  // the root alone writes --json: every process ends with it
    const double e = run.group.allreduce_max(t.exit ? *t.exit : 0);
    if (e > 0) t.exit = static_cast<int>(e);
  }
  return t;
}

}  // namespace

Timings time_phases(Run& run) {
  register_phases(run);
  register_cuda_graphs(run);
  register_input(run);
  std::unique_ptr<PerLayerBench> per_layer;  // its rigs live while the fixtures run
  if (run.c.per_layer)
    per_layer = std::make_unique<PerLayerBench>(run.towers->backend(0), run.towers->graph(0), run.c.run.layout,
                                                run.c.run.dtype(), run.prefix, run.c.repetitions, run.group,
                                                run.c.run.fault_slow_conv, run.stop, &run.progress);
  if (per_layer) run.fixtures += per_layer->fixtures();
  return run_fixtures(run);
}

}  // namespace stepbench
