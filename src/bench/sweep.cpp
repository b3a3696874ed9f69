// --sweep-batch / --sweep-gpus (sweep.hpp).
#include "bench/sweep.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "bench/fabric.hpp"
#include "bench/interrupt.hpp"
#include "bench/layer_times.hpp"
#include "bench/nvtx.hpp"
#include "bench/projection.hpp"
#include "bench/region_timer.hpp"
#include "bench/report.hpp"
#include "bench/stats.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

constexpr double kRepetitionMs = 100;  // steps per repetition: enough to fill about this much
constexpr int kMaxStepsPerRepetition = 100;

// One grid point: towers built, warmed up, `repetitions` repetitions of k steps timed on the device.
SweepRow time_point(const BenchConfig& c, const ProcessGroup& group, int towers_per_process, std::int64_t batch,
                    std::vector<std::pair<std::string, std::string>>* context, ProjectionInput* projection) {
  TowerOptions o = c.run;
  o.towers = towers_per_process;
  o.batch_per_tower = batch;
  Towers t(o);
  if (context && context->empty()) *context = run_context(c, t);
  t.set_synthetic_batch(42);
  SweepRow row;
  row.gpus = t.global_size();
  row.batch = batch;
  {
    NvtxRange nv(fmt::format("sweep warm-up gpus:{} batch:{}", row.gpus, batch));
    for (int i = 0; i < std::max(c.warmup, 1); ++i) t.step();
  }
  RegionTimer rt(t, 2);
  rt.start();
  t.step();
  rt.stop();
  const double one = group.allreduce_max(rt.device_ms(0, 1));
  const int k = std::clamp(static_cast<int>(std::ceil(kRepetitionMs / std::max(one, 1e-3))), 1, kMaxStepsPerRepetition);
  std::vector<double> per_step;
  for (int r = 0; r < std::max(c.repetitions, 1); ++r) {
    NvtxRange nv(fmt::format("sweep gpus:{} batch:{}", row.gpus, batch));
    rt.start();
    for (int i = 0; i < k; ++i) t.step();
    rt.stop();
    per_step.push_back(group.allreduce_max(rt.device_ms(0, 1)) / k);
  }
  row.steps_per_repetition = k;
  row.step_ms = median(per_step);
  if (projection) {
    *projection = projection_input(run_probed_steps(t, std::max(c.repetitions, 3)), t, c.run.overlap);
    set_measured_step(*projection, row.step_ms);
  }
  row.images_per_s = static_cast<double>(row.gpus) * static_cast<double>(batch) / (row.step_ms / 1e3);
  return row;
}

// Why the plan refuses batch b (beyond the largest it accepts), with its bytes: the exact plan's,
// else (an op that cannot be made at that batch) the lower bound of its quick estimate.
std::string refused(const TowerOptions& o, const BatchFit& fit, std::int64_t b) {
  std::size_t need = b == fit.batch + 1 ? fit.next_bytes : plan_memory(o, b).bytes;
  const bool exact = need > 0;
  if (!exact) need = plan_memory(o, b, true).bytes;
  return fmt::format("does not fit: its memory plan needs {}{:.2f} GiB of the {:.2f} GiB planning uses",
                     exact ? "" : "at least ", static_cast<double>(need) / (1 << 30),
                     static_cast<double>(fit.usable) / (1 << 30));
}

}  // namespace

void fill_scaling_efficiency(std::vector<SweepRow>& rows) {
  std::map<std::int64_t, const SweepRow*> base;  // per batch: the smallest count that ran
  for (const auto& r : rows)
    if (r.fits && r.images_per_s > 0 && (!base.count(r.batch) || r.gpus < base[r.batch]->gpus)) base[r.batch] = &r;
  for (auto& r : rows) {
    r.efficiency = -1;
    if (!r.fits || r.images_per_s <= 0 || !base.count(r.batch)) continue;
    const SweepRow& b = *base[r.batch];
    r.efficiency = r.images_per_s / (b.images_per_s * static_cast<double>(r.gpus) / static_cast<double>(b.gpus));
  }
}

