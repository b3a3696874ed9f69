#!/usr/bin/python3
"""Pictures of a stepbench run, from its --json file, or of a history (matplotlib, no display needed).

  scripts/plot.py RUN.json --out DIR [--top N]
  scripts/plot.py HISTORY.jsonl --out DIR [--verdict COMPARE.json]

Writes, where the run has what they show:
  phases.png          the phases' medians (every run)
  layers.png          forward vs backward per layer, the top N layers by time (--layer-times), backward
                      split into batch norm + ReLU, filter gradient and data gradient
  step_breakdown.png  the step by kind of work, forward and backward side by side (--layer-times)
  scaling.png         images/s and scaling efficiency against the GPU count, one line per batch size
                      (--sweep-batch / --sweep-gpus)
From a history (stepbench --history FILE, one JSON line per run):
  history.png         each phase's median over the runs of the last record's machine and configuration,
                      with its spread (1.4826 MAD), oldest first; with --verdict (stepbench compare
                      --history ... --json FILE) the change points it found (a line at the first run
                      after each, labelled with the change) and the runs it compared (HEAD)
Prints the paths it wrote. Exit 2 when the file is not a stepbench --json file."""
import argparse, json, os, statistics, sys

try:
    import matplotlib
except ImportError:
    print(f"plot.py: {sys.executable} cannot import matplotlib; run it with /usr/bin/python3 (Debian's "
          "python3-matplotlib, which scripts/bench.sh installs) or install matplotlib for this interpreter",
          file=sys.stderr)
    sys.exit(2)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402


def ms(v):
    return f"{v:.1f}" if v >= 10 else f"{v:.3g}"


def title_of(run):
    c = run.get("context", {})
    if "model" not in c:
        return ""
    batch = f", batch {c['batch_size_per_gpu']} x {c.get('gpus', '?')} GPUs" if "batch_size_per_gpu" in c else ""
    return f"{c['model']} {c.get('precision', '')} {c.get('layout', '')}{batch} on {c.get('device', '?')}"


def kind_of(p):
    if p["part"].startswith("conv_"):
        return "convolution"
    if p["part"].startswith("bn_relu"):
        return "batch norm + ReLU"
    return {"pool": "pooling", "linear": "fully connected", "cross_entropy": "loss",
            "graph": "weight cast, gradient zeroing"}.get(p["kind"], p["kind"])


