#!/usr/bin/env bash
# ctest ci.ab: scripts/ab.sh with a built binary on both sides (no builds), on the cpu backend.
#   tests/ci/ab_test.sh STEPBENCH_BIN SOURCE_DIR
# Checks: usage errors exit 2 (--rounds 2, an unknown option); 8 interleaved rounds pool into
# base.json / head.json with 8 x 3 = 24 iteration entries per phase, each tagged with its round,
# "ab_rounds": 8, no aggregates; STEPBENCH_AB_HEAD_ENV reaches the head side's runs only; rounds of
# one side that disagree in a configuration key stop it with exit 2; compare.md and compare.json
# are written, and a head slowed by the binary's test fault (STEPBENCH_FAULT_SLOW_CONV through
# STEPBENCH_AB_HEAD_ENV) is a regression (exit 1) whose report names that shape and direction as
# what moved in the step; the same binary on both sides is no regression at --alpha 0.01 (the
# rounds are paired and the signed-rank test is exact: a false alarm has a chance under 1%, no
# retry); eight lone runs of the binary compared pairwise give no regression. About a minute.
set -euo pipefail

[ $# -eq 2 ] || {
  echo "usage: $0 STEPBENCH_BIN SOURCE_DIR" >&2
  exit 2
}
BIN=$1
SRC=$2
AB=$SRC/scripts/ab.sh
[ -x "$BIN" ] || {
  echo "FAIL: $BIN is not an executable" >&2
  exit 1
}
[ -x "$AB" ] || {
  echo "FAIL: $AB is missing or not executable" >&2
  exit 1
}
command -v python3 >/dev/null || {
  echo "SKIP: python3 not found (ab.sh pools with it)"
  exit 77
}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/stepbench-ab-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

FLAGS=(--backend cpu --model tiny --image-size 32 --batch-size 4 --warmup 1 --repetitions 3
  --phases "forward,step" --benchmark_min_time=0.01)
# One OpenMP thread on both sides: two threads that spin at barriers on 2 cores shared with other
# tests make timings swing by orders of magnitude; one thread keeps base and head comparable.
export OMP_NUM_THREADS=1
fails=0
fail() {
  echo "FAIL: $*" >&2
  fails=$((fails + 1))
}
# expect_rc WANT NAME -- command...: runs it (stderr into $TMP/NAME.err), checks its exit status
expect_rc() {
  local want=$1 name=$2 rc=0
  shift 3
  "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" || rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$name: exit $rc, expected $want; its stderr:"
    sed 's/^/    /' "$TMP/$name.err" >&2
    return 1
  fi
  echo "ok: $name (exit $rc)"
}

# ---- usage errors -------------------------------------------------------------------------------
if expect_rc 2 rounds2 -- "$AB" HEAD --bin-base "$BIN" --bin-head "$BIN" --rounds 2 --out "$TMP/r2" -- "${FLAGS[@]}"; then
  grep -q "at least 3" "$TMP/rounds2.err" || fail "rounds2: the message does not say the least number of rounds"
fi
if expect_rc 2 unknown_option -- "$AB" HEAD --bin-base "$BIN" --bin-head "$BIN" --no-such-option --out "$TMP/u" -- "${FLAGS[@]}"; then
  grep -q -- "--no-such-option" "$TMP/unknown_option.err" || fail "unknown_option: the message does not name the option"
fi
expect_rc 0 help -- "$AB" --help || true
grep -q "Usage: scripts/ab.sh BASE_REV" "$TMP/help.out" || fail "help: no usage line"

# ---- does this binary have `stepbench compare`? -------------------------------------------------
# Without the subcommand, `stepbench compare --help` still exits 0 (the main --help wins), so the
# help text must also name the subcommand.
has_compare=0
if "$BIN" compare --help >"$TMP/compare-help.txt" 2>&1 && grep -q "compare" "$TMP/compare-help.txt"; then
  has_compare=1
fi

