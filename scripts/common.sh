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
  iproute2 util-linux # scripts/hosts.sh: network-namespace hosts for tests/comm/test_hosts.py (ip, tc, unshare)
)

# sb_progress LABEL LOG: keeps a command's output (stdin) in LOG and shows how far it is on stderr:
# ninja's [n/N] and apt's packages as they are set up. On a terminal one line redrawn in place;
# elsewhere (a log, CI) a line every 25%.
sb_progress() {
  local label=$1 log=$2 tty=0 shown=-1 n=0 total=0 line
  [ -t 2 ] && tty=1
  : >"$log"
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$log"
    if [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]]; then
      n=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]}
    elif [[ $line =~ ([0-9]+)\ newly\ installed ]]; then
      total=${BASH_REMATCH[1]}
    elif [[ $line =~ ^Setting\ up\  ]]; then
      n=$((n + 1))
    else
      continue
    fi
    [ "$total" -gt 0 ] || continue
    local pct=$((n * 100 / total))
    if [ $tty = 1 ]; then
      printf '\r\033[K%s %d/%d (%d%%)' "$label" "$n" "$total" "$pct" >&2
    elif [ $((pct / 25)) -gt $shown ]; then
      shown=$((pct / 25))
      printf '%s %d/%d (%d%%)\n' "$label" "$n" "$total" "$pct" >&2
    fi
  done
  if [ $tty = 1 ]; then printf '\r\033[K' >&2; fi
}

# sb_run LABEL LOG COMMAND...: runs COMMAND with sb_progress; on failure prints the end of LOG.
sb_run() {
  local label=$1 log=$2
  shift 2
  if ! "$@" 2>&1 | sb_progress "$label" "$log"; then
    echo "stepbench: $label failed; the end of $log:" >&2
    tail -n 40 "$log" >&2
    return 1
  fi
}

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
  local log=${TMPDIR:-/tmp}/stepbench-apt.log
  echo "stepbench: installing ${#missing[@]} Debian packages and what they need (a few minutes; log: $log):" >&2
  echo "  ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive sb_run "stepbench: installing packages" "$log" \
    apt-get install -y --no-install-recommends "${missing[@]}"
}

# sb_configure BUILD_DIR [extra cmake args...]: configures Release (the first time) and says whether
# the CUDA backend is in, and why not.
sb_configure() {
  local dir=$1; shift
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  mkdir -p "$dir"
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    echo "stepbench: configuring $dir (Release)" >&2
    sb_run "stepbench: configuring" "$dir/stepbench-configure.log" \
      cmake -S "$STEPBENCH_ROOT" -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
  else
    sb_run "stepbench: configuring" "$dir/stepbench-configure.log" cmake -S "$STEPBENCH_ROOT" -B "$dir" "$@"
  fi
  local cuda
  cuda=$(sed -n 's/^STEPBENCH_CUDA_STATUS:INTERNAL=//p' "$dir/CMakeCache.txt")
  case $cuda in
    on*) echo "stepbench: CUDA backend $cuda" >&2 ;;
    off*) echo "stepbench: CUDA backend left out: ${cuda#off: }; runs use the cpu backend" >&2 ;;
  esac
}

# sb_compile BUILD_DIR [target]: builds (everything, or the target), showing the progress.
sb_compile() {
  local dir=$1 target=()
  [ $# -gt 1 ] && target=(--target "$2")
  sb_run "stepbench: building${2:+ $2}" "$dir/stepbench-build.log" cmake --build "$dir" --parallel "$(nproc)" "${target[@]}"
}

# sb_build BUILD_DIR [extra cmake args...]: configure, then build everything
sb_build() {
  local dir=$1; shift
  sb_configure "$dir" "$@"
  sb_compile "$dir"
}
