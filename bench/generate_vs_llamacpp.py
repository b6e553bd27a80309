#!/usr/bin/env python3
"""Generation speed of tlm next to llama.cpp (llama-cpp-python), on the same file,
in one run, interleaved, so a noisy shared machine affects both alike.

Reports decode ms/token at 1 and 2 threads, prefill tokens/s on a 64-token prompt,
load + first token wall time, and peak RSS; writes bench/results/generate.md.

  .venv/bin/python bench/generate_vs_llamacpp.py --build build [--model GGUF] [--rounds 3]
  # larger shapes, on synthetic files (examples/synth_model):
  .venv/bin/python bench/generate_vs_llamacpp.py --model build/synthetic-smollm2_360m.gguf --config smollm2_360m
"""
import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time

LLAMA_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from llama_cpp import Llama
path, threads, prompt, n = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
t_import = time.perf_counter()
llm = Llama(model_path=path, n_ctx=256, n_threads=threads, n_threads_batch=threads, n_batch=256, verbose=False)
t_load = time.perf_counter()
llm.eval(prompt)
t_prefill = time.perf_counter()
import numpy as np
tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
t_first = time.perf_counter()
times = []
for _ in range(n):
    s = time.perf_counter()
    llm.eval([tok])
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    times.append(time.perf_counter() - s)
print(json.dumps({
    "load_ms": (t_load - t_import) * 1e3,
    "prefill_tps": len(prompt) / (t_prefill - t_load),
    "first_token_ms": (t_first - t_import) * 1e3,
    "decode_ms": sorted(times)[len(times) // 2] * 1e3,
    "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def child_rss_mib(before):
    return (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024


def run_tlm(build, model, config, threads, prompt, n):
    cmd = [os.path.join(build, "examples", "generate"), "--model", model, "--config", config, "--threads", str(threads),
           "--token-ids", ",".join(map(str, prompt)), "-n", str(n + 1), "--timing"]
    # A fresh process per run so its peak RSS is its own: measured with /usr/bin/time if present.
    wrapped = ["/usr/bin/time", "-f", "MAXRSS %M"] + cmd if os.path.exists("/usr/bin/time") else cmd
    p = subprocess.run(wrapped, capture_output=True, text=True, check=True)
    m = re.search(r"load ([\d.]+) ms, tokenizer ([\d.]+) ms \| prefill (\d+) tokens in ([\d.]+) ms \(([\d.]+) tokens/s\) \| decode (\d+) tokens, ([\d.]+) ms/token", p.stderr)
    if not m:
        sys.exit("cannot parse generate --timing output:\n" + p.stderr)
    rss = re.search(r"MAXRSS (\d+)", p.stderr)
    # Load counts the tokenizer too, as llama.cpp's load builds its vocabulary.
    load_ms = float(m.group(1)) + float(m.group(2))
    return {
        "load_ms": load_ms,
        "prefill_tps": float(m.group(5)),
        "first_token_ms": load_ms + float(m.group(4)),
        "decode_ms": float(m.group(7)),
        "rss_mib": int(rss.group(1)) / 1024 if rss else float("nan"),
    }


def run_llama(model, threads, prompt, n):
    p = subprocess.run([sys.executable, "-c", LLAMA_CHILD, model, str(threads), json.dumps(prompt), str(n)],
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--config", default="smollm2_135m", help="config type for tlm (synthetic files of the larger shapes)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--out", default=None, help="default: bench/results/generate-<config>.md")
    args = ap.parse_args()
    if args.out is None:
        args.out = f"bench/results/generate-{args.config}.md"
    # 64 prompt tokens: a fixed English passage's ids, repeated ids are fine for timing.
    prompt = [504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 6557, 314, 18532, 30, 378, 3575, 282,
              5545, 314, 9893, 30, 378, 3575, 282, 10617, 314, 20521, 30] * 3
    prompt = prompt[:64]
    results = {}
    for r in range(args.rounds):
        for threads in (1, 2):
            for name, fn in (("tlm", lambda: run_tlm(args.build, args.model, args.config, threads, prompt, args.decode)),
                             ("llama.cpp", lambda: run_llama(args.model, threads, prompt, args.decode))):
                res = fn()
                results.setdefault((name, threads), []).append(res)
                print(f"round {r} {name:9} threads {threads}: {res}", flush=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
    simd = " ".join(f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni") if f in flags)
    load = os.getloadavg()
    lines = [
        "# Generation: tlm vs llama.cpp, same file, same run",
        "",
        f"- Machine: {cpu}, {os.cpu_count()} CPUs ({simd}); load average {load[0]:.2f} at the end; shared and noisy.",
        f"- Model: `{os.path.basename(args.model)}` (tlm config `{args.config}`); prompt 64 tokens; decode {args.decode} tokens greedy; "
        f"{args.rounds} interleaved rounds, medians shown.",
        "- llama.cpp: llama-cpp-python 0.3.36 (built from source by pip, native CPU flags), `n_batch=256`; its RSS includes the Python interpreter and numpy (~50 MiB).",
        "- tlm: `examples/generate --timing`; load = mapping + binding + building the tokenizer; "
        "load + first token = load + prefill of the 64-token prompt (llama.cpp: `Llama()` + `eval` + argmax).",
        "",
        "| engine | threads | decode ms/token | prefill tokens/s | load ms | load + first token ms | peak RSS MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for (name, threads), rs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        lines.append(f"| {name} | {threads} | {med['decode_ms']:.2f} | {med['prefill_tps']:.0f} | {med['load_ms']:.1f} | "
                     f"{med['first_token_ms']:.1f} | {med['rss_mib']:.0f} |")
    for threads in (1, 2):
        a = statistics.median(r["decode_ms"] for r in results[("tlm", threads)])
        b = statistics.median(r["decode_ms"] for r in results[("llama.cpp", threads)])
        lines.append(f"\nDecode at {threads} thread(s): tlm / llama.cpp time ratio = {a / b:.2f} (below 1 means tlm is faster).")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