# ---- the main run: the same binary on both sides ------------------------------------------------
# pooled.py DIR: the pooling checks on DIR/base.json and DIR/head.json
cat >"$TMP/pooled.py" <<'PY'
import json, sys, collections
d, R, fails = sys.argv[1], int(sys.argv[2]), 0
def fail(msg):
    global fails
    print("FAIL: pooled " + msg, file=sys.stderr)
    fails += 1
for side in ("base", "head"):
    try:
        with open(f"{d}/{side}.json") as fh:
            j = json.load(fh)
    except (OSError, ValueError) as e:
        fail(f"{side}.json: {e}")
        continue
    ctx, bms = j.get("context", {}), j.get("benchmarks", [])
    if ctx.get("ab_rounds") != R: fail(f"{side}: context ab_rounds is {ctx.get('ab_rounds')!r}, not {R}")
    if ctx.get("ab_side") != side: fail(f"{side}: context ab_side is {ctx.get('ab_side')!r}")
    if ctx.get("model") != "tiny": fail(f"{side}: context model is {ctx.get('model')!r}, not the first round's 'tiny'")
    agg = [b["name"] for b in bms if b.get("run_type") != "iteration"]
    if agg: fail(f"{side}: entries that are not iterations: {agg[:3]}")
    per = collections.defaultdict(list)
    for b in bms:
        per[b["run_name"].split("/")[5] if b["run_name"].count("/") >= 5 else b["run_name"]].append(b)
    if sorted(per) != ["forward", "step"]: fail(f"{side}: phases {sorted(per)}, expected forward and step")
    for phase, es in per.items():
        if len(es) != 3 * R: fail(f"{side} {phase}: {len(es)} iteration entries, expected {R} rounds x 3 repetitions")
        rounds = collections.Counter(e.get("ab_round") for e in es)
        if rounds != collections.Counter({k: 3 for k in range(1, R + 1)}):
            fail(f"{side} {phase}: entries per round {dict(rounds)}, expected 3 in each of rounds 1..{R}")
        if sorted(e.get("repetition_index") for e in es) != list(range(len(es))):
            fail(f"{side} {phase}: repetition_index not renumbered 0..{len(es) - 1}")
        if {e.get("repetitions") for e in es} != {len(es)}:
            fail(f"{side} {phase}: 'repetitions' is {sorted({e.get('repetitions') for e in es})}, not {len(es)}")
        if not all(isinstance(e.get("real_time"), (int, float)) and e["real_time"] > 0 for e in es):
            fail(f"{side} {phase}: an entry without a positive real_time")
    print(f"ok: pooled {side}.json: " + ", ".join(f"{p} {len(e)}" for p, e in sorted(per.items())))
sys.exit(1 if fails else 0)
PY

# the order of the runs: base head, head base, base head, ... (alternating)
ROUNDS=8
check_interleaved() {  # check_interleaved NAME
  local got want="" k
  got=$(sed -n "s/^ab\.sh: round \([0-9]*\)\/$ROUNDS \([a-z]*\) .*/\1\2/p" "$TMP/$1.err" | tr '\n' ' ')
  for ((k = 1; k <= ROUNDS; k++)); do
    if ((k % 2)); then want+="${k}base ${k}head "; else want+="${k}head ${k}base "; fi
  done
  [ "$got" = "$want" ] || fail "$1: runs not interleaved, alternating, per round: '$got'"
}

want=2  # ab.sh says the head binary has no compare subcommand
[ "$has_compare" -eq 0 ] || want=0
# The rounds are paired by time slot and judged by an exact signed-rank test over them: whatever a
# shared machine does to one run moves one observation, and identical binaries are called a
# regression with a chance under alpha (0.01 here), however noisy the machine.
rc=0
"$AB" HEAD --bin-base "$BIN" --bin-head "$BIN" --rounds $ROUNDS --alpha 0.01 --out "$TMP/same" -- "${FLAGS[@]}" \
  >"$TMP/same.out" 2>"$TMP/same.err" || rc=$?
