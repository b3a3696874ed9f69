// Graph: the builder calls that are not a layer kind (the input, training-only sections), running
// forward and backward over the planned layers, and the public accessors. Each layer kind and its
// builder call is in layers/, planning in plan.cpp.
#include "graph/graph.hpp"

#include <fmt/format.h>

#include <cstring>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "graph/graph_impl.hpp"
#include "graph/layers/layer.hpp"
#include "tensor/error.hpp"

namespace stepbench {

// ---- building ------------------------------------------------------------------------------------
Graph::Graph(Backend& be, GraphConfig cfg) : impl_(std::make_unique<Impl>(be, cfg)) {
  if (cfg.batch <= 0) throw UsageError(fmt::format("batch size {} must be positive", cfg.batch));
  be.require(cfg.dtype);
}
Graph::~Graph() = default;

void Graph::set_fault(const SlowConvFault& f) { impl_->slow_conv = f; }

ValueId Graph::input(std::int64_t c, std::int64_t h, std::int64_t w) {
  auto& g = *impl_;
  if (g.input >= 0) throw Error("graph: only one input");
  g.input = g.new_value({g.cfg.batch, c, h, w}, -1);
  g.values[g.input].needs_grad = false;
  return g.input;
}

void Graph::set_training_only(bool on) { impl_->training_only = on; }

void Graph::keep(ValueId v) {
  auto& g = *impl_;
  SB_CHECK(!g.planned && !g.dry_planned, "keep() after plan()");
  SB_CHECK(v >= 0 && static_cast<std::size_t>(v) < g.values.size(), fmt::format("no value {}", v));
  g.kept.resize(g.values.size(), false);
  g.kept[static_cast<std::size_t>(g.root_id(v))] = true;
}

// ---- running -------------------------------------------------------------------------------------
void Graph::forward(Stream& s, bool training) {
  SB_CHECK(impl_->planned, "forward before plan()");
  impl_->run_forward(s, training);
}

void Graph::Impl::run_forward(Stream& s, bool training, const std::function<void(std::size_t)>& after_layer) {
  // the 16-bit weights from the fp32 master copy, as autocast re-casts them in every forward
  if (mixed()) {
    current = -1;
    ProbeScope ps(*this, s, "weight_cast");
    be.cast(s, param_arena.get(), DType::f32, param_half.get(), cfg.dtype, param_floats);
  }
  trained = false;  // until this forward is whole
  for (std::size_t i = 0; i < layers.size(); ++i) {
    Layer& l = *layers[i];
    if (l.training_only && !training) continue;
    current = static_cast<int>(i);
    if (l.probes_itself()) {
      l.forward(*this, s, training);
    } else {
      ProbeScope ps(*this, s, "fwd");
      l.forward(*this, s, training);
    }
    if (after_layer) after_layer(i);
  }
  if (training) ++step;
  trained = training;
}

void Graph::backward(Stream& s, const std::function<void(std::size_t)>& on_ready) {
  SB_CHECK(impl_->planned, "backward before plan()");
  impl_->run_backward(s, on_ready);
}

void Graph::Impl::run_backward(Stream& s, const std::function<void(std::size_t)>& on_ready,
                               const std::function<void(std::size_t)>& after_layer) {
  // what backward reads of the forward is the training forward's: an inference forward since then
  // may have used its space (the plan shares it)
  SB_CHECK(trained, "backward() needs a training forward right before it (forward(s, true))");
  current = -1;
  bool zeroing = false;
  for (auto& v : values) zeroing |= v.grad_zero_first && v.root < 0 && v.needs_grad;
  if (zeroing) {
    ProbeScope ps(*this, s, "grad_zero");
    for (auto& v : values)
      if (v.grad_zero_first && v.root < 0 && v.needs_grad) be.memset_zero(s, v.g.data, v.g.desc.bytes());
  }
  std::size_t told = 0;
  for (std::size_t i = layers.size(); i-- > 0;) {
    Layer& l = *layers[i];
    for (const int j : recompute_before[i]) {
      current = j;
      layers[static_cast<std::size_t>(j)]->recompute(*this, s);
    }
    current = static_cast<int>(i);
    if (l.probes_itself()) {
      l.backward(*this, s);
    } else {
      ProbeScope ps(*this, s, "bwd");
      l.backward(*this, s);
    }
    if (after_layer) after_layer(i);
    if (on_ready && l.ready_after > told) on_ready(told = l.ready_after);
  }
}

void Graph::set_probe(GraphProbe* p) { impl_->probe = p; }
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
  if (t.desc.dtype != DType::f32)
    convert(host.data(), DType::f32, host.data(), t.desc.dtype, host.size());  // in place: narrower
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
  check_after_sync();
  return out;
}

