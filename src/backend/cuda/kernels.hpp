// stepbench's own CUDA kernels over 4-D tensors with any strides (channel slices of a concat buffer
// included), in fp32, bf16 or fp16 storage with fp32 arithmetic; the formulas mirror
// src/backend/cpu/cpu_kernels.cpp so both backends compute the same thing (the op tests compare
// both with the oracle). Host-side launchers, one kernels_<op>.cu per group below; only
// src/backend/cuda includes this.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace stepbench::cuda {

// Element types of the storage: 0 fp32, 1 bf16, 2 fp16 (arithmetic is fp32 throughout).
enum Elem : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// A 4-D view: logical N, C, H, W and element strides.
struct View {
  void* p;
  long long n, c, h, w;
  long long sn, sc, sh, sw;
  int t;  // Elem
};
// A dense array of one element type.
struct Flat {
  void* p;
  int t;  // Elem
};

struct PoolArgs {
  int kh, kw, sh, sw, ph, pw;
  int kind;  // 0 max, 1 avg include pad, 2 avg exclude pad
};

struct OptArgs {
  int kind;  // 0 sgd, 1 momentum, 2 rmsprop
  float lr, wd, mu, rho, eps;
};

cudaError_t launch_fill(float* x, float v, std::size_t n, cudaStream_t s);
cudaError_t launch_scale(float* x, float alpha, std::size_t n, cudaStream_t s);
// dst = src + beta * dst (beta 0: dst is not read)
cudaError_t launch_add(View src, View dst, float beta, cudaStream_t s);
cudaError_t launch_relu_forward(View x, View y, cudaStream_t s);
cudaError_t launch_relu_backward(View y, View dy, View dx, float beta, cudaStream_t s);
// kernels_bias_act.cu: a convolution's bias and ReLU (in place forward; db[c] overwritten), the
// clipped ReLU (ReLU6), adaptive average pooling to y's size
cudaError_t launch_bias_act_forward(View y, const float* b, bool relu, cudaStream_t s);
cudaError_t launch_bias_act_backward(View y, View dy, View dx, float beta, float* db, bool relu, cudaStream_t s);
cudaError_t launch_relu_clip_forward(View x, View y, float clip, cudaStream_t s);
cudaError_t launch_relu_clip_backward(View y, View dy, View dx, float beta, float clip, cudaStream_t s);
cudaError_t launch_adaptive_avg_pool_forward(View x, View y, cudaStream_t s);
cudaError_t launch_adaptive_avg_pool_backward(View dy, View dx, float beta, cudaStream_t s);
// The residual add + ReLU: y = max(a + b, 0); backward g = dy where y > 0 (else 0),
// da = g + beta_a * da and db = g + beta_b * db in one pass
cudaError_t launch_add_relu_forward(View a, View b, View y, cudaStream_t s);
cudaError_t launch_add_relu_backward(View y, View dy, View da, float beta_a, View db, float beta_b, cudaStream_t s);

// Batch norm over (N, H, W) per channel, deterministic. Where x, y (and dy, dx) are rows in one order
// (dense tensors and channel slices: kernels_rows.cuh) the statistics are multi-block reductions,
// coalesced (channels-last: threads along channels; NCHW: along each plane), into per-chunk partial
// sums in double in `scratch` (bn_scratch_bytes), summed per channel in a fixed order, then one
// vectorised pass applies them. Other views: one block per channel, two-pass statistics in double.
std::size_t bn_scratch_bytes(long long n, long long c, long long h, long long w);
cudaError_t launch_bn_forward_training(View x, View y, const float* gamma, const float* beta, float* running_mean,
                                       float* running_var, float* save_mean, float* save_invstd, double eps,
                                       double momentum, bool relu, void* scratch, cudaStream_t s);
cudaError_t launch_bn_forward_inference(View x, View y, const float* gamma, const float* beta, const float* rmean,
                                        const float* rvar, double eps, bool relu, cudaStream_t s);
