// The CUDA backend: convolutions on cuDNN (cudnnFind* at planning time within a workspace budget),
// batch norm (ReLU fused where cuDNN can) and pooling on cuDNN, the fully connected layer on
// cuBLAS, and stepbench's own kernels (kernels_*.cu) for ReLU, accumulation, dropout, the loss and
// the optimizer update, and for batch norm and pooling where cuDNN declines a layout.
// fp32, bf16 or fp16 storage (fp32 accumulation everywhere); TF32 tensor-op math on request
// (set_tensor_math). Every tensor may be a strided view (a concat slice): cuDNN gets strided
// descriptors, the kernels take strides.
//
// This file holds the Backend itself (device, memory, streams, events, CUDA Graphs, the
// whole-arena passes); each op is in its own file (conv.cpp, batch_norm.cpp, ...), made through the
// factories in common.hpp. The op and model tests run it against the oracle wherever a GPU is
// visible.
#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "backend/cuda/common.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cupti.hpp"
#include "backend/cuda/nvml.hpp"

namespace stepbench {

int cuda_device_count_impl() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::string cuda_unavailable_reason_impl() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) return fmt::format("no GPU visible ({}: {})", cudaGetErrorName(err), cudaGetErrorString(err));
  if (n == 0) return "no GPU visible (0 CUDA devices)";
  return "";
}

