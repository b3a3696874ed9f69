// The abstract Backend: memory, streams and events, and every op of a CNN training step, forward
// and backward. Layers never branch on the device; they call these methods.
//
// Ops are objects planned once with the descriptors they will run on (cuDNN algorithm search,
// oneDNN primitive creation happen in make_*). Their execute methods only launch work, never
// allocate. Data pointers may change between calls; descriptors may not.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/image_decode.hpp"
#include "tensor/tensor.hpp"

namespace stepbench {

enum class DeviceKind { cpu, cuda };

class Stream {
 public:
  virtual ~Stream() = default;
  // The library's own handle (cudaStream_t on the cuda backend), for collectives that enqueue on it
  // (NCCL); nullptr on the cpu backend.
  virtual void* native_handle() { return nullptr; }
};
class Event {
 public:
  virtual ~Event() = default;
};

// Work recorded once and replayed as one launch (a CUDA Graph).
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  virtual void replay(Stream& s) = 0;
};

// ---- op descriptors ------------------------------------------------------------------------------
struct ConvParams {
  int kh = 1, kw = 1;
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;  // per dimension, so 1x7 with pad (0, 3) is expressible
  // Grouped convolution (PyTorch's groups, cuDNN's group count, oneDNN's groups): the channels in
  // and out split into `groups` equal parts, part g of the output from part g of the input only;
  // the filter is O x I/groups x KH x KW. Depthwise: groups = I = O (MobileNet-v2).
  int groups = 1;
};
Shape conv_output_shape(const Shape& x, std::int64_t cout, const ConvParams& p);

enum class PoolKind { max, avg_include_pad, avg_exclude_pad };
struct PoolParams {
  PoolKind kind = PoolKind::max;
  int kh = 3, kw = 3;
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
};
Shape pool_output_shape(const Shape& x, const PoolParams& p);  // floor mode, as PyTorch's default

// How a convolution filter is laid out in the parameter arena. Logical shape is always
// O x I x KH x KW (PyTorch's); the storage order is the backend's choice per activation layout.
enum class FilterFormat { oihw, hwio, ohwi };
constexpr auto enum_names(FilterFormat) {
  return std::array<EnumName<FilterFormat>, 3>{
      {{FilterFormat::oihw, "oihw"}, {FilterFormat::hwio, "hwio"}, {FilterFormat::ohwi, "ohwi"}}};
}

struct BatchNormParams {
  double eps = 1e-3;      // torchvision's BasicConv2d
  double momentum = 0.1;  // running = (1 - m) * running + m * batch; running_var uses unbiased var
  bool relu = true;       // fuse the ReLU that follows
};

enum class OptimizerKind { sgd, momentum, rmsprop };
constexpr auto enum_names(OptimizerKind) {
  return std::array<EnumName<OptimizerKind>, 3>{
      {{OptimizerKind::momentum, "momentum"}, {OptimizerKind::sgd, "sgd"}, {OptimizerKind::rmsprop, "rmsprop"}}};
}
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::momentum;
  float lr = 0.01f;
  float momentum = 0.9f;      // momentum SGD, and RMSProp's momentum
  float weight_decay = 0.0f;  // L2, added to the gradient (PyTorch's and TF's convention)
  float rms_decay = 0.9f;     // RMSProp
  float epsilon = 1.0f;       // RMSProp: the Inception recipe's 1.0
};

// ---- ops -----------------------------------------------------------------------------------------
// `ws` is scratch shared between ops (at least workspace_bytes()), valid only during one call.
// `reserve` is per-layer memory kept from forward to backward (reserve_bytes()).
// `beta` on a gradient output: 0 overwrites it, 1 adds to it (fan-out accumulation).

// A convolution filter kept in a backend's own format (oneDNN's blocked weights on the cpu backend),
// where the backend's convolution of one shape runs on it without a reorder per call. The arenas
// (parameters, gradients, optimizer state) hold floats() floats in it, padding included (zeros,
// which the update keeps zero); the graph converts at its edges: initialisation, weight files, a
// test reading a filter.
class FilterStorage {
 public:
  virtual ~FilterStorage() = default;
  virtual std::size_t floats() const = 0;
  virtual std::string name() const = 0;  // oneDNN's naming of the format, "ABcd16b16a"
  // From / to PyTorch's O, I, KH, KW order (host memory).
  virtual void to_storage(const float* oihw, float* dst) const = 0;
  virtual void from_storage(const float* src, float* oihw) const = 0;
};