// forward_training's y again from its saved mean and 1/sqrt(var + eps) (BatchNormOp::forward_recompute):
// the factors into `scratch` (C float4), then the apply pass of the row path, else a generic kernel.
cudaError_t launch_bn_forward_recompute(View x, View y, const float* gamma, const float* beta, const float* save_mean,
                                        const float* save_invstd, bool relu, void* scratch, cudaStream_t s);
cudaError_t launch_bn_backward(View x, View y, View dy, View dx, const float* gamma, const float* save_mean,
                               const float* save_invstd, float* dgamma, float* dbeta, float beta_dx, bool relu,
                               void* scratch, cudaStream_t s);

// Pooling; argmax (max pool) holds, per output in logical NCHW order, the input position h * W + w.
// It may be null: the forward then does not record it and the backward finds it again in x.
cudaError_t launch_pool_forward(View x, View y, PoolArgs p, std::int32_t* argmax, cudaStream_t s);
cudaError_t launch_pool_backward(View x, View dy, View dx, PoolArgs p, float beta, const std::int32_t* argmax,
                                 cudaStream_t s);

// y[n, m] += b[m] over a dense N x M; db[m] = sum_n dy[n, m]
cudaError_t launch_add_bias(Flat y, Flat b, long long N, long long M, cudaStream_t s);
cudaError_t launch_bias_grad(Flat dy, Flat db, long long N, long long M, cudaStream_t s);

cudaError_t launch_dropout_forward(Flat x, Flat y, std::uint8_t* mask, long long n, double p, std::uint64_t seed,
                                   std::uint64_t step, cudaStream_t s);
cudaError_t launch_dropout_backward(Flat dy, Flat dx, const std::uint8_t* mask, long long n, double p, float beta,
                                    cudaStream_t s);

// probs: N x M; row_loss: N floats (in the reserve); *loss = mean of row_loss. bad_label (device
// int) is set to 1 + the first sample whose label is outside [0, M).
// probs are fp32 whatever the logits' type.
cudaError_t launch_softmax_xent_forward(Flat logits, const std::int32_t* labels, float* loss, float* probs,
                                        float* row_loss, int* bad_label, long long N, long long M, cudaStream_t s);
// loss_scale: device float multiplying the gradient, or null
cudaError_t launch_softmax_xent_backward(const std::int32_t* labels, Flat dlogits, const float* probs, float scale,
                                         float beta, const float* loss_scale, long long N, long long M, cudaStream_t s);

// One launch over the whole parameter arena. scaler: LossScaler in device memory, or null.
cudaError_t launch_optimizer_update(OptArgs a, float* params, const float* grads, float* s0, float* s1, std::size_t n,
                                    const float* scaler, cudaStream_t s);

// Mixed precision and loss scaling.
cudaError_t launch_cast(Flat src, Flat dst, std::size_t n, cudaStream_t s);
cudaError_t launch_check_finite(const float* x, std::size_t n, float* scaler, cudaStream_t s);
cudaError_t launch_update_loss_scale(float* scaler, int growth_interval, cudaStream_t s);

// The input pipeline's transforms (--decode gpu; kernels_image.cu, src/data/augment.cpp's
// arithmetic): decoded RGB images (device memory, rows `pitch` bytes apart) resized to R x R (the
// shorter side, antialiased, centred), then each crop box resized to S x S, flipped, normalised into
// slot `slot` of a float batch tensor.
struct ImageIn {
  const unsigned char* px;
  int w, h;
  std::size_t pitch;
};
struct CropIn {
  int x, y, w, h, flip, slot;
};
struct NormIn {
  float scale[3], shift[3];  // v * scale + shift: 1 / (255 std), -mean / std
};
cudaError_t launch_resize_store(const ImageIn* in, int n, int R, unsigned char* out, cudaStream_t s);
cudaError_t launch_crop_normalise(const unsigned char* stored, int R, const CropIn* crops, int n, int S, NormIn nrm,
                                  View out, cudaStream_t s);

}  // namespace stepbench::cuda
