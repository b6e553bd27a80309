#!/usr/bin/env python3
"""Live check of tlm's training against PyTorch: gradients, AdamW steps, one real layer.

    .venv-torch/bin/python tests/reference/torch_check_train.py --build BUILD [--model GGUF]
        [--part all|tiny|layer] [--precision both|float|double] [--probe PATH] [--keep DIR]

1. tiny: re-runs make_train_fixtures.py into a temporary directory (and checks that the
   committed fixtures in tests/fixtures/train/ agree with the fresh ones), then for
   tiny_gqa and tiny_untied runs

       BUILD/tests/train_probe model FIXTURE.gguf OUT.gguf [--precision double]

   which must write the F32 tensors train.loss [1], train.losses [10], grad.<name> and
   step10.<name> for every weight. Relative error per tensor = max|ours − ref| / max|ref|.
   Limits: loss, losses and every gradient 1e-5; weights after 10 steps 1e-5 in double,
   and --step-tol-float (2e-4) in float: AdamW divides each gradient by its own running
   RMS, so an element whose gradient is ~1e-7 of the tensor's largest moves by a fraction
   of lr that float32 rounding decides; PyTorch's own float32 run is 6e-5 away from its
   float64 run on tiny_untied (the table shows that yardstick next to ours), and ours
   moves between 7.9e-5 and 1.33e-4 with the summation order alone (kernel level,
   attention blocking; the same bound as tests/test_train_fixtures.cpp).

2. layer: layer 0 of the real SmolLM2-135M file (dequantized with gguf.quants.dequantize),
   an input x [64, 576] and an upstream gradient dy [64, 576] (seeded N(0, 1), rounded to
   f32). PyTorch float64 computes y = block(x) and the gradients of sum(y·dy) with respect
   to x and the 9 layer tensors. The input file IN.gguf holds layer.x, layer.dy and the 9
   tensors as F32 under their blk.0.* names (with the model's llama.* metadata); then

       BUILD/tests/train_probe layer IN.gguf OUT.gguf --config smollm2_135m [--precision double]

   must write layer.y, grad.x and grad.blk.0.<name>.weight; each within 1e-5 relative.

3. lora: a rank-4 LoRA adapter on all seven matrices of every layer, over a frozen base
   that tlm quantizes and maps as a LoRA run does, for four tiny configs that cover the
   traits between them (LORA_CASES: tied and untied, GQA groups 2 and 4, q/k/v biases
   with the half-split RoPE of qwen2 files, Llama 3 frequency scaling; F32, F16, Q8_0
   and Q4_1 bases). This script draws the base (F32), the adapter (written as
   llama.cpp's adapter GGUF: general.type adapter, adapter.lora.alpha, tensors
   blk.N.<matrix>.weight.lora_a [r, in] / .lora_b [out, r]) and one batch; then

       BUILD/tests/train_probe lora IN.gguf OUT.gguf ADAPTER.gguf --encoding ENC [--precision double]

   writes train.loss, train.losses, grad.<adapter tensor>, step10.<adapter tensor> and
   base.<name> in ENC. PyTorch float64 runs the same LoRA (written here and in
   torch_model.py, not from tlm's code) over the base as gguf.quants.dequantize reads
   OUT's base.* tensors, with gradients for A and B only, and the same 10 AdamW steps
   on the adapter. Limits: in double 1e-6 for everything (the issue asks 1e-5; the
   results are written as F32, so 6e-8 is what agreement looks like); in float, 3e-4 for
   the loss and the gradients and --step-tol-float for the steps. PyTorch's own float32
   run is up to 4.2e-5 from its float64 run on these cases (tiny_qwen2's q gradients),
   and the tables show that yardstick beside tlm's float. The float limit is not tighter
   because tiny_qwen2's attn_q lora_a gradient moves by 1e-4 under one-ulp changes of the
   forward's products: with every product over the base correctly rounded (the float64
   product rounded once to float32) it came to 1.24e-4, and with those rounded results
   moved by -1, 0 or +1 ulp at random, 0.82e-4 to 1.66e-4 over ten seeds (on an Intel
   Xeon, 2026-12-07); the avx512 level's products, less exact than either, happened to
   give 5.4e-5, and the amx level's, whose quantized products now round as a float32 dot
   product does (kernels/amx.hpp, the scaled path), 1.84e-4. A limit under 2e-4 tests
   that luck; a wrong formula is off by far more, and the double run holds every formula
   to 1e-6.

Exits non-zero, naming the tensor, on any failure; a missing probe, model or package is a
failure, never a skip.
"""
from __future__ import annotations

