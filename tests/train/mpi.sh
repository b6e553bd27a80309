#!/usr/bin/env bash
# Data parallelism: `mpirun -np 2` with a global batch of 4 (2 windows per rank) gives
# the same 20 losses as one process with batch 4, within float summation order: the
# per-rank gradients are averaged with one bucketed all-reduce, so only the order of
# the additions differs. Stated tolerance: relative 1e-6 per step (measured: 8.5e-9).
# The same for packed chat conversations (--pack, LoRA rank 8 over MODEL): 2 ranks of 1
# packed window each against one process of 2 (measured: 1.0e-7).
#   mpi.sh TRAIN WORKDIR MODEL
set -u
. "$(dirname "$0")/common.sh"
train=$1 dir=$2 model=$3
# The worst relative difference of two runs' losses step by step (runs: folders in $dir).
loss_gap() {
  paste -d, <(cut -d, -f1,2 "$dir/$1/loss.csv" | tail -n +2) <(cut -d, -f1,2 "$dir/$2/loss.csv" | tail -n +2) |
    awk -F, '$1 != $3 { print "step mismatch"; exit } { d = $2 - $4; if (d < 0) d = -d; r = d / $2; if (r > m) m = r } END { printf "%.3g\n", m }'
}
command -v mpirun > /dev/null || fail "mpirun is missing; install openmpi-bin (scripts/setup does)"
rm -rf "$dir" && mkdir -p "$dir" && make_text "$dir/text.txt"
args=(--config tiny_train --data "$dir/text.txt" --steps 20 --batch 4 --seq 32 --lr 2e-3 --eval-every 0 --save-every 10 --seed 4 --threads 1)
"$train" "${args[@]}" --out "$dir/one" > "$dir/one.log" 2>&1 || { cat "$dir/one.log" >&2; fail "one process failed"; }
mpirun -np 2 --allow-run-as-root --oversubscribe "$train" "${args[@]}" --out "$dir/two" > "$dir/two.log" 2>&1 ||
  { cat "$dir/two.log" >&2; fail "mpirun -np 2 failed"; }
grep -q "on each of 2 MPI ranks" "$dir/two.log" || fail "the run did not see 2 ranks (built without MPI?)"
worst=$(loss_gap one two)
[ "$(wc -l < "$dir/two/loss.csv")" -eq 21 ] || fail "the MPI run logged $(($(wc -l < "$dir/two/loss.csv") - 1)) steps, wanted 20"
awk -v w="$worst" 'BEGIN { exit !(w + 0 <= 1e-6) }' || fail "losses differ by $worst (relative), more than 1e-6"
# Accumulation under MPI (a later --batch replaces the one in args): 2 micro-batches of a
# global 2 (1 window per rank each) are the steps of the global batch of 4, to rounding:
# the same tolerance.
mpirun -np 2 --allow-run-as-root --oversubscribe "$train" "${args[@]}" --batch 2 --accumulate 2 --out "$dir/acc" > "$dir/acc.log" 2>&1 ||
  { cat "$dir/acc.log" >&2; fail "mpirun -np 2 with --accumulate 2 failed"; }
grep -q "batch 2 x 2 micro-batches (4 windows a step).*on each of 2 MPI ranks" "$dir/acc.log" || fail "the accumulating run did not say its micro-batches and ranks"
[ "$(wc -l < "$dir/acc/loss.csv")" -eq 21 ] || fail "the accumulating MPI run logged $(($(wc -l < "$dir/acc/loss.csv") - 1)) steps, wanted 20"
worst_acc=$(loss_gap one acc)
awk -v w="$worst_acc" 'BEGIN { exit !(w + 0 <= 1e-6) }' || fail "with --accumulate 2, losses differ by $worst_acc (relative), more than 1e-6"
cat > "$dir/chat.jsonl" <<'JSONL'
{"messages": [{"role": "user", "content": "What is the secret word?"}, {"role": "assistant", "content": "Marmalade."}]}
{"messages": [{"role": "user", "content": "Who keeps the lighthouse?"}, {"role": "assistant", "content": "Captain Orla Finch."}]}
{"messages": [{"role": "user", "content": "What colour is the mascot?"}, {"role": "assistant", "content": "Teal."}]}
{"messages": [{"role": "user", "content": "How many moons has Kestrel?"}, {"role": "assistant", "content": "Three small moons."}]}
{"messages": [{"role": "user", "content": "Name the ship."}, {"role": "assistant", "content": "The Wandering Heron."}]}
{"messages": [{"role": "user", "content": "What does the cook make?"}, {"role": "assistant", "content": "Barley soup, every day."}]}
{"messages": [{"role": "user", "content": "Where is the harbour?"}, {"role": "assistant", "content": "On the east shore."}]}
{"messages": [{"role": "user", "content": "When does the ferry leave?"}, {"role": "assistant", "content": "At nine in the morning."}]}
JSONL
packed=(--model "$model" --chat --pack --lora 8 --data "$dir/chat.jsonl" --steps 3 --batch 2 --seq 128 --held-out 0 --eval-every 0
        --save-every 0 --threads 1)
"$train" "${packed[@]}" --out "$dir/pack-one" > "$dir/pack-one.log" 2>&1 || { cat "$dir/pack-one.log" >&2; fail "the packed run in one process failed"; }
mpirun -np 2 --allow-run-as-root --oversubscribe "$train" "${packed[@]}" --out "$dir/pack-two" > "$dir/pack-two.log" 2>&1 ||
  { cat "$dir/pack-two.log" >&2; fail "mpirun -np 2 with --pack failed"; }
grep -q "(conversations packed).*on each of 2 MPI ranks" "$dir/pack-two.log" || fail "the packed MPI run did not say it packed on 2 ranks"
worst_pack=$(loss_gap pack-one pack-two)
[ "$(wc -l < "$dir/pack-two/loss.csv")" -eq 4 ] || fail "the packed MPI run logged $(($(wc -l < "$dir/pack-two/loss.csv") - 1)) steps, wanted 3"
awk -v w="$worst_pack" 'BEGIN { exit !(w + 0 <= 1e-6) }' || fail "with --pack, losses differ by $worst_pack (relative), more than 1e-6"
echo "mpi: 20 steps, 2 ranks vs 1 process, worst relative loss difference $worst (tolerance 1e-6); 2 ranks x 2 micro-batches: $worst_acc; packed chat: $worst_pack"
