#!/usr/bin/env python3
"""Compare llama.cpp (through llama-cpp-python) with the float64 reference.

    python llamacpp_ref.py [--model GGUF] [--fixtures DIR] [--out REPORT.md]

For every prompt of the fixtures:
  * prompt logits: llama.cpp's `scores` after `eval(prompt)` against the live
    float64 reference, max|llama - ref| / max|ref| per position, and argmax
    agreement;
  * free-running greedy: 32 tokens, each chosen by argmax of llama.cpp's last
    logits, compared token by token with the reference's greedy ids
    (greedy.bin); at the first divergence the reference's top1 - top2 margin
    at that step is shown, because llama.cpp quantizes activations to Q8 and
    a near-tie can legitimately flip;
  * teacher-forced: llama.cpp evaluates prompt + the reference's tokens, and
    its argmax is compared with the reference's choice at each of the 32
    steps (so agreement after a divergence is still measured).

Writes the report to tests/fixtures/forward/llamacpp_agreement.md.  This is a
report, not a pass/fail test: llama.cpp is a second opinion on tokens, while
the float64 reference is the judge of logits.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ref_forward as rf  # noqa: E402
from make_forward_fixtures import DEFAULT_MODEL, DEFAULT_OUT, load_prompts, read_fixture  # noqa: E402


def llama_logits(llm, tokens: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[:len(tokens)], dtype=np.float64)     # [T, vocab]


def llama_greedy(llm, tokens: list[int], n: int) -> list[int]:
    llm.reset()
    llm.eval(tokens)
    out = []
    for i in range(n):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(t)
        if i + 1 < n:
            llm.eval([t])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--fixtures", default=str(DEFAULT_OUT))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    fx = Path(args.fixtures)
    out_path = Path(args.out) if args.out else fx / "llamacpp_agreement.md"

    import llama_cpp
    from llama_cpp import Llama

    t0 = time.time()
    llm = Llama(model_path=args.model, logits_all=True, n_ctx=512, n_threads=2, verbose=False)
    model = rf.RefModel(args.model)
    # The same float64 model with its matmul inputs rounded to Q8 blocks: if
    # llama.cpp's error is of the size this rounding alone causes, the error
    # is explained by activation quantization rather than a modelling difference.
    q8sim = rf.RefModel(args.model, _shared=model, act_quant="q8")
    gf = read_fixture(fx / "greedy.bin")
    names = [p["name"] for p in load_prompts()["prompts"]]
    n_prompts = int(gf["n_prompts"][0])
    n_gen = int(gf["n_generated"][0])

    rows, rel_all, am_agree, am_total = [], [], 0, 0
    q8_all, pos0 = [], []
    free_total = forced_total = 0
    for p in range(n_prompts):
        toks = [int(t) for t in gf[f"p{p}.tokens"]]
        ref_ids = [int(t) for t in gf[f"p{p}.ids"]]
        margins = [float(m) for m in gf[f"p{p}.margins"]]
        T = len(toks)

        ref = model.prompt_logits(toks)
        lam = llama_logits(llm, toks)
        rel = np.max(np.abs(lam - ref), axis=1) / np.max(np.abs(ref), axis=1)
        rel_all.extend(rel.tolist())
        refq = q8sim.prompt_logits(toks)
        q8_all.extend((np.max(np.abs(refq - ref), axis=1) / np.max(np.abs(ref), axis=1)).tolist())
        pos0.append((rel[0], np.max(np.abs(lam[0] - refq[0])) / np.max(np.abs(refq[0]))))
        am = int(np.sum(np.argmax(lam, axis=1) == np.argmax(ref, axis=1)))
        am_agree += am
        am_total += T

        gen = llama_greedy(llm, toks, n_gen)
        k = next((i for i in range(n_gen) if gen[i] != ref_ids[i]), n_gen)
        free_total += k

        forced = llama_logits(llm, toks + ref_ids[:-1])[T - 1:]              # [n_gen, vocab]
        forced_am = np.argmax(forced, axis=1)
        forced_ok = int(np.sum(forced_am == np.array(ref_ids)))
        forced_total += forced_ok
        flips = [(i, margins[i]) for i in range(n_gen) if forced_am[i] != ref_ids[i]]

        div = "none"
        if k < n_gen:
            div = (f"step {k}: llama {gen[k]} {model_piece(llm, gen[k])} vs ref {ref_ids[k]} "
                   f"{model_piece(llm, ref_ids[k])}, ref margin {margins[k]:.4f}")
        rows.append((p, names[p] if p < len(names) else str(p), T, am, rel.max(), k, forced_ok, div,
                     ", ".join(f"{i} ({m:.3f})" for i, m in flips) or "-", min(margins)))
        print(f"[{p}] argmax {am}/{T}, logit rel err {rel.max():.2e}, free {k}/{n_gen}, "
              f"forced {forced_ok}/{n_gen}; {div}", file=sys.stderr)

    r = np.array(rel_all)
    rq = np.array(q8_all)
    p0 = np.array(pos0)
    lines = [
        "# llama.cpp vs the float64 reference",
        "",
        f"Written by `tests/reference/llamacpp_ref.py` (llama-cpp-python {llama_cpp.__version__}, "
        f"`Llama(logits_all=True, n_ctx=512, n_threads=2)`) on `{Path(args.model).name}`.",
        "llama.cpp multiplies Q4_1/Q8_0 weights by activations quantized to Q8, so its logits",
        "differ from a float64 computation over the dequantized weights; tokens can flip where",
        "the reference's top1 - top2 margin is small.",
        "",
        "## Summary",
        "",
        f"- prompt-position argmax agreement: {am_agree}/{am_total}",
        f"- llama.cpp logit error max|llama - ref| / max|ref| over {r.size} prompt positions: "
        f"worst {r.max():.3e}, median {np.median(r):.3e}",
        f"- for scale: the float64 reference with only its matmul inputs rounded to Q8 blocks "
        f"(int8, fp16 scale per 32) differs from the plain reference by worst {rq.max():.3e}, "
        f"median {np.median(rq):.3e} (compare with llama.cpp's figures above: a similar size means "
        f"llama.cpp's error is what activation quantization alone produces in this 30-layer model)",
        f"- at position 0 (no attention mixing) llama.cpp vs the reference: median "
        f"{np.median(p0[:, 0]):.3e}; vs the Q8-rounded reference: median {np.median(p0[:, 1]):.3e}",
        f"- free-running greedy: {free_total}/{n_prompts * n_gen} tokens before the first divergence "
        f"({sum(1 for row in rows if row[5] == n_gen)}/{n_prompts} prompts identical over {n_gen} tokens)",
        f"- teacher-forced greedy (llama.cpp's argmax on the reference's path): "
        f"{forced_total}/{n_prompts * n_gen}",
        "",
        "## Per prompt",
        "",
        "| # | prompt | T | argmax agree | worst logit rel err | free-run agree | forced agree "
        "| first divergence | forced flips: step (ref margin) | ref min margin |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p, name, T, am, worst, k, fo, div, flips, mm in rows:
        lines.append(f"| {p} | {name} | {T} | {am}/{T} | {worst:.2e} | {k}/{n_gen} | {fo}/{n_gen} "
                     f"| {div} | {flips} | {mm:.4f} |")
    out_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines[8:16]))
    print(f"report written to {out_path} ({time.time() - t0:.1f}s)")
    return 0


def model_piece(llm, tok: int) -> str:
    return json.dumps(llm.detokenize([tok], special=True).decode("utf-8", errors="replace"),
                      ensure_ascii=False).replace("|", "\\|")


if __name__ == "__main__":
    sys.exit(main())
