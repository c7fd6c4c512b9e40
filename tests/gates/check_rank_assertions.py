#!/usr/bin/env python3
"""Refuses a plain Catch2 assertion in code that runs on a rank's thread.

Catch2's assertions are not thread-safe: where the ranks of a test are threads (run_inproc,
run_thread_ranks, a std::thread, or any lambda taking the rank first, `[&](int r, ...)`), two
ranks failing at once corrupt its state. Those bodies use tests/support/thread_checks.hpp's
TCHECK, TREQUIRE and TFAIL, or record what each rank saw and assert after the join.

    check_rank_assertions.py [--root DIR]     exit 1 naming each file:line, 0 when none
"""
import argparse
import pathlib
import re
import sys

# Where a rank's thread starts: a lambda passed to a call that runs it on threads, or a lambda
# whose first parameter is the rank (`int r`, `int rank`, ...).
THREAD_CALLS = re.compile(r"\b(?:run_inproc|run_thread_ranks|run_tcp|run_shm|run_mixed|run_job|run_hogwild"
                          r"|thread_keeping_error|std::async|emplace_back)\s*(?:<[^;(]*?>)?\s*\("
                          r"|\bstd::j?thread(?:\s+\w+)?\s*[({]")
LAMBDA = re.compile(r"\[[^\[\]]*\]\s*(?:\([^)]*\)\s*)?(?:mutable\s*)?(?:noexcept\s*)?(?:->\s*[\w:<>]+\s*)?\{")
RANK_LAMBDA = re.compile(r"\[[^\[\]]*\]\s*\(\s*int\b(?:\s+(?:r|rank|t|\w+_rank|me))?\s*[,)][^)]*\)?\s*"
                         r"(?:mutable\s*)?\{")
PLAIN = re.compile(r"(?<![\w])(?:CHECK|REQUIRE|CHECK_FALSE|REQUIRE_FALSE|CHECK_THAT|REQUIRE_THAT|CHECK_THROWS\w*"
                   r"|REQUIRE_THROWS\w*|CHECK_NOTHROW|REQUIRE_NOTHROW|FAIL|FAIL_CHECK|INFO|CAPTURE|WARN)\s*\(")


def blank_comments_and_strings(text):
    """The text with comments and string or char literals replaced by spaces (lines kept)."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def matching(text, open_at, opening, closing):
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == opening:
            depth += 1
        elif text[i] == closing:
            depth -= 1
            if depth == 0:
                return i
    return len(text)


def rank_bodies(text):
    """(first, last) offsets of every lambda body that runs on a rank's thread."""
    for call in THREAD_CALLS.finditer(text):
        opening = "(" if text[call.end() - 1] == "(" else "{"
        args_end = matching(text, call.end() - 1, opening, ")" if opening == "(" else "}")
        for lam in LAMBDA.finditer(text, call.end(), args_end):
            yield lam.end() - 1, matching(text, lam.end() - 1, "{", "}")
    for lam in RANK_LAMBDA.finditer(text):
        yield lam.end() - 1, matching(text, lam.end() - 1, "{", "}")


# What the check must find in a sample of its own before its verdict on tests/ counts: a check
# that finds nothing anywhere would pass every suite.
SAMPLE = """
run_inproc(2, [&](int r, inproc_transport t) { CHECK(r >= 0); TCHECK(r >= 0); });
run_job<ssp<1>>(1, 2, [&](auto& w) {
  REQUIRE(w.id() < 2);
});
std::thread other([&] { INFO("x"); });
auto body = [&](int rank, auto& t) { FAIL("y"); };
CHECK(on_the_main_thread);
"""
SAMPLE_LINES = [2, 4, 6, 7]


def findings(path, text=None):
    text = blank_comments_and_strings(path.read_text() if text is None else text)
    seen = set()
    for first, last in rank_bodies(text):
        for hit in PLAIN.finditer(text, first, last):
            line = text.count("\n", 0, hit.start()) + 1
            if line not in seen:
                seen.add(line)
                yield line, hit.group(0).rstrip("( ")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=pathlib.Path(__file__).resolve().parents[2])
    root = pathlib.Path(parser.parse_args().root)
    found = sorted(line for line, _ in findings(None, SAMPLE))
    if found != SAMPLE_LINES:
        print(f"check_rank_assertions: finds lines {found} in its sample, not {SAMPLE_LINES}")
        return 2
    bad = []
    for path in sorted((root / "tests").rglob("*.[ch]pp")):
        if path.name == "catch.hpp" or "mutations" in path.parts:
            continue
        for line, macro in findings(path):
            bad.append(f"{path.relative_to(root)}:{line}: {macro} on a rank's thread (use TCHECK/TREQUIRE/TFAIL "
                       "from support/thread_checks.hpp, or record and assert after the join)")
    print("\n".join(bad) if bad else "no plain Catch2 assertion on a rank's thread")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
