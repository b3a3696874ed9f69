// GPU tests: built always, skipped with the reason when no GPU is visible (or CUDA is not built).
#include <gtest/gtest.h>

#include "stepbench/backend.hpp"
#include "stepbench/error.hpp"

namespace stepbench {
namespace {

TEST(Cuda, BackendIsUsableWhereAGpuIsVisible) {
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  EXPECT_GT(cuda_device_count(), 0);
  // The cuDNN ops are not implemented yet: the backend must say so instead of running wrong code.
  EXPECT_THROW(make_backend("cuda"), UnsupportedError);
}

TEST(Cuda, ExplicitCudaWithoutGpuIsAClearError) {
  if (cuda_unavailable_reason().empty()) GTEST_SKIP() << "a GPU is visible";
  try {
    make_backend("cuda");
    FAIL() << "no error";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("--backend cpu"), std::string::npos) << e.what();
  }
  EXPECT_EQ(make_backend("auto")->name(), "cpu");
}

}  // namespace
}  // namespace stepbench
