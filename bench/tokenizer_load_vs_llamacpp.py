"""How long building the tokenizer takes, tlm next to llama.cpp, for vocabulary-only GGUF
files (Llama 3's 128k tokens, Qwen2's 152k, Llama 2's 32k), alternating, in one run.

    .venv/bin/python bench/tokenizer_load_vs_llamacpp.py [--build BUILD_DIR]
        [--vocab-dir models/llama.cpp/vocab] [--repeat 5] [--out FILE]

tlm: `BUILD/bench/tokenizer --model VOCAB` in a fresh process; its "load" figure is
tlm::tokenizer::from_gguf on the opened file (the vocabulary, merges, special tokens and
pre-tokenizer patterns built). llama.cpp: a fresh Python process times
`Llama(VOCAB, vocab_only=True)` (llama-cpp-python; the file opened and the vocabulary
built), the import of llama_cpp excluded. Both read the file from a warm page cache (one
untimed run first). Minimum and median over --repeat runs each.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from programs import built  # noqa: E402

VOCABS = [("ggml-vocab-llama-bpe.gguf", "Llama 3 (BPE, llama-bpe)"),
          ("ggml-vocab-qwen2.gguf", "Qwen2 (BPE, qwen2)"),
          ("ggml-vocab-llama-spm.gguf", "Llama 2 (SentencePiece)")]

LLAMA = """
import sys, time
from llama_cpp import Llama
t0 = time.perf_counter()
Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
print("load_s", time.perf_counter() - t0)
"""


def tlm_load(exe, vocab):
    p = subprocess.run([str(exe), "--model", vocab, "--mb", "0.05", "--reps", "1"], capture_output=True, text=True)
    m = re.search(r"^load ([\d.]+) s", p.stdout, re.M)
    if p.returncode != 0 or not m:
        sys.exit(f"bench/tokenizer --model {vocab} failed ({p.returncode}): {p.stderr.strip()}")
    return float(m.group(1)) * 1e3


def llama_load(python, vocab):
    p = subprocess.run([python, "-c", LLAMA, vocab], capture_output=True, text=True)
    m = re.search(r"^load_s ([\d.eE+-]+)", p.stdout, re.M)
    if p.returncode != 0 or not m:
        sys.exit(f"llama.cpp vocab-only load of {vocab} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return float(m.group(1)) * 1e3


def vocab_size(vocab):
    import gguf
    r = gguf.GGUFReader(vocab)
    f = r.fields["tokenizer.ggml.tokens"]
    merges = r.fields.get("tokenizer.ggml.merges")
    return len(f.data), (len(merges.data) if merges is not None else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--vocab-dir", default=str(ROOT / "models" / "llama.cpp" / "vocab"))
    ap.add_argument("--llama-python", default=sys.executable, help="the Python whose llama_cpp is measured")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "tokenizer-load.md"))
    args = ap.parse_args()
    exe = built(args.build, "tokenizer")
    rows = []
    for name, what in VOCABS:
        path = os.path.join(args.vocab_dir, name)
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: scripts/setup fetches llama.cpp's vocabulary files into {args.vocab_dir}")
        tlm_load(exe, path), llama_load(args.llama_python, path)  # warm the page cache
        t, l = [], []
        for r in range(args.repeat):
            if r % 2 == 0:
                t.append(tlm_load(exe, path)); l.append(llama_load(args.llama_python, path))
            else:
                l.append(llama_load(args.llama_python, path)); t.append(tlm_load(exe, path))
            print(f"{name} round {r}: tlm {t[-1]:.1f} ms, llama.cpp {l[-1]:.1f} ms", flush=True)
        tokens, merges = vocab_size(path)
        rows.append((name, what, tokens, merges, t, l))
    cpu = "unknown"
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            cpu = line.split(":", 1)[1].strip()
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((l for l in f if l.startswith("flags")), ":").split(":", 1)[1].split())
    except OSError:
        pass
    simd = " ".join(x for x in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi",
                                "avx512_bf16", "avx_vnni", "amx_int8") if x in flags)
    import llama_cpp
    lines = [
        "# Building the tokenizer: tlm vs llama.cpp",
        "",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- CPU: {cpu}, {os.cpu_count()} logical CPUs ({simd}); load average {os.getloadavg()[0]:.2f} at the end (shared machine).",
        f"- tlm: `bench/tokenizer --model VOCAB`, its `tlm::tokenizer::from_gguf` time; llama.cpp: llama-cpp-python "
        f"{llama_cpp.__version__}, `Llama(VOCAB, vocab_only=True)` timed inside a fresh process (import excluded).",
        f"- {args.repeat} runs each, alternating; warm page cache. Files: llama.cpp's vocabulary-only GGUFs.",
        "",
        "| vocabulary | tokens | merges | tlm min / median ms | llama.cpp min / median ms | tlm speed-up (medians) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, what, tokens, merges, t, l in rows:
        lines.append(f"| `{name}` ({what}) | {tokens} | {merges} | {min(t):.0f} / {statistics.median(t):.0f} | "
                     f"{min(l):.0f} / {statistics.median(l):.0f} | {statistics.median(l) / statistics.median(t):.2f}× |")
    lines += ["", "Reproduce: `.venv/bin/python bench/tokenizer_load_vs_llamacpp.py --build build`.", ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
