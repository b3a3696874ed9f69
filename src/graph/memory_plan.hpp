// The step's memory plan: every buffer of a graph's one device arena, when it is live in the
// schedule of the step (the inference forward; the training forward, backward and update), and
// where it sits. Buffers whose lifetimes do not overlap share space (graph/liveness.*: lifetimes
// from what each layer declares it reads and writes; graph/assign.cpp: the offsets). Here: the
// plan as data, the checker that verifies it and the peak bytes per phase, for reports and tests.
#pragma once
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace stepbench {

// The phases the plan reports a peak for. forward_only: the inference forward (--phases forward).
enum class MemoryPhase { forward_only, training_forward, backward, update };
inline constexpr std::array<std::string_view, 4> kMemoryPhaseNames{"forward-only", "training forward", "backward",
                                                                   "update"};
inline std::string_view to_string(MemoryPhase p) { return kMemoryPhaseNames[static_cast<std::size_t>(p)]; }

// What a buffer holds, for the report. saved: an activation or a layer's own buffer (the
// convolution's pre-norm output, batch-norm statistics and reserves, ReLU masks, pooling indices,
// dropout masks) written in the training forward and read in the backward; activations: the rest
// of them (live within one pass). io: the input, the labels, the loss terms and the named outputs
// (logits). workspace: scratch valid during one piece of work.
enum class BufferKind {
  weights,  // the parameters, BN running statistics and the 16-bit weight copies
  gradients,
  optimizer_state,
  io,
  saved,
  activations,
  activation_gradients,
  workspace
};
inline constexpr std::size_t kBufferKinds = 8;
inline constexpr std::array<std::string_view, kBufferKinds> kBufferKindNames{
    "weights", "gradients", "optimizer_state", "io", "saved", "activations", "activation_gradients", "workspace"};
inline std::string_view to_string(BufferKind k) { return kBufferKindNames[static_cast<std::size_t>(k)]; }

// One piece of work of the schedule, as the graph's probe names it (graph/probe.hpp): a layer's
// "conv_fwd", "bwd", ..., or the graph's own "weight_cast", "grad_zero" and "update" (layer -1).
struct PlanStep {
  MemoryPhase phase = MemoryPhase::forward_only;
  int layer = -1;  // index in Graph::layers(); -1: the graph's own work
  std::string part;
  std::string label;  // the layer's (LayerInfo::label); "" for the graph's own work
};

struct LiveInterval {
  int first = 0, last = 0;  // steps, both included
};

struct PlannedBuffer {
  std::string name;  // "Mixed_5b.branch1x1 z", "grad of Mixed_5b", "parameters", ...
  BufferKind kind = BufferKind::activations;
  std::size_t offset = 0, bytes = 0;  // into the arena; bytes as reserved (256-byte multiples)
  bool persistent = false;            // live at every step, and across steps
  std::vector<LiveInterval> live;     // otherwise: when, in steps (ascending, disjoint)
  bool recomputed = false;            // freed after the forward, made again in backward (GraphConfig::recompute)
  bool live_at(int step) const;
  bool overlaps_in_time(const PlannedBuffer& o) const;
};

struct MemoryPlan {
  std::vector<PlanStep> steps;  // the inference forward, then the training forward, backward and update
  std::vector<PlannedBuffer> buffers;
  std::size_t arena_bytes = 0;
  std::size_t unshared_bytes() const;  // every buffer its own space: the arena without sharing
  std::size_t persistent_bytes() const;
};

// The checker: every two buffers live at one step that overlap in memory, and every buffer that
// ends past the arena, one line each (at most `max`), naming the buffers and the step. Empty: sound.
std::vector<std::string> plan_conflicts(const MemoryPlan& p, std::size_t max = 10);

// The bytes live at a phase's worst step and what holds them.
struct MemoryPeak {
  MemoryPhase phase = MemoryPhase::forward_only;
  std::size_t bytes = 0;
  int step = -1;  // -1: the phase has no step (a graph with no training forward cannot have none)
  std::array<std::size_t, kBufferKinds> by_kind{};
};
std::array<MemoryPeak, 4> memory_peaks(const MemoryPlan& p);  // indexed by MemoryPhase
// The largest of them: the plan's peak of live bytes (at most arena_bytes).
MemoryPeak overall_peak(const MemoryPlan& p);

}  // namespace stepbench
