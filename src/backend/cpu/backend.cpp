// The cpu backend: memory, streams and events on the host, one oneDNN engine and stream for the
// convolution and fully connected ops, and each op made by the file of its name in this folder.
#include "backend/cpu/cpu_backend.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backend/cpu/common.hpp"
#include "backend/cpu/isa.hpp"
#include "backend/cpu/onednn.hpp"
#include "tensor/error.hpp"

namespace stepbench {
namespace cpu {
namespace {

struct CpuStream final : Stream {};
struct CpuEvent final : Event {
  std::chrono::steady_clock::time_point t{};
};

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(pos + 2);
    }
  return "unknown CPU";
}

std::string isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return fmt::format("isa#{}", static_cast<int>(isa));
  }
}

// ---- the backend ---------------------------------------------------------------------------------
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(bool emulate_bf16)
      : eng_(dnnl::engine::kind::cpu, 0),
        strm_(eng_),
        native_bf16_(native_bf16()),
        emulate_bf16_(emulate_bf16 && !native_bf16_) {}

  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string name() const override { return "cpu"; }
  std::string device_name() const override {
    return fmt::format("{} ({} threads)", cpu_model_name(), omp_get_max_threads());
  }
  std::map<std::string, std::string> versions() const override {
    const auto* v = dnnl::version();
    return {{"onednn", fmt::format("{}.{}.{}", v->major, v->minor, v->patch)},
            {"cpu_isa", isa_name(dnnl::get_effective_cpu_isa())},
            {"cpu_kernels", std::string(cpu::to_string(cpu::kernel_isa()))},  // isa.hpp
            {"cpu_kernel_builds", std::string(cpu::kernel_builds())},
            {"omp_threads", std::to_string(omp_get_max_threads())},
            {"bf16", emulate_bf16_  ? "emulated on fp32 (tests only)"
                     : native_bf16_ ? "native"
                                    : "none"}};
  }
  void require(DType t) const override {
    if (t == DType::f32) return;
    const dnnl::cpu_isa found = dnnl::get_effective_cpu_isa();
    const std::string isa = isa_name(found);
    if (t == DType::bf16) {
      // native bf16 only: AVX512_BF16 (Zen 4/5, Cooper Lake) or AMX (Sapphire Rapids and later); on
      // AVX2 or AVX-512 without it oneDNN would emulate bf16, slower than fp32 (or has no kernel).
      // The tests' emulation (BackendOptions::emulate_bf16) runs anywhere.
      if (!emulate_bf16_ && !native_bf16_)
        throw UnsupportedError(fmt::format(
            "--precision bf16 on the cpu backend needs a CPU with native bf16 (AVX512_BF16: AMD Zen 4 or 5, Intel "
            "Cooper Lake; or AMX: Sapphire Rapids and later); oneDNN finds {} here, where bf16 would be emulated and "
            "slower than fp32 (ONEDNN_MAX_CPU_ISA, where set, limits what it finds). Use --precision fp32",
            isa));
      return;
    }
    throw UnsupportedError(
        fmt::format("precision {} is not supported by the cpu backend (it computes in fp32); "
                    "use --precision fp32, or the cuda backend for reduced precision",
                    to_string(t)));
  }
  FilterFormat filter_format(Layout l) const override {
    // The layouts oneDNN's GEMM convolutions take without reordering (oihw: NCHW, hwio: NHWC).
    return l == Layout::nchw ? FilterFormat::oihw : FilterFormat::hwio;
  }

  void* allocate(std::size_t bytes) override {
    void* p = std::aligned_alloc(64, align_up(std::max<std::size_t>(bytes, 1)));
    if (!p)
      throw Error(fmt::format("out of memory: could not allocate {:.1f} MiB of host memory; use a smaller batch",
                              static_cast<double>(bytes) / (1 << 20)));
    return p;
  }
  void deallocate(void* p) override { std::free(p); }
  void* allocate_host(std::size_t bytes) override { return allocate(bytes); }
  void deallocate_host(void* p) override { std::free(p); }
  std::size_t memory_available() const override {
    const std::size_t kb = meminfo_kb("MemAvailable:");
    return kb ? kb * 1024
              : static_cast<std::size_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  }
  std::size_t memory_total() const override {
    const std::size_t kb = meminfo_kb("MemTotal:");
    return kb ? kb * 1024 : memory_available();
  }
  static std::size_t meminfo_kb(const std::string& field) {
    std::ifstream f("/proc/meminfo");
    std::string key, unit;
    std::size_t kb = 0;
    while (f >> key >> kb >> unit)
      if (key == field) return kb;
    return 0;
  }

  Stream& default_stream() override { return stream_; }
  std::unique_ptr<Stream> create_stream() override { return std::make_unique<CpuStream>(); }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(); }
  void record(Event& e, Stream&) override { static_cast<CpuEvent&>(e).t = std::chrono::steady_clock::now(); }
  void wait(Stream&, Event&) override {}
  void synchronize(Stream&) override {}
  double elapsed_ms(Event& a, Event& b) override {
    return std::chrono::duration<double, std::milli>(static_cast<CpuEvent&>(b).t - static_cast<CpuEvent&>(a).t).count();
  }

  void copy(Stream&, void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void memset_zero(Stream&, void* dst, std::size_t bytes) override { std::memset(dst, 0, bytes); }
  void fill(Stream&, float* dst, float value, std::size_t count) override { cpu::fill(dst, value, count); }

  std::unique_ptr<ConvOp> make_conv(const TensorDesc& x, const TensorDesc& y, const ConvParams& p) override {
    if (emulated(x)) return cpu::make_emulated_bf16_conv(eng_, strm_, x, y, p, filter_format(x.layout));
    return cpu::make_dnnl_conv(eng_, strm_, x, y, p, filter_format(x.layout));
  }
  std::shared_ptr<const FilterStorage> conv_filter_storage(const TensorDesc& x, const TensorDesc& y,
                                                           const ConvParams& p) override {
    // sized, never run (the largest-batch search) or run: the same storage, so that the memory plan
    // of a sized graph is the one a run makes (its quick lower bound keeps absurd batches from here)
    // one search per shape: graphs built again on this backend ask again
    if (emulated(x)) return nullptr;  // the emulation's filter stays plain
    const std::string key = cpu::dnnl_conv_key(x, y, p);
    std::lock_guard<std::mutex> lock(storage_mutex_);
    auto it = storages_.find(key);
    if (it == storages_.end())
      it = storages_.emplace(key, cpu::dnnl_filter_storage(eng_, x, y, p, filter_format(x.layout))).first;
    return it->second;
  }
  std::unique_ptr<ConvOp> make_conv_stored(const TensorDesc& x, const TensorDesc& y, const ConvParams& p,
                                           const FilterStorage& w) override {
    return cpu::make_dnnl_conv_stored(eng_, strm_, x, y, p, filter_format(x.layout), w);
  }
  std::unique_ptr<BatchNormOp> make_batch_norm(const TensorDesc& x, const TensorDesc& y,
                                               const BatchNormParams& p) override {
    if (cpu::dnnl_batch_norm_wins(x, y))
      return cpu::make_dnnl_batch_norm(eng_, strm_, x, p, cpu::make_batch_norm(x, p));
    return cpu::make_batch_norm(x, p);
  }
  std::unique_ptr<PoolOp> make_pool(const TensorDesc& x, const TensorDesc& y, const PoolParams& p) override {
    if (cpu::dnnl_pool_wins(x, y, p)) return cpu::make_dnnl_pool(eng_, strm_, x, y, p, cpu::make_pool(x, y, p));
    return cpu::make_pool(x, y, p);
  }
  std::unique_ptr<ReluOp> make_relu(const TensorDesc& x, const TensorDesc&, float clip) override {
    return cpu::make_relu(x, clip);
  }
  std::unique_ptr<BiasActOp> make_bias_act(const TensorDesc& y, bool relu) override {
    return cpu::make_bias_act(y, relu);
  }
  std::unique_ptr<AdaptiveAvgPoolOp> make_adaptive_avg_pool(const TensorDesc& x, const TensorDesc& y) override {
    return cpu::make_adaptive_avg_pool(x, y);
  }
  std::unique_ptr<AddReluOp> make_add_relu(const TensorDesc& y) override { return cpu::make_add_relu(y); }
  std::unique_ptr<LinearOp> make_linear(const TensorDesc& x, const TensorDesc& y) override {
    if (emulated(x)) return cpu::make_emulated_bf16_linear(eng_, strm_, x, y);
    return cpu::make_dnnl_linear(eng_, strm_, x, y);
  }
  std::unique_ptr<DropoutOp> make_dropout(const TensorDesc& x, double p) override { return cpu::make_dropout(x, p); }
  std::unique_ptr<SoftmaxCrossEntropyOp> make_softmax_cross_entropy(const TensorDesc& logits) override {
    return cpu::make_softmax_cross_entropy(logits);
  }

  void add(Stream&, const Tensor& src, const Tensor& dst, float beta) override { cpu::add(src, dst, beta); }
  void scale(Stream&, float* x, float alpha, std::size_t count) override { cpu::scale(x, alpha, count); }
  void optimizer_update(Stream&, const OptimizerConfig& cfg, float* params, const float* grads, float* s0, float* s1,
                        std::size_t count, const float* scaler) override {
    if (scaler && scaler[1] != 0.0f) return;  // an overflow this step: skip it (the scale shrinks)
    cpu::optimizer_update(cfg, params, grads, s0, s1, count, scaler ? 1.0f / scaler[0] : 1.0f);
  }
  void cast(Stream&, const void* src, DType from, void* dst, DType to, std::size_t count) override {
    cpu::cast(src, from, dst, to, count);
  }
  void check_finite(Stream&, const float* x, std::size_t count, float* scaler) override {
    cpu::check_finite(x, count, scaler);
  }
  void update_loss_scale(Stream&, float* scaler, int growth_interval) override {
    cpu::update_loss_scale(scaler, growth_interval);
  }

 private:
  bool emulated(const TensorDesc& x) const { return emulate_bf16_ && x.dtype == DType::bf16; }
  // oneDNN runs bf16 convolutions on native bf16 kernels here (its ISA, and a kernel it creates);
  // asked once, at construction
  bool native_bf16() const {
    const auto bits = static_cast<unsigned>(dnnl::get_effective_cpu_isa()),
               bf16_bits = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (bits & bf16_bits) == bf16_bits && bf16_capable();
  }
  bool bf16_capable() const {
    try {
      const memory::desc xd({1, 16, 8, 8}, dt::bf16, tag::nhwc), wd({16, 16, 3, 3}, dt::bf16, tag::any);
      dnnl::convolution_forward::primitive_desc pd(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, xd,
                                          wd, memory::desc({1, 16, 6, 6}, dt::bf16, tag::nhwc), {1, 1}, {0, 0}, {0, 0}),
          eng_);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }
  mutable dnnl::engine eng_;
  dnnl::stream strm_;
  CpuStream stream_;
  bool native_bf16_;   // native_bf16()
  bool emulate_bf16_;  // BackendOptions::emulate_bf16, on a CPU without native bf16
  std::mutex storage_mutex_;
  std::map<std::string, std::shared_ptr<const FilterStorage>> storages_;  // null: the plain filter
};

}  // namespace
}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend(bool emulate_bf16) { return std::make_unique<cpu::CpuBackend>(emulate_bf16); }

}  // namespace stepbench
