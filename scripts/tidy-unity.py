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
that is said. --per-file checks every file on its own (the old way, for comparison).
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
        entries = json.load(f)
    files = sorted(os.path.realpath(os.path.join(d, n)) for d, _, names in os.walk(os.path.join(ROOT, "src"))
                   for n in names if n.endswith(".cpp"))
    first = {}
    for e in entries:  # a file two targets compile: its first command, as clang-tidy -p takes it
        first.setdefault(os.path.realpath(os.path.join(e["directory"], e["file"])), e)

    jobs = []  # (the files reported, the files given to clang-tidy, the build folder)
    alone = [f for f in files if f not in first]
    if a.per_file:
        alone = files
    else:
        groups = {}
        for f in files:
            if f in first:
                e = first[f]
                groups.setdefault((e["directory"], without_file(command_of(e), e["file"])), []).append(f)
        out_dir = os.path.join(build, "tidy-unity")
        os.makedirs(out_dir, exist_ok=True)
        unity_db = []
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
                unity_db.append({"directory": directory, "file": path, "arguments": [*args, "-c", path]})
                jobs.append((part, [path], out_dir))
        with open(os.path.join(out_dir, "compile_commands.json"), "w") as f:
            json.dump(unity_db, f, indent=1)

    def as_listed(f):  # the path the compile database names the file by, for clang-tidy -p to find it
        e = first.get(f)
        return os.path.join(e["directory"], e["file"]) if e else f

    jobs += [([f], [as_listed(f)], build) for f in alone]

    def names(files):
        return ", ".join(os.path.relpath(m, ROOT) for m in files)

    def run(job):
        reported, given, where = job
        rc, text = tidy(where, given)
        found = re.search(r": (warning|error): ", text)
        if rc != 0 and len(reported) > 1 and (rc < 0 or not found or "clang-diagnostic-error" in text):
            why = (f"clang-tidy ended with {rc}" if rc < 0 or not found else "they do not parse as one file")
            note = f"tidy-unity: {names(reported)}: {why}; checked one by one\n"
            results = [tidy(build, [as_listed(m)]) for m in reported]
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
