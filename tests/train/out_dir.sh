#!/usr/bin/env bash
# The --out folder of a run: a new run refuses an earlier run's folder (--resume or
# --overwrite), a resume that changes a hyperparameter says which and from what to
# what, leftovers of killed runs are removed at start, the newest --keep-checkpoints
# pairs stay, the schedule's first step is at the peak and its last above --min-lr,
# the loss plot has round ticks on both axes, and a damaged or incomplete checkpoint is
# named on resume.
#   out_dir.sh TRAIN WORKDIR
set -u
. "$(dirname "$0")/common.sh"
train=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" && make_text "$dir/text.txt"
args=(--config tiny_train --data "$dir/text.txt" --batch 2 --seq 16 --eval-every 0 --seed 2)
v=$dir/v

# A finished run: checkpoints at 10 and 20 (--keep-checkpoints defaults to 2), model.gguf.
"$train" "${args[@]}" --steps 20 --save-every 10 --out "$v" > "$dir/first.log" || fail "first run failed"
[ -f "$v/checkpoint-10.gguf" ] && [ -f "$v/checkpoint-20.optim.gguf" ] || fail "the default does not keep the newest 2 checkpoints: $(ls "$v")"
cp "$v/loss.csv" "$dir/loss.before" && cp "$v/model.gguf" "$dir/model.before"

# A new run into it, without --resume: refused, nothing touched.
"$train" "${args[@]}" --steps 5 --out "$v" > "$dir/refused.log" 2> "$dir/refused.err" && fail "a new run into an earlier run's --out was not refused"
grep -qF -- "train: --out $v holds an earlier run (checkpoint-20, model.gguf); continue it with --resume, replace it with --overwrite" \
  "$dir/refused.err" || fail "refusal message: $(cat "$dir/refused.err")"
[ -s "$dir/refused.log" ] && fail "the refusal printed on stdout"
[ -f "$v/checkpoint-20.gguf" ] && cmp -s "$v/loss.csv" "$dir/loss.before" && cmp -s "$v/model.gguf" "$dir/model.before" ||
  fail "the refused run changed the earlier run's files"
"$train" "${args[@]}" --steps 5 --out "$v" --resume --overwrite > /dev/null 2> "$dir/both.err" && fail "--resume with --overwrite was accepted"
grep -qF "train: --resume continues the run in --out and --overwrite deletes it; give one of them" "$dir/both.err" || fail "both: $(cat "$dir/both.err")"

# --overwrite replaces it: a 5-step run, the earlier checkpoints gone.
"$train" "${args[@]}" --steps 5 --out "$v" --overwrite > "$dir/over.log" || fail "--overwrite run failed"
[ "$(cat "$v/checkpoint")" = checkpoint-5 ] || fail "after --overwrite the checkpoint is $(cat "$v/checkpoint")"
ls "$v"/checkpoint-10.* "$v"/checkpoint-20.* > /dev/null 2>&1 && fail "--overwrite left the earlier checkpoints: $(ls "$v")"
[ "$(($(wc -l < "$v/loss.csv") - 1))" -eq 5 ] || fail "loss.csv of the --overwrite run is not 5 rows"

# The schedule (no warm-up, --lr 3e-4, --min-lr 0): step 1 at the peak, the last step above 0.
[ "$(sed -n 2p "$v/loss.csv" | cut -d, -f4)" = 0.0003 ] || fail "step 1 lr is $(sed -n 2p "$v/loss.csv" | cut -d, -f4), not the peak 0.0003"
last_lr=$(tail -1 "$v/loss.csv" | cut -d, -f4)
awk -v x="$last_lr" 'BEGIN { exit !(x > 0) }' || fail "the last step ran at lr $last_lr"

# A resume that changes --lr and the total steps says so on stderr, and runs.
"$train" "${args[@]}" --steps 8 --lr 1e-3 --out "$v" --resume > "$dir/changed.log" 2> "$dir/changed.err" || fail "resume with a new --lr failed"
grep -qF "train: warning: the checkpoint was made with --lr 0.0003, this run uses 0.001; continuing with 0.001 from step 5" "$dir/changed.err" ||
  fail "no --lr warning: $(cat "$dir/changed.err")"
grep -qF "train: warning: the checkpoint was made with total steps (--steps/--epochs) 5, this run uses 8" "$dir/changed.err" ||
  fail "no --steps warning: $(cat "$dir/changed.err")"
"$train" "${args[@]}" --steps 9 --lr 1e-3 --clip 0.5 --weight-decay 0.1 --warmup 2 --min-lr 1e-5 --out "$v" --resume > /dev/null 2> "$dir/changed2.err" ||
  fail "second resume failed"
