// --per-layer: every distinct convolution shape of the model (DeepBench style), timed alone in
// each direction (fwd, bwd_data, bwd_filter) on tower 0's backend.
#pragma once
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.hpp"
#include "backend/slow_conv.hpp"
#include "bench/interrupt.hpp"
#include "bench/progress.hpp"
#include "comm/process_group.hpp"
#include "graph/graph.hpp"

namespace stepbench {

struct ConvShape {
  Shape x;
  std::int64_t cout;
  ConvParams p;
  int count = 0;                    // layers of this shape
  std::vector<std::string> layers;  // their names
  auto key() const {
    return std::make_tuple(x.n, x.c, x.h, x.w, cout, p.kh, p.kw, p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.groups);
  }
  std::string name() const;
};

std::vector<ConvShape> distinct_convs(const Graph& g);

// The buffers and ops of the per-layer benchmarks, kept alive while they run.
class PerLayerBench {
 public:
  // Registers prefix/<shape>/{fwd,bwd_data,bwd_filter} for every distinct conv shape of g; after a
  // signal (stop) they are marked cut short instead of run. stop must outlive the benchmarks.
  // progress (may be null): told of every call.
  PerLayerBench(Backend& be, const Graph& g, Layout l, DType t, const std::string& prefix, int repetitions,
                const ProcessGroup& group, const SlowConvFault& fault, const Interrupt& stop,
                Progress* progress = nullptr);
  int fixtures() const { return 3 * static_cast<int>(rigs_.size()); }
  ~PerLayerBench();

 private:
  struct Rig;
  std::vector<std::unique_ptr<Rig>> rigs_;
};

}  // namespace stepbench
