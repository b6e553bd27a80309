# Shared by the trainer's command-line tests: a deterministic text and a failure helper.
fail() { echo "FAIL: $*" >&2; exit 1; }
# ~60 KB of varied ASCII lines: enough windows for byte-level training of tiny_train.
make_text() { awk 'BEGIN { for (i = 1; i <= 2000; i++) printf "line %d: the quick brown fox %s over %d lazy dogs\n", i, (i % 3 ? "jumps" : "leaps"), i * 7 % 13 }' > "$1"; }
# The columns that must match exactly between two runs: step, loss, held-out loss, lr.
losses() { cut -d, -f1-4 "$1"; }
