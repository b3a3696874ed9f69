#!/usr/bin/env bash
# Interleaved A/B benchmark of two revisions on this machine, then `stepbench compare` on the rounds,
# paired by time slot: the regression gate that .github/workflows/gpu-bench.yml runs.
#
#   scripts/ab.sh BASE_REV [HEAD_REV] [--rounds N] [--out DIR] [--threshold PCT] [--alpha A] [--fail-on-unknown]
#                 [--bin-base BIN] [--bin-head BIN] [-- stepbench flags...]
#
# 1. Builds each revision (HEAD_REV defaults to HEAD: committed code only, not the working tree's
#    edits) in a throw-away git worktree under a mktemp folder, removed on exit, failure included:
#      cmake -S WT -B WT/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTEPBENCH_WERROR=OFF
#      ninja -C WT/build stepbench
#    with ccache as the C++ compiler launcher when ccache is installed. One build when both
#    revisions are the same commit. --bin-base / --bin-head use a built binary for that side instead.
# 2. Runs the binaries interleaved, base head, head base, base head, ... (the order alternates, so
#    an order effect cancels), N rounds each (default 9, at least 3),
#    each run `BIN <stepbench flags> --json DIR/rounds/<side>-K.json` (its output in
#    DIR/rounds/<side>-K.log); one line per run on stderr.
# 3. Pools each side's rounds into DIR/base.json and DIR/head.json: the first round's context plus
#    "ab_rounds" and "ab_side", every round's iteration entries (aggregates dropped), each with its
#    round ("ab_round": 1..N), repetition_index renumbered 0..R-1 per run_name and "repetitions" = R.
#    Rounds of one side that disagree in model, precision, layout, batch_size_per_gpu, gpus, backend
#    or device stop it (exit 2).
# 4. Runs `HEAD_BIN compare DIR/base.json DIR/head.json --markdown DIR/compare.md --json
#    DIR/compare.json` (with --threshold / --alpha / --fail-on-unknown when given) and exits with its
#    status. compare pairs the rounds: round k's median of each side ran in the same time slot, so
#    their ratio is one observation, and the verdict is a signed-rank test over the rounds (not a
#    test on the pooled repetitions, which would take one run's spread for the whole noise).
#
# The revisions are resolved in the git repository this script is in.
# Exit status: 0 no regression, 1 a regression (compare's verdict), 2 a usage error or rounds that
# do not match, 3 a build or a benchmark run failed.
#
# Environment:
#   STEPBENCH_AB_CMAKE_ARGS   extra cmake arguments for both builds, split on spaces
#                             (e.g. "-DCMAKE_CUDA_ARCHITECTURES=native" or "-DSTEPBENCH_CUDA=OFF")
#   STEPBENCH_AB_HEAD_ENV     TESTS ONLY: "VAR=VALUE[ VAR=VALUE...]" exported for the HEAD side's
#                             runs only, so that a test can make one side slower (e.g.
#                             "OMP_NUM_THREADS=1 ONEDNN_MAX_CPU_ISA=SSE41" on the cpu backend). Never
#                             set it for a real comparison: the two sides would not run alike.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/ab.sh BASE_REV [HEAD_REV] [options] [-- stepbench flags...]

Builds BASE_REV and HEAD_REV (default HEAD) in temporary git worktrees, runs their stepbench
binaries interleaved (base, head, head, base, ...) on this machine, pools each side's rounds and
gates with `stepbench compare` (HEAD's binary), which pairs round k of each side (a signed-rank test
over the rounds). Exit: 0 no regression, 1 regression (or, with --fail-on-unknown, undecided),
2 usage error, 3 a build or run failed.

Options (before --):
  --rounds N         runs per side, interleaved (default 9, at least 3)
  --out DIR          results: rounds/, base.json, head.json, compare.md, compare.json (default ./ab)
  --threshold PCT    passed to stepbench compare
  --alpha A          passed to stepbench compare
  --fail-on-unknown  passed to stepbench compare: exit 1 when the rounds cannot decide a phase
  --bin-base BIN     use this binary for the base side instead of building BASE_REV
  --bin-head BIN     use this binary for the head side instead of building HEAD_REV
  -h, --help         this text
After --: stepbench's flags, passed as they are to every run (not --json: ab.sh sets it), e.g.
  scripts/ab.sh origin/main -- --backend cpu --model tiny --image-size 64 --batch-size 16 --repetitions 3 --per-layer