class ConvOp {
 public:
  virtual ~ConvOp() = default;
  virtual std::size_t workspace_bytes() const = 0;
  virtual std::string algorithm() const = 0;  // what the backend picked, for reports
  virtual void forward(Stream&, const Tensor& x, const void* w, const Tensor& y, void* ws) = 0;
  virtual void backward_data(Stream&, const Tensor& dy, const void* w, const Tensor& dx, float beta, void* ws) = 0;
  virtual void backward_filter(Stream&, const Tensor& x, const Tensor& dy, void* dw, void* ws) = 0;
};

class BatchNormOp {
 public:
  virtual ~BatchNormOp() = default;
  // Scratch shared with other ops (valid during one call), and per-layer memory kept from
  // forward_training to backward (the cuda backend's fused BN+ReLU keeps its ReLU mask there).
  virtual std::size_t workspace_bytes() const { return 0; }
  virtual std::size_t reserve_bytes() const { return 0; }
  // What runs it, for reports ("cudnn spatial persistent, relu fused"); may change after the first step
  // where a library declines a configuration.
  virtual std::string implementation() const { return "stepbench kernel"; }
  // Whether forward_training takes a y without data (Tensor{nullptr, its desc}) and then makes only
  // the statistics, saved and running: a fused unit whose output is not stored (backend/fused.hpp).
  virtual bool statistics_without_output() const { return false; }
  // The scratch forward_recompute and forward_inference need (at most workspace_bytes()).
  virtual std::size_t recompute_workspace_bytes() const { return workspace_bytes(); }
  // Batch statistics; saves mean and 1/sqrt(var + eps) (C floats each) for backward and updates
  // the running statistics in place.
  virtual void forward_training(Stream&, const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                                float* running_mean, float* running_var, float* save_mean, float* save_invstd, void* ws,
                                void* reserve) = 0;
  virtual void forward_inference(Stream&, const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, void* ws) = 0;
  // forward_training's y again, from x and the mean and 1/sqrt(var + eps) it saved, for a step that
  // frees y after the forward and recomputes it in backward (GraphConfig::recompute). Bit for bit
  // the same y where the backend's training forward ran the same affine pass (the cpu backend's
  // hand-written kernels); within a rounding of it elsewhere. The running statistics are untouched.
  virtual void forward_recompute(Stream&, const Tensor& x, const Tensor& y, const float* gamma, const float* beta,
                                 const float* save_mean, const float* save_invstd, void* ws, const void* reserve) = 0;
  // y is the forward output (for the fused ReLU's mask). dgamma/dbeta are overwritten.
  virtual void backward(Stream&, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx,
                        const float* gamma, const float* beta, const float* save_mean, const float* save_invstd,
                        float* dgamma, float* dbeta, float beta_dx, void* ws, const void* reserve) = 0;
};

class PoolOp {
 public:
  virtual ~PoolOp() = default;
  virtual std::size_t reserve_bytes() const = 0;                             // max pool's argmax; may be 0
  virtual std::string implementation() const { return "stepbench kernel"; }  // for reports
  virtual void forward(Stream&, const Tensor& x, const Tensor& y, void* reserve) = 0;
  virtual void backward(Stream&, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx, float beta,
                        const void* reserve) = 0;
};

// y = min(max(x, 0), clip): the ReLU, and with clip 6 MobileNet-v2's ReLU6 (infinity: no clip).
// Backward passes dy where 0 < y < clip (PyTorch's hardtanh backward; without a clip, where y > 0).
class ReluOp {
 public:
  virtual ~ReluOp() = default;
  virtual void forward(Stream&, const Tensor& x, const Tensor& y) = 0;
  virtual void backward(Stream&, const Tensor& y, const Tensor& dy, const Tensor& dx, float beta) = 0;
};
constexpr float kNoClip = std::numeric_limits<float>::infinity();

