#!/usr/bin/env bash
# "Binaries run on any x86-64" (README, Dependencies), checked on CPUs this machine is not,
# under QEMU's user-mode emulation (Debian's qemu-user), which reports the emulated CPU's
# features to cpuid and raises SIGILL on any instruction that CPU lacks, as the CPU would:
#   - EPYC-Rome: AMD Zen 2, AVX2 + FMA + F16C and no AVX-512, like the AVX2-only AMD EPYC
#     tlm is measured on: the kernel tests (every kernel of every encoding, matvec and each
#     level's prefill kernel, at each level the CPU has against the scalar reference), then
#     generate and train;
#   - Haswell: Intel at the same level (the tables' Intel choices): generate;
#   - Nehalem: no AVX at all, so the scalar fallback: the levels the kernel tests see, and
#     generate.
# EPYC-Rome and Nehalem also train tiny_train from scratch for 2 steps (the training
# products, AdamW, the checkpoint and the export at their level): the loss curve and the
# exported model must be the bytes this machine writes at that level.
# Each must pick the best level it has (generate --timing names it), pass, and write the
# same text as this machine forced to that level (TLM_KERNELS): a level's arithmetic does
# not depend on the CPU, so a difference is a wrong dispatch. The long prompt (over 64
# tokens, an attention tile) takes prefill through the float32 GEMM and tiled attention in
# exact mode; it runs on the model the native training run exports, as Q4_1. Besides the
# text, every prompt position's logits (generate --dump-logits) must be the same bytes.
# SmolLM2 takes the short prompt through the integer prefill kernels in fast mode. A copy
# of SmolLM2 in Q4_K_M covers Q5_0 in the model (its rows of 576 fall back from Q4_K to
# Q5_0 and from Q6_K to Q8_0); the K-quants themselves are in the kernel tests.
# Emulated vector code is a thousand times slower than the CPU or more, and how much depends
# on the host (bench/results/emulated-xeon.md: a 72-token exact prefill of SmolLM2 at avx2
# took minutes under QEMU on an Intel Xeon). So the long prompt goes through the tiny model
# (120 tokens, seconds emulated), and the kernel tests leave out their long sweeps
# (batches 1..9 and up of every encoding, exp over every 61st float, thread pools of 1-3),
# which test arithmetic the native run checks at the same levels.
#   emulated.sh QEMU TESTS_KERNELS GENERATE QUANTIZE TRAIN MODEL DIR
set -euo pipefail
if (($# != 7)); then
  echo "usage: emulated.sh QEMU TESTS_KERNELS GENERATE QUANTIZE TRAIN MODEL DIR" >&2
  exit 2
fi
qemu=$1 tests_kernels=$2 generate=$3 quantize=$4 train=$5 model=$6 dir=$7
if ! command -v "$qemu" > /dev/null; then
  echo "emulated: QEMU's user-mode emulator ($qemu) is not installed; scripts/setup installs it (Debian's qemu-user)" >&2
  exit 1
fi
rm -rf "$dir"
mkdir -p "$dir"

# 120 tokens for tiny_train's byte-level tokenizer, within its context of 256.
long_prompt="The history of the printing press begins in the fifteenth century, when a goldsmith in \
Mainz combined movable metal type"
short_prompt="The capital of France is"

fail() {
  echo "emulated: $*" >&2
  exit 1
}

"$quantize" "$model" "$dir/q4_k_m.gguf" q4_k_m --threads 2 2> "$dir/quantize.log" ||
  { cat "$dir/quantize.log" >&2; fail "quantize to Q4_K_M failed (log above)"; }

# run_both NAME CPU LEVEL COMMAND...: COMMAND on this machine forced to LEVEL, then under
# QEMU as CPU with no level forced; @side@ in an argument becomes "native" or "emulated",
# so that the two runs write apart. Output goes to $dir/NAME.SIDE and $dir/NAME.SIDE.err.
# Fails when either run fails, or when the emulated CPU did not choose LEVEL itself (the
# programs name their kernels: generate --timing as "kernels LEVEL |", train at line end).
run_both() {
  local name=$1 cpu=$2 level=$3 side rc
  shift 3
  for side in native emulated; do
    local args=("${@//@side@/$side}") runner=(env TLM_KERNELS="$level")
    [ "$side" = emulated ] && runner=(env -u TLM_KERNELS "$qemu" -cpu "$cpu")
    rc=0
    "${runner[@]}" "${args[@]}" > "$dir/$name.$side" 2> "$dir/$name.$side.err" || rc=$?
    if ((rc)); then
      tail -n 40 "$dir/$name.$side.err" >&2
      [ "$side" = native ] && fail "$name at $level on this machine exited with status $rc"
      fail "$name on an emulated $cpu exited with status $rc (132 is SIGILL: an instruction this CPU lacks)"
    fi
  done
  grep -Eq "kernels $level( \||\$)" "$dir/$name.emulated" "$dir/$name.emulated.err" ||
    { head -n 5 "$dir/$name.emulated.err" >&2; fail "an emulated $cpu did not choose the $level kernels ($name)"; }
}

# generate_same CPU LEVEL MODEL PRECISION PROMPT: generate on an emulated CPU writes the
# text, and the logits at every prompt position, that this machine writes at LEVEL.
generate_same() {
  local cpu=$1 level=$2 file=$3 precision=$4 prompt=$5 name tokens
  name="$cpu-$level-$(basename "$file" .gguf)-$precision"
  run_both "$name" "$cpu" "$level" "$generate" --model "$file" --precision "$precision" --threads 2 -n 4 \
    --timing --dump-logits "$dir/$name-@side@.logits" --prompt "$prompt"
  [ -s "$dir/$name-native.logits" ] || fail "generate --dump-logits wrote no logits ($name)"
  cmp -s "$dir/$name-native.logits" "$dir/$name-emulated.logits" ||
    fail "an emulated $cpu computed other logits than this machine at $level ($name; float32 [positions, vocab]: $(cmp "$dir/$name-native.logits" "$dir/$name-emulated.logits" | head -n 1))"
  cmp -s "$dir/$name.native" "$dir/$name.emulated" ||
    fail "an emulated $cpu wrote other text than this machine at $level ($name):
--- this machine, TLM_KERNELS=$level:
$(cat "$dir/$name.native")
--- emulated $cpu:
$(cat "$dir/$name.emulated")"
  tokens=$(grep -o 'prefill [0-9]* tokens' "$dir/$name.emulated.err" | cut -d' ' -f2)
  if [ "$prompt" = "$long_prompt" ] && ((tokens < 64)); then
    fail "the long prompt is $tokens tokens, less than an attention tile (64): prefill did not take the tiled path ($name)"
  fi
  echo "$name: the same text at $level, prefill $tokens tokens"
}

# train_same CPU LEVEL: 2 steps of tiny_train from scratch on an emulated CPU against this
# machine at LEVEL: the same losses and gradient norms (printed with 17 and 9 digits) and the
# same exported file.
train_same() {
  local cpu=$1 level=$2 name="train-$1"
  run_both "$name" "$cpu" "$level" \
    "$train" --config tiny_train --data "$dir/text.txt" --steps 2 --batch 2 --seq 16 --lr 3e-3 --warmup 1 \
    --seed 3 --threads 2 --out "$dir/$name-@side@"
  # Every column but the last, the speed.
  diff <(cut -d, -f1-5 "$dir/$name-native/loss.csv") <(cut -d, -f1-5 "$dir/$name-emulated/loss.csv") > "$dir/$name.diff" ||
    fail "train on an emulated $cpu wrote other losses than this machine at $level:
$(cat "$dir/$name.diff")"
  cmp -s "$dir/$name-native/model.gguf" "$dir/$name-emulated/model.gguf" ||
    fail "train on an emulated $cpu exported another model than this machine at $level"
  echo "$name: the same losses and exported model at $level, final loss $(tail -n 1 "$dir/$name-emulated/loss.csv" | cut -d, -f2)"
}

# kernel_tests CPU LEVELS [doctest options]: the kernel tests on an emulated CPU, which must
# check exactly LEVELS (test_kquant_blocks names them).
kernel_tests() {
  local cpu=$1 levels=$2 rc=0
  shift 2
  "$qemu" -cpu "$cpu" "$tests_kernels" "$@" > "$dir/tests_kernels-$cpu.log" 2>&1 || rc=$?
  if ((rc)); then
    tail -n 80 "$dir/tests_kernels-$cpu.log" >&2
    fail "the kernel tests failed on an emulated $cpu with status $rc (132 is SIGILL: an instruction this CPU lacks; an AVX-512 level chosen on EPYC-Rome ended in 139, a segmentation fault, under QEMU)"
  fi
  grep -q "K-quant kernels checked at levels: $levels\$" "$dir/tests_kernels-$cpu.log" ||
    fail "the kernel tests on an emulated $cpu did not check exactly the levels $levels: $(grep 'checked at levels' "$dir/tests_kernels-$cpu.log")"
  echo "$cpu: kernel tests at levels $levels, $(grep 'test cases:' "$dir/tests_kernels-$cpu.log" | tr -s ' ')"
}

# doctest splits its filters at commas, so names with commas are matched by a part.
kernel_tests EPYC-Rome "scalar, avx2" \
  "--test-case-exclude=matmul: every level and encoding*,fast: matmul at every level*,exp_poly: within*,*pools of 1*,gemm: the three training products*,gemm: tile and k-block edges*"
kernel_tests Nehalem "scalar" "--source-file=*/test_kquant_blocks.cpp"
generate_same EPYC-Rome avx2 "$dir/q4_k_m.gguf" fast "$short_prompt"
generate_same Haswell avx2 "$model" fast "$short_prompt"
generate_same Nehalem scalar "$model" exact "$short_prompt"
awk 'BEGIN { for (i = 1; i <= 200; i++) printf "line %d: the quick brown fox %s over %d lazy dogs\n", i, (i % 3 ? "jumps" : "leaps"), i * 7 % 13 }' > "$dir/text.txt"
train_same EPYC-Rome avx2
train_same Nehalem scalar
"$quantize" "$dir/train-EPYC-Rome-native/model.gguf" "$dir/tiny-q4_1.gguf" q4_1 --threads 2 2> "$dir/quantize-tiny.log" ||
  { cat "$dir/quantize-tiny.log" >&2; fail "quantize of the trained model to Q4_1 failed (log above)"; }
generate_same EPYC-Rome avx2 "$dir/tiny-q4_1.gguf" exact "$long_prompt"
echo "emulated: every CPU chose its level, passed, and wrote and trained as this machine does at it"
