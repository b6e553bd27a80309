#!/usr/bin/env bash
# LoRA over the real SmolLM2-135M (Q4_1, mapped): a short run lowers the held-out loss and
# writes adapter.gguf, which tlm::read_lora reads back (lora_probe --read), and with
# --merge model.gguf (without it none; test_train_trainer checks the merged logits); a run
# killed with SIGKILL after step 3 and resumed (from checkpoint-2) equals the uninterrupted
# one bit for bit (losses and adapter bytes); a resume with another rank, alpha or targets
# is refused; the finished run resumed with --merge and no --out-type writes model.gguf in
# the base's encodings (inspect's table of encodings, tensor counts and bytes is the base's).
#   lora.sh TRAIN LORA_PROBE MODEL WORKDIR INSPECT
set -u
. "$(dirname "$0")/common.sh"
train=$1 probe=$2 model=$3 dir=$4 inspect=$5
rm -rf "$dir" && mkdir -p "$dir" && make_text "$dir/long.txt" && head -c 6000 "$dir/long.txt" > "$dir/text.txt"
args=(--model "$model" --lora 8 --lora-alpha 16 --data "$dir/text.txt" --steps 6 --batch 2 --seq 16 --lr 1e-2 --eval-every 3
      --save-every 2 --seed 3 --threads 1)
"$train" "${args[@]}" --out "$dir/full" --merge --out-type q8_0 > "$dir/full.log" 2>&1 || { cat "$dir/full.log" >&2; fail "uninterrupted LoRA run failed"; }
grep -q "LoRA rank 8, alpha 16, targets q,k,v,o" "$dir/full.log" || fail "no LoRA line: $(cat "$dir/full.log")"
before=$(sed -n 's/^held-out loss before training //p' "$dir/full.log")
after=$(tail -1 "$dir/full/loss.csv" | cut -d, -f3)
awk -v b="$before" -v a="$after" 'BEGIN { exit !(b > 0 && a > 0 && a < b - 0.3) }' ||
  fail "held-out loss did not fall by 0.3: $before -> $after"
[ -f "$dir/full/adapter.gguf" ] || fail "no adapter.gguf"
grep -q "merged the adapter into .*/full/model.gguf (q8_0; " "$dir/full.log" || fail "no merged model: $(cat "$dir/full.log")"
grep -q "of the adapter's change to the weights: the rest is finer" "$dir/full.log" && fail "a Q8_0 merge was said to lose the adapter"
[ "$(stat -c %s "$dir/full/model.gguf")" -gt 100000000 ] || fail "the merged model.gguf is too small for 135M in Q8_0"
read_back=$("$probe" --read "$dir/full/adapter.gguf") || fail "read_lora refused adapter.gguf"
echo "$read_back" | grep -qE "^alpha 16 tensors 240 sum\|B\| [0-9.e+-]+$" || fail "unexpected adapter: $read_back"
echo "$read_back" | grep -q "sum|B| 0$" && fail "B is still zero: the adapter did not train"
"$train" "${args[@]}" --out "$dir/split" > "$dir/split1.log" 2>&1 &
pid=$!
while ! grep -q "^step 3 " "$dir/split1.log" 2> /dev/null && ps -o stat= -p "$pid" | grep -qv Z; do sleep 0.002; done
kill -9 "$pid" 2> /dev/null
wait "$pid" 2> /dev/null
[ $? -eq 137 ] || fail "the first half was not killed: $(cat "$dir/split1.log")"
[ "$(cat "$dir/split/checkpoint")" = checkpoint-2 ] || fail "after the kill at step 3 the checkpoint is $(cat "$dir/split/checkpoint")"
for other in "--lora 16" "--lora-alpha 8" "--lora-targets q,v"; do
  set -- $other
  changed=("${args[@]}")
  for i in "${!changed[@]}"; do [ "${changed[$i]}" = "$1" ] && changed[$((i + 1))]=$2; done
  [ "$1" = --lora-targets ] && changed+=("$1" "$2")
  if "$train" "${changed[@]}" --out "$dir/split" --resume > /dev/null 2> "$dir/refused.err"; then fail "resume with $other was accepted"; fi
  grep -q "^train: --resume: the checkpoint in .* was made with $1 " "$dir/refused.err" || fail "resume with $other: $(cat "$dir/refused.err")"
done
"$train" "${args[@]}" --out "$dir/split" --resume > "$dir/split2.log" 2>&1 || { cat "$dir/split2.log" >&2; fail "resumed run failed"; }
diff <(losses "$dir/full/loss.csv") <(losses "$dir/split/loss.csv") || fail "loss curves differ"
cmp "$dir/full/adapter.gguf" "$dir/split/adapter.gguf" || fail "adapters differ"
[ ! -e "$dir/split/model.gguf" ] || fail "a LoRA run without --merge wrote model.gguf"
# A finished run resumed runs no step and exports again, here with the merge.
"$train" "${args[@]}" --out "$dir/split" --resume --merge > "$dir/merge.log" 2>&1 || { cat "$dir/merge.log" >&2; fail "--resume --merge failed"; }
grep -q "merged the adapter into .*/split/model.gguf (the base.s encodings; " "$dir/merge.log" || fail "no merged model: $(cat "$dir/merge.log")"
# A 6-step adapter's change is mostly finer than a Q4_1 step (12% of it kept, measured):
# the trainer says so rather than leave a merged model that computes nearly the base.
grep -q "^train: .*/split/model.gguf keeps [0-9]*% of the adapter's change to the weights: the rest is finer than the step" "$dir/merge.log" ||
  fail "no warning that the Q4_1 merge rounds most of the adapter away: $(cat "$dir/merge.log")"
kept=$(sed -n 's/.*(the base.s encodings; \([0-9.]*%\) of the adapter.*/\1/p' "$dir/merge.log")
encodings() { "$inspect" "$1" | sed -n '/^enc /,$p'; }
diff <(encodings "$model") <(encodings "$dir/split/model.gguf") || fail "the merged model's encodings are not the base's"
encodings "$dir/split/model.gguf" | grep -qE "^Q4_1 +[0-9]+" || fail "the merged model has no Q4_1 tensor: $(encodings "$dir/split/model.gguf")"
echo "lora: held-out $before -> $after; $read_back; resume after SIGKILL bit-exact; other rank, alpha, targets refused;"\
     "merged as the base ($kept of the adapter's change kept): $(encodings "$dir/split/model.gguf" | awk 'NR > 1 { printf "%s %s; ", $1, $2 }')"
