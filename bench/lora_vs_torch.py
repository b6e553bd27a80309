#!/usr/bin/env python3
"""LoRA fine-tuning: step time next to PyTorch 2.x at 135M, and peak RSS at the 1B class.

1. Speed (issue 19's goal: at least 1.5x PyTorch's step speed at 135M). One step = forward,
   cross-entropy, backward into a rank-16 adapter on q, k, v, o (alpha 32), clipping and
   AdamW on the adapter; SmolLM2-135M, batch 4, seq 512, at 1 and 2 threads; engines
   alternate within a round, each configuration in a process of its own:
   - PyTorch (bench/.venv-torch2, as bench/train_vs_torch.py sets it up, with the same
     adapter): an F32 base, since torch has no Q4 matrix product on CPU;
   - tlm over the same F32 base (`bench/lora --base f32`: the file dequantized first);
   - tlm over the file's Q4_1 base mapped read-only, as `train --lora` runs
     (`bench/lora --base mapped`).
2. Memory (goal: the 1B-class LoRA run in 4 GB of peak RSS, the 1.7B in 6 GB): tlm alone,
   rank 16 on q, k, v, o, batch 1, seq 512, with --recompute, over a 1.7B-shaped Q4_1 file
   and a llama32_1b-shaped Q4_K_M file (synthetic files of the exact shapes:
   `synth_model`, then `quantize ... q4_k_m` for the second). Beside them full
   fine-tuning's peak RSS: measured at 135M (`bench/train --model`, batch 4, seq 512),
   and for the large shapes the weights, gradients and two AdamW moments it must hold
   (16 bytes a parameter), computed, since they exceed this machine's memory or come near.

    bench/setup-torch2     # once
    python3 bench/lora_vs_torch.py --build build --model models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        [--big smollm2_1_7b=FILE --big llama32_1b=FILE] [--rounds 2] [--threads 1,2] [--write]

--write puts the tables in bench/results/lora-<cpu>.md.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_vs_torch as tvt  # noqa: E402
from programs import built  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RANK = 16
BATCH, SEQ, WARMUP, STEPS = 4, 512, 1, 3


def parameters(build: Path, config: str) -> int:
    """The config's parameter count, as `describe CONFIG` prints it."""
    out = subprocess.run([str(build / "examples" / "describe"), config], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        words = line.split()
        if "parameters" in words:
            return int(words[words.index("parameters") - 1])
    sys.exit(f"describe {config} printed no parameter count:\n{out}")


def tlm_lora(build: Path, config: str, model: str, base: str, batch: int, seq: int, threads: int, steps: int,
             recompute: bool = False) -> dict:
    cmd = [str(build / "bench" / "lora"), "--config", config, "--model", model, "--base", base, "--batch", str(batch),
           "--seq", str(seq), "--threads", str(threads), "--steps", str(steps)] + (["--recompute"] if recompute else [])
    return tvt.json_line(cmd)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--torch-python", default=str(tvt.TORCH_PY))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--big", action="append", default=[], metavar="CONFIG=FILE",
                    help="a large-shape file for the memory table (smollm2_1_7b=..., llama32_1b=...)")
    ap.add_argument("--skip-speed", action="store_true", help="only the memory table")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    build = Path(args.build)
    for prog in ("lora", "train"):
        built(build, prog)
    torch_py = Path(args.torch_python)
    if not args.skip_speed and not torch_py.exists():
        sys.exit(f"{torch_py} is missing: run bench/setup-torch2 first")

    cpu, simd, slug = tvt.machine()
    load_start = os.getloadavg()
    lines = [f"# LoRA fine-tuning: tlm vs PyTorch, and peak memory", "",
             f"- Machine: {cpu}, {os.cpu_count()} CPUs ({simd}); shared and noisy."]
    threads = [int(t) for t in args.threads.split(",")]

    if not args.skip_speed:
        results = {}
        engines = ["torch", "tlm f32", "tlm q4_1"]
        for rnd in range(args.rounds):
            for n in threads:
                order = engines if rnd % 2 == 0 else engines[::-1]
                for eng in order:
                    t0 = time.perf_counter()
                    if eng == "torch":
                        r = tvt.run_torch(torch_py, "smollm2_135m", BATCH, SEQ, n, WARMUP, STEPS, 0, lora=RANK)
                    else:
                        r = tlm_lora(build, "smollm2_135m", args.model, "f32" if eng == "tlm f32" else "mapped",
                                     BATCH, SEQ, n, STEPS)
                    slot = results.setdefault((eng, n), {"ms": [], "rss": 0.0, "extra": r})
                    slot["ms"].append(r["ms_per_step"])
                    slot["rss"] = max(slot["rss"], r["peak_rss_mb"])
                    print(f"round {rnd + 1}/{args.rounds} {eng:>8} threads={n}: {r['ms_per_step']:9.1f} ms/step, "
                          f"peak RSS {r['peak_rss_mb']:.0f} MiB ({time.perf_counter() - t0:.0f} s)", flush=True)
        load = os.getloadavg()
        torch_version = results[("torch", threads[0])]["extra"].get("torch", "?")
        lines += [
            f"- Load average {load_start[0]:.2f} at the start, {load[0]:.2f} at the end of the speed runs.",
            f"- Step: SmolLM2-135M, batch {BATCH}, seq {SEQ}; forward, cross-entropy, backward into a rank-{RANK} "
            "adapter on q, k, v, o (alpha 32), clip to norm 1, AdamW on the adapter; float32 arithmetic; random tokens.",
            f"- PyTorch {torch_version} (PyPI, MKL, oneDNN), set up as in bench/train_vs_torch.py, over an F32 base "
            "(torch has no Q4 matrix product on CPU); its RSS includes Python and torch's libraries.",
            "- tlm f32: `bench/lora --base f32`, the file dequantized into owned f32 weights (the same arithmetic); "
            "tlm q4_1: `bench/lora --base mapped`, the Q4_1 file mapped read-only, as `train --lora` runs.",
            f"- {args.rounds} alternating round(s), {WARMUP} warm-up + {STEPS} measured steps each; the median step of a "
            "round, the best round shown, every round listed.",
            "", "| threads | engine | ms/step (best) | tokens/s | peak RSS MiB | each round |", "|---|---|---|---|---|---|"]
        ratios = []
        for n in threads:
            best = {}
            for eng in engines:
                s = results[(eng, n)]
                best[eng] = min(s["ms"])
                lines.append(f"| {n} | {eng} | {best[eng]:.0f} | {BATCH * SEQ / (best[eng] / 1e3):.0f} | {s['rss']:.0f} | "
                             + ", ".join(f"{m:.0f}" for m in s["ms"]) + " |")
            ratios.append(f"- {n} thread(s): PyTorch / tlm f32 = {best['torch'] / best['tlm f32']:.2f}x, "
                          f"PyTorch / tlm q4_1 = {best['torch'] / best['tlm q4_1']:.2f}x (goal 1.5x)")
        lines += [""] + ratios

    if args.big:
        lines += ["", f"## Peak RSS at the 1B class: rank {RANK} on q, k, v, o, batch 1, seq {SEQ}, --recompute, 2 threads", "",
                  "| shape | base file | LoRA peak RSS MiB | after mapping MiB | activations kept MiB | ms/step | "
                  "full fine-tuning |", "|---|---|---|---|---|---|---|"]
        full = tlm_lora_full_135m(build, args.model)
        lines.append(f"| smollm2_135m | Q4_1 (real) | {tlm_lora(build, 'smollm2_135m', args.model, 'mapped', 1, SEQ, 2, 1, True)['peak_rss_mb']:.0f} "
                     f"| - | - | - | {full['peak_rss_mb']:.0f} MiB measured (`bench/train --model`, batch 1, seq {SEQ}) |")
        for item in args.big:
            config, _, path = item.partition("=")
            r = tlm_lora(build, config, path, "mapped", 1, SEQ, 2, 1, True)
            enc = "Q4_K_M" if "q4_k_m" in path.lower() else "Q4_1" if "q4_1" in path.lower() else "?"
            need = parameters(build, config) * 16 / 2**20
            lines.append(f"| {config} | {enc} ({os.path.getsize(path) / 2**20:.0f} MiB) | {r['peak_rss_mb']:.0f} | "
                         f"{r['rss_after_load_mb']:.0f} | {r['activation_mb']:.0f} | {r['ms_per_step']:.0f} | "
                         f"{need:.0f} MiB computed (16 bytes a parameter: weights, gradients, 2 moments) |")
            print(lines[-1], flush=True)
        lines += ["", "Goal: 1B class ≤ 4096 MiB, 1.7B ≤ 6144 MiB."]

    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.write:
        out = REPO / "bench" / "results" / f"lora-{slug}.md"
        out.write_text(text)
        print(f"wrote {out}")
    return 0


def tlm_lora_full_135m(build: Path, model: str) -> dict:
    return tvt.json_line([str(build / "bench" / "train"), "--config", "smollm2_135m", "--model", model, "--batch", "1",
                     "--seq", str(SEQ), "--threads", "2", "--steps", "1"])


if __name__ == "__main__":
    sys.exit(main())
