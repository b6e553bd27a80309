#!/usr/bin/env bash
# Fine-tuning throughput, peak RSS and checkpoint times of examples/train on the real
# SmolLM2-135M-Instruct (Jargon File text, from jargon-text), written to
# bench/results/finetune-<cpu>.md. A benchmark, not a test: minutes per configuration.
#   bench/finetune.sh BUILD MODEL [STEPS]      (STEPS per configuration, default 3)
set -euo pipefail
build=$1 model=$2 steps=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
zcat /usr/share/doc/jargon-text/jargon.txt.gz | sed -n '2115,12000p' > "$work/text.txt"
cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
out="$here/results/finetune-$(echo "$cpu" | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9-').md"
{
  echo "# Fine-tuning SmolLM2-135M with examples/train"
  echo
  echo "- CPU: $cpu, $(nproc) CPUs; date $(date -u '+%Y-%m-%d %H:%M') UTC; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- $steps steps per row, Jargon File text; tokens/s is the median step after the first (forward, backward, AdamW)"
  echo "- peak RSS from /usr/bin/time -v; checkpoint = weights (f32 GGUF) + AdamW sidecar, written atomically with fsync"
  echo
  echo "| seq | batch | threads | tokens/s | s/step | peak RSS MiB | checkpoint write s | checkpoint load s | checkpoint MiB |"
  echo "|---|---|---|---|---|---|---|---|---|"
} > "$out"
configs=("128 4 1" "128 4 2" "512 4 2")
[ -n "${BENCH_CONFIGS:-}" ] && IFS=, read -r -a configs <<< "$BENCH_CONFIGS"
for cfg in "${configs[@]}"; do
  read -r seq batch threads <<< "$cfg"
  dir="$work/run-$seq-$threads"
  /usr/bin/time -v "$build/examples/train" --model "$model" --data "$work/text.txt" --steps "$steps" --batch "$batch" --seq "$seq" \
    --threads "$threads" --eval-every 0 --held-out 0.02 --save-every 0 --out "$dir" > "$dir.log" 2> "$dir.time"
  tps=$(tail -n +3 "$dir/loss.csv" | cut -d, -f6 | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  rss=$(awk '/Maximum resident set size/ { printf "%.0f", $NF / 1024 }' "$dir.time")
  write=$(sed -n 's/^checkpoint .* written (step [0-9]*, \([0-9.]*\) s)$/\1/p' "$dir.log")
  # Load time: resume the finished run asking for the same steps (it loads and only re-exports).
  "$build/examples/train" --model "$model" --data "$work/text.txt" --steps "$steps" --batch "$batch" --seq "$seq" --threads "$threads" \
    --eval-every 0 --held-out 0.02 --save-every 0 --out "$dir" --resume > "$dir.resume.log"
  load=$(sed -n 's/^resumed from .* (checkpoint loaded in \([0-9.]*\) s)$/\1/p' "$dir.resume.log")
  size=$(du -cm "$dir"/checkpoint-*.gguf | tail -1 | cut -f1)
  echo "| $seq | $batch | $threads | $tps | $(awk -v t="$tps" -v n=$((seq * batch)) 'BEGIN { printf "%.1f", n / t }') | $rss | $write | $load | $size |" >> "$out"
  rm -rf "$dir"
done
echo "- load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out"
cat "$out"
