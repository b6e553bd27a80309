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
# On another kernel level the resume still works, and says that it cannot be bit-exact.
"$train" "${args[@]}" --out "$dir/relevel" --stop-after 5 > "$dir/relevel1.log" || fail "first half (relevel) failed"
TLM_KERNELS=scalar "$train" "${args[@]}" --out "$dir/relevel" --resume > "$dir/relevel2.log" 2> "$dir/relevel2.err" ||
  fail "resume on the scalar kernels failed"
level=$(grep -o "kernels [a-z0-9]*" "$dir/relevel1.log" | head -1 | cut -d' ' -f2)
if [ "$level" != scalar ]; then
  grep -q "train: note: the checkpoint was made with the $level kernels, this run uses scalar" "$dir/relevel2.err" ||
    fail "no note about the kernel level on resume: $(cat "$dir/relevel2.err")"
fi
echo "resume: $(($(wc -l < "$dir/full/loss.csv") - 1)) steps, losses and model.gguf bit-exact; a resume on another kernel level says so"
