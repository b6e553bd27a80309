#!/usr/bin/env python3
"""Write the forward-pass fixtures in tests/fixtures/forward/ from the float64 reference.

    python make_forward_fixtures.py [--model GGUF] [--out DIR]

Deterministic: BLAS runs single-threaded, prompts come from prompts.json, and
nothing is sampled.  The container format (TLMFIX01) is described in
tests/fixtures/forward/README.md; `write_fixture` / `read_fixture` below are
its only Python implementation.
"""
from __future__ import annotations

import os

# One BLAS thread: the summation order, and so the last bits, stay the same run to run.
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import hashlib
import importlib.metadata
import json
import struct
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
import ref_forward as rf  # noqa: E402

DEFAULT_MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = REPO / "tests" / "fixtures" / "forward"

MAGIC = b"TLMFIX01"
DTYPES = {1: np.dtype("<f4"), 2: np.dtype("<f8"), 3: np.dtype("<i4")}
DTYPE_CODE = {np.dtype("<f4"): 1, np.dtype("<f8"): 2, np.dtype("<i4"): 3}

TOPK = 32
STRIPE_STEP = 97          # stripe = logits[0::97]
N_GREEDY = 32
TRACE_NAMES = ["x_in", "attn_norm", "q", "k", "v", "q_rope", "k_rope", "attn", "attn_out",
               "h", "ffn_norm", "gate", "up", "act", "mlp", "out"]
ROPE_POSITIONS = [0, 5, 4000]   # layer-0 q/k depend on the position only through RoPE


# --------------------------------------------------------------------------
# TLMFIX01 container: a list of named little-endian row-major arrays.

def write_fixture(path: Path, arrays: dict) -> None:
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<I", len(arrays)))
        for name, a in arrays.items():
            a = np.asarray(a)
            if a.dtype.kind == "f":
                a = a.astype("<f8" if a.dtype.itemsize == 8 else "<f4")
            else:
                a = a.astype("<i4")
            nb = name.encode("ascii")
            f.write(struct.pack("<I", len(nb)))
            f.write(nb)
            f.write(struct.pack("<II", DTYPE_CODE[a.dtype], a.ndim))
            f.write(struct.pack("<%dQ" % a.ndim, *a.shape))
            f.write(np.ascontiguousarray(a).tobytes())


def read_fixture(path: Path) -> dict:
    data = Path(path).read_bytes()
    if data[:8] != MAGIC:
        raise ValueError(f"{path}: not a TLMFIX01 file")
    (n,) = struct.unpack_from("<I", data, 8)
    off = 12
    out = {}
    for _ in range(n):
        (ln,) = struct.unpack_from("<I", data, off)
        off += 4
        name = data[off:off + ln].decode("ascii")
        off += ln
        code, ndim = struct.unpack_from("<II", data, off)
        off += 8
        shape = struct.unpack_from("<%dQ" % ndim, data, off)
        off += 8 * ndim
        dt = DTYPES[code]
        count = int(np.prod(shape)) if ndim else 1
        out[name] = np.frombuffer(data, dtype=dt, count=count, offset=off).reshape(shape)
        off += count * dt.itemsize
    if off != len(data):
        raise ValueError(f"{path}: {len(data) - off} trailing bytes")
    return out


# --------------------------------------------------------------------------

def load_prompts() -> dict:
    return json.loads((HERE / "prompts.json").read_text(encoding="utf-8"))


def tokenizer(model_path: Path):
    from llama_cpp import Llama
    return Llama(model_path=str(model_path), vocab_only=True, verbose=False)


def tokenize(tok, text: str) -> list[int]:
    return list(tok.tokenize(text.encode("utf-8"), add_bos=False, special=True))


def detokenize(tok, ids) -> str:
    return tok.detokenize(list(ids), special=True).decode("utf-8", errors="replace")


