#!/usr/bin/env python3
"""The stepbench binary as a user meets it: flags, bad values (exit code 2 and a message that names
the flag and what to change), every preset in configs/, and the JSON (every phase with its counters).

  tests/cli/test_cli.py --stepbench build/bin/stepbench --configs configs [unittest args, e.g. -k Flags]"""
import argparse, atexit, glob, json, os, re, shutil, signal, subprocess, sys, tempfile, time, tomllib, unittest

STEPBENCH = None
CONFIGS = None
FAST = ["--benchmark_min_time=0.01"]  # one short timing per repetition: these tests check plumbing


def slurp(path):
    with open(path) as f:
        return f.read()


def native_bf16():
    """Whether oneDNN finds native bf16 here (AVX512_BF16 or AMX), which --backend cpu --precision bf16 needs:
    the CPU has it and ONEDNN_MAX_CPU_ISA, where set, does not hold oneDNN below it"""
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    allowed = limit in ("ALL", "DEFAULT") or "BF16" in limit or "AMX" in limit or "FP16" in limit
    return allowed and ("avx512_bf16" in flags or "amx_bf16" in flags)


def run(*args, timeout=300):
    p = subprocess.run([STEPBENCH, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


class Flags(unittest.TestCase):
    def test_help_lists_every_flag_with_its_default(self):
        rc, out, _ = run("--help")
        self.assertEqual(rc, 0)
        for flag in ["--backend", "--gpus", "--batch-size", "--global-batch-size", "--model", "--image-size",
                     "--no-aux-logits", "--precision", "--format", "--variable-update", "--optimizer", "--warmup",
                     "--repetitions", "--json", "--per-layer", "--config", "--phases", "--version", "--verbose"]:
            self.assertIn(flag, out)
        for default in ["[auto]", "[inception_v3]", "[fp32]", "[nchw]", "[replicated]", "[momentum]", "[10]",
                        "[5]"]:
            self.assertIn(default, out)
        groups = ["What to run:", "Model and precision:", "Towers and sync:", "Data:", "Timing:", "Output:", "GPU:",
                  "Subcommands"]
        at = [out.index("\n" + g) for g in groups]
        self.assertEqual(at, sorted(at), "the groups in their order")
        for sub in ("check", "compare", "make-dataset", "make-records"):
            self.assertRegex(out, rf"\n  {sub} +\S")
        self.assertNotIn("--aux-logits ", out)  # the old on|off spelling: still read, no longer listed
        rc, out, _ = run("--version")
        self.assertEqual(rc, 0)
        self.assertRegex(out, r"^stepbench \d+\.\d+\.\d+ ")

    def test_the_models_come_from_one_list(self):
        """--list-models (models/models.hpp's one list) is what --help offers, what docs/flags.md maps from
        tf_cnn_benchmarks' names and what both PyTorch scripts build; ResNet-152, AlexNet, DenseNet-121 and
        MobileNet-v2 run every phase, ResNet-101 and VGG-16 the step, each at its smallest image, and each refuses one
        pixel less."""
        rc, out, err = run("--list-models")
        self.assertEqual(rc, 0, err)
        rows = [line.split(None, 3) for line in out.splitlines()[1:]]
        names = [r[0] for r in rows]
        self.assertEqual(names[:4], ["inception_v3", "resnet50", "resnet101", "resnet152"])
        _, helptext, _ = run("--help")
        self.assertIn("--model " + "|".join(names) + "\n", helptext)
        src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with open(os.path.join(src, "docs", "flags.md")) as f:
            flags_md = f.read()
        for name, _, _, rest in rows:
            tf = rest.split()[0]
            if tf != "-":
                self.assertIn(f"| `--model={tf}` | `--model {name}` |", flags_md, f"docs/flags.md lacks {name}")
        for script in ("bench/torch_peer.py", "tests/parity/torch_parity.py"):
            with open(os.path.join(src, script)) as f:
                choices = re.search(r'"--model", default="\w+", choices=\[([^]]*)\]', f.read()).group(1)
            self.assertEqual(sorted(re.findall(r'"(\w+)"', choices)), sorted(names), script)
        every = ("forward", "forward_train", "forward_backward", "step", "update")
        smallest = {r[0]: int(r[2]) for r in rows}
        # 101's blocks are 152's, fewer; VGG-16's layer kinds are AlexNet's (its 25088 x 4096 fc: the step only)
        for name, phases in (("resnet101", ("step",)), ("resnet152", every), ("vgg16", ("step",)),
                             ("alexnet", every), ("densenet121", every), ("mobilenet_v2", every)):
            # DenseNet-121 and MobileNet-v2 at 64: at their smallest, 32, the last maps are 1x1 and batch
            # norm over 2 values a channel blows the step up to infinity within a few steps (PyTorch too)
            size = 64 if name in ("densenet121", "mobilenet_v2") else smallest[name]
            rc, out, err = run("--backend", "cpu", "--model", name, "--image-size", str(size), "--batch-size", "2",
                               "--warmup", "1", "--repetitions", "1", "--phases", ",".join(phases), *FAST)
            self.assertEqual(rc, 0, err)
            for phase in phases:
                self.assertRegex(out, rf"\n\s*{phase}\s+\d", f"{name}: no {phase} row\n{out}")
            self.assertIn(f"{name} fp32 nchw {size}x{size}", out.splitlines()[0])
            low = smallest[name] - 1
            self.bad(["--backend", "cpu", "--model", name, "--image-size", str(low)], f"--image-size {low}", name,
                     f"at least {low + 1}")

    def test_booleans_are_bare_flags_and_the_old_switch_still_reads(self):
        for args in (["--no-aux-logits"], ["--aux-logits", "off"]):
            rc, out, err = run("--backend", "cpu", "--image-size", "150", *args, "--list")
            self.assertEqual(rc, 0, f"{args}: {err}")
        self.bad(["--backend", "cpu", "--image-size", "150", "--list"], "--image-size 150")

    def bad(self, args, *expect):
        rc, out, err = run(*args)
        self.assertEqual(rc, 2, f"{args}: exit {rc}\n{out}\n{err}")
        for e in expect:
            self.assertIn(e, err, f"{args}: message lacks {e!r}:\n{err}")
        self.assertNotIn("Traceback", err)
        return err

    def test_the_fabric_flags_of_the_projection(self):
        P = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--project-gpus", "8,64"]
        self.bad([*P[:6], "--gpus-per-node", "8"], "describe the fabric for --project-gpus")
        self.bad([*P, "--fabric", "ib-ndr", "--gpus-per-node", "8"], "--gpus-per-node needs the link within a node")
        self.bad([*P, "--fabric", "ib-ndr", "--node-fabric", "nvlink4"], "add --gpus-per-node")
        self.bad([*P, "--fabric", "ib-ndr", "--gpus-per-node", "8", "--node-link-gbps", "100"],
                 "needs both --node-link-gbps and --node-link-latency-us")
        self.bad([*P, "--fabric-from", "/nonexistent/nccl.json"], "--fabric-from /nonexistent/nccl.json")
        with tempfile.TemporaryDirectory() as d:
            # an nccl-tests -J file of two hosts: the link between nodes, fitted (alpha 6 us, 40 GB/s)
            n, devices, results = 16, [], []
            for r in range(16):
                devices.append({"rank": r, "hostname": "a" if r < 8 else "b", "device": r % 8})
            s = 1024
            while s <= 1 << 30:
                us = 2 * (n - 1) * 6 + 2 * (n - 1) / n * s / 40e3
                results.append({"size": s, "out_of_place": {"time": us, "alg_bw": 0, "bus_bw": 0}})
                s *= 4
            with open(f"{d}/nccl.json", "w") as f:
                json.dump({"version": 1, "config": {"devices": devices}, "results": results}, f)
            self.bad([*P, "--fabric-from", f"{d}/nccl.json", "--fabric", "ib-ndr"], "drop --fabric and --link-*")
            rc, out, err = run(*P, "--fabric-from", f"{d}/nccl.json", "--gpus-per-node", "8", "--node-fabric",
                               "nvlink4", "--phases", "step", "--warmup", "1", "--repetitions", "2", *FAST,
                               "--json", f"{d}/run.json")
            self.assertEqual(rc, 0, err)
            self.assertIn("8 GPUs per node over nvlink4", " ".join(out.split()))
            self.assertIn("--fabric-from:", out)
            with open(f"{d}/run.json") as f:
                pj = json.load(f)["projection"]
            self.assertEqual(pj["gpus_per_node"], 8)
            self.assertEqual(pj["node_link"]["name"], "nvlink4")
            self.assertAlmostEqual(pj["link"]["latency_us"], 6, delta=0.06)
            self.assertAlmostEqual(pj["link"]["gbps"], 320, delta=3.2)
            self.assertIn("fabric_from", pj)

    def test_bad_values_name_the_flag_and_the_choices(self):
        self.bad(["--precision", "fp64"], "--precision", "fp32", "bf16")
        self.bad(["--format", "nchwc"], "--format", "nhwc")
        self.bad(["--model", "vgg19"], "--model", "inception_v3", "resnet50", "resnet152", "tiny")
        self.bad(["--variable-update", "ring"], "--variable-update", "parameter_server")
        self.bad(["--optimizer", "adam"], "--optimizer", "rmsprop")
        self.bad(["--backend", "tpu"], "--backend", "cuda")
        self.bad(["--gpus", "0"], "--gpus")
        self.bad(["--batch-size", "0"], "--batch-size")
        self.bad(["--batch-size", "eight"], "--batch-size")
        self.bad(["--warmup", "0"], "--warmup")
        self.bad(["--phases", "forward,sideways"], "--phases")
        self.bad(["--recompute", "maybe"], "--recompute", "maybe", "{auto,on,off}")
        self.bad(["--fuse", "yes"], "--fuse", "yes", "{off,on}")

    def test_every_number_flag_refuses_non_finite_and_out_of_range_values(self):
        # every flag of every subcommand that takes a number with a fraction (X in stepbench --help,
        # FLOAT in the subcommands'), from their help: NaN, the infinities and absurd magnitudes are
        # refused with exit 2 naming the flag (CLI11's ranges let NaN through)
        def flags(help_text, kind):
            return sorted(set(re.findall(rf"^  (--[a-z0-9-]+) {kind}\b", help_text, re.M)))
        _, main_help, _ = run("--help")
        _, compare_help, _ = run("compare", "--help")
        _, launch_help, _ = run("launch", "--help")
        cases = [([], f, ["--backend", "cpu", "--list"]) for f in flags(main_help, "X")]
        cases += [(["compare"], f, ["/dev/null", "/dev/null"]) for f in flags(compare_help, "FLOAT")]
        cases += [(["launch"], f, ["--nproc", "1", "--", "--list"]) for f in flags(launch_help, "FLOAT")]
        self.assertGreaterEqual(len(cases), 12, cases)
        for sub, flag, rest in cases:
            for value in ("nan", "inf", "-inf", "1e300", "-1e300"):
                rc, out, err = run(*sub, flag, value, *rest, timeout=60)
                self.assertEqual(rc, 2, f"{sub} {flag} {value}: exit {rc}\n{out}{err}")
                self.assertIn(flag, err, f"{sub} {flag} {value}")

    def test_unknown_flags_and_google_benchmark_flags(self):
        self.bad(["--batchsize", "8"], "--batchsize")
        rc, _, err = run("--backend", "cpu", "--model", "tiny", "--benchmark_no_such_flag=1", "--list")
        self.assertEqual(rc, 2, err)

    def test_impossible_combinations(self):
        self.bad(["--backend", "cpu", "--gpus", "4", "--global-batch-size", "10"], "--global-batch-size 10",
                 "--gpus 4", "multiple of 4")
        self.bad(["--batch-size", "8", "--global-batch-size", "16"], "--global-batch-size")
        self.bad(["--backend", "cpu", "--precision", "tf32"], "tf32", "--precision fp32")
        # bf16 on the CPU: runs where the CPU has native bf16 (AVX512_BF16 or AMX), else exit 2 saying why
        native = native_bf16()
        rc, out, err = run("--backend", "cpu", "--model", "tiny", "--precision", "bf16", "--list")
        if native:
            self.assertEqual(rc, 0, err)
            self.assertIn("tiny bf16", out)
        else:
            self.assertEqual(rc, 2, err)
            self.assertIn("native bf16", err)
            self.assertIn("--precision fp32", err)
        self.bad(["--backend", "cpu", "--image-size", "150"], "--image-size 150", "aux")
        self.bad(["--backend", "cpu", "--image-size", "40", "--aux-logits", "off"], "--image-size 40")
        self.bad(["--backend", "cpu", "--model", "resnet50", "--image-size", "16"], "--image-size 16", "resnet50")
        self.bad(["--backend", "cpu", "--model", "resnet50", "--aux-logits", "on"], "--aux-logits", "resnet50 has none")
        self.bad(["--backend", "cpu", "--batch-size", "100000"], "batch size 100000", "GiB", "--batch-size")
        # keeping every conv + BN output, the refusal names the other way to fit; recomputing, it does not
        self.bad(["--backend", "cpu", "--batch-size", "100000", "--recompute", "off"], "--recompute on")
        rc, _, err = run("--backend", "cpu", "--batch-size", "100000", "--list")
        self.assertEqual(rc, 2, err)
        self.assertNotIn("--recompute", err)
        self.bad(["--backend", "cpu", "--ps-device", "cpu"], "--ps-device cpu", "parameter_server")
        self.bad(["--ps-device", "gpu0"], "--ps-device", "device", "cpu")
        self.bad(["--sync-timeout-s", "-1"], "--sync-timeout-s")
        self.bad(["--workspace-mb", "-5"], "--workspace-mb")
        self.bad(["--backend", "cpu", "--cuda-graph"], "--cuda-graph", "cuda backend")
        self.bad(["--backend", "cpu", "--plan-cache", "/tmp/plans.json"], "--plan-cache", "cpu")
        self.bad(["--backend", "cpu", "--own-kernels"], "--own-kernels", "cpu")

    def test_cuda_without_a_gpu_is_a_clear_error(self):
        rc, out, err = run("--backend", "cuda", "--list")
        if rc == 0:
            self.skipTest("a GPU is visible here")
        self.assertEqual(rc, 2, err)
        self.assertIn("--backend cpu", err)

    def test_asking_for_gpus_without_one_is_a_clear_error(self):
        if run("--backend", "cuda", "--model", "tiny", "--list")[0] == 0:
            self.skipTest("a GPU is visible here")
        rc, out, err = run("--gpus", "2", "--list")
        self.assertEqual(rc, 2, f"{out}\n{err}")  # never two CPU towers quietly
        self.assertIn("--gpus 2 asks for GPUs: ", err)
        self.assertIn("Add --backend cpu to run --gpus 2 on CPU towers", err)
        self.bad(["--sweep-gpus", "1,2"], "--sweep-gpus asks for GPUs", "--backend cpu")
        rc, out, err = run("--backend", "cpu", "--model", "tiny", "--gpus", "2", "--list")
        self.assertEqual(rc, 0, err)  # asked for: CPU towers
        self.assertIn("tiny/fp32/nchw/gpus:2/batch:32/step\n", out)

    def test_repetitions_are_stepbenchs_flag(self):
        self.bad(["--backend", "cpu", "--benchmark_repetitions=3"], "--repetitions N")

    def test_auto_says_what_it_picked(self):
        rc, out, err = run("--backend", "auto", "--model", "tiny", "--list")
        self.assertEqual(rc, 0, err)
        self.assertIn("--backend auto picked", err)
        self.assertLessEqual(max(len(l) for l in (out + err).splitlines()), 100, err)  # one short line

    def test_missing_or_broken_config_file(self):
        self.bad(["--config", "/nonexistent/x.toml"], "x.toml")

    def test_global_batch_size_splits_over_towers(self):
        rc, out, err = run("--backend", "cpu", "--model", "tiny", "--gpus", "2", "--global-batch-size", "8", "--list")
        self.assertEqual(rc, 0, err)
        self.assertIn("tiny/fp32/nchw/gpus:2/batch:4/step", out)
        self.assertIn("tiny/fp32/nchw/gpus:2/batch:4/grad_sync", out)

    def test_check_subcommand_errors(self):
        rc, _, err = run("check", "--weights", "/nonexistent.safetensors", "--input", "/nonexistent.npy",
                         "--output", "/tmp/x.safetensors")
        self.assertEqual(rc, 2, err)
        self.assertIn("--weights", err)
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "w.safetensors")
            with open(bad, "wb") as f:
                f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
            x = os.path.join(d, "x.npy")
            with open(x, "wb") as f:
                f.write(b"\x93NUMPY\x01\x00" + b"garbage")
            rc, _, err = run("check", "--backend", "cpu", "--model", "tiny", "--weights", bad, "--input", x,
                             "--output", os.path.join(d, "o.safetensors"))
            self.assertIn(rc, (1, 2), err)
            self.assertIn("x.npy", err)
            # check takes the main command's model flags: tf32 is tensor math on the cuda backend
            # (BackendOptions; Registry.PrecisionTf32TurnsTensorMathOn), a usage error on the cpu
            rc, _, err = run("check", "--backend", "cpu", "--model", "tiny", "--precision", "tf32", "--weights", bad,
                             "--input", x, "--output", os.path.join(d, "o.safetensors"))
            self.assertEqual(rc, 2, err)
            self.assertIn("--precision tf32 needs the cuda backend", err)
            rc, _, err = run("check", "--backend", "cpu", "--precision", "fp64", "--weights", bad, "--input", x,
                             "--output", os.path.join(d, "o.safetensors"))
            self.assertEqual(rc, 2, err)
            self.assertIn("fp32", err)

    def test_check_names_what_is_wrong_in_the_users_files(self):
        import struct

        def npy(path, descr, shape, raw):
            h = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
            h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
            with open(path, "wb") as f:
                f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + raw)

        with tempfile.TemporaryDirectory() as d:
            x, xnan, y, w = (os.path.join(d, n) for n in ("x.npy", "xnan.npy", "y.npy", "w.safetensors"))
            pixels = [0.5] * (2 * 3 * 16 * 16)
            npy(x, "<f4", "(2, 3, 16, 16)", struct.pack("<%df" % len(pixels), *pixels))
            pixels[3 * 256 + 16 * 2 + 5] = float("nan")  # sample 1, channel 0, row 2, column 5
            npy(xnan, "<f4", "(2, 3, 16, 16)", struct.pack("<%df" % len(pixels), *pixels))
            npy(y, "<i8", "(2,)", struct.pack("<2q", 2 ** 32 + 3, 1))  # would wrap to 3 as int32
            hdr = b'{"fc.weight": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}'
            with open(w, "wb") as f:
                f.write(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 8)
            base = ["check", "--backend", "cpu", "--model", "tiny", "--image-size", "16", "--output",
                    os.path.join(d, "o.safetensors")]
            for args, words in [(["--weights", w, "--input", xnan], ["xnan.npy", "element [1, 0, 2, 5] is nan"]),
                                (["--weights", w, "--input", x, "--labels", y, "--mode", "train"],
                                 ["y.npy", "label 4294967299 of sample 0 is not a class index"]),
                                (["--weights", w, "--input", x], ["--weights", "w.safetensors", "tensor"])]:
                rc, out, err = run(*base, *args)
                self.assertEqual(rc, 2, f"{args}: {out}{err}")
                for word in words:
                    self.assertIn(word, err, args)
            # the parity tests' bf16 emulation (tests only) takes 1, 0 or nothing
            p = subprocess.run([STEPBENCH, *base, "--weights", w, "--input", x], capture_output=True, text=True,
                               env={**os.environ, "STEPBENCH_EMULATE_BF16": "yes"}, timeout=300)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn("STEPBENCH_EMULATE_BF16=yes: set it to 1 (tests only) or unset it", p.stderr)


