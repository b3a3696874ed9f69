// Test helpers: backends by name (skipping with the reason when one cannot run here), tensors
// placed in backend memory in either layout (optionally as a channel slice of a wider buffer, so
// the strided paths are exercised), random data and the comparison metric.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/registry.hpp"
#include "graph/graph.hpp"
#include "support/error_model.hpp"
#include "support/reference.hpp"
#include "tensor/error.hpp"

namespace stepbench::test {

struct Config {
  std::string backend;
  Layout layout;
  DType dtype;
  bool tf32 = false;  // fp32 storage, TF32 tensor-op math (Backend::set_tensor_math): cuda only
};
inline std::string precision_name(const Config& c) { return c.tf32 ? "tf32" : std::string(to_string(c.dtype)); }
inline void PrintTo(const Config& c, std::ostream* os) {
  *os << c.backend << "/" << to_string(c.layout) << "/" << precision_name(c);
}
inline std::string config_name(const testing::TestParamInfo<Config>& i) {
  return i.param.backend + "_" + std::string(to_string(i.param.layout)) + "_" + precision_name(i.param);
}
// Every configuration some machine can run: the cpu backend in fp32 and bf16 (its refusal of fp16,
// and of bf16 without native bf16 outside the tests, is tested in backend_test.cpp), the cuda backend
// in every precision.
inline std::vector<Config> all_configs() {
  std::vector<Config> v;
  // cpu bf16: on CPUs without native bf16 (AVX2, AVX-512 without AVX512_BF16) with the convolutions
  // and inner products emulated (try_backend)
  for (Layout l : {Layout::nchw, Layout::nhwc})
    for (DType t : {DType::f32, DType::bf16}) v.push_back({"cpu", l, t});
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    for (DType t : {DType::f32, DType::bf16, DType::f16}) v.push_back({"cuda", l, t});
    v.push_back({"cuda", l, DType::f32, true});
  }
  return v;
}

// ctest ops.cuda_own_kernels sets STEPBENCH_CUDA_OWN_KERNELS=1: the cuda backend then runs batch
// norm and pooling on stepbench's kernels (the path it falls back to where cuDNN declines).
inline bool own_kernels() {
  const char* v = std::getenv("STEPBENCH_CUDA_OWN_KERNELS");
  return v && std::string(v) == "1";
}
inline BackendOptions gpu_options() {
  BackendOptions o;
  o.kind = BackendKind::cuda;
  o.own_kernels = own_kernels();
  return o;
}

// Returns the backend, or nullptr after GTEST_SKIP-worthy reason in `why`.
// The cpu backend emulates bf16 convolution and inner product where oneDNN has no bf16 kernel
// (BackendOptions::emulate_bf16), so that cpu bf16 runs on every CPU, CI's AVX2 machines included:
// there the tests check everything else in bf16 (batch norm, pooling, ReLU, concat, casts, the
// optimizers, the graph's 16-bit weight copies and plan) on stepbench's own code, and the
// convolutions on the emulation; on a CPU with native bf16 they check oneDNN's bf16 kernels.
inline std::unique_ptr<Backend> try_backend(const Config& c, std::string& why) {
  try {
    BackendOptions o = c.backend == "cuda" ? gpu_options() : BackendOptions{};
    o.emulate_bf16 = c.backend == "cpu";
    o.precision = c.tf32                   ? Precision::tf32
                  : c.dtype == DType::bf16 ? Precision::bf16
                  : c.dtype == DType::f16  ? Precision::fp16
                                           : Precision::fp32;
    auto be = make_backend(o);
    be->require(c.dtype);
    return be;
  } catch (const UsageError& e) {
    why = e.what();
    return nullptr;
  }
}

#define SB_BACKEND_OR_SKIP(var, cfg)          \
  std::string sb_why_;                        \
  auto var = test::try_backend(cfg, sb_why_); \
  if (!var) GTEST_SKIP() << sb_why_

inline std::vector<double> random_vec(std::size_t n, std::uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = static_cast<float>(d(g));  // representable in fp32
  return v;
}

