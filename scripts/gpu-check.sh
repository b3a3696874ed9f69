#!/usr/bin/env bash
# The GPU checks, in stages that each fit one 10-minute command and write at most 3 files into OUT
# (a log, a JSON, a tar.gz of the rest):
#   gpu-check.sh tests OUT    every GPU test, then the cuda op and step tests again with batch norm and
#                             pooling on stepbench's own kernels (STEPBENCH_CUDA_OWN_KERNELS=1)
#   gpu-check.sh bench OUT    Inception-v3, batch 128 per GPU: fp32 NCHW, tf32 NHWC, bf16 NHWC, fp16 NHWC,
#                             forward, forward_backward and step, each also replayed as a CUDA Graph;
#                             then ResNet-50 bf16 NHWC at batch 256 the same way (MLPerf's configuration)
#   gpu-check.sh peer OUT [BENCH_JSON]
#                             the same configurations in PyTorch on the same GPU (eager with autocast or
#                             TF32 as stepbench, then torch.compile); images/s ratios against OUT/bench.json
#                             or BENCH_JSON
#   gpu-check.sh layers OUT   where the time goes: Inception-v3 bf16 NHWC, --layer-times and --trace (the
#                             trace checked as the CPU test checks it), a one-GPU --sweep-batch with
#                             and without --recompute on, --peer pytorch (time and memory)
#   gpu-check.sh input OUT    the input fixtures on the GPU: a JPEG folder decoded on the GPU (--decode gpu) and
#                             on the CPU, each with --suggest, its record file, synthetic-host
#   gpu-check.sh ranks OUT    several NCCL ranks (on one GPU: NCCL_HOSTID per process before NCCL 2.30):
#                             Dist.* under stepbench launch (2, 4) and a file rendezvous by hand, the
#                             binary on 2 ranks in every mode with and without overlap; 4 ranks as 2
#                             nodes (distributed_all_reduce over NCCL communicators split by node)
#   gpu-check.sh ranks-faults OUT  a stopped, a killed, a late (NCCL's initialisation), a stalled (its
#                             first sync) and a missing rank; Inception-v3 on 2 ranks, bf16, --cuda-graph, fp32
#   gpu-check.sh fused OUT    the fused conv + BN units (--fuse): their op and whole-net tests on the GPU,
#                             then ResNet-50 bf16 NHWC batch 256 and Inception-v3 bf16 NHWC batch 128 with
#                             --fuse off and on (the step replayed as a CUDA Graph), ResNet-50's --layer-times
#   gpu-check.sh zoo OUT      the model zoo: the ops it added (bias + ReLU, adaptive pooling, ReLU6,
#                             grouped and depthwise convolutions) on the GPU, then the step of
#                             ResNet-101/152, VGG-16, AlexNet, DenseNet-121 and MobileNet-v2, bf16 NHWC
#                             (configs/<model>-bf16-nhwc.toml's batches), as a CUDA Graph
#   gpu-check.sh all OUT      tests, bench, peer in turn
# STEPBENCH_CHECK_TESTS / STEPBENCH_CHECK_OWN_TESTS replace the tests stage's two gtest filters;
# STEPBENCH_CHECK_IMAGES sets the input stage's folder size (default 512).
# STEPBENCH_CHECK_STAGE_S sets each stage's budget in seconds (default 480): what would not fit in what is
# left of it is skipped, saying so (the bench stage starts no configuration past 330/480 of it).
# STEPBENCH_PEER_COMPILE=bf16-nhwc,... limits the torch.compile runs (each compiles for 1-3 minutes;
# default all); STEPBENCH_CHECK_BATCH sets the batch (default 128); STEPBENCH_CHECK_CONFIGS limits the
# bench and peer configurations ("bf16-nhwc,fp32-nchw,bf16-nhwc-own"; default all five).
# Runs from a bundle made by scripts/gpu-bundle.sh (bin/ and lib/ beside this script), or from a
# checkout with a CUDA build in ${STEPBENCH_BUILD_DIR:-build-gpu} (made here when missing).
# cuDNN, cuBLAS and NCCL are taken from the CUDA toolkit's folder, else from the Python wheels
# (nvidia/*/lib of ${STEPBENCH_PYTHON:-python3}); the files used are printed.
# Exit: 0 all passed; 1 a test or run failed; 2 no GPU, a build without CUDA, or a usage error.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${STEPBENCH_PYTHON:-python3}

usage() {
  sed -n '2,43p' "${BASH_SOURCE[0]}" >&2
  exit 2
}
[ $# -ge 2 ] || usage
STAGE=$1
OUT_DIR=$2
BENCH_JSON=${3:-}
case $STAGE in tests|bench|peer|layers|input|ranks|ranks-faults|fused|zoo|all) ;; *) echo "gpu-check: unknown stage '$STAGE'" >&2; usage ;; esac
mkdir -p "$OUT_DIR" || exit 2
OUT_DIR=$(cd "$OUT_DIR" && pwd)

# ---- the GPU, the build ---------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "gpu-check: no NVIDIA GPU visible (nvidia-smi -L lists none); run it on a machine with one." >&2
  echo "  On a machine without a GPU, scripts/test.sh runs the CPU tests." >&2
  exit 2
fi
GPUS=$(nvidia-smi -L | grep -c '^GPU ')
if [ -x "$HERE/bin/stepbench" ]; then
  BIN=$HERE/bin
  PEER=$HERE/bench/torch_peer.py
else  # a checkout: scripts/ is HERE
  ROOT=$(cd "$HERE/.." && pwd)
  BUILD_DIR=${STEPBENCH_BUILD_DIR:-$ROOT/build-gpu}
  BIN=$BUILD_DIR/bin
  PEER=$ROOT/bench/torch_peer.py
  if [ ! -x "$BIN/stepbench" ] || [ ! -x "$BIN/stepbench_tests" ]; then
    source "$ROOT/scripts/common.sh"
    [ "$(id -u)" -eq 0 ] && sb_install_deps
    sb_build "$BUILD_DIR" -DSTEPBENCH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-native}" \
      -DSTEPBENCH_BUILD_TESTS=ON || exit 1
  fi
fi

# ---- the CUDA libraries ---------------------------------------------------------------------------

