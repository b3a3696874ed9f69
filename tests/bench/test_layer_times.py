#!/usr/bin/env python3
"""Where the time goes, on the cpu backend: --layer-times (every layer's pieces inside the real step
add up to it), --trace (a valid Chrome trace: well-formed events, perfect nesting per track, every
layer once per pass), --sweep-gpus/--sweep-batch (the grid, the scaling efficiency, the largest batch
agreeing with planning) and scripts/plot.py (its PNG files from a real run's JSON).

  tests/bench/test_layer_times.py --stepbench build/bin/stepbench --scripts scripts [unittest args]"""
import argparse, json, os, statistics, subprocess, sys, tempfile, unittest

STEPBENCH = None
SCRIPTS = None
FAST = ["--benchmark_min_time=0.01"]
TINY = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "8", "--warmup", "1"]
# Inception-v3 at its smallest size, without the aux head (which needs 299x299): every layer kind
INCEPTION = ["--backend", "cpu", "--model", "inception_v3", "--image-size", "75", "--no-aux-logits",
             "--batch-size", "2", "--warmup", "1"]
TINY_LAYERS = {"conv1", "conv2", "maxpool", "block.branch1x1", "block.branch5x5_1", "block.branch5x5_2",
               "block.branch3x3_1", "block.branch3x3_2", "block.avg_pool", "block.branch_pool", "avgpool", "dropout",
               "fc", "loss(logits)"}