import argparse
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_train_fixtures as mf  # noqa: E402
import torch_model as tm  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-5
LAYER_T = 64
LAYER_SEED = 135


class CheckFailed(Exception):
    pass


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return mf.rel_err(ours, ref)


def kind_of(name: str) -> str:
    """'grad.blk.1.attn_q.weight' -> 'grad.attn_q'; 'step10.token_embd.weight' -> 'step10.token_embd'."""
    prefix, _, rest = name.partition(".")
    if prefix not in ("grad", "step10", "layer"):
        return name
    rest = re.sub(r"^blk\.\d+\.", "", rest)
    rest = re.sub(r"\.weight$", "", rest)
    return f"{prefix}.{rest}"


def run_probe(cmd: list[str], what: str) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise CheckFailed(f"{what}: `{' '.join(cmd)}` exited with {p.returncode}\n"
                          f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}")
    return dt


def run_precisions(probe: Path, mode: str, inp: Path, rest: list, out_of, label: str, precisions: list[str],
                   fails: list[str]) -> dict[str, Path]:
    """`probe MODE IN OUT REST...` once per precision (double adds --precision double): the
    output files of the runs that succeeded; a failed run's message goes to `fails`."""
    outs = {}
    for prec in precisions:
        out = out_of(prec)
        cmd = [str(probe), mode, str(inp), str(out)] + [str(a) for a in rest] + (
            ["--precision", "double"] if prec == "double" else [])
        try:
            dt = run_probe(cmd, f"{label} ({prec})")
        except CheckFailed as e:
            fails.append(str(e))
            continue
        outs[prec] = out
        print(f"  {label} ({prec}): probe ran in {dt:.2f} s")
    return outs


def compare(ours: dict, ref: dict, names: list[str], tol_of, label: str, errors: dict) -> list[str]:
    """Fills errors[name] and returns failure messages (missing, shape, limit)."""
    fails = []
    for n in names:
        if n not in ours:
            fails.append(f"{label}: the probe wrote no tensor '{n}'")
            continue
        if ours[n].shape != ref[n].shape:
            fails.append(f"{label}: tensor '{n}' has shape {list(ours[n].shape)}, expected {list(ref[n].shape)}")
            continue
        if not np.all(np.isfinite(ours[n])):
            fails.append(f"{label}: tensor '{n}' holds NaN or Inf")
            errors[n] = float("inf")
            continue
        e = rel_err(ours[n], ref[n])
        errors[n] = e
        if not e <= tol_of(n):
            fails.append(f"{label}: tensor '{n}' is {e:.2e} relative from PyTorch (limit {tol_of(n):.0e})")
    return fails


def print_table(title: str, columns: list[tuple[str, dict]], limits: dict[str, str]) -> None:
    """One row per tensor kind: the worst error over the tensors of that kind, per column."""
    kinds = []
    for _, errs in columns:
        for n in errs:
            k = kind_of(n)
            if k not in kinds:
                kinds.append(k)
    order = {"train": 0, "layer": 0, "grad": 1, "step10": 2}
    kinds.sort(key=lambda k: order.get(k.split(".")[0], 3))   # stable: file order within a group
    print(f"\n{title}")
    head = f"  {'tensor kind':<24}" + "".join(f"{c:>14}" for c, _ in columns) + f"  {'limit'}"
    print(head)
    print("  " + "-" * (len(head) - 2))
    for k in kinds:
        cells = []
        for _, errs in columns:
            vals = [e for n, e in errs.items() if kind_of(n) == k]
            cells.append(f"{max(vals):>14.2e}" if vals else f"{'-':>14}")
        print(f"  {k:<24}" + "".join(cells) + f"  {limits.get(k, limits.get(k.split('.')[0], ''))}")


