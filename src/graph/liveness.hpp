// Planning by liveness, internal to the graph: the buffers of the one device arena, when each is
// live (from what every layer declares it reads and writes, piece by piece: Layer::declare with a
// Uses), and where each sits (assign.cpp). The contract a layer kind keeps is in
// docs/architecture.md, "Planning by liveness".
#pragma once
#include <map>
#include <string>
#include <vector>

#include "graph/graph_impl.hpp"
#include "graph/memory_plan.hpp"

namespace stepbench {

// How one piece of work touches a buffer.
enum class Access {
  read,
  write,
  update,   // read, then written: a gradient accumulated into (beta 1)
  scratch,  // workspace: its contents matter during this piece only
};

// What one layer declares for one pass (Layer::declare(u, training)): its pieces of work in the
// order they run, each named as the ProbeScope around it ("conv_fwd", "bwd", ...), and the buffers
// each touches. Everything a piece touches must be declared: the plan lets a buffer's space go to
// another buffer outside its declared lifetime. Not declared (the graph keeps them for the whole
// step and across steps): parameters and their gradients, the 16-bit copies, BN running statistics,
// the labels, the loss terms and the optimizer's state.
class Uses {
 public:
  struct Piece {
    bool backward = false;
    const char* part = "";
    std::vector<std::pair<Slot*, Access>> uses;
  };
  Uses(Graph::Impl& g, int layer, std::string label, bool training);

  Uses& forward(const char* part);   // the next piece of the layer's forward (training or inference)
  Uses& backward(const char* part);  // the next piece of its backward (declared when training)
  // A value's buffer (a concat part: its root's, of which it is a channel slice) and its gradient.
  Uses& reads(ValueId v);
  Uses& writes(ValueId v);
  Uses& reads_grad(ValueId v);
  Uses& writes_grad(ValueId v, float beta);  // beta 1 accumulates: a read too
  // The layer's own buffers (sized by the layer's plan()), named for reports and messages.
  Uses& reads(Slot& s, const char* what);
  Uses& writes(Slot& s, const char* what);
  Uses& scratch(Slot& s, const char* what);  // workspace: nothing in it outlives the piece

  bool training() const { return training_; }
  bool needs_grad(ValueId v) const;  // whether backward computes v's gradient at all
  const std::vector<Piece>& pieces() const { return pieces_; }
  // Names of the layer's own buffers, as declared.
  const std::map<const Slot*, std::string>& names() const { return names_; }

 private:
  Uses& use(Slot& s, Access a);
  Graph::Impl& g_;
  std::string label_;
  bool training_;
  std::vector<Piece> pieces_;
  std::map<const Slot*, std::string> names_;
};

// Fills g.mem (the schedule and every buffer with its kind, size and lifetime; no offsets yet) and
// g.mem_slots from the graph's buffers and its layers' declarations. Throws Error where a piece reads
// a buffer that nothing wrote before it in that pass (a missing declaration, or a bug).
void plan_lifetimes(Graph::Impl& g);
// Copies the slots' sizes (the layers' plan() sizes their op buffers) into g.mem, 256-byte aligned.
void refresh_sizes(Graph::Impl& g);
// Offsets (assign.cpp): the persistent buffers first, in order, then the others greedy by size,
// each in the best-fitting gap among the buffers placed so far that are live when it is (XLA's
// global decreasing-size best-fit heap, TFLite's greedy-by-size). Sets arena_bytes.
void assign_offsets(MemoryPlan& p);

}  // namespace stepbench
