// --layer-times and --trace (layer_times.hpp): the probe, the probed step, and the medians.
#include "bench/layer_times.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>
#include <utility>

#include "bench/nvtx.hpp"
#include "bench/stats.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace {

double steady_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// oneDNN's implementation of one piece, from what the layer reports: its convolution's "fwd A /
// bwd_data B / bwd_filter C" or its inner product's "fwd A / bwd_data B / bwd_weights C".
std::string piece_implementation(const LayerInfo& info, const std::string& part) {
  const std::string& all = info.is_conv_bn() ? info.conv_algorithm : info.kind == "linear" ? info.implementation : "";
  const char* key = part == "conv_fwd" || (info.kind == "linear" && part == "fwd") ? "fwd "
                    : part == "conv_bwd_data"                                      ? "bwd_data "
                    : part == "conv_bwd_filter"                                    ? "bwd_filter "
                    : info.kind == "linear" && part == "bwd"                       ? "bwd_weights "
                                                                                   : nullptr;
  if (!key || all.empty()) return "";
  const auto named = [&](const std::string& k) -> std::string {
    const auto at = all.find(k);
    if (at == std::string::npos) return "";
    const auto from = at + k.size();
    const auto end = std::min({all.find(" / ", from), all.find(" (", from), all.find(" [", from)});
    return all.substr(from, end == std::string::npos ? std::string::npos : end - from);
  };
  // the fully connected layer's backward piece runs both gradients: both kernels, where they differ
  if (info.kind == "linear" && part == "bwd") {
    const std::string d = named("bwd_data "), w = named("bwd_weights ");
    return d.empty() || d == w ? w : d + "+" + w;
  }
  return named(key);
}

}  // namespace

// Records an event before and after every piece on the tower's stream, and the host clock around
// its launches. Events are kept from step to step (made during the first probed step).
struct ProbedRun::Probe final : GraphProbe {
  struct Open {
    int layer;
    const char* part;
    std::size_t e0;
    double h0;
  };
  struct Done {
    int layer;
    const char* part;
    const char* phase;
    std::size_t e0, e1;
    double h0, h1;
  };
  Backend& be;
  std::vector<std::string> labels;
  double origin;
  std::vector<std::unique_ptr<Event>> ev;
  std::size_t used = 0;
  std::vector<Open> open;
  std::vector<Done> done;
  const char* phase = "";
  double ref_host = 0;  // when event 0 was recorded (the stream was idle: it fired then)
  // activity records: tag k + 1 is piece k of the step (in begin order); the activity clock at ref_host
  bool activity = false;
  struct Tagged {
    int layer;
    const char* part;
    const char* phase;
  };
  std::vector<Tagged> tagged;
  std::uint64_t ref_activity = 0;  // the activity clock at ref_host: the anchor when the marker is missing
  // A 4-byte set launched right after event 0, under its own tag: its start on the device is event 0's
  // moment on the activity clock, so kernels and pieces share the device's own time.
  static constexpr std::uint64_t kMarker = ~std::uint64_t{0};
  Buffer marker;

