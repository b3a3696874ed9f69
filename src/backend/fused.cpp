// The composed pieces of the fused convolution + batch-norm unit (fused.hpp): each made of the
// backend's own ConvOp, BatchNormOp and AddReluOp. A reader's x' (the producing unit's
// normalisation of its z, applied on load) goes to the reader's workspace right before its
// convolution or residual add reads it; so do a unit's y in a statistics-only forward (where the
// backend's batch norm cannot skip it) and the ReLU's mask made again from z in backward.
//
// Planted faults (a test-only build: cmake -DSTEPBENCH_PLANT_FAULT=<n>, tests/mutation/plant_faults.sh)
// in the load of a normalised input: 5 drops the unit's ReLU, 6 ignores its scale (gamma taken as 1).
#include "backend/fused.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "tensor/error.hpp"

#ifndef STEPBENCH_PLANT_FAULT
#define STEPBENCH_PLANT_FAULT 0
#endif

namespace stepbench {
namespace {

constexpr std::size_t kFusedAlign = 256;
std::size_t fused_aligned(std::size_t n) { return (n + kFusedAlign - 1) / kFusedAlign * kFusedAlign; }
void* offset_by(void* ws, std::size_t offset) { return ws ? static_cast<char*>(ws) + offset : nullptr; }
const void* offset_by(const void* p, std::size_t offset) { return p ? static_cast<const char*>(p) + offset : nullptr; }

// Tests only (Backend::set_fused_canaries): a pattern of one unit's buffer (its statistics, factors or
// reserve), written where the pieces write that buffer and checked, after a synchronisation, where
// they read it: a piece that reads it outside the lifetime the memory plan gave it (a declaration
// missing) finds another buffer's bytes, or the poison of liveness_test.
class Canary {
 public:
  static constexpr std::size_t kBytes = 64;
  Canary() = default;
  Canary(Backend& be, const void* unit, std::uint32_t which) : be_(&be) {
    std::uint64_t h = reinterpret_cast<std::uintptr_t>(unit) * 0x9e3779b97f4a7c15ull + which;
    for (auto& w : pattern_)
      w = static_cast<std::uint32_t>((h = h * 6364136223846793005ull + 1442695040888963407ull) >> 32);
  }
  bool on() const { return be_ != nullptr; }
  void write(Stream& s, void* at) const {
    if (be_) be_->copy(s, at, pattern_.data(), kBytes);
  }
  void check(Stream& s, const void* at, const char* what) const {
    if (!be_) return;
    std::array<std::uint32_t, kBytes / 4> got{};
    be_->copy(s, got.data(), at, kBytes);
    be_->synchronize(s);
    if (got != pattern_)
      throw Error(
          fmt::format("fused canary: what was left in the unit's {} has changed (read outside the lifetime the "
                      "memory plan gave it: a declaration missing?)",
                      what));
  }