// A convolution's bias and the ReLU after it, in place on the convolution's output (VGG's and
// AlexNet's Conv2d(bias=True) -> ReLU, no batch norm): y = relu(y + b[c]), or y + b[c] without the
// ReLU. Backward: g = dy where y > 0 (every element without the ReLU); dx = g + beta dx (dx may be dy
// itself, beta 0); db = the sum of g over n, h and w, overwritten. b and db are fp32 (C floats) in
// every precision, as batch norm's parameters; y any strides.
class BiasActOp {
 public:
  virtual ~BiasActOp() = default;
  virtual void forward(Stream&, const Tensor& y, const float* b) = 0;
  virtual void backward(Stream&, const Tensor& y, const Tensor& dy, const Tensor& dx, float beta, float* db) = 0;
};

// Adaptive average pooling to y's size (PyTorch's AdaptiveAvgPool2d): output row oh averages input
// rows [floor(oh H / OH), ceil((oh + 1) H / OH)), columns likewise, so windows overlap or repeat
// where the output is larger than the input. Backward adds dy / window size to every input of the
// window: dx = that + beta dx. Any strides.
class AdaptiveAvgPoolOp {
 public:
  virtual ~AdaptiveAvgPoolOp() = default;
  virtual void forward(Stream&, const Tensor& x, const Tensor& y) = 0;
  virtual void backward(Stream&, const Tensor& dy, const Tensor& dx, float beta) = 0;
};

// A residual connection's sum and the ReLU after it, fused (ResNet's `relu(out + identity)`):
// y = max(a + b, 0). Backward sends g = dy where y > 0 (else 0) to both inputs: da = g + beta_a da
// and db = g + beta_b db; an input whose tensor has no data (Tensor{}) gets nothing. a, b and y
// (and dy, da, db) share one shape and layout; any strides.
class AddReluOp {
 public:
  virtual ~AddReluOp() = default;
  virtual std::string implementation() const { return "stepbench kernel"; }  // for reports
  virtual void forward(Stream&, const Tensor& a, const Tensor& b, const Tensor& y) = 0;
  virtual void backward(Stream&, const Tensor& y, const Tensor& dy, const Tensor& da, float beta_a, const Tensor& db,
                        float beta_b) = 0;
};

// Fully connected: x is N x K (an N x K x 1 x 1 tensor), w is M x K row-major (PyTorch's Linear),
// b has M entries, y is N x M.
class LinearOp {
 public:
  virtual ~LinearOp() = default;
  virtual std::size_t workspace_bytes() const = 0;
  virtual std::string implementation() const { return ""; }  // what runs it, for reports ("" : not said)
  virtual void forward(Stream&, const Tensor& x, const void* w, const void* b, const Tensor& y, void* ws) = 0;
  virtual void backward_data(Stream&, const Tensor& dy, const void* w, const Tensor& dx, float beta, void* ws) = 0;
  virtual void backward_weights(Stream&, const Tensor& x, const Tensor& dy, void* dw, void* db, void* ws) = 0;
};

// Inverted dropout (scale kept elements by 1 / (1 - p)), training mode only. The mask comes from a
// counter-based hash of (seed, step, element), so it is reproducible and independent of threads.
class DropoutOp {
 public:
  virtual ~DropoutOp() = default;
  virtual std::size_t reserve_bytes() const = 0;  // the mask
  virtual void forward(Stream&, const Tensor& x, const Tensor& y, void* reserve, std::uint64_t seed,
                       std::uint64_t step) = 0;
  virtual void backward(Stream&, const Tensor& dy, const Tensor& dx, float beta, const void* reserve) = 0;
};

// Softmax cross-entropy, mean over the batch. logits: N x M. labels: N int32 in [0, M) in device
// memory. forward writes the mean loss to *loss (device memory) and keeps the probabilities.
// backward writes dlogits = scale * (softmax - onehot) / N, times *loss_scale (device memory) when
// that is given (dynamic loss scaling).
class SoftmaxCrossEntropyOp {
 public:
  virtual ~SoftmaxCrossEntropyOp() = default;
  virtual std::size_t reserve_bytes() const = 0;
  virtual void forward(Stream&, const Tensor& logits, const std::int32_t* labels, float* loss, void* reserve) = 0;
  virtual void backward(Stream&, const std::int32_t* labels, const Tensor& dlogits, float scale, float beta,
                        const void* reserve, const float* loss_scale) = 0;
  // Called once the stream of the last forward has been synchronised: throws UsageError when a label
  // of that forward was outside [0, classes). The cpu op throws in forward already; the cuda op's
  // kernel flags it on the device (no synchronisation in the step, and under CUDA Graph replay too).
  virtual void check_labels() {}
};

