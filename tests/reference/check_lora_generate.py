#!/usr/bin/env python3
"""`generate --lora` and llama.cpp with the same adapter give the same text.

    python check_lora_generate.py --build BUILD --model GGUF

BUILD/tests/lora_probe writes a rank-8 adapter on q, k, v, o of the model (alpha 16, B
drawn N(0, 0.1^2), so that it changes the logits; see check_lora_llamacpp.py). Then,
for each lora scale S in SCALES, on a fixed prompt of token ids:
  1. BUILD/examples/generate --precision fast --lora ADAPTER --lora-scale S
     --token-ids IDS -n 32 --ignore-eos --print-ids --dump-logits F, and llama.cpp
     through llama-cpp-python, Llama(lora_path=ADAPTER, lora_scale=S), greedy for 32
     tokens: the ids must be the same (at the scales SCALES marks, and without an
     adapter) for the first AGREE tokens; a parting after them must be at a step where
     the two engines' logits on the shared prefix agree within LLAMA_TOL (a near-tie
     their int8 activations round apart);
  2. the prompt logits of the two agree within LLAMA_TOL (max|tlm - llama| / max|tlm|
     per position), the tolerance check_lora_llamacpp.py gives llama.cpp on this Q4_1
     model; the same figure without an adapter is printed beside it;
  3. the adapter matters: it moves tlm's logits by more than twice the difference of
     check 2, so check 2 could not pass with the adapter ignored by either side.
Exit status 0 only when every check passes.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from check_lora_llamacpp import LLAMA_TOL  # noqa: E402
from llamacpp_ref import llama_greedy, llama_logits  # noqa: E402

N = 32
# A chat turn with one clear answer (SmolLM2's ChatML), tokenized by llama.cpp: free
# text makes near-ties that int8 activations flip within 32 tokens even without an adapter.
TEXT = os.environ.get("TLM_CHECK_PROMPT",
                      "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
PROMPT: list[int] = []
# (lora scale, whether the 32 greedy ids must be identical). This random adapter at
# scale 1 moves the logits by ~30% of their range and leaves near-ties that int8
# activations (llama.cpp's, and tlm's --precision fast) flip within 32 tokens, as they
# do without an adapter on free text; at 0.5 it still moves them by twice the two
# engines' difference, and the text is identical. Scale 1 keeps the logits checks.
SCALES = ((1.0, False), (0.5, True))
PRECISION = os.environ.get("TLM_CHECK_PRECISION", "fast")


def rel_err(x: np.ndarray, ref: np.ndarray) -> float:
    return float((np.abs(x - ref).max(axis=1) / np.abs(ref).max(axis=1)).max())


def tlm_run(build: Path, model: str, out: Path, lora: list[str]) -> tuple[list[int], np.ndarray]:
    dump = out / "logits.f32"
    cmd = [str(build / "examples/generate"), "--model", model, "--threads", "1", "--precision", PRECISION, "--token-ids",
           ",".join(map(str, PROMPT)), "-n", str(N), "--ignore-eos", "--print-ids", "--dump-logits", str(dump), *lora]
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    ids = [int(t) for t in r.stdout.strip().splitlines()[-1].split(",")]
    return ids, np.fromfile(dump, dtype=np.float32).reshape(len(PROMPT), -1).astype(np.float64)


# Greedy runs of two engines whose activations are int8 (llama.cpp's, and tlm's fast mode)
# part, now and then, where two candidates are closer than the engines' difference; the
# first AGREE tokens (the answer and what follows it) must be the same, and a parting
# after them is judged as check_kquant.py judges llama.cpp against the reference: by the
# two engines' logits on the shared prefix at that step, within LLAMA_TOL of the largest.
AGREE = 16


def parting(build: Path, model: str, lora: list[str], llm, ids: list[int], their_ids: list[int]):
    """(the step where the two greedy runs part, or None; the two engines' logit difference
    there, relative to tlm's largest logit)."""
    k = next((i for i, (a, b) in enumerate(zip(ids, their_ids)) if a != b), None)
    if k is None:
        return None, 0.0
    prefix = PROMPT + ids[:k]
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "logits.f32"
        subprocess.run([str(build / "examples/generate"), "--model", model, "--threads", "1", "--precision", PRECISION,
                        "--token-ids", ",".join(map(str, prefix)), "-n", "0", "--dump-logits", str(dump), *lora],
                       check=True, capture_output=True, text=True)
        ours = np.fromfile(dump, dtype=np.float32).reshape(len(prefix), -1)[-1].astype(np.float64)
    theirs = llama_logits(llm, prefix)[-1]
    return k, float(np.abs(ours - theirs).max() / np.abs(ours).max())


def judge(label: str, k, err: float, failures: list[str]) -> str:
    if k is None:
        return f"identical for {N} tokens"
    verdict = f"parts at token {k}, where the two engines' logits differ by {err:.2e} of the largest"
    if k < AGREE:
        failures.append(f"{label}: greedy ids part at token {k}, within the first {AGREE}")
    elif err > LLAMA_TOL:
        failures.append(f"{label}: greedy ids part at token {k}, where the logits differ by {err:.2e} > {LLAMA_TOL:g}")
    return verdict


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    from llama_cpp import Llama

    build = Path(args.build)
    tok = Llama(args.model, vocab_only=True, verbose=False)
    PROMPT[:] = tok.tokenize(TEXT.encode(), add_bos=False, special=True)
    del tok
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        subprocess.run([str(build / "tests/lora_probe"), args.model, str(out), ",".join(map(str, PROMPT))], check=True)
        adapter = str(out / "adapter.gguf")

        base_ids, base_logits = tlm_run(build, args.model, out, [])
        llm = Llama(args.model, logits_all=True, n_ctx=128, n_threads=1, verbose=False)
        base_err = rel_err(llama_logits(llm, PROMPT), base_logits)
        k, err_k = parting(build, args.model, [], llm, base_ids, llama_greedy(llm, PROMPT, N))
        del llm
        print(f"no adapter: tlm vs llama.cpp logits {base_err:.2e}, greedy "
              + judge("without an adapter", k, err_k, failures))
        for scale, greedy in SCALES:
            ids, logits = tlm_run(build, args.model, out, ["--lora", adapter, "--lora-scale", f"{scale:g}"])
            llm = Llama(args.model, lora_path=adapter, lora_scale=scale, logits_all=True, n_ctx=128, n_threads=1,
                        verbose=False)
            theirs = llama_logits(llm, PROMPT)
            their_ids = llama_greedy(llm, PROMPT, N)
            lora = ["--lora", adapter, "--lora-scale", f"{scale:g}"]
            k, err_k = parting(build, args.model, lora, llm, ids, their_ids) if greedy else (None, 0.0)
            del llm
            err = rel_err(theirs, logits)
            moved = rel_err(logits, base_logits)
            first = next((i for i, (a, b) in enumerate(zip(ids, their_ids)) if a != b), None)
            verdict = (judge(f"scale {scale:g}", k, err_k, failures) if greedy
                       else f"parts at token {first}" if first is not None else f"identical for {N} tokens")
            print(f"lora scale {scale:g}: tlm vs llama.cpp logits {err:.2e} (tolerance {LLAMA_TOL:g}); "
                  f"the adapter moves tlm's logits by {moved:.2e}; greedy {verdict}")
            print(f"  tlm:       {ids}\n  llama.cpp: {their_ids}\n  (tlm's text {'differs from' if ids != base_ids else 'is'} "
                  "the base's)")
            if greedy and len(ids) != N:
                failures.append(f"scale {scale:g}: tlm gave {len(ids)} ids, not {N}")
            if err > LLAMA_TOL:
                failures.append(f"scale {scale:g}: tlm's and llama.cpp's logits differ by {err:.2e} > {LLAMA_TOL:g}")
            if moved <= 2 * err:
                failures.append(f"scale {scale:g}: the adapter moves the logits by only {moved:.2e}, not twice "
                                f"the difference of the two ({err:.2e}): too little to tell it was applied")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
