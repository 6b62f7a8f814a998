#!/usr/bin/python3
"""README.md's source map is true: it names every file of the library's
folders that exists, names no path that does not, and lists the folders
from the top floor down in the order of the layout (scripts/check_layers.sh).

A map row names its files in its first cell, in backquotes: a path
(`pipeline/run/run.c`), a pair (`io/output/writer.[ch]` names .c and .h) or a
folder (`cuda/`, only checked to exist). Folder READMEs are the folders' own
headers and need no row.
"""
import os
import re
import sys

SRC = os.environ.get("TW_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The library's folders, top floor first: the order the map lists them in.
FLOORS = [
    "include", "workflows", "api", "config", "pipeline/run", "pipeline/report",
    "pipeline/engine", "pipeline/store", "pipeline", "cuda", "model", "io/output", "io/modelfile",
    "io/input", "io", "core",
]
LIBRARY = ["include", "workflows", "api", "config", "pipeline", "cuda", "model", "io", "core"]

fails = []


def fail(msg):
    fails.append(msg)
    print("FAIL: " + msg)


def map_rows(readme):
    text = open(readme, encoding="utf-8").read()
    start = text.find("\n## Source map")
    if start < 0:
        fail("README.md has no '## Source map' section")
        return []
    end = text.find("\n## ", start + 1)
    section = text[start:end if end > 0 else len(text)]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| path") or line.startswith("|---"):
            continue
        first = line[2:].split(" | ", 1)[0]
        rows.append(re.findall(r"`([^`]+)`", first))
    return rows


def expand(token):
    m = re.fullmatch(r"(.*)\.\[([a-z]+)\]", token)
    if m:
        return [m.group(1) + "." + c for c in m.group(2)]
    return [token]


def library_files():
    out = set()
    for top in LIBRARY:
        for root, _dirs, files in os.walk(os.path.join(SRC, top)):
            for f in files:
                if f == "README.md" or f.endswith((".pyc", ".o")):
                    continue
                out.add(os.path.relpath(os.path.join(root, f), SRC))
    return out


def floor_of(path):
    d = os.path.dirname(path)
    return FLOORS.index(d) if d in FLOORS else None


def main():
    rows = map_rows(os.path.join(SRC, "README.md"))
    named = []
    for tokens in rows:
        for t in tokens:
            for p in expand(t):
                named.append(p)
    for p in named:
        if not os.path.exists(os.path.join(SRC, p.rstrip("/"))):
            fail("README.md's source map names %s, which does not exist" % p)
    files = library_files()
    for f in sorted(files - set(named)):
        fail("%s is a library file README.md's source map does not name" % f)
    last, last_path = -1, None
    for p in named:
        if p.endswith("/") or p not in files:
            continue
        k = floor_of(p)
        if k is None:
            fail("%s lies in no floor of the layout (%s)" % (p, ", ".join(FLOORS)))
            continue
        if k < last:
            fail("README.md's source map lists %s (%s/) after %s (%s/): the floors go %s" %
                 (p, FLOORS[k], last_path, FLOORS[last], " > ".join(FLOORS)))
        last, last_path = max(last, k), p if k >= last else last_path
    print("%d library files, %d named paths, %d problems" % (len(files), len(named), len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