// Dynamic loss scaling (fp16, as PyTorch's GradScaler), kept in device memory so that no step waits
// for the host: [0] the scale, [1] found_inf (0 or 1), [2] good steps since the scale last changed.
struct LossScaler {
  static constexpr float kInitialScale = 65536.0f;  // 2^16
  static constexpr int kGrowthInterval = 2000;      // steps without overflow before the scale doubles
  static constexpr std::size_t kFloats = 3;
};

struct FusedConvSpec;  // the fused convolution + batch-norm unit's pieces (backend/fused.hpp)
struct BnUnitSpec;
class FusedConvOp;
class BnUnitOp;
class BnAddReluOp;
// ---- the backend ---------------------------------------------------------------------------------
// The device's state at one moment (NVML on a GPU): clocks, temperature, power, and why the clocks
// are held down. A gate marks a repetition whose GPU was throttled instead of calling it a regression.
struct DeviceState {
  double sm_clock_mhz = 0, mem_clock_mhz = 0, temperature_c = 0, power_w = 0;
  unsigned long long throttle_reasons = 0;  // NVML's clocks-throttle-reason bits
  bool throttled = false;                   // a power cap, thermal or hardware slowdown was active
  std::string throttle_text;                // e.g. "sw_power_cap, hw_thermal"; "" when none
};

// One piece of work the device ran, from the backend's activity records (CUPTI on cuda): a kernel,
// a copy or a set, its start and end on the device, and the tag the launching thread had pushed.
struct DeviceActivity {
  std::string name;                        // the kernel's name (demangled), "memcpy HtoD", "memset"
  std::uint64_t start_ns = 0, end_ns = 0;  // on the activity clock (activity_clock_ns)
  std::uint64_t tag = 0;                   // the innermost push_activity_tag of the launching thread; 0: none
  std::uint32_t stream = 0;                // the stream's id on the device
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;                             // "cpu", "cuda"
  virtual std::string device_name() const = 0;                      // "AMD EPYC (2 threads)", "NVIDIA H100 80GB HBM3"
  virtual std::map<std::string, std::string> versions() const = 0;  // library versions, for reports
  // Throws UnsupportedError with the reason when this backend cannot run `t` here.
  virtual void require(DType t) const = 0;
  virtual FilterFormat filter_format(Layout l) const = 0;
  // The CUDA device ordinal; -1 on the cpu backend.
  virtual int device() const { return -1; }
  // The device's clocks, temperature, power and throttling now; nullopt where nothing can tell (the
  // cpu backend, a GPU machine without NVML).
  virtual std::optional<DeviceState> device_state() const { return std::nullopt; }
  // Allow TF32 tensor-op math for fp32 convolutions and GEMMs (--precision tf32); a no-op where it
  // means nothing. Call before making ops.
  virtual void set_tensor_math(bool allow_tf32) { tensor_math_ = allow_tf32; }
  bool tensor_math() const { return tensor_math_; }
  // The most scratch memory one convolution's algorithm may use (--workspace-mb): cudnnFind* only
  // considers algorithms that fit. A no-op where it means nothing. Call before making ops.
  virtual void set_workspace_limit(std::size_t bytes) { (void)bytes; }
  // Ops made while this is on only size memory (Graph::plan_dry, the largest batch that fits) and are
  // never run: the cuda backend then skips cudnnFind's timed search (a minute or more per graph at
  // the batches that search probes) and counts each convolution's workspace at the limit above,
  // the most a searched algorithm may take; the cpu backend keeps every filter plain (no search).
  void set_sizing_only(bool on) { sizing_only_ = on; }
  bool sizing_only() const { return sizing_only_; }
  // Tests only (backend/fused.hpp): the composed fused pieces made from now on keep checked canaries.
  void set_fused_canaries(bool on) { fused_canaries_ = on; }
  bool fused_canaries() const { return fused_canaries_; }