EOF
}

die() {  # die STATUS MESSAGE
  echo "ab.sh: $2" >&2
  exit "$1"
}

ROUNDS=9
OUT=ab
BIN_BASE=""
BIN_HEAD=""
REVS=()
COMPARE_OPTS=()
BENCH_FLAGS=()
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help)
      usage
      exit 0
      ;;
    --rounds | --out | --bin-base | --bin-head | --threshold | --alpha)
      [ $# -ge 2 ] || die 2 "$1 needs a value (e.g. $1 X); see --help"
      case $1 in
        --rounds) ROUNDS=$2 ;;
        --out) OUT=$2 ;;
        --bin-base) BIN_BASE=$2 ;;
        --bin-head) BIN_HEAD=$2 ;;
        *) COMPARE_OPTS+=("$1" "$2") ;;
      esac
      shift 2
      ;;
    --rounds=* | --out=* | --bin-base=* | --bin-head=* | --threshold=* | --alpha=*)
      set -- "${1%%=*}" "${1#*=}" "${@:2}"  # --opt=value: split, handle on the next pass
      ;;
    --fail-on-unknown)
      COMPARE_OPTS+=("$1")
      shift
      ;;
    --)
      shift
      BENCH_FLAGS=("$@")
      break
      ;;
    -*)
      die 2 "unknown option '$1'. ab.sh's own options are --rounds, --out, --threshold, --alpha, --fail-on-unknown, --bin-base, --bin-head; stepbench's flags go after '--' (scripts/ab.sh BASE [HEAD] -- $1 ...)"
      ;;
    *)
      REVS+=("$1")
      shift
      ;;
  esac
done