class Presets(unittest.TestCase):
    def test_a_preset_with_a_wrong_line_is_a_usage_error_naming_the_file_line_and_key(self):
        cases = [("backend = \"cpu\"\nmodel = \"tiny\"\nbatchsize = 64\n",
                  ["line 3", "unknown key 'batchsize'", "did you mean 'batch-size'"]),
                 ("model = \"tiny\"\nnot = [valid toml\n", ["line 2", "not a TOML string, number, boolean or array"]),
                 ("model = \"tiny\"\n\n# a comment\nmodel = \"inception_v3\"\n", ["line 4", "'model' is given twice (first on line 1)"]),
                 ("[run]\nmodel = \"tiny\"\n", ["line 1", "sections"]),
                 ("model \"tiny\"\n", ["line 1", "is not key = value"]),
                 ("model = \"tiny\" extra\n", ["line 1", "unexpected text after the value of 'model'"]),
                 ("warmup = 1.5.3\n", ["line 1", "unexpected text"]),
                 ("model = \"tiny\n", ["line 1", "not a TOML string"]),
                 # well-formed TOML of the wrong type or range for the flag: CLI11's message, and where
                 ("model = \"tiny\"\nwarmup = 1.5\n", ["--warmup", "the value of 'warmup'", "line 2"]),
                 ("batch-size = \"abc\"\n", ["--batch-size", "the value of 'batch-size'", "line 1"]),
                 # CLI11 would skip a key spelt with underscores, and run with the default
                 ("model = \"tiny\"\nimage_size = 40\n", ["line 2", "unknown key 'image_size'", "did you mean 'image-size'"]),
                 ("\nprecision = \"fp64\"\n", ["fp32", "the value of 'precision'", "line 2"])]
        with tempfile.TemporaryDirectory() as d:
            for text, words in cases:
                path = os.path.join(d, "p.toml")
                open(path, "w").write(text)
                rc, out, err = run("--config", path, "--backend", "cpu", "--list")
                self.assertEqual(rc, 2, f"{text!r}: exit {rc}\n{out}{err}")
                self.assertIn(path, err)
                for w in words:
                    self.assertIn(w, err, text)
            # what TOML allows still reads: comments after values, arrays, spacing
            open(path, "w").write("model = 'tiny'  # the small one\nimage-size=32\nphases = [\"forward\", \"step\",]\n")
            rc, out, err = run("--config", path, "--backend", "cpu", "--list")
            self.assertEqual(rc, 0, err)
            self.assertIn("tiny/fp32/nchw/gpus:1/batch:32/forward", out)

    def test_damaged_presets_are_read_or_refused_never_a_crash(self):
        """Truncations of a preset (every other length) and a random byte at 60 random positions: exit 0
        or a usage error naming the file, never a crash or a hang (the checker runs before --help is
        answered; each run starts the binary, so the sample is kept to ~15 s)."""
        import random
        text = open(os.path.join(CONFIGS, "cpu-inception_v3.toml"), "rb").read()
        rng = random.Random(5)
        variants = [text[:n] for n in range(0, len(text), 2)]
        for i in rng.sample(range(len(text)), 60):
            variants.append(text[:i] + bytes([rng.randrange(256)]) + text[i + 1:])
        refused = 0
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "p.toml")
            for v in variants:
                open(path, "wb").write(v)
                p = subprocess.run([STEPBENCH, "--config", path, "--help"], capture_output=True, timeout=30)
                err = p.stderr.decode(errors="replace")
                self.assertIn(p.returncode, (0, 2), f"{v!r}: exit {p.returncode}\n{err}")
                if p.returncode == 2:
                    refused += 1
                    self.assertTrue(path in err or "--" in err, f"{v!r}: {err}")
        self.assertGreater(refused, len(text) // 4)

    def test_every_preset_runs_on_the_cpu_with_a_small_override(self):
        presets = sorted(glob.glob(os.path.join(CONFIGS, "*.toml")))
        self.assertGreaterEqual(len(presets), 4)
        for p in presets:
            with self.subTest(preset=os.path.basename(p)), tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "out.json")
                rc, out, err = run("--config", p, "--backend", "cpu", "--model", "tiny", "--image-size", "32",
                                   "--batch-size", "2", "--precision", "fp32", "--warmup", "1", "--repetitions", "1",
                                   "--gpus", "2", "--json", path, *FAST)
                self.assertEqual(rc, 0, f"{p}\n{out}\n{err}")
                self.assertRegex(out, r"\nphase +median ms ")  # the summary's table
                self.assertIn("step ", out)
                with open(p, "rb") as f:
                    preset = tomllib.load(f)
                with open(path) as f:
                    ctx = json.load(f)["context"]
                # what the preset sets and the command line does not override reaches the run
                self.assertEqual(ctx["layout"], preset.get("format", "nchw"))
                self.assertEqual(ctx["variable_update"], preset.get("variable-update", "replicated"))
                # and the overrides win
                self.assertEqual((ctx["gpus"], ctx["batch_size_per_gpu"], ctx["global_batch_size"]), ("2", "2", "4"))
                self.assertEqual(ctx["model"], "tiny")


