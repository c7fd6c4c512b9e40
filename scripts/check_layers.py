#!/usr/bin/env python3
"""Keeps dtrain's headers in their layers.

Reads the layer ladder from docs/architecture.md (the fenced block after the line
`<!-- layer ladder -->`: one layer a line, `number name folder/ folder/ file.hpp ...`, higher numbers
above lower ones) and every `#include "dtrain/..."` under include/, and fails when
  - a header includes one from a higher layer (the same layer is fine),
  - a header is in no layer of the ladder,
  - the includes form a cycle,
  - a header includes PyTorch, pybind11 or Python (those belong to extensions/torch_backend, a
    separate target; the header-only library stays free of them),
  - a header under include/, or a source or build file under OTHER_FOLDERS, is longer than MAX_LINES as a reader holds
    it (each line counted as the lines it takes wrapped at WRAP columns, so joining lines does not
    shorten a file) and is not in LARGE_HEADERS below, or is listed there but no longer needs to be
    (so the list stays short and true),
  - a line there, or in a C++ block of README.md or docs/, is wider than MAX_COLUMNS.

  python3 scripts/check_layers.py [--root .]
"""
import argparse
import os
import re
import sys

MAX_LINES = 500
WRAP = 100
MAX_COLUMNS = 120
SOURCES = (".hpp", ".cuh", ".h", ".cpp", ".cu", ".py")
BUILD_FILES = (".sh", ".cmake", ".in", "CMakeLists.txt")  # and scripts named by their #! line
# Beside include/, the folders whose sources and build files are held to the same sizes.
OTHER_FOLDERS = ("extensions", "tests", "bench", "examples", "tools", "scripts", "cmake")