int run_sweep(const BenchConfig& c, const ProcessGroup& group) {
  const bool root = group.rank() == 0;
  const auto& r = c.run;
  std::vector<int> gpus = c.sweep_gpus.empty() ? std::vector<int>{r.towers} : c.sweep_gpus;
  std::vector<std::int64_t> batches =
      c.sweep_batch.empty() ? std::vector<std::int64_t>{r.batch_per_tower} : c.sweep_batch;
  std::sort(gpus.begin(), gpus.end());
  std::sort(batches.begin(), batches.end());
  if (!c.project_gpus.empty() && group.size() > 1) {
    if (root)
      std::cerr
          << "stepbench: --project-gpus starts from one GPU's step in one process; drop it with several processes\n";
    return 2;
  }
  const BatchFit fit = largest_batch_that_fits(r);
  if (root)
    std::cerr << fmt::format("stepbench: sweep of {} on {}, {} {}, {}x{}: GPUs {} x batch per GPU {}{}{}\n",
                             to_string(r.model), to_string(r.backend), to_string(r.precision), to_string(r.layout),
                             r.model_options.image_size, r.model_options.image_size, fmt::join(gpus, ","),
                             fmt::join(batches, ","),
                             group.size() > 1 ? fmt::format(" (per process; {} processes)", group.size()) : "",
                             c.reduced() ? fmt::format(" [{}]", c.reduced_note) : "");
  std::vector<SweepRow> rows;
  std::vector<std::pair<std::string, std::string>> context;
  std::map<std::int64_t, ProjectionInput> inputs;  // per batch: the one-GPU point's probed step
  const Interrupt stop(c.interrupt, group);        // every process agrees before each point
  bool cut = false;
  for (int g : gpus) {
    for (std::int64_t b : batches) {
      if ((cut = cut || stop.agreed() != 0)) break;
      SweepRow row;
      row.gpus = g * group.size();
      row.batch = b;
      if (b > fit.batch) {
        row.fits = false;
        row.why = refused(r, fit, b);
        rows.push_back(row);
        continue;
      }
      const bool base = !c.project_gpus.empty() && g * group.size() == 1;
      try {
        row = time_point(c, group, g, b, &context, base ? &inputs[b] : nullptr);
      } catch (const UsageError& e) {  // e.g. N CPU towers' arenas together: that point, not the sweep
        if (group.size() > 1) throw;   // the other processes are inside a collective: end the job
        row.fits = false;
        row.why = fmt::format("not run: {}", e.what());
        inputs.erase(b);
      }
      rows.push_back(row);
      if (root && row.fits)
        std::cerr << fmt::format("  gpus {} batch {}: {:.3f} ms per step\n", row.gpus, b, row.step_ms);
    }
  }
  fill_scaling_efficiency(rows);
  if (!c.plan_cache.empty() && r.plans && root) r.plans->save(c.plan_cache);
  if (!root) return cut ? 128 + stop.signal() : 0;

  // the configuration's context, less what the grid varies
  std::erase_if(context, [](const auto& kv) {
    return kv.first == "gpus" || kv.first == "towers_per_process" || kv.first == "batch_size_per_gpu" ||
           kv.first == "global_batch_size" || kv.first == "sync_buckets";
  });
  std::string device = "-";
  for (const auto& [k, v] : context)
    if (k == "device") device = v;
  std::cout << fmt::format(
      "\nsweep: {} {} {} on {} ({}), step medians of {} repetitions (device time; each repetition as many steps as "
      "fill {:.0f} ms)\n",
      to_string(r.model), to_string(r.precision), to_string(r.layout), to_string(r.backend), device,
      std::max(c.repetitions, 1), kRepetitionMs);
  std::cout << fmt::format("{:>6} {:>10} {:>13} {:>11} {:>11} {:>11}\n", "gpus", "batch/gpu", "global batch", "step ms",
                           "images/s", "efficiency");
  for (const auto& row : rows) {
    if (!row.fits) {
      std::cout << fmt::format("{:>6} {:>10} {:>13}   {}\n", row.gpus, row.batch, row.gpus * row.batch, row.why);
      continue;
    }
    std::cout << fmt::format("{:>6} {:>10} {:>13} {:>11.3f} {:>11.1f} {:>11}\n", row.gpus, row.batch,
                             row.gpus * row.batch, row.step_ms, row.images_per_s,
                             row.efficiency < 0 ? "-" : fmt::format("{:.1f}%", 100 * row.efficiency));
  }
  std::cout << fmt::format(
      "largest batch per GPU that planning accepts: {} (its memory plan: {:.2f} GiB of the {:.2f} GiB planning may "
      "use on {}{}; {})\n",
      fit.batch, static_cast<double>(fit.bytes) / (1 << 30), static_cast<double>(fit.usable) / (1 << 30),
      r.backend == BackendKind::cpu ? "the host" : "each process's first GPU",
      group.size() > 1 ? ", the least over the processes" : "",
      fit.at_cap ? "the search stopped there, its cap"
                 : fmt::format("batch {} does not fit: it needs {:.2f} GiB", fit.batch + 1,
                               static_cast<double>(fit.next_bytes) / (1 << 30)));
  if (r.backend == BackendKind::cpu)
    std::cout << "(that is one tower's: CPU towers of one process share the host's memory, so N of them need N "
                 "times it; they also share its cores and run one after another, so images/s stays about flat and "
                 "the efficiency falls as 1/N by construction)\n";
  else
    std::cout << "(one tower on one GPU: the same for every count where the GPUs are alike)\n";
  if (cut) std::cout << "cut short by a signal: the rows above are the points measured before it\n";
  const Fabric fabric = fabric_of(c);
  nlohmann::json projections = nlohmann::json::array();
  for (const auto& [b, in] : inputs) {
    std::vector<std::pair<int, double>> measured;
    for (const auto& row : rows)
      if (row.batch == b && row.fits) measured.emplace_back(row.gpus, row.step_ms);
    const auto pts = project(in, fabric, c.project_gpus);
    print_projection(in, fabric, pts, measured, b);
    auto j = projection_json(in, fabric, pts);
    j["batch"] = b;
    projections.push_back(std::move(j));
  }

  if (!c.json.empty()) {
    nlohmann::json jr = nlohmann::json::array();
    for (const auto& row : rows) {
      nlohmann::json x{
          {"gpus", row.gpus}, {"batch", row.batch}, {"global_batch", row.gpus * row.batch}, {"fits", row.fits}};
      if (!row.fits) x["why"] = row.why;
      if (row.fits) {
        x["step_ms"] = row.step_ms;
        x["images_per_s"] = row.images_per_s;
        x["steps_per_repetition"] = row.steps_per_repetition;
        x["scaling_efficiency"] = row.efficiency < 0 ? nlohmann::json(nullptr) : nlohmann::json(row.efficiency);
      }
      jr.push_back(std::move(x));
    }
    nlohmann::json ctx = nlohmann::json::object();
    for (const auto& [k, v] : context) ctx[k] = v;
    write_json_file(c.json, {{"context", ctx},
                             {"sweep",
                              {{"rows", jr},
                               {"repetitions", std::max(c.repetitions, 1)},
                               {"largest_batch_per_gpu", fit.batch},
                               {"largest_batch_bytes", fit.bytes},
                               {"next_batch_bytes", fit.next_bytes},
                               {"memory_budget_bytes", fit.budget},
                               {"memory_usable_bytes", fit.usable},
                               {"projections", projections}}}});
  }
  return cut ? 128 + stop.signal() : 0;
}

}  // namespace stepbench
