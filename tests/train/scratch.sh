#!/usr/bin/env bash
# A model trained from scratch on bytes is a normal model file: its byte tokenizer
# encodes the prompt, and generate --config tiny_train continues the training text.
#   scratch.sh TRAIN GENERATE TOKENIZE WORKDIR
set -u
. "$(dirname "$0")/common.sh"
train=$1 generate=$2 tokenize=$3 dir=$4
rm -rf "$dir" && mkdir -p "$dir" && make_text "$dir/text.txt"
"$train" --config tiny_train --data "$dir/text.txt" --steps 300 --batch 8 --seq 64 --lr 3e-3 --warmup 20 --seed 1 \
  --threads 2 --eval-every 100 --out "$dir/out" > "$dir/train.log" || fail "training failed: $(tail -3 "$dir/train.log")"
held=$(grep -o "step 300 loss [0-9.]* held_out [0-9.]*" "$dir/train.log" | awk '{print $6}')
awk -v h="$held" 'BEGIN { exit !(h != "" && h < 0.5) }' || fail "held-out loss after 300 steps is '$held', expected below 0.5"
# The tokenizer in the file gives each byte its own value as the id, as training did.
ids=$("$tokenize" --model "$dir/out/model.gguf" "line 7: é" | tail -n +2 | cut -f1 | paste -sd,)
[ "$ids" = "108,105,110,101,32,55,58,32,195,169" ] || fail "the byte tokenizer should give the text's bytes, got '$ids'"
text=$("$generate" --model "$dir/out/model.gguf" --config tiny_train -n 40 "line 7: the quick" 2> "$dir/generate.err") ||
  fail "generate failed: $(cat "$dir/generate.err")"
printf '%s\n' "$text" | head -1 | grep -Eq "^line 7: the quick brown fox (jumps|leaps) over [0-9]+ lazy dogs$" ||
  fail "generate did not continue the training text: '$text'"
echo "scratch: held-out loss $held after 300 steps; generate continues: $(printf '%s\n' "$text" | head -1)"