if [ "$rc" -ne "$want" ]; then
  fail "same: exit $rc, expected $want; its stdout and stderr:"
  sed 's/^/    /' "$TMP/same.out" "$TMP/same.err" >&2
fi
check_interleaved same
for ((k = 1; k <= ROUNDS; k++)); do
  for side in base head; do
    [ -s "$TMP/same/rounds/$side-$k.json" ] || fail "same: no rounds/$side-$k.json"
  done
done
python3 "$TMP/pooled.py" "$TMP/same" "$ROUNDS" || fails=$((fails + 1))

# ---- eight lone runs of the binary, compared pairwise: no regression ----------------------------
# Two lone runs are judged with the stated run-to-run noise of the cpu backend (35%): the same
# binary's runs differ by chance (on a 2-core VM by up to 4.7x), and that is no regression. A gate
# that holds alpha calls an A/A pair a regression with a chance of up to alpha, so 7 pairs at the
# default 0.05 would fail here up to 7 x 5% of the time with the code right; at 0.0001, 0.07%, and a
# pair must then differ by exp(z(1 - 0.0001/2) sqrt(2) 35%) = 6.9x, beyond the 4.7x measured. The
# old gate (the repetitions as the evidence) calls pairs whose runs ran at different speeds
# regressions at any alpha: 12 repetitions a side let its U test (normal beyond 8 a side, as scipy's)
# reach p < 0.0001 / 2; 9 would not.
if [ "$has_compare" -eq 1 ]; then
  for k in 1 2 3 4 5 6 7 8; do
    "$BIN" --backend cpu --model tiny --image-size 32 --batch-size 4 --warmup 1 --repetitions 12 \
      --phases "forward,step" --benchmark_min_time=0.01 --json "$TMP/lone-$k.json" >/dev/null 2>&1 ||
      fail "lone run $k failed"
  done
  lone_alarms=0
  for k in 1 2 3 4 5 6 7; do
    rc=0
    "$BIN" compare --alpha 0.0001 "$TMP/lone-$k.json" "$TMP/lone-$((k + 1)).json" >"$TMP/lone-$k.out" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { lone_alarms=$((lone_alarms + 1)); sed 's/^/    /' "$TMP/lone-$k.out" >&2; }
  done
  if [ "$lone_alarms" -eq 0 ]; then
    echo "ok: 7 pairs of lone runs, no regression ($(grep -h -o -m1 'unknown\|no change' "$TMP"/lone-*.out | sort | uniq -c | tr -s ' \n' ' '))"
  else
    fail "lone runs: $lone_alarms of 7 pairs of one binary's runs exited non-zero"
  fi
fi

# ---- a head slowed by the binary's test fault: a regression ------------------------------------
# STEPBENCH_FAULT_SLOW_CONV=<shape>/fwd*20 (tests only): that convolution's forward runs 21 times,
# several times slower forward and step; the machine and configuration stay the same for compare.
convs=$("$BIN" "${FLAGS[@]}" --per-layer --list 2>/dev/null | grep -o 'conv:[^/]*' || true)
shape=$(grep -m1 '>24:' <<<"$convs" || head -n1 <<<"$convs")
has_fault=0
if [ -z "$shape" ]; then
  fail "slow_head: no conv shape in '$BIN ${FLAGS[*]} --per-layer --list'"
else
  rc=0
  STEPBENCH_AB_HEAD_ENV="STEPBENCH_FAULT_SLOW_CONV=$shape/fwd*20" \
    "$AB" HEAD --bin-base "$BIN" --bin-head "$BIN" --rounds $ROUNDS --out "$TMP/slow" -- "${FLAGS[@]}" --per-layer \
    >"$TMP/slow_head.out" 2>"$TMP/slow_head.err" || rc=$?
  check_interleaved slow_head
  if grep -q "test fault" "$TMP/slow/rounds/head-1.log" 2>/dev/null; then
    has_fault=1
    if grep -q "test fault" "$TMP"/slow/rounds/base-*.log; then fail "slow_head: the base side ran with the fault too"; fi
  fi
  want=2  # no compare subcommand
  [ "$has_compare" -eq 0 ] || want=1
  if [ "$has_fault" -eq 0 ]; then
    fail "slow_head: $BIN ignores STEPBENCH_FAULT_SLOW_CONV"
  elif [ "$rc" -ne "$want" ]; then
    fail "slow_head ($shape/fwd*20 on head): exit $rc, expected $want; its stdout and stderr:"
    sed 's/^/    /' "$TMP/slow_head.out" "$TMP/slow_head.err" >&2
  else
    echo "ok: slow_head (exit $rc; the fault $([ "$has_fault" -eq 1 ] && echo "ran on head only" || echo "is not in this binary"))"
  fi
