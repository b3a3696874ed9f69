#include "stepbench/graph.hpp"

#include <fmt/format.h>

#include <cstring>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>

#include "stepbench/error.hpp"

namespace stepbench {

namespace {
constexpr std::size_t kAlignFloats = 16;  // 64-byte aligned parameters
std::size_t align_floats(std::size_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }
}  // namespace

// A piece of the graph's one device arena: sized while planning, placed when the arena is
// allocated at the end of plan(), so a batch that does not fit fails there, before any step.
struct Slot {
  std::size_t offset = 0, size = 0;
  char* base = nullptr;
  void* get() const { return size ? base + offset : nullptr; }
  template <class T> T* as() const { return static_cast<T*>(get()); }
  std::size_t bytes() const { return size; }
};

struct Value {
  Shape shape;
  ValueId root = -1;  // concat parent, or -1
  std::int64_t c_offset = 0;
  bool needs_grad = true;
  int producer = -1;  // layer index
  Slot data, grad;  // roots only
  Tensor t, g;        // views, valid after plan()
  bool grad_zero_first = false;
};

struct Layer {
  virtual ~Layer() = default;
  std::vector<ValueId> in;
  ValueId out = -1;
  bool training_only = false;
  std::vector<float> in_beta;  // per input: 0 overwrites its gradient, 1 accumulates
  std::vector<std::size_t> trainable;  // indices of the parameters whose gradients this layer writes
  std::size_t ready_after = 0;         // gradient-arena prefix (floats) final once this layer's backward ran
  virtual void plan(Graph::Impl&) = 0;
  virtual void forward(Graph::Impl&, Stream&, bool training) = 0;
  virtual void backward(Graph::Impl&, Stream&) = 0;
  virtual std::int64_t macs() const { return 0; }  // whole batch
  virtual std::size_t workspace_bytes() const { return 0; }
  virtual std::size_t scratch_bytes() const { return 0; }  // shared gradient scratch
  virtual LayerInfo info() const = 0;
  LayerInfo base_info(std::string kind, std::string name = {}) const {
    LayerInfo i;
    i.kind = std::move(kind);
    i.name = std::move(name);
    i.in = in;
    i.out = out;
    i.training_only = training_only;
    i.macs = macs();
    return i;
  }
};

struct Graph::Impl {
  Backend& be;
  GraphConfig cfg;
  std::vector<Value> values;
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<ParamEntry> params;
  std::map<std::string, std::size_t> param_index;
  std::map<std::string, ValueId> outputs;
  bool training_only = false;
  bool planned = false;
  ValueId input = -1;
  Slot param_arena, grad_arena, state_arena, workspace, scratch, labels, losses;
  Slot param_half, grad_half, scaler;  // mixed precision: 16-bit weights and weight gradients; loss scaler
  // The arena: every slot above and every layer's, one allocation.
  Buffer arena;
  std::vector<Slot*> slots;
  std::size_t arena_bytes = 0;
  void reserve(Slot& sl, std::size_t bytes) {
    constexpr std::size_t kAlign = 256;  // what cuDNN and vector loads like
    sl.size = bytes;
    sl.offset = arena_bytes;
    arena_bytes += (bytes + kAlign - 1) / kAlign * kAlign;
    slots.push_back(&sl);
  }
  std::size_t param_floats = 0, state_floats = 0;
  int num_losses = 0;
  std::vector<float> loss_weights;
  std::uint64_t step = 0;

  Impl(Backend& b, GraphConfig c) : be(b), cfg(c) {}
  std::int32_t* bound_labels = nullptr;  // bind_input(): labels live in the caller's buffer
  void* own_input = nullptr;             // the planned input buffer, for unbinding
  std::int32_t* label_ptr() const { return bound_labels ? bound_labels : labels.as<std::int32_t>(); }

