// The slowest tower (stages.hpp, bench/straggler.hpp): --slow-tower's delay calibrated after warm-up,
// every tower's timeline in every timed step of the step fixture, gathered on rank 0 and analysed
// there: which tower the step waits for, and what it costs.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "bench/stages.hpp"
#include "bench/text.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

std::string host_name() {
  char h[256] = {};
  gethostname(h, sizeof h - 1);
  return h;
}

// The GPU's state now, as the report names it ("" on the CPU).
std::string state_text(const Backend& be) {
  const auto s = be.device_state();
  if (!s) return "";
  return fmt::format("SM {:.0f} MHz, {:.0f} C, {:.0f} W{}", s->sm_clock_mhz, s->temperature_c, s->power_w,
                     s->throttled ? ", throttled: " + s->throttle_text : "");
}

std::string version_of(const Backend& be, const char* key) {
  const auto v = be.versions();
  const auto it = v.find(key);
  return it == v.end() ? "" : it->second;
}

nlohmann::json timeline_json(const Towers::Timeline& l) {
  return {{"b", l.begin_ms},    {"f", l.forward_ms},   {"w", l.backward_ms},
          {"r", l.released_ms}, {"ready", l.ready_ms}, {"synced", l.synced_ms}};
}

TowerStep tower_step(const nlohmann::json& j) {
  TowerStep s;
  s.begin_ms = j.at("b");
  s.forward_ms = j.at("f");
  s.backward_ms = j.at("w");
  s.released_ms = j.at("r");
  s.ready_ms = j.at("ready").get<std::vector<double>>();
  s.synced_ms = j.at("synced").get<std::vector<double>>();
  return s;
}

// This process's part: its towers (where they ran) and their timelines in the last `keep` calls of
// the step fixture (the earlier ones were Google Benchmark's trials for the iteration count).
std::string local_part(const Run& run, std::size_t keep) {
  const Towers& t = *run.towers;
  nlohmann::json towers = nlohmann::json::array(), calls = nlohmann::json::array();
  const std::string host = host_name();
  for (int i = 0; i < t.size(); ++i) {
    const Backend& be = t.backend(i);
    towers.push_back({{"host", host},
                      {"node", run.group.nodes() > 1 ? run.group.node() : -1},
                      {"device", be.device()},
                      {"bus_id", version_of(be, "pci_bus_id")},
                      {"uuid", version_of(be, "gpu_uuid")},
                      {"state", state_text(be)}});
  }
  const auto& log = run.stragglers;
  const std::size_t from = log.calls.size() > keep ? log.calls.size() - keep : 0;
  for (std::size_t c = from; c < log.calls.size(); ++c) {
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& step : log.calls[c].steps) {
      nlohmann::json per = nlohmann::json::array();
      for (const auto& l : step) per.push_back(timeline_json(l));
      steps.push_back(per);
    }
    calls.push_back({{"steps", steps}, {"step_ms", log.calls[c].step_ms}});
  }
  return nlohmann::json{{"towers", towers}, {"calls", calls}}.dump();
}

}  // namespace

void StragglerLog::record(const Towers& t, double step_ms) {
  if (!on || calls.empty()) return;
  std::vector<Towers::Timeline> step;
  step.reserve(static_cast<std::size_t>(t.size()));
  for (int i = 0; i < t.size(); ++i) step.push_back(t.timeline(i));
  calls.back().steps.push_back(std::move(step));
  calls.back().step_ms.push_back(step_ms);
}

void calibrate_slow_tower(Run& run) {
  const BenchConfig& c = run.c;
  if (c.slow_tower < 0) return;
  Towers& towers = *run.towers;
  const int per = towers.size(), global = per * run.group.size();
  if (c.slow_tower >= global)
    throw UsageError(fmt::format("--slow-tower {}: there are {} towers (0 to {}); name one of them", c.slow_tower,
                                 global, global - 1));
  const bool mine = c.slow_tower / per == run.group.rank();
  const int local = c.slow_tower % per;
  double ms = c.slow_ms;
  if (c.slow_factor > 0) {  // the tower's own compute, measured on a few steps, scaled
    towers.set_step_timing(true);
    std::vector<double> compute;
    for (int i = 0; i < 3; ++i) {
      towers.step();
      towers.synchronize();
      const auto l = towers.timeline(mine ? local : 0);
      compute.push_back(l.forward_ms + l.backward_ms);
    }
    towers.set_step_timing(false);
    towers.set_sync_timing(false);
    std::sort(compute.begin(), compute.end());
    ms = (c.slow_factor - 1) * compute[1];
  }
  if (mine) towers.set_delay(local, ms);
  run.stragglers.injected_ms = run.group.allreduce_max(mine ? ms : 0.0);
}