# --------------------------------------------------------------------------
# Part 1: the tiny fixtures.

def check_tiny(probe: Path, work: Path, precisions: list[str], step_tol_float: float) -> list[str]:
    fails = []
    fixdir = work / "fixtures"
    print(f"regenerating the training fixtures into {fixdir} ...", flush=True)
    torch.set_num_threads(1)
    yardsticks = {}
    for name in mf.FIXTURE_CONFIGS:
        fx = mf.compute(name)
        mf.write(fixdir / f"{name}.gguf", fx)
        f32 = fx["f32run"]
        yardsticks[name] = {"grad." + n: rel_err(g.numpy(), fx["ref"]["grads"][n].numpy()) for n, g in f32["grads"].items()}
        yardsticks[name].update({f"step{mf.HPARAMS.steps}." + n: rel_err(w.numpy(), fx["ref"]["final"][n].numpy())
                                 for n, w in f32["final"].items()})
        yardsticks[name]["train.loss"] = abs(f32["loss"] - fx["ref"]["loss"]) / abs(fx["ref"]["loss"])
        yardsticks[name]["train.losses"] = rel_err(np.array(f32["losses"]), np.array(fx["ref"]["losses"]))

        committed = REPO / "tests" / "fixtures" / "train" / f"{name}.gguf"
        if not committed.exists():
            fails.append(f"{name}: the committed fixture {committed} is missing")
        else:
            old, new = mf.read_tensors(committed), mf.read_tensors(fixdir / f"{name}.gguf")
            if sorted(old) != sorted(new):
                fails.append(f"{name}: the committed fixture's tensors differ from a fresh run's: regenerate it")
            else:
                worst = max((rel_err(old[n], new[n]), n) for n in new)
                if worst[0] > 1e-6:
                    fails.append(f"{name}: the committed fixture differs from a fresh run at '{worst[1]}' "
                                 f"({worst[0]:.1e}): regenerate it with make_train_fixtures.py")
                else:
                    print(f"  {name}: committed fixture = fresh run (worst {worst[0]:.1e})")

    for name in mf.FIXTURE_CONFIGS:
        fixture = fixdir / f"{name}.gguf"
        ref = mf.read_tensors(fixture)
        weights = list(tm.tensor_shapes(tm.CONFIGS[name]))
        names = (["train.loss", "train.losses"] + [f"grad.{n}" for n in weights]
                 + [f"step{mf.HPARAMS.steps}.{n}" for n in weights])
        columns = [("torch f32", yardsticks[name])]
        for prec in precisions:
            out = work / f"{name}.{prec}.out.gguf"
            cmd = [str(probe), "model", str(fixture), str(out)] + (["--precision", "double"] if prec == "double" else [])
            try:
                dt = run_probe(cmd, f"{name} ({prec})")
            except CheckFailed as e:
                fails.append(str(e))
                continue
            ours = mf.read_tensors(out)
            step_tol = TOL if prec == "double" else step_tol_float
            errs = {}
            fails += compare(ours, ref, names,
                             lambda n: step_tol if n.startswith("step") else TOL,
                             f"{name} ({prec})", errs)
            columns.append((f"tlm {prec}", errs))
            print(f"  {name} ({prec}): probe ran in {dt:.2f} s")
        print_table(f"{name}: worst relative error per tensor kind (max|ours - ref| / max|ref| vs PyTorch float64)",
                    columns, {"train": f"{TOL:.0e}", "grad": f"{TOL:.0e}",
                              "step10": f"{TOL:.0e} double, {step_tol_float:.0e} float"})
    return fails


