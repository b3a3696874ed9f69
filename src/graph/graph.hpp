// The network as a list of layers over planned buffers.
//
// Build with the layer calls, then plan(): every activation, gradient, reserve and workspace
// buffer is planned by liveness into one device arena (graph/memory_plan.hpp: buffers whose
// lifetimes in the step do not overlap share space) and every backend op is created there;
// forward() and backward() only launch work. Trainable parameters live in one contiguous arena (and their gradients in
// another of the same layout), laid out in reverse execution order so gradients fill it front to back during backward.
// BatchNorm running statistics live in a separate state arena.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/slow_conv.hpp"
#include "graph/memory_plan.hpp"
#include "graph/probe.hpp"

namespace stepbench {

using ValueId = int;

// normal: N(0, init_std) (kaiming_normal_ with the std its caller derives); uniform_fan_in:
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), nn.Linear's default for its weight and bias.
enum class ParamInit { trunc_normal, normal, ones, zeros, uniform_fan_in };

struct ParamEntry {
  std::string name;                 // torchvision's state_dict name
  std::vector<std::int64_t> shape;  // PyTorch's logical shape (O, I, KH, KW for filters)
  std::size_t offset = 0;           // in floats, into its arena
  std::size_t count = 0;            // floats in its arena: numel(), or the storage's (padding included)
  bool trainable = true;            // false: BN running statistics (the state arena)
  bool is_filter = false;           // stored in `format` (or `storage`) rather than O,I,KH,KW
  FilterFormat format = FilterFormat::oihw;
  ParamInit init = ParamInit::zeros;
  float init_std = 0.1f;  // trunc_normal and normal
  std::int64_t fan_in = 0;
  // A filter in its backend's own storage (Backend::conv_filter_storage; `format` is then unused).
  std::shared_ptr<const FilterStorage> storage = nullptr;
  std::size_t numel() const {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    return n;
  }
};

// What a layer is, for listings and for checking a layer in place.
struct LayerInfo {
  // conv_bn_relu, conv_bn (no ReLU), conv (no batch norm), bn_relu, bn, relu, relu6, add_relu, add, pool,
  // adaptive_avg_pool, flatten, dropout, linear, cross_entropy
  std::string kind;
  std::string name;   // the layer's module name (linear: its parameters' prefix); empty for layers without parameters
  std::string label;  // what reports call it: the name, else the builder's label, else <kind>_<index>
  std::vector<ValueId> in;
  ValueId out = -1;  // -1 for the loss
  ConvParams conv{};
  PoolParams pool{};
  bool training_only = false;
  std::size_t ready_after = 0;  // after plan(): the gradient-arena prefix (floats) final once its backward ran
  float loss_weight = 0;        // cross_entropy: its term's weight in the loss
  std::int64_t macs = 0;        // whole batch
  // conv_bn_relu and conv_bn: the convolution's weight and the batch norm's prefix (ConvBnSpec), its eps
  std::string weight, bn;
  double bn_eps = 0;
  bool is_conv_bn() const { return kind == "conv_bn_relu" || kind == "conv_bn"; }
  // What the backend runs (reports): the convolution's algorithms, and the batch norm's or the
  // pooling's implementation; with GraphConfig::fuse, how the fused convolution runs (`fused`).
  std::string conv_algorithm, implementation, fused;
  // GraphConfig::fuse: false where the output is not stored (its readers apply this unit's batch
  // norm to its z as they load it); per input, the label of the unit whose output it loads that way,
  // or "" (a stored value).
  bool stored = true;
  std::vector<std::string> loads;
};

// A convolution (no bias) -> BatchNorm2d -> ReLU (optional) unit: its parameters' torchvision names,
// batch norm's eps and the weight's initialisation.
struct ConvBnSpec {
  std::string weight;  // the convolution's weight, "layer1.0.conv1.weight"
  std::string bn;      // the batch norm's prefix, "layer1.0.bn1": .weight, .bias, .running_mean, .running_var
  bool relu = true;    // the ReLU after the batch norm, fused into it
  double eps = 1e-3;   // BatchNorm2d's eps: 1e-3 in torchvision's BasicConv2d, PyTorch's default 1e-5
  ParamInit init = ParamInit::trunc_normal;  // the weight's: trunc_normal or normal, with init_std
  float init_std = 0.1f;
};

