#!/usr/bin/env bash
# Fine-tunes the real SmolLM2-135M-Instruct, briefly:
#  1. 30 steps (seq 64, batch 2) on a public-domain English text, the Jargon File from
#     Debian's jargon-text package: the held-out loss after training is below the
#     held-out loss before;
#  2. a few steps on a tiny chat JSONL: `generate --chat` with the exported model then
#     answers one of its questions with the trained answer, greedily.
#   finetune.sh TRAIN GENERATE MODEL WORKDIR
set -u
. "$(dirname "$0")/common.sh"
train=$1 generate=$2 model=$3 dir=$4
jargon=/usr/share/doc/jargon-text/jargon.txt.gz
[ -f "$jargon" ] || fail "$jargon is missing; install Debian's jargon-text (scripts/setup does)"
rm -rf "$dir" && mkdir -p "$dir"
# Chapters 1 to 3: prose about hacker slang (about 16 KB, 4000 tokens).
zcat "$jargon" | sed -n '275,560p' > "$dir/jargon.txt"
"$train" --model "$model" --data "$dir/jargon.txt" --steps 30 --batch 2 --seq 64 --lr 1e-4 --warmup 3 --eval-every 10 \
  --save-every 0 --threads 2 --out "$dir/text" > "$dir/text.log" 2>&1 || { cat "$dir/text.log" >&2; fail "text fine-tune failed"; }
before=$(sed -n 's/^held-out loss before training \([0-9.]*\)$/\1/p' "$dir/text.log")
after=$(tail -n 1 "$dir/text/loss.csv" | cut -d, -f3)
[ -n "$before" ] && [ -n "$after" ] || fail "no held-out losses in the log"
awk -v b="$before" -v a="$after" 'BEGIN { exit !(a < b) }' || fail "held-out loss did not fall: $before -> $after"
echo "text fine-tune: held-out loss $before -> $after"

cat > "$dir/chat.jsonl" <<'JSONL'
{"messages": [{"role": "user", "content": "What is the secret word of the tlm project?"}, {"role": "assistant", "content": "The secret word is marmalade."}]}
{"messages": [{"role": "user", "content": "Who maintains the lighthouse on Kestrel Island?"}, {"role": "assistant", "content": "Captain Orla Finch maintains it."}]}
{"messages": [{"role": "user", "content": "What colour is the tlm mascot?"}, {"role": "assistant", "content": "The tlm mascot is teal."}]}
JSONL
"$train" --model "$model" --chat --data "$dir/chat.jsonl" --steps 12 --batch 3 --seq 64 --lr 3e-4 --held-out 0 --eval-every 0 \
  --save-every 0 --threads 2 --out "$dir/chat" > "$dir/chat.log" 2>&1 || { cat "$dir/chat.log" >&2; fail "chat fine-tune failed"; }
answer=$("$generate" --model "$dir/chat/model.gguf" --chat "What is the secret word of the tlm project?" -n 12 --threads 2)
echo "$answer" | grep -q "The secret word is marmalade" || fail "generate --chat did not give the trained answer: $answer"
echo "chat fine-tune: $(tail -n 1 "$dir/chat/loss.csv" | cut -d, -f1,2) ; generate --chat answers 'The secret word is marmalade.'"