def run(*args, timeout=600):
    p = subprocess.run([STEPBENCH, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def check_trace(test, path, towers, layers=None, convs=None, input_threads=0):
    """Well-formed, nested per track, monotonic per track, every layer once per pass and step; with
    input_threads, a process more for the input pipeline with a track per thread."""
    with open(path) as f:
        j = json.load(f)
    ev = j["traceEvents"]
    spans = [e for e in ev if e["ph"] == "X"]
    meta = [e for e in ev if e["ph"] == "M"]
    test.assertEqual(len(spans) + len(meta), len(ev), "only complete (X) and metadata (M) events")
    for e in spans:
        for k, t in (("name", str), ("pid", int), ("tid", int), ("ts", (int, float)), ("dur", (int, float))):
            test.assertIsInstance(e.get(k), t, e)
        test.assertGreaterEqual(e["ts"], 0, e)
        test.assertGreaterEqual(e["dur"], 0, e)
    test.assertEqual({e["pid"] for e in spans}, set(range(towers + (1 if input_threads else 0))))
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in meta if e["name"] in ("process_name", "thread_name")}
    for pid in range(towers):
        test.assertIn((pid, None), names)
        test.assertIn((pid, 1), names)
    tracks = {}
    for e in spans:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    eps = 1e-6  # µs: printing rounds the last digit
    if input_threads:
        inp = [e for e in spans if e["pid"] == towers]
        # a track per thread that did something: on a loaded machine one thread can take every image of
        # a short run (seen under ctest -j2), so the tracks are a non-empty subset of the threads
        tids = {e["tid"] for e in inp}
        test.assertTrue(tids and tids <= set(range(1, input_threads + 1)), tids)
        test.assertTrue({e["name"] for e in inp} <= {"read", "decode", "resize", "crop", "flip_normalise", "assembly",
                                                      "wait for room"}, {e["name"] for e in inp})
        test.assertEqual(names[(towers, None)], "input pipeline (rank 0)")
    for key, v in tracks.items():
        ts = [e["ts"] for e in v]
        test.assertEqual(ts, sorted(ts), f"track {key}: timestamps go back")
        stack = []
        for e in v:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + eps:
                stack.pop()
            if stack:
                top = stack[-1]
                test.assertLessEqual(e["ts"] + e["dur"], top["ts"] + top["dur"] + eps,
                                     f"track {key}: {e['name']} overlaps {top['name']} without nesting in it")
            stack.append(e)
    steps = j["otherData"]["steps"]
    for pid in range(towers):
        dev = [e for e in tracks[(pid, 1)]]
        for phase in ("step", "forward", "backward", "grad_sync", "update"):
            test.assertEqual(len([e for e in dev if e["cat"] == "phase" and e["name"] == phase]), steps, phase)
        for k in range(steps):
            for p in ("forward", "backward"):
                per = {}
                for e in dev:  # a layer: its span (several pieces) or its one piece
                    a = e["args"]
                    if a.get("step") != k or e["cat"] not in ("layer", "piece"):
                        continue
                    if e["cat"] == "layer" and a["pass"] == p:
                        per[e["name"]] = per.get(e["name"], 0) + 1
                    if e["cat"] == "piece" and e["name"] == a["layer"] and a["part"] == ("fwd" if p == "forward"
                                                                                          else "bwd"):
                        per[e["name"]] = per.get(e["name"], 0) + 1
                for graph_part in ("weight_cast", "grad_zero"):  # the graph's own work, not a layer
                    per.pop(graph_part, None)
                test.assertTrue(all(n == 1 for n in per.values()), f"step {k} {p}: {per}")
                if layers is not None:
                    test.assertEqual(set(per), layers, f"step {k} {p}")
                if convs is not None:
                    test.assertEqual(len([n for n in per if n.startswith(("Conv2d", "Mixed"))
                                          and not n.endswith((".avg_pool", ".max_pool"))]), convs, f"step {k} {p}")
            pieces = {e["args"]["part"] for e in dev if e["cat"] == "piece" and e["args"].get("step") == k}
            test.assertTrue({"conv_fwd", "bn_relu_fwd", "bn_relu_bwd", "conv_bwd_filter", "conv_bwd_data"} <= pieces,
                            pieces)
    return j


class LayerTimes(unittest.TestCase):
    def test_the_pieces_add_up_to_the_step(self):
        for layout in ("nchw", "nhwc"):
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "run.json")
                rc, out, err = run(*TINY, "--format", layout, "--phases", "forward,step", "--repetitions", "5",
                                   "--layer-times", "--json", path, "--benchmark_min_time=0.05")
                self.assertEqual(rc, 0, err)
                with open(path) as f:
                    lt = json.load(f)["layer_times"]
            self.assertEqual(lt["probed_steps"], 5)
            self.assertEqual(lt["clock"], "steady clock")
            # every piece of work in the step is inside a probe: what is left (per step, then the median) is
            # bookkeeping. (Medians of the phases need not add up to the step's median on a loaded machine.)
            self.assertGreaterEqual(lt["remainder_ms"], 0, lt)
            self.assertLess(lt["remainder_ms"], 0.03 * lt["step_ms"], lt)
            pieces = {(p["layer"], p["part"]) for p in lt["pieces"]}
            for conv in ("conv2", "block.branch5x5_2"):
                for part in ("conv_fwd", "bn_relu_fwd", "bn_relu_bwd", "conv_bwd_filter", "conv_bwd_data"):
                    self.assertIn((conv, part), pieces)
            # the stem's input needs no gradient: no backward-data piece there
            self.assertNotIn(("conv1", "conv_bwd_data"), pieces)
            self.assertIn(("conv1", "conv_bwd_filter"), pieces)
            self.assertEqual({p["layer"] for p in lt["pieces"] if p["layer"] != "(graph)"}, TINY_LAYERS)
            for p in lt["pieces"]:
                self.assertGreaterEqual(p["median_ms"], 0, p)
                if p["part"].startswith("conv_"):
                    self.assertGreater(p["tflops"], 0, p)
            self.assertIn("layer times: tower 0 inside the real step", out)
            self.assertIn("by kind of work", out)
            self.assertIn("top 12 layers", out)
            self.assertRegex(out, r"convolution +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+\n +[0-9.]+   data\n +[0-9.]+   filter\n")
            # the cpu's default recomputes the conv + BN outputs in backward: pieces of their own
            self.assertRegex(out, r"batch norm recomputed +0\.000 +[0-9.]+ ")
            self.assertIn("bn_relu_recompute", {p["part"] for p in lt["pieces"] if p["pass"] == "backward"})
            section = out[out.index("layer times:"):]
            self.assertEqual([l for l in section.splitlines() if len(l) > 100], [], "wider than 100 columns")

    def test_the_section_joins_a_json_that_holds_nan(self):
        # Google Benchmark writes NaN for the cv of a counter that is 0 in every repetition (gap_ms of
        # input_pipeline here; throttled on an unthrottled GPU): the section is added as text, not re-parsed
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.json")
            rc, out, err = run(*TINY, "--data", "synthetic-host", "--phases", "input_pipeline,step", "--repetitions",
                               "2", "--layer-times", "--json", path, *FAST)
            self.assertEqual(rc, 0, err)
            with open(path) as f:
                text = f.read()
            self.assertIn("NaN", text)
            j = json.loads(text)  # Python's json reads NaN
            self.assertIn("layer_times", j)
            self.assertGreater(len(j["benchmarks"]), 0)

    def test_a_trace_of_one_and_two_towers(self):
        for towers in (1, 2):
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "trace.json")
                rc, out, err = run(*TINY, "--gpus", str(towers), "--phases", "step", "--repetitions", "1",
                                   "--trace", path, *FAST)
                self.assertEqual(rc, 0, err)
                self.assertIn(f"trace: {path}", out)
                j = check_trace(self, path, towers, layers=TINY_LAYERS)
                sync = [e for e in j["traceEvents"] if e.get("cat") == "sync"]
                if towers == 1:
                    self.assertEqual(sync, [], "one tower syncs nothing")
                else:
                    self.assertGreater(len(sync), 0)
                    for e in sync:
                        self.assertEqual(e["tid"], 3)
                        self.assertGreater(e["args"]["bytes"], 0)

    def test_a_trace_of_inception_v3(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            rc, out, err = run(*INCEPTION, "--phases", "step", "--repetitions", "1", "--trace", path,
                               "--layer-times", *FAST)
            self.assertEqual(rc, 0, err)
            check_trace(self, path, 1, convs=94)  # torchvision's 94 BasicConv2d without the aux head
            # the summary's top layers go by torchvision's module names (which layers lead depends on the
            # machine's load: under ctest -j2 every piece once read 32 ms, a scheduler's time slice)
            top = out[out.index("  top 12 layers"):].splitlines()[1:13]
            self.assertEqual(len(top), 12, out)
            for line in top:
                self.assertRegex(line, r"^  (Conv2d_\w+|Mixed_[5-7][a-e]\.\w+|maxpool[12]|avgpool|dropout|fc) ", out)

    def test_a_trace_with_an_input_pipeline(self):
        """--data: each probed step is fed a batch, staged on the copy stream's track, and the
        pipeline's threads show what they did, stage by stage."""
        with tempfile.TemporaryDirectory() as d:
            data = os.path.join(d, "jpegs")
            rc, out, err = run("make-dataset", data, "--images", "24", "--classes", "2", "--size", "80x60")
            self.assertEqual(rc, 0, err)
            for towers in (1, 2):
                path = os.path.join(d, f"trace{towers}.json")
                rc, out, err = run(*TINY, "--gpus", str(towers), "--data", data, "--data-threads", "2", "--phases",
                                   "step", "--repetitions", "1", "--layer-times", "--trace", path, *FAST)
                self.assertEqual(rc, 0, f"{out}\n{err}")
                j = check_trace(self, path, towers, layers=TINY_LAYERS, input_threads=2)
                steps = j["otherData"]["steps"]
                ev = [e for e in j["traceEvents"] if e["ph"] == "X"]
                for pid in range(towers):
                    staged = [e for e in ev if e["pid"] == pid and e["tid"] == 4]
                    self.assertEqual(len(staged), steps, f"tower {pid}: one staged batch per probed step")
                    first = min(e["ts"] for e in ev if e["pid"] == pid and e["tid"] == 1 and e["cat"] == "piece")
                    self.assertLessEqual(staged[0]["ts"], first, "the batch is staged before the step reads it")
                names = {e["name"] for e in ev if e["pid"] == towers}
                self.assertIn("decode", names)
                self.assertIn("read", names)

    def test_a_trace_that_cannot_be_written_is_a_usage_error(self):
        rc, out, err = run(*TINY, "--phases", "step", "--trace", "/nonexistent-dir/trace.json", *FAST)
        self.assertEqual(rc, 2, err)
        self.assertIn("--trace /nonexistent-dir/trace.json cannot be written", err)


class Sweep(unittest.TestCase):
    SWEEP = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--warmup", "1", "--repetitions", "3",
             "--device-memory-mb", "64"]

    def test_the_grid_its_efficiency_and_the_largest_batch(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "sweep.json")
            rc, out, err = run(*self.SWEEP, "--sweep-gpus", "2,1", "--sweep-batch", "8,4,100000", "--json", path)
            self.assertEqual(rc, 0, err)
            with open(path) as f:
                j = json.load(f)
        sw = j["sweep"]
        self.assertEqual(j["context"]["model"], "tiny")
        self.assertNotIn("batch_size_per_gpu", j["context"])  # the grid varies it
        rows = {(r["gpus"], r["batch"]): r for r in sw["rows"]}
        self.assertEqual(set(rows), {(g, b) for g in (1, 2) for b in (4, 8, 100000)})
        big = sw["largest_batch_per_gpu"]
        self.assertGreater(big, 8)
        self.assertLess(big, 100000)
        self.assertLessEqual(sw["largest_batch_bytes"], sw["memory_budget_bytes"])
        for g in (1, 2):
            self.assertFalse(rows[(g, 100000)]["fits"])
            for b in (4, 8):
                r = rows[(g, b)]
                self.assertTrue(r["fits"])
                self.assertEqual(r["global_batch"], g * b)
                self.assertAlmostEqual(r["images_per_s"], g * b / (r["step_ms"] / 1e3), delta=1e-6 * r["images_per_s"])
                base = rows[(1, b)]
                self.assertAlmostEqual(r["scaling_efficiency"], r["images_per_s"] / (g * base["images_per_s"]),
                                       delta=1e-9)
        self.assertRegex(out, r"gpus +batch/gpu +global batch +step ms +images/s +efficiency")
        self.assertRegex(out, r"\n +2 +8 +16 +[0-9.]+ +[0-9.]+ +[0-9.]+%\n")
        self.assertRegex(" ".join(out.split()), r"100000 does not fit: its memory plan needs [0-9.]+ GiB of the 0.06 GiB "
                                                r"planning uses")
        self.assertIn(f"largest batch per GPU that planning accepts: {big} ", out)
        self.assertIn(f"batch {big + 1} does not fit", out)
        # the answer is planning's: that batch plans, one more does not (exit 2 naming the limit)
        one = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--device-memory-mb", "64", "--list"]
        rc, out, err = run(*one, "--batch-size", str(big))
        self.assertEqual(rc, 0, err)
        rc, out, err = run(*one, "--batch-size", str(big + 1))
        self.assertEqual(rc, 2, err)
        self.assertIn(f"batch size {big + 1} needs", err)
        self.assertIn("a memory limit of 64 MiB is set", err)

    def test_flags_that_do_not_go_with_a_sweep(self):
        for extra, why in ((["--trace", "t.json"], "--trace does not go with --sweep-gpus"),
                           (["--phases", "step"], "--phases does not go with"),
                           (["--gpus", "2"], "--gpus and --sweep-gpus both give the GPU count"),
                           (["--sweep-batch", "4,4"], "--sweep-batch lists a value twice"),
                           (["--global-batch-size", "16"], "--global-batch-size does not go with a sweep"),
                           (["--benchmark_min_time=1"], "--benchmark_min_time=1 does not go with a sweep"),
                           (["--sweep-batch", "0"], "--sweep-batch")):
            rc, out, err = run(*self.SWEEP, "--sweep-gpus", "1", *extra)
            self.assertEqual(rc, 2, f"{extra}: {err}")
            self.assertIn(why, err)