// A convolution without batch norm (Graph::conv): its parameters' names and initialisation, and
// the bias and ReLU after it (VGG's, AlexNet's), or neither (DenseNet's, after BN + ReLU).
struct ConvSpec {
  std::string weight;                      // "features.0.weight"
  std::string bias;                        // "features.0.bias"; "" : no bias
  bool relu = false;                       // the ReLU after the bias (needs the bias)
  ParamInit init = ParamInit::normal;      // the weight's: normal (kaiming_normal_'s std), or nn.Conv2d's uniform
  float init_std = 0.1f;                   // normal, trunc_normal
  ParamInit bias_init = ParamInit::zeros;  // zeros (VGG's), or uniform_fan_in (nn.Conv2d's default)
};

// A batch norm and the ReLU after it, alone (Graph::batch_norm: DenseNet's pre-activation).
struct BnSpec {
  std::string prefix;  // "features.denseblock1.denselayer1.norm1": .weight, .bias, .running_mean, .running_var
  bool relu = true;
  double eps = 1e-5;  // BatchNorm2d's default
};

// How the plan shares the arena between buffers (Graph::value and Graph::grad say what it means for
// a reader).
enum class BufferSharing {
  by_liveness,  // buffers whose lifetimes in the step do not overlap share space
  keep_values,  // as by_liveness, but every value and its gradient lives for the whole step
  none,         // every buffer its own space for the whole step (the plan before liveness)
};

// Whether backward recomputes what is cheap to make again instead of keeping it from the forward:
// the output of every convolution + batch norm (+ ReLU) unit that backward reads (the next
// convolution's filter gradient, the ReLU's mask) is made again from the unit's pre-norm output and
// batch statistics, which backward keeps anyway, right before its first backward reader (activation
// checkpointing at the granularity of one elementwise pass, as MXNet's mirror and Chen et al.'s
// sublinear memory). It frees about a third of Inception-v3's saved activations for one more
// batch-norm pass per unit. automatic: on where the arena is host memory (the cpu backend), off on a
// GPU. Values kept by keep() and sharing other than by_liveness are never recomputed.
enum class Recompute { automatic, on, off };
constexpr auto enum_names(Recompute) {
  return std::array<EnumName<Recompute>, 3>{
      {{Recompute::automatic, "auto"}, {Recompute::on, "on"}, {Recompute::off, "off"}}};
}
constexpr bool recomputes(Recompute r, DeviceKind d) {
  return r == Recompute::on || (r == Recompute::automatic && d == DeviceKind::cpu);
}

// Whether convolution + batch-norm units run as fused units (backend/fused.hpp), as MLPerf's
// ResNet-50 on cuDNN: a unit whose output feeds only convolutions (any unit) or a residual add (a
// unit without ReLU) does not store it; each reader applies the unit's batch norm and ReLU to the
// unit's pre-norm z as it loads it, and backward makes the ReLU's mask again from z. A unit's
// batch statistics come from a finalize piece (and, where the backend's convolution makes them, its
// epilogue). off: every unit's convolution and batch norm as separate ops, every output stored.
// Values kept by keep(), the input, named outputs and concat parts are always stored; with sharing
// other than by_liveness nothing is fused.
enum class Fuse { off, on };
constexpr auto enum_names(Fuse) { return std::array<EnumName<Fuse>, 2>{{{Fuse::off, "off"}, {Fuse::on, "on"}}}; }

// Parameter-sized buffers of state the optimizer keeps: momentum's buffer; RMSProp's mean square
// and momentum.
constexpr int optimizer_state_arenas(OptimizerKind k) {
  return k == OptimizerKind::sgd ? 0 : k == OptimizerKind::momentum ? 1 : 2;
}

struct GraphConfig {
  std::int64_t batch = 1;
  Layout layout = Layout::nchw;
  DType dtype = DType::f32;
  std::uint64_t seed = 0;  // dropout masks
  // Dynamic loss scaling (LossScaler): always on for f16, whose gradients underflow without it;
  // may be turned on for the others (tests).
  bool loss_scaling = false;
  float initial_loss_scale = LossScaler::kInitialScale;  // PyTorch's GradScaler starts at 2^16 too
  BufferSharing sharing = BufferSharing::by_liveness;
  // Parameter-sized arenas of optimizer state the graph's arena holds for its trainer
  // (optimizer_state_arenas(kind): momentum 1, RMSProp 2), so the plan counts them; 0: the trainer
  // allocates its own.
  int optimizer_state_arenas = 0;
  Recompute recompute = Recompute::automatic;
  Fuse fuse = Fuse::off;
};

