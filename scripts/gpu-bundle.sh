#!/usr/bin/env bash
# Builds stepbench for a GPU machine that has the CUDA driver and toolkit, a Python with PyTorch and its
# cuDNN / cuBLAS / NCCL wheels, and none of this project's Debian packages nor a network; writes a
# self-contained folder to carry there:
#   OUT_DIR/bin/stepbench, OUT_DIR/bin/stepbench_tests     RUNPATH $ORIGIN/../lib
#   OUT_DIR/lib/                 every shared library they need that such a machine lacks (oneDNN, the
#                                OpenCL ICD loader, Google Benchmark, fmt, libjpeg-turbo, libpng,
#                                zlib, libgomp, Gloo and what it links: hiredis, libibverbs, libnl)
#   OUT_DIR/gpu-check.sh         the stages to run there: tests, bench, peer (see its header)
#   OUT_DIR/bench/, tests/parity/, tests/bench/, configs/, BUNDLE.txt
# The CUDA runtime is linked statically; cuDNN, cuBLAS and NCCL are taken from the GPU machine
# (gpu-check.sh finds them), since they are hundreds of MiB. Built without MPI (Open MPI's plugins
# and helpers would not fit); NCCL towers in one process work, mpirun across processes does not.
#
#   scripts/gpu-bundle.sh OUT_DIR [--arch "80;90"] [--build-dir DIR]    build and write the bundle
#   scripts/gpu-bundle.sh OUT_DIR --from-build DIR   take the binaries from a build with CUDA on (its
#                                             stepbench_nompi and stepbench_tests_nompi where it has
#                                             MPI: the same objects linked without it), its
#                                             architectures; seconds where that build is up to date
#                                             (a Release build of this tree, without sanitizers
#                                             or a planted fault)
#   scripts/gpu-bundle.sh --check OUT_DIR     check that every NEEDED entry resolves in the bundle
#                                             or is on the allow-list; exit 1 naming what does not
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

MAX_MIB=60
# Libraries the GPU machine brings: glibc's, the C++ runtime, the driver, and the CUDA libraries
# from its toolkit or PyTorch's wheels.
ALLOWED_RE='^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|ld-linux-x86-64\.so\.2|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libcuda\.so\.1|libcudnn[a-z_]*\.so\.9|libcublas\.so\.13|libcublasLt\.so\.13|libnccl\.so\.2)$'

usage() {
  echo "usage: scripts/gpu-bundle.sh OUT_DIR [--arch LIST] [--build-dir DIR | --from-build DIR] | --check OUT_DIR" >&2
  exit 2
}

# check_bundle DIR: every NEEDED entry of every ELF file resolves to DIR/lib or is allowed.
check_bundle() {
  local dir=$1 bad=0 f n
  [ -d "$dir/bin" ] && [ -d "$dir/lib" ] || { echo "gpu-bundle: $dir is not a bundle (no bin/ and lib/)" >&2; return 2; }
  while IFS= read -r f; do
    readelf -h "$f" > /dev/null 2>&1 || continue  # ELF files only
    for n in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      if [[ $n == libmpi* ]]; then
        echo "gpu-bundle: ${f#"$dir"/} needs $n: the bundle carries no MPI (Open MPI's plugins would not fit)" >&2
        bad=1
        continue
      fi
      if [ -e "$dir/lib/$n" ]; then continue; fi
      if [[ $n =~ $ALLOWED_RE ]]; then continue; fi
      echo "gpu-bundle: ${f#"$dir"/} needs $n, which is neither in lib/ nor on the allow-list" >&2
      bad=1
    done
  done < <(find "$dir/bin" "$dir/lib" -type f)
  local mib
  mib=$(du -sm "$dir" | cut -f1)
  if [ "$mib" -gt "$MAX_MIB" ]; then
    echo "gpu-bundle: $dir is $mib MiB, over the $MAX_MIB MiB that can be carried" >&2
    bad=1
  fi
  [ $bad -eq 0 ] && echo "gpu-bundle: $dir is self-contained ($mib MiB)"
  return $bad
}