class Json(unittest.TestCase):
    def test_the_cpu_names_onednns_kernel_of_every_piece_in_fp32_and_bf16(self):
        for precision in ("fp32", "bf16"):
            if precision == "bf16" and not native_bf16():
                continue  # Flags.test_impossible_combinations checks the refusal there
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "out.json")
                rc, out, err = run("--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "4",
                                   "--precision", precision, "--warmup", "1", "--repetitions", "1", "--phases", "step",
                                   "--layer-times", "--json", path, *FAST)
                self.assertEqual(rc, 0, err)
                with open(path) as f:
                    j = json.load(f)
            pieces = j["layer_times"]["pieces"]
            convs = [p for p in pieces if p["part"].startswith("conv_")]
            fcs = [p for p in pieces if p["kind"] == "linear" and p["part"] in ("fwd", "bwd")]
            self.assertEqual(len(convs), 3 * 8 - 1, precision)  # 8 convolutions x 3 directions; no dx of the image
            self.assertEqual(len(fcs), 2, precision)
            for p in convs + fcs:
                impl = p.get("implementation", "")
                self.assertRegex(impl, r"^[a-z0-9_:+]+$", f"{precision} {p['layer']} {p['part']}")
                # bf16 pieces on bf16 kernels (or gemm, which names no type); fp32 never on a bf16 one
                self.assertEqual("bf16" in impl, precision == "bf16" and "gemm" not in impl, impl)
            self.assertIn("oneDNN's implementations of the top layers", out)
            self.assertRegex(j["context"]["linear_kernels"], r"^1 x fwd \S+ / bwd_data \S+ / bwd_weights \S+$")

    def test_fused_units_say_what_ran_fused(self):
        """--fuse on: the header says so, the context names the unstored outputs, who loads them and what
        ran the pieces, and --layer-times has the statistics-only pieces; off: none of it."""
        for fuse in ("on", "off"):
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "out.json")
                rc, out, err = run("--backend", "cpu", "--model", "resnet50", "--image-size", "32", "--batch-size", "2",
                                   "--warmup", "1", "--repetitions", "1", "--phases", "step", "--layer-times",
                                   "--fuse", fuse, "--json", path, *FAST)
                self.assertEqual(rc, 0, err)
                with open(path) as f:
                    j = json.load(f)
            ctx = j["context"]
            self.assertEqual(ctx["fuse"], fuse)
            header = out.splitlines()[0]
            parts = {p["part"] for p in j["layer_times"]["pieces"]}
            if fuse == "off":
                self.assertNotIn("fused", header)
                self.assertNotIn("fused_units", ctx)
                self.assertNotIn("bn_stats", parts)
                continue
            self.assertIn("resnet50 fp32 nchw 32x32 fused", header)
            # every bottleneck's 3 units and the 4 downsamples; the stem feeds the max pool
            self.assertEqual(ctx["fused_units"], "52 of 53 conv + BN outputs not stored, loaded through their "
                                                 "batch norm by 32 convolutions and 20 residual-add inputs")
            self.assertRegex(ctx["fused_pieces"], r"^\d+ x composed: ")
            self.assertIn("composed", ctx["batch_norm_kernels"])
            self.assertIn("bn_stats", parts)

    def test_the_share_of_peak_in_the_summary_and_json(self):
        """--peak auto measures the CPU's GEMM once into the cache and reads it back on the next run; the summary's
        'of peak' line and --json's "peak" give the step's and the forward's model FLOP/s as shares of it; a given
        figure is used as it is; off says nothing; bad values and a damaged cache exit 2 before the run."""
        tiny = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "4", "--warmup", "1",
                "--repetitions", "2", "--phases", "forward,step", *FAST]
        with tempfile.TemporaryDirectory() as d:
            cache, path = os.path.join(d, "cache", "peak.json"), os.path.join(d, "out.json")
            runs = []
            for _ in range(2):
                rc, out, err = run(*tiny, "--peak-cache", cache, "--json", path)
                self.assertEqual(rc, 0, err)
                runs.append((out, json.loads(slurp(path))["peak"]))
            (_, first), (out, second) = runs
            self.assertEqual((first["source"], second["source"]), ("measured", "cached"))
            self.assertGreater(first["tflops"], 0)
            self.assertEqual(first["tflops"], second["tflops"])
            self.assertLessEqual(first["median_tflops"], first["tflops"])
            self.assertEqual(list(json.loads(slurp(cache))["peaks"]), [first["machine"]])
            for k in ("step", "forward"):
                self.assertGreater(second[f"{k}_tflops"], 0)
                self.assertAlmostEqual(second[f"{k}_share"], second[f"{k}_tflops"] / second["tflops"], places=9)
            self.assertRegex(re.sub(r"\s+", " ", out), r"of peak step \d+\.\d% \(\S+ TFLOP/s\), forward \d+\.\d% "
                             r"\(\S+ TFLOP/s\) of the fp32 GEMM's \S+ TFLOP/s, measured here on \d{4}-\d\d-\d\d")
            # a figure given is used as it is, and no cache is read or written
            rc, out, err = run(*tiny, "--peak", "1.5", "--json", path)
            self.assertEqual(rc, 0, err)
            given = json.loads(slurp(path))["peak"]
            self.assertEqual((given["source"], given["tflops"]), ("given", 1.5))
            self.assertAlmostEqual(given["step_share"], given["step_tflops"] / 1.5, places=9)
            self.assertIn("of 1.5 TFLOP/s as given (--peak)", re.sub(r"\s+", " ", out))
            rc, out, err = run(*tiny, "--peak", "off", "--json", path)
            self.assertEqual(rc, 0, err)
            self.assertNotIn("of peak", out)
            self.assertIsNone(json.loads(slurp(path))["peak"]["tflops"])
            with open(cache, "w") as f:
                f.write('{"format": "stepbench-peak-cache/1", "peaks": {"m": {"tflops": "fast"}}}')
            rc, out, err = run(*tiny, "--peak-cache", cache)
            self.assertEqual(rc, 2, err)
            self.assertIn(f"--peak-cache {cache}: the entry", err)
            self.assertNotIn("images/s", out)  # refused before the run
        sweep = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--warmup", "1", "--sweep-batch", "2,4"]
        for args, expect in [([*tiny, "--peak", "fast"], "--peak fast: give auto, measure, off, or the device's peak"),
                             ([*tiny, "--peak", "0"], "above 0"), ([*tiny, "--peak", "1e9"], "at most 1e6"),
                             ([*tiny, "--peak", "off", "--peak-cache", "x.json"], "drop one of them"),
                             ([*tiny, "--peak", "2", "--peak-cache", "x.json"], "--peak 2 measures none"),
                             ([*tiny, "--peak-cache", ""], "--peak-cache needs a file"),
                             ([*sweep, "--peak", "measure"], "not with --sweep-*")]:
            rc, _, err = run(*args)
            self.assertEqual(rc, 2, f"{args}: {err}")
            self.assertIn(expect, err, args)

    def test_json_holds_every_phase_with_its_counters(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "out.json")
            rc, out, err = run("--backend", "cpu", "--model", "tiny", "--image-size", "32", "--gpus", "3",
                               "--batch-size", "2", "--warmup", "1", "--repetitions", "2", "--per-layer",
                               "--json", path, *FAST)
            self.assertEqual(rc, 0, f"{out}\n{err}")
            with open(path) as f:
                j = json.load(f)
        ctx = j["context"]
        for k in ["backend", "device", "onednn", "precision", "layout", "model", "gpus", "batch_size_per_gpu",
                  "global_batch_size", "variable_update", "stepbench_version"]:
            self.assertIn(k, ctx)
        self.assertEqual(ctx["gpus"], "3")
        # what ran batch norm and pooling: the cpu backend's own kernels, every layer counted
        self.assertRegex(ctx["batch_norm_kernels"], r"^[1-9][0-9]* x stepbench kernel$")
        self.assertRegex(ctx["pool_kernels"], r"^[1-9][0-9]* x stepbench kernel$")
        self.assertRegex(ctx["conv_algorithms"], r"^[1-9][0-9]* x fwd .* / bwd_data .* / bwd_filter ")
        runs = {}
        for b in j["benchmarks"]:
            if b.get("run_type") == "iteration":
                runs.setdefault(b["run_name"].removesuffix("/manual_time"), []).append(b)
        prefix = "tiny/fp32/nchw/gpus:3/batch:2/"
        want = {
            "forward": ["images/s", "TFLOP/s", "host_ms", "gap_ms"],
            "forward_train": ["images/s", "TFLOP/s", "host_ms", "gap_ms"],
            "forward_backward": ["images/s", "TFLOP/s", "forward_ms", "backward_ms", "host_ms", "gap_ms"],
            "step": ["images/s", "TFLOP/s", "forward_ms", "backward_ms", "sync_ms", "update_ms", "host_ms"],
            "grad_sync": ["algbw_GB/s", "busbw_GB/s", "bytes", "buckets", "host_ms"],
            "update": ["params/s", "host_ms"],
        }
        for phase, counters in want.items():
            name = prefix + phase
            self.assertIn(name, runs, sorted(runs))
            self.assertEqual(len(runs[name]), 2)  # --repetitions 2
            for r in runs[name]:
                self.assertGreater(r["real_time"], 0, name)
                for c in counters:
                    self.assertIn(c, r, f"{name} lacks {c}")
        self.assertEqual(ctx["global_batch_size"], "6")
        for phase in ("forward", "forward_train", "forward_backward", "step"):
            for r in runs[prefix + phase]:  # images/s is the global batch over the repetition's time
                self.assertEqual(r["time_unit"], "ms")
                self.assertAlmostEqual(r["images/s"], 6 / (r["real_time"] / 1e3), delta=1e-6 * r["images/s"])
        # the step's parts: each timed, together the whole step (marks between the phase table's calls).
        # Each part is the longest of the towers' own intervals, whose marks are recorded one tower
        # after another: their sum is at least the step, and more only by the moments between two
        # towers' records at a mark (microseconds; a preemption there is rare, 2% leaves room for one)
        for r in runs[prefix + "step"]:
            parts = [r[k] for k in ("forward_ms", "backward_ms", "sync_ms", "update_ms")]
            self.assertTrue(all(p > 0 for p in parts), parts)
            self.assertGreaterEqual(sum(parts), r["real_time"] - 0.005)
            self.assertLessEqual(sum(parts), 1.02 * r["real_time"] + 0.005)
        for r in runs[prefix + "forward_backward"]:
            self.assertGreaterEqual(r["forward_ms"] + r["backward_ms"], r["real_time"] - 0.005)
            self.assertLessEqual(r["forward_ms"] + r["backward_ms"], 1.02 * r["real_time"] + 0.005)
        # rates from each repetition's own time: TFLOP/s x ms / images is the FLOPs per image, 3x the
        # training forward's in forward+backward and the step; the sync's bytes over its time, and
        # the bus bandwidth nccl-tests' 2(n - 1)/n = 4/3 of it at 3 towers; every tower's parameters
        def flops_per_image(phase):
            return [r["TFLOP/s"] * r["real_time"] / 6 for r in runs[prefix + phase]]
        train = flops_per_image("forward_train")[0]
        self.assertGreater(train, 0)
        for phase in ("forward_train", "forward_backward", "step"):
            for f in flops_per_image(phase):
                self.assertAlmostEqual(f, (1 if phase == "forward_train" else 3) * train, delta=1e-6 * f, msg=phase)
        for r in runs[prefix + "grad_sync"]:
            self.assertGreater(r["bytes"], 0)
            self.assertAlmostEqual(r["algbw_GB/s"], r["bytes"] / 1e9 / (r["real_time"] / 1e3),
                                   delta=1e-6 * r["algbw_GB/s"])
            self.assertAlmostEqual(r["busbw_GB/s"], r["algbw_GB/s"] * 4 / 3, delta=1e-6 * r["busbw_GB/s"])
        for r in runs[prefix + "update"]:
            self.assertAlmostEqual(r["params/s"], 3 * int(ctx["parameters"]) / (r["real_time"] / 1e3),
                                   delta=1e-6 * r["params/s"])
        # names without "repeats:N", so that runs with other --repetitions match (compare.py, stepbench compare)
        self.assertFalse([b["name"] for b in j["benchmarks"] if "repeats" in b["name"]])
        aggregates = {b["aggregate_name"] for b in j["benchmarks"] if b.get("run_type") == "aggregate"}
        self.assertTrue({"median", "stddev", "mean"} <= aggregates, aggregates)
        layers = [n for n in runs if "/conv:" in n]
        self.assertTrue(any(n.endswith("/fwd") for n in layers) and any(n.endswith("/bwd_data") for n in layers)
                        and any(n.endswith("/bwd_filter") for n in layers), layers)
        for n in layers:
            self.assertIn("GFLOP/s", runs[n][0])
            self.assertIn("MACs", runs[n][0])
        self.assertIn("backward:forward", out)
        self.assertIn("grad_sync:", out)
        # the memory plan: a peak per phase, each what it holds; the backward holds what the forward saved
        mem = j["memory_plan"]
        self.assertEqual(mem["towers_per_process"], 3)
        phases = mem["phases"]
        self.assertEqual(set(phases), {"forward_only", "training_forward", "backward", "update"})
        for name, p in phases.items():
            self.assertEqual(p["peak_bytes"], sum(p["by_kind"].values()), name)
            self.assertLessEqual(p["peak_bytes"], mem["arena_bytes"], name)
            self.assertGreater(p["by_kind"]["weights"], 0, name)
            self.assertGreater(p["by_kind"]["optimizer_state"], 0, name)  # momentum, in the arena
        self.assertGreater(phases["backward"]["by_kind"]["saved"], 0)
        self.assertEqual(phases["update"]["by_kind"]["saved"], 0)
        # the inference forward keeps nothing for a backward; the training forward keeps what it will read
        self.assertEqual(phases["forward_only"]["by_kind"]["saved"], 0)
        self.assertGreater(phases["training_forward"]["by_kind"]["saved"], 0)
        self.assertLess(mem["arena_bytes"], mem["unshared_bytes"])
        self.assertGreater(mem["resident"]["peak_bytes"], mem["resident"]["before_towers_bytes"])
        # the arenas' pages are resident once the steps touched them (not every byte of a workspace is
        # written: most, not all)
        self.assertGreaterEqual(mem["resident"]["arena_resident_bytes"], 0.8 * 3 * mem["arena_bytes"])
        self.assertLessEqual(mem["resident"]["arena_resident_bytes"], 3 * mem["arena_bytes"])
        # the cpu's default: the conv + BN outputs recomputed in backward
        self.assertEqual(ctx["recompute"], "on")
        self.assertGreater(mem["recomputed_buffers"], 0)
        self.assertGreater(mem["recomputed_bytes"], 0)
        self.assertRegex(out, r"memory plan \(per tower\): peak [0-9.]+ [KMG]iB in [a-z ]+ \(weights ")
        self.assertRegex(out, r"resident memory: peak [0-9.]+ [KMG]iB")


class Output(unittest.TestCase):
    """The terminal as a user reads it: a header line, one table of the phases with the units in its
    header, the answer lines, each note and warning once, at most 100 columns; Google Benchmark's own
    table and context only with --verbose; a live progress line on a terminal and nowhere else."""
    TINY = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "4", "--warmup", "1",
            "--repetitions", "3", *FAST]
    SI = r"\d(\.\d+)?[munkMG](/s)?(?=\s|$)|\d/s(?=\s|$)"  # Google Benchmark's "6.3m", "0.2/s", "559.2M/s"

    def check_layout(self, out, err, towers):
        lines = out.splitlines()
        widths = {l: len(l) for l in lines}
        self.assertLessEqual(max(widths.values()), 100, max(widths, key=widths.get))
        self.assertRegex(lines[0], r"^stepbench \d+\.\d+\.\d+ · tiny fp32 nchw 32x32 · cpu: .+ · "
                                   + (r"1 tower" if towers == 1 else f"{towers} towers") + r" x batch 4$")
        head = next(l for l in lines if l.startswith("phase "))
        for col in ("median ms", "cv %", "images/s", "host ms", "gap ms", "% of step"):
            self.assertIn(col, head)
        for answer in ("inside the step ", "backward:forward ", "images/s "):
            self.assertTrue(any(l.startswith(answer) for l in lines), answer)
        # the answer comes before any section: within the first screen
        self.assertLess(next(i for i, l in enumerate(lines) if l.startswith("images/s ")), 24, out)
        said = [l for l in lines if l.strip()]
        self.assertEqual(len(said), len(set(said)), "a line said twice")
        self.assertNotRegex(out, self.SI)  # figures in their own units, never an SI suffix
        for gb in ("Benchmark ", "Run on (", "***WARNING***", "repeats:", "manual_time"):
            self.assertNotIn(gb, out + err)  # Google Benchmark's table and context: --verbose only
        # images/s: the towers' images over the step's median
        m = re.search(r"^images/s +([0-9.]+) in the step \((\d+) images per step\)", out, re.M)
        self.assertIsNotNone(m, out)
        self.assertEqual(int(m[2]), 4 * towers)
        step_ms = float(next(l for l in lines if l.startswith("step ")).split()[1])
        self.assertAlmostEqual(float(m[1]), 1000 * 4 * towers / step_ms, delta=0.01 * float(m[1]))
        if towers == 1:  # nothing to synchronise: no sync time beside it
            self.assertIn("nothing to synchronise", out)
            self.assertNotRegex(out, r"sync [0-9.]+ ms")
        else:
            self.assertRegex(out, r"inside the step +forward [0-9.]+ ms, backward [0-9.]+ ms, sync [0-9.]+ ms")
            self.assertRegex(out, r"\nsync share +[0-9.]+% of the step")

    def test_the_summary_reads_first_and_fits_100_columns(self):
        for towers in (1, 2):
            with self.subTest(towers=towers):
                rc, out, err = run(*self.TINY, "--gpus", str(towers))
                self.assertEqual(rc, 0, f"{out}\n{err}")
                self.check_layout(out, err, towers)

    def test_per_layer_table_and_the_reduced_default_said_once(self):
        rc, out, err = run("--backend", "cpu", "--model", "tiny", "--image-size", "32", "--per-layer", *FAST)
        self.assertEqual(rc, 0, f"{out}\n{err}")
        self.assertEqual((out + err).count("reduced CPU run: --batch-size 32 --warmup 2 --repetitions"), 1, out + err)
        self.assertLessEqual(max(len(l) for l in out.splitlines()), 100)
        self.assertRegex(out, r"\nshape +layers +fwd ms +bwd_data ms +bwd_filter ms\n")
        self.assertRegex(out, r"\nconv:32x3x32x32>16:k3x3:s2x2:p0x0 +1 +[0-9.]+ +[0-9.]+ +[0-9.]+\n")

    def test_verbose_adds_google_benchmarks_table_in_plain_units(self):
        rc, out, err = run(*self.TINY, "--phases", "forward,update", "--verbose")
        self.assertEqual(rc, 0, f"{out}\n{err}")
        table = out[out.index("Benchmark "):out.index("\nphase ")]
        self.assertIn("tiny/fp32/nchw/gpus:1/batch:4/forward", table)
        self.assertIn("batch_size_per_gpu: 4", out)  # the context
        self.assertNotRegex(table, self.SI)
        self.assertRegex(table, r"TFLOP/s +gap_ms +host_ms +images/s\n")
        if "Library was built as DEBUG" in out:  # Debian's libbenchmark: said once, and why it does not matter
            self.assertEqual(out.count("built as DEBUG"), 1)
            self.assertIn("Debian's libbenchmark package", out)
            self.assertNotIn("***WARNING***", out + err)

    def test_no_progress_line_off_a_terminal(self):
        rc, out, err = run(*self.TINY, "--phases", "forward,step")
        self.assertEqual(rc, 0, err)
        for stream in (out, err):
            self.assertNotIn("\r", stream)
            self.assertNotIn("\x1b", stream)
            self.assertNotIn("repetition 1/", stream)

    def test_a_progress_line_on_a_terminal(self):
        import pty
        master, slave = pty.openpty()
        p = subprocess.Popen([STEPBENCH, *self.TINY, "--phases", "forward,step"], stdout=subprocess.PIPE,
                             stderr=slave, env={**os.environ, "TERM": "xterm"})
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            seen += chunk
        out, _ = p.communicate(timeout=120)
        os.close(master)
        self.assertEqual(p.returncode, 0, seen)
        tty = seen.decode(errors="replace")
        self.assertRegex(tty, r"\r\x1b\[K  \[1/2\] forward · repetition 1/3 · [0-9]+ s")
        self.assertIn("[2/2] step · repetition 3/3", tty)
        self.assertTrue(tty.endswith("\r\x1b[K"), repr(tty[-80:]))  # erased at the end
        self.assertNotIn(b"\r", out)  # stdout is a pipe here: the summary only
        rc, _, _ = run(*self.TINY, "--phases", "forward")
        self.assertEqual(rc, 0)


