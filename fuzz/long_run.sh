#!/usr/bin/env bash
# The long fuzz run, outside CI: each target for SECONDS_<name> seconds (default 1200),
# starting from fuzz/seeds/<name> and growing build-fuzz/long/<name>. Afterwards,
#   fuzz/long_run.sh --merge
# minimizes each grown corpus into fuzz/seeds/<name> (libFuzzer -merge=1), so that
# CI's short runs (scripts/test) start where this run stopped. Results go to
# fuzz/README.md by hand: executions, coverage (cov/ft from the last status line), findings.
#   build first: CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DTLM_BUILD_FUZZ=ON \
#                  -DTLM_BUILD_TESTS=OFF -DTLM_BUILD_EXAMPLES=OFF -DTLM_BUILD_BENCH=OFF && cmake --build build-fuzz
set -euo pipefail
cd "$(dirname "$0")/.."
export TLM_MODEL_PATH=${TLM_MODEL_PATH:-$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf}
targets=${TARGETS:-"fuzz_gguf fuzz_model fuzz_tokenizer"}
mkdir -p build-fuzz/long
for name in $targets; do
  bin=build-fuzz/fuzz/$name
  [ -x "$bin" ] || { echo "long_run: $bin is missing; build build-fuzz first (see the top of this script)" >&2; exit 1; }
  if [ "${1:-}" = "--merge" ]; then
    # Minimize seeds + grown corpus into a fresh directory, then replace the seeds with it.
    rm -rf "build-fuzz/long/$name.min" && mkdir -p "build-fuzz/long/$name.min"
    "$bin" -merge=1 "build-fuzz/long/$name.min" "fuzz/seeds/$name" "build-fuzz/long/$name" > "build-fuzz/long/$name.merge.log" 2>&1
    rm -rf "fuzz/seeds/$name" && cp -r "build-fuzz/long/$name.min" "fuzz/seeds/$name"
    echo "$name: $(ls "fuzz/seeds/$name" | wc -l) seeds, $(du -sh "fuzz/seeds/$name" | cut -f1)"
    continue
  fi
  var=SECONDS_$name
  secs=${!var:-1200}
  mkdir -p "build-fuzz/long/$name"
  echo "--- $name for $secs s"
  "$bin" -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="build-fuzz/long/$name-" \
         "build-fuzz/long/$name" "fuzz/seeds/$name" > "build-fuzz/long/$name.log" 2>&1 || echo "$name: FAILED (see build-fuzz/long/$name.log)"
  grep -E "^#[0-9]+.*(DONE|cov)" "build-fuzz/long/$name.log" | tail -n 1
  grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "build-fuzz/long/$name.log" || true
done
