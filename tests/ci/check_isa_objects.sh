#!/usr/bin/env bash
# Checks the per-instruction-set builds of the cpu kernels (src/backend/cpu/isa.hpp) on their
# object files (NAME.avx2.cpp.o, NAME.avx512.cpp.o among the arguments; the others are ignored, so
# the target's whole object list can be passed):
#   1. every weak function in them (inline functions and templates of headers, which the linker may
#      keep from any object), with its local clones (.cold, .part.N, .isra.N, .constprop.N), is
#      plain x86-64 code: no VEX or EVEX instruction, no ymm/zmm/mask register, no popcnt, crc32,
#      lzcnt or tzcnt. A copy built for AVX-512 that the linker kept would crash an AVX2 machine in
#      code that has nothing to do with the kernels. (A template of the set's own namespace
#      instantiated with a named type would be flagged too, though its name is the set's own: move
#      it into an anonymous namespace.)
#   2. every global function they define is in their own namespace (stepbench::cpu::isa_<set>), and
#      nothing in them runs at load time (.init_array): that would run on every CPU.
#   3. no fused multiply-add (vfmadd...): the builds are compiled with -ffp-contract=off so that they
#      round every operation as the plain build does.
#   4. with --require-wide (optimised builds; -O0 vectorises nothing): the target pragma took, each
#      object has code that uses its set's registers (ymm for avx2, zmm for avx512).
set -euo pipefail
require_wide=0
if [ "${1:-}" = --require-wide ]; then require_wide=1; shift; fi
[ $# -gt 0 ] || { echo "usage: $0 [--require-wide] OBJECT.o... (NAME.avx2.cpp.o and NAME.avx512.cpp.o are checked)" >&2; exit 2; }
command -v objdump > /dev/null && command -v nm > /dev/null || { echo "SKIP: objdump/nm (binutils) missing"; exit 77; }
fail=0 checked=0
for obj in "$@"; do
  case "$obj" in
    *.avx512.cpp.o) set_name=avx512 reg='%zmm' ;;
    *.avx2.cpp.o) set_name=avx2 reg='%ymm' ;;
    *) continue ;;
  esac
  [ -f "$obj" ] || { echo "$obj: missing" >&2; exit 2; }
  checked=$((checked + 1)) ok=1
  weak=$(nm --defined-only "$obj" | awk '$2 == "W" {print $3}' | sort -u)
  # per function: its name, whether it has a VEX/EVEX instruction or a wide/mask register
  report=$(objdump -d --no-show-raw-insn "$obj" | awk -v reg="$reg" '
    /^[0-9a-f]+ <.*>:$/ { name = substr($2, 2, length($2) - 3); sub(/\..*/, "", name); next }  # clones: their function
    /^ +[0-9a-f]+:\t/ {
      split($0, f, "\t"); ins = f[2]
      if (ins ~ /^(v|popcnt|crc32|lzcnt|tzcnt)/ || ins ~ /%[yz]mm|%k[0-7]/) vec[name] = 1
      if (index(ins, reg)) wide++
    }
    END { for (n in vec) print "vec", n; print "wide", wide + 0 }')
  bad=$(comm -12 <(printf '%s\n' "$weak") <(awk '$1 == "vec" {print $2}' <<< "$report" | sort -u) | grep -v '^$' || true)
  if [ -n "$bad" ]; then
    echo "FAIL $obj: weak functions with $set_name instructions (a header's inline code compiled inside the region?):"
    c++filt <<< "$bad" | sed 's/^/  /'
    ok=0
  fi
  strays=$(nm -C --defined-only "$obj" | awk '$2 == "T"' | cut -d' ' -f3- | grep -v "^stepbench::cpu::isa_${set_name}::" || true)
  if [ -n "$strays" ]; then
    echo "FAIL $obj: global functions outside stepbench::cpu::isa_${set_name}:"
    sed 's/^/  /' <<< "$strays"
    ok=0
  fi
  fma=$(objdump -d --no-show-raw-insn "$obj" | grep -cE $'\tvf(n)?m(add|sub)' || true)
  if [ "$fma" -gt 0 ]; then
    echo "FAIL $obj: $fma fused multiply-adds (is -ffp-contract=off set on it?)"
    ok=0
  fi
  if objdump -h "$obj" | grep -q '\.init_array'; then
    echo "FAIL $obj: has load-time code (.init_array), which would run on every CPU"
    ok=0
  fi
  wide=$(awk '$1 == "wide" {print $2}' <<< "$report")
  if [ $require_wide -eq 1 ] && [ "$wide" -eq 0 ]; then
    echo "FAIL $obj: no instruction uses $reg: the $set_name target pragma did not apply"
    ok=0
  fi
  if [ $ok -eq 1 ]; then
    echo "ok $(basename "$obj"): $(wc -w <<< "$weak") weak functions, all plain x86-64; $wide instructions on $reg"
  else
    fail=1
  fi
done
[ $checked -gt 0 ] || { echo "FAIL: no NAME.avx2.cpp.o or NAME.avx512.cpp.o among the $# objects given" >&2; exit 1; }
exit $fail
