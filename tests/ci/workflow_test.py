#!/usr/bin/env python3
"""ctest ci.workflow: the properties .github/workflows/gpu-bench.yml must keep.

    python3 tests/ci/workflow_test.py PATH/TO/gpu-bench.yml [--self-test]

Checks the triggers, the permissions, that the self-hosted GPU job never runs a fork's code, the
runners, and that both jobs run the scripts/ab.sh gate (cuda on the GPU, cpu on the hosted runner),
write the step summary and upload the results even when the gate failed. Exit 0 when all hold,
1 on any failure (each named), 77 (skip) without PyYAML. --self-test also mutates an in-memory
copy (no fork guard, another runner label, pull_request_target, ...) and fails unless each
mutation is caught.
"""
import copy
import re
import sys

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML is not installed (Debian: apt-get install python3-yaml)")
    sys.exit(77)

FORK_GUARD = "github.event.pull_request.head.repo.full_name == github.repository"
GPU_LABELS = ["self-hosted", "linux", "x64", "gpu"]


def on_block(doc):
    """The `on:` mapping. YAML 1.1 (PyYAML) reads the key `on` as the boolean True."""
    on = doc.get("on", doc.get(True))
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return {t: None for t in on}
    return on if isinstance(on, dict) else {}


def set_on_block(doc, on):
    doc["on" if "on" in doc else True] = on


