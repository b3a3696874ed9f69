#!/usr/bin/env bash
# Installs what is missing (as root), builds (CUDA on when nvcc and cuDNN are found), checks that the
# install list brings everything the build used (scripts/check-install.sh) and runs every test, then
# the sanitizer stages (scripts/sanitize.sh). GPU tests skip with the reason when no GPU is visible.
# Non-zero exit on any failure.
#   scripts/test.sh [extra cmake args...]      e.g. -DSTEPBENCH_CUDA=OFF
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sb_install_deps
BUILD_DIR=${STEPBENCH_BUILD_DIR:-$STEPBENCH_ROOT/build}
# warnings are errors here (CI runs this script); scripts/bench.sh builds without -Werror. Both build
# unity (CMakeLists.txt's default), so a plain build (-DCMAKE_UNITY_BUILD=OFF) is compiled by no step
# Without a visible GPU the CUDA code is only compiled, for sm_90 alone (the GPU bundle's architecture,
# which the bundle test then makes from this build), unless the arguments or CUDAARCHS name
# architectures. The build folder's cache keeps it: on a GPU machine later, give
# -DCMAKE_CUDA_ARCHITECTURES="80;90" (or a fresh STEPBENCH_BUILD_DIR)
arch=()
gpus=$(nvidia-smi -L 2>/dev/null || true)
if [[ " $* " != *CMAKE_CUDA_ARCHITECTURES* && -z ${CUDAARCHS:-} && $gpus != *"GPU "* ]] &&
  { [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; }; then
  arch=(-DCMAKE_CUDA_ARCHITECTURES=90)
fi
sb_build "$BUILD_DIR" -DSTEPBENCH_WERROR=ON "${arch[@]}" "$@"
# everything the build used must come from the install list, or a fresh machine fails where this passes
"$STEPBENCH_ROOT/scripts/check-install.sh" "$BUILD_DIR"
# layers, format and clang-tidy (scripts/lint.sh)
"$STEPBENCH_ROOT/scripts/lint.sh" "$BUILD_DIR"
cd "$BUILD_DIR"
ctest --output-on-failure --parallel "$(nproc)"
# the same code under AddressSanitizer + UBSan and ThreadSanitizer (scripts/sanitize.sh, ~11 minutes
# on two cores); STEPBENCH_SKIP_SANITIZERS=1 leaves them out of a local run
if [ "${STEPBENCH_SKIP_SANITIZERS:-0}" != 1 ]; then
  "$STEPBENCH_ROOT/scripts/sanitize.sh" all
fi