 private:
  Backend* be_ = nullptr;
  std::array<std::uint32_t, kBytes / 4> pattern_{};
};

class ComposedBnUnit final : public BnUnitOp {
 public:
  ComposedBnUnit(Backend& be, const TensorDesc& z, const TensorDesc& y, const BnUnitSpec& spec)
      : spec_(spec), y_(y), bn_(be.make_batch_norm(z, y, spec.bn)) {
    if (be.fused_canaries()) stats_ = Canary(be, this, 0), norm_ = Canary(be, this, 1), kept_ = Canary(be, this, 2);
    SB_CHECK(z.is_dense(), "a fused unit's z is dense");
    SB_CHECK(spec.stored || y.is_dense(), "a fused unit's output that is not stored is dense (a reader's workspace)");
    // not stored: y of the statistics-only forward (unless the batch norm skips it) and the ReLU's
    // mask made again in backward, dense in the workspace
    if (!spec.stored && (!bn_->statistics_without_output() || spec.bn.relu)) temp_ = fused_aligned(y.bytes());
  }
  std::size_t workspace_bytes() const override { return temp_ + bn_->workspace_bytes(); }
  std::size_t apply_workspace_bytes() const override { return bn_->recompute_workspace_bytes(); }
  // the batch norm's reserve; with canaries (tests), one after it, and a statistics and a factors buffer
  std::size_t reserve_bytes() const override { return canary_at() + (kept_.on() ? Canary::kBytes : 0); }
  std::size_t stats_bytes() const override { return stats_.on() ? Canary::kBytes : 0; }
  std::size_t norm_bytes() const override { return norm_.on() ? Canary::kBytes : 0; }
  const Canary& stats_canary() const { return stats_; }  // what this unit's convolution writes
  const BatchNormParams& params() const override { return spec_.bn; }
  std::string implementation() const override {
    return fmt::format("composed: {}{}", bn_->implementation(),
                       spec_.stored                       ? ""
                       : bn_->statistics_without_output() ? ", statistics without y"
                                                          : ", y to the workspace");
  }
  void finalize(Stream& s, const Tensor& z, const void* stats, const float* gamma, const float* beta,
                float* running_mean, float* running_var, float* save_mean, float* save_invstd, void* norm,
                const Tensor& y, void* ws, void* reserve) override {
    if (stats) stats_.check(s, stats, "statistics");  // only the canary's: the composed convolution makes none
    norm_.write(s, norm);
    kept_.write(s, offset_by(reserve, canary_at()));
    Tensor out = y;
    if (!out.data && !bn_->statistics_without_output()) out = Tensor{ws, y_};
    if (!y.data) out.desc = y_;
    bn_->forward_training(s, z, out, gamma, beta, running_mean, running_var, save_mean, save_invstd,
                          offset_by(ws, temp_), reserve);
  }
  void apply(Stream& s, const Tensor& z, const UnitNorm& n, const Tensor& y, void* ws) override {
    if (n.training) check_kept(s, n);
    if (n.training)
      bn_->forward_recompute(s, z, y, n.gamma, n.beta, n.save_mean, n.save_invstd, ws, n.reserve);
    else
      bn_->forward_inference(s, z, y, n.gamma, n.beta, n.running_mean, n.running_var, ws);
  }
  void backward(Stream& s, const Tensor& z, const UnitNorm& n, const Tensor& y, const Tensor& dy, const Tensor& dz,
                float* dgamma, float* dbeta, void* ws) override {
    check_kept(s, n);
    Tensor mask = y;
    if (!mask.data && spec_.bn.relu) {  // the output's bits again, from z and the saved statistics
      mask = Tensor{ws, y_};
      bn_->forward_recompute(s, z, mask, n.gamma, n.beta, n.save_mean, n.save_invstd, offset_by(ws, temp_), n.reserve);
    }
    if (!mask.data) mask = Tensor{z.data, y_};  // no ReLU: no backend reads y
    bn_->backward(s, z, mask, dy, dz, n.gamma, n.beta, n.save_mean, n.save_invstd, dgamma, dbeta, 0.0f,
                  offset_by(ws, temp_), n.reserve);
  }

 private:
  std::size_t canary_at() const { return kept_.on() ? fused_aligned(bn_->reserve_bytes()) : bn_->reserve_bytes(); }
  void check_kept(Stream& s, const UnitNorm& n) const {  // what finalize left for the unit's readers and backward
    norm_.check(s, n.norm, "factors");
    kept_.check(s, offset_by(n.reserve, canary_at()), "reserve");
  }
  BnUnitSpec spec_;
  TensorDesc y_;
  std::unique_ptr<BatchNormOp> bn_;
  std::size_t temp_ = 0;
  Canary stats_, norm_, kept_;
};

// x' of a normalised input, in the workspace: the producing unit's apply (with a planted fault, its
// ReLU dropped or its scale ignored, through a batch norm of this op's own).
class Load {
 public:
  Load(Backend& be, const TensorDesc& x, BnUnitOp* unit)
      : unit_(unit), x_(TensorDesc::dense(x.shape, x.dtype, x.layout)), temp_(unit ? fused_aligned(x.bytes()) : 0) {
    (void)be;
#if STEPBENCH_PLANT_FAULT == 5 || STEPBENCH_PLANT_FAULT == 6
    if (unit) {
      BatchNormParams p = unit->params();
      p.relu = STEPBENCH_PLANT_FAULT == 6 && unit->relu();
      fault_bn_ = be.make_batch_norm(x_, x_, p);
      ones_ = Buffer(be, sizeof(float) * static_cast<std::size_t>(x.shape.c));
      be.fill(be.default_stream(), ones_.as<float>(), 1.0f, static_cast<std::size_t>(x.shape.c));
      be.synchronize(be.default_stream());
    }
#endif
  }
  std::size_t workspace_bytes() const {
    std::size_t apply = unit_ ? unit_->apply_workspace_bytes() : 0;
#if STEPBENCH_PLANT_FAULT == 5 || STEPBENCH_PLANT_FAULT == 6
    if (fault_bn_) apply = std::max(apply, fault_bn_->workspace_bytes());
#endif
    return temp_ + apply;
  }
  std::size_t offset() const { return temp_; }  // where the rest of the workspace starts
  bool normalises() const { return unit_ != nullptr; }
  Tensor operator()(Stream& s, const Tensor& x, const UnitNorm* in, void* ws) const {
    SB_CHECK((in != nullptr) == (unit_ != nullptr) && (!in || in->op == unit_),
             "a fused convolution's input norm differs from the unit it was made for");
    if (!in) return x;
    const Tensor xp{ws, x_};
#if STEPBENCH_PLANT_FAULT == 5 || STEPBENCH_PLANT_FAULT == 6
    const float* gamma = STEPBENCH_PLANT_FAULT == 6 ? ones_.as<float>() : in->gamma;
    if (in->training)
      fault_bn_->forward_recompute(s, x, xp, gamma, in->beta, in->save_mean, in->save_invstd, offset_by(ws, temp_),
                                   in->reserve);
    else
      fault_bn_->forward_inference(s, x, xp, gamma, in->beta, in->running_mean, in->running_var, offset_by(ws, temp_));
#else
    unit_->apply(s, x, *in, xp, offset_by(ws, temp_));
#endif
    return xp;
  }