  Probe(Backend& b, std::vector<std::string> l, double o) : be(b), labels(std::move(l)), origin(o) {}
  double now() const { return steady_ms() - origin; }
  std::size_t record(Stream& s) {
    if (used == ev.size()) ev.push_back(be.create_event());
    be.record(*ev[used], s);
    return used++;
  }
  void start(Stream& s) {  // after a synchronisation
    used = 0;
    done.clear();
    open.clear();
    tagged.clear();
    ref_host = now();
    if (activity) ref_activity = be.activity_clock_ns();
    record(s);
    if (activity) {
      if (!marker.get()) marker = Buffer(be, 256);
      be.push_activity_tag(kMarker);
      be.memset_zero(s, marker.get(), 4);
      be.pop_activity_tag();
    }
  }
  void begin(Stream& s, int layer, const char* part) override {
    if (kNvtxEnabled)
      nvtx_push(layer >= 0 ? labels.at(static_cast<std::size_t>(layer)) + "/" + part : std::string(part));
    if (activity) {
      tagged.push_back({layer, part, phase});
      be.push_activity_tag(tagged.size());
    }
    open.push_back({layer, part, 0, now()});
    open.back().e0 = record(s);
  }
  void end(Stream& s) override {
    SB_CHECK(!open.empty(), "probe: end without begin");
    const Open o = open.back();
    open.pop_back();
    const std::size_t e1 = record(s);
    done.push_back({o.layer, o.part, phase, o.e0, e1, o.h0, now()});
    if (activity) be.pop_activity_tag();
    if (kNvtxEnabled) nvtx_pop();
  }
  // After the step and a synchronisation: the device's records, placed on the run's clock.
  std::vector<KernelSpan> kernels() {
    std::vector<KernelSpan> v;
    if (!activity) return v;
    auto records = be.take_activity();
    std::uint64_t anchor = ref_activity;
    for (const auto& a : records)
      if (a.tag == kMarker) anchor = a.start_ns;
    // the difference in integers first: the clock counts nanoseconds since 1970, past a double's 2^53
    auto ms = [&](std::uint64_t ns) {
      return ref_host + static_cast<double>(static_cast<std::int64_t>(ns - anchor)) * 1e-6;
    };
    for (auto& a : records) {
      if (a.tag == kMarker) continue;
      KernelSpan k{std::move(a.name), ms(a.start_ns), ms(a.end_ns), KernelSpan::kUntagged, "", "", a.stream};
      if (a.tag >= 1 && a.tag <= tagged.size()) {
        const Tagged& t = tagged[a.tag - 1];
        k.layer = t.layer, k.part = t.part, k.phase = t.phase;
      }
      v.push_back(std::move(k));
    }
    return v;
  }
  double dev(std::size_t e) { return ref_host + be.elapsed_ms(*ev[0], *ev[e]); }
  // After the step and a synchronisation: the pieces, the phases they make up and the step.
  std::vector<ProbeSpan> finish() {
    std::vector<ProbeSpan> v;
    for (const auto& d : done) v.push_back({d.layer, d.part, d.phase, dev(d.e0), dev(d.e1), d.h0, d.h1});
    auto cover = [&](const char* name, const char* phase) {  // the span over the pieces of a phase (or all)
      ProbeSpan s{ProbeSpan::kPhase, name, phase ? phase : name, 1e300, -1e300, 1e300, -1e300};
      bool any = false;
      for (const auto& p : v) {
        if (phase && (p.layer == ProbeSpan::kPhase || std::string(p.phase) != phase)) continue;
        s.dev0 = std::min(s.dev0, p.dev0), s.dev1 = std::max(s.dev1, p.dev1);
        s.host0 = std::min(s.host0, p.host0), s.host1 = std::max(s.host1, p.host1);
        any = true;
      }
      if (any) v.push_back(s);
    };
    cover("forward", "forward");
    cover("backward", "backward");
    cover("step", nullptr);
    std::stable_sort(v.begin(), v.end(), [](const ProbeSpan& a, const ProbeSpan& b) {
      return a.dev0 != b.dev0 ? a.dev0 < b.dev0 : a.dev1 > b.dev1;  // parents before their children
    });
    return v;
  }
};

ProbedRun::ProbedRun(Towers& t, bool activity, Feeder* feeder)
    : t_(t), origin_(steady_ms()), feeder_(feeder && feeder->active() ? feeder : nullptr) {
  for (int i = 0; i < t.size(); ++i) {
    std::vector<std::string> labels;
    for (const auto& l : t.graph(i).layers()) labels.push_back(l.label);
    probes_.push_back(std::make_unique<Probe>(t.backend(i), std::move(labels), origin_));
  }
  if (activity) {
    try {
      for (auto& p : probes_) {
        p->be.start_activity();
        p->activity = true;
      }
      activity_ = true;
      activity_note_ = "CUPTI activity records";
    } catch (const UnsupportedError& e) {  // the steps go on without kernels
      for (auto& p : probes_)
        if (p->activity) p->be.stop_activity(), p->activity = false;
      activity_note_ = e.what();
    }
  }
  for (int i = 0; i < t.size(); ++i) t.graph(i).set_probe(probes_[static_cast<std::size_t>(i)].get());
  t.set_sync_timing(true);
  t.set_level_tracing(true);
  if (feeder_) feeder_->trace(true);
}

ProbedRun::~ProbedRun() {
  for (int i = 0; i < t_.size(); ++i) t_.graph(i).set_probe(nullptr);
  t_.set_sync_timing(false);
  t_.set_level_tracing(false);
  if (feeder_) feeder_->trace(false);
  for (auto& p : probes_)
    if (p->activity) p->be.stop_activity();
}