  TensorDesc desc(const Shape& s) const { return TensorDesc::dense(s, cfg.dtype, cfg.layout); }
  ValueId new_value(const Shape& s, int producer) {
    values.push_back(Value{});
    values.back().shape = s;
    values.back().producer = producer;
    return static_cast<ValueId>(values.size() - 1);
  }
  std::size_t add_param(ParamEntry e) {
    if (param_index.count(e.name)) throw Error(fmt::format("parameter '{}' registered twice", e.name));
    e.count = 1;
    for (auto d : e.shape) e.count *= static_cast<std::size_t>(d);
    param_index[e.name] = params.size();
    params.push_back(std::move(e));
    return params.size() - 1;
  }
  float* pdata(std::size_t i) const {
    const auto& e = params[i];
    return (e.trainable ? param_arena.as<float>() : state_arena.as<float>()) + e.offset;
  }
  float* pgrad(std::size_t i) const { return grad_arena.as<float>() + params[i].offset; }
  bool mixed() const { return is_half(cfg.dtype); }
  // What convolutions and fully connected layers read and write: the fp32 arenas, or the 16-bit ones.
  void* wdata(std::size_t i) const {
    return mixed() ? static_cast<void*>(param_half.as<char>() + 2 * params[i].offset) : pdata(i);
  }
  void* wgrad(std::size_t i) const {
    return mixed() ? static_cast<void*>(grad_half.as<char>() + 2 * params[i].offset) : pgrad(i);
  }
  // After a layer wrote the 16-bit gradient of parameter i: into the fp32 gradient arena.
  void widen_grad(Stream& s, std::size_t i) const {
    if (mixed()) be.cast(s, wgrad(i), cfg.dtype, pgrad(i), DType::f32, params[i].count);
  }
  const float* loss_scale_ptr() const { return scaler.size ? scaler.as<float>() : nullptr; }
  const Value& root_of(ValueId v) const { return values[v].root >= 0 ? values[values[v].root] : values[v]; }
  Layer& add_layer(std::unique_ptr<Layer> l) {
    if (planned) throw Error("graph: layers cannot be added after plan()");
    l->training_only = training_only;
    layers.push_back(std::move(l));
    return *layers.back();
  }
};

namespace {

// ---- layers --------------------------------------------------------------------------------------
struct ConvBnReluLayer final : Layer {
  ConvParams p;
  std::int64_t cout;
  std::size_t w, gamma, beta, rmean, rvar;
  Slot z, saved, bn_reserve;  // conv output (dense), saved mean + invstd, what the BN op keeps
  std::unique_ptr<ConvOp> conv;
  std::unique_ptr<BatchNormOp> bn;
  TensorDesc zdesc;

