#!/usr/bin/env python3
"""Write the random-model fixtures in tests/fixtures/models/ and their float64 logits.

    .venv/bin/python tests/reference/make_model_fixtures.py --build BUILD [--out DIR]

These cover the paths the real 135M file never takes:
  tiny_gqa.gguf     tiny_gqa (group 2, tied), written by BUILD/examples/synth_model --seed 1 --std 0.25
  tiny_untied.gguf  tiny_untied (a separate output.weight, group 4), the same way
  tiny_gqa_hf.gguf  tiny_gqa.gguf with the rows of every attn_q / attn_k permuted
                    into Hugging Face order (within each head, HF row j*d/2+i = GGUF
                    row 2i+j, ref_forward.gguf_to_hf_rows). The raw quantized rows are
                    moved, so the weights are the same numbers; a model that reads the
                    file with the half-split RoPE pairing must give tiny_gqa's logits.
  reference.bin     TLMFIX01 (format in tests/fixtures/forward/README.md): for each model
                    M in (tiny_gqa, tiny_untied), M.tokens [T], M.logits [T, vocab] float64
                    at every prompt position, M.greedy [N] and M.margins [N] (top1 - top2
                    of the logits that chose each greedy token).

The logits come from ref_forward.RefModel (float64 numpy over weights dequantized by the
gguf package). The script also checks that tiny_gqa_hf.gguf, computed with the
half-split rotation and no permutation of its own, gives tiny_gqa's logits to < 1e-12,
and that the adjacent rotation on it does not (> 1e-3); it fails, never skips, when
synth_model, the venv's packages or a check is missing. Re-running writes identical files.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np


HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
import ref_forward as rf  # noqa: E402
from gguf_file import GGUFFile  # noqa: E402
from make_forward_fixtures import write_fixture  # noqa: E402

N_GREEDY = 16
# Matrices N(0, 0.25) rather than synth_model's default 0.02: with so few dims, small weights
# make attention nearly uniform and RoPE nearly irrelevant, and a wrong rotation would hide.
STD = "0.25"
# Prompts: a few ids spread over each vocabulary, repeats included (so attention
# sees equal keys at different positions).
PROMPTS = {
    "tiny_gqa": [5, 17, 90, 3, 17, 42, 64, 95, 0, 17, 33, 71],
    "tiny_untied": [200, 7, 129, 255, 7, 64, 13, 198, 0, 7, 150, 91],
}


def synth(build: Path, config: str, out: Path) -> None:
    exe = build / "examples" / "synth_model"
    if not exe.exists():
        sys.exit(f"make_model_fixtures: {exe} is missing; build it first (cmake --build {build} --target synth_model)")
    subprocess.run([str(exe), "--config", config, "--seed", "1", "--std", STD, "--out", str(out)], check=True)


def permute_qk_rows_to_hf(src: Path, dst: Path) -> None:
    """Copy src to dst with the rows of attn_q / attn_k moved into HF order, byte for byte."""
    reader = GGUFFile(src)
    hp = rf.read_hparams(reader)
    data = bytearray(src.read_bytes())
    moved = 0
    for t in reader.tensors:
        if not (t.name.endswith("attn_q.weight") or t.name.endswith("attn_k.weight")):
            continue
        heads = hp.n_head if t.name.endswith("attn_q.weight") else hp.n_kv_head
        perm = rf.gguf_to_hf_rows(heads, hp.head_dim)
        rows = int(t.shape[1])
        assert rows == heads * hp.head_dim, t.name
        raw = np.frombuffer(bytes(data[t.data_offset:t.data_offset + t.n_bytes]), dtype=np.uint8).reshape(rows, -1)
        data[t.data_offset:t.data_offset + t.n_bytes] = raw[perm].tobytes()
        moved += 1
    assert moved == 2 * hp.n_layer, moved
    dst.write_bytes(bytes(data))


def check_hf_file(gguf_model: rf.RefModel, hf_path: Path, tokens: list[int]) -> None:
    want = gguf_model.prompt_logits(tokens)
    scale = np.max(np.abs(want))
    hf = rf.RefModel(str(hf_path))          # the permuted rows as stored, not permuted back
    hf.pairing = "hf"                         # rotate (x[i], x[i + d/2])
    err = np.max(np.abs(hf.prompt_logits(tokens) - want)) / scale
    hf.pairing = "gguf"                       # the wrong rotation for this file
    control = np.max(np.abs(hf.prompt_logits(tokens) - want)) / scale
    print(f"tiny_gqa_hf.gguf with half-split RoPE: {err:.2e} from tiny_gqa (must be < 1e-12); "
          f"with adjacent RoPE: {control:.2e} (must be > 1e-3)")
    if not (err < 1e-12 and control > 1e-3):
        sys.exit("make_model_fixtures: the HF-order file is not the same model; refusing to write fixtures")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", type=Path, required=True, help="build directory with examples/synth_model")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "models")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    arrays = {}
    for config, tokens in PROMPTS.items():
        path = args.out / f"{config}.gguf"
        synth(args.build, config, path)
        model = rf.RefModel(str(path))
        assert model.hp.tied == (config == "tiny_gqa"), config
        ids, margins, logits = model.greedy(tokens, N_GREEDY)
        print(f"{config}: logits [{logits.shape[0]}, {logits.shape[1]}], max|logit| {np.max(np.abs(logits)):.3f}, "
              f"greedy {ids}, smallest margin {min(margins):.2e}")
        if min(margins) < 1e-4 * np.max(np.abs(logits)):
            sys.exit(f"make_model_fixtures: a greedy margin of {config} is a near-tie; choose another prompt")
        arrays[f"{config}.tokens"] = np.asarray(tokens, dtype=np.int32)
        arrays[f"{config}.logits"] = logits.astype(np.float64)
        arrays[f"{config}.greedy"] = np.asarray(ids, dtype=np.int32)
        arrays[f"{config}.margins"] = np.asarray(margins, dtype=np.float64)
        if config == "tiny_gqa":
            hf_path = args.out / "tiny_gqa_hf.gguf"
            permute_qk_rows_to_hf(path, hf_path)
            check_hf_file(model, hf_path, tokens)
    write_fixture(args.out / "reference.bin", arrays)
    print(f"wrote {args.out / 'reference.bin'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