// Each value rounded to the storage type t (what a backend computes from after an upload in t).
inline std::vector<double> round_to(DType t, std::vector<double> v) {
  for (auto& x : v) {
    const auto f = static_cast<float>(x);
    x = t == DType::bf16 ? bf16_to_float(float_to_bf16(f)) : t == DType::f16 ? f16_to_float(float_to_f16(f)) : f;
  }
  return v;
}
// The unit roundoff of the storage type: half the distance from 1 to the next value.
inline double unit_roundoff(DType t) { return t == DType::f32 ? 0x1p-24 : t == DType::bf16 ? 0x1p-8 : 0x1p-11; }

// n distinct values, each exact in bf16, fp16 and fp32 (magnitudes in [1/8, 8), both signs: 1536
// of them), shuffled: max pooling over them has no ties in any precision, so which of several equal
// maxima a backend routes the gradient to never matters.
inline std::vector<double> distinct_vec(std::size_t n, std::uint32_t seed) {
  std::vector<double> pool;
  for (int e = -3; e < 3; ++e)
    for (int m = 0; m < 128; ++m)
      for (double sign : {1.0, -1.0}) pool.push_back(sign * std::ldexp(1.0 + m / 128.0, e));
  if (n > pool.size()) throw std::invalid_argument("distinct_vec: at most 1536 values");
  std::mt19937 g(seed);
  std::shuffle(pool.begin(), pool.end(), g);
  pool.resize(n);
  return pool;
}

inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;  // nothing or the wrong thing to compare
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / std::max(den, 1e-12);
}

// The Euclidean norm.
inline double norm(const std::vector<double>& a) {
  double s = 0;
  for (double v : a) s += v * v;
  return std::sqrt(s);
}

#define EXPECT_CLOSE(got, want, tol) \
  EXPECT_LE(test::rel_error(got, want), tol) << "max |got - want| / max |want| for " #got

// A tensor in backend memory: `extra` channels around it make it a strided slice of a wider buffer.
class DevTensor {
 public:
  DevTensor(Backend& be, Shape s, Layout l, DType t = DType::f32, std::int64_t before = 0, std::int64_t after = 0)
      : be_(be) {
    Shape full = s;
    full.c += before + after;
    const TensorDesc fd = TensorDesc::dense(full, t, l);
    buf_ = Buffer(be, fd.bytes());
    be.memset_zero(be.default_stream(), buf_.get(), fd.bytes());
    full_ = Tensor{buf_.get(), fd};
    t_ = full_.channel_slice(before, s.c);
  }
  const Tensor& t() const { return t_; }
  operator const Tensor&() const { return t_; }
  void upload(const std::vector<double>& nchw) {
    std::vector<float> host = raw();
    const Shape& s = t_.shape();
    const std::int64_t base = elements_before();
    for (std::int64_t n = 0; n < s.n; ++n)
      for (std::int64_t c = 0; c < s.c; ++c)
        for (std::int64_t h = 0; h < s.h; ++h)
          for (std::int64_t w = 0; w < s.w; ++w)
            host[static_cast<std::size_t>(base + t_.desc.offset(n, c, h, w))] =
                static_cast<float>(nchw[ref::idx(s, n, c, h, w)]);
    std::vector<char> stored(full_.desc.bytes());
    convert(host.data(), DType::f32, stored.data(), full_.desc.dtype, host.size());
    be_.copy(be_.default_stream(), full_.data, stored.data(), stored.size());
    be_.synchronize(be_.default_stream());
  }
  std::vector<double> download() const {
    const std::vector<float> host = raw();
    const Shape& s = t_.shape();
    const std::int64_t base = elements_before();
    std::vector<double> out(static_cast<std::size_t>(s.numel()));
    for (std::int64_t n = 0; n < s.n; ++n)
      for (std::int64_t c = 0; c < s.c; ++c)
        for (std::int64_t h = 0; h < s.h; ++h)
          for (std::int64_t w = 0; w < s.w; ++w)
            out[ref::idx(s, n, c, h, w)] = host[static_cast<std::size_t>(base + t_.desc.offset(n, c, h, w))];
    return out;
  }
  // The whole buffer as floats (to check that a slice write left its neighbours alone).
  std::vector<float> raw() const {
    std::vector<char> stored(full_.desc.bytes());
    be_.copy(be_.default_stream(), stored.data(), full_.data, stored.size());
    be_.synchronize(be_.default_stream());
    std::vector<float> host(static_cast<std::size_t>(full_.desc.numel()));
    convert(stored.data(), full_.desc.dtype, host.data(), DType::f32, host.size());
    return host;
  }

