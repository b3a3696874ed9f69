#!/usr/bin/env bash
# Installs what is missing (as root), builds Release into build/ and runs build/bin/stepbench with
# the flags given.
#   scripts/bench.sh [stepbench flags...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sb_install_deps
BUILD_DIR=${STEPBENCH_BUILD_DIR:-$STEPBENCH_ROOT/build}
sb_build "$BUILD_DIR" >/dev/null
exec "$BUILD_DIR/bin/stepbench" "$@"
