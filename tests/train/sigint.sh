#!/usr/bin/env bash
# Ctrl-C (SIGINT) finishes the current step, writes a checkpoint and exits 0; the run
# then resumes from it.
#   sigint.sh TRAIN WORKDIR
set -u
. "$(dirname "$0")/common.sh"
train=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" && make_text "$dir/text.txt"
args=(--config tiny_train --data "$dir/text.txt" --steps 100000 --batch 2 --seq 32 --save-every 0 --eval-every 0 --seed 1)
"$train" "${args[@]}" --out "$dir/run" > "$dir/log" 2>&1 &
pid=$!
for _ in $(seq 200); do grep -q "^step 3 " "$dir/log" && break; sleep 0.05; done
kill -INT "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 0 ] || { cat "$dir/log" >&2; fail "exit status $rc after SIGINT, wanted 0"; }
grep -q "stopped at step [0-9]* of 100000; continue with --resume" "$dir/log" || fail "no 'stopped at step' line"
step=$(sed -n 's/^stopped at step \([0-9]*\) .*/\1/p' "$dir/log")
[ "$(cat "$dir/run/checkpoint")" = "checkpoint-$step" ] || fail "the checkpoint is not at step $step"
"$train" "${args[@]/100000/$((step + 2))}" --out "$dir/run" --resume > "$dir/log2" 2>&1 || fail "resume after SIGINT failed"
echo "sigint: stopped at step $step with a checkpoint, resumed to step $((step + 2))"
