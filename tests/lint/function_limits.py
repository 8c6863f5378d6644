#!/usr/bin/python3
"""The size limit on functions in lib/ and launcher/, held by clang-tidy.

    function_limits.py BUILD_DIR [--jobs N] [--report] [--exceptions FILE]

Runs Debian's clang-tidy with readability-function-size (100 lines, 8 levels of nesting) and
readability-function-cognitive-complexity (threshold below) on every source of lib/ and launcher/
in BUILD_DIR's compile database, and compares the offenders with the exceptions file
(function-limit-exceptions.txt beside this script). Fails, naming each one, when a function
offends that the file does not list, or when the file lists one that no longer offends (the file
only shrinks: delete its line). --report prints every offender with its figures instead.

Results are cached per translation unit in BUILD_DIR/function-limits/, keyed by the text of the
source and of every project header it includes, so a second run checks only what changed.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys

LINES = 100
NESTING = 8
COGNITIVE = 25
CHECKS = "-*,readability-function-size,readability-function-cognitive-complexity"
CONFIG = json.dumps({"CheckOptions": [
    {"key": "readability-function-size.LineThreshold", "value": str(LINES)},
    {"key": "readability-function-size.NestingThreshold", "value": str(NESTING)},
    {"key": "readability-function-cognitive-complexity.Threshold", "value": str(COGNITIVE)},
    {"key": "readability-function-cognitive-complexity.DescribeBasicIncrements", "value": "false"},
]})
ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
AREAS = ("lib/src/", "lib/include/", "launcher/")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
WARNING = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):\d+: warning: function '(?P<name>[^']+)' "
                     r"(?:exceeds recommended size/complexity thresholds|has cognitive complexity "
                     r"of (?P<cc>\d+))", re.M)
NOTE = re.compile(r"^[^:\n]+:\d+:\d+: note: (?P<n>\d+) (?P<what>lines|nesting level)", re.M)


def tidy_binary():
    for name in ("clang-tidy", "clang-tidy-14"):
        for folder in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin"]:
            path = os.path.join(folder, name)
            if os.access(path, os.X_OK):
                return path
    return None


def project_headers(source, include_dirs, seen):
    """The project headers `source` includes, transitively (quoted includes found on disk)."""
    try:
        text = open(source, encoding="utf-8", errors="replace").read()
    except OSError:
        return
    for name in INCLUDE.findall(text):
        for folder in [os.path.dirname(source)] + include_dirs:
            path = os.path.realpath(os.path.join(folder, name))
            if path.startswith(ROOT) and os.path.isfile(path):
                if path not in seen:
                    seen.add(path)
                    project_headers(path, include_dirs, seen)
                break


def cache_key(entry, tidy):
    source = entry["file"]
    include_dirs = [os.path.join(entry["directory"], arg[2:]) if not arg[2:].startswith("/")
                    else arg[2:] for arg in entry["arguments"] if arg.startswith("-I")]
    seen = set()
    project_headers(source, include_dirs, seen)
    digest = hashlib.sha256((tidy + CHECKS + CONFIG + " ".join(entry["arguments"])).encode())
    for path in [source] + sorted(seen):
        digest.update(path.encode())
        digest.update(open(path, "rb").read())
    return digest.hexdigest()


def offenders_of(output):
    """[(file, function, figures)] from clang-tidy's output for one translation unit."""
    found = {}
    positions = [m for m in WARNING.finditer(output)]
    for i, m in enumerate(positions):
        end = positions[i + 1].start() if i + 1 < len(positions) else len(output)
        rel = os.path.relpath(os.path.realpath(m["file"]), ROOT)
        if not rel.startswith(AREAS):
            continue
        figures = found.setdefault((rel, m["name"]), {})
        if m["cc"]:
            figures["cognitive"] = int(m["cc"])
        for note in NOTE.finditer(output, m.end(), end):
            figures["lines" if note["what"] == "lines" else "nesting"] = int(note["n"])
    return found


def check_unit(entry, tidy, cache_dir):
    key = cache_key(entry, tidy)
    cached = os.path.join(cache_dir, key + ".json")
    if os.path.exists(cached):
        return json.load(open(cached)), True
    run = subprocess.run([tidy, "--quiet", "-p", entry["build"], "--checks=" + CHECKS,
                          "--config=" + CONFIG, entry["file"]],
                         capture_output=True, text=True)
    if "fatal error:" in run.stdout + run.stderr:
        raise RuntimeError(f"clang could not parse {entry['file']}:\n{run.stdout}{run.stderr}")
    found = [[f, n, figures] for (f, n), figures in offenders_of(run.stdout).items()]
    tmp = cached + ".partial"
    json.dump(found, open(tmp, "w"))
    os.replace(tmp, cached)
    return found, False