# find_lib NAME: the first folder holding NAME, from the toolkit, then the Python wheels
wheel_dirs() {
  "$PY" - 2>/dev/null <<'PY'
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
try:
    import torch
    roots.append(os.path.join(os.path.dirname(torch.__file__), "lib"))
except Exception:
    pass
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "**", "lib"), recursive=True)) + [r]:
        print(d)
PY
}
CUDA_DIRS=("${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
mapfile -t WHEEL_DIRS < <(wheel_dirs)
find_lib() {
  local d
  for d in "${CUDA_DIRS[@]}" "${WHEEL_DIRS[@]}"; do
    if [ -e "$d/$1" ]; then echo "$d"; return 0; fi
  done
  return 1
}
LIB_PATH=""
[ -d "$HERE/lib" ] && [ -x "$HERE/bin/stepbench" ] && LIB_PATH=$HERE/lib
LIBS_FOUND=""
for lib in libcudnn.so.9 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  if ! d=$(find_lib "$lib"); then
    echo "gpu-check: $lib not found in ${CUDA_DIRS[*]} nor in $PY's nvidia wheels; install it or set CUDA_HOME" >&2
    exit 2
  fi
  real=$(readlink -f "$d/$lib")
  LIBS_FOUND+="  $lib: $real"$'\n'
  case ":$LIB_PATH:" in *":$d:"*) ;; *) LIB_PATH=${LIB_PATH:+$LIB_PATH:}$d ;; esac
done
# optional, loaded at run time: CUPTI (the kernel names of --trace and --layer-times), nvJPEG (--decode gpu)
for lib in libcupti.so.13 libnvjpeg.so.13; do
  if d=$(find_lib "$lib"); then
    LIBS_FOUND+="  $lib: $(readlink -f "$d/$lib")"$'\n'
    case ":$LIB_PATH:" in *":$d:"*) ;; *) LIB_PATH=${LIB_PATH:+$LIB_PATH:}$d ;; esac
  else
    LIBS_FOUND+="  $lib: not found (optional)"$'\n'
  fi
done
export LD_LIBRARY_PATH=$LIB_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

if ! version=$("$BIN/stepbench" --version 2>&1); then
  echo "gpu-check: $BIN/stepbench does not start:" >&2
  echo "$version" >&2
  exit 1
fi
if ! grep -q '^cuda backend: on' <<<"$version"; then
  echo "gpu-check: $BIN/stepbench was built without the cuda backend; refusing to skip every GPU test." >&2
  echo "  Build with -DSTEPBENCH_CUDA=ON (scripts/gpu-bundle.sh does)." >&2
  exit 2
fi

header() {
  echo "== gpu-check $1: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader
  echo "$version"
  [ -f "$HERE/BUNDLE.txt" ] && sed -n 's/^commit: /bundle commit: /p' "$HERE/BUNDLE.txt"
  echo "CUDA libraries used:"
  printf '%s' "$LIBS_FOUND"
}

# ---- stages ---------------------------------------------------------------------------------------
stage_tests() {
  local rc=0 tmp=$OUT_DIR/tests-files
  mkdir -p "$tmp"
  header tests
  echo "== GPU tests (cuDNN batch norm and pooling where cuDNN takes them)"
  "$BIN/stepbench_tests" --gtest_filter="${STEPBENCH_CHECK_TESTS:-*cuda*:*Cuda*:Nccl.*:GpuDecode.*:Feeder.*}" --gtest_brief=1 \
    --gtest_output="json:$OUT_DIR/tests.json" || rc=1
  echo "== the cuda op and step tests with batch norm and pooling on stepbench's kernels"
  STEPBENCH_CUDA_OWN_KERNELS=1 "$BIN/stepbench_tests" \
    --gtest_filter="${STEPBENCH_CHECK_OWN_TESTS:-*Ops.*cuda*:*CudaStep*:*CudaTinyStep*:*CudaUnits*}" --gtest_brief=1 \
    --gtest_output="json:$tmp/tests-own-kernels.json" || rc=1
  # a run where every GPU test skipped is not a pass
  "$PY" - "$OUT_DIR/tests.json" "$tmp/tests-own-kernels.json" <<'PY' || rc=1
import json, sys
bad = 0
for path in sys.argv[1:]:
    d = json.load(open(path))
    ran = skipped = failed = 0
    for s in d["testsuites"]:
        for t in s["testsuite"]:
            if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                skipped += 1
            else:
                ran += 1
                failed += bool(t.get("failures"))
    print(f"{path.split('/')[-1]}: {ran} ran, {failed} failed, {skipped} skipped")
    if ran == 0 or failed:
        bad = 1
sys.exit(bad)
PY
  if [ "$GPUS" -ge 2 ]; then
    echo "== gradient sync over $GPUS GPUs (NCCL, one process)"
    "$BIN/stepbench" --backend cuda --model inception_v3 --gpus "$GPUS" --batch-size 64 --phases step,grad_sync \
      --warmup 5 --repetitions 3 --json "$tmp/towers-$GPUS.json" || rc=1
  fi
  tar -C "$OUT_DIR" -czf "$OUT_DIR/tests.tar.gz" tests-files && rm -rf "$tmp"
  echo "== tests: $([ $rc -eq 0 ] && echo passed || echo FAILED)"
  return $rc
}

