#!/usr/bin/env python3
"""examples/quantize against llama.cpp's own quantizer on the same input.

    python check_quantize.py --build BUILD --model GGUF [--types ...] [--synth-types ...]

Both quantizers (BUILD/examples/quantize and `llama_cpp.llama_model_quantize` with
allow_requantize, llama-cpp-python's pinned llama.cpp) read the same file:

  1. the real SmolLM2-135M Q4_1 model (--types; llama.cpp dequantizes every tensor to
     float32 and quantizes that). Its rows of 576 are not a multiple of 256, so the
     K-quant types fall back to Q5_0 / Q5_1 / Q8_0 there; ffn_down's rows of 1536 take
     Q4_K / Q5_K / Q6_K. llama.cpp's files are the ones check_kquant.py makes and caches
     in BUILD/kquant (made here when missing).
  2. a synthetic F16 llama file written here (--synth-types): 4 blocks, dim 512, kv 128,
     ffn 1408, vocab 1000, an untied output: rows of 512 take the K-quants themselves,
     ffn_down's rows of 1408 fall back, output.weight takes Q6_K, and use_more_bits picks
     blocks 2 and 3 for Q4_K_M / Q5_K_M. Cached in BUILD/kquant with llama.cpp's outputs.

For every tensor: the same encoding (required), and the same bytes. Measured (x86-64,
llama-cpp-python 0.3.36): every tensor byte-identical for every type, 272 of 272 per
SmolLM2 file and 39 of 39 per synthetic file, and each whole file (header, metadata
order, padding) identical to llama.cpp's, so that is what is asserted; a tensor that
differs is reported with its dequantized max difference before the failure.

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
import time
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize

TIMEOUT_S = 300

# llama.cpp's llama_ftype numbers (llama.h), and the name examples/quantize takes.
FTYPES = {"Q4_0": (2, "q4_0"), "Q4_1": (3, "q4_1"), "Q8_0": (7, "q8_0"), "Q5_0": (8, "q5_0"), "Q5_1": (9, "q5_1"),
          "Q4_K_S": (14, "q4_k"), "Q4_K_M": (15, "q4_k_m"), "Q5_K_S": (16, "q5_k"), "Q5_K_M": (17, "q5_k_m"),
          "Q6_K": (18, "q6_k")}


def quantize_with_llamacpp(src: Path, dst: Path, ftype: str) -> float:
    """Writes dst with llama.cpp's quantizer unless a complete copy is there; returns seconds.
    (The same naming and caching as check_kquant.py, so the two share files.)"""
    if dst.is_file():  # complete: a file gets its name only when written (below)
        return 0.0
    import llama_cpp
    t0 = time.time()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype][0]
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    tmp = dst.with_suffix(".partial")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {ftype}) returned {rc}")
    tmp.rename(dst)
    return time.time() - t0


def write_synthetic(path: Path, layers=4, dim=512, kv=128, ffn=1408, vocab=1000, seed=5) -> None:
    """A llama-architecture F16 file with random weights (no tokenizer: the quantizers
    need none). Outliers at 20x, as real weights have, so scales and mins are exercised."""
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(dim // 64)
    w.add_head_count_kv(kv // 64)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(1)

    def mat(rows, cols):
        x = rng.standard_normal((rows, cols)).astype(np.float32) * 0.02
        x[rng.random((rows, cols)) < 0.002] *= 20
        return x.astype(np.float16)

    w.add_tensor("token_embd.weight", mat(vocab, dim))
    w.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
    w.add_tensor("output.weight", mat(vocab, dim))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
        w.add_tensor(p + "attn_q.weight", mat(dim, dim))
        w.add_tensor(p + "attn_k.weight", mat(kv, dim))
        w.add_tensor(p + "attn_v.weight", mat(kv, dim))
        w.add_tensor(p + "attn_output.weight", mat(dim, dim))
        w.add_tensor(p + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32))
        w.add_tensor(p + "ffn_gate.weight", mat(ffn, dim))
        w.add_tensor(p + "ffn_up.weight", mat(ffn, dim))
        w.add_tensor(p + "ffn_down.weight", mat(dim, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(path)


def compare(label: str, ours: Path, theirs: Path, failures: list[str]) -> None:
    if ours.read_bytes() == theirs.read_bytes():
        # The same file: every tensor the same encoding and bytes. One reader (reading
        # SmolLM2's vocabulary takes seconds) for the counts.
        encs: dict[str, int] = {}
        tensors = gguf.GGUFReader(theirs).tensors
        for t in tensors:
            encs[t.tensor_type.name] = encs.get(t.tensor_type.name, 0) + 1
        print(f"{label:28s} {len(tensors)} tensors: {len(tensors)} same encoding, {len(tensors)} byte-identical, "
              "the whole file identical  [" + ", ".join(f"{k} x{v}" for k, v in sorted(encs.items())) + "]")
        return
    failures.append(f"{label}: the files differ (tensors below, or metadata, order or padding)")
    a = {t.name: t for t in gguf.GGUFReader(ours).tensors}
    b = {t.name: t for t in gguf.GGUFReader(theirs).tensors}
    if a.keys() != b.keys():
        failures.append(f"{label}: tensor names differ: only ours {sorted(a.keys() - b.keys())}, "
                        f"only llama.cpp's {sorted(b.keys() - a.keys())}")
        return
    same_enc = same_bytes = 0
    encs: dict[str, int] = {}
    for name, x in a.items():
        y = b[name]
        if x.tensor_type != y.tensor_type:
            failures.append(f"{label}: {name} is {x.tensor_type.name}, llama.cpp wrote {y.tensor_type.name}")
            continue
        same_enc += 1
        encs[x.tensor_type.name] = encs.get(x.tensor_type.name, 0) + 1
        xb, yb = np.asarray(x.data).view(np.uint8).ravel(), np.asarray(y.data).view(np.uint8).ravel()
        if np.array_equal(xb, yb):
            same_bytes += 1
            continue
        dx = dequantize(x.data, x.tensor_type).astype(np.float64)
        dy = dequantize(y.data, y.tensor_type).astype(np.float64)
        diff = float(np.max(np.abs(dx - dy)))
        scale = float(np.max(np.abs(dy))) or 1.0
        failures.append(f"{label}: {name} ({x.tensor_type.name}): {int(np.sum(xb != yb))} of {xb.size} bytes differ; "
                        f"dequantized max difference {diff:.3e} ({diff / scale:.2e} of the tensor's largest value)")
    print(f"{label:28s} {len(a)} tensors: {same_enc} same encoding, {same_bytes} byte-identical  ["
          + ", ".join(f"{k} x{v}" for k, v in sorted(encs.items())) + "]")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--types", default="Q4_K_M,Q5_K_M,Q6_K,Q8_0")
    ap.add_argument("--synth-types", default="Q4_K_M,Q5_K_M,Q6_K,Q8_0,Q4_K_S,Q5_K_S,Q4_0,Q4_1,Q5_0,Q5_1")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)

    exe = Path(args.build) / "examples" / "quantize"
    if not exe.is_file():
        print(f"FAIL: {exe} is missing; build it: cmake --build {args.build} --target quantize", file=sys.stderr)
        return 1
    model = Path(args.model)
    if not model.is_file():
        print(f"FAIL: {model} not found; run scripts/fetch-model", file=sys.stderr)
        return 1
    cache = Path(args.build) / "kquant"
    cache.mkdir(parents=True, exist_ok=True)
    synth = cache / "synthetic-quantize-4x512.F16.gguf"
    if not synth.is_file():
        write_synthetic(synth)

    jobs = [(model, "SmolLM2-135M-Instruct", t) for t in args.types.split(",") if t.strip()]
    jobs += [(synth, "synthetic-quantize-4x512", t) for t in args.synth_types.split(",") if t.strip()]
    failures: list[str] = []
    t_all = time.time()
    with tempfile.TemporaryDirectory() as td:
        for src, stem, ftype in jobs:
            ftype = ftype.strip()
            if ftype not in FTYPES:
                print(f"FAIL: unknown type {ftype}; known: {', '.join(FTYPES)}", file=sys.stderr)
                return 1
            theirs = cache / f"{stem}.{ftype}.gguf"
            secs = quantize_with_llamacpp(src, theirs, ftype)
            ours = Path(td) / f"{stem}.{ftype}.gguf"
            t0 = time.time()
            r = subprocess.run([str(exe), str(src), str(ours), FTYPES[ftype][1], "--threads", str(args.threads)],
                               capture_output=True, text=True, timeout=TIMEOUT_S)
            if r.returncode != 0:
                failures.append(f"{stem} {ftype}: examples/quantize failed ({r.returncode}): {r.stderr[-1000:]}")
                continue
            ours_s = time.time() - t0
            compare(f"{stem.split('-')[0]} {ftype}", ours, theirs, failures)
            print(f"{'':28s} tlm {ours_s:.1f} s, llama.cpp {f'{secs:.1f} s' if secs else '(reused)'}")
            ours.unlink()
    print(f"\n{len(jobs)} files compared in {time.time() - t_all:.1f} s")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("OK: every tensor of every file has llama.cpp's encoding and bytes; every file is llama.cpp's, byte for byte")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
