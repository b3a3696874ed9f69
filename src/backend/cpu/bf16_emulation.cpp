// For tests only: bf16 convolution and inner product where oneDNN has no bf16 kernel (AVX2, AVX-512
// without AVX512_BF16), so that machines without native bf16 (CI's AVX2 machines among them) run the
// op, graph and training tests of bf16 through everything else the cpu backend does in bf16. The fp32
// op runs on fp32 copies in its workspace: the bf16 operands widened (exact), each output rounded to
// bf16 once. oneDNN's native bf16 kernels also accumulate in fp32 and round each output once; a
// backward-data that adds (beta 1) rounds once here and twice natively (the sum rounded again),
// which the tests' bound allows for. Reached only through BackendOptions::emulate_bf16: the tests'
// backends, and `stepbench check` under STEPBENCH_EMULATE_BF16=1 (the parity tests); the benchmark
// never emulates, and its --precision bf16 still needs native bf16 (Backend::require).
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/common.hpp"
#include "backend/cpu/onednn.hpp"

namespace stepbench::cpu {
namespace {

TensorDesc f32_desc(const TensorDesc& d) { return TensorDesc::dense(d.shape, DType::f32, d.layout); }

// The fp32 copies, one after another in the workspace after the fp32 op's own.
class Copies {
 public:
  Copies(std::size_t inner_ws, std::initializer_list<std::size_t> counts) : cursor_(align_up(inner_ws)) {
    for (std::size_t c : counts) {
      offsets_.push_back(cursor_);
      cursor_ += align_up(c * sizeof(float));
    }
  }
  std::size_t bytes() const { return cursor_; }
  float* at(void* ws, std::size_t i) const { return reinterpret_cast<float*>(static_cast<char*>(ws) + offsets_[i]); }

 private:
  std::size_t cursor_;
  std::vector<std::size_t> offsets_;
};

void widen(const void* src, float* dst, std::size_t count) { cast(src, DType::bf16, dst, DType::f32, count); }
void narrow(const float* src, void* dst, std::size_t count) { cast(src, DType::f32, dst, DType::bf16, count); }
std::size_t elements(const TensorDesc& d) { return static_cast<std::size_t>(d.shape.numel()); }

class EmulatedBf16Conv final : public ConvOp {
 public:
  EmulatedBf16Conv(std::unique_ptr<ConvOp> op, const TensorDesc& x, const TensorDesc& y, std::size_t filter)
      : op_(std::move(op)),
        x_(f32_desc(x)),
        y_(f32_desc(y)),
        filter_(filter),
        copies_(op_->workspace_bytes(), {elements(x), elements(y), filter}) {}
  std::size_t workspace_bytes() const override { return copies_.bytes(); }
  std::string algorithm() const override { return "bf16 emulated on fp32 (tests only): " + op_->algorithm(); }
  void forward(Stream& s, const Tensor& x, const void* w, const Tensor& y, void* ws) override {
    float *xf = copies_.at(ws, 0), *yf = copies_.at(ws, 1), *wf = copies_.at(ws, 2);
    widen(x.data, xf, elements(x_));
    widen(w, wf, filter_);
    op_->forward(s, Tensor{xf, x_}, wf, Tensor{yf, y_}, ws);
    narrow(yf, y.data, elements(y_));
  }
  void backward_data(Stream& s, const Tensor& dy, const void* w, const Tensor& dx, float beta, void* ws) override {
    float *dxf = copies_.at(ws, 0), *dyf = copies_.at(ws, 1), *wf = copies_.at(ws, 2);
    widen(dy.data, dyf, elements(y_));
    widen(w, wf, filter_);
    if (beta != 0.0f) widen(dx.data, dxf, elements(x_));
    op_->backward_data(s, Tensor{dyf, y_}, wf, Tensor{dxf, x_}, beta, ws);
    narrow(dxf, dx.data, elements(x_));
  }
  void backward_filter(Stream& s, const Tensor& x, const Tensor& dy, void* dw, void* ws) override {
    float *xf = copies_.at(ws, 0), *dyf = copies_.at(ws, 1), *dwf = copies_.at(ws, 2);
    widen(x.data, xf, elements(x_));
    widen(dy.data, dyf, elements(y_));
    op_->backward_filter(s, Tensor{xf, x_}, Tensor{dyf, y_}, dwf, ws);
    narrow(dwf, dw, filter_);
  }

