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

enum RowOp : int { kRelu, kReluBwd, kAdd, kBnInfer };
struct RowArgs {
  Rows a, b, c;  // relu: x, y; relu backward: y, dy, dx; add: src, dst; bn inference: x, y
  float beta;    // accumulate into the destination (kReluBwd, kAdd)
  const float *gamma, *bnbeta, *mean, *var;
  float eps;
  bool relu, cl;  // bn: fused ReLU; channels-last rows (the channel is the column), else NCHW rows
  unsigned vec_per_row, total, channels;
};

// Runs OP over rows when every view has them in the same order and one element type; returns
// false (nothing launched) otherwise, and the caller runs the generic kernel. Instantiated in
// kernels_rows.cu for every RowOp.
template <int OP>
bool launch_rows(RowArgs a, const View* v, int n_views, cudaStream_t s, cudaError_t& err);

}  // namespace stepbench::cuda