for change in "--clip 1, this run uses 0.5" "--weight-decay 0.01, this run uses 0.1" "--warmup 0, this run uses 2" "--min-lr 0, this run uses 1e-05"; do
  grep -qF "made with $change" "$dir/changed2.err" || fail "no warning of '$change': $(cat "$dir/changed2.err")"
done
# What decides the data and the model's shape cannot change: refused, with the values.
for change in "--seed 3:--seed 2, this run has 3" "--batch 4:--batch 2, this run has 4" "--seq 8:--seq 16, this run has 8"; do
  "$train" "${args[@]}" ${change%%:*} --steps 10 --out "$v" --resume > /dev/null 2> "$dir/refused2.err" && fail "a resume with ${change%%:*} ran"
  grep -qF "was made with ${change#*:}; use the same value to resume" "$dir/refused2.err" || fail "refusal of ${change%%:*}: $(cat "$dir/refused2.err")"
done
cp "$dir/text.txt" "$dir/other.txt"
"$train" "${args[@]}" --data "$dir/other.txt" --steps 10 --out "$v" --resume > /dev/null 2> "$dir/refused3.err" && fail "a resume with another --data ran"
grep -qF "was made with --data $dir/text.txt, this run has $dir/other.txt" "$dir/refused3.err" || fail "refusal of --data: $(cat "$dir/refused3.err")"

# Leftovers of killed runs (a pair never committed, a half pair, temporary files) go at
# start; with --keep-checkpoints 3 the newest three pairs stay.
cp "$v/checkpoint-9.gguf" "$v/checkpoint-99.gguf" && cp "$v/checkpoint-9.optim.gguf" "$v/checkpoint-99.optim.gguf"
cp "$v/checkpoint-9.gguf" "$v/checkpoint-3.gguf"
echo torn > "$v/checkpoint-10.optim.gguf.tmp-4242"
"$train" "${args[@]}" --steps 13 --lr 1e-3 --clip 0.5 --weight-decay 0.1 --save-every 1 --keep-checkpoints 3 --out "$v" --resume \
  > "$dir/prune.log" 2> "$dir/prune.err" || fail "resume after the leftovers failed"
grep -qF "train: removed from $v what earlier runs left:" "$dir/prune.err" || fail "no note of the removed files: $(cat "$dir/prune.err")"
left=$(cd "$v" && ls | grep -E '^checkpoint-|tmp-' | tr '\n' ' ')
[ "$left" = "checkpoint-11.gguf checkpoint-11.optim.gguf checkpoint-12.gguf checkpoint-12.optim.gguf checkpoint-13.gguf checkpoint-13.optim.gguf " ] ||
  fail "files left: $left"

# The plot's axes carry round ticks, not only the extremes.
[ "$(grep -c 'class="x-tick"' "$v/loss.svg")" -ge 3 ] && [ "$(grep -c 'class="y-tick"' "$v/loss.svg")" -ge 3 ] || fail "loss.svg lacks ticks"
grep -q 'class="x-tick"[^>]*>10</text>' "$v/loss.svg" || fail "no tick at step 10 in loss.svg (steps 1 to 13)"
# A byte changed in the middle of the weights file (inside some tensor's data): the
# resume names the file and the tensor; a file of the pair gone: said so, without the
# model-download advice.
cp "$v/checkpoint-13.gguf" "$dir/saved.gguf"
size=$(stat -c %s "$v/checkpoint-13.gguf")
printf '\x5a' | dd of="$v/checkpoint-13.gguf" bs=1 seek=$((size / 2)) conv=notrunc status=none
cmp -s "$v/checkpoint-13.gguf" "$dir/saved.gguf" && printf '\xa5' | dd of="$v/checkpoint-13.gguf" bs=1 seek=$((size / 2)) conv=notrunc status=none
"$train" "${args[@]}" --steps 14 --out "$v" --resume > "$dir/flip.log" 2> "$dir/flip.err" && fail "a changed checkpoint was resumed from"
grep -qE "^train: $v/checkpoint-13.gguf: tensor '[a-z0-9_.]+' fails its checksum" "$dir/flip.err" || fail "flip: $(cat "$dir/flip.err")"
cp "$dir/saved.gguf" "$v/checkpoint-13.gguf" && rm "$v/checkpoint-13.optim.gguf"
"$train" "${args[@]}" --steps 14 --out "$v" --resume > /dev/null 2> "$dir/gone.err" && fail "a resume without the optimizer file ran"
grep -qF "train: $v/checkpoint-13.optim.gguf: missing, though $v/checkpoint names checkpoint-13" "$dir/gone.err" || fail "gone: $(cat "$dir/gone.err")"
grep -q "fetch-model" "$dir/gone.err" && fail "a missing checkpoint file advises fetching the model"
echo "out dir: refused without --resume/--overwrite, --overwrite replaces, resume warns of changes, leftovers pruned, ticks on the plot"