 private:
  BnUnitOp* unit_;
  TensorDesc x_;
  std::size_t temp_;
#if STEPBENCH_PLANT_FAULT == 5 || STEPBENCH_PLANT_FAULT == 6
  std::unique_ptr<BatchNormOp> fault_bn_;
  Buffer ones_;
#endif
};

class ComposedFusedConv final : public FusedConvOp {
 public:
  ComposedFusedConv(Backend& be, std::unique_ptr<ConvOp> conv, const TensorDesc& x, BnUnitOp* in, BnUnitOp* out)
      : conv_(std::move(conv)), load_(be, x, in) {
    // with canaries (tests), the output unit's statistics are its canary, written here as an epilogue would
    if (const auto* unit = dynamic_cast<const ComposedBnUnit*>(out)) stats_ = unit->stats_canary();
  }
  bool makes_statistics() const override { return stats_.on(); }
  std::size_t workspace_bytes() const override {
    return std::max(load_.workspace_bytes(), load_.offset() + conv_->workspace_bytes());
  }
  std::string algorithm() const override { return conv_->algorithm(); }
  std::string implementation() const override {
    return load_.normalises() ? "composed: the input unit's batch norm applied to the workspace, then the convolution"
                              : "composed: the convolution";
  }
  void forward(Stream& s, const Tensor& x, const UnitNorm* in, const void* w, const Tensor& z, void* stats,
               void* ws) override {
    conv_->forward(s, load_(s, x, in, ws), w, z, offset_by(ws, load_.offset()));
    stats_.write(s, stats);
  }
  void backward_filter(Stream& s, const Tensor& x, const UnitNorm* in, const Tensor& dz, void* dw, void* ws) override {
    conv_->backward_filter(s, load_(s, x, in, ws), dz, dw, offset_by(ws, load_.offset()));
  }
  void backward_data(Stream& s, const Tensor& dz, const void* w, const Tensor& dx, float beta, void* ws) override {
    conv_->backward_data(s, dz, w, dx, beta, ws);
  }

 private:
  std::unique_ptr<ConvOp> conv_;
  Load load_;
  Canary stats_;
};

class ComposedBnAddRelu final : public BnAddReluOp {
 public:
  ComposedBnAddRelu(Backend& be, const TensorDesc& y, BnUnitOp* a, BnUnitOp* b)
      : op_(be.make_add_relu(y)), a_(be, y, a), b_(be, y, b) {}
  std::size_t workspace_bytes() const override {
    return std::max(a_.workspace_bytes(), a_.offset() + b_.workspace_bytes());
  }
  std::string implementation() const override {
    return a_.normalises() || b_.normalises()
               ? "composed: the input units' batch norm applied to the workspace, then " + op_->implementation()
               : "composed: " + op_->implementation();
  }
  void forward(Stream& s, const Tensor& a, const UnitNorm* na, const Tensor& b, const UnitNorm* nb, const Tensor& y,
               void* ws) override {
    // a' first (in [0, a's x')), then b' after it; each load's own scratch beyond its x'
    const Tensor ap = a_(s, a, na, ws);
    const Tensor bp = b_(s, b, nb, offset_by(ws, a_.offset()));
    op_->forward(s, ap, bp, y);
  }
  void backward(Stream& s, const Tensor& y, const Tensor& dy, const Tensor& da, float beta_a, const Tensor& db,
                float beta_b) override {
    op_->backward(s, y, dy, da, beta_a, db, beta_b);
  }

 private:
  std::unique_ptr<AddReluOp> op_;
  Load a_, b_;
};

}  // namespace

std::unique_ptr<FusedConvOp> Backend::make_fused_conv(const TensorDesc& x, const TensorDesc& z,
                                                      const FusedConvSpec& spec, const FilterStorage* w) {
  auto conv = w ? make_conv_stored(x, z, spec.conv, *w) : make_conv(x, z, spec.conv);
  return std::make_unique<ComposedFusedConv>(*this, std::move(conv), x, spec.input, spec.output);
}

std::unique_ptr<BnUnitOp> Backend::make_bn_unit(const TensorDesc& z, const TensorDesc& y, const BnUnitSpec& spec) {
  return std::make_unique<ComposedBnUnit>(*this, z, y, spec);
}

std::unique_ptr<BnAddReluOp> Backend::make_bn_add_relu(const TensorDesc& y, BnUnitOp* a, BnUnitOp* b) {
  return std::make_unique<ComposedBnAddRelu>(*this, y, a, b);
}

}  // namespace stepbench