  // memory
  virtual void* allocate(std::size_t bytes) = 0;  // device memory (host memory on the CPU backend)
  virtual void deallocate(void* p) = 0;
  virtual void* allocate_host(std::size_t bytes) = 0;  // pinned where that means something
  virtual void deallocate_host(void* p) = 0;
  // Whether `p` is page-locked host memory the device can DMA from (false on the cpu backend).
  virtual bool is_pinned(const void* p) const {
    (void)p;
    return false;
  }
  // Bytes that can still be allocated (free device memory; MemAvailable on the CPU), and in all.
  virtual std::size_t memory_available() const = 0;
  virtual std::size_t memory_total() const { return memory_available(); }
  // What planning may use: memory_available(), at most the limit (--device-memory-mb: size a run
  // for a smaller device; 0: none) and a 1/share of the whole when `share` processes plan on it.
  void set_memory_limit(std::size_t bytes, int share = 1) { memory_limit_ = bytes, share_ = std::max(share, 1); }
  std::size_t memory_limit() const { return memory_limit_; }
  std::size_t memory_budget() const {
    const std::size_t a = share_ > 1 ? std::min(memory_available(), memory_total() / static_cast<std::size_t>(share_))
                                     : memory_available();
    return memory_limit_ ? std::min(a, memory_limit_) : a;
  }

  // streams and events; on the CPU backend work runs synchronously and events hold host times
  virtual Stream& default_stream() = 0;
  virtual std::unique_ptr<Stream> create_stream() = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  // An event only waited on, never timed (elapsed_ms refuses it on cuda): cheaper to record.
  virtual std::unique_ptr<Event> create_sync_event() { return create_event(); }
  virtual void record(Event& e, Stream& s) = 0;
  virtual void wait(Stream& s, Event& e) = 0;  // s waits for e
  virtual void synchronize(Stream& s) = 0;
  // Whether everything launched on `s` has finished, without waiting (polling loops that must be
  // able to give up: a hung collective). Always true on the cpu backend.
  virtual bool query(Stream& /*s*/) { return true; }
  // Holds `s` for `ms` as if it computed (--slow-tower): here, the host waits for `s` and sleeps (the
  // cpu backend runs its work as it is launched); cuda enqueues a host function that sleeps.
  virtual void delay(Stream& s, double ms);
  virtual double elapsed_ms(Event& start, Event& stop) = 0;

  // Capture (--cuda-graph): the work launched on `s`, and on streams that joined it through events,
  // between begin_capture and end_capture is recorded instead of run. Nothing in between may
  // allocate or synchronise. UnsupportedError where the backend cannot capture (the cpu backend).
  virtual void begin_capture(Stream& s);
  virtual std::unique_ptr<CapturedWork> end_capture(Stream& s);

  // Device activity records (--trace, --layer-times on cuda: CUPTI): after start_activity, every
  // kernel, copy and set this device runs is recorded with its device times and the innermost tag
  // the launching thread has pushed (tags are per thread; work launched with none has tag 0).
  // take_activity, after a synchronisation, returns this device's records since the last take.
  // activity_unavailable: "" where it works, else why not (no CUPTI library, a profiler holding it,
  // the cpu backend); start_activity throws UnsupportedError with that reason.
  virtual std::string activity_unavailable() const {
    return "the " + name() + " backend has no device activity records (kernel names need --backend cuda)";
  }
  virtual void start_activity();
  virtual void push_activity_tag(std::uint64_t tag) { (void)tag; }
  virtual void pop_activity_tag() {}
  virtual std::uint64_t activity_clock_ns() const { return 0; }  // the records' clock now
  virtual std::vector<DeviceActivity> take_activity() { return {}; }
  virtual void stop_activity() {}
  // --decode gpu: UnsupportedError (saying what to change) where the backend cannot decode images.
  virtual std::unique_ptr<ImageDecodeOp> make_image_decoder(const ImageDecodeParams& p);

  // copies (host<->device and device<->device) and simple fills, ordered on `s`
  virtual void copy(Stream& s, void* dst, const void* src, std::size_t bytes) = 0;
  virtual void memset_zero(Stream& s, void* dst, std::size_t bytes) = 0;
  virtual void fill(Stream& s, float* dst, float value, std::size_t count) = 0;

