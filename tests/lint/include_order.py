#!/usr/bin/python3
"""Includes run one way: no file includes one of a layer above its own.

    include_order.py [BUILD_DIR]

Two rules, over every source and header of lib/ and launcher/ (and the sources of BUILD_DIR's
compile database, when given, so that a generated or out-of-folder source is not missed):
  1. Between the library's parts: base <- comm <- parallel <- train, capi on comm, and the
     launcher on base alone (its doctor's sweep, a program of its own, also on comm). PARTS below
     places each folder and public header.
  2. Inside a folder whose README.md has a line "Layers, lowest first: a < b, c < d": a unit
     (a file's stem, a sub-folder, or a public header as `ddp/x.h`) includes only units of its
     own layer or lower ones.
Prints each offending include with its file and line and exits 1; exits 0 when there is none.
"""
import json
import os
import re
import sys

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
LAYERS = re.compile(r"^Layers, lowest first: (.+)$")
SEARCH = ["lib/src", "lib/include", "launcher"]

# The part each path belongs to: the longest matching prefix wins.
PARTS = {
    "lib/src/base/": "base", "lib/src/net/": "base", "lib/src/store/": "base",
    "lib/include/ddp/net/": "base",
    "lib/src/comm/": "comm", "lib/include/ddp/comm/": "comm",
    "lib/include/ddp/distributed.h": "comm",
    "lib/src/parallel/": "parallel", "lib/include/ddp/parallel/": "parallel",
    "lib/src/train/": "train", "lib/src/data/": "train", "lib/src/models/": "train",
    "lib/include/ddp/train/": "train", "lib/include/ddp/data/": "train",
    "lib/include/ddp/models/": "train",
    "lib/src/capi/": "capi", "lib/include/ddp/capi.h": "capi",
    "launcher/": "launcher",
    "launcher/doctor/allreduce_sweep.cpp": "sweep",
}
BASE_HEADERS = ["env", "env_vars", "error", "error_file", "exit_codes", "flight_recorder",
                "live_metrics", "log", "settings", "store", "store_server"]
PARTS.update({f"lib/include/ddp/{h}.h": "base" for h in BASE_HEADERS})
MAY_INCLUDE = {
    "base": {"base"},
    "comm": {"base", "comm"},
    "parallel": {"base", "comm", "parallel"},
    "train": {"base", "comm", "parallel", "train"},
    "capi": {"base", "comm", "capi"},
    "launcher": {"base", "launcher"},
    # ddprun-allreduce-sweep: the ranks of `ddprun doctor`'s sweep, built on ddp::comm.
    "sweep": {"base", "comm", "launcher", "sweep"},
}


def part_of(rel):
    best = None
    for prefix, part in PARTS.items():
        if rel.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, part)
    return best[1] if best else None


def resolve(name, including_dir):
    """The repository path an include names, or None for a system or third-party header."""
    for folder in [including_dir] + [os.path.join(ROOT, d) for d in SEARCH]:
        path = os.path.realpath(os.path.join(folder, name))
        if path.startswith(ROOT + os.sep) and os.path.isfile(path):
            return os.path.relpath(path, ROOT)
    return None


def layer_specs():
    """{folder: [(level, set of units)]} from the READMEs that declare layers."""
    specs = {}
    for area in ("lib", "launcher"):
        for folder, _, files in os.walk(os.path.join(ROOT, area)):
            if "README.md" not in files:
                continue
            for line in open(os.path.join(folder, "README.md"), encoding="utf-8"):
                m = LAYERS.match(line.strip())
                if m:
                    levels = [{u.strip(" `") for u in level.split(",")}
                              for level in m[1].split("<")]
                    specs[os.path.relpath(folder, ROOT)] = levels
    return specs


def unit_in(folder, rel):
    """The unit `rel` is in `folder`'s layers: a public header as ddp/x.h, else the first path
    component under the folder, without its extension."""
    if rel.startswith("lib/include/"):
        return rel[len("lib/include/"):]
    if not rel.startswith(folder + "/"):
        return None
    first = rel[len(folder) + 1:].split("/")[0]
    return os.path.splitext(first)[0]