if [ "${1:-}" = "--check" ]; then
  [ $# -eq 2 ] || usage
  check_bundle "$2"
  exit $?
fi

OUT_DIR=""
ARCH=90
BUILD_DIR=$STEPBENCH_ROOT/build-bundle
FROM=""
ARCH_GIVEN=0
DIR_GIVEN=0
while [ $# -gt 0 ]; do
  case $1 in
    --arch) [ $# -ge 2 ] || usage; ARCH=$2; ARCH_GIVEN=1; shift 2 ;;
    --build-dir) [ $# -ge 2 ] || usage; BUILD_DIR=$2; DIR_GIVEN=1; shift 2 ;;
    --from-build) [ $# -ge 2 ] && [ -n "$2" ] || usage; FROM=$2; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    -*) echo "gpu-bundle: unknown option $1" >&2; usage ;;
    *) [ -z "$OUT_DIR" ] || usage; OUT_DIR=$1; shift ;;
  esac
done
[ -n "$OUT_DIR" ] || usage
cache_of() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD_DIR/CMakeCache.txt"; }
if [ -n "$FROM" ]; then
  # an existing build: its CUDA architectures, and its binaries without MPI
  [ $ARCH_GIVEN = 0 ] && [ $DIR_GIVEN = 0 ] ||
    { echo "gpu-bundle: --from-build takes that build's binaries and architectures; leave out --arch and --build-dir" >&2; exit 2; }
  BUILD_DIR=$FROM
  [ -f "$BUILD_DIR/CMakeCache.txt" ] || { echo "gpu-bundle: $BUILD_DIR is not a configured build (no CMakeCache.txt)" >&2; exit 2; }
  on() { [[ $(cache_of "$1") =~ ^(ON|on|On|TRUE|true|True|YES|yes|Y|y|1)$ ]]; }
  refuse() { echo "gpu-bundle: $BUILD_DIR $1; give a Release build of this tree with CUDA on (or leave out --from-build)" >&2; exit 2; }
  [ "$(cd "$(cache_of CMAKE_HOME_DIRECTORY)" 2>/dev/null && pwd -P)" = "$(cd "$STEPBENCH_ROOT" && pwd -P)" ] ||
    refuse "is a build of $(cache_of CMAKE_HOME_DIRECTORY), not of $STEPBENCH_ROOT"
  on STEPBENCH_CUDA || refuse "was configured without CUDA"
  [ "$(cache_of CMAKE_BUILD_TYPE)" = Release ] || refuse "is a '$(cache_of CMAKE_BUILD_TYPE)' build"
  on STEPBENCH_SANITIZE && refuse "is a sanitizer build (STEPBENCH_SANITIZE)"
  on STEPBENCH_TSAN && refuse "is a sanitizer build (STEPBENCH_TSAN)"
  [ "$(cache_of STEPBENCH_PLANT_FAULT)" = 0 ] || refuse "has a planted fault (STEPBENCH_PLANT_FAULT)"
  on STEPBENCH_BUILD_TESTS && on STEPBENCH_BUILD_BENCH || refuse "builds no tests or no stepbench binary"
  ARCH=$(cache_of CMAKE_CUDA_ARCHITECTURES)
  suffix=""
  if on STEPBENCH_MPI; then suffix=_nompi; fi
  log=$BUILD_DIR/gpu-bundle-build.log
  cmake --build "$BUILD_DIR" --target "stepbench$suffix" "stepbench_tests$suffix" > "$log" 2>&1 ||
    { tail -n 30 "$log" >&2; echo "gpu-bundle: building stepbench$suffix and stepbench_tests$suffix in $BUILD_DIR failed (above; $log)" >&2; exit 1; }
  "$BUILD_DIR/bin/stepbench$suffix" --version > "$log" 2>&1 ||
    { cat "$log" >&2; echo "gpu-bundle: $BUILD_DIR/bin/stepbench$suffix does not run here" >&2; exit 1; }
  grep -q '^mpi: off' "$log" ||
    { echo "gpu-bundle: $BUILD_DIR/bin/stepbench$suffix was built with MPI, which the bundle cannot carry" >&2; exit 1; }
else
  [[ $ARCH =~ ^[0-9]+[a-z]?(\;[0-9]+[a-z]?)*$ ]] ||
    { echo "gpu-bundle: --arch takes CUDA architectures like 90 or \"80;90\", not '$ARCH'" >&2; exit 2; }
  command -v /usr/local/cuda/bin/nvcc >/dev/null || command -v nvcc >/dev/null ||
    { echo "gpu-bundle: nvcc not found; a bundle needs the CUDA toolkit (nvcc, cuDNN, NCCL) to build" >&2; exit 2; }
  sb_install_deps

  # a unity build (the C++ sources of a target compiled a few at a time as one file, the default): 3.3
  # minutes on two cores, about half a plain build's time. Its options (CUDA on, MPI off, one GPU
  # architecture) stay in that build folder's cache, so give --build-dir a folder of its own
  sb_build "$BUILD_DIR" -DSTEPBENCH_CUDA=ON -DSTEPBENCH_MPI=OFF -DSTEPBENCH_BUILD_TESTS=ON \
    -DSTEPBENCH_BUILD_BENCH=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" -DCMAKE_UNITY_BUILD=ON
  grep -q '^STEPBENCH_CUDA:BOOL=ON' "$BUILD_DIR/CMakeCache.txt" ||
    { echo "gpu-bundle: $BUILD_DIR was configured without CUDA" >&2; exit 1; }
  suffix=""
fi
command -v patchelf >/dev/null || sb_install_deps

# replace only an earlier bundle or an empty folder
if [ -e "$OUT_DIR" ] && [ ! -f "$OUT_DIR/BUNDLE.txt" ] && [ -n "$(ls -A "$OUT_DIR" 2>/dev/null)" ]; then
  echo "gpu-bundle: $OUT_DIR exists and is not a bundle; give an empty or new folder" >&2
  exit 2
fi
rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR/bin" "$OUT_DIR/lib" "$OUT_DIR/bench" "$OUT_DIR/tests/parity" "$OUT_DIR/tests/bench"
for b in stepbench stepbench_tests; do
  cp "$BUILD_DIR/bin/$b$suffix" "$OUT_DIR/bin/$b"
  strip --strip-unneeded "$OUT_DIR/bin/$b"
  patchelf --set-rpath '$ORIGIN/../lib' "$OUT_DIR/bin/$b"
done
# every library ldd resolves that the GPU machine does not bring, under its SONAME
for b in "$OUT_DIR"/bin/*; do
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r soname path; do
  if [[ $soname =~ $ALLOWED_RE ]]; then continue; fi
  cp -L "$path" "$OUT_DIR/lib/$soname"
  chmod u+w "$OUT_DIR/lib/$soname"
  patchelf --set-rpath '$ORIGIN' "$OUT_DIR/lib/$soname"
done
cp "$STEPBENCH_ROOT/bench/torch_peer.py" "$OUT_DIR/bench/"
cp "$STEPBENCH_ROOT/tests/parity/torch_parity.py" "$OUT_DIR/tests/parity/"
cp "$STEPBENCH_ROOT/tests/bench/test_layer_times.py" "$OUT_DIR/tests/bench/"  # gpu-check layers: its trace checker
cp -r "$STEPBENCH_ROOT/configs" "$OUT_DIR/"
cp "$STEPBENCH_ROOT/scripts/gpu-check.sh" "$OUT_DIR/gpu-check.sh"
{
  echo "stepbench GPU bundle"
  echo "commit: $(git -C "$STEPBENCH_ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "built: $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname)"
  echo "cuda architectures: $ARCH"
  nvcc_bin=$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")
  echo "nvcc: $("$nvcc_bin" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  hdr() { sed -n "s/^#define $2 \([0-9]*\).*/\1/p" "$1" | head -1; }
  inc=$(sed -n 's/^CUDNN_INCLUDE_DIR:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")
  ninc=$(sed -n 's/^NCCL_INCLUDE_DIR:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")
  echo "built against: cuDNN $(hdr "$inc/cudnn_version.h" CUDNN_MAJOR).$(hdr "$inc/cudnn_version.h" CUDNN_MINOR)" \
       "NCCL $(hdr "$ninc/nccl.h" NCCL_MAJOR).$(hdr "$ninc/nccl.h" NCCL_MINOR).$(hdr "$ninc/nccl.h" NCCL_PATCH)"
  echo "needs on the GPU machine: glibc >= 2.34 and libstdc++ >= GCC 12's (GLIBCXX_3.4.30), not carried"
  echo "mpi: off (not carried)"
  echo "carried libraries:"
  (cd "$OUT_DIR/lib" && ls -l | awk 'NR > 1 {printf "  %s %d\n", $9, $5}')
} > "$OUT_DIR/BUNDLE.txt"
check_bundle "$OUT_DIR"
echo "gpu-bundle: run there: $OUT_DIR/gpu-check.sh tests|bench|peer OUT"