class Graph {
 public:
  Graph(Backend& be, GraphConfig cfg);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // ---- building ----
  ValueId input(std::int64_t c, std::int64_t h, std::int64_t w);
  // torchvision's BasicConv2d: Conv2d(bias=False) -> BatchNorm2d(eps=1e-3) -> ReLU. Parameters are
  // named <name>.conv.weight and <name>.bn.{weight,bias,running_mean,running_var}.
  ValueId conv_bn_relu(const std::string& name, ValueId x, std::int64_t cout, const ConvParams& p,
                       float init_std = 0.1f);
  // Conv2d(bias=False) -> BatchNorm2d -> ReLU if spec.relu (kind conv_bn_relu, else conv_bn), the
  // parameters named by spec; name: what reports call it (torchvision's module name).
  ValueId conv_bn(const std::string& name, ValueId x, std::int64_t cout, const ConvParams& p, const ConvBnSpec& spec);
  // A residual connection: relu(a + b), a and b of one shape (two different values). Backward sends
  // the masked gradient to both (fan-out: accumulated where they have other consumers).
  ValueId add_relu(ValueId a, ValueId b, const std::string& label = {});
  // label: what reports call the layer (torchvision's module name where it has one, "maxpool1").
  ValueId pool(ValueId x, const PoolParams& p, const std::string& label = {});
  ValueId global_avg_pool(ValueId x, const std::string& label = {});
  // Concatenate along channels without copies: the parts become channel slices of the result.
  // Each part must be produced by a layer and not already be part of a concat, or be a concat
  // itself, which then becomes a slice of this one (DenseNet's growing block: each layer reads the
  // concatenation so far, a prefix of the block's).
  ValueId concat(const std::vector<ValueId>& parts);
  // A convolution without batch norm, its bias and ReLU as spec says; name: torchvision's module.
  ValueId conv(const std::string& name, ValueId x, std::int64_t cout, const ConvParams& p, const ConvSpec& spec);
  // BatchNorm2d (+ ReLU): name, what reports call it; the input must take a gradient (not the image).
  ValueId batch_norm(const std::string& name, ValueId x, const BnSpec& spec);
  // min(max(x, 0), clip): kNoClip the ReLU, 6 ReLU6.
  ValueId relu(ValueId x, float clip = kNoClip, const std::string& label = {});
  // a + b, of one shape (two different values): a residual connection without a ReLU.
  ValueId add(ValueId a, ValueId b, const std::string& label = {});
  // N x C x H x W into N x (C H W) x 1 x 1 in PyTorch's order (torch.flatten(x, 1)), in both layouts.
  ValueId flatten(ValueId x, const std::string& label = {});
  // AdaptiveAvgPool2d((h, w)).
  ValueId adaptive_avg_pool(ValueId x, std::int64_t h, std::int64_t w, const std::string& label = {});
  ValueId dropout(ValueId x, double p, const std::string& label = {});
  // Linear (with bias) over the flattened N x C x 1 x 1 input. <name>.weight, <name>.bias. The weight
  // from a truncated normal of init_std, or as weight_init says (uniform_fan_in: nn.Linear's default;
  // normal: N(0, init_std), VGG's and MobileNet-v2's); the bias uniform_fan_in (nn.Linear's) or zeros.
  ValueId linear(const std::string& name, ValueId x, std::int64_t out, float init_std = 0.1f,
                 ParamInit weight_init = ParamInit::trunc_normal, ParamInit bias_init = ParamInit::uniform_fan_in);
  // Adds weight * cross_entropy(logits, labels) to the loss and names the logits as an output.
  void cross_entropy(ValueId logits, float weight, const std::string& output_name);
  // Layers added while this is set run only in training (torchvision's aux head).
  void set_training_only(bool on);