def level_of(levels, unit):
    for i, units in enumerate(levels):
        if unit in units:
            return i
    return None


def files_to_check(build_dir):
    found = set()
    for area in ("lib/src", "lib/include", "launcher"):
        for folder, _, files in os.walk(os.path.join(ROOT, area)):
            for f in files:
                if f.endswith((".cpp", ".h")):
                    found.add(os.path.relpath(os.path.join(folder, f), ROOT))
    if build_dir:
        for entry in json.load(open(os.path.join(build_dir, "compile_commands.json"))):
            path = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
            rel = os.path.relpath(path, ROOT)
            if rel.startswith(("lib/src/", "launcher/")):
                found.add(rel)
    return sorted(found)


def check(build_dir=None):
    specs = layer_specs()
    problems = []
    for rel in files_to_check(build_dir):
        part = part_of(rel)
        if part is None:
            problems.append(f"{rel}: in no part of the library; place its folder in "
                            "tests/lint/include_order.py's PARTS")
            continue
        for number, line in enumerate(open(os.path.join(ROOT, rel), encoding="utf-8"), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = resolve(m[1], os.path.dirname(os.path.join(ROOT, rel)))
            if target is None:
                continue
            target_part = part_of(target)
            if target_part not in MAY_INCLUDE[part]:
                problems.append(f"{rel}:{number}: includes {m[1]} ({target_part}) from {part}, "
                                f"which may include only {', '.join(sorted(MAY_INCLUDE[part]))}")
                continue
            for folder, levels in specs.items():
                mine, theirs = unit_in(folder, rel), unit_in(folder, target)
                a, b = level_of(levels, mine), level_of(levels, theirs)
                if mine is None or theirs is None or mine == theirs:
                    continue
                if rel.startswith(folder + "/") and a is None:
                    problems.append(f"{rel}: '{mine}' is in no layer of {folder}/README.md")
                elif a is not None and b is not None and b > a:
                    problems.append(f"{rel}:{number}: includes {m[1]}: '{theirs}' is a layer "
                                    f"above '{mine}' in {folder}/README.md")
    return sorted(set(problems))


def self_test():
    """The checker on a small tree with one include of each wrong kind: it must name both, and
    nothing else."""
    import tempfile
    global ROOT
    with tempfile.TemporaryDirectory() as root:
        files = {
            "lib/src/base/a.cpp": '#include "comm/b.h"\n#include "ddp/log.h"\n',
            "lib/src/comm/b.h": '#include "ddp/log.h"\n',
            "lib/include/ddp/log.h": "",
            "lib/include/ddp/store_server.h": "",
            "lib/src/store/README.md": "Layers, lowest first: wire < tcp_backend < "
                                       "`ddp/store_server.h`, server\n",
            "lib/src/store/tcp_backend.cpp": '#include "store/wire.h"\n'
                                             '#include "ddp/store_server.h"\n',
            "lib/src/store/wire.h": "",
            "lib/src/store/server.cpp": '#include "ddp/store_server.h"\n#include "store/wire.h"\n',
        }
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            open(os.path.join(root, rel), "w").write(text)
        ROOT = os.path.realpath(root)
        problems = check()
    expected = ["lib/src/base/a.cpp:1: includes comm/b.h (comm) from base, which may include "
                "only base",
                "lib/src/store/tcp_backend.cpp:2: includes ddp/store_server.h: "
                "'ddp/store_server.h' is a layer above 'tcp_backend' in lib/src/store/README.md"]
    if problems != expected:
        print("include order self-test: expected\n  " + "\n  ".join(expected) + "\ngot\n  " +
              "\n  ".join(problems))
        return 1
    print("include order self-test: both wrong includes named, nothing else")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    problems = check(sys.argv[1] if len(sys.argv) > 1 else None)
    for p in problems:
        print(p)
    if problems:
        print(f"include order: {len(problems)} includes run against the layers")
        return 1
    print("include order: every include runs down a layer or stays in its own")
    return 0


if __name__ == "__main__":
    sys.exit(main())