class Interrupted(unittest.TestCase):
    """SIGINT or SIGTERM mid-run: what was measured is reported and written whole to --json, the rest is
    marked cut short, the exit status is 128 + the signal, and no partial file is left."""

    def start(self, d, *extra):
        path = os.path.join(d, "out.json")
        p = subprocess.Popen([STEPBENCH, "--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size",
                              "4", "--json", path, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return p, path

    def test_a_signal_mid_run_keeps_what_was_measured(self):
        for sig, code, name in ((signal.SIGINT, 130, "SIGINT"), (signal.SIGTERM, 143, "SIGTERM")):
            with self.subTest(name), tempfile.TemporaryDirectory() as d:
                p, path = self.start(d, "--warmup", "1", "--repetitions", "200", "--benchmark_min_time=0.05")
                deadline = time.time() + 120
                while not glob.glob(path + ".partial.*") and time.time() < deadline and p.poll() is None:
                    time.sleep(0.1)
                time.sleep(3)  # some repetitions of the first phase
                p.send_signal(sig)
                out, err = p.communicate(timeout=120)
                self.assertEqual(p.returncode, code, f"{out}\n{err}")
                self.assertIn(f"cut short by {name}", out)
                self.assertEqual(glob.glob(path + ".partial.*"), [], "a partial file was left")
                with open(path) as f:
                    j = json.load(f)  # whole JSON
                done = [b for b in j["benchmarks"] if b.get("run_type") == "iteration" and not b.get("error_occurred")]
                cut = [b for b in j["benchmarks"] if b.get("error_occurred")]
                self.assertGreater(len(done), 0, "nothing measured was kept")
                self.assertGreater(len(cut), 0)
                self.assertTrue(all(b["error_message"] == f"cut short by {name}: not measured" for b in cut))
                self.assertLess(out.count("ERROR OCCURRED"), 8, "one line per benchmark cut short, not per repetition")

    def test_a_signal_during_warm_up_measures_nothing(self):
        with tempfile.TemporaryDirectory() as d:
            p, path = self.start(d, "--warmup", "100000")
            deadline = time.time() + 120
            head = ""
            while "· 1 tower x batch 4" not in head and time.time() < deadline:  # the header, before warm-up
                head += os.read(p.stdout.fileno(), 4096).decode()
            time.sleep(1)
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 130, f"{head}{out}\n{err}")
            self.assertIn("during warm-up: nothing was measured", err)
            self.assertFalse(os.path.exists(path))
            self.assertEqual(glob.glob(path + ".partial.*"), [])


    def test_json_goes_whole_to_files_and_as_asked_to_pipes(self):
        tiny = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "4", "--warmup", "1",
                "--repetitions", "1", "--phases", "forward", *FAST]
        rc, out, err = run(*tiny, "--json", "/dev/stdout")  # not a regular file: written in place
        self.assertEqual(rc, 0, err)
        self.assertIn('"benchmarks"', out)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "out.json")
            rc, out, err = run(*tiny, "--json", path, "--benchmark_filter=no-such-phase")
            self.assertEqual(rc, 2, err)
            self.assertIn("no benchmark ran", err)
            self.assertEqual(os.listdir(d), [], "an empty --json or a partial file was left")

    def test_numbers_that_stop_being_finite_stop_the_run_saying_where(self):
        tiny = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "4"]
        # a learning rate that blows the first update up: found after warm-up, nothing timed
        rc, out, err = run(*tiny, "--learning-rate", "1e30", "--warmup", "2", *FAST)
        self.assertEqual(rc, 1, f"{out}\n{err}")
        self.assertIn("the numbers stopped being finite during warm-up", err)
        self.assertIn("the first non-finite number: the parameter conv1.conv.weight (an update wrote it)", err)
        self.assertIn("nothing was timed", err)
        # the same rate with one warm-up step: the first update is still finite (about 1e28), the second is not,
        # so the step phase blows up whatever the machine's speed (a rate that diverges slowly depended on how many
        # iterations Google Benchmark ran); forward leaves parameters and gradients alone, so it is measured
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "out.json")
            rc, out, err = run(*tiny, "--learning-rate", "1e30", "--warmup", "1", "--repetitions", "3",
                               "--phases", "forward,step", "--json", path, *FAST)
            self.assertEqual(rc, 1, f"{out}\n{err}")
            with open(path) as f:
                j = json.load(f)
        bad = [b for b in j["benchmarks"] if b.get("error_message", "").startswith("not finite:")]
        self.assertEqual(len(bad), 1, [b.get("error_message") for b in j["benchmarks"] if b.get("error_occurred")])
        self.assertIn("/step/", bad[0]["name"])
        self.assertIn("the first non-finite number: the parameter ", bad[0]["error_message"])
        after = [b for b in j["benchmarks"] if b.get("error_message", "").startswith("not run: the numbers stopped")]
        self.assertGreater(len(after), 0)
        measured = [b for b in j["benchmarks"] if b.get("run_type") == "iteration" and not b.get("error_occurred")]
        self.assertTrue(any("/forward/" in b["name"] for b in measured))  # the phases before it were kept
        self.assertIn("the numbers stopped being finite in tiny/fp32/nchw/gpus:1/batch:4/step", out)