  // ops
  virtual std::unique_ptr<ConvOp> make_conv(const TensorDesc& x, const TensorDesc& y, const ConvParams& p) = 0;
  // The filter storage this backend's convolution of these shapes is fastest on, where that is not
  // filter_format(x.layout); null where it is (the default). make_conv_stored makes the convolution
  // that takes its filter, and writes its filter gradient, in that storage.
  virtual std::shared_ptr<const FilterStorage> conv_filter_storage(const TensorDesc& x, const TensorDesc& y,
                                                                   const ConvParams& p) {
    (void)x, (void)y, (void)p;
    return nullptr;
  }
  virtual std::unique_ptr<ConvOp> make_conv_stored(const TensorDesc& x, const TensorDesc& y, const ConvParams& p,
                                                   const FilterStorage& w);
  virtual std::unique_ptr<BatchNormOp> make_batch_norm(const TensorDesc& x, const TensorDesc& y,
                                                       const BatchNormParams& p) = 0;
  virtual std::unique_ptr<PoolOp> make_pool(const TensorDesc& x, const TensorDesc& y, const PoolParams& p) = 0;
  // clip: ReluOp's (kNoClip: the plain ReLU)
  virtual std::unique_ptr<ReluOp> make_relu(const TensorDesc& x, const TensorDesc& y, float clip) = 0;
  virtual std::unique_ptr<BiasActOp> make_bias_act(const TensorDesc& y, bool relu) = 0;
  virtual std::unique_ptr<AdaptiveAvgPoolOp> make_adaptive_avg_pool(const TensorDesc& x, const TensorDesc& y) = 0;
  virtual std::unique_ptr<AddReluOp> make_add_relu(const TensorDesc& y) = 0;
  // The fused unit's pieces (backend/fused.hpp): by default composed of this backend's ops (fused.cpp).
  // w: the filter's storage where conv_filter_storage gave one; a, b: the units of normalised inputs.
  virtual std::unique_ptr<FusedConvOp> make_fused_conv(const TensorDesc& x, const TensorDesc& z,
                                                       const FusedConvSpec& spec, const FilterStorage* w);
  virtual std::unique_ptr<BnUnitOp> make_bn_unit(const TensorDesc& z, const TensorDesc& y, const BnUnitSpec& spec);
  virtual std::unique_ptr<BnAddReluOp> make_bn_add_relu(const TensorDesc& y, BnUnitOp* a, BnUnitOp* b);
  virtual std::unique_ptr<LinearOp> make_linear(const TensorDesc& x, const TensorDesc& y) = 0;
  virtual std::unique_ptr<DropoutOp> make_dropout(const TensorDesc& x, double p) = 0;
  virtual std::unique_ptr<SoftmaxCrossEntropyOp> make_softmax_cross_entropy(const TensorDesc& logits) = 0;

  // elementwise over tensors of one shape (any strides): dst = src + beta * dst
  virtual void add(Stream& s, const Tensor& src, const Tensor& dst, float beta) = 0;
  // x *= alpha over a flat float buffer (gradient averaging)
  virtual void scale(Stream& s, float* x, float alpha, std::size_t count) = 0;
  // One update over a whole flat parameter arena. state0/state1: optimizer state of the same size
  // (momentum buffer; RMSProp's mean square and momentum), unused ones may be null. With a loss
  // scaler (device memory, LossScaler's layout) the gradients are divided by its scale, and nothing
  // changes when its found_inf is set.
  virtual void optimizer_update(Stream& s, const OptimizerConfig& cfg, float* params, const float* grads, float* state0,
                                float* state1, std::size_t count, const float* scaler) = 0;

  // Mixed precision: `count` elements converted from `from` to `to` (f32, bf16, f16; round to
  // nearest even), device memory.
  virtual void cast(Stream& s, const void* src, DType from, void* dst, DType to, std::size_t count) = 0;
  // Sets scaler[1] (found_inf) when any of x[0, count) is not finite; never clears it.
  virtual void check_finite(Stream& s, const float* x, std::size_t count, float* scaler) = 0;
  // After the update: found_inf halves the scale and restarts the count; otherwise a good step is
  // counted and the scale doubles after `growth_interval` of them. Clears found_inf.
  virtual void update_loss_scale(Stream& s, float* scaler, int growth_interval) = 0;

 protected:
  bool tensor_math_ = false;
  std::size_t memory_limit_ = 0;
  int share_ = 1;  // processes planning on this device at once
  bool sizing_only_ = false;
  bool fused_canaries_ = false;
};

}  // namespace stepbench

#include "backend/buffer.hpp"  // Buffer, HostBuffer: backend memory owned (after Backend, which they use)
