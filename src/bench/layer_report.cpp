// --layer-times' section of the summary and --trace's file (layer_times.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <set>

#include "tensor/error.hpp"

#include "bench/layer_times.hpp"
#include "bench/text.hpp"

namespace stepbench {
namespace {

// What kind of work a piece is, for the summary's per-kind lines.
std::string work_kind(const LayerTimes::Row& r) {
  if (r.part.size() > 10 && r.part.compare(r.part.size() - 10, 10, "_recompute") == 0) return "batch norm recomputed";
  if (r.part.rfind("conv_", 0) == 0) return "convolution";
  if (r.part.rfind("bn_relu", 0) == 0) return "batch norm + ReLU";
  if (r.part.rfind("bn_", 0) == 0) return "batch norm";
  if (r.kind == "add_relu") return "residual add + ReLU";
  if (r.kind == "pool") return "pooling";
  if (r.kind == "linear") return "fully connected";
  if (r.kind == "cross_entropy") return "loss";
  if (r.kind == "graph") return "weight cast, gradient zeroing";
  return r.kind;
}

constexpr int kLabel = 34;  // the tables' first column: with the others, 100 columns at most
// A name in the first column, shortened at its start where it is longer ("...ch3x3dbl_3b").
std::string cell(const std::string& name) {
  return name.size() <= kLabel ? name : "..." + name.substr(name.size() - (kLabel - 3));
}
// A sentence of the section, wrapped at 100 columns under its first word.
void say(const std::string& text) { std::cout << wrap(text, 4, kWidth, "  "); }

std::string pct(double part, double whole) { return whole > 0 ? fmt::format("{:.1f}", 100.0 * part / whole) : "-"; }
std::string ratio(double b, double f) { return f > 0 ? fmt::format("{:.2f}", b / f) : "-"; }

}  // namespace

void print_layer_times(const LayerTimes& lt, int top, double timed_step_ms) {
  std::cout << "\n"
            << wrap(fmt::format("layer times: tower 0 inside the real step, medians of {} probed steps after the timed "
                                "ones ({}; --json has every piece)",
                                lt.steps, lt.clock),
                    2);
  say(fmt::format(
      "probed step {:.3f} ms: forward {:.3f}, backward {:.3f} ({}x forward), grad_sync {:.3f}, update {:.3f}",
      lt.step_ms, lt.forward_ms, lt.backward_ms, ratio(lt.backward_ms, lt.forward_ms), lt.sync_ms, lt.update_ms));
  say(fmt::format(
      "the pieces{} add up to {:.3f} ms, {}% of it; the remainder {:.3f} ms is launch gaps and synchronisation "
      "(the {} between consecutive pieces: {:.3f} ms)",
      lt.towers_counted > 1
          ? fmt::format(" of all {} towers (on the CPU they run one after another)", lt.towers_counted)
          : "",
      lt.parts_ms, pct(lt.parts_ms, lt.step_ms), lt.remainder_ms,
      lt.clock == "device events" ? "device idle" : "host's bookkeeping", lt.idle_ms));
  if (lt.kernels > 0) {
    std::string d = fmt::format(
        "the device ({}: {} kernels, copies and sets per step) ran work {:.3f} of the {:.3f} ms from the first's "
        "start to the last's end ({}%); idle {:.3f} ms in {} gaps",
        lt.activity, lt.kernels, lt.busy_ms, lt.window_ms, pct(lt.busy_ms, lt.window_ms), lt.gap_ms, lt.gaps);
    if (!lt.largest_gaps.empty()) {
      const auto& g = lt.largest_gaps.front();
      d += fmt::format(", the largest {:.3f} ms between {} and {}", g.ms, g.after, g.before);
    }
    say(d);
  } else if (!lt.activity.empty()) {
    say("no kernel names: " + lt.activity);
  }
  if (!std::isnan(timed_step_ms))
    say(fmt::format("the timed step's median was {:.3f} ms: the probes' events and clock reads cost {}%", timed_step_ms,
                    fmt::format("{:+.1f}", 100.0 * (lt.step_ms / timed_step_ms - 1))));
  struct Sum {
    double f = 0, b = 0, bd = 0, bf = 0, flops = 0, flop_ms = 0;
    std::string kind;
  };
  std::map<std::string, Sum> kinds;
  std::vector<std::string> kind_order;
  std::map<int, Sum> layers;
  std::map<int, std::string> label;
  for (const auto& r : lt.rows) {
    const std::string k = work_kind(r);
    if (!kinds.count(k)) kind_order.push_back(k);
    for (Sum* s : {&kinds[k], &layers[r.layer]}) {
      (r.pass == "forward" ? s->f : s->b) += r.ms;
      if (r.part == "conv_bwd_data") s->bd += r.ms;
      if (r.part == "conv_bwd_filter") s->bf += r.ms;
      if (r.flops > 0) s->flops += r.flops, s->flop_ms += r.ms;
    }
    label[r.layer] = r.label;
    layers[r.layer].kind = r.kind;
  }
  std::cout << fmt::format("  {:<{}} {:>11} {:>12} {:>8} {:>10}\n", "by kind of work", kLabel, "forward ms",
                           "backward ms", "bwd/fwd", "% of step");
  for (const auto& k : kind_order) {
    const Sum& s = kinds[k];
    std::cout << fmt::format("  {:<{}} {:>11.3f} {:>12.3f} {:>8} {:>10}\n", cell(k), kLabel, s.f, s.b, ratio(s.b, s.f),
                             pct(s.f + s.b, lt.step_ms));
    if (k == "convolution")
      std::cout << fmt::format("  {:<{}} {:>11} {:>12.3f}   data\n  {:<{}} {:>11} {:>12.3f}   filter\n", "", kLabel, "",
                               s.bd, "", kLabel, "", s.bf);
  }
  for (const auto& [name, ms] :
       {std::pair<const char*, double>{"gradient sync (exposed)", lt.sync_ms}, {"update", lt.update_ms}})
    std::cout << fmt::format("  {:<{}} {:>11} {:>12.3f} {:>8} {:>10}\n", name, kLabel, "", ms, "", pct(ms, lt.step_ms));
  std::vector<int> idx;
  for (const auto& [i, s] : layers)
    if (i >= 0) idx.push_back(i);
  std::sort(idx.begin(), idx.end(),
            [&](int a, int b) { return layers[a].f + layers[a].b > layers[b].f + layers[b].b; });
  if (static_cast<int>(idx.size()) > top) idx.resize(static_cast<std::size_t>(top));
  std::cout << fmt::format("  {:<{}} {:>11} {:>12} {:>8} {:>10} {:>8}{}\n", fmt::format("top {} layers", idx.size()),
                           kLabel, "forward ms", "backward ms", "bwd/fwd", "% of step", "TFLOP/s",
                           lt.peak_tflops > 0 ? fmt::format(" {:>9}", "% of peak") : "");
  for (int i : idx) {
    const Sum& s = layers[i];
    const double tf = s.flop_ms > 0 ? s.flops / (s.flop_ms * 1e9) : 0;
    std::cout << fmt::format("  {:<{}} {:>11.3f} {:>12.3f} {:>8} {:>10} {:>8}{}\n", cell(label[i]), kLabel, s.f, s.b,
                             ratio(s.b, s.f), pct(s.f + s.b, lt.step_ms), tf > 0 ? fmt::format("{:.3f}", tf) : "-",
                             lt.peak_tflops > 0 ? fmt::format(" {:>9}", tf > 0 ? pct(tf, lt.peak_tflops) : "-") : "");
  }
  // the CPU: oneDNN's implementation of every convolution and fully connected piece of the top
  // layers (--json has every layer's), and once, any piece on oneDNN's reference code (slow)
  std::map<int, std::vector<const LayerTimes::Row*>> impl;
  std::vector<std::string> slow;
  for (const auto& r : lt.rows) {
    if (r.implementation.empty()) continue;
    impl[r.layer].push_back(&r);
    if (r.implementation.rfind("ref", 0) == 0 || r.implementation.find(":ref") != std::string::npos)
      slow.push_back(r.label + " " + r.part);
  }
  if (!impl.empty()) {
    std::cout << "  oneDNN's implementations of the top layers (per piece):\n";
    for (int i : idx) {
      if (!impl.count(i)) continue;
      std::string v;
      for (const auto* r : impl[i])
        v += fmt::format("{}{} {}", v.empty() ? "" : ", ", r->part.rfind("conv_", 0) == 0 ? r->part.substr(5) : r->part,
                         r->implementation);
      std::cout << wrap(fmt::format("{}: {}", label[i], v), 6, kWidth, "    ");
    }
    if (!slow.empty())
      say(
          fmt::format("{} piece{} ran on oneDNN's reference code, its slow path (a shape or type its fast kernels "
                      "do not take): {}",
                      slow.size(), slow.size() == 1 ? "" : "s", slow.front() + (slow.size() > 1 ? ", ..." : "")));
  }
  if (lt.row_kernels.empty()) return;
  // the kernels behind the top layers' largest pieces
  std::cout << "  kernels of the top layers' largest pieces (median ms per step, launches):\n";
  for (std::size_t n = 0; n < std::min<std::size_t>(idx.size(), 5); ++n) {
    std::size_t best = lt.rows.size();
    for (std::size_t r = 0; r < lt.rows.size(); ++r)
      if (lt.rows[r].layer == idx[n] && (best == lt.rows.size() || lt.rows[r].ms > lt.rows[best].ms)) best = r;
    if (best == lt.rows.size()) continue;
    const auto& r = lt.rows[best];
    std::cout << fmt::format("    {}/{} ({}, {:.3f} ms):\n", r.label, r.part, r.pass, r.ms);
    for (std::size_t k = 0; k < std::min<std::size_t>(lt.row_kernels[best].size(), 3); ++k) {
      const auto& kr = lt.row_kernels[best][k];
      constexpr std::size_t kName = kWidth - 20;  // after "      12345.678 123x "
      std::cout << fmt::format("      {:>8.3f} {:>3}x {}\n", kr.ms, kr.count,
                               kr.name.size() > kName ? kr.name.substr(0, kName - 3) + "..." : kr.name);
    }
  }
}

nlohmann::json trace_json(const std::vector<ProbedStep>& steps, const Towers& t, const nlohmann::json& meta) {
  nlohmann::json ev = nlohmann::json::array();
  const bool host_track = t.backend(0).name() != "cpu";  // on the CPU the host does the work: one track
  const auto& buckets = t.buckets();
  for (int i = 0; i < t.size(); ++i) {
    const int pid = t.rank() * t.size() + i;
    const auto layers = t.graph(i).layers();
    auto meta_ev = [&](const char* what, int tid, const std::string& name) {
      nlohmann::json e{{"ph", "M"}, {"name", what}, {"pid", pid}, {"args", {{"name", name}}}};
      if (tid) e["tid"] = tid;
      ev.push_back(std::move(e));
    };
    meta_ev("process_name", 0,
            fmt::format("tower {}{} ({})", pid, t.processes() > 1 ? fmt::format(", rank {}", t.rank()) : "",
                        t.backend(i).device_name()));
    ev.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    meta_ev("thread_name", 1, host_track ? "device: compute stream" : "compute (steady clock)");
    if (host_track) meta_ev("thread_name", 2, "host: launches");
    if (t.sync_bytes() > 0) meta_ev("thread_name", 3, "communication: gradient buckets");
    const bool staged = std::any_of(steps.begin(), steps.end(), [&](const ProbedStep& s) {
      return s.staging.size() > static_cast<std::size_t>(i) && s.staging[static_cast<std::size_t>(i)];
    });
    if (staged) meta_ev("thread_name", 4, "copy stream: the input batch staged");
    // the process's sync levels, a track each (tids 5..7), under its first tower
    const std::vector<SyncLevel> levels = i == 0 ? t.sync_levels() : std::vector<SyncLevel>{};
    for (std::size_t l = 0; l < levels.size(); ++l)
      meta_ev("thread_name", static_cast<int>(5 + l), fmt::format("communication: {} (host)", levels[l].name));
    auto span = [&](int tid, const std::string& name, const char* cat, double b, double e, nlohmann::json args) {
      ev.push_back({{"ph", "X"},
                    {"name", name},
                    {"cat", cat},
                    {"pid", pid},
                    {"tid", tid},
                    {"ts", b * 1e3},
                    {"dur", std::max(0.0, e - b) * 1e3},
                    {"args", std::move(args)}});
    };
    for (std::size_t k = 0; k < steps.size(); ++k) {
      const auto& v = steps[k].towers.at(static_cast<std::size_t>(i));
      for (int tid : {1, 2}) {
        if (tid == 2 && !host_track) continue;
        auto b = [&](const ProbeSpan& s) { return tid == 1 ? s.dev0 : s.host0; };
        auto e = [&](const ProbeSpan& s) { return tid == 1 ? s.dev1 : s.host1; };
        for (std::size_t j = 0; j < v.size(); ++j) {
          const ProbeSpan& s = v[j];
          if (s.layer == ProbeSpan::kPhase) {
            span(tid, s.part, "phase", b(s), e(s), {{"step", k}});
            continue;
          }
          // a layer's consecutive pieces under one span named after it
          std::size_t n = j;
          while (n + 1 < v.size() && v[n + 1].layer == s.layer && std::string(v[n + 1].phase) == s.phase) ++n;
          const std::string lab = s.layer >= 0 ? layers.at(static_cast<std::size_t>(s.layer)).label : s.part;
          const std::string kind = s.layer >= 0 ? layers.at(static_cast<std::size_t>(s.layer)).kind : "graph";
          if (n > j) span(tid, lab, "layer", b(s), e(v[n]), {{"kind", kind}, {"pass", s.phase}, {"step", k}});
          for (std::size_t m = j; m <= n; ++m)
            span(tid, n > j ? std::string(v[m].part) : lab, "piece", b(v[m]), e(v[m]),
                 {{"layer", lab}, {"kind", kind}, {"part", v[m].part}, {"step", k}});
          j = n;
        }
      }
      for (const auto& bs : steps[k].buckets.at(static_cast<std::size_t>(i)))
        span(3, fmt::format("bucket {}", bs.bucket), "sync", bs.begin_ms, bs.end_ms,
             {{"bytes", buckets.at(bs.bucket).second * sizeof(float)}, {"step", k}, {"sync", t.sync_name()}});
      for (const LevelSpan& l : steps[k].levels)
        if (l.level < levels.size())
          span(static_cast<int>(5 + l.level), levels[l.level].name, "sync level", l.begin_ms, l.end_ms,
               {{"step", k}, {"level", levels[l.level].key}});
      if (steps[k].staging.size() > static_cast<std::size_t>(i) && steps[k].staging[static_cast<std::size_t>(i)]) {
        const auto [b, e] = *steps[k].staging[static_cast<std::size_t>(i)];
        span(4, "stage batch", "input", b, e, {{"step", k}});
      }
    }
    // The device's kernels, copies and sets (its activity records: CUPTI), a track per stream: each
    // piece's kernels under a span of the piece (the cover of its kernels on that stream). A piece
    // that overlaps the one before on the stream (Hopper's programmatic dependent launch lets a kernel
    // start before the one before it ends) goes on a lane more; where a piece's own kernels overlap,
    // they are spread over lanes and the piece's span stands alone.
    std::map<std::uint32_t, std::vector<double>> lanes;  // stream -> each lane's last end
    std::map<std::pair<std::uint32_t, std::size_t>, int> tids;
    int next_tid = 10;
    auto place = [&](std::uint32_t stream, double t0, double t1) {  // the lane's track
      auto& l = lanes[stream];
      std::size_t lane = 0;
      while (lane < l.size() && l[lane] > t0) ++lane;
      if (lane == l.size()) l.push_back(-1e300);
      l[lane] = t1;
      auto [it, fresh] = tids.try_emplace({stream, lane}, next_tid);
      if (fresh)
        meta_ev("thread_name", next_tid++,
                fmt::format("device: stream {} kernels (CUPTI){}", stream,
                            lane ? fmt::format(", overlapping {}", lane) : ""));
      return it->second;
    };
    auto label_of = [&](const KernelSpan& ks) {
      return ks.layer == KernelSpan::kUntagged ? std::string("(no piece)")
             : ks.layer >= 0                   ? layers.at(static_cast<std::size_t>(ks.layer)).label
                                               : std::string(ks.part);
    };
    for (std::size_t k = 0; k < steps.size(); ++k) {
      if (steps[k].kernels.size() <= static_cast<std::size_t>(i)) continue;
      std::map<std::uint32_t, std::vector<const KernelSpan*>> by_stream;  // in start order
      for (const KernelSpan& ks : steps[k].kernels[static_cast<std::size_t>(i)]) by_stream[ks.stream].push_back(&ks);
      for (const auto& [stream, v] : by_stream) {
        for (std::size_t a = 0; a < v.size();) {
          std::size_t b = a + 1;  // [a, b): one piece's consecutive kernels (an untagged one alone)
          while (b < v.size() && v[a]->layer != KernelSpan::kUntagged && v[b]->layer == v[a]->layer &&
                 std::string(v[b]->part) == v[a]->part && std::string(v[b]->phase) == v[a]->phase)
            ++b;
          double t0 = v[a]->t0, t1 = v[a]->t1;
          bool overlap = false;
          for (std::size_t m = a + 1; m < b; ++m) {
            overlap = overlap || v[m]->t0 < t1;
            t1 = std::max(t1, v[m]->t1);
          }
          const std::string lab = label_of(*v[a]);
          const bool piece = v[a]->layer != KernelSpan::kUntagged;
          const int tid = place(stream, t0, t1);
          if (piece)
            span(tid, lab + "/" + v[a]->part, "piece", t0, t1,
                 {{"layer", lab}, {"part", v[a]->part}, {"pass", v[a]->phase}, {"step", k}, {"kernels", b - a}});
          for (std::size_t m = a; m < b; ++m)
            span(overlap ? place(stream, v[m]->t0, v[m]->t1) : tid, v[m]->name, "kernel", v[m]->t0, v[m]->t1,
                 {{"layer", lab}, {"part", v[m]->part}, {"pass", v[m]->phase}, {"step", k}, {"stream", stream}});
          a = b;
        }
      }
    }
  }
  // The input pipeline's threads (one process of this rank's, after its towers): each stage of each
  // image, the batches' bookkeeping and the waits for room, as they happened during the probed steps.
  const int input_pid = t.global_size() + t.rank();
  bool input = false;
  for (std::size_t k = 0; k < steps.size(); ++k)
    for (const InputSpan& s : steps[k].input) {
      if (!input) {
        ev.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", input_pid},
                      {"args", {{"name", fmt::format("input pipeline (rank {})", t.rank())}}}});
        ev.push_back(
            {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", input_pid}, {"args", {{"sort_index", input_pid}}}});
        input = true;
      }
      ev.push_back({{"ph", "X"},
                    {"name", s.stage},
                    {"cat", "input"},
                    {"pid", input_pid},
                    {"tid", s.thread + 1},
                    {"ts", s.t0 * 1e3},
                    {"dur", std::max(0.0, s.t1 - s.t0) * 1e3},
                    {"args", {{"step", k}}}});
    }
  if (input) {
    std::set<int> threads;
    for (const auto& st : steps)
      for (const auto& s : st.input) threads.insert(s.thread);
    for (int th : threads)
      ev.push_back({{"ph", "M"},
                    {"name", "thread_name"},
                    {"pid", input_pid},
                    {"tid", th + 1},
                    {"args", {{"name", fmt::format("thread {}", th)}}}});
  }
  // per track in time order, parents (the longer span) before the children that start with them
  std::stable_sort(ev.begin(), ev.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    const bool ma = a["ph"] == "M", mb = b["ph"] == "M";
    if (ma || mb) return ma && !mb;
    for (const char* k : {"pid", "tid"})
      if (a[k] != b[k]) return a[k].get<int>() < b[k].get<int>();
    const double ta = a["ts"].get<double>(), tb = b["ts"].get<double>();
    return ta != tb ? ta < tb : a["dur"].get<double>() > b["dur"].get<double>();
  });
  return {{"traceEvents", ev}, {"displayTimeUnit", "ms"}, {"otherData", meta}};
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  const std::string tmp = path + ".partial";
  {
    std::ofstream f(tmp);
    f << j.dump() << "\n";
    if (!f) throw Error(fmt::format("could not write {} ({})", tmp, std::strerror(errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw Error(fmt::format("could not write {} ({})", path, why));
  }
}

void add_to_json_file(const std::string& path, const std::string& key, const nlohmann::json& v) {
  // As text, before the object's closing brace: Google Benchmark's file keeps its own formatting,
  // and the NaN and Infinity it writes for a cv of all-zero counters (which JSON parsers refuse) stay.
  std::ifstream f(path);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto close = text.find_last_not_of(" \t\r\n");
  if (!f.good() && !f.eof()) throw Error(fmt::format("could not read {} ({})", path, std::strerror(errno)));
  if (close == std::string::npos || text[close] != '}' || text.find('{') == std::string::npos)
    throw Error(fmt::format("{} is not the JSON object expected: {} was not added", path, key));
  const bool empty = text.find_last_not_of(" \t\r\n", close - 1) == text.find('{');
  text = text.substr(0, close) + (empty ? "" : ",") + "\n  " + nlohmann::json(key).dump() + ": " + v.dump() + "\n}\n";
  const std::string tmp = path + ".partial";
  {
    std::ofstream o(tmp, std::ios::trunc);
    o << text;
    if (!o) throw Error(fmt::format("could not write {} ({})", tmp, std::strerror(errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw Error(fmt::format("could not write {} ({})", path, why));
  }
}

}  // namespace stepbench
