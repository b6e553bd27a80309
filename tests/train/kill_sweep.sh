#!/usr/bin/env bash
# SIGKILL at many moments (a delay sweep, checkpoints every step so many kills land in
# the middle of a write), resuming after each kill, until the run completes. The final
# loss curve and model must equal an uninterrupted run's bit for bit.
#   kill_sweep.sh TRAIN WORKDIR
set -u
. "$(dirname "$0")/common.sh"
train=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" && make_text "$dir/text.txt"
args=(--config tiny_train --data "$dir/text.txt" --steps 40 --batch 2 --seq 32 --lr 2e-3 --eval-every 5 --save-every 1 --held-out 0.02 --seed 5 --threads 1)
"$train" "${args[@]}" --out "$dir/ref" > /dev/null || fail "uninterrupted run failed"
# Each attempt is killed at a point of its own progress, not after a fixed time, so the
# sweep covers the same points on a fast build and under sanitizers: some attempts during
# start-up, the others a few steps on (each step ends with a checkpoint write) plus a
# delay of 0 to 40 ms, which lands in the write of the next checkpoint or the next step.
gaps=(0 1 2 3 1 2 0 3 2 1)
delays=(0.05 0 0.002 0.005 0.01 0.02 0.03 0.04 0.001 0.015)
kills=0 torn=0 attempt=0
while :; do
  resume=()
  [ -f "$dir/run/checkpoint" ] && resume=(--resume)
  done_steps=0
  [ -f "$dir/run/checkpoint" ] && done_steps=$(sed 's/checkpoint-//' "$dir/run/checkpoint")
  "$train" "${args[@]}" --out "$dir/run" "${resume[@]}" > "$dir/log.$attempt" 2>&1 &
  pid=$!
  gap=${gaps[$((attempt % ${#gaps[@]}))]}
  if [ "$gap" -gt 0 ]; then  # wait for the step line (or the end of the run)
    target=$((done_steps + gap))
    while ! grep -qE "^step $target |^exported" "$dir/log.$attempt" 2> /dev/null && ps -o stat= -p "$pid" | grep -qv Z; do sleep 0.002; done
  fi
  sleep "${delays[$((attempt % ${#delays[@]}))]}"
  attempt=$((attempt + 1))
  kill -9 "$pid" 2> /dev/null
  wait "$pid" 2> /dev/null
  rc=$?
  [ "$rc" -eq 0 ] && break  # the run had finished before the kill
  [ "$rc" -eq 137 ] || { cat "$dir/log.$((attempt - 1))" >&2; fail "run after $kills kills exited $rc"; }
  kills=$((kills + 1))
  ls "$dir"/run/*.tmp-* > /dev/null 2>&1 && torn=$((torn + 1))
  [ "$attempt" -le 400 ] || fail "no completion after 400 attempts"
done
diff <(losses "$dir/ref/loss.csv") <(losses "$dir/run/loss.csv") || fail "loss curves differ after $kills kills"
cmp "$dir/ref/model.gguf" "$dir/run/model.gguf" || fail "exported models differ after $kills kills"
[ "$kills" -ge 10 ] || fail "only $kills kills landed; the sweep is too coarse for this machine"
echo "kill sweep: $kills SIGKILLs ($torn in the middle of writing a file), resumed each time; losses and model bit-exact"