def phases_png(run, out):
    meds = {}
    for b in run.get("benchmarks", []):
        if b.get("run_type") != "iteration" or b.get("error_occurred"):
            continue
        phase = b["run_name"].split("/")[5] if b["run_name"].count("/") >= 5 else b["run_name"]
        meds.setdefault(phase, []).append(b["real_time"])
    if not meds:
        return None
    names = list(meds)
    vals = [statistics.median(meds[n]) for n in names]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.5))
    ax.barh(names, vals, color="#4c72b0")
    for y, v in enumerate(vals):
        ax.text(v, y, f" {ms(v)} ms", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("median ms per call (device time)")
    ax.set_title(f"phases: {title_of(run)}", fontsize=9)
    return save(fig, out, "phases.png")


def layers_png(lt, out, top):
    layers = {}
    for p in lt["pieces"]:
        if p["layer"] == "(graph)":
            continue
        d = layers.setdefault(p["layer"], {"fwd": 0.0, "bn_relu_bwd": 0.0, "conv_bwd_filter": 0.0,
                                           "conv_bwd_data": 0.0, "other_bwd": 0.0})
        if p["pass"] == "forward":
            d["fwd"] += p["median_ms"]
        elif p["part"] in d:
            d[p["part"]] += p["median_ms"]
        else:
            d["other_bwd"] += p["median_ms"]
    names = sorted(layers, key=lambda n: -sum(layers[n].values()))[:top]
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(names) + 1.8))
    y = range(len(names))
    h = 0.4
    ax.barh([i - h / 2 for i in y], [layers[n]["fwd"] for n in names], h, label="forward", color="#4c72b0")
    left = [0.0] * len(names)
    for part, colour, label in (("bn_relu_bwd", "#dd8452", "backward: batch norm + ReLU"),
                                ("conv_bwd_filter", "#c44e52", "backward: filter gradient"),
                                ("conv_bwd_data", "#8172b3", "backward: data gradient"),
                                ("other_bwd", "#937860", "backward: other")):
        vals = [layers[n][part] for n in names]
        if any(vals):
            ax.barh([i + h / 2 for i in y], vals, h, left=left, label=label, color=colour)
            left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(list(y))
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("median ms per step")
    ax.set_title(f"top {len(names)} layers: forward vs backward (step {ms(lt['step_ms'])} ms, "
                 f"backward {lt['backward_ms'] / lt['forward_ms']:.2f}x forward)", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    return save(fig, out, "layers.png")


def breakdown_png(lt, out):
    kinds = {}
    for p in lt["pieces"]:
        k = kinds.setdefault(kind_of(p), [0.0, 0.0])
        k[0 if p["pass"] == "forward" else 1] += p["median_ms"]
    kinds["gradient sync (exposed)"] = [0.0, lt["grad_sync_ms"]]
    kinds["update"] = [0.0, lt["update_ms"]]
    kinds["remainder (gaps)"] = [0.0, max(0.0, lt["remainder_ms"])]
    names = [k for k in sorted(kinds, key=lambda k: -sum(kinds[k])) if sum(kinds[k]) > 0]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    left_f = left_b = 0.0
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, n in enumerate(names):
        f, b = kinds[n]
        c = colours[i % len(colours)]
        ax.barh(["forward"], [f], left=left_f, color=c, label=n)
        ax.barh(["backward, sync, update"], [b], left=left_b, color=c)
        left_f += f
        left_b += b
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (medians of the probed steps)")
    ax.set_title(f"the step by kind of work: {ms(lt['step_ms'])} ms, the pieces {ms(lt['pieces_sum_ms'])} ms",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3)
    return save(fig, out, "step_breakdown.png")


def scaling_png(sweep, out):
    rows = [r for r in sweep["rows"] if r.get("images_per_s")]
    if not rows:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for batch in sorted({r["batch"] for r in rows}):
        rs = sorted((r for r in rows if r["batch"] == batch), key=lambda r: r["gpus"])
        g = [r["gpus"] for r in rs]
        a1.plot(g, [r["images_per_s"] for r in rs], marker="o", label=f"batch {batch}")
        eff = [(r["gpus"], 100 * r["scaling_efficiency"]) for r in rs if r.get("scaling_efficiency") is not None]
        a2.plot([e[0] for e in eff], [e[1] for e in eff], marker="o", label=f"batch {batch}")
    a1.set_xlabel("GPUs (towers)")
    a1.set_ylabel("images/s")
    a2.set_xlabel("GPUs (towers)")
    a2.set_ylabel("scaling efficiency %")
    a2.axhline(100, color="grey", lw=0.5)
    for a in (a1, a2):
        a.legend(fontsize=7)
        a.grid(alpha=0.3)
    fig.suptitle("sweep: images/s and scaling efficiency (images/s at N over N/N0 times that at the smallest "
                 "count N0 measured)", fontsize=9)
    return save(fig, out, "scaling.png")


def history_png(path, out, verdict_path):
    """history.png from a --history file (see the module's doc); None when nothing matches."""
    recs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {n} is not JSON ({e})")
            if not isinstance(rec, dict) or "benchmarks" not in rec:
                raise ValueError(f"{path} line {n} is not a stepbench --history record")
            recs.append(rec)
    if not recs:
        raise ValueError(f"{path} has no records")
    key = lambda r: (json.dumps(r.get("fingerprint", {}), sort_keys=True),
                     json.dumps(r.get("configuration", {}), sort_keys=True))
    mine = [r for r in recs if key(r) == key(recs[-1])]
    phases = [b for b in mine[-1]["benchmarks"] if "/conv:" not in b]
    if not phases:
        return None
    changes, head = [], None
    if verdict_path:
        with open(verdict_path) as f:
            v = json.load(f)
        changes = v.get("changes", [])
        head = v.get("head")
        # the runs compare judged against, in its order: a change point's "run" indexes them
        runs = [(h.get("revision"), h.get("time")) for h in v.get("history", [])]
        if runs:
            picked, i = [], 0
            for r in recs:
                if i < len(runs) and (r.get("revision"), r.get("time")) == runs[i]:
                    picked.append(r)
                    i += 1
            if i == len(runs):
                mine = picked
                phases = [b for b in mine[-1]["benchmarks"] if "/conv:" not in b] or phases
            else:  # another history than the verdict's: its run numbers would point elsewhere
                print(f"plot.py: {verdict_path} judged runs that are not all in {path}; its change points "
                      "are not drawn", file=sys.stderr)
                changes = []
    fig, axes = plt.subplots(len(phases), 1, figsize=(9, 2.2 * len(phases)), squeeze=False)
    for ax, b in zip(axes[:, 0], phases):
        xs, ys, es = [], [], []
        for i, r in enumerate(mine):
            m = r["benchmarks"].get(b)
            if m and m.get("median_ms"):
                xs.append(i + 1)
                ys.append(m["median_ms"])
                es.append(m.get("spread", 0) * m["median_ms"])
        ax.errorbar(xs, ys, yerr=es, fmt="o-", ms=3, lw=1, capsize=2, label="run median (spread)")
        for c in changes:
            if c.get("benchmark") != b:
                continue
            at = c["run"] + 1 if isinstance(c.get("run"), int) and c["run"] < len(mine) else None
            if at is not None:
                ax.axvline(at - 0.5, color="C3", lw=1.2)
                ax.annotate(f"{100 * c['change']:+.1f}%", (at - 0.5, max(ys) if ys else 0), color="C3", fontsize=7,
                            ha="left", va="top")
        ax.set_title(b.rsplit("/", 1)[-1], fontsize=9, loc="left")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel(f"run (oldest first; {len(mine)} of {len(recs)} records: this machine and configuration)"
                           + (f"; compared: {head}" if head else ""))
    fig.suptitle(f"history: {phases[0].rsplit('/', 1)[0]}", fontsize=9)
    return save(fig, out, "history.png")


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a stepbench --json file, or a --history file (.jsonl)")
    ap.add_argument("--out", required=True, help="folder for the PNG files (made if missing)")
    ap.add_argument("--top", type=int, default=25, help="layers in layers.png [25]")
    ap.add_argument("--verdict", help="with a history: stepbench compare --history ... --json FILE, to mark its "
                                      "change points")
    a = ap.parse_args()
    if a.run.endswith(".jsonl"):
        os.makedirs(a.out, exist_ok=True)
        try:
            wrote = history_png(a.run, a.out, a.verdict)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"plot.py: {e}", file=sys.stderr)
            return 2
        if not wrote:
            print(f"plot.py: {a.run} has no phase to plot", file=sys.stderr)
            return 1
        print(wrote)
        return 0
    if a.verdict:
        print("plot.py: --verdict goes with a history (.jsonl), not a run's --json file", file=sys.stderr)
        return 2
    try:
        with open(a.run) as f:
            run = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"plot.py: cannot read {a.run}: {e}", file=sys.stderr)
        return 2
    if not isinstance(run, dict) or ("benchmarks" not in run and "sweep" not in run):
        print(f"plot.py: {a.run} is not a stepbench --json file (no benchmarks, no sweep)", file=sys.stderr)
        return 2
    if a.top < 1:
        print("plot.py: --top must be at least 1", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    wrote = [phases_png(run, a.out)]
    if "layer_times" in run:
        wrote += [layers_png(run["layer_times"], a.out, a.top), breakdown_png(run["layer_times"], a.out)]
    if "sweep" in run:
        wrote.append(scaling_png(run["sweep"], a.out))
    wrote = [w for w in wrote if w]
    if not wrote:
        print(f"plot.py: {a.run} has nothing to plot (no measured benchmark)", file=sys.stderr)
        return 1
    for w in wrote:
        print(w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