class Projection(unittest.TestCase):
    def link_of_this_machine(self):
        """alpha and beta of the host collective between two CPU towers, from grad_sync's medians with one
        bucket and with one bucket per parameter (nccl-tests' way: a small and a large count)"""
        t = {}
        for mb in ("25", "0.001"):
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "gs.json")
                rc, out, err = run("--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "8",
                                   "--gpus", "2", "--warmup", "1", "--repetitions", "5", "--phases", "grad_sync",
                                   "--bucket-mb", mb, "--json", path, "--benchmark_min_time=0.1")
                self.assertEqual(rc, 0, err)
                with open(path) as f:
                    rows = [b for b in json.load(f)["benchmarks"] if b["run_type"] == "iteration"]
            t[mb] = (sorted(b["real_time"] for b in rows)[len(rows) // 2], rows[0]["bytes"], rows[0]["buckets"])
        (t1, size, _), (tn, _, n) = t["25"], t["0.001"]
        alpha = max(0.0, (tn - t1) / (n - 1))  # ms per bucket
        beta = 2 * size / max(t1 - alpha, 1e-6)  # bytes per ms: one bucket costs alpha + 2 (N-1) s / beta at N = 2
        return beta * 1e3 * 8 / 1e9, alpha * 1e3  # Gb/s, us

    @staticmethod
    def by_hand(pj, g):
        """The model for CPU towers, computed here from the JSON's inputs, not from its answers: N x one
        tower's step, plus what of the buckets' host all-reduces (alpha + 2 (N-1) s / beta each, one after
        another, each no earlier than its bucket is ready) runs past the last tower's backward"""
        alpha = pj["link"]["latency_us"] / 1e3  # ms
        beta = pj["link"]["gbps"] * 1e9 / 8 / 1e3  # bytes per ms
        end = sync = 0.0
        for b in pj["buckets"]:
            t = alpha + 2 * (g - 1) * b["bytes"] / beta
            end = max(end, b["ready_ms"]) + t
            sync += t
        exposed = max(0.0, end - pj["backward_ms"])
        return g * pj["one_gpu_step_ms"] + exposed, sync, exposed

    def test_it_predicts_the_measured_towers(self):
        # A sweep measures its points one after another on a shared machine, and one point can drift
        # (on a 2-vCPU VM one tower's step moved from 6.6 to 8.6 ms and two towers' from 13.2 to 18.8 ms
        # between four runs in a row): five sweeps, each projecting from its own one-tower step, and the
        # median of their errors is judged, so that two drifted sweeps of five cannot fail it
        gbps, us = self.link_of_this_machine()
        errs = {2: [], 4: []}
        lines = []
        for sweep in range(5):
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "sweep.json")
                # batch 32: at batch 8 four towers' working sets no longer stay in the caches as one tower's
                # does, and the model (N x one tower's compute) was 13% short at 4 towers
                rc, out, err = run("--backend", "cpu", "--model", "tiny", "--image-size", "32", "--warmup", "2",
                                   "--repetitions", "5", "--sweep-gpus", "1,2,4", "--sweep-batch", "32",
                                   "--project-gpus", "2,4,64", "--link-gbps", f"{gbps:.6g}", "--link-latency-us",
                                   f"{us:.6g}", "--json", path)
                self.assertEqual(rc, 0, err)
                with open(path) as f:
                    sw = json.load(f)["sweep"]
            measured = {r["gpus"]: r["step_ms"] for r in sw["rows"]}
            pj = sw["projections"][0]
            self.assertEqual(pj["batch"], 32)
            self.assertTrue(pj["towers_one_after_another"])
            self.assertGreater(len(pj["buckets"]), 0)
            self.assertEqual(pj["link"]["gbps"], float(f"{gbps:.6g}"))
            points = {p["gpus"]: p for p in pj["points"]}
            self.assertAlmostEqual(pj["one_gpu_step_ms"], measured[1], places=6)  # the sweep's timed one tower
            for g in (2, 4, 64):  # the model's arithmetic, exactly
                step, sync, exposed = self.by_hand(pj, g)
                self.assertAlmostEqual(points[g]["step_ms"], step, delta=1e-9 * step)
                self.assertAlmostEqual(points[g]["sync_ms"], sync, delta=1e-9 * max(sync, 1e-9))
                self.assertAlmostEqual(points[g]["exposed_sync_ms"], exposed, delta=1e-9 * max(step, 1e-9))
            self.assertGreater(points[64]["step_ms"], points[4]["step_ms"])
            for g in (2, 4):
                errs[g].append(points[g]["step_ms"] / measured[g] - 1)
            lines.append("; ".join(f"{g} towers: projected {points[g]['step_ms']:.3f} ms, measured "
                                   f"{measured[g]:.3f} ms ({errs[g][-1]:+.1%})" for g in (2, 4)))
        # against the measured towers: CPU towers share one host's caches, which the model (N x one tower +
        # the sync) leaves out, so the measured steps mostly run above it: 5-12% at 2 and 4 towers on two
        # EPYCs, 8% at 2 and 19% at 4 in one CI run. Not always: on a 2-vCPU Sapphire Rapids VM one CI run
        # measured -14% at 2 towers and +18% at 4 (the one-tower step it projects from was timed slow under
        # the load); alone, -4% to -19% in seven runs. So the median error is held to a band, -30% to +25%,
        # at each count: a model that dropped the N x (-50% at 2, -75% at 4) or counted a tower twice
        # (+100%) misses it
        why = "\n".join(lines) + f"\n(link {gbps:.3g} Gb/s, {us:.3g} us)\n{out}"
        for g in (2, 4):
            mid = statistics.median(errs[g])
            self.assertGreater(mid, -0.30, f"{g} towers: median error {mid:+.1%}\n{why}")
            self.assertLess(mid, 0.25, f"{g} towers: median error {mid:+.1%}\n{why}")
        self.assertIn("projection from one GPU's measured step", out)
        self.assertRegex(out, r"\n +4 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+% +host +[0-9.]+ +[-+][0-9.]+%\n")

    def test_a_run_of_one_gpu_projects_too(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.json")
            rc, out, err = run(*TINY, "--phases", "step", "--repetitions", "3", "--project-gpus", "8,64",
                               "--fabric", "ib-ndr", "--json", path, *FAST)
            self.assertEqual(rc, 0, err)
            with open(path) as f:
                pj = json.load(f)["projection"]
        self.assertEqual(pj["link"], {"name": "ib-ndr", "gbps": 400, "latency_us": 5})
        self.assertEqual([p["gpus"] for p in pj["points"]], [8, 64])
        # as one line: where the text wraps depends on the width of the step's figures (a loaded
        # machine's 939.418 ms moved "per hop" to the next line)
        self.assertIn("over ib-ndr (400 Gb/s, 5 us per hop)", " ".join(out.split()))

    def test_what_a_projection_needs(self):
        for extra, why in ((["--project-gpus", "8"], "--project-gpus needs the link"),
                           (["--project-gpus", "8", "--link-gbps", "100"], "--project-gpus needs the link"),
                           (["--project-gpus", "8", "--fabric", "ib-ndr", "--link-gbps", "1", "--link-latency-us", "1"],
                            "--fabric and --link-gbps/--link-latency-us both describe the link"),
                           (["--fabric", "ib-ndr"], "describe the link for --project-gpus"),
                           (["--project-gpus", "8", "--fabric", "infiniband"], "--fabric"),
                           (["--project-gpus", "8", "--fabric", "ib-ndr", "--gpus", "2"], "use --gpus 1"),
                           (["--project-gpus", "8", "--fabric", "ib-ndr", "--sweep-gpus", "2,4"],
                            "add 1 to --sweep-gpus"),
                           (["--project-gpus", "8", "--fabric", "ib-ndr", "--variable-update", "independent"],
                            "--project-gpus models replicated all-reduce"),
                           (["--project-gpus", "8", "--fabric", "ib-ndr", "--variable-update", "distributed_all_reduce"],
                            "two levels against a run of several processes"),
                           (["--project-gpus", "8", "--fabric", "ib-ndr", "--list"], "--list prints names")):
            sweep = "--sweep-gpus" in extra
            rc, out, err = run(*TINY, *([] if sweep else ["--phases", "step", *FAST]), *extra)
            self.assertEqual(rc, 2, f"{extra}: {err}")
            self.assertIn(why, err)


class Plot(unittest.TestCase):
    def plot(self, *args):
        p = subprocess.run([self.python, os.path.join(SCRIPTS, "plot.py"), *args], capture_output=True, text=True,
                           timeout=300)
        return p.returncode, p.stdout, p.stderr

    def test_pictures_of_a_real_run(self):
        # Debian's python3-matplotlib (the install list's) is /usr/bin/python3's; ctest's may be another
        self.python = next((py for py in (sys.executable, "/usr/bin/python3")
                            if subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode == 0),
                           None)
        if self.python is None:
            self.skipTest("no interpreter here imports matplotlib (python3-matplotlib is not installed)")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.json")
            rc, out, err = run(*TINY, "--phases", "forward,step", "--repetitions", "3", "--layer-times", "--json",
                               path, *FAST)
            self.assertEqual(rc, 0, err)
            rc, out, err = self.plot(path, "--out", os.path.join(d, "plots"), "--top", "8")
            self.assertEqual(rc, 0, err)
            wrote = out.split()
            self.assertEqual(sorted(os.path.basename(w) for w in wrote),
                             ["layers.png", "phases.png", "step_breakdown.png"])
            for w in wrote:
                with open(w, "rb") as f:
                    head = f.read(24)
                self.assertEqual(head[:8], b"\x89PNG\r\n\x1a\n", w)
                width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
                self.assertGreater(width, 400, w)
                self.assertGreater(height, 200, w)
            # a sweep's file: the scaling curves
            sweep = os.path.join(d, "sweep.json")
            rc, out, err = run(*Sweep.SWEEP, "--sweep-gpus", "1,2", "--sweep-batch", "4,8", "--json", sweep)
            self.assertEqual(rc, 0, err)
            rc, out, err = self.plot(sweep, "--out", os.path.join(d, "plots"))
            self.assertEqual(rc, 0, err)
            self.assertEqual([os.path.basename(w) for w in out.split()], ["scaling.png"])
            # not a run file, a missing file, a bad --top: exit 2 with the reason
            with open(os.path.join(d, "x.json"), "w") as f:
                f.write("[1, 2]")
            # a history: four runs appended by --history (the same binary), compare's verdict on the
            # last against the others; the picture of each phase's medians over the runs
            hist = os.path.join(d, "runs.jsonl")
            for k in range(4):
                rc, out, err = run(*TINY, "--phases", "forward,step", "--repetitions", "5", "--history", hist,
                                   "--json", os.path.join(d, f"h{k}.json"), *FAST)
                self.assertEqual(rc, 0, err)
            # the records share this binary's revision; a distinct one each, as nightly runs would have
            lines = [json.loads(l) for l in open(hist)]
            for k, rec in enumerate(lines):
                rec["revision"] = f"night{k}"
            with open(hist, "w") as f:
                f.write("".join(json.dumps(rec) + "\n" for rec in lines))
            with open(os.path.join(d, "h3.json")) as f:
                head = json.load(f)
            head["context"]["revision"] = "night3"
            with open(os.path.join(d, "h3.json"), "w") as f:
                json.dump(head, f)
            verdict = os.path.join(d, "verdict.json")
            rc, out, err = run("compare", "--history", hist, os.path.join(d, "h3.json"), "--json", verdict)
            self.assertIn(rc, (0, 1), err)
            self.assertIn("evidence: HEAD against the earlier runs", out)
            rc, out, err = self.plot(hist, "--out", os.path.join(d, "hp"), "--verdict", verdict)
            self.assertEqual(rc, 0, err)
            self.assertEqual([os.path.basename(w) for w in out.split()], ["history.png"])
            with open(out.split()[0], "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            with open(os.path.join(d, "bad.jsonl"), "w") as f:
                f.write("{oops\n")
            for args, why in (([os.path.join(d, "x.json")], "is not a stepbench --json file"),
                              ([os.path.join(d, "missing.json")], "cannot read"),
                              ([path, "--top", "0"], "--top must be at least 1"),
                              ([os.path.join(d, "bad.jsonl")], "line 1 is not JSON"),
                              ([path, "--verdict", verdict], "--verdict goes with a history")):
                rc, out, err = self.plot(*args, "--out", os.path.join(d, "p2"))
                self.assertEqual(rc, 2, err)
                self.assertIn(why, err)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--stepbench", required=True)
    ap.add_argument("--scripts", required=True)
    args, rest = ap.parse_known_args()
    STEPBENCH, SCRIPTS = os.path.abspath(args.stepbench), os.path.abspath(args.scripts)
    result = unittest.main(argv=[sys.argv[0], "-v", *rest], exit=False).result
    sys.exit(0 if result.wasSuccessful() else 1)
