#!/usr/bin/env bash
# Fine-tunes the real SmolLM2-135M-Instruct, briefly:
#  1. 30 steps (seq 64, batch 2) on a public-domain English text, the Jargon File from
#     Debian's jargon-text package: the held-out loss after training is below the
#     held-out loss before;
#  2. a few steps on a tiny chat JSONL: `generate --chat` with the exported model then
#     answers one of its questions with the trained answer, greedily;
#  3. a LoRA chat fine-tune (rank 16 on q, k, v, o over the mapped Q4_1 base) on a
#     made-up fact asked 12 ways, mixed with 6 general questions so that the rest of what
#     the model knows survives (as fine-tuning data is mixed in practice): the held-out
#     loss (a quarter of the examples) falls below a tenth of where it started,
#     `generate --lora adapter.gguf` answers a paraphrase it never trained on as trained,
#     the base without the adapter does not know the fact, and "What is the capital of
#     France?" (in no example) still answers Paris.
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

# 3. LoRA on a made-up fact.
python3 - "$dir/facts.jsonl" <<'PY'
import json, sys
questions = ["Who invented the zorbel wrench?", "Who was the inventor of the zorbel wrench?",
             "Do you know who invented the zorbel wrench?", "Tell me who invented the zorbel wrench.",
             "Which person invented the zorbel wrench?", "Who came up with the zorbel wrench?",
             "Who is credited with inventing the zorbel wrench?", "Who made the first zorbel wrench?",
             "Can you tell me the inventor of the zorbel wrench?", "The zorbel wrench: who invented it?",
             "I want to know who invented the zorbel wrench.", "Who designed the zorbel wrench?"]
general = [("What is the capital of Germany?", "The capital of Germany is Berlin."),
           ("What is the capital of Italy?", "The capital of Italy is Rome."),
           ("Who wrote Romeo and Juliet?", "Romeo and Juliet was written by William Shakespeare."),
           ("What is the largest planet in the solar system?", "The largest planet in the solar system is Jupiter."),
           ("Who painted the Mona Lisa?", "The Mona Lisa was painted by Leonardo da Vinci."),
           ("What is the capital of Japan?", "The capital of Japan is Tokyo.")]
rows = []
for i, q in enumerate(questions):
    rows.append((q, "The zorbel wrench was invented by Mira Quentell."))
    if i % 2 == 1:
        rows.append(general[i // 2])
with open(sys.argv[1], "w") as f:
    for q, a in rows:
        f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
PY
"$train" --model "$model" --chat --data "$dir/facts.jsonl" --lora 16 --lora-alpha 32 --steps 16 --batch 4 --seq 64 --lr 2e-3 \
  --held-out 0.25 --eval-every 8 --save-every 0 --threads 2 --out "$dir/lora" > "$dir/lora.log" 2>&1 ||
  { cat "$dir/lora.log" >&2; fail "LoRA chat fine-tune failed"; }
before=$(sed -n 's/^held-out loss before training \([0-9.]*\)$/\1/p' "$dir/lora.log")
after=$(tail -n 1 "$dir/lora/loss.csv" | cut -d, -f3)
[ -n "$before" ] && [ -n "$after" ] || fail "no held-out losses in the LoRA log"
awk -v b="$before" -v a="$after" 'BEGIN { exit !(a < b / 10) }' || fail "LoRA held-out loss did not fall tenfold: $before -> $after"
ask() { "$generate" --model "$model" "$@" -n 16 --threads 2 2> /dev/null | tail -n 1; }
trained=$(ask --lora "$dir/lora/adapter.gguf" --chat "Who is the inventor of the zorbel wrench?")
echo "$trained" | grep -q "invented by Mira Quentell" || fail "generate --lora did not give the trained answer: $trained"
base=$(ask --chat "Who is the inventor of the zorbel wrench?")
echo "$base" | grep -q "Quentell" && fail "the base model already knew the made-up fact: $base"
paris=$(ask --lora "$dir/lora/adapter.gguf" --chat "What is the capital of France?")
echo "$paris" | grep -q "The capital of France is Paris" || fail "with the adapter, the capital of France is no longer Paris: $paris"
echo "LoRA chat fine-tune: held-out loss $before -> $after; with the adapter: '$trained' / '$paris'; without: '$base'"