ProbedStep ProbedRun::step() {
  t_.synchronize();
  const int n = t_.size();
  auto each = [&](auto f) {
    for (int i = 0; i < n; ++i) f(*probes_[static_cast<std::size_t>(i)], t_.stream(i));
  };
  each([](Probe& p, Stream& s) { p.start(s); });
  if (feeder_) feeder_->feed();  // the batch this step reads, staged as the timed step:data steps stage it
  auto phase = [&](const char* name) { each([name](Probe& p, Stream&) { p.phase = name; }); };
  NvtxRange nv("step (probed)");
  phase("forward");
  t_.forward_train();
  phase("backward");
  t_.backward(true);
  for (const char* name : {"grad_sync", "update"}) {  // the whole process's, as the towers run them
    phase(name);
    each([name](Probe& p, Stream& s) { p.begin(s, ProbeSpan::kPhase, name); });
    if (std::string(name) == "grad_sync")
      t_.grad_sync();
    else
      t_.update();
    each([](Probe& p, Stream& s) { p.end(s); });
  }
  t_.synchronize();
  ProbedStep st;
  st.levels = t_.take_level_spans();
  for (auto& l : st.levels) l.begin_ms -= origin_, l.end_ms -= origin_;
  for (int i = 0; i < n; ++i) {
    Probe& p = *probes_[static_cast<std::size_t>(i)];
    st.towers.push_back(p.finish());
    auto b = t_.bucket_spans(i, *p.ev[0]);
    for (auto& x : b) x.begin_ms += p.ref_host, x.end_ms += p.ref_host;
    st.buckets.push_back(std::move(b));
    st.kernels.push_back(p.kernels());
    auto staged = t_.staging_span(i, *p.ev[0]);
    if (staged) staged->first += p.ref_host, staged->second += p.ref_host;
    st.staging.push_back(staged);
  }
  if (feeder_) {
    const auto threads = feeder_->take_stage_spans();
    for (std::size_t k = 0; k < threads.size(); ++k)
      for (const StageSpan& s : threads[k])
        st.input.push_back(
            {static_cast<int>(k),
             s.stage == StageSpan::kIdle ? "wait for room" : kStageNames[static_cast<std::size_t>(s.stage)].data(),
             static_cast<double>(s.t0) * 1e-6 - origin_, static_cast<double>(s.t1) * 1e-6 - origin_});
  }
  return st;
}

std::vector<ProbedStep> run_probed_steps(Towers& t, int steps, bool activity, std::string* note, Feeder* feeder) {
  ProbedRun run(t, activity, feeder);
  if (note) *note = run.activity_note();
  run.step();  // makes the events (and CUPTI's first buffers); not kept
  std::vector<ProbedStep> v;
  v.reserve(static_cast<std::size_t>(steps));
  for (int i = 0; i < steps; ++i) v.push_back(run.step());
  return v;
}

double device_peak_tflops(const std::string& device_name, const std::string& precision) {
  struct Peak {
    const char* name;
    double fp32, tf32, half;  // dense, from NVIDIA's data sheets
  };
  // the first match wins: the PCIe H100 before the SXM one
  static const Peak kPeaks[] = {{"H100 PCIe", 51.2, 378.0, 756.0},
                                {"H100 NVL", 60.0, 418.0, 835.0},
                                {"H100", 66.9, 494.7, 989.4},
                                {"H200", 66.9, 494.7, 989.4},
                                {"A100", 19.5, 156.0, 312.0}};
  for (const auto& p : kPeaks) {
    if (device_name.find(p.name) == std::string::npos) continue;
    if (precision == "fp32") return p.fp32;
    if (precision == "tf32") return p.tf32;
    return p.half;
  }
  return 0;
}