# --------------------------------------------------------------------------
# Part 2: layer 0 of the real SmolLM2-135M.

def load_layer0(model: Path) -> tuple[tm.Config, dict[str, np.ndarray], dict]:
    r = gguf.GGUFReader(str(model))
    fields = {k: f.contents() for k, f in r.fields.items()}
    cfg = tm.CONFIGS["smollm2_135m"]
    expect = {"general.architecture": "llama", "llama.embedding_length": cfg.dim,
              "llama.feed_forward_length": cfg.ffn, "llama.attention.head_count": cfg.heads,
              "llama.attention.head_count_kv": cfg.kv_heads, "llama.block_count": cfg.layers}
    for k, v in expect.items():
        if fields.get(k) != v:
            raise CheckFailed(f"{model}: metadata {k} = {fields.get(k)!r}, expected {v!r} (smollm2_135m)")
    for k, v in (("llama.attention.layer_norm_rms_epsilon", cfg.rms_eps), ("llama.rope.freq_base", cfg.rope_theta)):
        if abs(float(fields.get(k, float("nan"))) - v) > 1e-6 * v:
            raise CheckFailed(f"{model}: metadata {k} = {fields.get(k)!r}, expected {v!r} (smollm2_135m)")
    tensors = {t.name: t for t in r.tensors}
    w = {}
    for short, shape in tm.layer_shapes(cfg).items():
        name = f"blk.0.{short}.weight"
        t = tensors.get(name)
        if t is None:
            raise CheckFailed(f"{model}: tensor '{name}' is missing")
        dims = tuple(int(d) for d in reversed(list(t.shape)))
        if dims != shape:
            raise CheckFailed(f"{model}: tensor '{name}' is {list(dims)} as [rows, cols], expected {list(shape)}")
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        w[short] = np.ascontiguousarray(np.asarray(a, dtype=np.float32).reshape(shape))
    keep = {k: fields[k] for k in ("llama.context_length", "llama.vocab_size", "llama.rope.dimension_count")
            if k in fields}
    return cfg, w, keep


def layer_reference(cfg: tm.Config, w: dict[str, np.ndarray], x: np.ndarray, dy: np.ndarray,
                    dtype=torch.float64) -> dict[str, np.ndarray]:
    """y = block(x) and the gradients of sum(y·dy), in float64 (or `dtype`, for the yardstick)."""
    wt = {k: torch.tensor(a, dtype=dtype, requires_grad=True) for k, a in w.items()}
    xt = torch.tensor(x, dtype=dtype, requires_grad=True)
    cos, sin = tm.rope_tables(x.shape[0], cfg.head_dim, cfg.rope_theta, dtype)
    y = tm.block(xt[None], wt, cfg, cos, sin)[0]
    (y * torch.tensor(dy, dtype=dtype)).sum().backward()
    out = {"layer.y": y.detach().numpy(), "grad.x": xt.grad.numpy()}
    for k, t in wt.items():
        out[f"grad.blk.0.{k}.weight"] = t.grad.numpy()
    return out