class Peer(unittest.TestCase):
    def test_bf16_on_the_cpu_against_pytorchs_autocast(self):
        if not native_bf16():
            self.skipTest("this CPU has no native bf16 (AVX512_BF16 or AMX)")
        if subprocess.run(["/usr/bin/python3", "-c", "import torch, torchvision"], capture_output=True).returncode:
            self.skipTest("python3-torch and python3-torchvision are not installed")
        rc, out, err = run("--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "4",
                           "--precision", "bf16", "--warmup", "1", "--repetitions", "1", "--phases", "forward,step",
                           "--peer", "pytorch", "--peer-python", "/usr/bin/python3", *FAST)
        self.assertEqual(rc, 0, f"{out}\n{err}")
        self.assertIn("tiny bf16 nchw", out)
        self.assertRegex(" ".join(out.split()), r"peer settings: autocast\(cpu, bfloat16\) on the CPU")
        self.assertRegex(out, r"\nstep +[0-9.]+ .* [0-9.]+ +[0-9.]+\n")  # PyTorch's median and the ratio

    def test_pytorch_peer_adds_medians_and_ratios(self):
        if subprocess.run(["/usr/bin/python3", "-c", "import torch, torchvision"], capture_output=True).returncode:
            self.skipTest("python3-torch and python3-torchvision are not installed")
        # the peer takes stepbench's thread count (OpenMP's, from OMP_NUM_THREADS here)
        p = subprocess.run([STEPBENCH, "--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "4",
                            "--warmup", "1", "--repetitions", "1", "--phases", "forward,step", "--peer", "pytorch",
                            "--peer-python", "/usr/bin/python3", *FAST],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        rc, out, err = p.returncode, p.stdout, p.stderr
        self.assertEqual(rc, 0, f"{out}\n{err}")
        self.assertIn("PyTorch ms", out)
        self.assertIn("stepbench/PT", out)
        said = " ".join(out.split())  # the lines are wrapped at 100 columns
        self.assertIn("compares host wall time on both sides", said)
        self.assertRegex(said, r"peer settings: fp32 on the CPU, autocast=off, 1 threads, dropout 0.5, eager, "
                              r"calls per repetition [0-9]+/[0-9]+ \(forward,step\)")
        self.assertRegex(err, r"--dropout 0.5 .*--min-time 0.01 --phases forward,step --threads 1")
        for phase in ("forward", "step"):
            row = next(l for l in out.splitlines() if l.startswith(phase + " ")).split()
            mine, theirs, ratio = float(row[1]), float(row[-2]), float(row[-1])
            self.assertGreater(theirs, 0)  # PyTorch's median
            # the ratio is the quotient of the two medians, to the digits printed: both medians to
            # 5e-4 ms, the ratio to 0.005
            q = mine / theirs
            self.assertAlmostEqual(ratio, q, delta=0.005 + q * (5e-4 / mine + 5e-4 / theirs) + 1e-9, msg=" ".join(row))
        # memory beside the peer's: each process's resident peak, and above what it held before its model
        m = re.search(r"against PyTorch \S+: the process's peak ([0-9.]+) ([KMG])iB to its ([0-9.]+) ([KMG])iB, "
                      r"([0-9.]+)x; above what each held before its model was built, [0-9.]+ [KMG]iB to "
                      r"[0-9.]+ [KMG]iB, ([0-9.]+)x", said)
        self.assertTrue(m, said)
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        mine, theirs = float(m[1]) * unit[m[2]], float(m[3]) * unit[m[4]]
        self.assertGreater(theirs, 100 << 20)  # torch alone holds more than that
        self.assertAlmostEqual(float(m[5]), mine / theirs, delta=0.01 + 0.002 * mine / theirs)

    def test_layer_times_beside_the_peers_profiler(self):
        if subprocess.run(["/usr/bin/python3", "-c", "import torch, torchvision"], capture_output=True).returncode:
            self.skipTest("python3-torch and python3-torchvision are not installed")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.json")
            p = subprocess.run([STEPBENCH, "--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size",
                                "4", "--warmup", "1", "--repetitions", "3", "--phases", "step", "--layer-times",
                                "--peer", "pytorch", "--peer-python", "/usr/bin/python3", "--json", path, *FAST],
                               capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
            self.assertEqual(p.returncode, 0, f"{p.stdout}\n{p.stderr}")
            with open(path) as f:
                j = json.load(f)
        self.assertRegex(p.stderr, r"--phases step --threads 1 --layer-times 3")
        self.assertIn("layers beside PyTorch", p.stdout)
        pl = j["peer_layer_times"]
        self.assertEqual(pl["peer_steps"], 3)
        rows = {r["layer"]: r for r in pl["layers"]}
        # the layers both name: torchvision-style modules and the block's functional pool; the model's
        # own functional pools and the loss are outside any module on the peer's side
        self.assertEqual(set(rows), {"conv1", "conv2", "block.branch1x1", "block.branch5x5_1", "block.branch5x5_2",
                                     "block.branch3x3_1", "block.branch3x3_2", "block.avg_pool", "block.branch_pool",
                                     "dropout", "fc"})
        # stepbench's side is the sum of that layer's pieces per pass in layer_times
        for name, r in rows.items():
            for pass_, key in (("forward", "forward_ms"), ("backward", "backward_ms")):
                mine = sum(q["median_ms"] for q in j["layer_times"]["pieces"] if q["layer"] == name and q["pass"] == pass_)
                self.assertAlmostEqual(r[key], mine, delta=1e-9, msg=f"{name} {pass_}")
            if r["kind"] == "conv_bn_relu":
                self.assertGreater(r["peer_forward_ms"], 0, name)
                self.assertGreater(r["peer_backward_ms"], 0, name)
        # the table's row for conv1: both sides and the gap, as in the JSON to the digits printed
        beside = p.stdout[p.stdout.index("layers beside PyTorch"):]
        line = next(l for l in beside.splitlines() if l.split()[:1] == ["conv1"])
        c = rows["conv1"]
        gap = c["forward_ms"] + c["backward_ms"] - c["peer_forward_ms"] - c["peer_backward_ms"]
        self.assertAlmostEqual(float(line.split()[-1]), gap, delta=2e-3, msg=line)

    def test_resnet50s_layers_are_named_alike_on_both_sides(self):
        """The peer builds torchvision's resnet50 and times each of stepbench's units under its name:
        conv1, the bottlenecks' conv1-3, downsample and add_relu, the pools, fc."""
        if subprocess.run(["/usr/bin/python3", "-c", "import torch, torchvision"], capture_output=True).returncode:
            self.skipTest("python3-torch and python3-torchvision are not installed")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "run.json")
            p = subprocess.run([STEPBENCH, "--backend", "cpu", "--model", "resnet50", "--image-size", "32",
                                "--batch-size", "2", "--warmup", "1", "--repetitions", "1", "--phases", "step",
                                "--layer-times", "--peer", "pytorch", "--peer-python", "/usr/bin/python3", "--json",
                                path, *FAST],
                               capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
            self.assertEqual(p.returncode, 0, f"{p.stdout}\n{p.stderr}")
            with open(path) as f:
                j = json.load(f)
        self.assertRegex(p.stderr, r"--model resnet50 .*--aux-logits off")
        labels = {q["layer"] for q in j["layer_times"]["pieces"] if q["layer"]}
        rows = {r["layer"]: r for r in j["peer_layer_times"]["layers"]}
        blocks = [f"layer{s}.{b}" for s, n in ((1, 3), (2, 4), (3, 6), (4, 3)) for b in range(n)]
        want = {"conv1", "maxpool", "avgpool", "fc"} | {f"{b}.{u}" for b in blocks for u in ("conv1", "conv2", "conv3",
                                                                                               "add_relu")}
        want |= {f"layer{s}.0.downsample" for s in (1, 2, 3, 4)}
        self.assertEqual(set(rows), want)
        self.assertEqual(labels - want, {"loss(logits)"} & labels)  # every layer but the loss has its peer
        for name, r in rows.items():
            self.assertGreater(r["peer_forward_ms"], 0, name)
            self.assertGreater(r["peer_backward_ms"], 0, name)

    def test_a_peer_that_cannot_run_is_a_usage_error_before_the_benchmarks(self):
        base = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "4", "--warmup", "1",
                "--repetitions", "1", *FAST]
        rc, out, err = run(*base, "--peer", "pytorch", "--peer-python", "/nonexistent/python")
        self.assertEqual(rc, 2, err)
        self.assertIn("/nonexistent/python: not found", err)
        self.assertIn("point --peer-python at one", err)
        self.assertNotIn("median ms", out)  # nothing was timed
        rc, _, err = run(*base, "--peer", "pytorch", "--precision", "fp16")
        self.assertEqual(rc, 2, err)
        self.assertIn("compares fp32 or bf16", err)
        rc, _, err = run(*base, "--peer", "pytorch", "--peer-python", "")
        self.assertEqual(rc, 2, err)
        self.assertIn("--peer-python is empty", err)
        old = subprocess.run(["/usr/bin/python3", "-c", "import torch, torchvision, sys; "
                              "sys.exit(0 if not hasattr(torch, 'compile') else 1)"], capture_output=True).returncode
        if old == 0:  # Debian's torch 1.13 has no torch.compile
            rc, out, err = run(*base, "--peer", "pytorch-compile", "--peer-python", "/usr/bin/python3")
            self.assertEqual(rc, 2, err)
            self.assertIn("has no torch.compile (2.0 or later has)", err)


class Compare(unittest.TestCase):
    """stepbench compare and --history as a user meets them (the statistics: tests/compare)."""
    BASE = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--warmup", "1", "--repetitions", "5",
            "--phases", "forward,step", *FAST]

    def test_two_runs_compare_and_the_history_records_them(self):
        with tempfile.TemporaryDirectory() as d:
            hist = os.path.join(d, "runs.jsonl")
            for name in ("a", "b"):
                rc, out, err = run(*self.BASE, "--batch-size", "4", "--json", os.path.join(d, name + ".json"),
                                   "--history", hist)
                self.assertEqual(rc, 0, err)
            lines = slurp(hist).splitlines()
            self.assertEqual(len(lines), 2)
            rec = json.loads(lines[0])
            self.assertRegex(rec["revision"], r"^[0-9a-f]{7,}|unknown")
            self.assertEqual(rec["fingerprint"]["backend"], "cpu")
            self.assertIn("host_name", rec["fingerprint"])
            self.assertEqual(rec["configuration"]["batch_size_per_gpu"], "4")
            step = rec["benchmarks"]["tiny/fp32/nchw/gpus:1/batch:4/step"]
            self.assertEqual(len(step["ms"]), 5)
            self.assertAlmostEqual(step["median_ms"], sorted(step["ms"])[2])
            md, js = os.path.join(d, "c.md"), os.path.join(d, "c.json")
            rc, out, err = run("compare", os.path.join(d, "a.json"), os.path.join(d, "b.json"), "--markdown", md,
                               "--json", js)
            self.assertIn(rc, (0, 1), err)  # two runs back to back: whatever the machine did, not a usage error
            self.assertIn("benchmarks: tiny/fp32/nchw/gpus:1/batch:4/...", out)
            self.assertRegex(out, r"\n[a-z ]+ +step +[0-9.]+ +[0-9.]+ ")  # rows named by phase
            self.assertTrue(all(len(line) <= 102 for line in out.splitlines()), out)  # 100 columns (+ a 2-byte ±)
            verdict = json.loads(slurp(js))
            self.assertEqual(rc, 1 if verdict["regression"] else 0)
            # two lone runs: judged with the stated run-to-run noise, which the report shows
            step = next(b for b in verdict["benchmarks"] if b["benchmark"].endswith("/step"))
            self.assertEqual(step["evidence"], "runs")
            self.assertAlmostEqual(step["run_noise"], 0.35)
            self.assertGreater(step["min_detectable_change"], 0.5)
            self.assertIn("two lone runs", out)
            if verdict["unknown"]:  # --fail-on-unknown makes it the exit status
                rc2, _, err = run("compare", os.path.join(d, "a.json"), os.path.join(d, "b.json"),
                                  "--fail-on-unknown")
                self.assertEqual(rc2, 1, err)
            rc3, out3, err = run("compare", os.path.join(d, "a.json"), os.path.join(d, "b.json"), "--run-noise", "100")
            self.assertEqual(rc3, 0, err)  # nothing is beyond 100% noise
            self.assertIn("--run-noise 100.0%", out3)
            self.assertEqual({b["benchmark"].rsplit("/", 1)[1] for b in verdict["benchmarks"]}, {"forward", "step"})
            self.assertTrue(slurp(md).startswith("### stepbench compare"))
            # against the history: both records have this binary's revision, so neither is a baseline
            rc, out, err = run("compare", "--history", hist, os.path.join(d, "b.json"))
            self.assertEqual(rc, 0, err)
            self.assertIn("insufficient data", out)
            self.assertIn("no earlier run on this machine", out)

    def test_google_benchmarks_compare_matches_runs_of_different_repetitions(self):
        tool = "/usr/share/benchmark/compare.py"
        if not os.path.exists(tool):
            self.skipTest("Google Benchmark's compare.py is not installed (Debian: libbenchmark-tools)")
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for n in (2, 3):
                paths.append(os.path.join(d, f"r{n}.json"))
                rc, _, err = run("--backend", "cpu", "--model", "tiny", "--image-size", "32", "--warmup", "1",
                                 "--repetitions", str(n), "--phases", "forward", "--batch-size", "4", "--json",
                                 paths[-1], *FAST)
                self.assertEqual(rc, 0, err)
            p = subprocess.run(["/usr/bin/python3", tool, "benchmarks", *paths], capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            import re
            said = re.sub(r"\x1b\[[0-9;]*m", "", p.stdout)
            # the two runs' benchmark matched by name, its repetitions tested against each other
            self.assertRegex(said, r"\ntiny/fp32/nchw/gpus:1/batch:4/forward/manual_time_pvalue +[0-9.]+ +[0-9.]+ +U Test, "
                                   r"Repetitions: 2 vs 3", said)

    def test_bad_input_is_a_usage_error(self):
        with tempfile.TemporaryDirectory() as d:
            a = os.path.join(d, "a.json")
            rc, _, err = run(*self.BASE, "--batch-size", "4", "--json", a)
            self.assertEqual(rc, 0, err)
            b = os.path.join(d, "b.json")
            rc, _, err = run(*self.BASE, "--batch-size", "2", "--json", b)
            self.assertEqual(rc, 0, err)
            bad = os.path.join(d, "bad.json")
            open(bad, "w").write("{oops")
            for args, words in [(["compare", a, b], ["no benchmark in common"]),
                                (["compare", a], ["BASE.json HEAD.json"]),
                                (["compare", a, os.path.join(d, "missing.json")], ["missing.json"]),
                                (["compare", a, bad], ["is not JSON"]),
                                (["compare", a, a, "--threshold", "-1"], ["--threshold"]),
                                (["compare", a, a, "--run-noise", "-5"], ["--run-noise"]),
                                (["compare", "--history", a, a, a], ["with --history, give one file"])]:
                rc, out, err = run(*args)
                self.assertEqual(rc, 2, f"{args}: {out}{err}")
                for w in words:
                    self.assertIn(w, err, args)
                self.assertNotIn("Traceback", err)
            rc, _, err = run(*self.BASE, "--batch-size", "4", "--history", os.path.join(d, "no", "such", "dir.jsonl"))
            self.assertEqual(rc, 2, err)
            self.assertIn("cannot be appended to", err)


class Data(unittest.TestCase):
    def test_make_dataset_and_its_bad_values(self):
        with tempfile.TemporaryDirectory() as d:
            rc, out, err = run("make-dataset", os.path.join(d, "ds"), "--images", "6", "--classes", "2",
                               "--size", "40x30")
            self.assertEqual(rc, 0, err)
            self.assertEqual(len(glob.glob(os.path.join(d, "ds", "*", "*.jpg"))), 6)
            rc, _, err = run("make-dataset", os.path.join(d, "x"), "--size", "40by30")
            self.assertEqual(rc, 2, err)
            self.assertIn("--size", err)

    def test_missing_and_empty_folders_are_usage_errors(self):
        with tempfile.TemporaryDirectory() as d:
            for folder, words in [(os.path.join(d, "nope"), ["no such folder", "make-dataset"]),
                                  (d, ["no JPEG or PNG files"])]:
                rc, _, err = run("--backend", "cpu", "--model", "tiny", "--data", folder, "--list")
                self.assertEqual(rc, 2, err)
                for w in words:
                    self.assertIn(w, err)

    def test_jpeg_folder_with_corrupt_files_gives_a_verdict(self):
        with tempfile.TemporaryDirectory() as d:
            ds = os.path.join(d, "ds")
            self.assertEqual(run("make-dataset", ds, "--images", "12", "--classes", "3", "--size", "64x48")[0], 0)
            with open(os.path.join(ds, "class_0000", "zz_corrupt.jpg"), "wb") as f:
                f.write(b"\xff\xd8 definitely not a jpeg")
            path = os.path.join(d, "out.json")
            rc, out, err = run("--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "4",
                               "--data", ds, "--data-threads", "2", "--warmup", "1", "--repetitions", "1",
                               "--phases", "step,input_pipeline", "--json", path, *FAST)
            self.assertEqual(rc, 0, f"{out}\n{err}")
            self.assertIn("verdict:", out)
            self.assertIn("zz_corrupt.jpg", out)
            self.assertIn("skipped", out)
            with open(path) as f:
                names = {b["run_name"].removesuffix("/manual_time") for b in json.load(f)["benchmarks"]}
            self.assertIn("tiny/fp32/nchw/gpus:1/batch:4/input_pipeline", names)
            self.assertIn("tiny/fp32/nchw/gpus:1/batch:4/step:data=images", names)

    def test_png_folder_records_and_cache_with_the_stage_breakdown_and_suggest(self):
        with tempfile.TemporaryDirectory() as d:
            ds = os.path.join(d, "png")
            rc, out, err = run("make-dataset", ds, "--images", "24", "--classes", "3", "--size", "120x90",
                               "--format", "png")
            self.assertEqual(rc, 0, err)
            self.assertEqual(len(glob.glob(os.path.join(ds, "*", "*.png"))), 24)
            common = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "4",
                      "--warmup", "1", "--repetitions", "2", "--phases", "step,input_pipeline", *FAST]
            path = os.path.join(d, "out.json")
            rc, out, err = run(*common, "--data", ds, "--suggest", "--json", path)
            self.assertEqual(rc, 0, f"{out}\n{err}")
            self.assertIn("24 PNG files", out)
            for w in ["input stages:", "decode", "resize", "flip_normalise", "verdict:", "--suggest:",
                      "--cache memory", "make-records, --data OUT.records", "--data-threads 4"]:
                self.assertIn(w, out)
            with open(path) as f:
                j = json.load(f)
            st = j["input_stages"]
            self.assertGreater(st["images"], 0)
            self.assertAlmostEqual(sum(st["share"].values()), 1.0, places=6)
            # the report's claim: the stages and the waits account for the threads' time in the window
            # measured around the snapshots, within 5% (the timed iterations alone leave out the moments
            # between them). The clocks add up by construction; that each moment lands in the right
            # stage is Data.StageCountersChargeEachMomentToWhereTheThreadWas's to check
            busy = sum(st["ms_per_image"][k] for k in st["share"]) * st["images"] / 1e3
            self.assertAlmostEqual((busy + st["open_s"] + st["idle_s"]) / (st["threads"] * st["window_s"]), 1.0,
                                   delta=0.05)
            self.assertLessEqual(st["wall_s"], st["window_s"])
            self.assertEqual([r["remedy"] for r in st["suggest"]],
                             ["as run", "--data-threads 4", "--cache memory", "make-records, --data OUT.records",
                              "--decode gpu"])
            self.assertTrue(all(r["images_per_s"] > 0 for r in st["suggest"][:4]), st["suggest"])
            # --decode gpu: nvJPEG decodes JPEG on a GPU; PNG files on the cpu backend, said why
            self.assertEqual(st["suggest"][4]["images_per_s"], 0)
            self.assertIn("not measured", st["suggest"][4]["note"])
            self.assertEqual(j["context"]["data_kind"], "images")
            # the same folder as a record file, and cached
            rec = os.path.join(d, "png.records")
            rc, out, err = run("make-records", ds, rec, "--image-size", "32")
            self.assertEqual(rc, 0, err)
            self.assertIn("wrote 24 images of 37x37", out)
            rc, out, err = run(*common, "--data", rec)
            self.assertEqual(rc, 0, f"{out}\n{err}")
            self.assertIn("record file: 24 images of 37x37", out)
            self.assertIn("step:data=records", out)
            rc, out, err = run(*common, "--data", ds, "--cache", "memory")
            self.assertEqual(rc, 0, f"{out}\n{err}")
            self.assertIn("cached in memory", out)
            self.assertIn("step:data=images+cache", out)
            # refusals: exit 2 and what to change
            for args, words in [
                    (["--data", ds, "--cache", "memory", "--cache-limit-mb", "1", "--image-size", "299"],
                     ["--cache memory needs", "MiB", "make-records"]),
                    (["--data", path], ["not a stepbench record file"]),
                    (["--cache", "memory"], ["--data DIR"]),
                    (["--data", rec, "--cache", "memory"], ["already decoded"]),
                    (["--suggest"], ["--data DIR"]),
                    (["--data", ds, "--cache", "disk"], ["none or memory"]),
                    (["--data", ds, "--cache-limit-mb", "5"], ["add --cache memory"]),
                    (["--data", ds, "--decode", "gpu"], ["--decode gpu", "cpu backend", "drop it"]),
                    (["--decode", "gpu"], ["--data DIR"]),
                    (["--data", rec, "--decode", "gpu"], ["already decoded", "drop --decode gpu"]),
                    (["--data", ds, "--decode", "tpu"], ["--decode", "cpu", "gpu"])]:
                rc, _, err = run("--backend", "cpu", "--model", "tiny", *args, "--list")
                self.assertEqual(rc, 2, f"{args}: {err}")
                for w in words:
                    self.assertIn(w, err, args)
            with open(rec, "r+b") as f:
                f.truncate(os.path.getsize(rec) - 7)
            rc, _, err = run(*common, "--data", rec)
            self.assertEqual(rc, 2, err)
            self.assertIn("truncated", err)
            rc, _, err = run("make-records", os.path.join(d, "nope"), rec)
            self.assertEqual(rc, 2, err)
            self.assertIn("no such folder", err)

    def test_synthetic_host_staging_over_two_towers(self):
        rc, out, err = run("--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "4",
                           "--gpus", "2", "--data", "synthetic-host", "--warmup", "1", "--repetitions", "1",
                           "--phases", "step,input_pipeline", *FAST)
        self.assertEqual(rc, 0, f"{out}\n{err}")
        self.assertIn("step:data=synthetic-host", out)
        self.assertIn("verdict:", out)