def walk(node):
    """Every key and scalar in the document."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield k
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)
    else:
        yield node


def norm(expr):
    """An `if:` expression without ${{ }} and with single spaces."""
    s = str(expr or "").strip()
    m = re.fullmatch(r"\$\{\{(.*)\}\}", s, re.S)
    return " ".join((m.group(1) if m else s).split())


def steps(job):
    return [s for s in (job.get("steps") or []) if isinstance(s, dict)]


# a command line that runs the gate (not one that only mentions it): [VAR=value ...] [./]scripts/ab.sh
AB_CALL = re.compile(r"^\s*(?:\w+=\S*\s+)*(?:\./)?scripts/ab\.sh(?:\s|$)", re.M)


def ab_steps(job):
    return [s for s in steps(job) if AB_CALL.search(str(s.get("run", "")))]


def check(doc):
    """A list of (tag, message) for every property that does not hold."""
    bad = []

    def need(ok, tag, msg):
        if not ok:
            bad.append((tag, msg))

    # ---- triggers and permissions
    on = on_block(doc)
    push = on.get("push") if isinstance(on.get("push"), dict) else {}
    branches = push.get("branches", [])
    branches = [branches] if isinstance(branches, str) else (branches or [])
    need("push" in on and "main" in branches, "trigger-push", "on: push with branches [main] is missing")
    for t in ("pull_request", "schedule", "workflow_dispatch"):
        need(t in on, f"trigger-{t}", f"on: {t} is missing")
    crons = on.get("schedule") or []
    need(isinstance(crons, list) and any(isinstance(c, dict) and c.get("cron") for c in crons),
         "trigger-schedule", "on: schedule has no cron entry")
    need(not any(isinstance(x, str) and "pull_request_target" in x for x in walk(doc)),
         "pull_request_target", "pull_request_target appears: it runs a fork's code with this repository's "
         "context; use pull_request")
    perms = doc.get("permissions")
    need(isinstance(perms, dict) and perms.get("contents") == "read",
         "permissions", f"top-level permissions must be {{contents: read}}, not {perms!r}")
    if isinstance(perms, dict):
        writes = [k for k, v in perms.items() if v == "write"]
        need(not writes, "permissions", f"permissions grant write: {writes}")

    jobs = doc.get("jobs") or {}
    for name in ("gpu", "cpu"):
        need(isinstance(jobs.get(name), dict), f"job-{name}", f"job '{name}' is missing")
    gpu = jobs.get("gpu") if isinstance(jobs.get("gpu"), dict) else {}
    cpu = jobs.get("cpu") if isinstance(jobs.get("cpu"), dict) else {}

    # ---- the GPU job: the self-hosted runner, never a fork's code, one run at a time
    need(gpu.get("runs-on") == GPU_LABELS, "gpu-runs-on",
         f"gpu runs-on must be exactly {GPU_LABELS}, not {gpu.get('runs-on')!r}")
    guard = norm(gpu.get("if"))
    # exactly this expression: any other clause (`|| true`, `|| always()`) could let a fork's code in
    need(guard == norm(f"github.event_name != 'pull_request' || {FORK_GUARD}"), "fork-guard",
         f"the gpu job's `if` must keep forks off the self-hosted runner "
         f"(github.event_name != 'pull_request' || {FORK_GUARD}); it is {gpu.get('if')!r}")
    # a concurrency group keeps one run pending and cancels the others: pushes would go ungated
    # (the self-hosted runner queues jobs by itself)
    need(not gpu.get("concurrency") and not doc.get("concurrency"), "gpu-concurrency",
         "no concurrency group for the gpu job: GitHub would cancel all but one pending run")

    # ---- the CPU job: GitHub-hosted, Debian 12
    need(cpu.get("runs-on") in ("ubuntu-latest", ["ubuntu-latest"]), "cpu-runs-on",
         f"cpu runs-on must be ubuntu-latest, not {cpu.get('runs-on')!r}")
    container = cpu.get("container")
    image = container.get("image") if isinstance(container, dict) else container
    need(image == "debian:bookworm", "cpu-container", f"cpu container must be debian:bookworm, not {image!r}")

    # ---- both jobs: the gate, the summary and the artifacts
    for name, job, backend in (("gpu", gpu, "cuda"), ("cpu", cpu, "cpu")):
        need("timeout-minutes" in job or any("timeout-minutes" in s for s in ab_steps(job)),
             f"{name}-timeout", f"{name}: no timeout-minutes on the job or the ab.sh step")
        checkouts = [s for s in steps(job) if str(s.get("uses", "")).startswith("actions/checkout@")]
        need(checkouts and all((s.get("with") or {}).get("fetch-depth") == 0 for s in checkouts),
             f"{name}-checkout", f"{name}: actions/checkout with fetch-depth 0 (ab.sh builds the base revision)")
        abs_ = ab_steps(job)
        need(bool(abs_), f"{name}-ab", f"{name}: no step runs scripts/ab.sh")
        for s in abs_:
            run = " ".join(str(s.get("run", "")).split())
            bench = run.split(" -- ", 1)[1] if " -- " in run else ""
            need(f"--backend {backend}" in bench, f"{name}-backend",
                 f"{name}: scripts/ab.sh must pass '--backend {backend}' after '--': {run!r}")
            need(not s.get("continue-on-error") and "|| true" not in run, f"{name}-ab",
                 f"{name}: the ab.sh step must fail the job on a regression (no continue-on-error, no || true)")
        summary = [s for s in steps(job) if "GITHUB_STEP_SUMMARY" in str(s.get("run", ""))]
        need(any(norm(s.get("if")) == "always()" for s in summary), f"{name}-summary",
             f"{name}: no step with `if: always()` writes $GITHUB_STEP_SUMMARY")
        uploads = [s for s in steps(job) if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
        need(bool(uploads), f"{name}-upload", f"{name}: no actions/upload-artifact step")
        need(any(norm(s.get("if")) == "always()" for s in uploads), f"{name}-upload",
             f"{name}: the actions/upload-artifact step needs `if: always()` (the results matter most when the gate failed)")
    return bad


# (what is done, the tag that must then fail, the mutation)
def _drop(d, *path):
    for p in path[:-1]:
        d = d[p]
    d.pop(path[-1], None)


def _no_always(job, what):
    def mutate(doc):
        for s in steps(doc["jobs"][job]):
            if what in str(s.get("run", "")) + str(s.get("uses", "")):
                s.pop("if", None)
    return mutate


def _ab_run(job, old, new):
    def mutate(doc):
        for s in ab_steps(doc["jobs"][job]):
            s["run"] = s["run"].replace(old, new)
    return mutate


def _add_prt(doc):
    on = on_block(doc)
    on["pull_request_target"] = {"types": ["opened"]}
    set_on_block(doc, on)


def _set(path, value):
    def mutate(doc):
        d = doc
        for p in path[:-1]:
            d = d[p]
        d[path[-1]] = value
    return mutate


MUTATIONS = [
    ("widen the fork guard with || true", "fork-guard",
     lambda d: d["jobs"]["gpu"].__setitem__("if", d["jobs"]["gpu"]["if"] + " || true")),
    ("drop the gpu job's fork guard", "fork-guard", lambda d: _drop(d, "jobs", "gpu", "if")),
    ("weaken the fork guard to always()", "fork-guard", _set(("jobs", "gpu", "if"), "always()")),
    ("change a gpu runs-on label (gpu -> cpu)", "gpu-runs-on",
     lambda d: d["jobs"]["gpu"].__setitem__("runs-on", ["self-hosted", "linux", "x64", "cpu"])),
    ("run the gpu job on a hosted runner", "gpu-runs-on", _set(("jobs", "gpu", "runs-on"), "ubuntu-latest")),
    ("add pull_request_target", "pull_request_target", _add_prt),
    ("drop the push trigger", "trigger-push", lambda d: on_block(d).pop("push")),
    ("grant write permissions", "permissions", _set(("permissions",), {"contents": "write"})),
    ("add a concurrency group to the gpu job", "gpu-concurrency",
     lambda d: d["jobs"]["gpu"].__setitem__("concurrency", {"group": "g", "cancel-in-progress": False})),
    ("move the cpu job to the self-hosted runner", "cpu-runs-on", _set(("jobs", "cpu", "runs-on"), GPU_LABELS)),
    ("gpu gate on --backend cpu", "gpu-backend", _ab_run("gpu", "--backend cuda", "--backend cpu")),
    ("cpu gate on --backend cuda", "cpu-backend", _ab_run("cpu", "--backend cpu", "--backend cuda")),
    ("ignore the gpu gate's verdict", "gpu-ab", _ab_run("gpu", "--per-layer", "--per-layer || true")),
    ("gpu summary without if: always()", "gpu-summary", _no_always("gpu", "GITHUB_STEP_SUMMARY")),
    ("cpu upload without if: always()", "cpu-upload", _no_always("cpu", "actions/upload-artifact")),
    ("drop the cpu job", "job-cpu", lambda d: _drop(d, "jobs", "cpu")),
]


def self_test(doc):
    failed = 0
    for what, tag, mutate in MUTATIONS:
        d = copy.deepcopy(doc)
        try:
            mutate(d)
        except (KeyError, TypeError, IndexError) as e:
            print(f"FAIL: self-test: cannot apply '{what}' to this file ({e!r})", file=sys.stderr)
            failed += 1
            continue
        tags = {t for t, _ in check(d)}
        if tag in tags:
            print(f"ok: self-test: '{what}' is caught ({tag})")
        else:
            print(f"FAIL: self-test: '{what}' is not caught (expected a '{tag}' failure; got {sorted(tags)})",
                  file=sys.stderr)
            failed += 1
    return failed


def main(argv):
    args = [a for a in argv[1:] if a != "--self-test"]
    if len(args) != 1:
        print(f"usage: {argv[0]} PATH/TO/gpu-bench.yml [--self-test]", file=sys.stderr)
        return 2
    try:
        with open(args[0]) as fh:
            doc = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError) as e:
        print(f"FAIL: cannot read {args[0]}: {e}", file=sys.stderr)
        return 1
    if not isinstance(doc, dict):
        print(f"FAIL: {args[0]} is not a YAML mapping", file=sys.stderr)
        return 1
    bad = check(doc)
    for _, msg in bad:
        print(f"FAIL: {msg}", file=sys.stderr)
    failed = len(bad)
    if not bad:
        print(f"ok: {args[0]}: every workflow check holds")
    if "--self-test" in argv[1:]:
        if bad:
            print("FAIL: self-test needs a file that passes the checks first", file=sys.stderr)
        else:
            failed += self_test(doc)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