def read_exceptions(path):
    """{(file, function): reason}; lines `file | function | reason`, # comments."""
    listed = {}
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != 3 or not all(parts):
            sys.exit(f"{path}:{number}: expected `file | function | reason`, got: {line}")
        listed[(parts[0], parts[1])] = parts[2]
    return listed


def describe(figures):
    parts = []
    if "lines" in figures:
        parts.append(f"{figures['lines']} lines")
    if "nesting" in figures:
        parts.append(f"nesting {figures['nesting']}")
    if "cognitive" in figures:
        parts.append(f"cognitive complexity {figures['cognitive']}")
    return ", ".join(parts) or "over a limit"


def run(build_dir, exceptions, jobs=1, report=False):
    tidy = tidy_binary()
    if tidy is None:
        sys.exit("function limits: clang-tidy is not installed (scripts/install-deps installs it)")
    database = os.path.join(build_dir, "compile_commands.json")
    if not os.path.exists(database):
        sys.exit(f"function limits: no {database}; configure the build first")
    build = os.path.realpath(build_dir)
    units = {}
    for entry in json.load(open(database)):
        source = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
        if os.path.relpath(source, ROOT).startswith(AREAS):
            arguments = entry.get("arguments") or shlex.split(entry["command"])
            units[source] = {"file": source, "directory": entry["directory"],
                             "arguments": arguments, "build": build}
    cache_dir = os.path.join(build, "function-limits")
    os.makedirs(cache_dir, exist_ok=True)
    offenders, fresh = {}, 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for found, was_cached in pool.map(lambda u: check_unit(u, tidy, cache_dir),
                                          units.values()):
            fresh += 0 if was_cached else 1
            for f, n, figures in found:
                offenders.setdefault((f, n), {}).update(figures)
    print(f"function limits: {len(units)} sources ({fresh} checked, {len(units) - fresh} cached); "
          f"{len(offenders)} functions over {LINES} lines, nesting {NESTING} or cognitive "
          f"complexity {COGNITIVE}")
    if report:
        for (f, n), figures in sorted(offenders.items(), key=lambda kv: -kv[1].get("lines", 0)):
            print(f"  {f} | {n} | {describe(figures)}")
        return 0
    listed = read_exceptions(exceptions)
    status = 0
    for (f, n), figures in sorted(offenders.items()):
        if (f, n) not in listed:
            print(f"{f}: function '{n}' is over the limit ({describe(figures)}); split it into "
                  f"named steps (the limit: {LINES} lines, nesting {NESTING}, cognitive "
                  f"complexity {COGNITIVE})")
            status = 1
    for (f, n) in sorted(listed):
        if (f, n) not in offenders:
            print(f"{os.path.basename(exceptions)}: '{n}' in {f} is within the limit now (or "
                  "gone); delete its line")
            status = 1
    if status == 0:
        print(f"function limits: every offender is one of the {len(listed)} listed exceptions")
    return status


def self_test():
    """A file with one function over the limit and one within it: unlisted, the long one fails
    the check; listed, it passes; a listed function that is within the limit fails it."""
    import tempfile
    global ROOT
    with tempfile.TemporaryDirectory() as root:
        ROOT = os.path.realpath(root)
        source = os.path.join(ROOT, "lib/src/base/sizes.cpp")
        os.makedirs(os.path.dirname(source))
        body = "".join(f"  total += {i};\n" for i in range(LINES + 20))
        open(source, "w").write(f"int long_one(int total) {{\n{body}  return total;\n}}\n"
                                "int short_one(int x) { return x + 1; }\n")
        build = os.path.join(ROOT, "build")
        os.makedirs(build)
        json.dump([{"directory": build, "file": source,
                    "command": f"c++ -std=c++17 -c {source}"}],
                  open(os.path.join(build, "compile_commands.json"), "w"))
        exceptions = os.path.join(ROOT, "exceptions.txt")
        outcomes = []
        for listed in ("", "lib/src/base/sizes.cpp | long_one | a test\n",
                       "lib/src/base/sizes.cpp | long_one | a test\n"
                       "lib/src/base/sizes.cpp | short_one | a test\n"):
            open(exceptions, "w").write(listed)
            outcomes.append(run(build, exceptions))
    if outcomes != [1, 0, 1]:
        print(f"function limits self-test: exit codes {outcomes}, expected [1, 0, 1]")
        return 1
    print("function limits self-test: an unlisted long function and a stale exception both fail")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build_dir")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--exceptions",
                        default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                             "function-limit-exceptions.txt"))
    args = parser.parse_args()
    return run(args.build_dir, args.exceptions, args.jobs, args.report)


if __name__ == "__main__":
    sys.exit(main())