MPIRUN = ["mpirun", "--oversubscribe", "-np", "2"]
MPI_ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
TINY = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "4", "--warmup", "1",
        "--repetitions", "1", *FAST]


@unittest.skipUnless(shutil.which("mpirun"), "mpirun not found (Debian: openmpi-bin)")
class Mpi(unittest.TestCase):
    def mpirun(self, *args, env=None, timeout=120):
        t0 = time.monotonic()
        p = subprocess.run([*MPIRUN, STEPBENCH, *args], capture_output=True, text=True, timeout=timeout,
                           env={**MPI_ENV, **(env or {})})
        return p.returncode, p.stdout + p.stderr, time.monotonic() - t0

    def test_a_stalled_process_ends_the_run_with_a_message_not_a_hang(self):
        # process 1 sleeps 90 s before its first gradient sync; process 0 gives up after 2 s
        rc, out, secs = self.mpirun(*TINY, "--phases", "step", "--sync-timeout-s", "2",
                                    env={"STEPBENCH_FAULT_SYNC_STALL": "1:90"})
        self.assertNotEqual(rc, 0, out)
        self.assertIn("did not complete within 2 s on process 0 of 2", out)
        # the silent rank is named, not the healthy one that reports it
        self.assertRegex(out, r"on process 0 of 2: rank 1 \(pid [0-9]+ on [^)]+\) did not answer within 2 s")
        self.assertIn("--sync-timeout-s", out)
        self.assertLess(secs, 60, f"took {secs:.0f} s: the other process was not ended\n{out}")

    def test_two_levels_with_a_node_split(self):
        # mpirun on one machine: --procs-per-node 2 makes 4 processes 2 nodes; MPI splits its communicator
        p = subprocess.run([*MPIRUN[:-1], "4", STEPBENCH, *TINY, "--phases", "step,grad_sync", "--variable-update",
                            "distributed_all_reduce", "--procs-per-node", "2"], capture_output=True, text=True,
                           timeout=300, env={**os.environ, **MPI_ENV})
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("2 nodes x 2 processes (MPI, started by mpirun)", out)
        self.assertRegex(out, r"grad_sync: +over MPI in two levels \(2 nodes x 2 processes\) \+ host memory")
        self.assertRegex(out, r"all-reduce across the nodes: [0-9.]+ ms, algbw")
        rc, out, _ = self.mpirun(*TINY, "--procs-per-node", "3")
        self.assertEqual(rc, 2, out)
        self.assertIn("--procs-per-node 3: the 2 processes do not split into nodes of 3", out)

    def test_the_asynchronous_server_needs_gloo(self):
        rc, out, _ = self.mpirun(*TINY, "--variable-update", "parameter_server", "--cross-replica-sync", "off")
        self.assertEqual(rc, 2, out)
        self.assertIn("--cross-replica-sync off needs the processes to meet through Gloo", out)

    def test_a_killed_process_ends_the_run_naming_it(self):
        # process 1 is killed (SIGKILL) mid-run: the other ends too, within the timeout, and the output
        # names the rank that died (mpirun notices the death and ends the job)
        t0 = time.monotonic()
        args = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "4", "--warmup", "1",
                "--phases", "step", "--repetitions", "1000", "--sync-timeout-s", "30", *FAST]
        p = subprocess.Popen([*MPIRUN, STEPBENCH, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, **MPI_ENV})
        victim = None
        while victim is None and time.monotonic() - t0 < 60 and p.poll() is None:
            for pid in os.listdir("/proc"):
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        env = f.read().split(b"\0")
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read()
                except OSError:
                    continue
                if b"OMPI_COMM_WORLD_RANK=1" in env and STEPBENCH.encode() in cmd and int(pid) != p.pid:
                    victim = int(pid)
            time.sleep(0.2)
        self.assertIsNotNone(victim, "rank 1 never started")
        time.sleep(3)  # into the benchmarks
        os.kill(victim, signal.SIGKILL)
        out, _ = p.communicate(timeout=120)
        secs = time.monotonic() - t0
        self.assertNotEqual(p.returncode, 0, out)
        self.assertRegex(out, r"rank 1\b", out)
        self.assertLess(secs, 90, f"took {secs:.0f} s: the other process was not ended\n{out}")

    def test_parameter_server_on_the_host_across_processes(self):
        rc, out, _ = self.mpirun(*TINY, "--phases", "step,grad_sync", "--variable-update", "parameter_server",
                                 "--ps-device", "cpu")
        self.assertEqual(rc, 0, out)
        self.assertIn("host memory (parameter server on the CPU) + MPI over 2 processes", " ".join(out.split()))


# the straggler report: a slowed tower is named with its cost, on CPU towers in one process and across
# processes; a quiet run has no chronic straggler
SLOW = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "8", "--warmup", "2",
        "--repetitions", "5", "--phases", "step", "--benchmark_min_time=0.05"]


