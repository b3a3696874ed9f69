// The fully connected layer on cuBLAS: column-major views of the row-major PyTorch layout, the bias
// and its gradient on stepbench's kernels (kernels_linear.cu).
#include "backend/cuda/common.hpp"

namespace stepbench::cuda {
namespace {

class CublasLinear final : public LinearOp {
 public:
  CublasLinear(const Ctx& c, const TensorDesc& x, const TensorDesc& y)
      : c_(c),
        N_(static_cast<int>(x.shape.n)),
        K_(static_cast<int>(x.shape.c)),
        M_(static_cast<int>(y.shape.c)),
        t_(x.dtype) {
    SB_CHECK(x.shape.h == 1 && x.shape.w == 1 && y.shape.h == 1 && y.shape.w == 1, "linear takes N x C x 1 x 1");
    SB_CHECK(x.is_dense() && y.is_dense(), "linear takes dense tensors");
  }
  std::size_t workspace_bytes() const override { return 0; }
  // y^T (M x N) = W (as K x M col-major, transposed) * x^T (K x N)
  void forward(Stream& s, const Tensor& x, const void* w, const void* b, const Tensor& y, void*) override {
    const float a = 1, z = 0;
    set(s);
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, M_, N_, K_, &a, w, K_, x.data, K_, &z, y.data, M_);
    SB_CUDA(cuda::launch_add_bias(flat(y.data, t_), flat(b, t_), N_, M_, S(s)));
  }
  // dx^T (K x N) = W^T (K x M) * dy^T (M x N)
  void backward_data(Stream& s, const Tensor& dy, const void* w, const Tensor& dx, float beta, void*) override {
    const float a = 1;
    set(s);
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, K_, N_, M_, &a, w, K_, dy.data, M_, &beta, dx.data, K_);
  }
  // dW^T (K x M) = x^T (K x N) * dy (N x M); db = column sums of dy
  void backward_weights(Stream& s, const Tensor& x, const Tensor& dy, void* dw, void* db, void*) override {
    const float a = 1, z = 0;
    set(s);
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, K_, M_, N_, &a, x.data, K_, dy.data, M_, &z, dw, K_);
    SB_CUDA(cuda::launch_bias_grad(flat(dy.data, t_), flat(db, t_), N_, M_, S(s)));
  }

 private:
  void set(Stream& s) {
    SB_CUDA(cudaSetDevice(c_.device));
    c_.blas->bind(S(s));
  }
  // Every storage type through cublasGemmEx with fp32 accumulation (the handle's math mode decides
  // TF32 for fp32 data).
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha, const void* A, int lda,
            const void* B, int ldb, const float* beta, void* C, int ldc) {
    const cudaDataType_t t = cuda_type(t_);
    SB_CUBLAS(cublasGemmEx(c_.blas->handle, ta, tb, m, n, k, alpha, A, t, lda, B, t, ldb, beta, C, t, ldc,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  Ctx c_;
  int N_, K_, M_;
  DType t_;
};

}  // namespace

std::unique_ptr<LinearOp> make_cuda_linear(const Ctx& c, const TensorDesc& x, const TensorDesc& y) {
  return std::make_unique<CublasLinear>(c, x, y);
}

}  // namespace stepbench::cuda