 private:
  std::unique_ptr<ConvOp> op_;
  TensorDesc x_, y_;  // the fp32 copies'
  std::size_t filter_;
  Copies copies_;
};

class EmulatedBf16Linear final : public LinearOp {
 public:
  EmulatedBf16Linear(std::unique_ptr<LinearOp> op, const TensorDesc& x, const TensorDesc& y)
      : op_(std::move(op)),
        x_(f32_desc(x)),
        y_(f32_desc(y)),
        weights_(static_cast<std::size_t>(x.shape.c * y.shape.c)),
        bias_(static_cast<std::size_t>(y.shape.c)),
        copies_(op_->workspace_bytes(), {elements(x), elements(y), weights_, bias_}) {}
  std::size_t workspace_bytes() const override { return copies_.bytes(); }
  std::string implementation() const override { return "bf16 emulated on fp32 (tests only): " + op_->implementation(); }
  void forward(Stream& s, const Tensor& x, const void* w, const void* b, const Tensor& y, void* ws) override {
    float *xf = copies_.at(ws, 0), *yf = copies_.at(ws, 1), *wf = copies_.at(ws, 2), *bf = copies_.at(ws, 3);
    widen(x.data, xf, elements(x_));
    widen(w, wf, weights_);
    widen(b, bf, bias_);
    op_->forward(s, Tensor{xf, x_}, wf, bf, Tensor{yf, y_}, ws);
    narrow(yf, y.data, elements(y_));
  }
  void backward_data(Stream& s, const Tensor& dy, const void* w, const Tensor& dx, float beta, void* ws) override {
    float *dxf = copies_.at(ws, 0), *dyf = copies_.at(ws, 1), *wf = copies_.at(ws, 2);
    widen(dy.data, dyf, elements(y_));
    widen(w, wf, weights_);
    if (beta != 0.0f) widen(dx.data, dxf, elements(x_));
    op_->backward_data(s, Tensor{dyf, y_}, wf, Tensor{dxf, x_}, beta, ws);
    narrow(dxf, dx.data, elements(x_));
  }
  void backward_weights(Stream& s, const Tensor& x, const Tensor& dy, void* dw, void* db, void* ws) override {
    float *xf = copies_.at(ws, 0), *dyf = copies_.at(ws, 1), *dwf = copies_.at(ws, 2), *dbf = copies_.at(ws, 3);
    widen(x.data, xf, elements(x_));
    widen(dy.data, dyf, elements(y_));
    op_->backward_weights(s, Tensor{xf, x_}, Tensor{dyf, y_}, dwf, dbf, ws);
    narrow(dwf, dw, weights_);
    narrow(dbf, db, bias_);
  }

 private:
  std::unique_ptr<LinearOp> op_;
  TensorDesc x_, y_;
  std::size_t weights_, bias_;
  Copies copies_;
};

}  // namespace

std::unique_ptr<ConvOp> make_emulated_bf16_conv(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x,
                                                const TensorDesc& y, const ConvParams& p, FilterFormat ff) {
  require_dense(x, "convolution");
  require_dense(y, "convolution");
  SB_CHECK(x.dtype == DType::bf16 && y.dtype == DType::bf16, "emulated bf16 convolution: bf16 tensors only");
  const auto filter = static_cast<std::size_t>(y.shape.c * (x.shape.c / p.groups) * p.kh * p.kw);
  return std::make_unique<EmulatedBf16Conv>(make_dnnl_conv(eng, strm, f32_desc(x), f32_desc(y), p, ff), x, y, filter);
}

std::unique_ptr<LinearOp> make_emulated_bf16_linear(dnnl::engine& eng, dnnl::stream& strm, const TensorDesc& x,
                                                    const TensorDesc& y) {
  require_dense(x, "linear");
  require_dense(y, "linear");
  SB_CHECK(x.dtype == DType::bf16 && y.dtype == DType::bf16, "emulated bf16 linear: bf16 tensors only");
  return std::make_unique<EmulatedBf16Linear>(make_dnnl_linear(eng, strm, f32_desc(x), f32_desc(y)), x, y);
}

}  // namespace stepbench::cpu
