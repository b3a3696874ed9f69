// The fast path of the elementwise passes (ReLU, its backward, accumulation, batch norm inference):
// views as rows of contiguous elements.
// Every view the graph makes is a dense tensor or a channel slice of one. In channels-last order
// (NHWC: c contiguous) such a view is N*H*W rows of C elements; in NCHW order it is N*C rows of
// H*W elements. Row r starts at (r / r1) * so + (r % r1) * si. Kernels over rows need one 32-bit
// division per vector of elements instead of six 64-bit ones per element, read whole rows with
// 16-byte loads where the alignment allows, and walk memory in order (coalesced).
#pragma once
#include "backend/cuda/kernels_common.cuh"

namespace stepbench::cuda {

struct Rows {
  char* p;
  long long len, r1, so, si;  // elements
};

// kBnApply: y = coef[c].x * (x - coef[c].z) + coef[c].y (then the ReLU); kBnBwdApply: with g = dy masked by y > 0
// (or dy), dx = k1 (g - k2 - (x - mean) k3) + beta dx, coef[c] = {k1, k2, k3, mean}: the last passes
// of batch norm's training forward and backward once the statistics are known (kernels_batch_norm.cu).
// kAddRelu: y = max(a + b, 0); kAddReluBwd: g = dy masked by y > 0 into da (beta) and db (beta2).
enum RowOp : int { kRelu, kReluBwd, kAdd, kBnInfer, kBnApply, kBnBwdApply, kAddRelu, kAddReluBwd };
struct RowArgs {
  Rows a, b, c, d;  // relu: x, y; relu backward: y, dy, dx; add: src, dst; bn inference and apply: x, y;
                    // bn backward apply: x, y, dy, dx; add + relu: a, b, y; its backward: y, dy, da, db
  float beta;       // accumulate into the destination (kReluBwd, kAdd, kBnBwdApply, kAddReluBwd's da)
  float beta2;      // kAddReluBwd's db
  const float *gamma, *bnbeta, *mean, *var;
  const float4* coef;  // kBnApply, kBnBwdApply
  float eps;
  bool relu, cl;  // bn: fused ReLU; channels-last rows (the channel is the column), else NCHW rows
  unsigned vec_per_row, total, channels;
};

// Runs OP over rows when every view has them in the same order and one element type; returns
// false (nothing launched) otherwise, and the caller runs the generic kernel. Instantiated in
// kernels_rows.cu for every RowOp.
template <int OP>
bool launch_rows(RowArgs a, const View* v, int n_views, cudaStream_t s, cudaError_t& err);

// The rows of v in channels-last order (cl: N*H*W rows of C) or NCHW order (N*C rows of H*W), or
// false when v is not such a view.
bool as_rows(const View& v, bool cl, Rows& r);
// Whether all n views are rows in that order, with one shape and element type (r gets them).
bool all_rows(const View* v, int n, bool cl, Rows* r);

}  // namespace stepbench::cuda