fi

# ---- STEPBENCH_AB_HEAD_ENV on the head side only; rounds that disagree stop the pooling ---------
# Both sides run recorders: each notes the AB_TEST_* variables it was given, then runs the binary;
# the base one also edits the context of the JSON its second run (base round 2) wrote.
for side in base head; do
  cat >"$TMP/rec-$side.sh" <<EOF
#!/usr/bin/env bash
n=\$(wc -l <"$TMP/$side.calls" 2>/dev/null || echo 0)
echo "\${AB_TEST_ONE:-unset} \${AB_TEST_TWO:-unset}" >>"$TMP/$side.calls"
"$BIN" "\$@" || exit
[ "$side" = base ] && [ "\$n" -eq 1 ] || exit 0
python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); j["context"]["batch_size_per_gpu"] = "999"; json.dump(j, open(sys.argv[1], "w"))' "\${!#}"
EOF
  chmod +x "$TMP/rec-$side.sh"
done
if STEPBENCH_AB_HEAD_ENV="AB_TEST_ONE=1 AB_TEST_TWO=two" expect_rc 2 drift -- \
  "$AB" HEAD --bin-base "$TMP/rec-base.sh" --bin-head "$TMP/rec-head.sh" --rounds 3 --out "$TMP/drift" -- "${FLAGS[@]}"; then
  grep -q "context key 'batch_size_per_gpu'" "$TMP/drift.err" || fail "drift: the message does not name batch_size_per_gpu"
fi
got_base=$(tr '\n' ',' <"$TMP/base.calls" 2>/dev/null || true)
got_head=$(tr '\n' ',' <"$TMP/head.calls" 2>/dev/null || true)
if [ "$got_base" = "unset unset,unset unset,unset unset," ] && [ "$got_head" = "1 two,1 two,1 two," ]; then
  echo "ok: STEPBENCH_AB_HEAD_ENV reached the head side's 3 runs only"
else
  fail "STEPBENCH_AB_HEAD_ENV: base runs saw '$got_base', head runs '$got_head' (want 'unset unset' x3, '1 two' x3)"
fi

# ---- the comparison -----------------------------------------------------------------------------
[ "$has_compare" -eq 1 ] || fail "$BIN has no 'compare' subcommand"
for d in same slow; do
  [ -s "$TMP/$d/compare.md" ] || fail "$d: no compare.md"
  python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$TMP/$d/compare.json" 2>/dev/null ||
    fail "$d: compare.json missing or not JSON"
done
# the slowed head: the step regressed, and what moved in it is the slowed shape's forward
python3 - "$TMP/slow/compare.json" "$shape" <<'PY' || fail "slow: the report does not name the slowed layer"
import json, sys
j, shape = json.load(open(sys.argv[1])), sys.argv[2]
step = next(b for b in j["benchmarks"] if b["benchmark"].endswith("/step"))
moved = step.get("layers_moved", [])
print(f"slow: step {step['status']} ({step['change']:+.1%}); moved: "
      + "; ".join(f"{m['shape']} {m['direction']} {m['share']:.0%}" for m in moved))
ok = step["status"] == "regression" and moved and moved[0]["shape"] == shape and moved[0]["direction"] == "forward"
sys.exit(0 if ok else 1)
PY
if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed" >&2
  exit 1
fi
echo "all ab.sh checks passed"