def write_layer_input(path: Path, cfg: tm.Config, w: dict, x: np.ndarray, dy: np.ndarray, keep: dict) -> None:
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_name("tlm layer check: SmolLM2-135M layer 0")
    wr.add_context_length(int(keep.get("llama.context_length", cfg.context)))
    wr.add_embedding_length(cfg.dim)
    wr.add_block_count(cfg.layers)
    wr.add_feed_forward_length(cfg.ffn)
    wr.add_head_count(cfg.heads)
    wr.add_head_count_kv(cfg.kv_heads)
    wr.add_layer_norm_rms_eps(cfg.rms_eps)
    wr.add_rope_freq_base(cfg.rope_theta)
    wr.add_rope_dimension_count(int(keep.get("llama.rope.dimension_count", cfg.head_dim)))
    wr.add_vocab_size(int(keep.get("llama.vocab_size", cfg.vocab)))
    wr.add_string("tlm.fixture.config", cfg.name)
    wr.add_uint32("tlm.fixture.seq", x.shape[0])
    wr.add_uint32("tlm.fixture.seed", LAYER_SEED)
    wr.add_tensor("layer.x", x)
    wr.add_tensor("layer.dy", dy)
    for k, a in w.items():
        wr.add_tensor(f"blk.0.{k}.weight", a)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def check_layer(probe: Path, model: Path, work: Path, precisions: list[str]) -> list[str]:
    if not model.exists():
        return [f"layer: the model {model} is missing (scripts/fetch-model fetches it)"]
    print(f"\nlayer 0 of {model}: dequantizing, PyTorch float64 forward and backward ...", flush=True)
    try:
        cfg, w, keep = load_layer0(model)
    except CheckFailed as e:
        return [f"layer: {e}"]
    rng = np.random.default_rng(LAYER_SEED)
    x = rng.standard_normal((LAYER_T, cfg.dim)).astype(np.float32)
    dy = rng.standard_normal((LAYER_T, cfg.dim)).astype(np.float32)
    torch.set_num_threads(1)
    ref = layer_reference(cfg, w, x, dy)
    # PyTorch in float32 on the same inputs: what a float computation reaches.
    f32 = layer_reference(cfg, w, x, dy, torch.float32)
    inp = work / "layer.in.gguf"
    write_layer_input(inp, cfg, w, x, dy, keep)
    fails, columns = [], [("torch f32", {n: rel_err(f32[n], ref[n]) for n in ref})]
    outs = run_precisions(probe, "layer", inp, ["--config", cfg.name], lambda prec: work / f"layer.{prec}.out.gguf",
                          "layer", precisions, fails)
    for prec, out in outs.items():
        ours = mf.read_tensors(out)
        errs = {}
        fails += compare(ours, ref, list(ref), lambda n: TOL, f"layer ({prec})", errs)
        columns.append((f"tlm {prec}", errs))
    if len(columns) > 1:
        print_table(f"SmolLM2-135M layer 0, T = {LAYER_T}: relative error vs PyTorch float64", columns,
                    {"layer": f"{TOL:.0e}", "grad": f"{TOL:.0e}"})
    return fails


# --------------------------------------------------------------------------
# Part 3: LoRA over a frozen, quantized base.

# (config, base encoding, seed): between them every trait of the block.
LORA_CASES = [("tiny_gqa", "f32", 11), ("tiny_untied", "q4_1", 12), ("tiny_qwen2", "q8_0", 13),
              ("tiny_traits", "f16", 14)]
LORA_RANK, LORA_ALPHA = 4, 8.0   # scale alpha / rank = 2, so that the scale is exercised
LORA_TOL_DOUBLE, LORA_TOL_FLOAT = 1e-6, 3e-4  # float: see the docstring


def lora_shapes(cfg: tm.Config) -> dict[str, tuple[int, int]]:
    """Adapter tensors by llama.cpp's names, in layer order: A [r, in] then B [out, r]."""
    out = {}
    for l in range(cfg.layers):
        for short, shape in tm.layer_shapes(cfg).items():
            if len(shape) == 2:
                rows, cols = shape
                out[f"blk.{l}.{short}.weight.lora_a"] = (LORA_RANK, cols)
                out[f"blk.{l}.{short}.weight.lora_b"] = (rows, LORA_RANK)
    return out


def make_lora_case(cfg: tm.Config, seed: int) -> tuple[dict, dict, np.ndarray, np.ndarray]:
    """Base weights, adapter (B nonzero, so A's gradient is not zero) and one batch."""
    base = tm.init_weights(cfg, seed)
    rng = np.random.default_rng([seed, 2])
    adapter = {n: (rng.standard_normal(shape) / math.sqrt(shape[1])).astype(np.float32)
               for n, shape in lora_shapes(cfg).items()}
    tokens, targets = mf.make_batch(cfg, seed)
    return base, adapter, tokens, targets