std::optional<Stragglers> gather_stragglers(Run& run) {
  if (!run.stragglers.on) return std::nullopt;
  const std::size_t keep = static_cast<std::size_t>(std::max(1, run.c.repetitions));
  const std::vector<std::string> parts = run.group.allgather(local_part(run, keep));
  if (!run.root) return std::nullopt;
  Stragglers s;
  StragglerInput& in = s.input;
  in.towers_per_process = run.towers->size();
  in.sequential = run.c.run.backend == BackendKind::cpu && run.towers->size() > 1;
  std::vector<nlohmann::json> js;
  std::size_t calls = SIZE_MAX;
  for (const auto& p : parts) {
    js.push_back(nlohmann::json::parse(p));
    calls = std::min(calls, js.back().at("calls").size());
  }
  for (std::size_t r = 0; r < js.size(); ++r) {
    const auto& towers = js[r].at("towers");
    for (std::size_t i = 0; i < towers.size(); ++i) {
      const auto& t = towers[i];
      in.towers.push_back({static_cast<int>(r) * in.towers_per_process + static_cast<int>(i), static_cast<int>(r),
                           t.at("device").get<int>(), t.at("host").get<std::string>(),
                           t.at("bus_id").get<std::string>(), t.at("uuid").get<std::string>(),
                           t.at("state").get<std::string>(), t.value("node", -1)});
    }
  }
  // each process's last `calls` calls, paired from the end (the repetitions are the last calls)
  const auto call_of = [&](const nlohmann::json& j, std::size_t c) -> const nlohmann::json& {
    const auto& all = j.at("calls");
    return all[all.size() - calls + c];
  };
  for (std::size_t c = 0; c < calls; ++c) {
    std::size_t n = SIZE_MAX;  // the steps every process has
    for (const auto& j : js) n = std::min(n, call_of(j, c).at("steps").size());
    if (n == 0) continue;
    std::vector<std::vector<TowerStep>> steps(n);
    std::vector<double> step_ms(n, 0.0);
    for (const auto& j : js) {
      const auto& call = call_of(j, c);
      for (std::size_t k = 0; k < n; ++k) {
        for (const auto& t : call.at("steps")[k]) steps[k].push_back(tower_step(t));
        step_ms[k] = std::max(step_ms[k], call.at("step_ms")[k].get<double>());
      }
    }
    in.steps.push_back(std::move(steps));
    in.step_ms.push_back(std::move(step_ms));
  }
  s.report = analyze_stragglers(in);
  return s;
}

nlohmann::json stragglers_json(const Run& run, const Stragglers& s) {
  nlohmann::json j = straggler_json(s.input, s.report);
  if (run.c.slow_tower >= 0)
    j["injected"] = {
        {"tower", run.c.slow_tower}, {"factor", run.c.slow_factor}, {"delay_ms", run.stragglers.injected_ms}};
  return j;
}

void print_stragglers(std::ostream& out, const Run& run, const Stragglers& s) {
  if (!s.report.valid) return;
  out << "\n";
  for (const auto& line : straggler_lines(s.input, s.report, run.c.straggler_top)) {
    if (columns(line) <= kWidth) {  // the table's rows keep their columns
      out << line << "\n";
      continue;
    }
    const std::size_t lead = line.find_first_not_of(' ');
    out << wrap(std::string_view(line).substr(lead), lead + 2, kWidth, std::string(lead, ' '));
  }
  // towers time-sharing one GPU (ranks sharing it, --ranks-per-gpu): each one's kernels wait for the
  // others', so a tower's compute is not its own
  const auto& ts = s.input.towers;
  const auto shares = [&](const TowerId& a) {
    return a.device >= 0 && !a.uuid.empty() && std::count_if(ts.begin(), ts.end(), [&](const TowerId& b) {
                                                 return b.uuid == a.uuid && b.host == a.host;
                                               }) > 1;
  };
  if (const auto shared = std::count_if(ts.begin(), ts.end(), shares); shared > 0)
    out << wrap(fmt::format("shared GPUs: {} of {} towers run on a GPU that another tower also runs on; their kernels "
                            "take turns, so each one's compute includes the others' work and only a delay larger "
                            "than that is told apart",
                            shared, ts.size()),
                4, kWidth, "  ");
  if (run.c.slow_tower >= 0)
    out << wrap(fmt::format("injected (--slow-tower): tower {} held {:.3f} ms at the start of each backward{}",
                            run.c.slow_tower, run.stragglers.injected_ms,
                            run.c.slow_factor > 0 ? fmt::format(" ({}x its compute)", run.c.slow_factor) : ""),
                4, kWidth, "  ");
}

}  // namespace stepbench
