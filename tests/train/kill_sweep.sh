#!/usr/bin/env bash
# SIGKILL at many moments (a delay sweep, checkpoints every step so many kills land in
# the middle of a write), resuming after each kill, until the run completes. The final
# loss curve and model must equal an uninterrupted run's bit for bit.
#   kill_sweep.sh TRAIN WORKDIR
set -u
. "$(dirname "$0")/common.sh"
train=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" && make_text "$dir/text.txt"
args=(--config tiny_train --data "$dir/text.txt" --steps 40 --batch 2 --seq 32 --lr 2e-3 --eval-every 5 --save-every 1 --seed 5 --threads 1)
"$train" "${args[@]}" --out "$dir/ref" > /dev/null || fail "uninterrupted run failed"
delays=(0.03 0.09 0.15 0.21 0.27 0.33 0.05 0.12 0.19 0.25)
kills=0 torn=0 attempt=0
while :; do
  resume=()
  [ -f "$dir/run/checkpoint" ] && resume=(--resume)
  "$train" "${args[@]}" --out "$dir/run" "${resume[@]}" > "$dir/log" 2>&1 &
  pid=$!
  sleep "${delays[$((attempt % ${#delays[@]}))]}"
  attempt=$((attempt + 1))
  if kill -9 "$pid" 2> /dev/null; then
    wait "$pid" 2> /dev/null
    kills=$((kills + 1))
    ls "$dir"/run/*.tmp-* > /dev/null 2>&1 && torn=$((torn + 1))
  else
    wait "$pid"
    rc=$?
    [ "$rc" -eq 0 ] || { cat "$dir/log" >&2; fail "run after $kills kills exited $rc"; }
    break
  fi
  [ "$attempt" -le 400 ] || fail "no completion after 400 attempts"
done
diff <(losses "$dir/ref/loss.csv") <(losses "$dir/run/loss.csv") || fail "loss curves differ after $kills kills"
cmp "$dir/ref/model.gguf" "$dir/run/model.gguf" || fail "exported models differ after $kills kills"
[ "$kills" -ge 5 ] || fail "only $kills kills landed; the sweep is too coarse for this machine"
echo "kill sweep: $kills SIGKILLs ($torn in the middle of writing a file), resumed each time; losses and model bit-exact"