  void plan(Graph::Impl& g) override {
    const Value& x = g.values[in[0]];
    zdesc = g.desc(g.values[out].shape);
    conv = g.be.make_conv(g.desc(x.shape), zdesc, p);
    bn = g.be.make_batch_norm(zdesc, g.values[out].t.desc, BatchNormParams{});
    g.reserve(z, zdesc.bytes());
    g.reserve(saved, 2 * sizeof(float) * static_cast<std::size_t>(cout));
    g.reserve(bn_reserve, bn->reserve_bytes());
  }
  void forward(Graph::Impl& g, Stream& s, bool training) override {
    const Tensor zt{z.get(), zdesc};
    conv->forward(s, g.values[in[0]].t, g.wdata(w), zt, g.workspace.get());
    if (training)
      bn->forward_training(s, zt, g.values[out].t, g.pdata(gamma), g.pdata(beta), g.pdata(rmean), g.pdata(rvar),
                           saved.as<float>(), saved.as<float>() + cout, g.workspace.get(), bn_reserve.get());
    else
      bn->forward_inference(s, zt, g.values[out].t, g.pdata(gamma), g.pdata(beta), g.pdata(rmean), g.pdata(rvar),
                            g.workspace.get());
  }
  void backward(Graph::Impl& g, Stream& s) override {
    const Tensor zt{z.get(), zdesc}, dz{g.scratch.get(), zdesc};
    const Value& o = g.values[out];
    bn->backward(s, zt, o.t, o.g, dz, g.pdata(gamma), g.pdata(beta), saved.as<float>(), saved.as<float>() + cout,
                 g.pgrad(gamma), g.pgrad(beta), 0.0f, g.workspace.get(), bn_reserve.get());
    conv->backward_filter(s, g.values[in[0]].t, dz, g.wgrad(w), g.workspace.get());
    g.widen_grad(s, w);
    if (g.values[in[0]].needs_grad)
      conv->backward_data(s, dz, g.wdata(w), g.values[in[0]].g, in_beta[0], g.workspace.get());
  }
  std::int64_t macs() const override { return mac_count; }
  std::int64_t cin = 0, mac_count = 0;
  std::size_t workspace_bytes() const override { return std::max(conv->workspace_bytes(), bn->workspace_bytes()); }
  std::size_t scratch_bytes() const override { return zdesc.bytes(); }
  std::string name;
  LayerInfo info() const override {
    auto i = base_info("conv_bn_relu", name);
    i.conv = p;
    if (conv) i.conv_algorithm = conv->algorithm();
    if (bn) i.implementation = bn->implementation();
    return i;
  }
};

struct PoolLayer final : Layer {
  PoolParams p;
  std::unique_ptr<PoolOp> op;
  Slot reserve;
  void plan(Graph::Impl& g) override {
    op = g.be.make_pool(g.values[in[0]].t.desc, g.values[out].t.desc, p);
    g.reserve(reserve, op->reserve_bytes());
  }
  void forward(Graph::Impl& g, Stream& s, bool) override {
    op->forward(s, g.values[in[0]].t, g.values[out].t, reserve.get());
  }
  void backward(Graph::Impl& g, Stream& s) override {
    const Value &x = g.values[in[0]], &y = g.values[out];
    if (x.needs_grad) op->backward(s, x.t, y.t, y.g, x.g, in_beta[0], reserve.get());
  }
  LayerInfo info() const override {
    auto i = base_info("pool");
    i.pool = p;
    if (op) i.implementation = op->implementation();
    return i;
  }
};

struct DropoutLayer final : Layer {
  double p;
  std::unique_ptr<DropoutOp> op;
  Slot reserve;
  void plan(Graph::Impl& g) override {
    op = g.be.make_dropout(g.values[in[0]].t.desc, p);
    g.reserve(reserve, op->reserve_bytes());
  }
  void forward(Graph::Impl& g, Stream& s, bool training) override {
    const Tensor &x = g.values[in[0]].t, &y = g.values[out].t;
    if (training) op->forward(s, x, y, reserve.get(), g.cfg.seed, g.step);
    else g.be.copy(s, y.data, x.data, x.desc.bytes());
  }
  void backward(Graph::Impl& g, Stream& s) override {
    const Value &x = g.values[in[0]], &y = g.values[out];
    if (x.needs_grad) op->backward(s, y.g, x.g, in_beta[0], reserve.get());
  }
  LayerInfo info() const override { return base_info("dropout"); }
};

struct LinearLayer final : Layer {
  std::size_t w, b;
  std::unique_ptr<LinearOp> op;
  std::int64_t k = 0, m = 0;
  void plan(Graph::Impl& g) override { op = g.be.make_linear(g.values[in[0]].t.desc, g.values[out].t.desc); }
  void forward(Graph::Impl& g, Stream& s, bool) override {
    op->forward(s, g.values[in[0]].t, g.wdata(w), g.wdata(b), g.values[out].t, g.workspace.get());
  }
  void backward(Graph::Impl& g, Stream& s) override {
    const Value &x = g.values[in[0]], &y = g.values[out];
    op->backward_weights(s, x.t, y.g, g.wgrad(w), g.wgrad(b), g.workspace.get());
    g.widen_grad(s, w);
    g.widen_grad(s, b);
    if (x.needs_grad) op->backward_data(s, y.g, g.wdata(w), x.g, in_beta[0], g.workspace.get());
  }
  std::int64_t macs() const override { return k * m * batch; }
  std::int64_t batch = 0;
  std::size_t workspace_bytes() const override { return op->workspace_bytes(); }
  std::string name;
  LayerInfo info() const override { return base_info("linear", name); }
};

struct LossLayer final : Layer {
  float weight;
  int slot;
  std::unique_ptr<SoftmaxCrossEntropyOp> op;
  Slot reserve;
  void plan(Graph::Impl& g) override {
    op = g.be.make_softmax_cross_entropy(g.values[in[0]].t.desc);
    g.reserve(reserve, op->reserve_bytes());
  }
  void forward(Graph::Impl& g, Stream& s, bool) override {
    op->forward(s, g.values[in[0]].t, g.label_ptr(), g.losses.as<float>() + slot, reserve.get());
  }
  void backward(Graph::Impl& g, Stream& s) override {
    op->backward(s, g.label_ptr(), g.values[in[0]].g, weight, in_beta[0], reserve.get(), g.loss_scale_ptr());
  }
  std::string name;
  LayerInfo info() const override { return base_info("cross_entropy", name); }
};

}  // namespace

// ---- building ------------------------------------------------------------------------------------
Graph::Graph(Backend& be, GraphConfig cfg) : impl_(std::make_unique<Impl>(be, cfg)) {
  if (cfg.batch <= 0) throw UsageError(fmt::format("batch size {} must be positive", cfg.batch));
  be.require(cfg.dtype);
}
Graph::~Graph() = default;

ValueId Graph::input(std::int64_t c, std::int64_t h, std::int64_t w) {
  auto& g = *impl_;
  if (g.input >= 0) throw Error("graph: only one input");
  g.input = g.new_value({g.cfg.batch, c, h, w}, -1);
  g.values[g.input].needs_grad = false;
  return g.input;
}

ValueId Graph::conv_bn_relu(const std::string& name, ValueId x, std::int64_t cout, const ConvParams& p,
                            float init_std) {
  auto& g = *impl_;
  const Shape xs = g.values.at(x).shape;
  const Shape ys = conv_output_shape(xs, cout, p);
  auto l = std::make_unique<ConvBnReluLayer>();
  l->p = p;
  l->name = name;
  l->cout = cout;
  l->cin = xs.c;
  l->mac_count = ys.numel() * p.kh * p.kw * xs.c;
  ParamEntry w{name + ".conv.weight", {cout, xs.c, p.kh, p.kw}};
  w.is_filter = true;
  w.format = g.be.filter_format(g.cfg.layout);
  w.init = ParamInit::trunc_normal;
  w.init_std = init_std;
  l->w = g.add_param(w);
  l->gamma = g.add_param({name + ".bn.weight", {cout}, 0, 0, true, false, FilterFormat::oihw, ParamInit::ones});
  l->beta = g.add_param({name + ".bn.bias", {cout}});
  l->trainable = {l->w, l->gamma, l->beta};
  l->rmean = g.add_param({name + ".bn.running_mean", {cout}, 0, 0, false});
  l->rvar = g.add_param({name + ".bn.running_var", {cout}, 0, 0, false, false, FilterFormat::oihw, ParamInit::ones});
  l->in = {x};
  l->out = g.new_value(ys, static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

ValueId Graph::pool(ValueId x, const PoolParams& p) {
  auto& g = *impl_;
  auto l = std::make_unique<PoolLayer>();
  l->p = p;
  l->in = {x};
  l->out = g.new_value(pool_output_shape(g.values.at(x).shape, p), static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

ValueId Graph::global_avg_pool(ValueId x) {
  const Shape s = impl_->values.at(x).shape;
  return pool(x, PoolParams{PoolKind::avg_include_pad, static_cast<int>(s.h), static_cast<int>(s.w), 1, 1, 0, 0});
}

ValueId Graph::concat(const std::vector<ValueId>& parts) {
  auto& g = *impl_;
  SB_CHECK(!parts.empty(), "concat of nothing");
  Shape s = g.values.at(parts[0]).shape;
  s.c = 0;
  for (ValueId v : parts) {
    const Value& pv = g.values.at(v);
    SB_CHECK(pv.producer >= 0 && pv.root < 0, "concat parts must be layer outputs not already concatenated");
    SB_CHECK(pv.shape.n == s.n && pv.shape.h == s.h && pv.shape.w == s.w,
             fmt::format("concat: part {} does not match {}", to_string(pv.shape), to_string(s)));
    s.c += pv.shape.c;
  }
  const ValueId id = g.new_value(s, -1);
  std::int64_t off = 0;
  for (ValueId v : parts) {
    g.values[v].root = id;
    g.values[v].c_offset = off;
    off += g.values[v].shape.c;
  }
  g.values[id].producer = -2;  // produced by its parts
  return id;
}

ValueId Graph::dropout(ValueId x, double p) {
  auto& g = *impl_;
  auto l = std::make_unique<DropoutLayer>();
  l->p = p;
  l->in = {x};
  l->out = g.new_value(g.values.at(x).shape, static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

ValueId Graph::linear(const std::string& name, ValueId x, std::int64_t out, float init_std) {
  auto& g = *impl_;
  const Shape xs = g.values.at(x).shape;
  SB_CHECK(xs.h == 1 && xs.w == 1, "linear needs a N x C x 1 x 1 input (pool first)");
  auto l = std::make_unique<LinearLayer>();
  l->name = name;
  l->k = xs.c;
  l->m = out;
  l->batch = xs.n;
  ParamEntry w{name + ".weight", {out, xs.c}};
  w.init = ParamInit::trunc_normal;
  w.init_std = init_std;
  l->w = g.add_param(w);
  ParamEntry b{name + ".bias", {out}};
  b.init = ParamInit::linear_bias;
  b.fan_in = xs.c;
  l->b = g.add_param(b);
  l->trainable = {l->w, l->b};
  l->in = {x};
  l->out = g.new_value({xs.n, out, 1, 1}, static_cast<int>(g.layers.size()));
  auto id = l->out;
  g.add_layer(std::move(l));
  return id;
}

void Graph::cross_entropy(ValueId logits, float weight, const std::string& output_name) {
  auto& g = *impl_;
  auto l = std::make_unique<LossLayer>();
  l->weight = weight;
  l->name = output_name;
  l->slot = g.num_losses++;
  l->in = {logits};
  g.loss_weights.push_back(weight);
  g.outputs[output_name] = logits;
  g.add_layer(std::move(l));
}

void Graph::set_training_only(bool on) { impl_->training_only = on; }

// ---- planning ------------------------------------------------------------------------------------
void Graph::plan() {
  auto& g = *impl_;
  if (g.planned) return;
  SB_CHECK(g.input >= 0, "graph has no input");
  auto& be = g.be;

  // Arenas: trainable parameters in reverse execution order, state in execution order.
  // Parameters are registered in execution order.
  std::size_t off = 0;
  for (auto it = g.params.rbegin(); it != g.params.rend(); ++it) {
    auto& e = *it;
    if (!e.trainable) continue;
    e.offset = off;
    off += align_floats(e.count);
  }
  g.param_floats = off;
  off = 0;
  for (auto& e : g.params) {
    if (e.trainable) continue;
    e.offset = off;
    off += align_floats(e.count);
  }
  g.state_floats = off;

  // A batch too large for the device is a usage error before anything is allocated (on the CPU,
  // overcommitted memory would otherwise end in the OOM killer mid-step).
  {
    double need = 3.0 * static_cast<double>(g.param_floats) * sizeof(float);  // params, grads, optimizer state
    if (g.mixed()) need += 2.0 * static_cast<double>(g.param_floats) * 2;      // the 16-bit copies
    for (const auto& v : g.values)
      if (v.root < 0) need += static_cast<double>(g.desc(v.shape).bytes()) * (v.needs_grad ? 2 : 1);
    for (const auto& l : g.layers)
      if (dynamic_cast<const ConvBnReluLayer*>(l.get())) need += static_cast<double>(g.desc(g.values[l->out].shape).bytes());
    const double have = static_cast<double>(be.memory_available());
    if (need > 0.9 * have) {
      const double per_image = need / static_cast<double>(g.cfg.batch);
      throw UsageError(fmt::format(
          "batch size {} needs about {:.1f} GiB on {} ({}) and {:.1f} GiB is available; use --batch-size {} or less",
          g.cfg.batch, need / (1 << 30), be.name(), be.device_name(), have / (1 << 30),
          std::max<std::int64_t>(1, static_cast<std::int64_t>(0.8 * have / per_image))));
    }
  }
  g.reserve(g.param_arena, g.param_floats * sizeof(float));
  g.reserve(g.grad_arena, g.param_floats * sizeof(float));
  g.reserve(g.state_arena, std::max<std::size_t>(g.state_floats, 1) * sizeof(float));
  if (g.mixed()) {
    g.reserve(g.param_half, g.param_floats * 2);
    g.reserve(g.grad_half, g.param_floats * 2);
  }
  if (g.cfg.loss_scaling || g.cfg.dtype == DType::f16) g.reserve(g.scaler, LossScaler::kFloats * sizeof(float));

  // Activations and gradients: roots own slots, concat parts are channel slices of their root
  // (their tensors get data pointers once the arena is placed).
  for (auto& v : g.values) {
    if (v.root >= 0) continue;
    const TensorDesc d = g.desc(v.shape);
    g.reserve(v.data, d.bytes());
    v.t = Tensor{nullptr, d};
    if (v.needs_grad) {
      g.reserve(v.grad, d.bytes());
      v.g = Tensor{nullptr, d};
    }
  }
  for (auto& v : g.values) {
    if (v.root < 0) continue;
    const Value& r = g.values[v.root];
    v.t = Tensor{nullptr, r.t.desc};
    v.t.desc.shape.c = v.shape.c;
    if (v.needs_grad) v.g = Tensor{nullptr, v.t.desc};
  }

  // Fan-out: walking backward, the first writer of a gradient overwrites it, later ones add.
  std::vector<bool> written(g.values.size(), false);
  std::vector<bool> part_has_consumer(g.values.size(), false);
  for (auto& l : g.layers)
    for (ValueId v : l->in)
      if (g.values[v].root >= 0) part_has_consumer[g.values[v].root] = true;
  for (std::size_t i = 0; i < g.values.size(); ++i)
    if (part_has_consumer[i]) g.values[i].grad_zero_first = true;  // mixed writers: zero, then add
  for (auto it = g.layers.rbegin(); it != g.layers.rend(); ++it) {
    auto& l = **it;
    l.in_beta.assign(l.in.size(), 0.0f);
    for (std::size_t k = 0; k < l.in.size(); ++k) {
      const ValueId v = l.in[k];
      const Value& val = g.values[v];
      const ValueId r = val.root >= 0 ? val.root : v;
      const bool init = written[v] || written[r] || g.values[r].grad_zero_first;
      l.in_beta[k] = init ? 1.0f : 0.0f;
      written[v] = true;
    }
  }
  // A gradient nobody writes (an output without a loss) must read as zero.
  for (std::size_t i = 0; i < g.values.size(); ++i) {
    auto& v = g.values[i];
    if (v.root < 0 && v.needs_grad && !written[i] && !v.grad_zero_first) {
      bool any_part_written = false;
      for (std::size_t j = 0; j < g.values.size(); ++j)
        if (g.values[j].root == static_cast<ValueId>(i) && written[j]) any_part_written = true;
      if (!any_part_written) v.grad_zero_first = true;
    }
  }

  for (auto& l : g.layers) l->plan(g);
  std::size_t ws = 0, scratch = 0;
  for (auto& l : g.layers) {
    ws = std::max(ws, l->workspace_bytes());
    scratch = std::max(scratch, l->scratch_bytes());
  }
  g.reserve(g.workspace, ws);
  g.reserve(g.scratch, scratch);
  g.reserve(g.labels, sizeof(std::int32_t) * static_cast<std::size_t>(g.cfg.batch));
  g.reserve(g.losses, sizeof(float) * static_cast<std::size_t>(std::max(g.num_losses, 1)));

  // The arena: every byte the graph uses on the device, in one allocation, checked first.
  const std::size_t have = be.memory_available();
  if (static_cast<double>(g.arena_bytes) > 0.95 * static_cast<double>(have)) {
    const double per_image = static_cast<double>(g.arena_bytes) / static_cast<double>(g.cfg.batch);
    throw UsageError(fmt::format(
        "batch size {} needs {} bytes ({:.2f} GiB) of {} memory on {} and {} bytes ({:.2f} GiB) are available; use "
        "--batch-size {} or less",
        g.cfg.batch, g.arena_bytes, g.arena_bytes / 1073741824.0, be.name(), be.device_name(), have,
        have / 1073741824.0, std::max<std::int64_t>(1, static_cast<std::int64_t>(0.8 * have / per_image))));
  }
  g.arena = Buffer(be, g.arena_bytes);
  for (Slot* sl : g.slots) sl->base = g.arena.as<char>();
  for (auto& v : g.values) {
    if (v.root >= 0) continue;
    v.t.data = v.data.get();
    if (v.needs_grad) v.g.data = v.grad.get();
  }
  for (auto& v : g.values) {
    if (v.root < 0) continue;
    const Value& r = g.values[v.root];
    v.t = r.t.channel_slice(v.c_offset, v.shape.c);
    if (v.needs_grad) v.g = r.g.channel_slice(v.c_offset, v.shape.c);
  }
  auto& st = be.default_stream();
  for (Slot* sl : {&g.param_arena, &g.grad_arena, &g.state_arena, &g.grad_half, &g.labels, &g.losses})
    if (sl->size) be.memset_zero(st, sl->get(), sl->size);
  if (g.scaler.size) {
    const float init[LossScaler::kFloats] = {g.cfg.initial_loss_scale, 0.0f, 0.0f};
    be.copy(st, g.scaler.get(), init, sizeof init);
  }
  be.synchronize(st);
  // Walking backward, the gradients of every layer from the last down to this one are final: with
  // the arena in reverse execution order they are a prefix of it.
  std::size_t ready = 0;
  for (auto it = g.layers.rbegin(); it != g.layers.rend(); ++it) {
    for (std::size_t p : (*it)->trainable)
      ready = std::max(ready, std::min(g.params[p].offset + align_floats(g.params[p].count), g.param_floats));
    (*it)->ready_after = ready;
  }
  g.planned = true;
}

bool Graph::planned() const { return impl_->planned; }

// ---- running -------------------------------------------------------------------------------------
void Graph::forward(Stream& s, bool training) {
  auto& g = *impl_;
  SB_CHECK(g.planned, "forward before plan()");
  // the 16-bit weights from the fp32 master copy, as autocast re-casts them in every forward
  if (g.mixed()) g.be.cast(s, g.param_arena.get(), DType::f32, g.param_half.get(), g.cfg.dtype, g.param_floats);
  for (auto& l : g.layers) {
    if (l->training_only && !training) continue;
    l->forward(g, s, training);
  }
  if (training) ++g.step;
}

void Graph::backward(Stream& s, const std::function<void(std::size_t)>& on_ready) {
  auto& g = *impl_;
  SB_CHECK(g.planned, "backward before plan()");
  for (auto& v : g.values)
    if (v.grad_zero_first && v.root < 0 && v.needs_grad) g.be.memset_zero(s, v.g.data, v.g.desc.bytes());
  std::size_t told = 0;
  for (auto it = g.layers.rbegin(); it != g.layers.rend(); ++it) {
    (*it)->backward(g, s);
    if (on_ready && (*it)->ready_after > told) on_ready(told = (*it)->ready_after);
  }
}

std::uint64_t Graph::step_counter() const { return impl_->step; }
float* Graph::loss_scaler() const { return impl_->scaler.size ? impl_->scaler.as<float>() : nullptr; }
float Graph::loss_scale(Stream& s) const {
  if (!loss_scaler()) return 1.0f;
  float v[LossScaler::kFloats];
  impl_->be.copy(s, v, loss_scaler(), sizeof v);
  impl_->be.synchronize(s);
  return v[0];
}

// ---- data ----------------------------------------------------------------------------------------
Shape Graph::shape_of(ValueId v) const { return impl_->values.at(v).shape; }
const GraphConfig& Graph::config() const { return impl_->cfg; }
Backend& Graph::backend() const { return impl_->be; }
Tensor Graph::input_tensor() const { return impl_->values.at(impl_->input).t; }
void Graph::set_input_nchw(const float* nchw) {
  const Tensor t = input_tensor();
  const Shape& s = t.shape();
  std::vector<float> host(static_cast<std::size_t>(s.numel()));
  std::size_t k = 0;
  for (std::int64_t n = 0; n < s.n; ++n)
    for (std::int64_t c = 0; c < s.c; ++c)
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t w = 0; w < s.w; ++w) host[static_cast<std::size_t>(t.desc.offset(n, c, h, w))] = nchw[k++];
  if (t.desc.dtype != DType::f32) convert(host.data(), DType::f32, host.data(), t.desc.dtype, host.size());  // in place: narrower
  Backend& be = impl_->be;
  be.copy(be.default_stream(), t.data, host.data(), t.desc.bytes());
  be.synchronize(be.default_stream());
}
void Graph::set_labels(const std::int32_t* labels) {
  Backend& be = impl_->be;
  be.copy(be.default_stream(), impl_->label_ptr(), labels, impl_->labels.bytes());
  be.synchronize(be.default_stream());
}
std::vector<float> Graph::read_output(const std::string& name) const {
  const Tensor t = output(name);
  std::vector<float> host(static_cast<std::size_t>(t.desc.numel()));
  Backend& be = impl_->be;
  be.copy(be.default_stream(), host.data(), t.data, t.desc.bytes());
  be.synchronize(be.default_stream());
  if (t.desc.dtype != DType::f32) {  // 16-bit values in the first half of the buffer: widen from the back
    std::vector<std::uint16_t> narrow(host.size());
    std::memcpy(narrow.data(), host.data(), t.desc.bytes());
    convert(narrow.data(), t.desc.dtype, host.data(), DType::f32, host.size());
  }
  return host;
}
std::int32_t* Graph::labels() const { return impl_->label_ptr(); }
void Graph::bind_input(void* images, std::int32_t* labels) {
  auto& g = *impl_;
  SB_CHECK(g.planned, "bind_input before plan()");
  auto& in = g.values.at(g.input);
  if (!g.own_input) g.own_input = in.t.data;
  in.t.data = images ? images : g.own_input;
  g.bound_labels = labels;
}
Tensor Graph::value(ValueId v) const { return impl_->values.at(v).t; }
Tensor Graph::grad(ValueId v) const { return impl_->values.at(v).g; }
bool Graph::has_output(const std::string& name) const { return impl_->outputs.count(name) > 0; }
Tensor Graph::output(const std::string& name) const {
  auto it = impl_->outputs.find(name);
  if (it == impl_->outputs.end()) throw Error(fmt::format("the model has no output '{}'", name));
  return value(it->second);
}

std::vector<float> Graph::loss_terms(Stream& s) const {
  auto& g = *impl_;
  std::vector<float> out(static_cast<std::size_t>(g.num_losses));
  if (!out.empty()) g.be.copy(s, out.data(), g.losses.get(), out.size() * sizeof(float));
  g.be.synchronize(s);
  return out;
}

float Graph::loss(Stream& s) const {
  const auto terms = loss_terms(s);
  double total = 0;
  for (std::size_t i = 0; i < terms.size(); ++i) total += impl_->loss_weights[i] * terms[i];
  return static_cast<float>(total);
}

// ---- parameters ----------------------------------------------------------------------------------
const std::vector<ParamEntry>& Graph::params() const { return impl_->params; }
const ParamEntry& Graph::param(const std::string& name) const {
  auto it = impl_->param_index.find(name);
  if (it == impl_->param_index.end()) throw Error(fmt::format("the model has no parameter '{}'", name));
  return impl_->params[it->second];
}
float* Graph::param_arena() const { return impl_->param_arena.as<float>(); }
float* Graph::grad_arena() const { return impl_->grad_arena.as<float>(); }
float* Graph::state_arena() const { return impl_->state_arena.as<float>(); }
std::size_t Graph::param_arena_floats() const { return impl_->param_floats; }
std::size_t Graph::state_arena_floats() const { return impl_->state_floats; }
float* Graph::data_of(const ParamEntry& e) const {
  return (e.trainable ? param_arena() : state_arena()) + e.offset;
}
float* Graph::grad_of(const ParamEntry& e) const {
  SB_CHECK(e.trainable, fmt::format("'{}' has no gradient", e.name));
  return grad_arena() + e.offset;
}
std::int64_t Graph::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& e : impl_->params)
    if (e.trainable) n += static_cast<std::int64_t>(e.count);
  return n;
}
std::int64_t Graph::forward_macs_per_image(bool training) const {
  std::int64_t m = 0;
  for (const auto& l : impl_->layers)
    if (training || !l->training_only) m += l->macs();
  return m / impl_->cfg.batch;
}
std::size_t Graph::device_bytes() const { return impl_->arena_bytes; }
std::size_t Graph::activation_bytes() const {
  std::size_t b = impl_->workspace.bytes() + impl_->scratch.bytes();
  for (const auto& v : impl_->values) b += v.data.bytes() + v.grad.bytes();
  for (const auto& l : impl_->layers)
    if (auto* c = dynamic_cast<const ConvBnReluLayer*>(l.get())) b += c->z.bytes();
  return b;
}

std::vector<LayerInfo> Graph::layers() const {
  std::vector<LayerInfo> v;
  v.reserve(impl_->layers.size());
  for (const auto& l : impl_->layers) v.push_back(l->info());
  return v;
}

// ---- filter storage ------------------------------------------------------------------------------
namespace {
// Index into the storage of element (o, i, h, w).
std::size_t filter_index(const ParamEntry& e, std::int64_t o, std::int64_t i, std::int64_t h, std::int64_t w) {
  const std::int64_t O = e.shape[0], I = e.shape[1], H = e.shape[2], W = e.shape[3];
  switch (e.format) {
    case FilterFormat::oihw: return static_cast<std::size_t>(((o * I + i) * H + h) * W + w);
    case FilterFormat::hwio: return static_cast<std::size_t>(((h * W + w) * I + i) * O + o);
    case FilterFormat::ohwi: return static_cast<std::size_t>(((o * H + h) * W + w) * I + i);
  }
  return 0;
}
template <bool ToStorage>
void permute_filter(const float* src, float* dst, const ParamEntry& e) {
  if (!e.is_filter || e.format == FilterFormat::oihw) {
    std::copy(src, src + e.count, dst);
    return;
  }
  std::size_t k = 0;
  for (std::int64_t o = 0; o < e.shape[0]; ++o)
    for (std::int64_t i = 0; i < e.shape[1]; ++i)
      for (std::int64_t h = 0; h < e.shape[2]; ++h)
        for (std::int64_t w = 0; w < e.shape[3]; ++w, ++k) {
          const std::size_t s = filter_index(e, o, i, h, w);
          if (ToStorage) dst[s] = src[k];
          else dst[k] = src[s];
        }
}
}  // namespace

void filter_to_storage(const float* oihw, float* dst, const ParamEntry& e) { permute_filter<true>(oihw, dst, e); }
void filter_from_storage(const float* src, float* oihw, const ParamEntry& e) { permute_filter<false>(src, oihw, e); }

}  // namespace stepbench
