#!/usr/bin/env bash
# Checks that the install list of scripts/common.sh brings everything a build used, so that a fresh
# machine builds too, whatever was installed by hand on this one. For every Debian file the build
# read (headers: ninja's dependency log; libraries: the binaries' ldd and the CMake cache; and the
# programs scripts/hosts.sh runs for the tests) it asks
# dpkg which package owns it, and fails, naming package and file, when that package is not in the
# dependency closure of the install list (apt-cache depends --recurse, no recommends).
# Files under /usr/local (the CUDA toolkit, a prerequisite) are not Debian's and not checked.
#   scripts/check-install.sh BUILD_DIR
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
BUILD_DIR=${1:?usage: scripts/check-install.sh BUILD_DIR}
[ -f "$BUILD_DIR/CMakeCache.txt" ] || { echo "check-install: $BUILD_DIR is not a configured build" >&2; exit 2; }
command -v dpkg-query >/dev/null && command -v apt-cache >/dev/null ||
  { echo "check-install: needs dpkg and apt-cache (Debian)"; exit 0; }

files=$(mktemp)
trap 'rm -f "$files" "$files.owners" "$files.closure"' EXIT
{
  # headers every object was compiled from (Ninja's deps log)
  if [ -f "$BUILD_DIR/build.ninja" ] && command -v ninja >/dev/null; then
    ninja -C "$BUILD_DIR" -t deps 2>/dev/null | awk '/^    \// {print $1}'
  else
    echo "check-install: not a Ninja build, headers not checked" >&2
  fi
  # libraries and tools CMake found
  sed -n 's/^[A-Za-z0-9_]*:\(FILEPATH\|PATH\)=\(\/.*\)$/\2/p' "$BUILD_DIR/CMakeCache.txt"
  # shared libraries the binaries load
  for b in "$BUILD_DIR"/bin/*; do
    if [ -x "$b" ]; then ldd "$b" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' || true; fi
  done
  # programs the tests run (scripts/hosts.sh: the cluster of namespace hosts)
  for t in ip tc unshare; do command -v "$t" || true; done
} | { grep -v -e '^/usr/local/' -e "^$BUILD_DIR" -e "^$STEPBENCH_ROOT" || true; } | sort -u |
  while read -r f; do
    if [ -f "$f" ]; then readlink -f "$f"; echo "$f"; fi  # files: a directory belongs to many packages
  done | sort -u > "$files"

# owners: "pkg[:arch][, pkg2]: /path"; a file no package owns (generated, pip, by hand) is reported
xargs -a "$files" dpkg-query -S 2>/dev/null | sed 's/: \//\t\//' > "$files.owners" || true
apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
  --no-enhances "${STEPBENCH_PACKAGES[@]}" 2>/dev/null | grep -v '^ ' | sed 's/:.*//; s/^<\(.*\)>$/\1/' |
  sort -u > "$files.closure"

bad=0
declare -A seen=()
while IFS=$'\t' read -r pkgs path; do
  ok=0
  for p in ${pkgs//,/ }; do
    p=${p%%:*}
    grep -qxF "$p" "$files.closure" && ok=1
  done
  if [ $ok -eq 0 ] && [ -z "${seen[$pkgs]:-}" ]; then
    seen[$pkgs]=1
    echo "check-install: the build used $path from package '$(sed 's/:[a-z0-9]*//g' <<<"$pkgs")', which the install list in scripts/common.sh does not bring; add it" >&2
    bad=1
  fi
done < "$files.owners"
n_files=$(wc -l < "$files.owners")
n_pkgs=$(cut -f1 "$files.owners" | tr ',' '\n' | sed 's/^ *//; s/:.*//' | sort -u | wc -l)
if [ $bad -eq 0 ]; then
  echo "check-install: the build used $n_files Debian files from $n_pkgs packages, all brought by the install list"
fi
exit $bad
