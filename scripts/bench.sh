#!/usr/bin/env bash
# Installs what is missing (as root), builds the stepbench binary (Release) into build/ and runs it
# with the flags given. The install and the build show their progress on stderr (their logs:
# build/stepbench-configure.log, build/stepbench-build.log), and say whether CUDA is in, or why not.
#   scripts/bench.sh [stepbench flags...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sb_install_deps
BUILD_DIR=${STEPBENCH_BUILD_DIR:-$STEPBENCH_ROOT/build}
sb_configure "$BUILD_DIR"
sb_compile "$BUILD_DIR" stepbench
exec "$BUILD_DIR/bin/stepbench" "$@"
