#!/usr/bin/env python3
"""Generation speed of tlm next to llama.cpp (llama-cpp-python), on the same file, in
one run, alternating the engines, so a noisy shared machine affects both alike.

Measures, at every thread count asked for (default 1 and 2, then every doubling up
to 16 that the machine has):
  - decode ms/token after a 64-token prompt, for 32 and for 128 new tokens;
  - prefill tokens/s at 64 and at 512 prompt tokens;
  - load + first token wall time and peak RSS (64-token prompt);
  - the weight-streaming floor of the file (build/bench/kernels --floor-file MODEL),
    measured after every round, and each decode figure as a multiple of its median.
Medians over the rounds; ratios are speeds (above 1: tlm is faster). The header names the
kernel level tlm ran at, as generate reports it (TLM_KERNELS=avx2 in the environment forces
a lower level than the CPU's best, and the header says so).

Which llama.cpp: the build must be native to the machine. The script prints what
`llama_print_system_info()` reports; if that build lacks instructions the CPU has (a
generic wheel), it builds llama-cpp-python natively into a separate venv
(CMAKE_ARGS="-DGGML_NATIVE=ON"). If the build crashes in a smoke run on a CPU whose
VM exposes AMX (SIGSEGV in ggml_backend_amx_mul_mat, seen on 2-core Xeons), it
builds again with -DGGML_NATIVE=OFF, the AVX-512 flags the CPU has and AMX off, and
says so in the results.

  .venv/bin/python bench/generate_vs_llamacpp.py --build build [--model GGUF] [--rounds 3]
  # tlm's fast mode (int8 activations), once generate has --precision:
  .venv/bin/python bench/generate_vs_llamacpp.py --build build --precision fast
  # larger shapes, on synthetic files (examples/synth_model):
  .venv/bin/python bench/generate_vs_llamacpp.py --model build/synthetic-smollm2_360m.gguf --config smollm2_360m
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from programs import built  # noqa: E402

LLAMA_INFO = r"""
import json, llama_cpp
print(json.dumps({"version": llama_cpp.__version__, "system_info": llama_cpp.llama_print_system_info().decode()}))
"""

LLAMA_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from llama_cpp import Llama
path, threads, prompt, n = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
t_import = time.perf_counter()
# One batch holds the whole context: the prompt is evaluated in a single ubatch (llama.cpp's best case),
# and llama-cpp-python keeps one row of scores per batch slot, so every position has its row.
ctx = max(512, len(prompt) + n + 16)
llm = Llama(model_path=path, n_ctx=ctx, n_threads=threads, n_threads_batch=threads,
            n_batch=ctx, n_ubatch=ctx, verbose=False)
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
    # The mean, as tlm's --timing reports it.
    "decode_ms": sum(times) / len(times) * 1e3 if times else float("nan"),
    "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""

# Flags of /proc/cpuinfo and the names llama_print_system_info() gives them.
CPU_TO_GGML = [("avx2", "AVX2"), ("fma", "FMA"), ("f16c", "F16C"), ("avx512f", "AVX512"),
               ("avx512_vnni", "AVX512_VNNI"), ("avx512_bf16", "AVX512_BF16"), ("avx512vbmi", "AVX512_VBMI"),
               ("avx_vnni", "AVX_VNNI"), ("amx_int8", "AMX_INT8")]


def cpu_model_and_flags():
    model, flags = "?", []
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].split()
    return model, flags


def ggml_features(system_info):
    return {k: v == "1" for k, v in re.findall(r"(\w+) = (\d)", system_info)}


def llama_info(python):
    p = subprocess.run([python, "-c", LLAMA_INFO], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{python}: cannot import llama_cpp:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def missing_features(system_info, flags):
    have = ggml_features(system_info)
    return [g for c, g in CPU_TO_GGML if c in flags and c != "amx_int8" and not have.get(g, False)]


def build_llama_venv(venv, version, cmake_args):
    """llama-cpp-python `version` compiled from source with `cmake_args`, in its own venv."""
    print(f"building llama-cpp-python {version} in {venv} with CMAKE_ARGS='{cmake_args}' (a few minutes)", flush=True)
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    env = dict(os.environ, CMAKE_ARGS=cmake_args, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 1))
    subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "--no-cache-dir", "--force-reinstall",
                    "--no-binary", "llama-cpp-python", f"llama-cpp-python=={version}", "numpy"], check=True, env=env)
    return os.path.join(venv, "bin", "python")


def run_llama(python, model, threads, prompt, n):
    p = subprocess.run([python, "-c", LLAMA_CHILD, model, str(threads), json.dumps(prompt), str(n)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise subprocess.CalledProcessError(p.returncode, "llama.cpp child", p.stdout, p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])


def choose_llama(args, flags):
    """The Python whose llama.cpp is measured, and a sentence on how it was built."""
    python = args.llama_python
    info = llama_info(python)
    how = f"llama-cpp-python {info['version']} from `{python}`, compiled from source by pip through scripts/setup"
    if "amx_int8" in flags:
        how += (", which on a CPU with AMX sets GGML_NATIVE=OFF, the AVX-512 flags the CPU has and AMX off (a native "
                "build crashes in ggml's AMX kernel on these VMs)")
    else:
        how += ", with llama.cpp's default GGML_NATIVE=ON"
    missing = missing_features(info["system_info"], flags)
    if missing:
        if args.no_build:
            how += f" (**generic build**: lacks {', '.join(missing)}; not rebuilt because of --no-build)"
        else:
            python = build_llama_venv(args.bench_venv, info["version"], "-DGGML_NATIVE=ON")
            info = llama_info(python)
            how = (f"llama-cpp-python {info['version']} built for this machine into `{args.bench_venv}` with "
                   f"CMAKE_ARGS=\"-DGGML_NATIVE=ON\" (the default venv's build lacked {', '.join(missing)})")
    # Smoke run: a native build that uses AMX crashes on some VMs that expose it.
    try:
        run_llama(python, args.model, 1, [1, 2, 3, 4, 5, 6, 7, 8], 2)
    except subprocess.CalledProcessError as e:
        died = e.returncode < 0 and -e.returncode in (signal.SIGSEGV, signal.SIGILL, signal.SIGBUS)
        if not (died and ggml_features(info["system_info"]).get("AMX_INT8", False)) or args.no_build:
            sys.exit(f"llama.cpp smoke run failed (exit {e.returncode}):\n{e.stderr[-2000:]}")
        on = lambda f: "ON" if f in flags else "OFF"
        cmake = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "
                 f"-DGGML_AVX512={on('avx512f')} -DGGML_AVX512_VNNI={on('avx512_vnni')} "
                 f"-DGGML_AVX512_BF16={on('avx512_bf16')} -DGGML_AVX512_VBMI={on('avx512vbmi')} "
                 "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF")
        venv = args.bench_venv + "-noamx"
        python = build_llama_venv(venv, info["version"], cmake)
        info = llama_info(python)
        how = (f"llama-cpp-python {info['version']} built into `{venv}` with CMAKE_ARGS=\"{cmake}\": the native "
               f"build died with signal {-e.returncode} in a smoke run (the AMX crash), so AMX is off")
        run_llama(python, args.model, 1, [1, 2, 3, 4, 5, 6, 7, 8], 2)
    return python, info, how


def run_tlm(args, threads, prompt, n):
    cmd = [os.path.join(args.build, "examples", "generate"), "--model", args.model, "--config", args.config,
           "--threads", str(threads), "--token-ids", ",".join(map(str, prompt)), "-n", str(n + 1), "--timing"]
    env = None
    if args.precision != "exact":
        if args.precision_via == "flag":
            # Only passed when asked for, so the script also runs a generate without the flag.
            cmd += ["--precision", args.precision]
        else:
            # The kernels' default precision (tlm::kernels::default_precision), for a
            # generate that has no --precision yet.
            env = dict(os.environ, TLM_PRECISION=args.precision)
    # A fresh process per run so its peak RSS is its own: measured with /usr/bin/time if present.
    wrapped = ["/usr/bin/time", "-f", "MAXRSS %M"] + cmd if os.path.exists("/usr/bin/time") else cmd
    p = subprocess.run(wrapped, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"generate failed ({' '.join(cmd)}):\n{p.stderr}")
    m = re.search(r"load ([\d.]+) ms, tokenizer ([\d.]+) ms \| prefill (\d+) tokens in ([\d.]+) ms \(([\d.]+) tokens/s\) \| decode (\d+) tokens, ([\d.]+) ms/token", p.stderr)
    if not m:
        sys.exit("cannot parse generate --timing output:\n" + p.stderr)
    rss = re.search(r"MAXRSS (\d+)", p.stderr)
    level = re.search(r"\| \d+ threads?, kernels (\w+)", p.stderr)
    # Load counts the tokenizer too, as llama.cpp's load builds its vocabulary.
    load_ms = float(m.group(1)) + float(m.group(2))
    return {
        "kernels": level.group(1) if level else "unknown",
        "load_ms": load_ms,
        "prefill_tps": float(m.group(5)),
        "first_token_ms": load_ms + float(m.group(4)),
        "decode_ms": float(m.group(7)),
        "rss_mib": int(rss.group(1)) / 1024 if rss else float("nan"),
    }


def streaming_floor(build, threads, model, rounds):
    """ms per token to read every weight byte of `model` once, from bench/kernels --floor-file
    (its own tensors, mapped as tlm maps them, split among the threads as the kernels split
    them), and how it was found. Measured on the file itself, not scaled from another size:
    a last-level cache can hold a small model (the Xeon's 480 MiB holds SmolLM2-135M), so
    bandwidth differs between sizes."""
    exe = str(built(build, "kernels"))
    p = subprocess.run([exe, "--rounds", str(rounds), "--filter", "file floor", "--floor-file", model],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench/kernels --floor-file {model} failed ({p.returncode}): {p.stderr.strip()}")
    out, how = {}, "`bench/kernels --floor-file`"
    for t in threads:
        m = re.search(r"\| file floor: read .*'s (\d+) tensors once \((\d+) MiB\), %d thr \| ([\d.]+) us" % t, p.stdout)
        if m:
            out[t] = float(m.group(3)) / 1e3
            how = (f"`bench/kernels --floor-file` on this file: {m.group(1)} tensors, {m.group(2)} MiB, "
                   "every tensor a token reads in full, streamed from the mapping")
    return out, how


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--config", default="smollm2_135m", help="config type for tlm (synthetic files of the larger shapes)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default=None, help="comma-separated thread counts (default 1,2,4,.. up to min(16, CPUs))")
    ap.add_argument("--precision", choices=("exact", "fast"), default="exact", help="tlm's arithmetic (generate --precision)")
    ap.add_argument("--precision-via", choices=("flag", "env"), default="flag",
                    help="pass the precision as generate --precision, or as TLM_PRECISION in the environment")
    ap.add_argument("--llama-python", default=sys.executable, help="the Python whose llama_cpp is measured")
    ap.add_argument("--bench-venv", default=".venv-bench", help="where a native llama-cpp-python is built if needed")
    ap.add_argument("--no-build", action="store_true", help="never build llama-cpp-python; report the build as it is")
    ap.add_argument("--out", default=None, help="default: bench/results/generate-<config>[-fast].md")
    args = ap.parse_args()
    if args.out is None:
        args.out = f"bench/results/generate-{args.config}{'-fast' if args.precision == 'fast' else ''}.md"
    ncpu = os.cpu_count() or 1
    if args.threads:
        threads = [int(t) for t in args.threads.split(",")]
    else:
        threads = [t for t in (1, 2, 4, 8, 16) if t <= min(16, ncpu)]

    model_name, flags = cpu_model_and_flags()
    python, info, how = choose_llama(args, flags)
    print(f"llama.cpp: {how}\nsystem info: {info['system_info']}", flush=True)

    # A fixed English passage's ids, repeated: the ids do not change the speed.
    passage = [504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 6557, 314, 18532, 30, 378, 3575, 282,
               5545, 314, 9893, 30, 378, 3575, 282, 10617, 314, 20521, 30]
    prompt = lambda n: (passage * (n // len(passage) + 1))[:n]
    # (name, prompt tokens, new tokens): what each run is for.
    runs = [("decode32", 64, 32), ("decode128", 64, 128), ("prefill512", 512, 4)]
    engines = {"tlm": lambda t, p, n: run_tlm(args, t, p, n),
               "llama.cpp": lambda t, p, n: run_llama(python, args.model, t, p, n)}
    results = {}
    # The floor is measured in every round, beside the engines: on a shared machine the
    # bandwidth moves (one Xeon read the 1B file's floor at 43.9 ms at 1 thread in
    # bench/results/kernels-kquant-two-rows-xeon.md and at 52.8-55.0 ms in
    # generate-llama32_1b-q4_k_m-xeon.md, the same afternoon), so a floor taken once would
    # put that drift into "x floor".
    floors = {}
    for r in range(args.rounds):
        for t in threads:
            for name, np_, n in runs:
                order = list(engines) if r % 2 == 0 else list(engines)[::-1]  # alternate who goes first
                for e in order:
                    res = engines[e](t, prompt(np_), n)
                    results.setdefault((e, t, name), []).append(res)
                    print(f"round {r} {e:9} threads {t} {name}: {res}", flush=True)
        floor_round, floor_how = streaming_floor(args.build, threads, args.model, rounds=3)
        for t, ms in floor_round.items():
            floors.setdefault(t, []).append(ms)
        print(f"round {r} floor: {floor_round}", flush=True)
    floor = {t: statistics.median(v) for t, v in floors.items()}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    # Changes outside bench/results (where this run and the ones before it write) make
    # the measured code differ from the commit.
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results"],
                             capture_output=True, text=True).stdout.strip()
    if commit and changed:
        commit += " with uncommitted changes"

    med = lambda e, t, name, key: statistics.median(x[key] for x in results[(e, t, name)])
    # The level tlm's kernels ran at (TLM_KERNELS forces one below the CPU's best).
    levels = {x["kernels"] for (e, _, _), xs in results.items() if e == "tlm" for x in xs}
    simd = " ".join(f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                                "avx_vnni", "amx_int8") if f in flags)
    load = os.getloadavg()
    lines = [
        "# Generation: tlm vs llama.cpp, same file, same run",
        "",
        f"- Machine: {model_name}, {ncpu} CPUs ({simd}); load average {load[0]:.2f} at the end; shared and noisy.",
        f"- tlm at commit {commit or 'unknown'}; {time.strftime('%Y-%m-%d')}.",
        f"- Model: `{os.path.basename(args.model)}` (tlm config `{args.config}`); greedy; {args.rounds} rounds, "
        "the engines alternating (who goes first swaps every round); medians shown.",
        f"- tlm: `examples/generate --timing`, precision `{args.precision}`"
        f"{' (set through TLM_PRECISION)' if args.precision != 'exact' and args.precision_via == 'env' else ''}, "
        f"kernel level {', '.join(sorted(levels))} as generate reported it"
        f"{' (forced: TLM_KERNELS=' + os.environ['TLM_KERNELS'] + ')' if os.environ.get('TLM_KERNELS') else ''}; "
        "load = mapping + binding + the tokenizer.",
        f"- llama.cpp: {how}.",
        f"- llama.cpp system info: `{info['system_info'].strip()}`",
        "- llama.cpp runs with `n_ctx = n_batch = n_ubatch = max(512, prompt + new + 16)`; its RSS includes the Python interpreter and "
        "numpy (~50 MiB). Decode ms/token is the mean over the new tokens for both engines.",
        f"- floor: the time to read every weight byte once per token ({floor_how}), the bound "
        "decode cannot beat; measured after every round, the median shown, with the range of the rounds; "
        "\"x floor\" is decode time over the median.",
        "",
        "## Decode",
        "",
        "| threads | new tokens | tlm ms/token | llama.cpp ms/token | speed tlm / llama.cpp | floor ms | tlm x floor | llama.cpp x floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in threads:
        for name, _, n in runs[:2]:
            a, b = med("tlm", t, name, "decode_ms"), med("llama.cpp", t, name, "decode_ms")
            f = floor.get(t)
            fs = ((f"{f:.2f} ({min(floors[t]):.2f}..{max(floors[t]):.2f})", f"{a / f:.2f}", f"{b / f:.2f}") if f
                  else ("-", "-", "-"))
            lines.append(f"| {t} | {n} | {a:.2f} | {b:.2f} | {b / a:.2f} | {fs[0]} | {fs[1]} | {fs[2]} |")
    lines += ["", "## Prefill", "", "| threads | prompt tokens | tlm tokens/s | llama.cpp tokens/s | speed tlm / llama.cpp |",
              "|---|---|---|---|---|"]
    for t in threads:
        for name, np_ in (("decode32", 64), ("prefill512", 512)):
            a, b = med("tlm", t, name, "prefill_tps"), med("llama.cpp", t, name, "prefill_tps")
            lines.append(f"| {t} | {np_} | {a:.0f} | {b:.0f} | {a / b:.2f} |")
    lines += ["", "## Load, first token, memory (64-token prompt, 32 new tokens)", "",
              "| threads | engine | load ms | load + first token ms | peak RSS MiB |", "|---|---|---|---|---|"]
    for t in threads:
        for e in engines:
            lines.append(f"| {t} | {e} | {med(e, t, 'decode32', 'load_ms'):.1f} | "
                         f"{med(e, t, 'decode32', 'first_token_ms'):.1f} | {med(e, t, 'decode32', 'rss_mib'):.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