# "own": batch norm and pooling on stepbench's kernels (--own-kernels), the fallback where cuDNN declines
CONFIGS=("fp32 nchw" "tf32 nhwc" "bf16 nhwc" "fp16 nhwc" "bf16 nhwc own")
if [ -n "${STEPBENCH_CHECK_CONFIGS:-}" ]; then
  picked=()
  for c in "${CONFIGS[@]}"; do
    case ",$STEPBENCH_CHECK_CONFIGS," in *",${c// /-},"*) picked+=("$c") ;; esac
  done
  [ ${#picked[@]} -gt 0 ] || { echo "gpu-check: STEPBENCH_CHECK_CONFIGS=$STEPBENCH_CHECK_CONFIGS names none of: ${CONFIGS[*]// /-}" >&2; exit 2; }
  CONFIGS=("${picked[@]}")
fi
BATCH=${STEPBENCH_CHECK_BATCH:-128}
STAGE_S=${STEPBENCH_CHECK_STAGE_S:-480}
[[ $STAGE_S =~ ^[0-9]+$ ]] || { echo "gpu-check: STEPBENCH_CHECK_STAGE_S takes whole seconds, not '$STAGE_S'" >&2; exit 2; }

stage_bench() {
  local rc=0 tmp=$OUT_DIR/bench-files
  mkdir -p "$tmp"
  header bench
  local start=$SECONDS
  for c in "${CONFIGS[@]}"; do
    set -- $c
    local own=${3:-} name="inception_v3-$1-$2${3:+-$3}-b$BATCH"
    # the stage ends within 8 minutes: a configuration that could not finish in time is listed as
    # skipped (on an H100 each took 30-40 s, planning included)
    if [ $((SECONDS - start)) -gt $((STAGE_S * 330 / 480)) ]; then
      echo "skipped: the bench stage's $STAGE_S s budget" > "$tmp/$name.err"
      continue
    fi
    echo "== $name"
    if ! timeout 150 "$BIN/stepbench" --backend cuda --model inception_v3 --batch-size "$BATCH" --precision "$1" --format "$2" \
        --phases forward,forward_backward,step --cuda-graph --warmup 5 --repetitions 5 ${own:+--own-kernels} \
        --plan-cache "$tmp/plans.json" --json "$tmp/$name.json" > "$tmp/$name.txt" 2> "$tmp/$name.err"; then
      rc=1
      echo "failed:"; tail -5 "$tmp/$name.err"
    fi
    sed -n '/^phase/,$p' "$tmp/$name.txt" | head -20
  done
  # ResNet-50 v1.5 as the published figures run it (MLPerf Training, NVIDIA's DeepLearningExamples):
  # bf16 NHWC, batch 256, CUDA Graph replay; its summary here, its JSON in the tar.gz
  local rn=resnet50-bf16-nhwc-b256
  if [ $((SECONDS - start)) -gt $((STAGE_S * 330 / 480)) ]; then
    echo "== $rn skipped: the bench stage's $STAGE_S s budget"
  else
    echo "== $rn"
    if ! timeout 150 "$BIN/stepbench" --backend cuda --model resnet50 --batch-size 256 --precision bf16 --format nhwc \
        --phases forward,forward_backward,step --cuda-graph --warmup 5 --repetitions 5 \
        --plan-cache "$tmp/plans.json" --json "$tmp/$rn.json" > "$tmp/$rn.txt" 2> "$tmp/$rn.err"; then
      rc=1
      echo "failed:"; tail -5 "$tmp/$rn.err"
    fi
    sed -n '/^phase/,$p' "$tmp/$rn.txt" | head -20
  fi
  "$PY" - "$tmp" "$OUT_DIR/bench.json" "$BATCH" <<'PY' || rc=1
import glob, json, os, statistics, sys
tmp, out, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = []
for err in sorted(glob.glob(os.path.join(tmp, "inception_v3-*.err"))):  # one per configuration, run or not
    path = err[:-4] + ".json"
    parts = os.path.basename(path)[:-5].split("-")
    prec, fmt, own = parts[1], parts[2], len(parts) == 5
    row = {"precision": prec, "layout": fmt + ("+own" if own else ""), "batch": batch}
    try:
        d = json.load(open(path))
    except Exception:
        lines = [l for l in open(err).read().strip().splitlines() if l and not l.startswith("***WARNING***")]
        said = [l for l in lines if l.startswith(("stepbench:", "skipped:"))]
        row["error"] = (said or lines or ["failed"])[-1] + ("" if os.path.exists(path) or said else " (no JSON)")
        rows.append(row)
        continue
    med, host = {}, {}
    for b in d["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        phase = b["run_name"].replace("/manual_time", "").split("/repeats")[0].split("/")[-1]
        med.setdefault(phase, []).append(b["real_time"])
        if "host_ms" in b:
            host.setdefault(phase, []).append(b["host_ms"])
    row["ms"] = {k: statistics.median(v) for k, v in med.items()}
    row["host_ms"] = {k: statistics.median(v) for k, v in host.items()}
    ctx = d["context"]
    row["kernels"] = {k: ctx.get(k, "?") for k in ("batch_norm_kernels", "pool_kernels", "conv_algorithms",
                                                   "cudnn_fallbacks", "cudnn_plans_searched", "cudnn_plans_reused")}
    row["context"] = {k: ctx.get(k) for k in ("device", "cudnn", "cublas", "nccl", "cuda_driver", "cuda_runtime")}
    rows.append(row)
json.dump({"batch": batch, "rows": rows}, open(out, "w"), indent=1)
nan = float("nan")
print(f"\n{'precision':<9} {'layout':<6} {'forward':>9} {'fwd+bwd':>9} {'step':>9} {'images/s':>9} {'graph fwd':>9} "
      f"{'graph step':>10} {'graph img/s':>11} {'gap ms':>7}   (ms, median; batch {batch}, device time)")
for r in rows:
    if "error" in r:
        print(f"{r['precision']:<9} {r['layout']:<6} not run: {r['error']}")
        continue
    m, h = r["ms"], r["host_ms"]
    st, gst = m.get("step", nan), m.get("step:cuda_graph", nan)
    gap = h.get("step", nan) - st
    print(f"{r['precision']:<9} {r['layout']:<6} {m.get('forward', nan):>9.2f} {m.get('forward_backward', nan):>9.2f} "
          f"{st:>9.2f} {1000 * batch / st:>9.0f} {m.get('forward:cuda_graph', nan):>9.2f} {gst:>10.2f} "
          f"{1000 * batch / gst:>11.0f} {gap:>7.2f}")
steps = {(r["precision"], r["layout"]): r["ms"].get("step:cuda_graph", nan) for r in rows if "ms" in r}
for a, b in ((("bf16", "nhwc"), ("fp16", "nhwc")), (("bf16", "nhwc+own"), ("fp16", "nhwc"))):
    if a in steps and b in steps:
        print(f"step ratio {a[0]} {a[1]} / {b[0]} {b[1]} (graph replay): {steps[a] / steps[b]:.3f} "
              "(the goal: at most 1.10)")
print("\nwhat ran (after warm-up):")
for r in rows:
    if "kernels" in r:
        k = r["kernels"]
        print(f"  {r['precision']:<5} {r['layout']:<5} batch norm: {k['batch_norm_kernels']}\n"
              f"              pooling: {k['pool_kernels']}\n              convolutions: {k['conv_algorithms']}\n"
              f"              fallbacks: {k['cudnn_fallbacks']}\n"
              f"              plans searched {k['cudnn_plans_searched']}, reused {k['cudnn_plans_reused']}")
sys.exit(1 if any("error" in r for r in rows) else 0)
PY
  if grep -h "cuDNN declined" "$tmp"/*.err 2>/dev/null | sort | uniq -c | grep .; then
    echo "(the lines above: cuDNN declined these; stepbench's kernels ran them)"
  fi
  tar -C "$OUT_DIR" -czf "$OUT_DIR/bench.tar.gz" bench-files && rm -rf "$tmp"
  echo "== bench: $([ $rc -eq 0 ] && echo done || echo FAILED)"
  return $rc
}

stage_peer() {
  local rc=0 tmp=$OUT_DIR/peer-files start=$SECONDS
  mkdir -p "$tmp"
  header peer
  if ! "$PY" -c 'import torch, torchvision, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu-check: $PY has no CUDA-enabled torch and torchvision; set STEPBENCH_PYTHON to one that has" >&2
    return 2
  fi
  for mode in eager compile; do
    for c in "${CONFIGS[@]}"; do
      set -- $c
      local name="peer-$mode-$1-$2" extra=() phases=forward,forward_backward,step
      if [ "$mode" = compile ]; then
        extra=(--compile)
        phases=step
        case ",${STEPBENCH_PEER_COMPILE:-all}," in
          *",all,"*|*",$1-$2,"*) ;;
          *) echo "{\"skipped\": \"not in STEPBENCH_PEER_COMPILE\"}" > "$tmp/$name.json"; continue ;;
        esac
      fi
      # the stage ends within 8 minutes; torch.compile took 1-3 minutes per configuration on an H100
      local limit=$([ "$mode" = compile ] && echo 200 || echo 120)
      if [ $((SECONDS - start + limit)) -gt "$STAGE_S" ]; then
        echo "{\"skipped\": \"the peer stage's $STAGE_S s budget\"}" > "$tmp/$name.json"
        continue
      fi
      echo "== $name"
      if PYTHONUNBUFFERED=1 timeout "$limit" "$PY" "$PEER" --device cuda --model inception_v3 --batch-size "$BATCH" \
          --precision "$1" --format "$2" --phases "$phases" --warmup 5 --repetitions 5 --calls 2 "${extra[@]}" \
          > "$tmp/$name.out" 2> "$tmp/$name.err"; then
        tail -n 1 "$tmp/$name.out" > "$tmp/$name.json"
      else
        rc=1
        echo "{\"error\": $("$PY" -c 'import json,sys; t=open(sys.argv[1]).read().strip().splitlines(); print(json.dumps(t[-1] if t else "failed"))' "$tmp/$name.err")}" > "$tmp/$name.json"
        tail -3 "$tmp/$name.err"
      fi
    done
  done
  [ -n "$BENCH_JSON" ] || BENCH_JSON=$OUT_DIR/bench.json
  "$PY" - "$tmp" "$BENCH_JSON" "$OUT_DIR/peer.json" "$BATCH" <<'PY' || rc=1
import json, os, sys
tmp, bench_path, out, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
bench = {}
if os.path.exists(bench_path):
    for r in json.load(open(bench_path))["rows"]:
        bench[(r["precision"], r["layout"])] = r.get("ms", {})
peer = {}
for f in sorted(os.listdir(tmp)):
    if f.endswith(".json"):
        _, mode, prec, fmt = f[:-5].split("-")
        try:
            peer[(mode, prec, fmt)] = json.load(open(os.path.join(tmp, f)))
        except Exception as e:  # a run cut off or printing something else last
            peer[(mode, prec, fmt)] = {"error": f"no JSON from the peer ({e})"}
json.dump({"batch": batch, "peer": {"-".join(k): v for k, v in peer.items()},
           "stepbench": {"-".join(k): v for k, v in bench.items()}}, open(out, "w"), indent=1)
nan = float("nan")
print(f"\nPyTorch on the same GPU, batch {batch}, device time between CUDA events (ms, median); "
      "ratio = stepbench images/s / PyTorch images/s (above 1: stepbench faster)")
print(f"{'precision':<9} {'layout':<6} {'mode':<8} {'PT fwd':>8} {'PT f+b':>8} {'PT step':>8} {'PT img/s':>9} "
      f"{'SB step':>8} {'SB graph':>8} {'ratio':>6} {'ratio graph':>11}")
for (mode, prec, fmt), p in sorted(peer.items(), key=lambda kv: (kv[0][0] != "eager", kv[0])):
    if "error" in p or "skipped" in p:
        print(f"{prec:<9} {fmt:<6} {mode:<8} not run: {p.get('error', p.get('skipped'))}")
        continue
    sb = bench.get((prec, fmt), {})
    st = p.get("step", nan)
    sbs, sbg = sb.get("step", nan), sb.get("step:cuda_graph", nan)
    print(f"{prec:<9} {fmt:<6} {mode:<8} {p.get('forward', nan):>8.2f} {p.get('forward_backward', nan):>8.2f} "
          f"{st:>8.2f} {1000 * batch / st:>9.0f} {sbs:>8.2f} {sbg:>8.2f} {st / sbs:>6.2f} {st / sbg:>11.2f}")
if not bench:
    print(f"(no stepbench figures: {bench_path} missing; run the bench stage first or pass its bench.json)")
PY
  tar -C "$OUT_DIR" -czf "$OUT_DIR/peer.tar.gz" peer-files && rm -rf "$tmp"
  echo "== peer: $([ $rc -eq 0 ] && echo done || echo FAILED)"
  return $rc
}

# Where the time goes on the GPU (issue 18's GPU check): the probed step's layer times against the
# step, the trace checked by the CPU test's own checker, and the sweep's largest batch.
stage_layers() {
  local rc=0 tmp=$OUT_DIR/layers-files
  mkdir -p "$tmp"
  header layers
  echo "== inception_v3 bf16 nhwc batch $BATCH: --layer-times --trace"
  if ! timeout 150 "$BIN/stepbench" --backend cuda --model inception_v3 --batch-size "$BATCH" --precision bf16 \
      --format nhwc --phases forward,step --warmup 5 --repetitions 5 --layer-times --trace "$tmp/trace.json" \
      --plan-cache "$tmp/plans.json" --json "$tmp/layers.json" > "$tmp/layers.txt" 2> "$tmp/layers.err"; then
    rc=1
    echo "failed:"; tail -5 "$tmp/layers.err"
  fi
  sed -n '/^layer times/,$p' "$tmp/layers.txt" | head -45
  if [ -f "$tmp/trace.json" ]; then
    "$PY" - "$HERE" "$tmp/trace.json" <<'PY' || rc=1
import importlib.util, json, os, sys, unittest
here, path = sys.argv[1], sys.argv[2]
src = next(p for p in (os.path.join(here, "tests/bench/test_layer_times.py"),
                       os.path.join(here, "../tests/bench/test_layer_times.py")) if os.path.exists(p))
spec = importlib.util.spec_from_file_location("tlt", src)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
j = m.check_trace(unittest.TestCase(), path, 1, convs=94)  # the aux head's two are named AuxLogits.*
ev = [e for e in j["traceEvents"] if e["ph"] == "X"]
tracks = sorted({(e["pid"], e["tid"]) for e in ev})
print(f"trace: {len(ev)} spans on tracks {tracks}; checked: well-formed, nested, every layer once per pass")
kern = [e for e in ev if e.get("cat") == "kernel"]
print(f"trace: {len(kern)} kernel spans" + (f", e.g. {kern[0]['name'][:100]}" if kern else " (no CUPTI records)"))
PY
  fi
  local sweep=${STEPBENCH_CHECK_SWEEP:-64,128,256} start=$SECONDS
  echo "== one-GPU sweep: bf16 nhwc, batch $sweep and the largest batch planning accepts"
  if ! timeout 150 "$BIN/stepbench" --backend cuda --model inception_v3 --precision bf16 --format nhwc \
      --sweep-gpus 1 --sweep-batch "$sweep" --warmup 3 --repetitions 3 --plan-cache "$tmp/plans.json" \
      --json "$tmp/sweep.json" \
      > "$tmp/sweep.txt" 2> "$tmp/sweep.err"; then
    rc=1
    echo "failed:"; tail -5 "$tmp/sweep.err"
  fi
  sed -n '/^sweep/,$p' "$tmp/sweep.txt" | head -25
  echo "(the sweep took $((SECONDS - start)) s)"
  # the conv + BN outputs recomputed in backward: the step's cost against the sweep above, and the
  # largest batch with it (issue 39: at least 1.3x the batch without it)
  start=$SECONDS
  echo "== the same sweep with --recompute on"
  if ! timeout 150 "$BIN/stepbench" --backend cuda --model inception_v3 --precision bf16 --format nhwc \
      --sweep-gpus 1 --sweep-batch "$sweep" --warmup 3 --repetitions 3 --plan-cache "$tmp/plans.json" \
      --recompute on --json "$tmp/sweep-recompute.json" \
      > "$tmp/sweep-recompute.txt" 2> "$tmp/sweep-recompute.err"; then
    rc=1
    echo "failed:"; tail -5 "$tmp/sweep-recompute.err"
  fi
  sed -n '/^sweep/,$p' "$tmp/sweep-recompute.txt" | head -25
  echo "(the sweep took $((SECONDS - start)) s)"
  if [ "${STEPBENCH_CHECK_PEER:-1}" = 1 ]; then
    echo "== --peer pytorch from stepbench itself: bf16 nhwc batch $BATCH, forward and step"
    if ! timeout 150 "$BIN/stepbench" --backend cuda --model inception_v3 --batch-size "$BATCH" --precision bf16 \
        --format nhwc --phases forward,step --warmup 5 --repetitions 5 --peer pytorch --peer-python "$PY" \
        --plan-cache "$tmp/plans.json" \
        --json "$tmp/peer-run.json" > "$tmp/peer-run.txt" 2> "$tmp/peer-run.err"; then
      rc=1
      echo "failed:"; tail -5 "$tmp/peer-run.err"
    fi
    sed -n '/^phase /,$p' "$tmp/peer-run.txt" | head -30
  fi
  tar -C "$OUT_DIR" -czf "$OUT_DIR/layers.tar.gz" layers-files && rm -rf "$tmp"
  echo "== layers: $([ $rc -eq 0 ] && echo done || echo FAILED)"
  return $rc
}

# The input fixtures on the GPU: a staged host batch, a JPEG folder (the pipeline, the step fed by
# it, the verdict, --suggest's rows: --decode gpu against the CPU's remedies) and the same folder as
# records.
stage_input() {
  local rc=0 tmp=$OUT_DIR/input-files b=64 start=$SECONDS
  mkdir -p "$tmp"
  header input
  "$BIN/stepbench" make-dataset "$tmp/jpegs" --images "${STEPBENCH_CHECK_IMAGES:-512}" --classes 8 --size 500x375 \
    > /dev/null 2>&1 || rc=1
  "$BIN/stepbench" make-records "$tmp/jpegs" "$tmp/data.records" > /dev/null 2> "$tmp/records.err" || rc=1
  local threads
  threads=$(nproc)
  for src in "$tmp/jpegs:gpu" "$tmp/jpegs" "$tmp/data.records" synthetic-host; do
    local name extra=() limit=100
    name=$(basename "${src%:gpu}")
    if [ "${src%:gpu}" != "$src" ]; then extra=(--decode gpu); name+="-gpu-decode"; fi
    if [ "$src" != "$tmp/data.records" ] && [ "$src" != synthetic-host ]; then  # each remedy measured too
      extra+=(--suggest); limit=180
    fi
    # the stage ends within 8 minutes (a command gets 10): what could not finish in time is skipped
    if [ $((SECONDS - start + limit)) -gt "$STAGE_S" ]; then
      echo "== --data $name: skipped, the input stage's $STAGE_S s budget"
      continue
    fi
    echo "== --data $name, bf16 nhwc, batch $b, $threads threads ${extra[*]}"
    if ! timeout -k 15 $limit "$BIN/stepbench" --backend cuda --model inception_v3 --batch-size $b --precision bf16 \
        --format nhwc --data "${src%:gpu}" "${extra[@]}" --data-threads "$threads" --phases step,input_pipeline \
        --warmup 3 --repetitions 3 --plan-cache "$tmp/plans.json" --json "$tmp/input-$name.json" \
        > "$tmp/input-$name.txt" 2> "$tmp/input-$name.err"; then
      rc=1
      echo "failed:"; tail -5 "$tmp/input-$name.err"
    fi
    sed -n '/^phase /,$p' "$tmp/input-$name.txt" | head -45
  done
  rm -rf "$tmp/jpegs" "$tmp/data.records"
  tar -C "$OUT_DIR" -czf "$OUT_DIR/input.tar.gz" input-files && rm -rf "$tmp"
  echo "== input: $([ $rc -eq 0 ] && echo done || echo FAILED)"
  return $rc
}

# Several NCCL ranks on this machine's GPUs, one per process (as many processes as asked share a
# GPU): the towers test, the binary in every mode, and the faults a multi-rank run must survive.
# Each run has its own time limit; the stage ends within 8 minutes.
rank_pid() {  # rank_pid PID RANK: the process stepbench launch started as RANK, PID's child or grandchild
  local p ppid gp
  for p in /proc/[0-9]*; do
    ppid=$(awk '{print $4}' "$p/stat" 2>/dev/null) || continue
    gp=$(awk '{print $4}' "/proc/$ppid/stat" 2>/dev/null)
    # PID is timeout's, whose child is the launcher
    [ "$ppid" = "$1" ] || [ "$gp" = "$1" ] || continue
    tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -qx "RANK=$2" && { echo "${p#/proc/}"; return 0; }
  done
  return 1
}
fault_run() {  # fault_run NAME SIGNAL EXPECT: a long run on 2 ranks, rank 1 sent SIGNAL 15 s in; EXPECT in its output
  local name=$1 sig=$2 expect=$3 lp pid t0=$SECONDS
  timeout -k 10 120 "$BIN/stepbench" launch --nproc 2 -- --backend cuda --model tiny --image-size 32 --batch-size 16 \
    --phases step --warmup 2 --repetitions 100000 --benchmark_min_time=0.01 --sync-timeout-s 10 \
    > "$tmp/fault-$name.txt" 2>&1 &
  lp=$!
  for _ in $(seq 150); do pid=$(rank_pid "$lp" 1) && break; sleep 0.2; done
  sleep 15
  if [ -n "${pid:-}" ]; then kill "-$sig" "$pid"; else echo "   $name: rank 1's process not found"; fi
  wait "$lp"
  local r=$?
  if [ $r -ne 0 ] && grep -q "$expect" "$tmp/fault-$name.txt"; then
    echo "   $name: ended in $((SECONDS - t0)) s (exit $r): $(grep -m1 "$expect" "$tmp/fault-$name.txt" | cut -c1-200)"
  else
    echo "   $name: FAILED (exit $r, $((SECONDS - t0)) s; no '$expect'):"; tail -5 "$tmp/fault-$name.txt"; rc=1
  fi
  [ -n "${pid:-}" ] && kill -CONT "$pid" 2>/dev/null
}
# the stage's budget: a run expected to take longer than what is left of STAGE_S is skipped, saying so
# (each run's own time limit is longer than that expectation; the command's limit is the backstop)
fits() {  # fits SECONDS NAME
  if [ $((SECONDS - start + $1)) -gt "$STAGE_S" ]; then echo "== $2: skipped, the stage's $STAGE_S s budget"; return 1; fi
}
stage_ranks() {
  local rc=0 tmp=$OUT_DIR/ranks-files start=$SECONDS
  mkdir -p "$tmp"
  header ranks
  # in the order of what matters most: the oracle on 2 ranks, every mode of the binary, 4 ranks, the
  # straggler report, a rendezvous by hand
  dist_ranks() {  # dist_ranks N: Dist.* on N ranks under stepbench launch
    fits 60 "Dist.* on $1 ranks" || return 0
    echo "== Dist.* on $1 ranks (stepbench launch; $GPUS GPU(s))"
    timeout -k 10 150 "$BIN/stepbench" launch --nproc "$1" -- "$BIN/stepbench_tests" --gtest_filter='Dist.*' \
      --gtest_brief=1 > "$tmp/dist-$1.txt" 2>&1 || rc=1
    grep -E "^NCCL|PASSED|FAILED|Failure|rror" "$tmp/dist-$1.txt" | head -20
  }
  dist_ranks 2
  echo "== the binary on 2 ranks, every mode (tiny, batch 16)"
  for mode in replicated parameter_server "parameter_server --ps-device cpu" independent; do
    for ov in "" --no-overlap; do
      fits 20 "$mode $ov" || continue
      local f="$tmp/mode-${mode// /_}${ov}.txt"
      # shellcheck disable=SC2086
      if timeout -k 10 45 "$BIN/stepbench" launch --nproc 2 -- --backend cuda --model tiny --image-size 32 \
          --batch-size 16 --phases step,grad_sync --warmup 2 --repetitions 3 --benchmark_min_time=0.05 \
          --variable-update $mode $ov > "$f" 2>&1; then
        echo "   $mode $ov: $(grep -m1 -E '^grad_sync:|nothing to sync' "$f" | cut -c1-160)"
      else
        echo "   $mode $ov: FAILED"; tail -5 "$f"; rc=1
      fi
    done
  done
  dist_ranks 4
  if fits 60 "4 ranks as 2 nodes"; then
    # distributed_all_reduce over NCCL communicators split by node: the oracle (4 processes posing as 2
    # nodes of 2, all on this host: the sockets on loopback), then the binary
    echo "== Dist.NcclRanksEqualTheOracle on 4 ranks as 2 nodes (stepbench launch --nodes 2)"
    NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} timeout -k 10 150 "$BIN/stepbench" launch --nproc 4 --nodes 2 -- \
      "$BIN/stepbench_tests" --gtest_filter='Dist.NcclRanksEqualTheOracle' --gtest_brief=1 > "$tmp/dist-4x2.txt" 2>&1 ||
      rc=1
    grep -E "^NCCL|PASSED|FAILED|Failure|rror" "$tmp/dist-4x2.txt" | head -20
    if NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} timeout -k 10 60 "$BIN/stepbench" launch --nproc 4 --nodes 2 -- \
        --backend cuda --model tiny --image-size 32 --batch-size 16 --phases step,grad_sync --warmup 2 --repetitions 3 \
        --benchmark_min_time=0.05 --variable-update distributed_all_reduce > "$tmp/two-levels.txt" 2>&1; then
      echo "   the binary: $(grep -m1 -A1 '^grad_sync:' "$tmp/two-levels.txt" | tr -s ' \n' ' ' | cut -c1-200)"
    else
      echo "   the binary, distributed_all_reduce on 2 nodes: FAILED"; tail -5 "$tmp/two-levels.txt"; rc=1
    fi
  fi
  if fits 40 "3 ranks in one node"; then
    # a node of 3 GPUs: the floats of a bucket that do not divide by 3 take the flat all-reduce
    echo "== Dist.NcclRanksEqualTheOracle on 3 ranks (one node of 3)"
    timeout -k 10 120 "$BIN/stepbench" launch --nproc 3 -- "$BIN/stepbench_tests" \
      --gtest_filter='Dist.NcclRanksEqualTheOracle' --gtest_brief=1 > "$tmp/dist-3.txt" 2>&1 || rc=1
    grep -E "^NCCL|PASSED|FAILED|Failure|rror" "$tmp/dist-3.txt" | head -20
  fi
  if fits 20 "--slow-tower on 2 ranks"; then
    # ranks that share a GPU take turns on it, so each one's compute includes the other's kernels (seen on
    # an H200: 1.5x the compute, 2.2 ms, left rank 1 the faster): a delay several times the step is one
    # that contention cannot hide
    echo "== the straggler report on 2 ranks, rank 1 held 20 ms per step (tiny, batch 64)"
    if timeout -k 10 60 "$BIN/stepbench" launch --nproc 2 -- --backend cuda --model tiny --image-size 64 \
        --batch-size 64 --phases step --warmup 2 --repetitions 5 --benchmark_min_time=0.05 --slow-tower 1:20ms \
        --json "$tmp/slow.json" > "$tmp/slow.txt" 2>&1 &&
       python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["stragglers"]; i=s["injected"]["delay_ms"]
t, v, c = s["slowest"], s["verdict"], s["cost_ms"]
print(f"   slowest {t} ({v}), cost {c:.3f} ms for {i:.3f} ms injected")
sys.exit(0 if t == 1 and abs(c - i) < 0.25 * i else 1)' "$tmp/slow.json"; then :
    else
      echo "   --slow-tower: FAILED"; grep -A8 '^stragglers' "$tmp/slow.txt"; tail -3 "$tmp/slow.txt"; rc=1
    fi
  fi
  if fits 40 "Dist.* by hand"; then
    echo "== Dist.* on 2 ranks through a file rendezvous, started by hand"
    local pids=()
    for r in 0 1; do
      RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 STEPBENCH_RENDEZVOUS=file:$tmp/meet timeout -k 10 120 \
        "$BIN/stepbench_tests" --gtest_filter='Dist.*' --gtest_brief=1 > "$tmp/by-hand-$r.txt" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    grep -hE "PASSED|FAILED|Failure" "$tmp"/by-hand-*.txt | head -10
  fi
  tar -C "$OUT_DIR" -czf "$OUT_DIR/ranks.tar.gz" ranks-files && rm -rf "$tmp"
  echo "== ranks: $([ $rc -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s"
  return $rc
}
stage_ranks_faults() {
  local rc=0 tmp=$OUT_DIR/ranks-faults-files start=$SECONDS
  mkdir -p "$tmp"
  header ranks-faults
  echo "== faults (2 ranks, --sync-timeout-s 10)"
  fits 40 "a stopped rank" && fault_run stopped STOP "rank 1 (pid .*) is stopped"
  fits 35 "a killed rank" && fault_run killed KILL "rank 1 (pid .*) was killed by signal 9"
  local t0 name env expect
  for name in late stall missing; do
    fits 25 "$name" || continue
    t0=$SECONDS
    case $name in  # late: rank 1 comes to NCCL's initialisation 120 s late; stall: before its first sync
      late) env=STEPBENCH_FAULT_INIT_STALL=1:120; expect="NCCL's initialisation .*did not complete within 10 s" ;;
      stall) env=STEPBENCH_FAULT_SYNC_STALL=1:120; expect="did not complete within 10 s.*rank 1 \\(pid [0-9]* on [^)]*\\) did not answer" ;;
      missing) env=RANK=0; expect="rank 1 of 2 never joined" ;;
    esac
    if [ $name = missing ]; then
      env RANK=0 WORLD_SIZE=2 timeout -k 10 50 "$BIN/stepbench" --backend cuda --model tiny --image-size 32 \
        --rendezvous "file:$tmp/alone" --sync-timeout-s 5 > "$tmp/fault-$name.txt" 2>&1
    else
      env "$env" timeout -k 10 50 "$BIN/stepbench" launch --nproc 2 -- --backend cuda --model tiny --image-size 32 \
        --batch-size 16 --phases step --sync-timeout-s 10 > "$tmp/fault-$name.txt" 2>&1
    fi
    if grep -qE "$expect" "$tmp/fault-$name.txt"; then
      echo "   $name: ended in $((SECONDS - t0)) s: $(grep -m1 -oE "$expect.{0,80}" "$tmp/fault-$name.txt")"
    else
      echo "   $name: FAILED (no '$expect')"; tail -5 "$tmp/fault-$name.txt"; rc=1
    fi
  done
  for prec in "bf16 --format nhwc" "bf16 --format nhwc --cuda-graph" "fp32 --format nchw"; do
    fits 60 "Inception-v3 $prec" || continue
    echo "== Inception-v3 on 2 ranks, batch 32, $prec"
    # shellcheck disable=SC2086
    timeout -k 10 120 "$BIN/stepbench" launch --nproc 2 -- --backend cuda --model inception_v3 --batch-size 32 \
      --precision $prec --phases step,grad_sync --warmup 3 --repetitions 3 --plan-cache "$tmp/plans.json" \
      --json "$tmp/inception-${prec// /_}.json" > "$tmp/inception.txt" 2>&1 || rc=1
    grep -E "^stepbench:|^phase|^step|^grad_sync|NCCL" "$tmp/inception.txt" | head -12
  done
  tar -C "$OUT_DIR" -czf "$OUT_DIR/ranks-faults.tar.gz" ranks-faults-files && rm -rf "$tmp"
  echo "== ranks-faults: $([ $rc -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s"
  return $rc
}

# --fuse off against on: the tests of the pieces on this GPU, then the step of both networks as MLPerf and
# the README run them, and ResNet-50's layer times (what the fused units change, piece by piece)
stage_fused() {
  local rc=0 tmp=$OUT_DIR/fused-files start=$SECONDS
  mkdir -p "$tmp"
  header fused
  echo "== the fused units' op and whole-net tests (cuda)"
  timeout 150 "$BIN/stepbench_tests" --gtest_filter='*Ops.Fused*cuda*:*GraphTest.Fused*cuda*' --gtest_brief=1 \
    > "$tmp/tests.txt" 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" "$tmp/tests.txt" | head -20
  local run
  for run in "resnet50 256 --cuda-graph" "inception_v3 128 --cuda-graph" "resnet50 256 --layer-times"; do
    set -- $run
    for f in off on; do
      local name="$1-bf16-nhwc-b$2-fuse-$f${3/--cuda-graph/}"
      if [ $((SECONDS - start)) -gt $((STAGE_S * 400 / 480)) ]; then
        echo "== $name skipped: the fused stage's $STAGE_S s budget"
        continue
      fi
      echo "== $name"
      if ! timeout 120 "$BIN/stepbench" --backend cuda --model "$1" --batch-size "$2" --precision bf16 --format nhwc \
          --phases forward,step "$3" --warmup 5 --repetitions 5 --fuse "$f" --plan-cache "$tmp/plans.json" \
          --json "$tmp/$name.json" > "$tmp/$name.txt" 2> "$tmp/$name.err"; then
        rc=1
        echo "failed:"; tail -5 "$tmp/$name.err"
      fi
      sed -n '/^phase/,/^images/p' "$tmp/$name.txt" | head -12
      [ "$3" = --layer-times ] && sed -n '/^layer times/,$p' "$tmp/$name.txt" | head -40
      "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1]))["context"]
for k in ("fuse", "fused_units", "fused_pieces", "batch_norm_kernels"): print(f"  {k}: {c.get(k, "-")}")' \
        "$tmp/$name.json" 2>/dev/null
    done
  done
  tar -C "$OUT_DIR" -czf "$OUT_DIR/fused.tar.gz" fused-files && rm -rf "$tmp"
  echo "== fused: $([ $rc -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s"
  return $rc
}

stage_zoo() {
  local rc=0 tmp=$OUT_DIR/zoo-files start=$SECONDS
  mkdir -p "$tmp"
  header zoo
  echo "== the zoo's ops on the GPU (cuda)"
  timeout 150 "$BIN/stepbench_tests" --gtest_brief=1 \
    --gtest_filter='*Ops.BiasAct*cuda*:*Ops.AdaptiveAverage*cuda*:*Ops.Relu6*cuda*:*Ops.Convolution/cuda*' \
    > "$tmp/tests.txt" 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|groups|depthwise" "$tmp/tests.txt" | head -20
  local run
  for run in "resnet101 256" "resnet152 256" "vgg16 128" "alexnet 512" "densenet121 128" "mobilenet_v2 256"; do
    set -- $run
    local name="$1-bf16-nhwc-b$2"
    if [ $((SECONDS - start)) -gt $((STAGE_S * 400 / 480)) ]; then
      echo "== $name skipped: the zoo stage's $STAGE_S s budget"
      continue
    fi
    echo "== $name"
    if ! timeout 100 "$BIN/stepbench" --backend cuda --model "$1" --batch-size "$2" --precision bf16 --format nhwc \
        --phases forward,step --cuda-graph --warmup 5 --repetitions 5 --plan-cache "$tmp/plans.json" \
        --json "$tmp/$name.json" > "$tmp/$name.txt" 2> "$tmp/$name.err"; then
      rc=1
      echo "failed:"; tail -5 "$tmp/$name.err"
    fi
    sed -n '/^phase/,/^images/p' "$tmp/$name.txt" | head -10
  done
  tar -C "$OUT_DIR" -czf "$OUT_DIR/zoo.tar.gz" zoo-files && rm -rf "$tmp"
  echo "== zoo: $([ $rc -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s"
  return $rc
}

rc=0
case $STAGE in
  tests) stage_tests 2>&1 | tee "$OUT_DIR/tests.log"; rc=${PIPESTATUS[0]} ;;
  bench) stage_bench 2>&1 | tee "$OUT_DIR/bench.log"; rc=${PIPESTATUS[0]} ;;
  peer) stage_peer 2>&1 | tee "$OUT_DIR/peer.log"; rc=${PIPESTATUS[0]} ;;
  layers) stage_layers 2>&1 | tee "$OUT_DIR/layers.log"; rc=${PIPESTATUS[0]} ;;
  input) stage_input 2>&1 | tee "$OUT_DIR/input.log"; rc=${PIPESTATUS[0]} ;;
  ranks) stage_ranks 2>&1 | tee "$OUT_DIR/ranks.log"; rc=${PIPESTATUS[0]} ;;
  ranks-faults) stage_ranks_faults 2>&1 | tee "$OUT_DIR/ranks-faults.log"; rc=${PIPESTATUS[0]} ;;
  fused) stage_fused 2>&1 | tee "$OUT_DIR/fused.log"; rc=${PIPESTATUS[0]} ;;
  zoo) stage_zoo 2>&1 | tee "$OUT_DIR/zoo.log"; rc=${PIPESTATUS[0]} ;;
  all)
    for s in tests bench peer; do
      "stage_$s" 2>&1 | tee "$OUT_DIR/$s.log"
      r=${PIPESTATUS[0]}
      [ "$r" -gt "$rc" ] && rc=$r
    done ;;
esac
exit "$rc"
