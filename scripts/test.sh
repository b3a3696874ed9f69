#!/usr/bin/env bash
# Installs what is missing (as root), builds (CUDA on when nvcc and cuDNN are found) and runs every
# test. GPU tests skip with the reason when no GPU is visible. Non-zero exit on any failure.
#   scripts/test.sh [extra cmake args...]      e.g. -DSTEPBENCH_CUDA=OFF
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sb_install_deps
BUILD_DIR=${STEPBENCH_BUILD_DIR:-$STEPBENCH_ROOT/build}
sb_build "$BUILD_DIR" "$@"
cd "$BUILD_DIR"
ctest --output-on-failure --parallel "$(nproc)"
