#!/usr/bin/env bash
# On a machine with a GPU: build there (or use a build carried there), run the GPU tests, then a
# short benchmark of Inception-v3 (forward, forward_backward, step at batch 32 and 128, fp32 / tf32
# / bf16 / fp16, NCHW and NHWC, plus the step replayed as a CUDA Graph) and print one table. Configurations the cuda backend does not support yet
# are listed with the reason instead of a figure.
#   scripts/gpu-check.sh                 build into build-gpu/ (or reuse it), test, benchmark
#   STEPBENCH_BUILD_DIR=build scripts/gpu-check.sh    use an existing build
# Writes the JSON of every run under ${OUT:-gpu-check-out}/.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
BUILD_DIR=${STEPBENCH_BUILD_DIR:-$STEPBENCH_ROOT/build-gpu}
OUT_DIR=${OUT:-$STEPBENCH_ROOT/gpu-check-out}
mkdir -p "$OUT_DIR"

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ ! -x "$BUILD_DIR/bin/stepbench" ] || [ ! -x "$BUILD_DIR/bin/stepbench_tests" ]; then
  if [ "$(id -u)" -eq 0 ]; then sb_install_deps || true; fi
  # native: only the GPU in this machine, so the build stays short
  sb_build "$BUILD_DIR" -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-native}" -DSTEPBENCH_BUILD_TESTS=ON || exit 1
fi
SB="$BUILD_DIR/bin/stepbench"

echo "== GPU tests"
"$BUILD_DIR/bin/stepbench_tests" --gtest_filter='*cuda*:*Cuda*:Nccl.*' --gtest_brief=1
tests_rc=$?
echo "== the same op and step tests with batch norm and pooling on stepbench's kernels instead of cuDNN"
STEPBENCH_CUDA_OWN_KERNELS=1 "$BUILD_DIR/bin/stepbench_tests" --gtest_filter='*Ops.*cuda*:*CudaStep*' --gtest_brief=1 ||
  tests_rc=1

# NCCL between GPUs: in one process, then one process per GPU under mpirun (unique id over MPI)
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
if [ "${gpus:-0}" -ge 2 ]; then
  echo "== gradient sync over $gpus GPUs (NCCL)"
  "$SB" --backend cuda --model inception_v3 --gpus "$gpus" --batch-size 64 --phases step,grad_sync --warmup 5 \
    --repetitions 3 --json "$OUT_DIR/towers-$gpus.json" | tail -20 || tests_rc=1
  if command -v mpirun >/dev/null; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np "$gpus" "$SB" --backend cuda \
      --model inception_v3 --gpus 1 --batch-size 64 --phases step,grad_sync --warmup 5 --repetitions 3 | tail -20 ||
      tests_rc=1
  fi
fi

echo "== benchmarks"
for prec in fp32 tf32 bf16 fp16; do
  for fmt in nchw nhwc; do
    for b in 32 128; do
      name="inception_v3-$prec-$fmt-b$b"
      if ! "$SB" --backend cuda --model inception_v3 --batch-size "$b" --precision "$prec" --format "$fmt" \
          --phases forward,forward_backward,step --cuda-graph --warmup 5 --repetitions 3 --json "$OUT_DIR/$name.json" \
          > "$OUT_DIR/$name.txt" 2> "$OUT_DIR/$name.err"; then
        python3 -c 'import json, sys; t = open(sys.argv[1]).read().strip().splitlines(); json.dump({"error": t[-1] if t else "failed"}, open(sys.argv[2], "w"))' \
          "$OUT_DIR/$name.err" "$OUT_DIR/$name.json"
      fi
    done
  done
done

python3 - "$OUT_DIR" <<'PY'
import glob, json, os, statistics, sys
rows, kernels = [], {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "inception_v3-*.json"))):
    cfg = os.path.basename(path)[:-5].split("-")
    d = json.load(open(path))
    if "error" in d:
        rows.append((cfg, None, d["error"]))
        continue
    med = {}
    for b in d["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        phase = b["run_name"].split("/repeats")[0].split("/")[-1]
        med.setdefault(phase, []).append(b["real_time"])
    rows.append((cfg, {k: statistics.median(v) for k, v in med.items()}, d["context"].get("device", "")))
    kernels.setdefault((cfg[1], cfg[2]), (d["context"].get("batch_norm_kernels", "?"), d["context"].get("pool_kernels", "?")))
print(f"{'precision':<9} {'layout':<6} {'batch':>5} {'forward ms':>11} {'fwd+bwd ms':>11} {'step ms':>9} {'images/s':>9} {'graph step ms':>13}")
for cfg, m, extra in rows:
    prec, fmt, b = cfg[1], cfg[2], int(cfg[3][1:])
    if m is None:
        print(f"{prec:<9} {fmt:<6} {b:>5}  not run: {extra}")
    else:
        st = m.get("step", float("nan"))
        print(f"{prec:<9} {fmt:<6} {b:>5} {m.get('forward', float('nan')):>11.2f} {m.get('forward_backward', float('nan')):>11.2f} "
              f"{st:>9.2f} {1000 * b / st:>9.1f} {m.get('step:cuda_graph', float('nan')):>13.2f}")
print("\nwhat ran batch norm / pooling (after warm-up):")
for (prec, fmt), (bn, pool) in sorted(kernels.items()):
    print(f"  {prec:<5} {fmt:<5} batch norm: {bn}; pooling: {pool}")
PY
# where cuDNN declined a batch norm or pooling configuration (our kernel ran it instead)
if grep -h "cuDNN declined" "$OUT_DIR"/*.err 2>/dev/null | sort | uniq -c | grep .; then
  echo "(the lines above: cuDNN declined these; stepbench's kernels ran them)"
fi
exit $tests_rc
