#!/usr/bin/env python3
"""Puts every C++ block of README.md, docs/ and the headers' doc comments in front of a compiler.

A block that begins "// A complete program" is built and run as it stands (tests/CMakeLists.txt,
`doc_program_*`). Every other ```cpp block must follow a line `<!-- frame: NAME -->`: the frame
tests/docs/frames/NAME.cpp holds what the block leaves to its reader (includes, the variables it
uses) and a line `// @block@` where the block goes. A header's doc-comment example
(`/// @code` ... `/// @endcode`) names its frame the same way, on the line right before it:
`/// <!-- frame: NAME -->`. A frame's first lines may say what it needs:
  // links: dtrain::asio            the targets to link
  // needs: asio eigen thrust nccl  build it only where each was found
A block whose frame cannot be written yet is listed in tests/docs/unframed.txt (`page block-index
reason`); the check fails for a block that is in neither place, for a listed block that has a
frame now or is gone, so the list only shrinks, and for a header's frame line no example follows.

  doc_blocks.py --root ROOT --out DIR    writes DIR/<page>_<n>.cpp and DIR/doc_blocks.cmake (exit 2
                                         where it cannot)
  doc_blocks.py --root ROOT --check      only the check above
"""
import argparse
import glob
import os
import re
import sys

BLOCK = re.compile(r"(?:<!-- frame: ([\w-]+) -->\n)?```cpp\n(.*?)```", re.S)
HEADER_BLOCK = re.compile(r"^(?:/// <!-- frame: ([\w-]+) -->\n)?/// @code\n((?:///.*\n)*?)/// @endcode", re.M)
# Anything that opens a C++ block, however spelled: each must be one BLOCK or HEADER_BLOCK finds.
ANY_FENCE = re.compile(r"^[ \t]*```[ \t]*(?:c\+\+|cpp|cxx|cc)\b.*$", re.M | re.I)
ANY_CODE = re.compile(r"^[ \t]*///?[ \t]*[@\\]code\b.*$", re.M)
# A header's frame line, however placed: each must be one that HEADER_BLOCK reads.
ANY_HEADER_FRAME = re.compile(r"^.*<!-- frame:.*$", re.M)


def pages(root):
    found = [os.path.join(root, "README.md")]
    found += sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
    return found


def page_id(root, path):
    rel = os.path.relpath(path, root)
    return re.sub(r"\W", "_", rel[:-3] if rel.endswith(".md") else rel)  # docs/a.md: docs_a; x.hpp: x_hpp


def blocks(root):
    """(page id, index from 1, frame or None, code) for every ```cpp block that is no complete program,
    and every `@code` block of a header's doc comments."""
    for path in sorted(glob.glob(os.path.join(root, "include", "**", "*.hpp"), recursive=True)):
        text = open(path, encoding="utf-8").read()
        for n, m in enumerate(HEADER_BLOCK.finditer(text), start=1):
            code = "".join(line[4:] + "\n" for line in m.group(2).splitlines())
            yield page_id(root, path), n, m.group(1), code
    for path in pages(root):
        text = open(path, encoding="utf-8").read()
        n = 0
        for m in BLOCK.finditer(text):
            if m.group(2).startswith("// A complete program"):
                continue
            n += 1
            yield page_id(root, path), n, m.group(1), m.group(2)


def unframed(root):
    listed = {}
    path = os.path.join(root, "tests", "docs", "unframed.txt")
    for line in open(path, encoding="utf-8"):
        if line.strip() and not line.startswith("#"):
            page, index, reason = line.split(None, 2)
            listed[(page, int(index))] = reason.strip()
    return listed


