#!/bin/sh
# A compiler launcher for what is compiled and never linked (the header checks, the doc blocks):
# the compiler runs with -fsyntax-only, which instantiates every template a source uses and gives
# every front-end diagnostic, but generates no code (half the time of -O0 for a trainer's block);
# an empty file then stands where the build expects the object, and the depfile is written as usual.
out=
prev=
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then out=$arg; fi
  prev=$arg
done
"$@" -fsyntax-only || exit
if [ -n "$out" ]; then : > "$out"; fi
