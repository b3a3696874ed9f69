// A hook around every piece of work a graph launches: per-layer timing, tracing and NVTX ranges
// (src/bench/layer_times.*). Graph::set_probe attaches one; without one nothing is called.
#pragma once

namespace stepbench {

class Stream;

struct GraphProbe {
  virtual ~GraphProbe() = default;
  // Around the launches of one piece of work on s. layer: its index in Graph::layers(), or -1 for
  // the graph's own work. part, a string literal: "fwd" and "bwd" for most layers; conv_bn_relu's
  // "conv_fwd", "bn_relu_fwd", "bn_relu_bwd", "conv_bwd_filter" (with the cast of a 16-bit weight
  // gradient into the fp32 arena) and "conv_bwd_data" (conv_bn's "bn_fwd" and "bn_bwd" without the
  // ReLU); the graph's "weight_cast" (16-bit weights from the fp32 master copy) and "grad_zero"
  // (gradients that are accumulated into).
  virtual void begin(Stream& s, int layer, const char* part) = 0;
  virtual void end(Stream& s) = 0;
};

}  // namespace stepbench
