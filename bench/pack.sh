#!/usr/bin/env bash
# Windows per epoch of a chat file with and without --pack (examples/train), on the real
# SmolLM2-135M-Instruct's tokenizer and chat template: the first N entries of the Jargon
# File (jargon-text) as one question and answer each. An epoch's steps, and so its time,
# go with its windows. Written to bench/results/pack.md. Each run trains one step of a
# LoRA rank 8 adapter, to print its windows.
#   bench/pack.sh BUILD MODEL [N]      (N conversations, default 300)
set -euo pipefail
build=$1 model=$2 n=${3:-300}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# An entry is ":term:" then paragraphs; its first paragraph is the answer.
zcat /usr/share/doc/jargon-text/jargon.txt.gz | python3 -c '
import json, re, sys
n = int(sys.argv[1])
entries, term, para = [], None, []
for line in sys.stdin.read().split("\n"):
    m = re.match(r"^   :([^:]+):", line)
    if m:
        if term and para:
            entries.append((term, " ".join(para)))
        term, para = m.group(1), []
        continue
    if term is None:
        continue
    if line.strip():
        para.append(line.strip())
    elif para:
        entries.append((term, " ".join(para)))
        term, para = None, []
for term, answer in entries[:n]:
    print(json.dumps({"messages": [{"role": "user", "content": f"What does {term} mean in hacker jargon?"},
                                   {"role": "assistant", "content": answer}]}))
' "$n" > "$work/chat.jsonl"
out="$here/results/pack.md"
{
  echo "# Chat packing: windows per epoch with and without --pack"
  echo
  echo "- $(wc -l < "$work/chat.jsonl") conversations from the Jargon File (bench/pack.sh), SmolLM2-135M-Instruct's tokenizer and"
  echo "  ChatML template with its default system turn; date $(date -u '+%Y-%m-%d %H:%M') UTC"
  echo "- fill: the tokens read over the positions of the windows"
  echo
  echo "| seq | windows unpacked | windows packed | packed / unpacked | fill unpacked | fill packed |"
  echo "|---|---|---|---|---|---|"
} > "$out"
for seq in 128 256 512; do
  declare -A windows=()
  tokens=0
  for mode in unpacked packed; do
    flag=()
    [ "$mode" = packed ] && flag=(--pack)
    log=$("$build/examples/train" --model "$model" --chat "${flag[@]}" --lora 8 --data "$work/chat.jsonl" --steps 1 --batch 1 \
      --seq "$seq" --held-out 0 --eval-every 0 --save-every 0 --threads 1 --out "$work/$mode-$seq" 2>&1)
    windows[$mode]=$(echo "$log" | sed -n 's/.*, \([0-9]*\) training windows.*/\1/p')
    tokens=$(echo "$log" | sed -n 's/.*(\([0-9]*\) tokens read).*/\1/p')
  done
  awk -v s="$seq" -v u="${windows[unpacked]}" -v p="${windows[packed]}" -v t="$tokens" \
    'BEGIN { printf "| %d | %d | %d | %.2f | %.2f | %.2f |\n", s, u, p, p / u, t / (u * s), t / (p * s) }' >> "$out"
done
cat "$out"
