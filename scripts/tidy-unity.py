#!/usr/bin/env python3
"""clang-tidy over every C++ file of src/, a few files per run (scripts/lint.sh runs this).

  scripts/tidy-unity.py BUILD_DIR [--batch N] [--jobs J] [--per-file]

Parsing the headers (fmt, nlohmann/json, CLI11, oneDNN, the CUDA runtime) is most of clang-tidy's
time, and a separate run per file parses them again for every file. So, as CMake's unity builds do,
the files that one target compiles with the same command are grouped N at a time (default 8, CMake's
UNITY_BUILD_BATCH_SIZE) into one file that includes them, under BUILD_DIR/tidy-unity/, and
clang-tidy runs once per group with that command. Every finding is still reported at its own file
and line: .clang-tidy's HeaderFilterRegex covers src/. Names in two files' anonymous namespaces of
one target are refused by scripts/unity-names.py, as for the unity builds; if a group does not parse
as one file all the same (clang-diagnostic-error), its files are checked one by one instead, and
that is said. --per-file checks every file on its own (the old way, for comparison). A unity build's
database (CMAKE_UNITY_BUILD, the default build) names CMake's unity files: each file they
include is given their command.
Exit status: 0 no findings, 1 findings (printed), 2 usage.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def command_of(entry):
    return entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])


def without_file(args, path):
    """The compile command with the source, -c and the object dropped: what a group must share."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif a != "-c" and a != path:
            out.append(a)
    return tuple(out)


UNITY_SOURCE = re.compile(r"/Unity/unity_[0-9]+_[a-z]+\.[a-z]+$")


def expand_unity(entries):
    """A unity build's database (CMAKE_UNITY_BUILD, the default) names CMake's unity
    files, not the sources: each member a unity file includes gets the unity file's command."""
    out = []
    for e in entries:
        path = os.path.join(e["directory"], e["file"])
        if not UNITY_SOURCE.search(path):
            out.append(e)
            continue
        args = command_of(e)
        with open(path) as f:
            members = re.findall(r'^#include "([^"]+)"', f.read(), re.M)
        for m in members:
            m = m if os.path.isabs(m) else os.path.normpath(os.path.join(os.path.dirname(path), m))
            out.append({"directory": e["directory"], "file": m,
                        "arguments": [m if a == e["file"] or a == path else a for a in args]})
    return out


def tidy(build, files):
    """clang-tidy on the given files with BUILD's compile_commands.json: (exit status, its output).
    The configuration is named: a unity file under a build folder outside the tree would otherwise
    get clang-tidy's defaults, which report nothing in included files."""
    p = subprocess.run(["clang-tidy", "-p", build, f"--config-file={os.path.join(ROOT, '.clang-tidy')}", "--quiet",
                        *files], capture_output=True, text=True)
    text = "\n".join(line for line in (p.stdout + p.stderr).splitlines()
                     if not re.search(r"^[0-9]+ warnings?( and [0-9]+ errors?)? generated", line))
    return p.returncode, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--per-file", action="store_true")
    a = ap.parse_args()
    if a.batch < 1 or a.jobs < 1:
        print("tidy-unity: --batch and --jobs take 1 or more", file=sys.stderr)
        return 2
    build = os.path.abspath(a.build)
    db = os.path.join(build, "compile_commands.json")
    if not os.path.isfile(db):
        print(f"tidy-unity: {db} missing; configure and build first", file=sys.stderr)
        return 2
    with open(db) as f:
        entries = expand_unity(json.load(f))
    files = sorted(os.path.realpath(os.path.join(d, n)) for d, _, names in os.walk(os.path.join(ROOT, "src"))
                   for n in names if n.endswith(".cpp"))
    first = {}
    for e in entries:  # a file two targets compile: its first command, as clang-tidy -p takes it
        first.setdefault(os.path.realpath(os.path.join(e["directory"], e["file"])), e)

    # one database for every run, under BUILD_DIR/tidy-unity/: each file's own command (a unity
    # build's expanded, above) and the groups' files
    out_dir = os.path.join(build, "tidy-unity")
    os.makedirs(out_dir, exist_ok=True)
    tidy_db = [{"directory": e["directory"], "file": f, "arguments": command_of(e)} for f, e in first.items()]
    jobs = []  # (the files reported, the files given to clang-tidy)
    alone = [f for f in files if f not in first]
    if a.per_file:
        alone = files
    else:
        groups = {}
        for f in files:
            if f in first:
                e = first[f]
                groups.setdefault((e["directory"], without_file(command_of(e), e["file"])), []).append(f)
        n = 0
        for (directory, args), members in groups.items():
            for i in range(0, len(members), a.batch):
                part = members[i:i + a.batch]
                if len(part) == 1:
                    alone.append(part[0])
                    continue
                n += 1
                path = os.path.join(out_dir, f"unity_{n:03d}.cpp")
                text = "".join(f'#include "{m}"  // NOLINT(bugprone-suspicious-include)\n' for m in part)
                if not os.path.exists(path) or open(path).read() != text:
                    with open(path, "w") as f:
                        f.write(text)
                tidy_db.append({"directory": directory, "file": path, "arguments": [*args, "-c", path]})
                jobs.append((part, [path]))
    with open(os.path.join(out_dir, "compile_commands.json"), "w") as f:
        json.dump(tidy_db, f, indent=1)
    jobs += [([f], [f]) for f in alone]

    def names(files):
        return ", ".join(os.path.relpath(m, ROOT) for m in files)

    def run(job):
        reported, given = job
        rc, text = tidy(out_dir, given)
        found = re.search(r": (warning|error): ", text)
        if rc != 0 and len(reported) > 1 and (rc < 0 or not found or "clang-diagnostic-error" in text):
            why = (f"clang-tidy ended with {rc}" if rc < 0 or not found else "they do not parse as one file")
            note = f"tidy-unity: {names(reported)}: {why}; checked one by one\n"
            results = [tidy(out_dir, [m]) for m in reported]
            return all(r[0] == 0 for r in results), note + "\n".join(r[1] for r in results if r[1])
        if rc != 0 and not found:
            text += f"\ntidy-unity: clang-tidy ended with {rc} on {names(reported)} and printed no finding"
        return rc == 0, text

    fail = False
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        for ok, text in pool.map(run, jobs):
            if text.strip():
                print(text.strip(), file=sys.stderr)
            fail |= not ok
    print(f"tidy-unity: {len(files)} files in {len(jobs)} clang-tidy runs: "
          f"{'findings above' if fail else 'no findings'}")
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
