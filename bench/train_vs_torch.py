#!/usr/bin/env python3
"""Training step time of tlm next to PyTorch 2.x, in one run, alternating, so that a noisy
shared machine affects both alike.

One step = forward, mean cross-entropy, backward, gradient clipping and AdamW, on a batch
of B sequences of T tokens, for tiny_train (batch 4, seq 16) and smollm2_135m (batch 4,
seq 128), at 1 and 2 threads. Each configuration runs in a process of its own, so the
peak RSS is that configuration's.

    bench/setup-torch2                       # once: PyPI's torch in bench/.venv-torch2
    python3 bench/train_vs_torch.py --build build [--rounds 2] [--only tiny_train] [--threads 1,2] [--write]

PyTorch's side (bench/.venv-torch2/bin/python, torch 2.15.0, MKL and oneDNN) gets a fair,
usual setup: N(0, 0.02) initialisation with unit norm gains, tied embeddings,
torch.set_flush_denormal(True) (without it tiny gradients turn denormal and every matmul
slows down), torch.set_num_threads(N), F.scaled_dot_product_attention (causal, GQA),
F.rms_norm, F.cross_entropy, clip_grad_norm_, AdamW with fused=True (its fastest CPU
path); warm-up steps, then the median of the measured steps. No torch.compile.

tlm's side runs `BUILD/bench/train --config NAME --batch B --seq T --threads N --steps S`,
which prints one JSON line {"ms_per_step": ..., "tokens_per_s": ..., "peak_rss_mb": ...};
when that binary is missing, tlm's side is left out with a message saying so.

--write puts a markdown table (with the tlm/PyTorch time ratios) in
bench/results/train-<cpu>.md. `--check-model` verifies that the benchmark's PyTorch model
computes the same loss and gradients as tests/reference/torch_model.py.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from programs import built  # noqa: E402

TORCH_PY = REPO / "bench" / ".venv-torch2" / "bin" / "python"

# name: (kv_heads, group, half_head, ffn, layers, vocab, rms_eps, rope_theta), all tied.
CONFIGS = {
    "tiny_train": (2, 2, 8, 256, 2, 512, 1e-5, 10000.0),
    "smollm2_135m": (3, 3, 32, 1536, 30, 49152, 1e-5, 100000.0),
}
# name: (batch, seq, warm-up steps, measured steps per round)
SHAPES = {
    "tiny_train": (4, 16, 5, 30),
    "smollm2_135m": (4, 128, 2, 5),
}
ADAMW = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
CLIP = 1.0


# --------------------------------------------------------------------------
# The child: one configuration of PyTorch, in its own process.

def torch_child(config: str, batch: int, seq: int, threads: int, warmup: int, steps: int, seed: int,
                dtype_name: str = "float32", check: bool = False, lora: int = 0) -> dict:
    """One configuration's step time. With lora = r > 0 (bench/lora_vs_torch.py): the weights
    are frozen and a rank-r adapter on q, k, v, o (alpha 2r, B = 0 as PEFT starts) trains."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    torch.manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    kvh, group, half, ffn, layers, vocab, eps, theta = CONFIGS[config]
    H, E = kvh * group, 2 * half
    D, K = H * E, kvh * E

    def param(*shape, std=0.02):
        return torch.nn.Parameter(torch.randn(*shape, dtype=dtype) * std)

    def ones(n):
        return torch.nn.Parameter(torch.ones(n, dtype=dtype))

    P = {"token_embd.weight": param(vocab, D)}
    for l in range(layers):
        b = f"blk.{l}."
        P.update({b + "attn_norm.weight": ones(D), b + "attn_q.weight": param(D, D),
                  b + "attn_k.weight": param(K, D), b + "attn_v.weight": param(K, D),
                  b + "attn_output.weight": param(D, D), b + "ffn_norm.weight": ones(D),
                  b + "ffn_gate.weight": param(ffn, D), b + "ffn_up.weight": param(ffn, D),
                  b + "ffn_down.weight": param(D, ffn)})
    P["output_norm.weight"] = ones(D)
    adapter = {}
    if lora:
        for p in P.values():
            p.requires_grad_(False)
        for l in range(layers):
            for short, rows in (("attn_q", D), ("attn_k", K), ("attn_v", K), ("attn_output", D)):
                cols = D
                name = f"blk.{l}.{short}.weight"
                adapter[name] = (torch.nn.Parameter((torch.rand(lora, cols, dtype=dtype) * 2 - 1) / cols ** 0.5),
                                 torch.nn.Parameter(torch.zeros(rows, lora, dtype=dtype)))

    def lin(x, name):
        y = F.linear(x, P[name])
        if name in adapter:
            a, b = adapter[name]
            y = y + 2.0 * F.linear(F.linear(x, a), b)
        return y

    i = torch.arange(half, dtype=torch.float64)
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * theta ** (-2.0 * i / E)[None, :]
    cos, sin = torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)            # [T, E/2]

    def rope(x):                                # x [B, heads, T, E], adjacent pairs
        u, v = x[..., 0::2], x[..., 1::2]
        return torch.stack((u * cos - v * sin, u * sin + v * cos), dim=-1).flatten(-2)

    def loss_of(tokens, targets):
        B, T = tokens.shape
        x = F.embedding(tokens, P["token_embd.weight"])
        for l in range(layers):
            b = f"blk.{l}."
            n = F.rms_norm(x, (D,), P[b + "attn_norm.weight"], eps)
            q = rope(lin(n, b + "attn_q.weight").view(B, T, H, E).transpose(1, 2))
            k = rope(lin(n, b + "attn_k.weight").view(B, T, kvh, E).transpose(1, 2))
            v = lin(n, b + "attn_v.weight").view(B, T, kvh, E).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + lin(a.transpose(1, 2).reshape(B, T, D), b + "attn_output.weight")
            n = F.rms_norm(x, (D,), P[b + "ffn_norm.weight"], eps)
            h = F.silu(F.linear(n, P[b + "ffn_gate.weight"])) * F.linear(n, P[b + "ffn_up.weight"])
            x = x + F.linear(h, P[b + "ffn_down.weight"])
        x = F.rms_norm(x, (D,), P["output_norm.weight"], eps)
        logits = F.linear(x, P["token_embd.weight"])
        return F.cross_entropy(logits.view(-1, vocab), targets.view(-1), ignore_index=-1)

    g = torch.Generator().manual_seed(seed + 1)
    text = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    tokens, targets = text[:, :-1].contiguous(), text[:, 1:].contiguous()

    if check:
        return {"P": P, "loss_of": loss_of, "tokens": tokens, "targets": targets}

    params = [p for pair in adapter.values() for p in pair] if lora else list(P.values())
    decay = [p for p in params if p.dim() == 2]
    no_decay = [p for p in params if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}] if no_decay
                            else [{"params": decay}], fused=True, **ADAMW)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_of(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        return float(loss)

    first_loss = None
    for _ in range(warmup):
        l = step()
        first_loss = l if first_loss is None else first_loss
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        last_loss = step()
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1e3
    return {"ms_per_step": ms, "tokens_per_s": batch * seq / (ms / 1e3),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "step_ms": [t * 1e3 for t in times], "first_loss": first_loss, "last_loss": last_loss,
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "params": sum(p.numel() for p in params)}


def check_model() -> int:
    """The benchmark's model (float64) against tests/reference/torch_model.py on tiny_train."""
    import torch
    sys.path.insert(0, str(REPO / "tests" / "reference"))
    import torch_model as tm
    torch.set_num_threads(1)
    c = torch_child("tiny_train", 2, 16, 1, 0, 0, seed=3, dtype_name="float64", check=True)
    cfg = tm.CONFIGS["tiny_train"]
    if CONFIGS["tiny_train"] != (cfg.kv_heads, cfg.group, cfg.half_head, cfg.ffn, cfg.layers, cfg.vocab,
                                 cfg.rms_eps, cfg.rope_theta):
        print("check-model: tiny_train differs between the benchmark and torch_model.py")
        return 1
    # Give the norm gains some spread so that they matter.
    with torch.no_grad():
        for n, p in c["P"].items():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, dtype=p.dtype))
    c["targets"][0, :3] = -1
    ours = c["loss_of"](c["tokens"], c["targets"])
    ours.backward()
    ref_params = {n: p.detach().clone().requires_grad_(True) for n, p in c["P"].items()}
    ref = tm.loss_fn(ref_params, cfg, c["tokens"], c["targets"])
    ref.backward()
    worst = max(float((c["P"][n].grad - p.grad).abs().max() / p.grad.abs().max()) for n, p in ref_params.items())
    ours, ref = float(ours.detach()), float(ref.detach())
    dl = abs(ours - ref) / abs(ref)
    ok = dl < 1e-12 and worst < 1e-10
    print(f"check-model: loss {ours:.6f} vs reference {ref:.6f} ({dl:.1e}); worst gradient {worst:.1e}: "
          + ("ok" if ok else "MISMATCH"))
    return 0 if ok else 1


