#!/usr/bin/env bash
# Ctrl-C (SIGINT) finishes the current step, writes a checkpoint and exits 0; the run
# then resumes from it. A second Ctrl-C abandons the checkpoint write and exits 1; the
# previous checkpoint is still the committed one, intact, and nothing is left behind.
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

# Ctrl-C pressed again and again, a checkpoint after every step: whatever step or write
# the presses land in, the write the second one reaches is abandoned. They are 10 ms
# apart because two signals sent at once may arrive as one; a step takes far longer.
# On a loaded machine the shell's 10 ms sleep can stretch past the last write, so that
# the run has stopped cleanly (exit 0, "stopped at step") before a second press lands:
# that attempt tells nothing and is made again, up to 3 times; any other outcome fails.
for attempt in 1 2 3; do
  rm -rf "$dir/twice"
  "$train" "${args[@]}" --save-every 1 --batch 16 --seq 128 --out "$dir/twice" > "$dir/twice.log" 2> "$dir/twice.err" &
  pid=$!
  for _ in $(seq 400); do grep -q "^step 2 " "$dir/twice.log" && break; sleep 0.05; done
  for _ in 1 2 3; do kill -INT "$pid" 2> /dev/null; sleep 0.01; done
  wait "$pid"
  rc=$?
  [ "$rc" -eq 0 ] && grep -q "^stopped at step [0-9]* of 100000" "$dir/twice.log" && [ "$attempt" -lt 3 ] && continue
  break
done
[ "$rc" -eq 1 ] || { cat "$dir/twice.log" "$dir/twice.err" >&2; fail "exit status $rc after two SIGINTs, wanted 1 (attempt $attempt)"; }
grep -qE "^train: a second Ctrl-C abandoned the checkpoint of step [0-9]+; .*/checkpoint-[0-9]+ is intact: continue with --resume" "$dir/twice.err" ||
  fail "no message of the abandoned write: $(cat "$dir/twice.err")"
kept=$(sed -n 's/.*\/\(checkpoint-[0-9]*\) is intact.*/\1/p' "$dir/twice.err")
[ "$(cat "$dir/twice/checkpoint")" = "$kept" ] || fail "the committed checkpoint is $(cat "$dir/twice/checkpoint"), the message says $kept"
ls "$dir"/twice/*.tmp-* > /dev/null 2>&1 && fail "temporary files left: $(ls "$dir/twice")"
newest=$(ls "$dir/twice" | sed -n 's/^checkpoint-\([0-9]*\)\.gguf$/\1/p' | sort -n | tail -1)
[ "checkpoint-$newest" = "$kept" ] || fail "an uncommitted checkpoint-$newest was left beside $kept"
kept_step=${kept#checkpoint-}
"$train" "${args[@]/100000/$((kept_step + 1))}" --save-every 1 --batch 16 --seq 128 --out "$dir/twice" --resume > /dev/null 2>&1 ||
  fail "resume from $kept after the abandoned write failed"
echo "sigint: stopped at step $step with a checkpoint, resumed to step $((step + 2)); two SIGINTs abandoned a write, $kept intact"