# Files allowed past MAX_LINES (paths under include/ without it, others from the root), each with
# a ceiling (its size when allowed, plus a few lines: it may not keep growing) and the reason it
# is still one file, with the split it waits for.
LARGE_HEADERS = {}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](dtrain/[^">]+)[">]', re.MULTILINE)
FOREIGN = re.compile(r'^\s*#\s*include\s*[<"]((?:torch|ATen|c10|pybind11)/[^">]*|Python\.h)[">]', re.MULTILINE)


def reader_lines(text):
    """Lines as a reader holds them: a line wider than WRAP columns counts as the lines it wraps to."""
    return sum(max(1, -(-len(line) // WRAP)) for line in text.splitlines())


def wide_code_in_docs(root):
    """C++ blocks in README.md and docs/ (compiled by the doc tests) wider than MAX_COLUMNS."""
    problems = []
    pages = [os.path.join(root, "README.md")]
    for folder, _, files in os.walk(os.path.join(root, "docs")):
        pages += [os.path.join(folder, f) for f in files if f.endswith(".md")]
    for page in sorted(pages):
        in_cpp = False
        for number, line in enumerate(open(page, encoding="utf-8").read().splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_cpp = not in_cpp and line.strip() in ("```cpp", "```c++", "```cuda")
            elif in_cpp and len(line) > MAX_COLUMNS:
                where = f"{os.path.relpath(page, root)}:{number}"
                problems.append(f"{where}: {len(line)} columns of C++, over {MAX_COLUMNS}")
    return problems


def read_ladder(architecture):
    text = open(architecture, encoding="utf-8").read()
    marker = text.find("<!-- layer ladder -->")
    if marker < 0:
        sys.exit(f"check_layers: {architecture} has no '<!-- layer ladder -->' block")
    block = re.search(r"```[^\n]*\n(.*?)```", text[marker:], re.DOTALL)
    if not block:
        sys.exit(f"check_layers: no fenced block after the ladder marker in {architecture}")
    layers = []  # (level, name, [prefixes])
    for line in block.group(1).splitlines():
        parts = line.split()
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        layers.append((int(parts[0]), parts[1], ["dtrain/" + p for p in parts[2:]]))
    return layers


def layer_of(header, layers):
    """The layer whose folder or file names `header` most specifically."""
    best = None
    for level, name, prefixes in layers:
        for p in prefixes:
            if (header == p or (p.endswith("/") and header.startswith(p))) and (best is None or len(p) > best[2]):
                best = (level, name, len(p))
    return best[:2] if best else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = ap.parse_args()
    include_dir = os.path.join(args.root, "include")
    layers = read_ladder(os.path.join(args.root, "docs", "architecture.md"))

    headers, foreign, sizes = {}, [], []
    for folder, _, files in os.walk(include_dir):
        for f in files:
            if f.endswith((".hpp", ".cuh", ".h")):
                path = os.path.join(folder, f)
                rel = os.path.relpath(path, include_dir).replace(os.sep, "/")
                text = open(path, encoding="utf-8").read()
                headers[rel] = (reader_lines(text), INCLUDE.findall(text))
                sizes.append((os.path.join("include", rel), text))
                foreign.extend(f"{rel}: includes <{inc}>: PyTorch and Python stay in extensions/torch_backend"
                               for inc in FOREIGN.findall(text))

    problems = list(foreign)
    for header, (_, includes) in sorted(headers.items()):
        mine = layer_of(header, layers)
        if mine is None:
            problems.append(f"{header}: in no layer of the ladder in docs/architecture.md")
            continue
        for inc in includes:
            if inc not in headers:
                problems.append(f"{header}: includes {inc}, which does not exist")
                continue
            theirs = layer_of(inc, layers)
            if theirs is not None and theirs[0] > mine[0]:
                problems.append(f"{header} ({mine[1]}, layer {mine[0]}) includes {inc} "
                                f"({theirs[1]}, layer {theirs[0]}): a lower layer may not include a higher one")

    # Cycles: a depth-first search that reports each back edge's loop once.
    state, stack = {}, []

    def visit(h):
        state[h] = "open"
        stack.append(h)
        for inc in headers[h][1]:
            if inc not in headers:
                continue
            if state.get(inc) == "open":
                loop = stack[stack.index(inc):] + [inc]
                problems.append("include cycle: " + " -> ".join(loop))
            elif inc not in state:
                visit(inc)
        stack.pop()
        state[h] = "done"

    for h in sorted(headers):
        if h not in state:
            visit(h)

    for top in OTHER_FOLDERS:
        if not os.path.isdir(os.path.join(args.root, top)):
            problems.append(f"{top}/: no such folder; update OTHER_FOLDERS in scripts/check_layers.py")
        for folder, _, files in os.walk(os.path.join(args.root, top)):
            for f in files:
                path = os.path.join(folder, f)
                if f.endswith(SOURCES + BUILD_FILES) or ("." not in f and open(path, "rb").read(2) == b"#!"):
                    sizes.append((os.path.relpath(path, args.root), open(path, encoding="utf-8").read()))
    problems += wide_code_in_docs(args.root)
    sizes.append(("CMakeLists.txt", open(os.path.join(args.root, "CMakeLists.txt"), encoding="utf-8").read()))
    size_of = {}
    for path, text in sorted(sizes):
        lines = reader_lines(text)
        key = path.removeprefix("include/")
        size_of[key] = lines
        if lines > MAX_LINES and key not in LARGE_HEADERS:
            problems.append(f"{path}: {lines} lines wrapped at {WRAP} columns, over {MAX_LINES}; split it by job "
                            f"(or allow it in scripts/check_layers.py with a reason)")
        for number, line in enumerate(text.splitlines(), 1):
            if len(line) > MAX_COLUMNS:
                problems.append(f"{path}:{number}: {len(line)} columns, over {MAX_COLUMNS}")
    for header, (ceiling, reason) in sorted(LARGE_HEADERS.items()):
        if header not in size_of:
            problems.append(f"scripts/check_layers.py allows {header}, which does not exist")
        elif size_of[header] <= MAX_LINES:
            problems.append(f"{header}: {size_of[header]} lines now; take it off the allow-list")
        elif size_of[header] > ceiling:
            problems.append(f"{header}: {size_of[header]} lines wrapped at {WRAP} columns, past its ceiling of "
                            f"{ceiling} in scripts/check_layers.py: split it by job")
        else:
            print(f"allowed: {header} ({size_of[header]} lines wrapped at {WRAP} columns): {reason}")

    if problems:
        print("\n".join(problems), file=sys.stderr)
        print(f"check_layers: {len(problems)} problem(s) in {len(headers)} headers", file=sys.stderr)
        return 1
    print(f"check_layers: {len(headers)} headers in {len(layers)} layers, no upward include, no cycle, "
          f"no file over {MAX_LINES} lines wrapped at {WRAP} columns nor any line over {MAX_COLUMNS} columns"
          + (f" but the {len(LARGE_HEADERS)} allowed" if LARGE_HEADERS else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