namespace cuda {
namespace {

struct CudaEvent final : Event {
  EventHandle e;
  bool timing;
  CudaEvent(int device, bool timed) : timing(timed) {
    SB_CUDA(cudaSetDevice(device));
    cudaEvent_t h = nullptr;
    SB_CUDA(cudaEventCreateWithFlags(&h, timed ? cudaEventDefault : cudaEventDisableTiming));
    e = EventHandle(h);
  }
};

// A captured CUDA Graph, instantiated once and replayed each step.
struct CudaGraphWork final : CapturedWork {
  GraphHandle graph;
  GraphExecHandle exec;  // destroyed before the graph
  int device;
  CudaGraphWork(GraphHandle g, int dev) : graph(std::move(g)), device(dev) {
    SB_CUDA(cudaSetDevice(device));
    cudaGraphExec_t h = nullptr;
    SB_CUDA(cudaGraphInstantiate(&h, graph.get(), 0));
    exec = GraphExecHandle(h);
  }
  void replay(Stream& s) override {
    SB_CUDA(cudaSetDevice(device));
    SB_CUDA(cudaGraphLaunch(exec.get(), S(s)));
  }
};

class CudaBackend final : public Backend {
 public:
  ~CudaBackend() override { stop_activity(); }
  CudaBackend(int device, bool own_kernels, std::shared_ptr<ConvPlanCache> plans)
      : dev_(device),
        stream_(device),
        own_norm_pool_(own_kernels),
        plans_(plans ? std::move(plans) : std::make_shared<ConvPlanCache>()) {
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cudaGetDeviceProperties(&prop_, dev_));
    cudnnHandle_t dnn = nullptr;
    SB_CUDNN(cudnnCreate(&dnn));
    cudnn_ = CudnnHandle(dnn);
    cublasHandle_t blas = nullptr;
    SB_CUBLAS(cublasCreate(&blas));
    cublas_ = CublasHandle(blas);
    blas_.handle = blas;
    SB_CUBLAS(cublasSetMathMode(cublas_.get(), CUBLAS_DEFAULT_MATH));
    std::array<char, 32> bus{};  // "0000:3B:00.0", the name NVML knows the GPU by
    if (cudaDeviceGetPCIBusId(bus.data(), static_cast<int>(bus.size()), dev_) == cudaSuccess)
      pci_bus_id_ = bus.data();
    else
      cudaGetLastError();
    // a plan's machine key: what decides cudnnFind's choice besides the convolution itself
    int drv = 0;
    cudaDriverGetVersion(&drv);
    const auto fp = nvml_.fingerprint(pci_bus_id_);
    const auto nv = fp.find("nvml_driver");  // "570.86.15"; CUDA says only "12080"
    machine_ =
        fmt::format("{} cc{}.{} {} SMs, driver {}, cuDNN {}", prop_.name, prop_.major, prop_.minor,
                    prop_.multiProcessorCount, nv != fp.end() ? nv->second : std::to_string(drv), cudnnGetVersion());
  }

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string name() const override { return "cuda"; }
  std::string device_name() const override { return fmt::format("{} (GPU {})", prop_.name, dev_); }
  std::map<std::string, std::string> versions() const override {
    int rt = 0, drv = 0, cublas = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    cublasGetVersion(cublas_.get(), &cublas);
    const std::size_t cudnn = cudnnGetVersion();
    int nccl = 0;
    ncclGetVersion(&nccl);  // the library loaded, which may differ from the headers built against
    auto v = [](int x) { return fmt::format("{}.{}", x / 1000, (x % 1000) / 10); };
    std::map<std::string, std::string> out{
        {"cuda_runtime", v(rt)},
        {"cuda_driver", v(drv)},
        {"cudnn", fmt::format("{}.{}.{}", cudnn / 10000, (cudnn % 10000) / 100, cudnn % 100)},
        {"cublas", std::to_string(cublas)},
        {"nccl", fmt::format("{}.{}.{}", nccl / 10000, (nccl % 10000) / 100, nccl % 100)},
        {"cudnn_built_against", fmt::format("{}.{}.{}", CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL)},
        {"compute_capability", fmt::format("{}.{}", prop_.major, prop_.minor)},
        {"tf32", tf32_ ? "on" : "off"}};
    out["gpu_count"] = std::to_string(cuda_device_count_impl());
    out["pci_bus_id"] = pci_bus_id_;  // where the straggler report says this GPU is
    const auto* u = reinterpret_cast<const unsigned char*>(prop_.uuid.bytes);
    out["gpu_uuid"] = fmt::format(
        "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    // the driver, power limit and clocks NVML reports for this GPU (none without NVML)
    for (const auto& [key, value] : nvml_.fingerprint(pci_bus_id_)) out[key] = value;
    // the convolution plans of this process (shared by its towers): searched now, or reused
    out["cudnn_plans_searched"] = std::to_string(plans_->searched());
    out["cudnn_plans_reused"] = std::to_string(plans_->reused());
    out["cudnn_plan_cache"] =
        plans_->path().empty() ? "this run only" : fmt::format("{} ({} plans read)", plans_->path(), plans_->loaded());
    out["cudnn_fallbacks"] = notes_.summary();
    return out;
  }
  std::optional<DeviceState> device_state() const override { return nvml_.state(pci_bus_id_); }
  void require(DType t) const override {
    const int cc = prop_.major * 10 + prop_.minor;
    if (t == DType::bf16 && cc < 80)
      throw UnsupportedError(
          fmt::format("--precision bf16 needs compute capability 8.0 or later (Ampere); {} has {}.{}. "
                      "Use --precision fp16 or fp32",
                      device_name(), prop_.major, prop_.minor));
    if (t == DType::f16 && cc < 70)
      throw UnsupportedError(
          fmt::format("--precision fp16 needs tensor cores (compute capability 7.0 or later); {} "
                      "has {}.{}. Use --precision fp32",
                      device_name(), prop_.major, prop_.minor));
  }
  void set_tensor_math(bool allow_tf32) override {
    tf32_ = allow_tf32;
    tensor_math_ = allow_tf32;
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUBLAS(cublasSetMathMode(cublas_.get(), tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  }
  FilterFormat filter_format(Layout l) const override {
    return l == Layout::nhwc ? FilterFormat::ohwi : FilterFormat::oihw;
  }
  int device() const override { return dev_; }
  void set_workspace_limit(std::size_t bytes) override { budget_ = bytes; }

  void* allocate(std::size_t bytes) override {
    SB_CUDA(cudaSetDevice(dev_));
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<std::size_t>(bytes, 1));
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      throw UsageError(
          fmt::format("out of GPU memory on {}: {:.1f} MiB requested, {:.1f} MiB free; use a smaller "
                      "--batch-size",
                      device_name(), static_cast<double>(bytes) / (1 << 20), static_cast<double>(free) / (1 << 20)));
    }
    return p;
  }
  void deallocate(void* p) override { cudaFree(p); }
  void* allocate_host(std::size_t bytes) override {
    void* p = nullptr;
    SB_CUDA(cudaMallocHost(&p, std::max<std::size_t>(bytes, 1)));
    return p;
  }
  void deallocate_host(void* p) override { cudaFreeHost(p); }
  bool is_pinned(const void* p) const override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeHost;
  }
  std::size_t memory_available() const override {
    cudaSetDevice(dev_);
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    return free;
  }
  std::size_t memory_total() const override {
    cudaSetDevice(dev_);
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    return total;
  }