  // Before plan(): v's buffer and its gradient's (its root's, for a concat part) live for the whole
  // step, so that value(v) and grad(v) still hold this step's after it.
  void keep(ValueId v);

  // Test-only (backend/slow_conv.hpp): convolutions planned after this carry the fault.
  void set_fault(const SlowConvFault& f);

  void plan();
  bool planned() const;
  // Planning's memory checks without allocating, for finding the largest batch that fits: the bytes
  // the plan needs and whether they fit. quick: the plan's peak of live bytes before any op is made
  // (without the ops' workspace and reserves: a lower bound of the arena, cheap); otherwise every
  // buffer and op is sized as plan() does and the exact arena is checked, without allocating it (the
  // ops are made; on a backend set to Backend::sizing_only, as largest_batch_that_fits sets it,
  // cuda's convolutions skip cuDNN's algorithm search and count their workspace at the budget;
  // otherwise the search runs at this batch). The graph is spent afterwards, fitting or not.
  struct Sizing {
    std::size_t bytes = 0;   // needed
    std::size_t usable = 0;  // what planning may use of the device's memory
    bool fits = false;
    std::string refusal;  // plan()'s UsageError when it does not fit: the bytes and a batch that would
  };
  Sizing size_plan(bool quick);
  std::size_t plan_dry(bool quick);  // size_plan(quick).bytes, or its refusal thrown as UsageError

  // ---- running ----
  // training: batch statistics, dropout, training-only layers and the loss. Otherwise inference:
  // running statistics, no dropout, training-only layers skipped; loss layers still compute when
  // their logits are computed.
  void forward(Stream& s, bool training);
  // After forward(s, true), with no inference forward between them (the plan lets the inference
  // forward use the space of what the training forward keeps for backward). on_ready(n), when given, is called as
  // backward goes whenever the first n floats of the gradient arena have their final values launched on `s` (the arena
  // is in reverse execution order, so they fill front to back): what gradient buckets wait for.
  void backward(Stream& s, const std::function<void(std::size_t)>& on_ready = {});
  // Per-layer timing and tracing (graph/probe.hpp): called around every piece of work forward()
  // and backward() launch from now on; nullptr detaches. The probe must outlive its attachment.
  void set_probe(GraphProbe* p);
  std::uint64_t step_counter() const;  // advances dropout masks; incremented by every training forward
  // The loss scaler (device memory, LossScaler's layout) when loss scaling is on, else nullptr;
  // the gradient arena then holds gradients times its scale. loss_scale() reads the scale (syncs).
  float* loss_scaler() const;
  float loss_scale(Stream& s) const;

  // ---- data ----
  const GraphConfig& config() const;
  Backend& backend() const;
  Tensor input_tensor() const;
  // Host data in: images N x C x H x W in NCHW order whatever the graph's layout; labels as int32.
  void set_input_nchw(const float* nchw);
  void set_labels(const std::int32_t* labels);
  // A dense N x M x 1 x 1 output (logits) copied to the host.
  std::vector<float> read_output(const std::string& name) const;
  std::int32_t* labels() const;  // batch entries, device memory
  // Read the images (dense, the graph's layout and dtype) and labels from the caller's device
  // buffers from now on, e.g. one of two staging buffers; nullptr goes back to the planned ones.
  void bind_input(void* images, std::int32_t* labels);
  Shape shape_of(ValueId v) const;  // available while building
  // Views of v's buffer and its gradient's (after plan()). The plan shares memory between buffers
  // whose lifetimes do not overlap, so they hold v's numbers only while v is live: a value from its
  // producer's forward to its last reader (in the training step, its last reader in backward), a
  // gradient from its first writer in backward to its producer's backward. After a step they still
  // hold them for the input, the named outputs (output()) and values kept with keep() or by
  // GraphConfig::sharing; the parameters' gradients (grad_of) are never shared. A fused unit's output
  // that is not stored (GraphConfig::fuse, LayerInfo::stored) has no buffer: its view has no data.
  Tensor value(ValueId v) const;
  Tensor grad(ValueId v) const;
  Tensor output(const std::string& name) const;  // "logits", "aux_logits"
  bool has_output(const std::string& name) const;
  // Weighted sum of the loss terms of the last training forward, and the terms themselves, copied
  // to the host (synchronises the stream).
  float loss(Stream& s) const;
  std::vector<float> loss_terms(Stream& s) const;
  // After the caller synchronised the stream: throws what the device flagged in the last step (a
  // label outside the class range, as UsageError). loss() and loss_terms() call it.
  void check_after_sync() const;
  // Numerical blow-up (graph/health.cpp), never in a timed region: whether every trainable parameter
  // is finite; and where the first non-finite number of a training step is — a parameter, else one
  // more inference forward (running statistics) and training forward (layer outputs in execution
  // order, then the loss) and the backward (the gradients each layer passes back, then the
  // parameters' gradients) — or "" when all are finite.
  // first_non_finite runs that step (the state moves on) and synchronises s.
  bool parameters_finite(Stream& s) const;
  // The parameters and the last backward's gradients (not with loss scaling, whose overflowed steps
  // are skipped by design) are finite. The loss is not read: an inference forward writes it too, and
  // in fp16 its logits may overflow while training is sound.
  bool step_finite(Stream& s) const;
  std::string first_non_finite(Stream& s);

