#!/bin/sh
# The compiler launcher of the benchmark sources' check (bench/CMakeLists.txt): runs the
# compile command it is given, which holds -fsyntax-only, then creates the object file
# the command names, empty. The compiler writes no object under -fsyntax-only (it does
# write the dependency file), so without it the build tool would see the check as never
# done and run it on every build; with it the check reruns only when a source or header
# it read changes.
"$@" || exit $?
out=
take=0
for arg in "$@"; do
  if [ "$take" = 1 ]; then out=$arg; take=0; fi
  [ "$arg" = "-o" ] && take=1
done
if [ -n "$out" ]; then : > "$out"; fi