void Graph::check_after_sync() const {
  for (const auto& l : impl_->layers) l->check_after_sync();
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
float* Graph::data_of(const ParamEntry& e) const { return (e.trainable ? param_arena() : state_arena()) + e.offset; }
float* Graph::grad_of(const ParamEntry& e) const {
  SB_CHECK(e.trainable, fmt::format("'{}' has no gradient", e.name));
  return grad_arena() + e.offset;
}
std::uint64_t Graph::arena_fingerprint() const {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&](const void* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  };
  for (const auto& e : impl_->params) {
    const std::string storage = e.storage ? e.storage->name() : "";
    const std::uint64_t numbers[] = {e.offset, e.count, e.trainable, static_cast<std::uint64_t>(e.format)};
    mix(e.name.data(), e.name.size() + 1);
    mix(numbers, sizeof numbers);
    mix(storage.data(), storage.size() + 1);
  }
  return h;
}

std::int64_t Graph::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& e : impl_->params)
    if (e.trainable) n += static_cast<std::int64_t>(e.numel());
  return n;
}
std::int64_t Graph::forward_macs_per_image(bool training) const {
  std::int64_t m = 0;
  for (const auto& l : impl_->layers)
    if (training || !l->training_only) m += l->macs();
  return m / impl_->cfg.batch;
}
std::size_t Graph::device_bytes() const { return impl_->arena_bytes; }
const void* Graph::arena_data() const { return impl_->arena.get(); }
std::size_t Graph::activation_bytes() const {
  return impl_->arena_bytes - std::min(impl_->arena_bytes, impl_->mem.persistent_bytes());
}
const MemoryPlan& Graph::memory_plan() const {
  SB_CHECK(impl_->planned || impl_->dry_planned, "memory_plan() before plan()");
  return impl_->mem;
}
float* Graph::optimizer_state(int i) const {
  SB_CHECK(i >= 0 && i < impl_->cfg.optimizer_state_arenas && impl_->planned,
           fmt::format("optimizer state {} of {} (GraphConfig::optimizer_state_arenas), after plan()", i,
                       impl_->cfg.optimizer_state_arenas));
  return impl_->opt_state[i].as<float>();
}

std::vector<LayerInfo> Graph::layers() const {
  std::vector<LayerInfo> v;
  v.reserve(impl_->layers.size());
  for (const auto& l : impl_->layers) {
    v.push_back(l->info());
    if (v.back().label.empty()) v.back().label = fmt::format("{}_{}", v.back().kind, v.size() - 1);
  }
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
  if (e.storage) {
    SB_CHECK(e.is_filter, fmt::format("'{}' has a filter storage but is not a filter", e.name));
    if (ToStorage)
      e.storage->to_storage(src, dst);
    else
      e.storage->from_storage(src, dst);
    return;
  }
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
          if (ToStorage)
            dst[s] = src[k];
          else
            dst[k] = src[s];
        }
}
}  // namespace

void filter_to_storage(const float* oihw, float* dst, const ParamEntry& e) { permute_filter<true>(oihw, dst, e); }
void filter_from_storage(const float* src, float* oihw, const ParamEntry& e) { permute_filter<false>(src, oihw, e); }

}  // namespace stepbench
