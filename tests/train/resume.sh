#!/usr/bin/env bash
# A run stopped after 7 steps and resumed equals an uninterrupted run bit for bit:
# every loss in loss.csv (printed with 17 digits) and the exported model file.
#   resume.sh TRAIN WORKDIR
set -u
. "$(dirname "$0")/common.sh"
train=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" && make_text "$dir/text.txt"
args=(--config tiny_train --data "$dir/text.txt" --steps 20 --batch 4 --seq 32 --lr 3e-3 --warmup 3 --eval-every 4 --save-every 5 --seed 3 --threads 2)
"$train" "${args[@]}" --out "$dir/full" > "$dir/full.log" || fail "uninterrupted run failed"
"$train" "${args[@]}" --out "$dir/split" --stop-after 7 > "$dir/split1.log" || fail "first half failed"
grep -q "stopped at step 7 of 20; continue with --resume" "$dir/split1.log" || fail "first half did not stop at step 7"
"$train" "${args[@]}" --out "$dir/split" --resume > "$dir/split2.log" || fail "resumed run failed"
diff <(losses "$dir/full/loss.csv") <(losses "$dir/split/loss.csv") || fail "loss curves differ"
cmp "$dir/full/model.gguf" "$dir/split/model.gguf" || fail "exported models differ"
echo "resume: $(($(wc -l < "$dir/full/loss.csv") - 1)) steps, losses and model.gguf bit-exact"