  // ---- parameters ----
  const std::vector<ParamEntry>& params() const;  // trainable first-registered order, then state
  const ParamEntry& param(const std::string& name) const;
  // Mixed precision (bf16, f16): the arenas stay fp32 (master weights, gradients, optimizer state);
  // convolutions and fully connected layers compute on a 16-bit copy of the arena refreshed at every
  // forward, and their weight gradients come back through a 16-bit arena, cast into the fp32 one.
  // A hash of the arenas' layout: every parameter's name, offset, size and filter format. Towers
  // that sum gradients element by element must agree on it.
  std::uint64_t arena_fingerprint() const;
  float* param_arena() const;  // trainable parameters
  float* grad_arena() const;   // their gradients, same layout
  float* state_arena() const;  // BN running statistics
  std::size_t param_arena_floats() const;
  std::size_t state_arena_floats() const;
  float* data_of(const ParamEntry& e) const;  // in the param or state arena
  float* grad_of(const ParamEntry& e) const;  // trainable only
  std::int64_t num_parameters() const;        // trainable elements (what torchvision counts)
  // Multiply-adds of one image's forward pass; training includes training-only layers.
  std::int64_t forward_macs_per_image(bool training) const;
  // The arena's part for activations, their gradients, the layers' own buffers and workspace (what
  // the plan shares): device_bytes() less the buffers that live for the whole step.
  std::size_t activation_bytes() const;
  // Everything the graph holds in backend memory: one arena, allocated at the end of plan(), which
  // throws UsageError (bytes needed and available, a batch size that fits) when it cannot fit.
  std::size_t device_bytes() const;
  const void* arena_data() const;  // where it starts (after plan())
  // The plan (after plan(), or plan_dry(false)): every buffer, when it is live, where it sits;
  // memory_peaks() of it gives the peak bytes per phase and what holds them.
  const MemoryPlan& memory_plan() const;
  // The optimizer state the arena holds (GraphConfig::optimizer_state_arenas), i < that count.
  float* optimizer_state(int i) const;
  std::vector<LayerInfo> layers() const;  // in execution order
  // The values concatenated into v, in channel order (empty when v is not a concat): with layers(),
  // the whole dataflow, for checkers that re-run the graph elsewhere.
  std::vector<ValueId> concat_parts(ValueId v) const;

  struct Impl;

 private:
  enum class PlanStage { estimate, sized, all };
  std::size_t plan_to(PlanStage stage);
  std::unique_ptr<Impl> impl_;
};

// Convert a filter between PyTorch's O,I,KH,KW order (e.numel() floats) and its storage in the
// arena (e.count floats): the plain `format`, or the backend's own `storage`.
void filter_to_storage(const float* oihw, float* dst, const ParamEntry& e);
void filter_from_storage(const float* src, float* oihw, const ParamEntry& e);

// torchvision's initialisation from a seed: truncated normal (std per parameter, cut at +-2) or
// normal, BN weight 1 and bias 0, Linear bias (and weight, where asked) uniform(+-1/sqrt(fan_in)),
// running mean 0 and var 1.
// Writes through host memory, so it works on every backend.
void init_parameters(Graph& g, std::uint64_t seed);

}  // namespace stepbench
