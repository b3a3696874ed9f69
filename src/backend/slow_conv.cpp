#include "backend/slow_conv.hpp"

#include <fmt/format.h>

namespace stepbench {

std::string conv_shape_name(const Shape& x, std::int64_t cout, const ConvParams& p) {
  return fmt::format("conv:{}x{}x{}x{}>{}:k{}x{}:s{}x{}:p{}x{}{}", x.n, x.c, x.h, x.w, cout, p.kh, p.kw, p.stride_h,
                     p.stride_w, p.pad_h, p.pad_w, p.groups > 1 ? fmt::format(":g{}", p.groups) : "");
}

namespace {

class SlowConv final : public ConvOp {
 public:
  SlowConv(std::unique_ptr<ConvOp> op, SlowConvFault f) : op_(std::move(op)), f_(std::move(f)) {}
  std::size_t workspace_bytes() const override { return op_->workspace_bytes(); }
  std::string algorithm() const override { return op_->algorithm() + " [test fault: slowed]"; }
  void forward(Stream& s, const Tensor& x, const void* w, const Tensor& y, void* ws) override {
    for (int i = 0; i < times("fwd"); ++i) op_->forward(s, x, w, y, ws);
  }
  void backward_data(Stream& s, const Tensor& dy, const void* w, const Tensor& dx, float beta, void* ws) override {
    // repeating is idempotent only when dx is overwritten; a call that accumulates (beta != 0, a
    // branch of a fan-out) runs once
    const int n = beta == 0.0f ? times("bwd_data") : 1;
    for (int i = 0; i < n; ++i) op_->backward_data(s, dy, w, dx, beta, ws);
  }
  void backward_filter(Stream& s, const Tensor& x, const Tensor& dy, void* dw, void* ws) override {
    for (int i = 0; i < times("bwd_filter"); ++i) op_->backward_filter(s, x, dy, dw, ws);
  }

 private:
  int times(const char* d) const { return f_.direction == d ? 1 + f_.repeats : 1; }
  std::unique_ptr<ConvOp> op_;
  SlowConvFault f_;
};

class SlowFusedConv final : public FusedConvOp {
 public:
  SlowFusedConv(std::unique_ptr<FusedConvOp> op, SlowConvFault f) : op_(std::move(op)), f_(std::move(f)) {}
  std::size_t workspace_bytes() const override { return op_->workspace_bytes(); }
  std::string algorithm() const override { return op_->algorithm() + " [test fault: slowed]"; }
  std::string implementation() const override { return op_->implementation(); }
  bool makes_statistics() const override { return op_->makes_statistics(); }
  void forward(Stream& s, const Tensor& x, const UnitNorm* in, const void* w, const Tensor& z, void* stats,
               void* ws) override {
    for (int i = 0; i < times("fwd"); ++i) op_->forward(s, x, in, w, z, stats, ws);
  }
  void backward_filter(Stream& s, const Tensor& x, const UnitNorm* in, const Tensor& dz, void* dw, void* ws) override {
    for (int i = 0; i < times("bwd_filter"); ++i) op_->backward_filter(s, x, in, dz, dw, ws);
  }
  void backward_data(Stream& s, const Tensor& dz, const void* w, const Tensor& dx, float beta, void* ws) override {
    const int n = beta == 0.0f ? times("bwd_data") : 1;  // as SlowConv: only an overwrite repeats
    for (int i = 0; i < n; ++i) op_->backward_data(s, dz, w, dx, beta, ws);
  }

 private:
  int times(const char* d) const { return f_.direction == d ? 1 + f_.repeats : 1; }
  std::unique_ptr<FusedConvOp> op_;
  SlowConvFault f_;
};

}  // namespace

std::unique_ptr<FusedConvOp> with_fault(std::unique_ptr<FusedConvOp> op, const Shape& x, std::int64_t cout,
                                        const ConvParams& p, const SlowConvFault& f) {
  if (!f.active() || conv_shape_name(x, cout, p) != f.shape) return op;
  return std::make_unique<SlowFusedConv>(std::move(op), f);
}

std::unique_ptr<ConvOp> with_fault(std::unique_ptr<ConvOp> op, const Shape& x, std::int64_t cout, const ConvParams& p,
                                   const SlowConvFault& f) {
  if (!f.active() || conv_shape_name(x, cout, p) != f.shape) return op;
  return std::make_unique<SlowConv>(std::move(op), f);
}

}  // namespace stepbench
