#!/usr/bin/env python3
"""Load time and peak RSS: tlm (bench/load) next to llama.cpp (llama-cpp-python), in one run.

    python bench/load_vs_llamacpp.py --build BUILD --model MODEL.gguf [MORE.gguf ...] [--repeat N]
                                     [--n-ctx 512] [--out bench/results/load.md]

Larger shapes can be measured on random-weight files from examples/synth_model.

tlm: `load MODEL --json` (open = mmap + parse + validate + tensor infos; bind adds the
typed binding to the config; touch adds faulting in every weight page).
llama.cpp: each repeat is a fresh Python process that times
`Llama(MODEL, n_ctx=N, verbose=False)` (mmap on, vocab_only off: model, vocabulary and
a context with its KV cache) and reports its own peak RSS, and the RSS of the same
process just before the call (Python + llama_cpp imported) as its baseline.
Both sides run with a warm page cache (one untimed open first).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from programs import built  # noqa: E402

CHILD = r"""
import resource, sys, time, json
from llama_cpp import Llama
path, n_ctx = sys.argv[1], int(sys.argv[2])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
m = Llama(path, n_ctx=n_ctx, verbose=False, vocab_only=False)
ms = (time.perf_counter() - t0) * 1000
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"ms": ms, "base_kib": base, "peak_kib": peak, "n_vocab": m.n_vocab()}))
"""


def lscpu():
    info = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            info[k.strip()] = v.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return info.get("Model name", platform.processor() or "unknown"), info.get("CPU(s)", str(os.cpu_count()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, type=Path)
    ap.add_argument("--model", required=True, type=Path, nargs="+")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "load.md")
    args = ap.parse_args()
    load = built(args.build, "load")
    cpu, cores = lscpu()
    mib = lambda kib: kib / 1024
    lines = [
        "# Load time: tlm vs llama.cpp",
        "",
        f"- Date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- CPU: {cpu}, {cores} logical CPUs (shared with other jobs while measured)",
        f"- Page cache warm on both sides (one untimed open first). tlm: {max(args.repeat, 5)} runs in one process;",
        f"  llama.cpp: {args.repeat} fresh processes, each timing `Llama(path, n_ctx={args.n_ctx}, verbose=False)`.",
        "",
        "| model | what | min ms | median ms | peak RSS MiB |",
        "|---|---|---:|---:|---:|",
    ]
    for model in args.model:
        if not model.exists():
            raise SystemExit(f"{model} is missing; run scripts/fetch-model (or examples/synth_model for synthetic files)")
        ours = json.loads(subprocess.run([str(load), str(model), "--repeat", str(max(args.repeat, 5)), "--json"],
                                         capture_output=True, text=True, check=True).stdout)
        runs = []
        for i in range(args.repeat + 1):  # the first run warms the page cache and is not counted
            r = subprocess.run([sys.executable, "-c", CHILD, str(model), str(args.n_ctx)], capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"llama-cpp-python failed on {model}:\n{r.stderr}")
            if i > 0:
                runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
        ll_ms = sorted(x["ms"] for x in runs)
        ll_peak = max(x["peak_kib"] for x in runs) / 1024
        ll_base = statistics.median(x["base_kib"] for x in runs) / 1024
        label = f"`{model.name}` ({ours['bytes'] / 2**20:.0f} MiB, {ours['tensors']} tensors, `{ours['config']}`)"
        lines += [
            f"| {label} | tlm open: mmap + parse + validate header, metadata, tensor infos | {ours['open_min_ms']:.2f} | {ours['open_median_ms']:.2f} | |",
            f"| | tlm open + bind<C> (typed check of every tensor, views bound) | {ours['bind_min_ms']:.2f} | {ours['bind_median_ms']:.2f} | |",
            f"| | tlm open + bind + fault in every weight page | {ours['touch_min_ms']:.2f} | {ours['touch_median_ms']:.2f} | "
            f"{mib(ours['rss_peak_kib']):.1f} |",
            f"| | llama.cpp `Llama(...)` (model + vocab + context) | {ll_ms[0]:.2f} | {statistics.median(ll_ms):.2f} | "
            f"{ll_peak:.1f} (of which Python + llama_cpp before the call {ll_base:.1f}) |",
        ]
    lines += [
        "",
        "Notes:",
        "- tlm's open is lazy: weights stay in the page cache and are faulted in on first use; the third row adds that cost so",
        "  it can be compared with llama.cpp, which also maps the file but builds its vocabulary, graph and KV cache at load.",
        "- llama.cpp's RSS includes the Python interpreter; subtract the baseline for llama.cpp's own share.",
        "- Files named `synth_*` are random-weight files of the real shapes written by `examples/synth_model`.",
        "- Reproduce: `python bench/load_vs_llamacpp.py --build BUILD --model MODEL [MORE ...]`.",
    ]
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