 private:
  std::int64_t elements_before() const {
    return (static_cast<char*>(t_.data) - static_cast<char*>(full_.data)) /
           static_cast<std::int64_t>(dtype_size(full_.desc.dtype));
  }
  Backend& be_;
  Buffer buf_;
  Tensor full_, t_;
};

// A flat buffer in backend memory, fp32 unless told (weights of a 16-bit op are 16-bit).
class DevVec {
 public:
  DevVec(Backend& be, const std::vector<double>& v, DType t = DType::f32)
      : be_(be), n_(v.size()), t_(t), buf_(be, std::max<std::size_t>(v.size(), 1) * dtype_size(t)) {
    set(v);
  }
  DevVec(Backend& be, std::size_t n, DType t = DType::f32) : DevVec(be, std::vector<double>(n, 0.0), t) {}
  float* get() const { return buf_.as<float>(); }
  operator float*() const { return get(); }
  void set(const std::vector<double>& v) {
    std::vector<float> h(v.begin(), v.end());
    std::vector<char> stored(h.size() * dtype_size(t_));
    convert(h.data(), DType::f32, stored.data(), t_, h.size());
    be_.copy(be_.default_stream(), buf_.get(), stored.data(), stored.size());
    be_.synchronize(be_.default_stream());
  }
  std::vector<double> get_host() const {
    std::vector<char> stored(n_ * dtype_size(t_));
    be_.copy(be_.default_stream(), stored.data(), buf_.get(), stored.size());
    be_.synchronize(be_.default_stream());
    std::vector<float> h(n_);
    convert(stored.data(), t_, h.data(), DType::f32, n_);
    return {h.begin(), h.end()};
  }

 private:
  Backend& be_;
  std::size_t n_;
  DType t_;
  Buffer buf_;
};

// Any tensor (fp32, bf16, fp16) in backend memory (dense or a strided slice) as dense NCHW doubles.
std::vector<double> read_nchw(Backend& be, const Tensor& t);

// After forward(training) and backward: every conv-BN(-ReLU) unit of g, checked in place against the
// oracle from its input value and the gradient at its output (the weight, gamma, beta gradients).
// Every conv-BN(-ReLU) unit's output and parameter gradients, and the gradient of every value (the
// sum of what its consumers send it: units, pools, the FC, residual additions), against the oracle
// recomputed from the unit's own inputs in the graph; bounds from the error model.
// With `only`, just the layers it selects (their inputs' gradient sums are then not checked where
// an unselected layer also consumes them). The graph must keep its values (GraphConfig::sharing).
void expect_units_match_oracle(Graph& g, const ErrorModel& m, const std::function<bool(const LayerInfo&)>& only = {});

// Reorders an O,I,KH,KW filter into the backend's storage format for layout l.
std::vector<double> filter_for(const Backend& be, Layout l, const std::vector<double>& oihw, std::int64_t O,
                               std::int64_t I, std::int64_t KH, std::int64_t KW);
std::vector<double> filter_back(const Backend& be, Layout l, const std::vector<double>& stored, std::int64_t O,
                                std::int64_t I, std::int64_t KH, std::int64_t KW);
// A graph's filter (or its gradient) at p, in O,I,KH,KW order from its storage (the entry's format
// or the backend's own storage).
std::vector<double> read_filter(Backend& be, const float* p, const ParamEntry& e);

// Every batch norm's scale in [0.5, 1.5) and shift in [-0.5, 0.5), random from `seed`, instead of
// their initial 1 and 0 (under which a kernel that ignored either would pass).
void perturb_batch_norms(Graph& g, std::uint32_t seed);

}  // namespace stepbench::test
