# Shared by bench.sh and test.sh: install missing Debian packages, configure and build.
# Sourced, not run.
STEPBENCH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STEPBENCH_PACKAGES=(
  cmake ninja-build g++ pkg-config
  libdnnl-dev libbenchmark-dev libbenchmark-tools libcli11-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libopenmpi-dev openmpi-bin libgloo-dev libturbojpeg0-dev libpng-dev
  ocl-icd-opencl-dev  # libdnnl-dev only recommends it, but its CMake config requires OpenCL
  patchelf            # scripts/gpu-bundle.sh: the bundle's RUNPATH
  clang-format clang-tidy  # scripts/lint.sh: format and static checks in CI
  python3 python3-numpy python3-torch python3-torchvision python3-scipy python3-matplotlib
  python3-yaml        # tests/ci/workflow_test.py
)

sb_install_deps() {
  local missing=()
  for p in "${STEPBENCH_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "stepbench: missing Debian packages. Install them as root, then run this again:" >&2
    echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 2
  fi
  echo "stepbench: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# sb_build BUILD_DIR [extra cmake args...]
sb_build() {
  local dir=$1; shift
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    cmake -S "$STEPBENCH_ROOT" -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
  else
    cmake -S "$STEPBENCH_ROOT" -B "$dir" "$@" >/dev/null
  fi
  cmake --build "$dir" --parallel "$(nproc)"
}
