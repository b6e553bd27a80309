#!/usr/bin/env bash
# Data parallelism: `mpirun -np 2` with a global batch of 4 (2 windows per rank) gives
# the same 20 losses as one process with batch 4, within float summation order: the
# per-rank gradients are averaged with one bucketed all-reduce, so only the order of
# the additions differs. Stated tolerance: relative 1e-6 per step (measured: 8.5e-9).
#   mpi.sh TRAIN WORKDIR
set -u
. "$(dirname "$0")/common.sh"
train=$1 dir=$2
command -v mpirun > /dev/null || fail "mpirun is missing; install openmpi-bin (scripts/setup does)"
rm -rf "$dir" && mkdir -p "$dir" && make_text "$dir/text.txt"
args=(--config tiny_train --data "$dir/text.txt" --steps 20 --batch 4 --seq 32 --lr 2e-3 --eval-every 0 --save-every 10 --seed 4 --threads 1)
"$train" "${args[@]}" --out "$dir/one" > "$dir/one.log" 2>&1 || { cat "$dir/one.log" >&2; fail "one process failed"; }
mpirun -np 2 --allow-run-as-root --oversubscribe "$train" "${args[@]}" --out "$dir/two" > "$dir/two.log" 2>&1 ||
  { cat "$dir/two.log" >&2; fail "mpirun -np 2 failed"; }
grep -q "on each of 2 MPI ranks" "$dir/two.log" || fail "the run did not see 2 ranks (built without MPI?)"
worst=$(paste -d, <(cut -d, -f1,2 "$dir/one/loss.csv" | tail -n +2) <(cut -d, -f1,2 "$dir/two/loss.csv" | tail -n +2) |
  awk -F, '$1 != $3 { print "step mismatch"; exit } { d = $2 - $4; if (d < 0) d = -d; r = d / $2; if (r > m) m = r } END { printf "%.3g\n", m }')
[ "$(wc -l < "$dir/two/loss.csv")" -eq 21 ] || fail "the MPI run logged $(($(wc -l < "$dir/two/loss.csv") - 1)) steps, wanted 20"
awk -v w="$worst" 'BEGIN { exit !(w + 0 <= 1e-6) }' || fail "losses differ by $worst (relative), more than 1e-6"
# Accumulation under MPI (a later --batch replaces the one in args): 2 micro-batches of a
# global 2 (1 window per rank each) are the steps of the global batch of 4, to rounding:
# the same tolerance.
mpirun -np 2 --allow-run-as-root --oversubscribe "$train" "${args[@]}" --batch 2 --accumulate 2 --out "$dir/acc" > "$dir/acc.log" 2>&1 ||
  { cat "$dir/acc.log" >&2; fail "mpirun -np 2 with --accumulate 2 failed"; }
grep -q "batch 2 x 2 micro-batches (4 windows a step).*on each of 2 MPI ranks" "$dir/acc.log" || fail "the accumulating run did not say its micro-batches and ranks"
[ "$(wc -l < "$dir/acc/loss.csv")" -eq 21 ] || fail "the accumulating MPI run logged $(($(wc -l < "$dir/acc/loss.csv") - 1)) steps, wanted 20"
worst_acc=$(paste -d, <(cut -d, -f1,2 "$dir/one/loss.csv" | tail -n +2) <(cut -d, -f1,2 "$dir/acc/loss.csv" | tail -n +2) |
  awk -F, '$1 != $3 { print "step mismatch"; exit } { d = $2 - $4; if (d < 0) d = -d; r = d / $2; if (r > m) m = r } END { printf "%.3g\n", m }')
awk -v w="$worst_acc" 'BEGIN { exit !(w + 0 <= 1e-6) }' || fail "with --accumulate 2, losses differ by $worst_acc (relative), more than 1e-6"
echo "mpi: 20 steps, 2 ranks vs 1 process, worst relative loss difference $worst (tolerance 1e-6); 2 ranks x 2 micro-batches: $worst_acc"
