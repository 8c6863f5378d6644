#!/usr/bin/python3
"""The Markdown files say nothing that does not exist.

    docs_resolve.py [--self-test]

Every relative link in every Markdown file of the repository points at a file or folder that
exists, and a link into a Markdown file's section (`file.md#section`, or `#section`) at one of its
headings, by GitHub's anchor rules. Every DDP_* or DDPRUN_* name a Markdown file mentions occurs
in the code: a setting of ddp/settings.h (or a name it replaced), a CMake option or definition, or
a variable of a script. Prints each one that does not, with its file and line; exits 1 if any.
"""
import os
import re
import sys
import tempfile

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
SKIP_DIRS = {".git", "node_modules", "__pycache__"}
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
NAME = re.compile(r"\bDDP(?:RUN)?_[A-Z0-9_]*[A-Z0-9]\b")
CODE_FENCE = re.compile(r"^\s*(```|~~~)")


def walk(root):
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")]
        for f in files:
            yield os.path.join(folder, f)


def slug(heading):
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return "".join(c for c in text if c.isalnum() or c in " -").replace(" ", "-")


def anchors_of(path, cache={}):
    if path not in cache:
        found, counts, fenced = set(), {}, False
        for line in open(path, encoding="utf-8"):
            if CODE_FENCE.match(line):
                fenced = not fenced
            if fenced or not line.startswith("#"):
                continue
            base = slug(line.lstrip("#"))
            n = counts.get(base, 0)
            counts[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def code_names(root):
    names = set()
    for path in walk(root):
        if path.endswith(".md"):
            continue
        try:
            names.update(NAME.findall(open(path, encoding="utf-8", errors="ignore").read()))
        except OSError:
            pass
    return names


COUNTS = {"files": 0, "links": 0, "names": 0}


def check(root):
    names = code_names(root)
    problems = []
    for path in walk(root):
        if not path.endswith(".md"):
            continue
        rel = os.path.relpath(path, root)
        COUNTS["files"] += 1
        fenced = False
        for number, line in enumerate(open(path, encoding="utf-8"), 1):
            if CODE_FENCE.match(line):
                fenced = not fenced
            for name in NAME.findall(line):
                COUNTS["names"] += 1
                if name not in names:
                    problems.append(f"{rel}:{number}: {name} occurs nowhere in the code (renamed "
                                    "or gone?)")
            if fenced:
                continue
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue  # http:, https:, mailto:
                COUNTS["links"] += 1
                file_part, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
                    if file_part else path
                if not os.path.exists(dest):
                    problems.append(f"{rel}:{number}: links to {file_part}, which does not exist")
                elif anchor and dest.endswith(".md") and anchor not in anchors_of(dest):
                    problems.append(f"{rel}:{number}: links to {target}, but "
                                    f"{os.path.relpath(dest, root)} has no such section")
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "lib"))
        open(os.path.join(root, "lib", "a.h"), "w").write('const char* k = "DDP_REAL";\n')
        open(os.path.join(root, "README.md"), "w").write(
            "# Top\n## Some Section (α-β)\nSee [a](lib/a.h), [s](#some-section-α-β), DDP_REAL.\n"
            "Broken: [b](lib/b.h), [c](#nowhere), DDP_GONE.\n")
        problems = check(os.path.realpath(root))
    expected = ["README.md:4: DDP_GONE occurs nowhere in the code (renamed or gone?)",
                "README.md:4: links to lib/b.h, which does not exist",
                "README.md:4: links to #nowhere, but README.md has no such section"]
    if problems != expected:
        print("docs self-test: expected\n  " + "\n  ".join(expected) + "\ngot\n  " +
              "\n  ".join(problems))
        return 1
    print("docs self-test: the broken link, the missing section and the unknown name are named")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    problems = check(ROOT)
    for p in problems:
        print(p)
    if problems:
        print(f"docs: {len(problems)} references resolve to nothing")
        return 1
    print(f"docs: the {COUNTS['links']} relative links and {COUNTS['names']} DDP_* names of "
          f"{COUNTS['files']} Markdown files all resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
