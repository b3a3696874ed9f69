#!/usr/bin/env python3
"""Names a unity build would see twice (scripts/lint.sh runs this).

Builds compile a target's .cpp files a few at a time as one file (CMAKE_UNITY_BUILD, the default;
the sanitizer builds and the GPU bundle too; .cu files are not checked: Debian 12's CMake 3.25
merges C++ only, newer ones CUDA too), so two files of one target that each define the same name in
their anonymous namespace either fail to build there or, with different signatures, silently call each other's.
This lists every top-level name (function, type, variable, alias) defined in an anonymous namespace
by more than one file of a group: src/<layer>/ (its subfolders included) and tests/ as a whole, a
little stricter than the targets themselves. Namespace aliases (namespace fs = ...) may repeat.
  scripts/unity-names.py [ROOT]        exit 1 and the names when there are any
"""
import collections
import os
import re
import sys

KIND = re.compile(r"^(?:template\s*<.*>\s*)?(?:struct|class|enum class|enum|using)\s+(\w+)")
FUNC = re.compile(r"^[\w:<>,\s*&]+?\b(\w+)\s*\(")
VAR = re.compile(r"^(?:static\s+)?(?:constexpr|const|inline|thread_local)?[\w:<>,\s*&]*?\b(\w+)\s*(?:=|\{|\[|;)")


def anonymous_names(path):
    """Names defined at the top level of the file's anonymous namespaces (unindented lines)."""
    names, depth, anon = set(), 0, None
    with open(path, errors="replace") as f:
        for line in f:
            s = line.rstrip("\n")
            if anon is None and re.match(r"^namespace\s*\{", s):
                anon = depth
            elif anon is not None and depth == anon + 1 and s[:1] not in ("", " ", "\t", "}", "#", "/"):
                if not s.startswith("namespace "):
                    m = KIND.match(s) or FUNC.match(s) or VAR.match(s)
                    if m and m.group(1) not in ("if", "for", "while", "return"):
                        names.add(m.group(1))
            depth += s.count("{") - s.count("}")
            if anon is not None and depth <= anon:
                anon = None
    return names


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    groups = collections.defaultdict(list)
    for top in ("src", "tests"):
        for d, _, files in os.walk(os.path.join(root, top)):
            rel = os.path.relpath(d, root).split(os.sep)
            group = "tests" if top == "tests" else "/".join(rel[:2])
            groups[group] += [os.path.join(d, f) for f in sorted(files) if f.endswith(".cpp")]
    found = 0
    for group, files in sorted(groups.items()):
        where = collections.defaultdict(list)
        for f in files:
            for n in anonymous_names(f):
                where[n].append(os.path.relpath(f, root))
        for n, fs in sorted(where.items()):
            if len(fs) > 1:
                print(f"unity-names: '{n}' is defined in the anonymous namespaces of {', '.join(fs)}; "
                      f"rename one (a unity build of {group} compiles them as one file)", file=sys.stderr)
                found += 1
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