[ ${#REVS[@]} -ge 1 ] || die 2 "give the base revision: scripts/ab.sh BASE_REV [HEAD_REV] [options] [-- stepbench flags] (see --help)"
[ ${#REVS[@]} -le 2 ] || die 2 "too many revisions (${REVS[*]}): give BASE_REV and at most HEAD_REV; stepbench's flags go after '--'"
BASE_REV=${REVS[0]}
HEAD_REV=${REVS[1]:-HEAD}
[[ $ROUNDS =~ ^[0-9]+$ ]] || die 2 "--rounds '$ROUNDS' is not a whole number; give --rounds 3 or more"
ROUNDS=$((10#$ROUNDS))
[ "$ROUNDS" -ge 3 ] || die 2 "--rounds $ROUNDS is too few: a side needs at least 3 rounds for the comparison to mean anything (default 9)"
for f in "${BENCH_FLAGS[@]}"; do
  case $f in
    --json | --json=*) die 2 "drop '$f' from the stepbench flags: ab.sh writes each round's JSON itself (see --out)" ;;
  esac
done

HEAD_ENV=()
if [ -n "${STEPBENCH_AB_HEAD_ENV:-}" ]; then
  read -r -a HEAD_ENV <<<"$STEPBENCH_AB_HEAD_ENV"
  for kv in "${HEAD_ENV[@]}"; do
    [[ $kv =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die 2 "STEPBENCH_AB_HEAD_ENV: '$kv' is not VAR=VALUE"
  done
fi
CMAKE_EXTRA=()
[ -z "${STEPBENCH_AB_CMAKE_ARGS:-}" ] || read -r -a CMAKE_EXTRA <<<"$STEPBENCH_AB_CMAKE_ARGS"

command -v python3 >/dev/null || die 2 "python3 is needed to pool the rounds; install it (Debian: apt-get install python3)"
for b in "$BIN_BASE" "$BIN_HEAD"; do
  [ -z "$b" ] || [ -x "$b" ] || die 2 "'$b' is not an executable file (--bin-base / --bin-head take a built stepbench)"
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# ---- build --------------------------------------------------------------------------------------
TMP=$(mktemp -d "${TMPDIR:-/tmp}/stepbench-ab.XXXXXX")
WORKTREES=()
# shellcheck disable=SC2317  # reached through the EXIT trap
cleanup() {
  local rc=$?
  for wt in "${WORKTREES[@]}"; do
    git -C "$ROOT" worktree remove --force "$wt" >/dev/null 2>&1 || true
  done
  [ ${#WORKTREES[@]} -eq 0 ] || git -C "$ROOT" worktree prune >/dev/null 2>&1 || true
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p "$OUT/rounds"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/rounds/base-*.json "$OUT"/rounds/head-*.json "$OUT"/rounds/*.log \
  "$OUT/base.json" "$OUT/head.json" "$OUT/compare.md" "$OUT/compare.json" "$OUT/compare.err"

resolve() {  # resolve REV -> full commit id
  git -C "$ROOT" rev-parse --verify --quiet "$1^{commit}" ||
    die 2 "'$1' is not a commit in $ROOT (fetch it first: git fetch origin; shallow clones need fetch-depth 0)"
}

build() {  # build SIDE COMMIT: a worktree at COMMIT in $TMP/SIDE, its binary in $TMP/SIDE/build/bin
  local side=$1 commit=$2 wt=$TMP/$1 log=$OUT/build-$1.log t0=$SECONDS
  local launcher=()
  command -v ninja >/dev/null || die 3 "ninja is not installed (Debian: apt-get install ninja-build)"
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  echo "ab.sh: building $side (${commit:0:12}) in $wt; log in $log" >&2
  WORKTREES+=("$wt")
  if ! { git -C "$ROOT" worktree add --detach "$wt" "$commit" &&
    cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTEPBENCH_WERROR=OFF \
      "${launcher[@]}" "${CMAKE_EXTRA[@]}" &&
    ninja -C "$wt/build" stepbench; } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die 3 "building $side (${commit:0:12}) failed; the whole log is $log"
  fi
  [ -x "$wt/build/bin/stepbench" ] || die 3 "building $side gave no $wt/build/bin/stepbench"
  echo "ab.sh: built $side in $((SECONDS - t0)) s" >&2
}

BASE_COMMIT=""
HEAD_COMMIT=""
[ -n "$BIN_BASE" ] || BASE_COMMIT=$(resolve "$BASE_REV")
[ -n "$BIN_HEAD" ] || HEAD_COMMIT=$(resolve "$HEAD_REV")
if [ -z "$BIN_BASE" ] && [ -z "$BIN_HEAD" ] && [ "$BASE_COMMIT" = "$HEAD_COMMIT" ]; then
  echo "ab.sh: $BASE_REV and $HEAD_REV are the same commit (${BASE_COMMIT:0:12}): building once, the same binary runs both sides" >&2
  build base "$BASE_COMMIT"
  BIN_BASE=$TMP/base/build/bin/stepbench
  BIN_HEAD=$BIN_BASE
fi
if [ -z "$BIN_BASE" ]; then
  build base "$BASE_COMMIT"
  BIN_BASE=$TMP/base/build/bin/stepbench
fi
if [ -z "$BIN_HEAD" ]; then
  build head "$HEAD_COMMIT"
  BIN_HEAD=$TMP/head/build/bin/stepbench
fi

# ---- interleaved rounds -------------------------------------------------------------------------
echo "ab.sh: $ROUNDS rounds, base ($BASE_REV: $BIN_BASE) and head ($HEAD_REV: $BIN_HEAD) interleaved; stepbench ${BENCH_FLAGS[*]}" >&2
[ ${#HEAD_ENV[@]} -eq 0 ] || echo "ab.sh: head runs with ${HEAD_ENV[*]} (STEPBENCH_AB_HEAD_ENV, tests only)" >&2
run_side() {  # run_side SIDE ROUND
  local side=$1 k=$2 bin=$BIN_BASE extra=() t0 t1
  if [ "$side" = head ]; then
    bin=$BIN_HEAD
    extra=("${HEAD_ENV[@]}")
  fi
  local json=$OUT/rounds/$side-$k.json log=$OUT/rounds/$side-$k.log
  t0=$EPOCHREALTIME
  if ! env "${extra[@]}" "$bin" "${BENCH_FLAGS[@]}" --json "$json" >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    die 3 "round $k, $side: stepbench failed (log: $log)"
  fi
  t1=$EPOCHREALTIME
  [ -s "$json" ] || die 3 "round $k, $side: stepbench wrote no $json (log: $log)"
  local us=$((${t1//[.,]/} - ${t0//[.,]/}))  # EPOCHREALTIME has 6 decimals: microseconds
  printf 'ab.sh: round %d/%d %-4s %4d.%02d s\n' "$k" "$ROUNDS" "$side" $((us / 1000000)) $((us % 1000000 / 10000)) >&2
}
# the order alternates (base head, head base, base head, ...): a side that always ran second would
# always meet the machine as the first left it (warm caches, a clock that ramped up, a neighbour's
# load that came or went), and that order effect would show up as a difference between the sides
for ((k = 1; k <= ROUNDS; k++)); do
  if ((k % 2)); then
    run_side base "$k"
    run_side head "$k"
  else
    run_side head "$k"
    run_side base "$k"
  fi
done

# ---- pool each side's rounds --------------------------------------------------------------------
pool() {  # pool SIDE
  local files=()
  for ((k = 1; k <= ROUNDS; k++)); do files+=("$OUT/rounds/$1-$k.json"); done
  python3 - "$1" "$OUT/$1.json" "${files[@]}" <<'PY'
import json
import sys

side, out, files = sys.argv[1], sys.argv[2], sys.argv[3:]
# configuration keys that must be the same in every round of one side
KEYS = ("model", "precision", "layout", "batch_size_per_gpu", "gpus", "backend", "device")
MISSING = object()

rounds = []
for f in files:
    try:
        with open(f) as fh:
            rounds.append(json.load(fh))
    except (OSError, ValueError) as e:
        print(f"ab.sh: {side}: cannot read {f}: {e}", file=sys.stderr)
        sys.exit(3)

first = rounds[0].get("context", {})
for f, r in zip(files[1:], rounds[1:]):
    ctx = r.get("context", {})
    for key in KEYS:
        a, b = first.get(key, MISSING), ctx.get(key, MISSING)
        if a != b:
            show = lambda v: "(absent)" if v is MISSING else repr(v)
            print(f"ab.sh: {side}: the rounds disagree in context key '{key}': {show(a)} in {files[0]}, "
                  f"{show(b)} in {f}", file=sys.stderr)
            sys.exit(2)

order, by_name = [], {}
for k, (f, r) in enumerate(zip(files, rounds), start=1):
    its = [b for b in r.get("benchmarks", []) if b.get("run_type", "iteration") != "aggregate"]
    if not its:
        print(f"ab.sh: {side}: {f} has no iteration entries (did --benchmark_filter match nothing?)", file=sys.stderr)
        sys.exit(2)
    for b in its:
        name = b.get("run_name", b.get("name"))
        if name not in by_name:
            by_name[name] = []
            order.append(name)
        b = dict(b)
        b["ab_round"] = k  # stepbench compare pairs round k of base with round k of head
        by_name[name].append(b)

benchmarks = []
for name in order:
    entries = by_name[name]
    for i, b in enumerate(entries):
        b = dict(b)
        b["repetition_index"] = i
        b["repetitions"] = len(entries)
        benchmarks.append(b)

context = dict(first)
context["ab_rounds"] = len(rounds)
context["ab_side"] = side
with open(out, "w") as fh:
    json.dump({"context": context, "benchmarks": benchmarks}, fh, indent=2)
    fh.write("\n")
counts = sorted({len(v) for v in by_name.values()})
print(f"ab.sh: {side}: {len(rounds)} rounds pooled into {out}: {len(order)} benchmarks, "
      f"{'/'.join(map(str, counts))} repetitions each", file=sys.stderr)
PY
}
pool base
pool head

# ---- the gate -----------------------------------------------------------------------------------
set +e
"$BIN_HEAD" compare "$OUT/base.json" "$OUT/head.json" "${COMPARE_OPTS[@]}" \
  --markdown "$OUT/compare.md" --json "$OUT/compare.json" 2>"$OUT/compare.err"
rc=$?
set -e
cat "$OUT/compare.err" >&2
no_compare=0
[ "$rc" -ne 2 ] || ! grep -q "unknown argument 'compare'" "$OUT/compare.err" || no_compare=1
rm -f "$OUT/compare.err"
[ "$no_compare" -eq 0 ] ||
  die 2 "head's stepbench ($BIN_HEAD) has no 'compare' subcommand: build a HEAD that has it. The pooled runs are in $OUT/base.json and $OUT/head.json"
case $rc in
  0) echo "ab.sh: no regression (results in $OUT)" >&2 ;;
  1)
    if grep -q '"regression": false' "$OUT/compare.json" 2>/dev/null; then
      echo "ab.sh: UNKNOWN: the rounds could not decide a phase (--fail-on-unknown; results in $OUT)" >&2
    else
      echo "ab.sh: REGRESSION (results in $OUT; compare.md has the table)" >&2
    fi ;;
  *) echo "ab.sh: stepbench compare failed with exit $rc" >&2 ;;
esac
exit "$rc"
