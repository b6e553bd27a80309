#!/usr/bin/env python3
"""Live check of the larger configs on random-weight files of their exact shape.

    .venv/bin/python tests/reference/check_synthetic.py --build BUILD --model REAL.gguf [--config smollm2_360m]

No 360M or 1.7B file can be downloaded here, so BUILD/examples/synth_model writes one
(random N(0, 0.02) matrices, the real tokenizer section copied from --model) into BUILD,
once. Then BUILD/examples/generate, bound to the config type, dumps the logits of every
prompt position, and the float64 reference (ref_forward.py, which reads any Llama GGUF)
computes them too. Checked over the whole vocabulary at every position:
max|ours - ref| / max|ref| <= 3.5e-6 and the same argmax; then 8 greedy tokens must match
the reference's. A file that decodes fewer layers, groups heads wrongly or misreads a
shape is far off. Fails, never skips, when the binaries or the model are missing.

Then the 1.7B shape, whose group is 1 (a key/value head per query head), which the
360M (group 3) does not exercise. The whole 1.7B would need 14 GB of float64 in the
reference, so synth_model writes its first 2 blocks only (--layers 2: full width 2048,
32/32 heads, FFN 8192, vocabulary) and BUILD/tests/layers_probe binds that file to the
1.7B shape with 2 layers and dumps the logits of every position from a batched prefill
and from token-by-token decoding; both are checked against the reference at the same
bound, with the same argmax. generate --config smollm2_1_7b must refuse the cut file.
Takes a few minutes (the reference dequantizes 362M + 235M weights to float64).
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ref_forward as rf  # noqa: E402

REL_TOL = 3.5e-6  # the bound claimed for every model (check_forward.py)
PROMPT = [504, 3575, 282, 4649, 314, 28, 50, 12345, 7, 49151]  # a real prompt, then spread-out ids
N_GREEDY = 8


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, type=Path)
    ap.add_argument("--model", required=True, type=Path, help="the real 135M file, for its tokenizer section")
    ap.add_argument("--config", default="smollm2_360m")
    args = ap.parse_args(argv)
    synth = args.build / "examples" / "synth_model"
    gen = args.build / "examples" / "generate"
    for exe in (synth, gen):
        if not exe.exists():
            print(f"FAIL: {exe} is missing; build the examples (cmake --build {args.build})", file=sys.stderr)
            return 1
    if not args.model.is_file():
        print(f"FAIL: model file {args.model} not found; run scripts/fetch-model", file=sys.stderr)
        return 1
    path = args.build / f"synthetic-{args.config}.gguf"
    if not path.exists():
        subprocess.run([str(synth), "--config", args.config, "--out", str(path), "--tokenizer-from", str(args.model)],
                       check=True)

    t0 = time.time()
    model = rf.RefModel(str(path))
    print(f"{path.name}: {model.hp.n_layer} layers, dim {model.hp.dim}, heads {model.hp.n_head}/{model.hp.n_kv_head}; "
          f"reference loaded in {time.time() - t0:.1f}s")
    failures = []
    ids = ",".join(map(str, PROMPT))
    with tempfile.TemporaryDirectory() as td:
        dump = Path(td) / "logits.f32"
        r = subprocess.run([str(gen), "--model", str(path), "--config", args.config, "--threads", "1", "--token-ids", ids, "-n", "0",
                            "--dump-logits", str(dump)], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL: generate exited {r.returncode}: {r.stderr}", file=sys.stderr)
            return 1
        vocab = model.hp.n_vocab
        ours = np.fromfile(dump, dtype="<f4").astype(np.float64)
        if ours.size != len(PROMPT) * vocab:
            print(f"FAIL: the dump has {ours.size} floats, expected {len(PROMPT)} x {vocab}", file=sys.stderr)
            return 1
        ours = ours.reshape(len(PROMPT), vocab)
    r = subprocess.run([str(gen), "--model", str(path), "--config", args.config, "--threads", "1", "--token-ids", ids, "-n", str(N_GREEDY),
                        "--print-ids"], capture_output=True, text=True)
    got = [int(x) for x in r.stdout.strip().splitlines()[-1].split(",")] if r.returncode == 0 else None
    # Our ids make the reference's greedy run one batched pass (RefModel.greedy); its ids
    # are its own whatever the guess.
    ref_ids, margins, ref = model.greedy(PROMPT, N_GREEDY, guess=got)
    rel = np.max(np.abs(ours - ref), axis=1) / np.max(np.abs(ref), axis=1)
    print(f"logits over {len(PROMPT)} positions x {vocab}: worst {rel.max():.3e}, median {np.median(rel):.3e} "
          f"(tolerance {REL_TOL:g}); max|ref| {np.max(np.abs(ref)):.3f}")
    if rel.max() > REL_TOL:
        failures.append(f"position {int(np.argmax(rel))}: relative logit error {rel.max():.3e} > {REL_TOL:g}")
    bad = np.nonzero(np.argmax(ours, axis=1) != np.argmax(ref, axis=1))[0]
    if bad.size:
        failures.append(f"argmax differs at positions {bad.tolist()}")

    print(f"greedy: ours {got}, reference {ref_ids} (smallest reference margin {min(margins):.2e})")
    if got != ref_ids:
        failures.append(f"greedy tokens differ: ours {got}, reference {ref_ids}")
    failures += check_1_7b_cut(args.build, args.model)
    print(f"total {time.time() - t0:.1f}s")
    if failures:
        print("FAIL: " + "; ".join(failures))
        return 1
    print("PASS")
    return 0


def check_1_7b_cut(build: Path, real_model: Path) -> list[str]:
    synth = build / "examples" / "synth_model"
    gen = build / "examples" / "generate"
    probe = build / "tests" / "layers_probe"
    if not probe.exists():
        return [f"{probe} is missing; build it (cmake --build {build} --target layers_probe)"]
    path = build / "synthetic-smollm2_1_7b-2layers.gguf"
    if not path.exists():
        subprocess.run([str(synth), "--config", "smollm2_1_7b", "--layers", "2", "--out", str(path),
                        "--tokenizer-from", str(real_model)], check=True)
    failures = []
    r = subprocess.run([str(gen), "--model", str(path), "--config", "smollm2_1_7b", "-n", "1", "Hi"],
                       capture_output=True, text=True)
    if r.returncode == 0 or "llama.block_count: expected 24, found 2" not in r.stderr:
        failures.append(f"generate --config smollm2_1_7b should refuse the 2-block file (exit {r.returncode}): "
                        f"{r.stderr[:300]}")
    t0 = time.time()
    model = rf.RefModel(str(path))
    hp = model.hp
    print(f"{path.name}: {hp.n_layer} layers, dim {hp.dim}, heads {hp.n_head}/{hp.n_kv_head}; "
          f"reference loaded in {time.time() - t0:.1f}s")
    if (hp.n_layer, hp.dim, hp.n_head, hp.n_kv_head) != (2, 2048, 32, 32):
        return failures + [f"the cut file has shape {(hp.n_layer, hp.dim, hp.n_head, hp.n_kv_head)}, "
                           "expected (2, 2048, 32, 32)"]
    with tempfile.TemporaryDirectory() as td:
        dump = Path(td) / "logits.f32"
        r = subprocess.run([str(probe), str(path), str(dump), ",".join(map(str, PROMPT))],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return failures + [f"layers_probe exited {r.returncode}: {r.stderr}"]
        ours = np.fromfile(dump, dtype="<f4").astype(np.float64)
    vocab = hp.n_vocab
    if ours.size != 2 * len(PROMPT) * vocab:
        return failures + [f"layers_probe wrote {ours.size} floats, expected 2 x {len(PROMPT)} x {vocab}"]
    ours = ours.reshape(2, len(PROMPT), vocab)
    ref = model.prompt_logits(PROMPT)
    for name, got in (("batched prefill", ours[0]), ("token by token", ours[1])):
        rel = np.max(np.abs(got - ref), axis=1) / np.max(np.abs(ref), axis=1)
        print(f"1.7B shape, 2 layers, {name}: worst {rel.max():.3e}, median {np.median(rel):.3e} "
              f"(tolerance {REL_TOL:g}); max|ref| {np.max(np.abs(ref)):.3f}")
        if rel.max() > REL_TOL:
            failures.append(f"1.7B shape, {name}, position {int(np.argmax(rel))}: relative logit error "
                            f"{rel.max():.3e} > {REL_TOL:g}")
        bad = np.nonzero(np.argmax(got, axis=1) != np.argmax(ref, axis=1))[0]
        if bad.size:
            failures.append(f"1.7B shape, {name}: argmax differs at positions {bad.tolist()}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