LayerTimes summarize_layer_times(const std::vector<ProbedStep>& steps, const Towers& t, double peak_tflops) {
  LayerTimes lt;
  lt.steps = static_cast<int>(steps.size());
  lt.peak_tflops = peak_tflops;
  lt.clock = t.backend(0).name() == "cpu" ? "steady clock" : "device events";
  if (steps.empty()) return lt;
  const auto layers = t.graph(0).layers();
  // per piece (layer, part, phase): its time in every step
  using Key = std::tuple<int, std::string, std::string>;
  std::map<Key, std::vector<double>> times;
  std::vector<Key> order;
  std::map<std::string, std::vector<double>> phases;
  std::vector<double> idle, parts, rest;
  // CPU towers run one after another on this thread: tower 0's step holds the others' pieces too
  lt.towers_counted = t.backend(0).name() == "cpu" ? t.size() : 1;
  for (const auto& st : steps) {
    const auto& v = st.towers.at(0);
    std::map<Key, double> sum;
    std::vector<const ProbeSpan*> leaves;
    for (const auto& s : v) {
      const bool leaf = s.layer >= -1 || std::string(s.part) == "grad_sync" || std::string(s.part) == "update";
      if (s.layer == ProbeSpan::kPhase) phases[s.part].push_back(s.dev1 - s.dev0);
      if (!leaf) continue;
      leaves.push_back(&s);
      if (s.layer == ProbeSpan::kPhase) continue;
      const Key k{s.layer, s.part, s.phase};
      if (!times.count(k) && !sum.count(k)) order.push_back(k);
      sum[k] += s.dev1 - s.dev0;
    }
    for (const auto& [k, ms] : sum) times[k].push_back(ms);
    for (int i = 1; i < lt.towers_counted; ++i)
      for (const auto& s : st.towers.at(static_cast<std::size_t>(i)))
        if (s.layer >= -1) leaves.push_back(&s);  // the sync and update spans are the same on every tower
    std::sort(leaves.begin(), leaves.end(), [](auto* a, auto* b) { return a->dev0 < b->dev0; });
    double gap = 0, total = 0;
    for (std::size_t i = 0; i < leaves.size(); ++i) {
      total += leaves[i]->dev1 - leaves[i]->dev0;
      if (i) gap += std::max(0.0, leaves[i]->dev0 - leaves[i - 1]->dev1);
    }
    idle.push_back(gap);
    parts.push_back(total);
    for (const auto& s : v)
      if (s.layer == ProbeSpan::kPhase && std::string(s.part) == "step") rest.push_back(s.dev1 - s.dev0 - total);
  }
  auto med = [&](const std::string& phase) { return phases.count(phase) ? median(phases[phase]) : 0.0; };
  lt.step_ms = med("step");
  lt.forward_ms = med("forward");
  lt.backward_ms = med("backward");
  lt.sync_ms = med("grad_sync");
  lt.update_ms = med("update");
  lt.idle_ms = median(idle);
  lt.parts_ms = median(parts);  // per step, then the median: the medians of the pieces need not add up
  lt.remainder_ms = median(rest);
  for (const auto& k : order) {
    const auto& [layer, part, phase] = k;
    LayerTimes::Row r;
    r.layer = layer;
    r.part = part;
    r.pass = phase;
    if (layer >= 0) {
      const auto& info = layers.at(static_cast<std::size_t>(layer));
      r.label = info.label;
      r.kind = info.kind;
      const double f = 2.0 * static_cast<double>(info.macs);
      if (part.rfind("conv_", 0) == 0 || (info.kind == "linear" && part == "fwd")) r.flops = f;
      if (info.kind == "linear" && part == "bwd") r.flops = 2 * f;  // data and weight gradients
      if (lt.clock == "steady clock") r.implementation = piece_implementation(info, part);
    } else {
      r.label = "(graph)";
      r.kind = "graph";
    }
    r.ms = median(times[k]);
    lt.rows.push_back(std::move(r));
  }
  return lt;
}

nlohmann::json layer_times_json(const LayerTimes& lt) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : lt.rows) {
    nlohmann::json j{{"layer", r.label},
                     {"index", r.layer},
                     {"kind", r.kind},
                     {"part", r.part},
                     {"pass", r.pass},
                     {"median_ms", r.ms},
                     {"share_of_step", lt.step_ms > 0 ? r.ms / lt.step_ms : 0.0}};
    if (!r.implementation.empty()) j["implementation"] = r.implementation;
    if (r.flops > 0 && r.ms > 0) {
      j["tflops"] = r.flops / (r.ms * 1e9);
      if (lt.peak_tflops > 0) j["percent_of_peak"] = 100.0 * r.flops / (r.ms * 1e9) / lt.peak_tflops;
    }
    if (!lt.row_kernels.empty()) {
      nlohmann::json ks = nlohmann::json::array();
      for (const auto& k : lt.row_kernels[rows.size()])
        ks.push_back({{"name", k.name}, {"median_ms", k.ms}, {"launches", k.count}});
      j["kernels"] = std::move(ks);
    }
    rows.push_back(std::move(j));
  }
  nlohmann::json activity{{"records", lt.activity.empty() ? "not asked" : lt.activity}};
  if (lt.kernels > 0) {
    nlohmann::json gaps = nlohmann::json::array();
    for (const auto& g : lt.largest_gaps)
      gaps.push_back({{"ms", g.ms}, {"step", g.step}, {"after", g.after}, {"before", g.before}});
    activity.update({{"kernels_per_step", lt.kernels},
                     {"first_to_last_ms", lt.window_ms},
                     {"busy_ms", lt.busy_ms},
                     {"idle_ms", lt.gap_ms},
                     {"idle_gaps", lt.gaps},
                     {"largest_gaps", gaps}});
  }
  return {{"tower", 0},
          {"device_activity", activity},
          {"probed_steps", lt.steps},
          {"clock", lt.clock},
          {"step_ms", lt.step_ms},
          {"forward_ms", lt.forward_ms},
          {"backward_ms", lt.backward_ms},
          {"grad_sync_ms", lt.sync_ms},
          {"update_ms", lt.update_ms},
          {"pieces_sum_ms", lt.parts_ms},
          {"remainder_ms", lt.remainder_ms},
          {"device_idle_between_pieces_ms", lt.idle_ms},
          {"peak_tflops", lt.peak_tflops > 0 ? nlohmann::json(lt.peak_tflops) : nlohmann::json(nullptr)},
          {"pieces", rows}};
}

}  // namespace stepbench