  Stream& default_stream() override { return stream_; }
  std::unique_ptr<Stream> create_stream() override { return std::make_unique<CudaStream>(dev_); }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CudaEvent>(dev_, true); }
  std::unique_ptr<Event> create_sync_event() override { return std::make_unique<CudaEvent>(dev_, false); }
  void record(Event& e, Stream& s) override { SB_CUDA(cudaEventRecord(static_cast<CudaEvent&>(e).e.get(), S(s))); }
  void wait(Stream& s, Event& e) override { SB_CUDA(cudaStreamWaitEvent(S(s), static_cast<CudaEvent&>(e).e.get(), 0)); }
  // A host function on the stream holds it (and what waits on it) for `ms`; a CUDA Graph captures it
  // as a host node. The milliseconds live in the backend, one slot per value asked for.
  void delay(Stream& s, double ms) override {
    if (ms <= 0) return;
    auto& slot = delays_[ms];
    slot = ms;
    SB_CUDA(cudaLaunchHostFunc(
        S(s),
        [](void* p) {
          std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(*static_cast<double*>(p)));
        },
        &slot));
  }
  void synchronize(Stream& s) override { SB_CUDA(cudaStreamSynchronize(S(s))); }
  bool query(Stream& s) override {
    const cudaError_t e = cudaStreamQuery(S(s));
    if (e == cudaErrorNotReady) return false;
    SB_CUDA(e);
    return true;
  }
  double elapsed_ms(Event& a, Event& b) override {
    SB_CHECK(static_cast<CudaEvent&>(a).timing && static_cast<CudaEvent&>(b).timing,
             "elapsed_ms between events made by create_sync_event (no timing)");
    float ms = 0;
    SB_CUDA(cudaEventElapsedTime(&ms, static_cast<CudaEvent&>(a).e.get(), static_cast<CudaEvent&>(b).e.get()));
    return ms;
  }

  void begin_capture(Stream& s) override {
    SB_CUDA(cudaSetDevice(dev_));
    // thread-local: the input pipeline's threads may make CUDA calls meanwhile
    SB_CUDA(cudaStreamBeginCapture(S(s), cudaStreamCaptureModeThreadLocal));
  }
  std::unique_ptr<CapturedWork> end_capture(Stream& s) override {
    SB_CUDA(cudaSetDevice(dev_));
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(S(s), &g);
    GraphHandle graph(g);
    if (e != cudaSuccess || !g) {
      cudaGetLastError();
      throw Error(
          fmt::format("CUDA Graph capture failed ({}): something in the captured work allocated, "
                      "synchronised or ran on an unjoined stream",
                      cudaGetErrorString(e)));
    }
    return std::make_unique<CudaGraphWork>(std::move(graph), dev_);
  }

  std::unique_ptr<ImageDecodeOp> make_image_decoder(const ImageDecodeParams& p) override {
    return make_cuda_image_decoder(dev_, p);
  }
  std::string activity_unavailable() const override { return cupti_unavailable(); }
  void start_activity() override {
    SB_CHECK(!activity_on_, "start_activity twice");
    cupti_start();
    activity_on_ = true;
  }
  void push_activity_tag(std::uint64_t tag) override {
    if (activity_on_) cupti_push(tag);
  }
  void pop_activity_tag() override {
    if (activity_on_) cupti_pop();
  }
  std::uint64_t activity_clock_ns() const override { return cupti_now_ns(); }
  std::vector<DeviceActivity> take_activity() override {
    return activity_on_ ? cupti_take(dev_) : std::vector<DeviceActivity>{};
  }
  void stop_activity() override {
    if (activity_on_) cupti_stop();
    activity_on_ = false;
  }

  void copy(Stream& s, void* dst, const void* src, std::size_t bytes) override {
    if (bytes) SB_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, S(s)));
  }
  void memset_zero(Stream& s, void* dst, std::size_t bytes) override {
    if (bytes) SB_CUDA(cudaMemsetAsync(dst, 0, bytes, S(s)));
  }
  void fill(Stream& s, float* dst, float v, std::size_t n) override {
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cuda::launch_fill(dst, v, n, S(s)));
  }

  std::unique_ptr<ConvOp> make_conv(const TensorDesc& x, const TensorDesc& y, const ConvParams& p) override {
    return make_cuda_conv(ctx(), x, y, p);
  }
  std::unique_ptr<BatchNormOp> make_batch_norm(const TensorDesc& x, const TensorDesc& y,
                                               const BatchNormParams& p) override {
    return make_cuda_batch_norm(ctx(), x, y, p);
  }
  std::unique_ptr<PoolOp> make_pool(const TensorDesc& x, const TensorDesc& y, const PoolParams& p) override {
    return make_cuda_pool(ctx(), x, y, p);
  }
  std::unique_ptr<ReluOp> make_relu(const TensorDesc&, const TensorDesc&, float clip) override {
    return make_cuda_relu(ctx(), clip);
  }
  std::unique_ptr<BiasActOp> make_bias_act(const TensorDesc&, bool relu) override {
    return make_cuda_bias_act(ctx(), relu);
  }
  std::unique_ptr<AdaptiveAvgPoolOp> make_adaptive_avg_pool(const TensorDesc&, const TensorDesc&) override {
    return make_cuda_adaptive_avg_pool(ctx());
  }
  std::unique_ptr<AddReluOp> make_add_relu(const TensorDesc&) override { return make_cuda_add_relu(ctx()); }
  std::unique_ptr<LinearOp> make_linear(const TensorDesc& x, const TensorDesc& y) override {
    blas_.reserve(dev_);
    return make_cuda_linear(ctx(), x, y);
  }
  std::unique_ptr<DropoutOp> make_dropout(const TensorDesc& x, double p) override {
    return make_cuda_dropout(ctx(), x, p);
  }
  std::unique_ptr<SoftmaxCrossEntropyOp> make_softmax_cross_entropy(const TensorDesc& logits) override {
    return make_cuda_softmax_cross_entropy(ctx(), logits);
  }

  void add(Stream& s, const Tensor& src, const Tensor& dst, float beta) override {
    SB_CHECK(src.shape() == dst.shape(), "add: shapes differ");
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cuda::launch_add(view(src), view(dst), beta, S(s)));
  }
  void scale(Stream& s, float* x, float alpha, std::size_t n) override {
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cuda::launch_scale(x, alpha, n, S(s)));
  }
  void optimizer_update(Stream& s, const OptimizerConfig& cfg, float* params, const float* grads, float* s0, float* s1,
                        std::size_t n, const float* scaler) override {
    const cuda::OptArgs a{cfg.kind == OptimizerKind::sgd        ? 0
                          : cfg.kind == OptimizerKind::momentum ? 1
                                                                : 2,
                          cfg.lr,
                          cfg.weight_decay,
                          cfg.momentum,
                          cfg.rms_decay,
                          cfg.epsilon};
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cuda::launch_optimizer_update(a, params, grads, s0, s1, n, scaler, S(s)));
  }
  void cast(Stream& s, const void* src, DType from, void* dst, DType to, std::size_t n) override {
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cuda::launch_cast(flat(src, from), flat(dst, to), n, S(s)));
  }
  void check_finite(Stream& s, const float* x, std::size_t n, float* scaler) override {
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cuda::launch_check_finite(x, n, scaler, S(s)));
  }
  void update_loss_scale(Stream& s, float* scaler, int growth_interval) override {
    SB_CUDA(cudaSetDevice(dev_));
    SB_CUDA(cuda::launch_update_loss_scale(scaler, growth_interval, S(s)));
  }

 private:
  Ctx ctx() {
    return Ctx{dev_,           cudnn_.get(), &blas_,       tf32_,    budget_,
               own_norm_pool_, &notes_,      plans_.get(), machine_, sizing_only()};
  }
  int dev_;
  cudaDeviceProp prop_{};
  CudaStream stream_;
  CudnnHandle cudnn_;
  CublasBinding blas_;  // cublas_'s stream and workspace (declared first: freed after cublasDestroy)
  CublasHandle cublas_;
  bool tf32_ = false;
  std::size_t budget_ = std::size_t{512} << 20;  // cuDNN workspace budget (--workspace-mb)
  bool own_norm_pool_ = false;                   // CudaBackendOptions::own_kernels
  FallbackNotes notes_;                          // the "cuDNN declined" lines said so far
  std::string pci_bus_id_;                       // "" where CUDA does not say
  std::map<double, double> delays_;              // delay(): the milliseconds its host functions read
  mutable Nvml nvml_;                            // loaded on first use; answers nothing without a driver
  std::shared_ptr<ConvPlanCache> plans_;         // CudaBackendOptions::plans, or this backend's own
  std::string machine_;                          // Ctx::machine
  bool activity_on_ = false;                     // start_activity without its stop_activity yet
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& o) {
  const int n = cuda_device_count_impl();
  if (o.device < 0 || o.device >= n) throw UsageError(fmt::format("GPU {} requested but {} visible", o.device, n));
  return std::make_unique<cuda::CudaBackend>(o.device, o.own_kernels, o.plans);
}

}  // namespace stepbench