class Stragglers(unittest.TestCase):
    def report(self, cmd, env=None, whole=False):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run([*cmd, "--json", f"{d}/run.json"], capture_output=True, text=True, timeout=300,
                               env={**os.environ, **(env or {})})
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            with open(f"{d}/run.json") as f:
                j = json.load(f)
                return p.stdout, (j if whole else j["stragglers"])

    def quiet_run(self, cmd, env=None):
        """A run of cmd without a slowed tower: its straggler report, and the median step (ms) and its spread
        (scaled MAD over the median) over the step's repetitions as Google Benchmark timed them, not a figure
        of the report under test."""
        _, whole = self.report(cmd, env, whole=True)
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
        steps = [b["real_time"] * scale[b.get("time_unit", "ms")] for b in whole["benchmarks"]
                 if b.get("run_type") == "iteration" and re.search(r"/step(/|$)", b["run_name"])]
        self.assertGreaterEqual(len(steps), 3, whole["benchmarks"])
        med = sorted(steps)[len(steps) // 2]
        return whole["stragglers"], med, 1.4826 * sorted(abs(x - med) for x in steps)[len(steps) // 2] / med

    def check_named(self, cmd, tower, rank, env=None):
        # the slowed tower named, with the cost what the injected delay adds to the step within 25% (the delay,
        # or the step's growth over a quiet run), in one of three runs at most. The hold is one the machine's
        # own noise cannot hide: 1.5x the tower's compute where a quiet run's steps spread by under 5%, else
        # 6 times that spread of the step (at least half a step), in ms.
        quiet, med, spread = self.quiet_run(cmd, env)
        hold = f"{tower}:1.5" if spread < 0.05 else f"{tower}:{max(0.5, 6 * spread) * med:.2f}ms"
        misses = []
        for _ in range(3):
            out, s = self.report([*cmd, "--slow-tower", hold], env)
            injected, added = s["injected"]["delay_ms"], s["step_ms"] - quiet["step_ms"]
            self.assertGreater(injected, 0, out)
            named = s["slowest"] == tower and s["towers"][tower]["rank"] == rank and \
                f"slowest: tower {tower} (rank {rank}" in out and s["verdict"] in ("chronic", "occasional")
            if named and min(abs(s["cost_ms"] - injected) / injected, abs(s["cost_ms"] - added) / max(added, 1e-9)) < 0.25:
                return
            misses.append(f"slowest {s['slowest']} ({s['verdict']}), cost {s['cost_ms']:.3f} ms for {injected:.3f} ms "
                          f"injected, the step {added:.3f} ms longer than a quiet run's")
        self.fail(f"--slow-tower {hold} (the quiet run's steps spread by {100 * spread:.1f}%): " + "; ".join(misses)
                  + "\n" + out)

    def test_cpu_towers_name_the_slowed_tower_and_its_cost(self):
        self.check_named([STEPBENCH, *SLOW, "--gpus", "2"], 1, 0)

    def test_a_quiet_run_has_no_chronic_straggler(self):
        verdicts = []
        for _ in range(2):  # a busy machine can slow one tower in every repetition of one run
            out, s = self.report([STEPBENCH, *SLOW, "--gpus", "2"])
            self.assertNotIn("injected", s)
            self.assertEqual(len(s["towers"]), 2)
            verdicts.append(s["verdict"])
            if s["verdict"] != "chronic":
                return
        self.fail(f"{verdicts}\n{out}")

    def test_the_top_k_and_a_delay_in_ms(self):
        # a hold in ms that the machine's noise cannot hide: half a quiet run's step at least, 6 times its
        # spread where that is more (a fixed 4 ms went unseen where a loaded machine made the step 2.8 s)
        cmd = [STEPBENCH, *SLOW, "--gpus", "3", "--straggler-top", "2"]
        _, med, spread = self.quiet_run(cmd)
        hold = round(max(0.5, 6 * spread) * med, 2)
        out, s = self.report([*cmd, "--slow-tower", f"2:{hold:.2f}ms"])
        self.assertEqual(s["slowest"], 2, out)
        self.assertAlmostEqual(s["injected"]["delay_ms"], hold, places=2)
        table = out[out.index("  tower  rank"):].splitlines()[1:]
        rows = [l for l in table if re.match(r"^ +\d+ +\d+ ", l)]
        self.assertEqual(len(rows), 2, out)  # --straggler-top 2 of 3
        self.assertTrue(rows[0].split()[0] == "2", out)

    @unittest.skipUnless(os.environ.get("STEPBENCH_HAS_GLOO", "1") == "1", "built without Gloo")
    def test_two_processes_under_launch(self):
        self.check_named([STEPBENCH, "launch", "--nproc", "2", "--", *SLOW], 1, 1)

    @unittest.skipUnless(shutil.which("mpirun"), "mpirun not found (Debian: openmpi-bin)")
    def test_two_processes_under_mpirun(self):
        # Open MPI polls while it waits: yield then, or two ranks' polling threads take the two cores
        self.check_named([*MPIRUN, STEPBENCH, *SLOW], 1, 1,
                         env={**MPI_ENV, "OMP_NUM_THREADS": "1", "OMPI_MCA_mpi_yield_when_idle": "1"})

    @unittest.skipUnless(os.environ.get("STEPBENCH_HAS_GLOO", "1") == "1", "built without Gloo")
    def test_one_trace_for_two_processes(self):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run([STEPBENCH, "launch", "--nproc", "2", "--", *SLOW, "--trace", f"{d}/t.json"],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertEqual(sorted(os.listdir(d)), ["t.json"])  # no FILE.rank1
            with open(f"{d}/t.json") as f:
                t = json.load(f)
        names = {e["args"]["name"] for e in t["traceEvents"] if e.get("name") == "process_name"}
        self.assertIn("rank 1", " ".join(names))
        self.assertEqual(len({e["pid"] for e in t["traceEvents"] if e.get("ph") == "X"}) >= 2, True, names)
        self.assertEqual(t["otherData"]["processes"], 2)
        # each tower's track: its compute (forward, backward) and its wait for the sync (grad_sync), and
        # the gradient buckets' syncs on a track of their own
        for pid in (0, 1):
            phases = {e["name"] for e in t["traceEvents"] if e.get("pid") == pid and e.get("cat") == "phase"}
            self.assertTrue({"forward", "backward", "grad_sync"} <= phases, (pid, phases))
            self.assertTrue(any(e.get("pid") == pid and e.get("cat") == "sync" for e in t["traceEvents"]), pid)

    def test_bad_values_are_usage_errors(self):
        for args, expect in [(["--gpus", "2", "--slow-tower", "x"], "give TOWER:FACTOR"),
                             (["--gpus", "2", "--slow-tower", "1:0.5"], "the factor is out of range"),
                             (["--gpus", "2", "--slow-tower", "1:0ms"], "the delay is out of range"),
                             (["--gpus", "2", "--slow-tower", "5:1.5"], "there are 2 towers"),
                             (["--slow-tower", "0:1.5"], "needs two towers or more"),
                             (["--gpus", "2", "--straggler-top", "0"], "--straggler-top"),
                             (["--straggler-top", "2"], "it needs two towers or more"),
                             (["--gpus", "2", "--slow-tower", ""], "give TOWER:FACTOR")]:
            rc, out, err = run(*SLOW, *args, timeout=120)
            self.assertEqual(rc, 2, f"{args}: {out}{err}")
            self.assertIn(expect, err, args)


# a run that goes on until it is stopped
LONG = ["--backend", "cpu", "--model", "tiny", "--image-size", "32", "--batch-size", "4", "--warmup", "1", "--phases",
        "step", "--repetitions", "1000", *FAST]


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_rank(rank, launcher_pid, timeout=60):
    """The pid of the process that stepbench launch started as `rank`, once it runs."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == launcher_pid and f"RANK={rank}".encode() in env:
                return int(pid)
        time.sleep(0.1)
    return None


@unittest.skipUnless(os.environ.get("STEPBENCH_HAS_GLOO", "1") == "1", "built without Gloo")
class Launch(unittest.TestCase):
    """Several processes without mpirun: stepbench launch, torchrun (its variables by hand, and the
    real one from Debian's PyTorch), a file rendezvous; what happens when one is missing, killed or
    stalled; and the refusals of variables that disagree."""

    def launch(self, *args, env=None, timeout=180):
        t0 = time.monotonic()
        p = subprocess.run([STEPBENCH, "launch", "--nproc", "2", "--", *args], capture_output=True, text=True,
                           timeout=timeout, env={**os.environ, **(env or {})})
        return p.returncode, p.stdout + p.stderr, time.monotonic() - t0

    def by_hand(self, envs, *args, timeout=180):
        procs = [subprocess.Popen([STEPBENCH, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, **e}) for e in envs]
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
        return [p.returncode for p in procs], outs

    def test_launch_runs_the_step_over_gloo_and_rank_0_reports(self):
        rc, out, _ = self.launch(*TINY, "--phases", "step,grad_sync")
        self.assertEqual(rc, 0, out)
        self.assertIn("2 processes (Gloo, started by stepbench launch) x 1 tower x batch", out)
        self.assertRegex(out, r"grad_sync: .* over Gloo over 2 processes \+ host memory")
        self.assertEqual(len(re.findall(r"\nphase +median ms ", out)), 1, out)

    def test_nodes_on_one_machine(self):
        # --nodes M: M groups of N / M processes with node ids of their own (torchrun's GROUP_RANK)
        p = subprocess.run([STEPBENCH, "launch", "--nproc", "4", "--nodes", "2", "--", *TINY, "--phases",
                            "step,grad_sync"], capture_output=True, text=True, timeout=300)
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("2 nodes x 2 processes (Gloo, started by stepbench launch) x 1 tower x batch 4", out)
        self.assertRegex(out, r"grad_sync: .* over Gloo over 4 processes")
        p = subprocess.run([STEPBENCH, "launch", "--nproc", "4", "--nodes", "3", "--", *TINY], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("--nproc 4 does not split into --nodes 3 of the same size", p.stderr)
        # torchrun's variables by hand: GROUP_RANK past the nodes the sizes make is refused naming it
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "GROUP_RANK": "2"}
        p = subprocess.run([STEPBENCH, *TINY, "--rendezvous", "file:/tmp/stepbench-never"], capture_output=True,
                           text=True, timeout=60, env=env)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("node 2 is outside the 2 nodes", p.stderr)

    def test_multi_node_launch_refusals(self):
        # --nnodes without a meeting place, a node rank outside them, --nodes across machines, both
        # --master and --rendezvous, a master that does not parse or resolve, node 0 on another host
        for args, say in ((["--nnodes", "2"], "needs where the machines meet"),
                          (["--nnodes", "2", "--node-rank", "2", "--master", "localhost:29500"],
                           "--node-rank 2 is outside --nnodes 2"),
                          (["--nnodes", "2", "--nodes", "2", "--nproc", "4", "--master", "localhost:29500"],
                           "--nodes poses nodes on one machine"),
                          (["--master", "localhost:29500", "--rendezvous", "file:/tmp/x"], "not both"),
                          (["--master", "localhost"], "give HOST:PORT"),
                          (["--nnodes", "2", "--node-rank", "1", "--master", "nohost.invalid:29500"],
                           "does not resolve"),
                          (["--nnodes", "2", "--master", "192.0.2.1:29500"], "is not an address of this machine")):
            nproc = [] if "--nproc" in args else ["--nproc", "2"]
            p = subprocess.run([STEPBENCH, "launch", *nproc, *args, "--", *TINY], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(p.returncode, 2, f"{args}: {p.stdout}{p.stderr}")
            self.assertIn(say, p.stderr, args)
            self.assertNotIn("stepbench: stepbench", p.stderr)

    def test_two_levels_on_two_nodes_and_a_rank_of_the_second_killed(self):
        # distributed_all_reduce over 4 processes posing as 2 nodes: the summary times each level
        p = subprocess.run([STEPBENCH, "launch", "--nproc", "4", "--nodes", "2", "--", *TINY, "--phases",
                            "step,grad_sync", "--variable-update", "distributed_all_reduce"], capture_output=True,
                           text=True, timeout=300)
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        self.assertRegex(out, r"grad_sync: +over Gloo in two levels \(2 nodes x 2 processes\) \+ host memory")
        for level in ("reduce-scatter within each node", "all-reduce across the nodes", "all-gather within each node"):
            self.assertRegex(out, level + r": [0-9.]+ ms, algbw [0-9.]+ GB/s, busbw [0-9.]+ GB/s")
        self.assertRegex(out, r"slowest: tower [0-3] \(rank [0-3], node [01], ")
        # distributed_replicated: node sums pushed to a server on each node, the values pulled back
        p = subprocess.run([STEPBENCH, "launch", "--nproc", "4", "--nodes", "2", "--", *TINY, "--phases",
                            "step,grad_sync", "--variable-update", "distributed_replicated", "--ps-ranks", "2"],
                           capture_output=True, text=True, timeout=300)
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        self.assertRegex(out, r"over Gloo in two levels \(2 nodes x 2 processes\) to 2 parameter servers")
        for level in ("sum within each node", "push to the parameter servers", "pull from the parameter servers"):
            self.assertRegex(out, level + r": [0-9.]+ ms, algbw [0-9.]+ GB/s")
        for args, said in ((["--ps-ranks", "3"], "--ps-ranks 3: at most one parameter server per node, and there "
                                                  "are 2"),
                           (["--variable-update", "replicated", "--ps-ranks", "2"],
                            "--ps-ranks applies to --variable-update distributed_replicated only")):
            mode = [] if "--variable-update" in args else ["--variable-update", "distributed_replicated"]
            p = subprocess.run([STEPBENCH, "launch", "--nproc", "4", "--nodes", "2", "--", *TINY, *mode, *args],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
            self.assertIn(said, p.stderr)
        # rank 3 (node 1) killed mid-run: the launcher names it first, and a rank that shares a level with
        # it (rank 2 within node 1, rank 1 across the nodes) names it too (each names what it waited on:
        # the dead rank, or one that ended because of it); all within the timeout
        t0 = time.monotonic()
        p = subprocess.Popen([STEPBENCH, "launch", "--nproc", "4", "--nodes", "2", "--grace-s", "20", "--", *LONG,
                              "--variable-update", "distributed_all_reduce", "--sync-timeout-s", "30"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        victim = find_rank(3, p.pid)
        self.assertIsNotNone(victim, "rank 3 never started")
        time.sleep(4)  # into the benchmarks
        os.kill(victim, signal.SIGKILL)
        out, _ = p.communicate(timeout=120)
        said = [l for l in out.splitlines() if l.startswith("stepbench launch: rank")]
        self.assertTrue(said, out)
        self.assertRegex(said[0], rf"rank 3 \(pid {victim}\) was killed by signal 9", out)
        # (a rank that failed elsewhere first, and so never answered, may be named too: the dead one must
        # be among those named)
        self.assertRegex(out, rf"on process [12] of 4: ranks? (?:[0-9]+ \(pid [0-9]+ on [^)]+\), )*3 \(pid {victim} "
                              rf"on [^)]+\) did not answer")
        self.assertEqual(p.returncode, 128 + 9, out)
        self.assertLess(time.monotonic() - t0, 90, out)

    def test_the_projection_beside_a_measured_run_of_two_nodes(self):
        # --project-gpus over 4 processes as 2 nodes: from process 0's compute and the links each level
        # reached in grad_sync, the two-level step at 4 GPUs beside the step measured, with the error
        with tempfile.TemporaryDirectory() as d:
            js = os.path.join(d, "run.json")
            p = subprocess.run([STEPBENCH, "launch", "--nproc", "4", "--nodes", "2", "--", *TINY, "--phases",
                                "step,grad_sync", "--variable-update", "distributed_all_reduce", "--project-gpus",
                                "2,4,16", "--fabric-from", "run", "--json", js, "--trace", f"{d}/t.json"],
                               capture_output=True, text=True, timeout=300)
            out = p.stdout + p.stderr
            self.assertEqual(p.returncode, 0, out)
            flat = " ".join(out.split())
            self.assertIn("projection checked against this run of 4 processes, one tower each, as 4 GPUs", flat)
            self.assertIn("2 GPUs per node over this run's grad_sync", flat)
            self.assertIn("2-level as the run did", flat)
            row = re.search(r"\n +4 +([0-9.]+) .* 2-level +([0-9.]+) +([+-][0-9.]+)%\n", out)
            self.assertIsNotNone(row, out)
            self.assertAlmostEqual(float(row[3]), 100 * (float(row[1]) / float(row[2]) - 1), delta=0.11)
            self.assertRegex(out, r"\n +16 +[0-9.]+ .* 2-level +- +-\n")  # projected, not measured
            with open(js) as f:
                j = json.load(f)
            pj = j["projection"]
            self.assertEqual((pj["processes"], pj["algorithm"], pj["gpus_per_node"]), (4, "2-level", 2))
            self.assertFalse(pj["towers_one_after_another"])
            at4 = next(r for r in pj["points"] if r["gpus"] == 4)
            step = next(b for b in j["benchmarks"] if "/step/" in b["name"] + "/")
            self.assertAlmostEqual(at4["measured_step_ms"], step["real_time"], delta=1e-6 * step["real_time"])
            self.assertAlmostEqual(at4["error"], at4["step_ms"] / at4["measured_step_ms"] - 1, places=9)
            # one GPU's step is process 0's steps less their wait for the sync: below the measured step by
            # about that wait (the step row's sync_ms, process 0's mean)
            self.assertLess(pj["one_gpu_step_ms"], at4["measured_step_ms"] - 0.5 * step["sync_ms"], pj)
            # the projected step by hand from the JSON: per bucket, with no latency, the reduce-scatter and
            # all-gather of 2 GPUs, 2 (G-1) (s/G) / beta, and the ring of each share over the 2 nodes,
            # 2 (m-1) (s/G) / (m beta), one bucket after another from when backward produced it
            per_ms = lambda gbps: gbps * 1e9 / 8 / 1e3  # noqa: E731 (bytes per ms)
            end = 0
            for b in pj["buckets"]:
                share = b["bytes"] / 2
                t = 2 * share / per_ms(pj["node_link"]["gbps"]) + share / per_ms(pj["link"]["gbps"])
                end = max(end, b["ready_ms"]) + t
            by_hand = pj["one_gpu_step_ms"] + max(0, end - pj["backward_ms"])
            self.assertAlmostEqual(at4["step_ms"], by_hand, delta=1e-9 * by_hand)
            self.assertNotIn("measured_step_ms", next(r for r in pj["points"] if r["gpus"] == 16))
            # the links are the levels' busbw in grad_sync (GB/s to Gb/s), with no latency
            gs = next(b for b in j["benchmarks"] if "/grad_sync/" in b["name"] + "/")
            self.assertAlmostEqual(pj["link"]["gbps"], 8 * gs["cross_node_all_reduce_busbw_GB/s"], places=6)
            rs, ag = gs["node_reduce_scatter_busbw_GB/s"], gs["node_all_gather_busbw_GB/s"]
            self.assertAlmostEqual(pj["node_link"]["gbps"], 8 * 2 / (1 / rs + 1 / ag), places=6)
            self.assertEqual((pj["link"]["latency_us"], pj["node_link"]["latency_us"]), (0, 0))
            # the trace: a track per level in every process, each call inside its bucket's sync
            with open(f"{d}/t.json") as f:
                ev = json.load(f)["traceEvents"]
            for pid in range(4):
                lv = [e for e in ev if e.get("pid") == pid and e.get("cat") == "sync level"]
                bk = [e for e in ev if e.get("pid") == pid and e.get("cat") == "sync"]
                self.assertEqual({e["name"] for e in lv}, {"reduce-scatter within each node",
                                                          "all-reduce across the nodes", "all-gather within each node"})
                self.assertEqual(len(lv), 3 * len(bk), pid)
                for e in lv:
                    self.assertTrue(any(b["args"]["step"] == e["args"]["step"] and b["ts"] - 100 <= e["ts"] and
                                        e["ts"] + e["dur"] <= b["ts"] + b["dur"] + 100 for b in bk), (pid, e))
        # replicated over 2 processes as 2 nodes: Gloo's ring, one link
        p = subprocess.run([STEPBENCH, "launch", "--nproc", "2", "--nodes", "2", "--", *TINY, "--phases",
                            "step,grad_sync", "--project-gpus", "2", "--fabric-from", "run"],
                           capture_output=True, text=True, timeout=300)
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        self.assertRegex(out, r"\n +2 +[0-9.]+ .* ring +[0-9.]+ +[+-][0-9.]+%\n")
        # what the check cannot be: one process, several towers per process, another shape of node
        for args, said in (
                (["launch", "--nproc", "2", "--", *TINY, "--gpus", "2", "--project-gpus", "4", "--fabric-from",
                  "run"], "use --gpus 1"),
                (["launch", "--nproc", "4", "--nodes", "2", "--", *TINY, "--variable-update",
                  "distributed_all_reduce", "--project-gpus", "4", "--fabric", "ib-ndr"],
                 "give --gpus-per-node 2 with the link within a node, or --fabric-from run"),
                ([*TINY, "--project-gpus", "4", "--fabric-from", "run"],
                 "--fabric-from run fits the links to this run's gradient sync across processes"),
                ([*TINY, "--project-gpus", "4", "--fabric-from", "run", "--phases", "step"],
                 "add grad_sync to --phases"),
                ([*TINY, "--project-gpus", "4", "--fabric-from", "run", "--fabric", "ib-ndr"],
                 "--fabric-from run takes the links and the nodes from this run"),
                ([*(a for a in TINY if a not in FAST), "--project-gpus", "4", "--fabric-from", "run", "--sweep-gpus",
                  "1,2"],
                 "not a sweep: drop --sweep-*"),
                (["launch", "--nproc", "2", "--", *TINY, "--variable-update", "distributed_all_reduce",
                  "--project-gpus", "2", "--fabric-from", "run"], "this run has one node"),
                (["launch", "--nproc", "4", "--nodes", "2", "--", *TINY, "--project-gpus", "4", "--fabric", "ib-ndr",
                  "--gpus-per-node", "4", "--node-fabric", "nvlink4"], "give --gpus-per-node 2, or drop it")):
            p = subprocess.run([STEPBENCH, *args], capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 2, f"{args}\n{p.stdout}{p.stderr}")
            self.assertIn(said, " ".join(p.stderr.split()), args)

    def test_a_killed_rank_in_the_parameter_server_modes(self):
        # the launcher names the dead rank first, a process that waited on it names it too, and the run ends
        # within the timeout: distributed_replicated (rank 3, a worker of node 1, whose first process
        # serves); the asynchronous server (rank 2, a worker: the server's thread for it sees its
        # connection close); asynchronous distributed_replicated (rank 2, node 1's pusher, with one server;
        # and with two, when it also serves: the others fail inside their round trips to it)
        async_off = ["--cross-replica-sync", "off"]
        for n, nodes, victim_rank, mode in (
                (4, 2, 3, ["--variable-update", "distributed_replicated", "--ps-ranks", "2"]),
                (3, 1, 2, ["--variable-update", "parameter_server", *async_off]),
                (4, 2, 2, ["--variable-update", "distributed_replicated", *async_off]),
                (4, 2, 2, ["--variable-update", "distributed_replicated", "--ps-ranks", "2", *async_off])):
            # into the benchmarks: a killed rank is named by the others from there on, not while they wait
            # for it at the store in set-up (CI once killed it at 4 s, still in a loaded machine's set-up,
            # and the others waited past the grace). So first time set-up, here and now: one repetition
            launch = [STEPBENCH, "launch", "--nproc", str(n), "--nodes", str(nodes), "--grace-s", "20", "--"]
            t0 = time.monotonic()
            subprocess.run([*launch, *(("1" if a == "1000" else a) for a in LONG), *mode], capture_output=True,
                           timeout=120, check=True)
            set_up = time.monotonic() - t0
            t0 = time.monotonic()
            p = subprocess.Popen([*launch, *LONG, *mode, "--sync-timeout-s", "30"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            victim = find_rank(victim_rank, p.pid)
            self.assertIsNotNone(victim, f"{mode}: rank {victim_rank} never started")
            time.sleep(max(4.0, 2 * set_up))
            os.kill(victim, signal.SIGKILL)
            out, _ = p.communicate(timeout=120)
            said = [l for l in out.splitlines() if l.startswith("stepbench launch: rank")]
            self.assertTrue(said, out)
            self.assertRegex(said[0], rf"rank {victim_rank} \(pid {victim}\) was killed by signal 9", out)
            named = [l for l in out.splitlines() if not l.startswith("stepbench launch:") and
                     re.search(rf"\b{victim_rank} \(pid {victim} on [^)]+\)", l)]
            self.assertTrue(named, f"{mode}: no process named rank {victim_rank}:\n{out}")
            self.assertEqual(p.returncode, 128 + 9, out)
            self.assertLess(time.monotonic() - t0, 90, out)

    def test_an_asynchronous_parameter_server(self):
        # --cross-replica-sync off: 3 workers at their own pace (worker 1 made 3x slower), the server on
        # process 0 applying each push once
        with tempfile.TemporaryDirectory() as d:
            js = os.path.join(d, "run.json")
            p = subprocess.run([STEPBENCH, "launch", "--nproc", "3", "--", *TINY, "--phases", "step,grad_sync",
                                "--variable-update", "parameter_server", "--cross-replica-sync", "off",
                                "--slow-tower", "1:3", "--json", js],
                               capture_output=True, text=True, timeout=300)
            out = p.stdout + p.stderr
            self.assertEqual(p.returncode, 0, out)
            self.assertIn("over host memory (asynchronous parameter server on process 0) + Gloo over 3", out)
            self.assertRegex(out, r"asynchronous: images/s per worker \(process\): 0 [0-9.]+, 1 [0-9.]+, 2 [0-9.]+; "
                                  r"[0-9.]+ in total")
            self.assertRegex(out, r"the server applied ([0-9]+) of the \1 pushes, each once")
            a = json.load(open(js))["asynchronous"]
            self.assertEqual(len(a["workers"]), 3)
            self.assertEqual(a["applied"], sum(w["pushes"] for w in a["workers"]))
            for w in a["workers"]:
                self.assertEqual(w["applied"], w["pushes"], a)
            self.assertAlmostEqual(a["images_per_s"], sum(w["images_per_s"] for w in a["workers"]), places=3)
        # asynchronous distributed_replicated: each node a worker, a server on each node
        with tempfile.TemporaryDirectory() as d:
            js = os.path.join(d, "run.json")
            p = subprocess.run([STEPBENCH, "launch", "--nproc", "4", "--nodes", "2", "--", *TINY, "--phases",
                                "step,grad_sync", "--variable-update", "distributed_replicated", "--ps-ranks", "2",
                                "--cross-replica-sync", "off", "--json", js],
                               capture_output=True, text=True, timeout=300)
            out = p.stdout + p.stderr
            self.assertEqual(p.returncode, 0, out)
            self.assertIn("host memory within each node, then asynchronous pushes to 2 parameter servers + Gloo "
                          "(2 nodes x 2 processes)", " ".join(out.split()))
            self.assertRegex(out, r"asynchronous: images/s per worker \(node\): 0 [0-9.]+, 1 [0-9.]+; [0-9.]+ in total")
            self.assertRegex(" ".join(out.split()), r"the 2 servers applied ([0-9]+) of the \1 pushed shards "
                                                    r"\([0-9]+ pushes to each\), each once")
            for level in ("sum within each node", "push to and pull from the parameter servers",
                          "from each node's first process to the rest"):
                self.assertRegex(out, level + r": [0-9.]+ ms, algbw [0-9.]+ GB/s")
            with open(js) as f:
                whole = json.load(f)
            a = whole["asynchronous"]
            self.assertEqual(a["workers_are"], "nodes")
            self.assertEqual([w["rank"] for w in a["workers"]], [0, 2])  # each node's first process pushes
            self.assertEqual([s["rank"] for s in a["servers"]], [0, 2])
            self.assertTrue(a["each_once"], a)
            self.assertEqual(sum(a["staleness_counts"]), a["applied"], a)
            for w in a["workers"]:
                self.assertEqual(w["applied"], 2 * w["pushes"], a)
                self.assertEqual(w["images_per_step"], 2 * 4, a)  # the node's 2 processes' batches
            # the two shards make up the variables
            self.assertEqual(4 * sum(s["floats"] for s in a["servers"]), int(whole["context"]["gradient_bytes"]), a)
        p = subprocess.run([STEPBENCH, "launch", "--nproc", "2", "--", *TINY, "--variable-update",
                            "distributed_replicated", "--cross-replica-sync", "off"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("--cross-replica-sync off with distributed_replicated needs several nodes as its workers",
                      p.stderr)
        for args, said in ((["--variable-update", "replicated"],
                            "--cross-replica-sync off applies to --variable-update parameter_server"),):
            p = subprocess.run([STEPBENCH, "launch", "--nproc", "2", "--", *TINY, "--cross-replica-sync", "off",
                                *args], capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
            self.assertIn(said, p.stderr)
        p = subprocess.run([STEPBENCH, *TINY, "--variable-update", "parameter_server", "--cross-replica-sync", "off"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("--cross-replica-sync off needs several processes as its workers", p.stderr)

    def test_torchruns_variables_set_by_hand(self):
        port = str(free_port())
        envs = [{"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"} for r in (0, 1)]
        rcs, outs = self.by_hand(envs, *TINY, "--phases", "step")
        self.assertEqual(rcs, [0, 0], "\n".join(outs))
        self.assertIn("started by torchrun", outs[0])
        self.assertRegex(outs[0], r"\nphase +median ms ")
        self.assertNotRegex(outs[1], r"\nphase +median ms ")

    def test_a_file_rendezvous_by_hand(self):
        with tempfile.TemporaryDirectory() as d:
            envs = [{"RANK": str(r), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"} for r in (0, 1)]
            rcs, outs = self.by_hand(envs, *TINY, "--phases", "step,grad_sync", "--variable-update", "parameter_server",
                                     "--ps-device", "cpu", "--rendezvous", f"file:{d}/meet")
            self.assertEqual(rcs, [0, 0], "\n".join(outs))
            self.assertIn("host memory (parameter server on the CPU) + Gloo over 2 processes", outs[0])
            self.assertFalse(os.path.exists(f"{d}/meet"), "rank 0 clears the store once all have met")

    @unittest.skipUnless(subprocess.run(["/usr/bin/python3", "-c", "import torch.distributed.run"],
                                        capture_output=True).returncode == 0, "no torchrun (Debian's python3-torch)")
    def test_real_torchrun(self):
        # torchrun's agent holds MASTER_PORT with PyTorch's store: stepbench's rank 0 listens on the next port
        # Debian's torchrun (PyTorch 1.13 on Python 3.11) cannot read its own default "--redirects 0"
        # (Std.from_str iterates an IntFlag, which 3.11 no longer does for 0): redirect stdout and tee it
        port = free_port()
        with tempfile.TemporaryDirectory() as logs:
            p = subprocess.run(["/usr/bin/python3", "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                "--master_port", str(port), "--redirects", "1", "--tee", "1", "--log_dir", logs,
                                "--no_python", STEPBENCH, *TINY, "--phases", "step"],
                               capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        out = p.stdout + p.stderr
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("started by torchrun", out)
        self.assertEqual(len(re.findall(r"\n(\[default0\]:)?phase +median ms ", out)), 1, out)

    def test_a_missing_rank_ends_the_run_naming_it(self):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.monotonic()
            p = subprocess.run([STEPBENCH, *TINY, "--rendezvous", f"file:{d}/m", "--sync-timeout-s", "2"],
                               capture_output=True, text=True, timeout=120,
                               env={**os.environ, "RANK": "0", "WORLD_SIZE": "2"})
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("rank 1 of 2 never joined the rendezvous", p.stderr)
            self.assertLess(time.monotonic() - t0, 60)

    def test_a_killed_process_ends_the_others_naming_it(self):
        t0 = time.monotonic()
        p = subprocess.Popen([STEPBENCH, "launch", "--nproc", "2", "--grace-s", "20", "--", *LONG,
                              "--sync-timeout-s", "30"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        victim = find_rank(1, p.pid)
        self.assertIsNotNone(victim, "rank 1 never started")
        time.sleep(3)  # into the benchmarks
        os.kill(victim, signal.SIGKILL)
        out, _ = p.communicate(timeout=120)
        self.assertNotEqual(p.returncode, 0, out)
        # the cause named first, whatever order the exits were reaped in: rank 0's failure follows from it
        said = [l for l in out.splitlines() if l.startswith("stepbench launch: rank") or
                l.startswith("stepbench launch: then rank")]
        self.assertTrue(said, out)
        self.assertRegex(said[0], rf"rank 1 \(pid {victim}\) was killed by signal 9", out)
        # and rank 0, whose sync failed, names the peer it lost (Gloo's pair knows it; its ask goes unanswered)
        self.assertRegex(out, rf"on process 0 of 2: rank 1 \(pid {victim} on [^)]+\) did not answer within 7.5 s")
        self.assertEqual(p.returncode, 128 + 9, out)  # the cause's status is the launcher's
        self.assertLess(time.monotonic() - t0, 90, out)

    def test_a_stalled_process_ends_the_run_within_the_timeout(self):
        rc, out, secs = self.launch(*TINY, "--phases", "step", "--sync-timeout-s", "2",
                                    env={"STEPBENCH_FAULT_SYNC_STALL": "1:90"})
        self.assertNotEqual(rc, 0, out)
        self.assertIn("did not complete within 2 s on process 0 of 2", out)
        # rank 0 names the sleeper, by its pid, as alive but in its own work (its liveness thread answers);
        # the launcher, who failed; then it ends the sleeper
        self.assertRegex(out, r"on process 0 of 2: rank 1 \(pid [0-9]+ on [^)]+\) answered from outside the group's "
                              r"calls, where it had been for [0-9.]+ s \(stalled in its own work\)")
        self.assertIn("rank 0 (pid", out)
        self.assertLess(secs, 60, out)

    def test_a_stopped_process_is_named_when_the_others_time_out(self):
        t0 = time.monotonic()
        p = subprocess.Popen([STEPBENCH, "launch", "--nproc", "2", "--grace-s", "2", "--", *LONG,
                              "--sync-timeout-s", "3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        victim = find_rank(1, p.pid)
        self.assertIsNotNone(victim, "rank 1 never started")
        time.sleep(3)
        os.kill(victim, signal.SIGSTOP)
        try:
            out, _ = p.communicate(timeout=120)
        finally:
            os.kill(victim, signal.SIGCONT) if p.poll() is None else None
        self.assertNotEqual(p.returncode, 0, out)
        self.assertIn("did not complete within 3 s on process 0 of 2", out)
        self.assertRegex(out, rf"on process 0 of 2: rank 1 \(pid {victim} on [^)]+\) did not answer")
        self.assertRegex(out, rf"rank 1 \(pid {victim}\) is stopped")
        self.assertLess(time.monotonic() - t0, 90, out)

    def test_a_stopped_process_is_named_without_a_launcher(self):
        # torchrun's variables by hand and a file rendezvous: no launcher watches the ranks, so rank 0's
        # own message must name the one that stopped (SIGSTOP during the timed steps)
        with tempfile.TemporaryDirectory() as d:
            envs = [{"RANK": str(r), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"} for r in (0, 1)]
            procs = [subprocess.Popen([STEPBENCH, *LONG, "--rendezvous", f"file:{d}/meet", "--sync-timeout-s", "3"],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env={**os.environ, **e}) for e in envs]
            try:
                t0 = time.monotonic()  # met (rank 0 clears the store once all have), and into the steps
                while os.path.exists(f"{d}/meet") and time.monotonic() - t0 < 60:
                    time.sleep(0.1)
                time.sleep(2)
                self.assertIsNone(procs[1].poll(), "rank 1 ended early")
                os.kill(procs[1].pid, signal.SIGSTOP)
                out, _ = procs[0].communicate(timeout=120)
            finally:
                for p in procs:
                    if p.poll() is None:
                        os.kill(p.pid, signal.SIGKILL)
                        p.communicate()
        self.assertEqual(procs[0].returncode, 1, out)
        self.assertRegex(out, rf"within 3 s on process 0 of 2: rank 1 \(pid {procs[1].pid} on [^)]+\) did not answer "
                              r"within 2 s \(stalled or ended\)")

    def test_an_interrupt_reaches_every_process_once(self):
        p = subprocess.Popen([STEPBENCH, "launch", "--nproc", "2", "--", *LONG], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        self.assertIsNotNone(find_rank(1, p.pid))
        time.sleep(4)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 130, out)
        self.assertIn("cut short by SIGINT", out)  # rank 0 kept what was measured

    def test_variables_that_disagree_are_refused(self):
        with tempfile.TemporaryDirectory() as d:
            twice = [{"RANK": "0", "WORLD_SIZE": "2"}] * 2
            rcs, outs = self.by_hand(twice, *TINY, "--rendezvous", f"file:{d}/a", "--sync-timeout-s", "30")
            self.assertEqual(rcs, [2, 2], "\n".join(outs))
            for o in outs:
                self.assertIn("two processes were given rank 0", o)
            sizes = [{"RANK": "0", "WORLD_SIZE": "2"}, {"RANK": "1", "WORLD_SIZE": "3"}]
            rcs, outs = self.by_hand(sizes, *TINY, "--rendezvous", f"file:{d}/b", "--sync-timeout-s", "30")
            self.assertEqual(rcs, [2, 2], "\n".join(outs))
            self.assertIn("was told the world has", outs[1])
        for env, expect in [({"RANK": "x", "WORLD_SIZE": "2"}, "RANK=x is not a whole number"),
                            ({"RANK": "1"}, "RANK is set but WORLD_SIZE is not"),
                            ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
                             "outside the world")]:
            p = subprocess.run([STEPBENCH, *TINY], capture_output=True, text=True, timeout=60,
                               env={**os.environ, **env})
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(expect, p.stderr)
        for args, expect in [(["launch", "--nproc", "2"], "give the run after --"),
                             (["launch", "--nproc", "0", "--", "--backend", "cpu"], "--nproc"),
                             (["launch", "--nproc", "2", "--rendezvous", "ftp:x", "--", "--backend", "cpu"],
                              "give file:PATH"),
                             ([*TINY, "--ranks-per-gpu", "2"], "--ranks-per-gpu shares GPUs"),
                             ([*TINY, "--rendezvous", "file:/tmp/x"], "without a launcher")]:
            p = subprocess.run([STEPBENCH, *args], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 2, f"{args}: {p.stderr}")
            self.assertIn(expect, p.stderr, args)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--stepbench", required=True)
    ap.add_argument("--configs", required=True)
    args, rest = ap.parse_known_args()
    STEPBENCH, CONFIGS = os.path.abspath(args.stepbench), os.path.abspath(args.configs)
    # --peak auto's cache: ctest's (in the build) or, run by hand, one of this run's, never the user's
    if "XDG_CACHE_HOME" not in os.environ:
        os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="stepbench_cli_cache.")
        atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)
    result = unittest.main(argv=[sys.argv[0], "-v", *rest], exit=False).result
    if not result.wasSuccessful():
        sys.exit(1)
    # every test skipped (PyTorch missing for Peer): 77, which ctest reports as skipped, not passed
    sys.exit(77 if result.testsRun and len(result.skipped) == result.testsRun else 0)