def top_k(row: np.ndarray, k: int):
    idx = np.argpartition(-row, k)[:k]
    idx = idx[np.lexsort((idx, -row[idx]))]   # by logit descending, ties by id
    return idx, row[idx]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    model_path, out = Path(args.model), Path(args.out)
    if not model_path.exists():
        print(f"model {model_path} not found: run scripts/fetch-model", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    import llama_cpp
    tok = tokenizer(model_path)
    spec = load_prompts()
    prompts = spec["prompts"]
    ids = [tokenize(tok, p["text"]) for p in prompts]
    trace_ids = tokenize(tok, spec["trace"]["text"])

    model = rf.RefModel(str(model_path))
    hp = model.hp
    if hp.add_bos:
        raise SystemExit("this file asks for BOS; the fixtures assume add_bos_token = false")
    t_load = time.time() - t_start
    print(f"model loaded in {t_load:.1f}s", file=sys.stderr)

    # ---- logits at every prompt position, and greedy continuations --------
    logits_fx = {"vocab": [hp.n_vocab], "stripe_step": [STRIPE_STEP], "topk": [TOPK],
                 "n_prompts": [len(prompts)]}
    greedy_fx = {"n_prompts": [len(prompts)], "n_generated": [N_GREEDY]}
    greedy_md = []
    total_positions = 0
    for p, (pr, toks) in enumerate(zip(prompts, ids)):
        t0 = time.time()
        gen, margins, L = model.greedy(toks, N_GREEDY)      # L: [T, vocab]
        T = L.shape[0]
        total_positions += T
        order = np.argsort(-L, axis=1)[:, :2]
        top = [top_k(L[t], TOPK) for t in range(T)]
        logits_fx.update({
            f"p{p}.tokens": toks,
            f"p{p}.argmax": order[:, 0],
            f"p{p}.margin": L[np.arange(T), order[:, 0]] - L[np.arange(T), order[:, 1]],
            f"p{p}.max_abs": np.max(np.abs(L), axis=1),
            f"p{p}.l2": np.sqrt(np.sum(L * L, axis=1)),
            f"p{p}.top_ids": np.stack([t[0] for t in top]),
            f"p{p}.top_logits": np.stack([t[1] for t in top]),
            # f32 keeps the file small; its rounding (<= 6e-8 relative) is far below the 1e-4 check.
            f"p{p}.stripe": L[:, ::STRIPE_STEP].astype(np.float32),
        })
        greedy_fx.update({f"p{p}.tokens": toks, f"p{p}.ids": gen, f"p{p}.margins": margins})
        text = detokenize(tok, gen)
        greedy_md.append((p, pr["name"], len(toks), min(margins), int(np.argmin(margins)), gen, text))
        print(f"  [{p}] {pr['name']}: {T} tokens, min margin {min(margins):.4f}, "
              f"{time.time() - t0:.1f}s: {text!r}", file=sys.stderr)
    write_fixture(out / "logits.bin", logits_fx)
    write_fixture(out / "greedy.bin", greedy_fx)

    # ---- op-by-op trace of the first and last layer ------------------------
    trace_layers = (0, hp.n_layer - 1)
    trace, rms = {}, []
    cache = model.new_cache(len(trace_ids))
    model.forward(trace_ids, cache, trace=trace, trace_layers=trace_layers, rms_log=rms)
    trace_fx = {"tokens": trace_ids, "layers": list(trace_layers)}
    for l in trace_layers:
        for name in TRACE_NAMES:
            trace_fx[f"L{l}.{name}"] = trace[l][name].astype(np.float32)
    write_fixture(out / "layer_trace.bin", trace_fx)
    write_fixture(out / "residual_rms.bin", {"tokens": trace_ids, "rms": np.stack(rms)})

    # ---- layer-0 q and k after RoPE at three positions ----------------------
    rope_toks = trace_ids[:len(ROPE_POSITIONS)]
    w0 = model.layers[0]
    pos = np.array(ROPE_POSITIONS)
    x0 = model.tok_embd[rope_toks]                                  # [3, dim]
    n0 = rf.rmsnorm(x0, w0.attn_norm, hp.rms_eps)
    q = n0 @ w0.wq.T                                                # [3, dim]
    k = n0 @ w0.wk.T                                                # [3, kv_dim]
    d = hp.head_dim
    q_rope = rf.rope_adjacent(q.reshape(3, hp.n_head, d), pos, hp.n_rot, hp.rope_base).reshape(3, -1)
    k_rope = rf.rope_adjacent(k.reshape(3, hp.n_kv_head, d), pos, hp.n_rot, hp.rope_base).reshape(3, -1)
    pq, pk = rf.gguf_to_hf_rows(hp.n_head, d), rf.gguf_to_hf_rows(hp.n_kv_head, d)
    q_hf = rf.rope_halfsplit(q[:, pq].reshape(3, hp.n_head, d), pos, hp.n_rot, hp.rope_base).reshape(3, -1)
    k_hf = rf.rope_halfsplit(k[:, pk].reshape(3, hp.n_kv_head, d), pos, hp.n_rot, hp.rope_base).reshape(3, -1)
    # The two pairings are the same vectors up to the row permutation.
    assert np.max(np.abs(q_hf - q_rope[:, pq])) < 1e-12 * np.max(np.abs(q_rope))
    assert np.max(np.abs(k_hf - k_rope[:, pk])) < 1e-12 * np.max(np.abs(k_rope))
    write_fixture(out / "rope_layer0.bin", {
        "tokens": rope_toks, "positions": ROPE_POSITIONS, "x_in": x0,
        "q": q, "k": k, "q_rope": q_rope, "k_rope": k_rope, "q_rope_hf": q_hf, "k_rope_hf": k_hf})

    # ---- HF pairing check over all prompts (not a fixture; fails loudly) ----
    worst_hf, control = rf.check_hf_pairing(model, ids)
    if not (worst_hf < 1e-12 and control > 1e-3):
        raise SystemExit(f"HF pairing check failed: {worst_hf:.3e} / control {control:.3e}")

    # ---- human-readable companions -----------------------------------------
    lines = ["# Greedy continuations from the float64 reference", "",
             f"{N_GREEDY} tokens per prompt, never stopping at EOS. margin = top1 - top2 logit;",
             "the minimum along the 32 steps shows how close the run came to a tie.", "",
             "| # | prompt | prompt tokens | min margin (step) | text |", "|---|---|---|---|---|"]
    for p, name, T, mm, step, gen, text in greedy_md:
        lines.append(f"| {p} | {name} | {T} | {mm:.4f} ({step}) | {json.dumps(text, ensure_ascii=False)} |")
    lines += ["", "## Token ids", ""]
    for p, name, T, mm, step, gen, text in greedy_md:
        lines.append(f"- {p} {name}: prompt `{','.join(map(str, ids[p]))}` -> `{','.join(map(str, gen))}`")
    (out / "greedy.md").write_text("\n".join(lines) + "\n", encoding="utf-8")

    meta = {
        "model_file": model_path.name,
        "model_sha256": sha256(model_path),
        "numpy": np.__version__,
        "gguf": importlib.metadata.version("gguf"),
        "llama_cpp_python": llama_cpp.__version__,
        "n_prompts": len(prompts),
        "logit_positions": total_positions,
        "trace_prompt": spec["trace"]["text"],
        "trace_tokens": len(trace_ids),
        "hf_pairing_max_rel_diff": worst_hf,
        "hf_pairing_wrong_control": control,
        "hparams": {k: getattr(hp, k) for k in ("n_layer", "dim", "ffn", "n_head", "n_kv_head", "head_dim",
                                                "n_rot", "rope_base", "rms_eps", "n_vocab", "n_ctx", "tied")},
        "encodings": sorted({(v, sum(1 for e in model.encodings.values() if e == v))
                             for v in model.encodings.values()}),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"{total_positions} logit positions, {len(prompts)} prompts, HF pairing {worst_hf:.2e} "
          f"(control {control:.2e}); fixtures {size / 1e6:.2f} MB; total {time.time() - t_start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