def write_lora_input(path: Path, cfg: tm.Config, base: dict, tokens: np.ndarray, targets: np.ndarray) -> None:
    hp = mf.HPARAMS
    w = gguf.GGUFWriter(str(path), "llama")
    p = "tlm.fixture."
    w.add_string(p + "config", cfg.name)
    for key, val in (("batch", tokens.shape[0]), ("seq", tokens.shape[1]), ("warmup", hp.warmup), ("steps", hp.steps)):
        w.add_uint32(p + key, int(val))
    for key in ("lr", "beta1", "beta2", "eps", "weight_decay", "clip", "min_lr"):
        w.add_float64(p + key, float(getattr(hp, key)))
    for n, a in base.items():
        w.add_tensor("base." + n, a)
    w.add_tensor("train.tokens", tokens.astype(np.float32))
    w.add_tensor("train.targets", targets.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_adapter(path: Path, cfg: tm.Config, adapter: dict) -> None:
    """llama.cpp's LoRA adapter format, written with the gguf package (not tlm's writer)."""
    w = gguf.GGUFWriter(str(path), "qwen2" if cfg.pairing == "half" else "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", LORA_ALPHA)
    for n, a in adapter.items():
        w.add_tensor(n, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_base(path: Path) -> dict[str, np.ndarray]:
    """The probe's base.* tensors in their encoding, dequantized by the gguf package."""
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.name.startswith("base."):
            shape = tuple(int(d) for d in reversed(list(t.shape)))
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            out[t.name[len("base."):]] = np.asarray(a, dtype=np.float64).reshape(shape)
    return out


def read_base_free(path: Path) -> dict[str, np.ndarray]:
    """The probe's results: every F32 tensor but base.*, shaped [rows, cols]."""
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        if not t.name.startswith("base."):
            if t.tensor_type != gguf.GGMLQuantizationType.F32:
                raise CheckFailed(f"{path}: tensor '{t.name}' is {t.tensor_type.name}, expected F32")
            out[t.name] = np.array(t.data, dtype=np.float32).reshape(tuple(int(d) for d in reversed(list(t.shape))))
    return out


def lora_reference(cfg: tm.Config, base: dict, adapter: dict, tokens: np.ndarray, targets: np.ndarray,
                   dtype) -> dict[str, np.ndarray]:
    """First loss and adapter gradients, then 10 AdamW steps on the adapter alone, in `dtype`."""
    hp = mf.HPARAMS
    params = {n: torch.tensor(a, dtype=dtype) for n, a in base.items()}          # frozen
    ad = tm.make_params(adapter, dtype)
    opt = tm.make_optimizer(ad, hp)
    tok, tgt = torch.from_numpy(tokens), torch.from_numpy(targets)
    scale = LORA_ALPHA / LORA_RANK
    out, losses = {}, []
    for t in range(1, hp.steps + 1):
        opt.zero_grad(set_to_none=True)
        loss = tm.loss_fn(params, cfg, tok, tgt, ad, scale)
        loss.backward()
        losses.append(float(loss.detach()))
        if t == 1:
            out["train.loss"] = np.array([losses[0]])
            out.update({"grad." + n: p.grad.detach().numpy().copy() for n, p in ad.items()})
        torch.nn.utils.clip_grad_norm_(list(ad.values()), hp.clip)
        for g in opt.param_groups:
            g["lr"] = tm.lr_at(t, hp)
        opt.step()
    out["train.losses"] = np.array(losses)
    out.update({f"step{hp.steps}." + n: p.detach().numpy().copy() for n, p in ad.items()})
    return out


def check_lora(probe: Path, work: Path, precisions: list[str], step_tol_float: float) -> list[str]:
    fails = []
    torch.set_num_threads(1)
    print("\nLoRA: rank 4 on all seven matrices, alpha 8, over a frozen base quantized and mapped by tlm ...",
          flush=True)
    for name, enc, seed in LORA_CASES:
        cfg = tm.CONFIGS[name]
        base, adapter, tokens, targets = make_lora_case(cfg, seed)
        inp, ada = work / f"lora.{name}.in.gguf", work / f"lora.{name}.adapter.gguf"
        write_lora_input(inp, cfg, base, tokens, targets)
        write_adapter(ada, cfg, adapter)
        label = f"lora {name} over {enc}"
        outs = run_precisions(probe, "lora", inp, [ada, "--encoding", enc],
                              lambda prec: work / f"lora.{name}.{prec}.out.gguf", label, precisions, fails)
        if not outs:
            continue
        # The base the products used, as the gguf package decodes the probe's bytes; it
        # must be the drawn base up to the encoding's rounding, or the case tests nothing.
        used = read_base(next(iter(outs.values())))
        if sorted(used) != sorted(base):
            fails.append(f"{label}: the probe's base.* tensors are not the config's weights")
            continue
        drift = max(rel_err(used[n], base[n]) for n in base)
        limit = {"f32": 0.0, "f16": 1e-3, "q8_0": 1e-2, "q4_1": 0.2}[enc]
        if not drift <= limit:
            fails.append(f"{label}: the quantized base is {drift:.1e} from the drawn one (limit {limit:.0e})")
        ref = lora_reference(cfg, used, adapter, tokens, targets, torch.float64)
        f32 = lora_reference(cfg, used, adapter, tokens, targets, torch.float32)
        columns = [("torch f32", {n: rel_err(np.asarray(f32[n]), np.asarray(ref[n])) for n in ref})]
        for prec, out in outs.items():
            ours = read_base_free(out)
            tol = LORA_TOL_DOUBLE if prec == "double" else LORA_TOL_FLOAT
            step_tol = LORA_TOL_DOUBLE if prec == "double" else step_tol_float
            errs = {}
            fails += compare(ours, ref, list(ref), lambda n: step_tol if n.startswith("step") else tol,
                             f"{label} ({prec})", errs)
            columns.append((f"tlm {prec}", errs))
        print_table(f"{label} (base {drift:.1e} from F32): worst relative error vs PyTorch float64", columns,
                    {"train": f"{LORA_TOL_DOUBLE:.0e} double, {LORA_TOL_FLOAT:.0e} float",
                     "grad": f"{LORA_TOL_DOUBLE:.0e} double, {LORA_TOL_FLOAT:.0e} float",
                     "step10": f"{LORA_TOL_DOUBLE:.0e} double, {step_tol_float:.0e} float"})
    return fails


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, help="the CMake build directory")
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--part", choices=("all", "tiny", "layer", "lora"), default="all")
    ap.add_argument("--precision", choices=("both", "float", "double"), default="both")
    ap.add_argument("--probe", help="the probe binary (default BUILD/tests/train_probe)")
    ap.add_argument("--step-tol-float", type=float, default=2e-4,
                    help="limit on the weights after 10 steps in float (default 2e-4; see above)")
    ap.add_argument("--keep", help="write the temporary files here and keep them")
    args = ap.parse_args(argv)

    probe = Path(args.probe) if args.probe else Path(args.build) / "tests" / "train_probe"
    if not probe.exists():
        print(f"FAIL: the probe {probe} is missing (build the target train_probe)", file=sys.stderr)
        return 1
    precisions = ["float", "double"] if args.precision == "both" else [args.precision]
    if args.keep:
        work = Path(args.keep)
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="tlm-train-check-"))
    t0 = time.perf_counter()
    fails = []
    try:
        if args.part in ("all", "tiny"):
            fails += check_tiny(probe, work, precisions, args.step_tol_float)
        if args.part in ("all", "layer"):
            fails += check_layer(probe, Path(args.model), work, precisions)
        if args.part in ("all", "lora"):
            fails += check_lora(probe, work, precisions, args.step_tol_float)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{time.perf_counter() - t0:.1f} s")
    if fails:
        print(f"\n{len(fails)} failure(s):", file=sys.stderr)
        for f in fails:
            print("FAIL: " + f, file=sys.stderr)
        return 1
    print("all training checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
