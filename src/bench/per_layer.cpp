#include "bench/per_layer.hpp"

#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <vector>

#include "bench/gpu_state.hpp"

namespace stepbench {

std::string ConvShape::name() const { return conv_shape_name(x, cout, p); }

std::vector<ConvShape> distinct_convs(const Graph& g) {
  std::vector<ConvShape> v;
  for (const auto& l : g.layers()) {
    if (!l.is_conv_bn() && l.kind != "conv") continue;  // every convolution: a unit's, or alone (VGG's)
    ConvShape s{g.shape_of(l.in[0]), g.shape_of(l.out).c, l.conv, 0, {}};
    auto it = std::find_if(v.begin(), v.end(), [&](const ConvShape& o) { return o.key() == s.key(); });
    if (it == v.end()) {
      s.count = 1;
      s.layers = {l.name};
      v.push_back(s);
    } else {
      ++it->count;
      it->layers.push_back(l.name);
    }
  }
  return v;
}

// Buffers and the op for timing one conv shape alone.
struct PerLayerBench::Rig {
  std::unique_ptr<ConvOp> op;
  Buffer x, y, w, dw, ws;
  TensorDesc xd, yd;
  Rig(Backend& be, const ConvShape& s, Layout l, DType t, const SlowConvFault& fault) {
    xd = TensorDesc::dense(s.x, t, l);
    yd = TensorDesc::dense(conv_output_shape(s.x, s.cout, s.p), t, l);
    // the filter kept as the graph keeps it (the backend's own storage where it has one)
    const auto storage = be.conv_filter_storage(xd, yd, s.p);
    op = with_fault(storage ? be.make_conv_stored(xd, yd, s.p, *storage) : be.make_conv(xd, yd, s.p), s.x, s.cout, s.p,
                    fault);
    x = Buffer(be, xd.bytes());
    y = Buffer(be, yd.bytes());
    const std::size_t logical = static_cast<std::size_t>(s.cout * (s.x.c / s.p.groups) * s.p.kh * s.p.kw);
    const std::size_t wn = storage ? storage->floats() : logical;
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
    // the filter in the convolution's type (a 16-bit one's bytes cast from fp32, as the graph's are)
    std::vector<float> stored(wn, 0.01f);
    if (storage) {  // its padding zero
      std::vector<float> plain(logical, 0.01f);
      storage->to_storage(plain.data(), stored.data());
    }
    be.copy(st, dw.get(), stored.data(), wn * sizeof(float));
    if (t == DType::f32)
      be.copy(st, w.get(), dw.get(), wn * sizeof(float));
    else
      be.cast(st, dw.get(), DType::f32, w.get(), t, wn);
    be.synchronize(st);
  }
};

PerLayerBench::PerLayerBench(Backend& be, const Graph& g, Layout l, DType t, const std::string& prefix, int repetitions,
                             const ProcessGroup& group, const SlowConvFault& fault, const Interrupt& stop,
                             Progress* progress) {
  for (const auto& c : distinct_convs(g)) {
    rigs_.push_back(std::make_unique<Rig>(be, c, l, t, fault));
    Rig* rig = rigs_.back().get();
    const std::int64_t cin = c.x.c / c.p.groups;  // each output's input channels
    const double macs = static_cast<double>(conv_output_shape(c.x, c.cout, c.p).numel() * c.p.kh * c.p.kw * cin);
    const std::string label = fmt::format("{}", fmt::join(c.layers, ", "));  // the model's layers of this shape
    for (const std::string kind : {"fwd", "bwd_data", "bwd_filter"}) {
      const std::string name = prefix + "/" + c.name() + "/" + kind;
      benchmark::RegisterBenchmark(
          name.c_str(),
          [&be, &group, &stop, rig, kind, macs, label, count = c.count, progress, shown = c.name() + "/" + kind,
           repetitions](benchmark::State& st) {
            if (stop.skip(st)) return;
            if (progress) progress->repetition(shown, static_cast<long long>(st.max_iterations), repetitions);
            auto& s = be.default_stream();
            auto run = [&] {
              const Tensor x{rig->x.get(), rig->xd}, y{rig->y.get(), rig->yd};
              if (kind == "fwd")
                rig->op->forward(s, x, rig->w.get(), y, rig->ws.get());
              else if (kind == "bwd_data")
                rig->op->backward_data(s, y, rig->w.get(), x, 0.0f, rig->ws.get());
              else
                rig->op->backward_filter(s, x, y, rig->dw.get(), rig->ws.get());
            };
            run();  // warm-up
            be.synchronize(s);
            auto e0 = be.create_event(), e1 = be.create_event();
            GpuStateProbe gpu;
            gpu.read(be);
            for (auto _ : st) {
              if (stop.stop_in_loop(st)) break;
              be.record(*e0, s);
              run();
              be.record(*e1, s);
              be.synchronize(s);
              st.SetIterationTime(group.allreduce_max(be.elapsed_ms(*e0, *e1)) / 1e3);
            }
            st.counters["MACs"] = macs;
            st.counters["GFLOP/s"] =
                benchmark::Counter(2.0 * macs / 1e9, benchmark::Counter::kIsIterationInvariantRate);
            st.counters["layers"] = count;
            gpu.read(be);
            gpu.report(st);
            st.SetLabel(label);
          })
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

PerLayerBench::~PerLayerBench() = default;

}  // namespace stepbench
