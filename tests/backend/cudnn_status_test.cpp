// What a cuDNN status means to the cuda backend (classify_cudnn_status, cudnn_try, FallbackNotes in
// src/backend/cuda/common.*): the whole table of cuDNN 9's statuses, without a GPU.
#ifdef STEPBENCH_HAVE_CUDA
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/common.hpp"
#include "backend/cuda/conv_padding.hpp"

namespace stepbench::cuda {
namespace {

using V = CudnnVerdict;

TEST(CudnnStatus, EveryStatusOfCudnn9HasItsVerdict) {
  const std::vector<std::pair<int, V>> table = {
      {CUDNN_STATUS_SUCCESS, V::ran},
      // the installation
      {CUDNN_STATUS_NOT_INITIALIZED, V::unavailable},
      {CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH, V::unavailable},
      {CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH, V::unavailable},
      {CUDNN_STATUS_DEPRECATED, V::failed},
      {CUDNN_STATUS_LICENSE_ERROR, V::unavailable},
      {CUDNN_STATUS_RUNTIME_IN_PROGRESS, V::failed},
      {CUDNN_STATUS_RUNTIME_FP_OVERFLOW, V::failed},
      {CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED, V::unavailable},
      // the legacy API's "no kernel for this" versus a wrong call
      {CUDNN_STATUS_BAD_PARAM, V::declined},
      {2001 /* INVALID_VALUE */, V::declined},
      {CUDNN_STATUS_BAD_PARAM_NULL_POINTER, V::failed},
      {CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, V::failed},
      {CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, V::failed},
      {CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND, V::failed},
      {CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT, V::failed},
      {CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH, V::failed},
      {CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, V::failed},
      {CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES, V::failed},
      {CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, V::failed},
      {CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH, V::failed},
      {CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, V::failed},
      // a configuration without a kernel versus a missing piece of the installation
      {CUDNN_STATUS_NOT_SUPPORTED, V::declined},
      {CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN, V::declined},
      {CUDNN_STATUS_NOT_SUPPORTED_SHAPE, V::declined},
      {CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, V::declined},
      {CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, V::declined},
      {CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER, V::unavailable},
      {CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART, V::unavailable},
      {CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH, V::unavailable},
      {CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING, V::unavailable},
      {CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE, V::unavailable},
      {CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT, V::declined},
      {CUDNN_STATUS_NOT_SUPPORTED_PADDING, V::declined},
      {CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM, V::declined},
      {CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API, V::declined},
      {CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE, V::declined},
      // failures
      {CUDNN_STATUS_INTERNAL_ERROR, V::failed},
      {CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED, V::failed},
      {CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE, V::failed},
      {CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, V::failed},
      {CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, V::failed},
      {CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM, V::failed},
      {CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED, V::failed},
      {CUDNN_STATUS_EXECUTION_FAILED, V::failed},
      {CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER, V::failed},
      {CUDNN_STATUS_EXECUTION_FAILED_CUBLAS, V::failed},
      {CUDNN_STATUS_EXECUTION_FAILED_CUDART, V::failed},
      {CUDNN_STATUS_EXECUTION_FAILED_CURAND, V::failed},
      // a code a later cuDNN adds is not taken for a refusal
      {2099, V::failed},
      {3099, V::failed},
      {9999, V::failed},
  };
  for (const auto& [status, want] : table)
    EXPECT_EQ(to_string(classify_cudnn_status(status)), std::string(to_string(want))) << "status " << status;
  // every named status of cudnn_graph.h is in the table (the header's enum, counted by hand: 48)
  EXPECT_EQ(table.size(), 48u + 1u + 3u);
}

TEST(CudnnStatus, ADeclineIsReturnedAndEverythingElseStopsWithTheCall) {
  EXPECT_EQ(cudnn_try(CUDNN_STATUS_SUCCESS, "call()", "f.cpp", 1), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnn_try(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, "call()", "f.cpp", 1), CUDNN_STATUS_NOT_SUPPORTED_LAYOUT);
  EXPECT_EQ(cudnn_try(CUDNN_STATUS_BAD_PARAM, "call()", "f.cpp", 1), CUDNN_STATUS_BAD_PARAM);
  try {
    cudnn_try(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, "cudnnBatchNormalizationBackwardEx(h, ...)", "f.cpp", 7);
    ADD_FAILURE() << "a misaligned pointer was taken for a refusal";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cudnnBatchNormalizationBackwardEx(h, ...)"), std::string::npos) << m;
    EXPECT_NE(m.find("CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER"), std::string::npos) << m;
  }
  try {
    cudnn_try(CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE, "cudnnPoolingForward(h, ...)", "f.cpp", 7);
    ADD_FAILURE() << "a missing sub-library was taken for a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sub-libraries"), std::string::npos) << e.what();
  }
}

TEST(CudnnStatus, EachFallbackIsSaidOnceAndCountedPerOp) {
  FallbackNotes notes;
  EXPECT_EQ(notes.summary(), "none");
  const auto x = TensorDesc::dense({8, 32, 17, 17}, DType::bf16, Layout::nhwc);
  testing::internal::CaptureStderr();
  for (int op = 0; op < 3; ++op)
    notes.note("batch norm", "forward", x, CUDNN_STATUS_NOT_SUPPORTED, "stepbench's kernel");
  notes.note("pooling", "backward", x, CUDNN_STATUS_BAD_PARAM, "stepbench's kernel");
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(said.find("batch norm forward"), said.rfind("batch norm forward")) << said;  // once
  EXPECT_NE(said.find("CUDNN_STATUS_NOT_SUPPORTED"), std::string::npos) << said;
  EXPECT_NE(said.find("pooling backward"), std::string::npos) << said;
  const std::string s = notes.summary();
  EXPECT_NE(s.find("3 x batch norm forward on nhwc bf16: CUDNN_STATUS_NOT_SUPPORTED -> stepbench's kernel"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("1 x pooling backward on nhwc bf16: CUDNN_STATUS_BAD_PARAM"), std::string::npos) << s;
}

TEST(ConvPadding, Only16BitChannelsLastInputsOffTheMultipleOf8ArePadded) {
  const Shape stem{8, 3, 299, 299};
  const auto nhwc = [](Shape s, DType t) { return TensorDesc::dense(s, t, Layout::nhwc); };
  for (DType t : {DType::bf16, DType::f16}) {
    const TensorDesc p = channel_padded(nhwc(stem, t));
    EXPECT_EQ(p.shape, (Shape{8, 8, 299, 299}));
    EXPECT_TRUE(p.is_dense());
    EXPECT_EQ(channel_padded(nhwc({8, 5, 9, 9}, t)).shape.c, 8);
    EXPECT_EQ(channel_padded(nhwc({8, 13, 9, 9}, t)).shape.c, 16);
    EXPECT_FALSE(needs_channel_pad(nhwc({8, 64, 9, 9}, t)));
    EXPECT_FALSE(needs_channel_pad(TensorDesc::dense(stem, t, Layout::nchw)));  // NCHW: cuDNN pads nothing
  }
  EXPECT_FALSE(needs_channel_pad(nhwc(stem, DType::f32)));  // fp32 runs without tensor cores' rule
  // a channel slice of a concat buffer with 64 channels is not padded: its count is a multiple of 8
  const auto slice = Tensor{nullptr, nhwc({8, 288, 35, 35}, DType::bf16)}.channel_slice(64, 64).desc;
  EXPECT_EQ(channel_padded(slice), slice);
}

}  // namespace
}  // namespace stepbench::cuda
#endif
