#!/usr/bin/env python3
"""Writes the training fixtures tests/fixtures/train/<config>.gguf (tiny_gqa, tiny_untied).

Each fixture is one GGUF file holding a tiny model's weights, one batch, and what PyTorch
computes from them in float64 (torch_model.py): the loss, the gradient of every weight,
the losses of 10 AdamW steps on that batch and the weights after them. Everything is
stored as F32; the weights are drawn in float32 and torch uses exactly those values.
The layout is in tests/fixtures/train/README.md.

    .venv-torch/bin/python tests/reference/make_train_fixtures.py [--out DIR] [--config NAME ...]

Deterministic: two runs write byte-identical files (torch runs on one thread).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_model as tm  # noqa: E402

FIXTURE_CONFIGS = ("tiny_gqa", "tiny_untied")
SEEDS = {"tiny_gqa": 1, "tiny_untied": 2}
BATCH, SEQ = 3, 11
HPARAMS = tm.TrainHparams(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, clip=1.0,
                          warmup=3, steps=10, min_lr=3e-4)
REPO = Path(__file__).resolve().parents[2]


def make_batch(cfg: tm.Config, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """tokens and targets [B, T] (int64): next-token targets of a random text, some masked.

    Row 1 has its first 4 targets masked (a prompt that carries no loss, as in supervised
    fine-tuning), and two single positions elsewhere are masked. Row 2 repeats a token
    of row 0 so that the embedding gradient sums rows of repeated tokens.
    """
    rng = np.random.default_rng([seed, 1])
    text = rng.integers(0, cfg.vocab, size=(BATCH, SEQ + 1))
    text[2, 5] = text[0, 2]
    tokens, targets = text[:, :-1].copy(), text[:, 1:].copy()
    targets[1, :4] = -1
    targets[0, SEQ - 1] = -1
    targets[2, 6] = -1
    return tokens, targets


def train(weights: dict[str, np.ndarray], cfg: tm.Config, tokens: np.ndarray, targets: np.ndarray,
          hp: tm.TrainHparams, dtype) -> dict:
    """The reference computation in `dtype`: first loss and gradients, then hp.steps AdamW steps."""
    params = tm.make_params(weights, dtype)
    tok = torch.from_numpy(tokens)
    tgt = torch.from_numpy(targets)
    loss = tm.loss_fn(params, cfg, tok, tgt)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in params.items()}
    first_loss = float(loss.detach())

    params = tm.make_params(weights, dtype)
    opt = tm.make_optimizer(params, hp)
    losses, norms = [], []
    for t in range(1, hp.steps + 1):
        l, n = tm.train_step(params, opt, cfg, tok, tgt, t, hp)
        losses.append(l)
        norms.append(n)
    if losses[0] != first_loss:
        raise AssertionError(f"loss of the first step {losses[0]!r} differs from the lone loss {first_loss!r}")
    return {"loss": first_loss, "grads": grads, "losses": losses, "grad_norms": norms,
            "final": {n: p.detach().clone() for n, p in params.items()}}


def adamw_by_hand(weights, cfg, tokens, targets, hp) -> dict[str, np.ndarray]:
    """AdamW from its formulas in float64 numpy (gradients from torch): checks the optimizer setup.

    p ← p − η_t λ p (rank-2 only); m ← β1 m + (1−β1) g; v ← β2 v + (1−β2) g²;
    p ← p − η_t (m / (1−β1ᵗ)) / (sqrt(v / (1−β2ᵗ)) + ε), with g clipped to global norm ≤ clip.
    """
    p = {n: a.astype(np.float64) for n, a in weights.items()}
    m = {n: np.zeros_like(a) for n, a in p.items()}
    v = {n: np.zeros_like(a) for n, a in p.items()}
    tok, tgt = torch.from_numpy(tokens), torch.from_numpy(targets)
    for t in range(1, hp.steps + 1):
        params = {n: torch.tensor(a, requires_grad=True) for n, a in p.items()}
        tm.loss_fn(params, cfg, tok, tgt).backward()
        g = {n: q.grad.numpy() for n, q in params.items()}
        norm = math.sqrt(sum(float(np.sum(a * a)) for a in g.values()))
        scale = min(1.0, hp.clip / (norm + 1e-6))     # clip_grad_norm_'s formula, 1e-6 included
        lr = tm.lr_at(t, hp)
        for n in p:
            gi = g[n] * scale
            if p[n].ndim == 2:
                p[n] = p[n] - lr * hp.weight_decay * p[n]
            m[n] = hp.beta1 * m[n] + (1 - hp.beta1) * gi
            v[n] = hp.beta2 * v[n] + (1 - hp.beta2) * gi * gi
            mhat = m[n] / (1 - hp.beta1 ** t)
            vhat = v[n] / (1 - hp.beta2 ** t)
            p[n] = p[n] - lr * mhat / (np.sqrt(vhat) + hp.eps)
    return p


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    scale = float(np.max(np.abs(ref)))
    return float(np.max(np.abs(ours.astype(np.float64) - ref.astype(np.float64)))) / (scale if scale > 0 else 1.0)


def f32(t) -> np.ndarray:
    a = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    return np.ascontiguousarray(a, dtype=np.float32)


def compute(name: str, seed: int | None = None) -> dict:
    """Everything one fixture holds, plus diagnostics (not stored)."""
    cfg = tm.CONFIGS[name]
    seed = SEEDS[name] if seed is None else seed
    weights = tm.init_weights(cfg, seed)
    tokens, targets = make_batch(cfg, seed)
    ref = train(weights, cfg, tokens, targets, HPARAMS, torch.float64)
    by_hand = adamw_by_hand(weights, cfg, tokens, targets, HPARAMS)
    optimizer_check = max(rel_err(by_hand[n], ref["final"][n].numpy()) for n in weights)
    if optimizer_check > 1e-10:
        raise AssertionError(f"{name}: torch.optim.AdamW and the formulas disagree by {optimizer_check:.2e}")
    # What a float32 computation of the same thing reaches (torch in float32 against the
    # float64 reference): the yardstick of the 1e-5 tolerance on the C++ float build.
    f32run = train(weights, cfg, tokens, targets, HPARAMS, torch.float32)
    clipped = [i + 1 for i, n in enumerate(ref["grad_norms"]) if n > HPARAMS.clip]
    if not clipped:
        raise AssertionError(f"{name}: clipping is active in no step (grad norms {ref['grad_norms']})")
    return {"cfg": cfg, "seed": seed, "weights": weights, "tokens": tokens, "targets": targets, "ref": ref,
            "clipped_steps": clipped, "optimizer_check": optimizer_check, "f32run": f32run}


def write(path: Path, fx: dict) -> None:
    cfg, ref, hp = fx["cfg"], fx["ref"], HPARAMS
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".gguf.tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")      # writes general.architecture = "llama"
    w.add_name(f"tlm training fixture {cfg.name}")
    w.add_context_length(cfg.context)
    w.add_embedding_length(cfg.dim)
    w.add_block_count(cfg.layers)
    w.add_feed_forward_length(cfg.ffn)
    w.add_head_count(cfg.heads)
    w.add_head_count_kv(cfg.kv_heads)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_vocab_size(cfg.vocab)
    p = "tlm.fixture."
    w.add_string(p + "config", cfg.name)
    for key, val in (("batch", BATCH), ("seq", SEQ), ("seed", fx["seed"]), ("warmup", hp.warmup),
                     ("steps", hp.steps)):
        w.add_uint32(p + key, int(val))
    for key in ("lr", "beta1", "beta2", "eps", "weight_decay", "clip", "min_lr"):
        w.add_float64(p + key, float(getattr(hp, key)))
    w.add_int32(p + "ignore_id", -1)
    w.add_string(p + "clipped_steps", ",".join(map(str, fx["clipped_steps"])))
    w.add_string(p + "reference", f"PyTorch {torch.__version__} float64, tests/reference/make_train_fixtures.py")
    for n, a in fx["weights"].items():
        w.add_tensor(n, f32(a))
    w.add_tensor("train.tokens", f32(fx["tokens"]))
    w.add_tensor("train.targets", f32(fx["targets"]))
    w.add_tensor("train.loss", f32([ref["loss"]]))
    for n, g in ref["grads"].items():
        w.add_tensor("grad." + n, f32(g))
    w.add_tensor("train.losses", f32(ref["losses"]))
    w.add_tensor("train.grad_norms", f32(ref["grad_norms"]))
    for n, a in ref["final"].items():
        w.add_tensor(f"step{hp.steps}." + n, f32(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)


def read_tensors(path) -> dict[str, np.ndarray]:
    """Every tensor of an F32 GGUF file by name, shaped [rows, cols] (GGUF dims reversed)."""
    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise ValueError(f"{path}: tensor '{t.name}' is {t.tensor_type.name}, expected F32")
        shape = tuple(int(d) for d in reversed(list(t.shape)))
        out[t.name] = np.array(t.data, dtype=np.float32).reshape(shape)
    return out


def read_fields(path) -> dict:
    r = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "tests" / "fixtures" / "train"), help="output directory")
    ap.add_argument("--config", action="append", choices=FIXTURE_CONFIGS, help="only these (default: all)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    for name in args.config or FIXTURE_CONFIGS:
        fx = compute(name)
        path = out / f"{name}.gguf"
        write(path, fx)
        if args.quiet:
            continue
        ref, f = fx["ref"], fx["f32run"]
        print(f"{path}: loss {ref['loss']:.6f}, losses {ref['losses'][0]:.4f} -> {ref['losses'][-1]:.4f}, "
              f"grad norms {' '.join(f'{n:.3g}' for n in ref['grad_norms'])} (clip {HPARAMS.clip}: "
              f"clipped at steps {fx['clipped_steps']}); AdamW by hand vs torch.optim {fx['optimizer_check']:.1e}")
        worst_g = max(rel_err(f["grads"][n].numpy(), ref["grads"][n].numpy()) for n in ref["grads"])
        worst_w = max(rel_err(f["final"][n].numpy(), ref["final"][n].numpy()) for n in ref["final"])
        print(f"  torch float32 vs the float64 reference: loss {abs(f['loss'] - ref['loss']) / abs(ref['loss']):.1e}, "
              f"worst gradient {worst_g:.1e}, worst weight after {HPARAMS.steps} steps {worst_w:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
