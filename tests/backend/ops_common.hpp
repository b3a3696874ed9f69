// What the op tests share (conv_test.cpp, batch_norm_test.cpp, pool_test.cpp, elementwise_test.cpp,
// add_relu_test.cpp, linear_test.cpp, loss_test.cpp, optimizer_test.cpp, mixed_precision_test.cpp): every backend op,
// forward and backward, against the naive oracle, in one fixture `Ops` typed over backend x layout
// x precision (instantiated once, in ops_common.cpp). Outputs and incoming gradients are channel
// slices of wider buffers, as they are when a branch writes into its concat, so the strided paths
// are what is tested.
#pragma once
#include "support/test_util.hpp"

namespace stepbench {

// One class for every file's TEST_P(Ops, ...): GoogleTest requires one fixture per test suite.
class Ops : public testing::TestWithParam<test::Config> {};

using test::DevTensor;
using test::DevVec;
using test::random_vec;

}  // namespace stepbench