def strays(root):
    """C++ blocks spelled so that no rule here finds them (```c++, an indented fence, a trailing
    space, an indented @code), a header's frame line that no `/// @code` follows, and complete
    programs outside docs/*.md, which CMake builds from there only."""
    found = []
    for path in pages(root):
        text = open(path, encoding="utf-8").read()
        for m in ANY_FENCE.finditer(text):
            if m.group(0) != "```cpp":
                found.append(f"{page_id(root, path)}: '{m.group(0).strip()}' opens a C++ block no rule reads; "
                             "write ```cpp")
        in_docs = os.path.dirname(os.path.relpath(path, root)) == "docs"
        if not in_docs and "```cpp\n// A complete program" in text:
            found.append(f"{page_id(root, path)}: a complete program outside docs/*.md, which nothing builds")
    for path in sorted(glob.glob(os.path.join(root, "include", "**", "*.hpp"), recursive=True)):
        text = open(path, encoding="utf-8").read()
        for m in ANY_CODE.finditer(text):
            if m.group(0) != "/// @code":
                found.append(f"{page_id(root, path)}: '{m.group(0).strip()}' opens an example no rule reads")
        read = {m.start() for m in HEADER_BLOCK.finditer(text) if m.group(1) is not None}
        for m in ANY_HEADER_FRAME.finditer(text):
            if m.start() not in read:
                found.append(f"{page_id(root, path)}: '{m.group(0).strip()}' names a frame for no example; "
                             "write '/// <!-- frame: NAME -->' on the line right before '/// @code'")
    return found


def check(root):
    """@returns the problems: blocks with neither a frame nor a listing, stale listings, missing
    frames or frames without their `// @block@` line, and blocks no rule reads."""
    problems = strays(root)
    listed = unframed(root)
    seen = set()
    for page, n, frame, _ in blocks(root):
        seen.add((page, n))
        if frame is None and (page, n) not in listed:
            problems.append(f"{page} block {n}: no '<!-- frame: NAME -->' line before it and not in unframed.txt")
        if frame is not None and (page, n) in listed:
            problems.append(f"{page} block {n}: has a frame now; take it out of unframed.txt")
        frame_path = os.path.join(root, "tests", "docs", "frames", f"{frame}.cpp")
        if frame is not None and not os.path.exists(frame_path):
            problems.append(f"{page} block {n}: no frame tests/docs/frames/{frame}.cpp")
        elif frame is not None and "// @block@\n" not in open(frame_path, encoding="utf-8").read():
            problems.append(f"{page} block {n}: tests/docs/frames/{frame}.cpp has no '// @block@' line")
    for key in listed:
        if key not in seen:
            problems.append(f"unframed.txt lists {key[0]} block {key[1]}, which is no longer an unframed block")
    return problems


def write(root, out):
    os.makedirs(out, exist_ok=True)
    lines = []
    for page, n, frame, code in blocks(root):
        if frame is None:
            continue
        frame_path = os.path.join(root, "tests", "docs", "frames", frame + ".cpp")
        text = open(frame_path, encoding="utf-8").read()
        if "// @block@\n" not in text:
            raise ValueError(f"{frame_path} has no '// @block@' line")
        links = re.search(r"^// links: (.*)$", text, re.M)
        needs = re.search(r"^// needs: (.*)$", text, re.M)
        name = f"{page}_{n}"
        source = os.path.join(out, name + ".cpp")
        source_text = text.replace("// @block@\n", f"// {page} block {n}, in frame {frame}\n#line 1 \"{page}\"\n{code}")
        if not os.path.exists(source) or open(source, encoding="utf-8").read() != source_text:
            open(source, "w", encoding="utf-8").write(source_text)  # unchanged: no rebuild
        lines.append(f'dtrain_doc_block({name} "{source}" "{links.group(1) if links else ""}" '
                     f'"{needs.group(1) if needs else ""}")')
    with open(os.path.join(out, "doc_blocks.cmake"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True)
    ap.add_argument("--out")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    problems = check(a.root)
    for p in problems:
        print(f"doc_blocks: {p}", file=sys.stderr)
    if a.out:
        try:
            write(a.root, a.out)
        except (OSError, ValueError) as e:  # configure stops: the blocks would not be compiled
            print(f"doc_blocks: {e}", file=sys.stderr)
            return 2
    if problems:
        return 1
    print(f"doc_blocks: every C++ block has a frame or is listed in unframed.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