# --------------------------------------------------------------------------
# The parent: alternate the two engines, collect, print, write.

def run_torch(torch_py: Path, config, batch, seq, threads, warmup, steps, seed, lora: int = 0) -> dict:
    cmd = [str(torch_py), str(Path(__file__).resolve()), "--child", config, str(batch), str(seq), str(threads),
           str(warmup), str(steps), str(seed), str(lora)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"PyTorch child failed ({' '.join(cmd)}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_tlm(binary: Path, config, batch, seq, threads, steps) -> dict:
    cmd = [str(binary), "--config", config, "--batch", str(batch), "--seq", str(seq), "--threads", str(threads),
           "--steps", str(steps)]
    return json_line(cmd)


def json_line(cmd: list[str], keys=("ms_per_step", "tokens_per_s", "peak_rss_mb")) -> dict:
    """The last JSON line a benchmark program prints, with these keys, or exit naming the failure."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"tlm failed ({' '.join(cmd)}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    lines = [l for l in p.stdout.strip().splitlines() if l.lstrip().startswith("{")]
    if not lines:
        sys.exit(f"tlm printed no JSON line ({' '.join(cmd)}):\n{p.stdout[-2000:]}")
    r = json.loads(lines[-1])
    for k in keys:
        if k not in r:
            sys.exit(f"tlm's JSON line has no '{k}': {lines[-1]}")
    return r


def machine() -> tuple[str, str, str]:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
    simd = " ".join(f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                                "avx512_bf16", "avx_vnni", "amx_tile") if f in flags)
    slug = re.sub(r"[^a-z0-9]+", "-", cpu.lower()).strip("-") or "cpu"
    return cpu, simd, slug


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        a = sys.argv[2:]
        r = torch_child(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4]), int(a[5]), int(a[6]),
                        lora=int(a[7]) if len(a) > 7 else 0)
        print(json.dumps(r))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(REPO / "build"), help="the CMake build directory (for bench/train)")
    ap.add_argument("--torch-python", default=str(TORCH_PY), help="the python of the torch 2.x venv")
    ap.add_argument("--only", action="append", choices=list(CONFIGS), help="only these configs (default: all)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per configuration")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", action="store_true", help="write bench/results/train-<cpu>.md")
    ap.add_argument("--check-model", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    torch_py = Path(args.torch_python)
    if args.check_model:
        if Path(sys.prefix).resolve() != torch_py.parent.parent.resolve():
            if not torch_py.exists():
                sys.exit(f"{torch_py} is missing: run bench/setup-torch2 first")
            return subprocess.call([str(torch_py), str(Path(__file__).resolve()), "--check-model"])
        return check_model()
    if not torch_py.exists():
        sys.exit(f"{torch_py} is missing: run bench/setup-torch2 first")
    tlm_bin = built(args.build, "train")
    threads = [int(t) for t in args.threads.split(",")]
    configs = args.only or list(CONFIGS)

    load_start = os.getloadavg()
    results = {}          # (engine, config, threads) -> {"ms": [...], "rss": max, ...}
    for rnd in range(args.rounds):
        for config in configs:
            batch, seq, warmup, steps = SHAPES[config]
            for n in threads:
                engines = ["torch", "tlm"]
                if rnd % 2:
                    engines.reverse()
                for eng in engines:
                    t0 = time.perf_counter()
                    if eng == "torch":
                        r = run_torch(torch_py, config, batch, seq, n, warmup, steps, args.seed)
                    else:
                        r = run_tlm(tlm_bin, config, batch, seq, n, steps)
                    slot = results.setdefault((eng, config, n), {"ms": [], "rss": 0.0, "extra": r})
                    slot["ms"].append(r["ms_per_step"])
                    slot["rss"] = max(slot["rss"], r["peak_rss_mb"])
                    print(f"round {rnd + 1}/{args.rounds} {eng:>5} {config:<13} B={batch} T={seq} threads={n}: "
                          f"{r['ms_per_step']:9.2f} ms/step, {r['tokens_per_s']:9.1f} tokens/s, "
                          f"peak RSS {r['peak_rss_mb']:.0f} MiB ({time.perf_counter() - t0:.0f} s)", flush=True)

    cpu, simd, slug = machine()
    torch_version = next((v["extra"].get("torch") for k, v in results.items() if k[0] == "torch"), "?")
    load = os.getloadavg()
    lines = [
        "# Training step: tlm vs PyTorch",
        "",
        f"- Machine: {cpu}, {os.cpu_count()} CPUs ({simd}); load average {load_start[0]:.2f} at the start, "
        f"{load[0]:.2f} at the end; shared and noisy.",
        "- Step: forward, mean cross-entropy, backward, clip to global norm 1.0, AdamW; float32; "
        "tied embeddings; random tokens, next-token targets.",
        f"- PyTorch {torch_version} (PyPI, bench/.venv-torch2; MKL, oneDNN): N(0, 0.02) init, "
        "`torch.set_flush_denormal(True)`, `torch.set_num_threads(N)`, `F.scaled_dot_product_attention` "
        "(causal, GQA), `F.rms_norm`, `F.cross_entropy`, `AdamW(fused=True)`, no `torch.compile`; its peak RSS "
        "includes the Python interpreter and torch's libraries.",
        f"- {args.rounds} alternating round(s), each configuration in a process of its own; "
        + ", ".join(f"{c}: batch {SHAPES[c][0]}, seq {SHAPES[c][1]}, {SHAPES[c][2]} warm-up + {SHAPES[c][3]} "
                    f"measured steps per round" for c in configs)
        + "; a round's figure is the median of its measured steps (tlm: bench/train's own figure); the table "
        "shows the best round, the least disturbed by the machine's other work, and every round's figure.",
        "- tlm: `bench/train --config C --batch B --seq T --threads N --steps S` (its own JSON line).",
    ]
    if max(load_start[0], load[0]) > (os.cpu_count() or 1):
        lines.append(f"- Warning: the machine was oversubscribed (load average above its {os.cpu_count()} CPUs): "
                     "every figure is slower than on a quiet machine, the 2-thread ones most of all (a thread "
                     "that loses its core stalls the other at every barrier). Compare ratios from one run, not "
                     "absolute times across runs.")
    lines += [
        "",
        "| config | threads | engine | ms/step (best round) | tokens/s | peak RSS MiB | ms/step of each round |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for config in configs:
        batch, seq = SHAPES[config][:2]
        for n in threads:
            row = {}
            for eng in ("torch", "tlm"):
                s = results.get((eng, config, n))
                if not s:
                    continue
                ms = min(s["ms"])
                row[eng] = ms
                name = "PyTorch" if eng == "torch" else "tlm"
                each = ", ".join(f"{m:.2f}" for m in s["ms"])
                lines.append(f"| {config} | {n} | {name} | {ms:.2f} | {batch * seq / (ms / 1e3):.1f} | {s['rss']:.0f} "
                             f"| {each} |")
            if "tlm" in row:
                ratios.append(f"{config} at {n} thread(s): tlm / PyTorch time ratio = {row['tlm'] / row['torch']:.2f} "
                              f"(speed-up {row['torch'] / row['tlm']:.2f}x)")
    lines.append("")
    lines += [r + "\n" for r in ratios] if ratios else ["tlm's side was not measured: no ratios yet.", ""]
    text = "\n".join(lines).rstrip() + "\n"
    print("\n" + text)
    if args.write:
        out = REPO / "bench" / "results" / f"train-{slug}.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
