// The summary, the answer first (hyperfine's, nvbench's way): one table of the phases, at most
// kWidth columns with the units in its header, then the answer lines (the step's parts,
// backward:forward, the sync's share, images/s, the peer's ratio), then each note and warning once
// with its remedy. Google Benchmark's own table is behind --verbose; every figure is in --json.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>

#include "bench/input_report.hpp"
#include "bench/report.hpp"
#include "bench/stats.hpp"
#include "bench/text.hpp"
#include "compare/compare.hpp"
#include "compare/stats.hpp"

namespace stepbench {
namespace {

using Reps = std::vector<SummaryReporter::Rep>;

// A bandwidth in GB/s with two decimals, more below 0.1 (a shaped or slow link: 0.00244, not 0.00).
std::string gbps(double x) {
  const int extra = x > 0 && x < 0.1 ? static_cast<int>(-std::floor(std::log10(x))) : 0;
  return fmt::format("{:.{}f}", x, 2 + std::min(extra, 6));
}

// The median of a counter over the repetitions ("": the device time).
double med(const Reps& r, const std::string& counter = "") {
  std::vector<double> v;
  for (const auto& x : r) {
    if (counter.empty()) {
      v.push_back(x.device_ms);
    } else if (auto it = x.counters.find(counter); it != x.counters.end()) {
      v.push_back(it->second);
    }
  }
  return median(v);
}

struct Row {
  std::string name;  // the benchmark's name after the prefix
  const Reps* reps;
  double ms, cv;  // median device ms, coefficient of variation in %
};

// The phases of the step, each timed on its own: its share of the step's median should be below 100%.
bool part_of_step(const std::string& name) {
  return name == "forward" || name == "forward_train" || name == "forward_backward" || name == "grad_sync" ||
         name == "update";
}

std::vector<Row> phase_rows(const BenchConfig& c, const SummaryReporter& rep, const std::string& prefix,
                            const Feeder& feeder) {
  std::vector<std::string> names = names_of<Phase>();
  if (feeder.active()) names.push_back("step:data=" + feeder.name());
  if (c.cuda_graph) {
    names.emplace_back("forward:cuda_graph");
    names.emplace_back("step:cuda_graph");
  }
  std::vector<Row> rows;
  for (const auto& n : names) {
    const auto it = rep.reps.find(prefix + "/" + n);
    if (it == rep.reps.end() || it->second.empty()) continue;
    std::vector<double> ms;
    for (const auto& x : it->second) ms.push_back(x.device_ms);
    rows.push_back({n, &it->second, median(ms), ms.size() > 1 ? 100.0 * stddev(ms) / mean(ms) : 0.0});
  }
  return rows;
}

struct Table {
  std::size_t name_width = 5;
  bool host = true;  // the host ms column (left out where the line would be too wide)
  bool peer = false;
  bool marks = false;  // some share of the step is over 100%: a column for its mark
};

std::string table_line(const Table& t, const std::vector<std::string>& cells) {
  // phase, median ms, cv %, images/s, [host ms], gap ms, % of step, [PyTorch ms, stepbench/PT]
  std::string s = fmt::format("{:<{}}", cells[0], t.name_width);
  const int widths[] = {10, 6, 9, 10, 8, 10, 10, 12};
  for (std::size_t i = 1; i < cells.size(); ++i) {
    if (i == 4 && !t.host) continue;
    s += fmt::format(" {:>{}}", cells[i], widths[i - 1]);
  }
  return s;
}

void print_table(std::ostream& out, const std::vector<Row>& rows, double step_ms, double images, const PeerResult& peer,
                 int gpus) {
  Table t;
  t.peer = !peer.empty();
  for (const auto& r : rows) {
    t.name_width = std::max(t.name_width, r.name.size());
    t.marks = t.marks || (part_of_step(r.name) && r.ms > step_ms);
  }
  const std::vector<std::string> head = {"phase",  "median ms", "cv %",       "images/s",    "host ms",
                                         "gap ms", "% of step", "PyTorch ms", "stepbench/PT"};
  auto cells_of = [&](std::vector<std::string> v) {
    if (!t.peer) v.resize(7);
    return v;
  };
  if (columns(table_line(t, cells_of(head))) > kWidth) t.host = false;
  out << table_line(t, cells_of(head)) << "\n";
  for (const auto& r : rows) {
    const bool per_image = r.name != "grad_sync" && r.name != "update";  // input_pipeline: images delivered
    const double share = 100.0 * r.ms / step_ms;
    const bool over = part_of_step(r.name) && share > 100.0;  // explained below the answer
    std::vector<std::string> v = {r.name,
                                  fmt::format("{:.3f}", r.ms),
                                  fmt::format("{:.1f}", r.cv),
                                  per_image ? fmt::format("{:.1f}", 1000.0 * images / r.ms) : "-",
                                  fmt::format("{:.3f}", med(*r.reps, "host_ms")),
                                  fmt::format("{:.3f}", med(*r.reps, "gap_ms")),
                                  std::isnan(step_ms) ? "-"
                                  : t.marks           ? fmt::format("{:.1f}{}", share, over ? "*" : " ")
                                                      : fmt::format("{:.1f}", share),
                                  "-",
                                  "-"};
    if (auto it = peer.ms.find(r.name); t.peer && it != peer.ms.end() && gpus == 1) {
      v[7] = fmt::format("{:.3f}", it->second);
      v[8] = fmt::format("{:.2f}", r.ms / it->second);
    }
    out << table_line(t, cells_of(v)) << "\n";
  }
}

const Row* find_row(const std::vector<Row>& rows, const std::string& name) {
  for (const auto& r : rows)
    if (r.name == name) return &r;
  return nullptr;
}

// The answer: what the step is made of, backward:forward, the sync, images/s, the peer's ratio.
void print_answers(std::ostream& out, const BenchConfig& c, const Towers& t, const std::vector<Row>& rows,
                   double images, const PeerResult& peer, const std::string& peak) {
  const Row* step = find_row(rows, "step");
  const Row* fb = find_row(rows, "forward_backward");
  const bool sync = t.sync_bytes() > 0;
  if (step) {
    const Reps& s = *step->reps;
    out << labelled("inside the step",
                    fmt::format("forward {:.3f} ms, backward {:.3f} ms{}, update {:.3f} ms", med(s, "forward_ms"),
                                med(s, "backward_ms"), sync ? fmt::format(", sync {:.3f} ms", med(s, "sync_ms")) : "",
                                med(s, "update_ms")));
  }
  if (step || fb) {
    const Row* r = step ? step : fb;
    std::string v = fmt::format("{:.2f} in the {}", med(*r->reps, "backward_ms") / med(*r->reps, "forward_ms"),
                                step ? "step" : "forward_backward phase");
    if (step && fb)
      v += fmt::format("; {:.2f} in forward_backward alone",
                       med(*fb->reps, "backward_ms") / med(*fb->reps, "forward_ms"));
    out << labelled("backward:forward", v);
  }
  if (!sync) {
    out << labelled("sync", fmt::format("nothing to synchronise ({}): not timed",
                                        t.global_size() < 2 ? "one tower" : "independent towers"));
  } else {
    if (step)
      out << labelled("sync share", fmt::format("{:.1f}% of the step: the sync left after backward ({})",
                                                100.0 * med(*step->reps, "sync_ms") / step->ms,
                                                c.run.overlap ? "the buckets sync during backward" : "--no-overlap"));
    if (const Row* gs = find_row(rows, "grad_sync")) {  // the collective on a line of its own: its name is long
      out << labelled("grad_sync:", fmt::format("over {}, {}", t.sync_name(), to_string(c.run.variable_update)));
      if (t.asynchronous())
        out << labelled("", fmt::format("asynchronous: grad_sync only sums {}; each worker's push and pull are in "
                                        "its update (see asynchronous, below)",
                                        t.sync_levels().empty() ? "this process's towers"
                                                                : "each node's towers onto its first process"));
      else
        out << labelled("", fmt::format("{:.1f} MB in {} bucket{}: algbw {} GB/s, busbw {} GB/s",
                                        static_cast<double>(t.sync_bytes()) / 1e6, t.bucket_count(),
                                        t.bucket_count() == 1 ? "" : "s", gbps(med(*gs->reps, "algbw_GB/s")),
                                        gbps(med(*gs->reps, "busbw_GB/s"))));
      // each level's host time, the slowest process's: in the step, which runs every level (a parameter
      // server's pull is part of the update), else in grad_sync
      const Row* lr = step ? step : gs;
      if (!t.sync_levels().empty())
        out << labelled(
            "", fmt::format("each level in {}, host time of the slowest process:", step ? "the step" : "grad_sync"));
      for (const SyncLevel& l : t.sync_levels())
        out << labelled(
            "", fmt::format("  {}: {:.3f} ms, algbw {} GB/s, busbw {} GB/s", l.name, med(*lr->reps, l.key + "_ms"),
                            gbps(med(*lr->reps, l.key + "_algbw_GB/s")), gbps(med(*lr->reps, l.key + "_busbw_GB/s"))));
    }
  }
  if (step) {
    std::string v = fmt::format("{:.1f} in the step ({} images per step)", 1000.0 * images / step->ms, images);
    if (t.asynchronous())
      v = fmt::format("{:.1f} in process 0's steps ({} images each; every worker's under asynchronous: below)",
                      1000.0 * images / step->ms, images);
    if (const Row* g = find_row(rows, "step:cuda_graph"))
      v += fmt::format("; {:.1f} replayed as a CUDA Graph", 1000.0 * images / g->ms);
    out << labelled("images/s", v);
  }
  if (!peak.empty()) out << labelled("of peak", peak);
  if (!peer.empty() && t.global_size() == 1) {
    std::vector<std::string> ratios;
    for (const char* ph : {"step", "forward"}) {
      const Row* r = find_row(rows, ph);
      const auto it = peer.ms.find(ph);
      if (!r || it == peer.ms.end()) continue;
      std::string x = fmt::format("{:.2f} for the {}", r->ms / it->second, ph);
      if (auto h = peer.host_ms.find(ph); peer.timing == "cuda events" && h != peer.host_ms.end())
        x += fmt::format(" (host time {:.2f})", med(*r->reps, "host_ms") / h->second);
      ratios.push_back(x);
    }
    if (!ratios.empty())
      out << labelled("stepbench/PT", fmt::format("{} (PyTorch {}; below 1: stepbench is faster)",
                                                  fmt::join(ratios, ", "), peer.torch));
  }
}

// Each note and warning once, with what to do about it.
void print_notes(std::ostream& out, const BenchConfig& c, const std::vector<Row>& rows, double step_ms,
                 const SummaryReporter& rep) {
  std::vector<std::string> over, noisy;
  double worst = 0;
  for (const auto& r : rows) {
    if (part_of_step(r.name) && 100.0 * r.ms / step_ms > 100.0)
      over.push_back(fmt::format("{} ({:.1f}%)", r.name, 100.0 * r.ms / step_ms));
    if (r.cv > 5.0) noisy.push_back(fmt::format("{} {:.1f}%", r.name, r.cv));
    worst = std::max(worst, r.cv);
  }
  if (!over.empty())
    out << wrap(fmt::format("* {} took longer alone than the whole step, of which {} a part: each phase is "
                            "timed on its own, at another moment (the step's own parts: 'inside the step' above). {}",
                            fmt::join(over, ", "), over.size() == 1 ? "it is" : "they are",
                            worst > 5.0 ? "The machine was busy (see the warning): a quieter one closes the gap."
                                        : "A share this far over 100% with a small cv is worth a look."),
                2);
  if (!noisy.empty())
    out << wrap(
        fmt::format(
            "warning: noisy timings, the cv over 5% in {} (of {} repetitions): other work on the machine, most likely. "
            "Remedy: a quieter machine, or more --repetitions (e.g. --repetitions {})",
            fmt::join(noisy, ", "), c.repetitions, std::max(10, 2 * c.repetitions)),
        9);
  for (const auto& e : rep.errors) out << wrap("error: " + e, 7);
}

}  // namespace

void print_per_layer_table(std::ostream& out, const SummaryReporter& rep, const std::string& prefix) {
  struct Shape {
    double ms[3] = {NAN, NAN, NAN};
    double layers = 0;
  };
  const char* kinds[] = {"fwd", "bwd_data", "bwd_filter"};
  std::vector<std::pair<std::string, Shape>> shapes;  // in run order
  for (const auto& name : rep.order) {
    if (name.rfind(prefix + "/conv:", 0) != 0) continue;
    const auto slash = name.rfind('/');
    const std::string shape = name.substr(prefix.size() + 1, slash - prefix.size() - 1), kind = name.substr(slash + 1);
    auto it = std::find_if(shapes.begin(), shapes.end(), [&](const auto& s) { return s.first == shape; });
    if (it == shapes.end()) it = shapes.insert(shapes.end(), {shape, Shape{}});
    const Reps& r = rep.reps.at(name);
    for (int k = 0; k < 3; ++k)
      if (kind == kinds[k]) it->second.ms[k] = med(r);
    it->second.layers = med(r, "layers");
  }
  if (shapes.empty()) return;
  std::size_t w = 5;
  for (const auto& [shape, s] : shapes) w = std::max(w, shape.size());
  out << "\nper layer: each distinct convolution shape alone, median ms per call (the layers' names: --json)\n";
  out << fmt::format("{:<{}} {:>6} {:>10} {:>11} {:>13}\n", "shape", w, "layers", "fwd ms", "bwd_data ms",
                     "bwd_filter ms");
  auto ms = [](double v) { return std::isnan(v) ? std::string("-") : fmt::format("{:.3f}", v); };
  for (const auto& [shape, s] : shapes)
    out << fmt::format("{:<{}} {:>6} {:>10} {:>11} {:>13}\n", shape, w, s.layers, ms(s.ms[0]), ms(s.ms[1]),
                       ms(s.ms[2]));
}

void print_summary(const BenchConfig& c, const Towers& t, const SummaryReporter& rep, const std::string& prefix,
                   const PeerResult& peer, const Feeder& feeder, const MemoryReport& memory, const std::string& peak) {
  const auto& r = c.run;
  const int gpus = t.global_size();
  // asynchronous workers each time their own steps: the rows are process 0's, with its images
  const double images = static_cast<double>(r.batch_per_tower * (t.asynchronous() ? t.size() : gpus));
  const std::vector<Row> rows = phase_rows(c, rep, prefix, feeder);
  const Row* step = find_row(rows, "step");
  const double step_ms = step ? step->ms : NAN;
  std::cout << "\n";
  if (!rows.empty()) {
    print_table(std::cout, rows, step_ms, images, peer, gpus);
    std::cout << fmt::format("(medians of {} repetitions after {} warm-up step{}; {})\n\n", c.repetitions, c.warmup,
                             c.warmup == 1 ? "" : "s",
                             t.backend(0).name() == "cpu" ? "the steady clock around the work"
                                                          : "device time between events on each GPU's stream");
    // what `stepbench compare` can decide from this run and another lone one (compare/compare.hpp)
    const std::string backend = t.backend(0).name() == "cpu" ? "cpu" : "cuda";
    const double sigma = compare::default_run_noise(backend), m = static_cast<double>(rows.size());
    std::cout << wrap(fmt::format("compare: this run and another lone one can show only changes beyond {:.0f}% (runs "
                                  "differ by chance; {}'s stated run-to-run noise, {:.0f}%); scripts/ab.sh's "
                                  "interleaved rounds or a --history decide smaller ones",
                                  100 * std::expm1(compare::normal_quantile(1 - 0.05 / m) * std::sqrt(2.0) * sigma),
                                  backend, 100 * sigma),
                      2)
              << "\n";
  }
  print_answers(std::cout, c, t, rows, images, peer, peak);
  const std::string mem = memory_lines(memory);
  for (std::size_t at = 0, end; (end = mem.find('\n', at)) != std::string::npos; at = end + 1)
    std::cout << wrap(std::string_view(mem).substr(at, end - at), 6);
  print_notes(std::cout, c, rows, step_ms, rep);
  print_per_layer_table(std::cout, rep, prefix);
  if (feeder.active()) {
    std::cout << "input: " << feeder.describe() << "\n";
    const Row* pipe = find_row(rows, "input_pipeline");
    const Row* fed = find_row(rows, "step:data=" + feeder.name());
    const double S = step ? 1000.0 * images / step_ms : NAN;
    const double P = pipe ? 1000.0 * images / pipe->ms : NAN;
    const double D = fed ? 1000.0 * images / fed->ms : NAN;
    print_input_section(std::cout, c, feeder, S, P, D, std::max(1, t.global_size() / std::max(1, t.size())));
    if (r.backend == BackendKind::cpu)
      std::cout << wrap(
          "note: on the cpu backend the decoding threads share the cores with the model, so the fed "
          "step is slower than the synthetic one even when the pipeline alone keeps up",
          6);
    if (const std::string sk = feeder.skipped(); !sk.empty()) std::cout << "input: " << sk << "\n";
  }
}

}  // namespace stepbench
