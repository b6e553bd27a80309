"""tlm's tokenizer and Hugging Face tokenizers side by side, on the same corpus, in one run.

    .venv/bin/python bench/tokenizer_vs_hf.py [--build BUILD_DIR] [--model GGUF] [--mb 4] [--reps 3]

Runs <build>/bench/tokenizer (which assembles the corpus and writes it out), then HF on
those bytes: one `encode` of the whole corpus, `encode` of each ~4 KiB document in a loop
(both single-threaded by nature), and `encode_batch` over the documents (HF's thread pool,
all cores). Checks that both produce the same number of tokens, and writes
bench/results/tokenizer.md.
"""
import argparse
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "reference"))
from tokenizer_common import build_hf_tokenizer  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from programs import built  # noqa: E402


def chunks_of(data):
    # Same rule as chunks_of in bench/tokenizer.cpp (on bytes, so offsets agree).
    out, start = [], 0
    while start < len(data):
        end = start + 4096
        if end >= len(data):
            end = len(data)
        else:
            nl = data.find(b"\n", end)
            end = len(data) if nl < 0 else nl + 1
        out.append(data[start:end].decode("utf-8"))
        start = end
    return out


def cpu_model():
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--mb", type=float, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "tokenizer.md"))
    args = ap.parse_args()
    binary = built(args.build, "tokenizer")

    with tempfile.TemporaryDirectory() as tmp:
        corpus_path = pathlib.Path(tmp) / "corpus.txt"
        run = subprocess.run([str(binary), "--model", args.model, "--mb", str(args.mb), "--reps", str(args.reps),
                              "--corpus-out", str(corpus_path)], check=True, capture_output=True, text=True)
        print(run.stdout, end="")
        ours = dict(kv.split("=") for kv in re.search(r"^RESULT (.*)$", run.stdout, re.M).group(1).split())
        data = corpus_path.read_bytes()
    text = data.decode("utf-8")
    docs = chunks_of(data)
    mb = len(data) / 1e6

    tok, _ = build_hf_tokenizer(args.model)
    tok.encode_special_tokens = True  # like tlm without parse_special

    t0 = time.perf_counter()
    hf_ids = tok.encode(text, add_special_tokens=False).ids
    hf_cold = time.perf_counter() - t0
    warm = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        tok.encode(text, add_special_tokens=False)
        warm.append(time.perf_counter() - t0)
    hf_warm = statistics.median(warm)

    tok_docs, _ = build_hf_tokenizer(args.model)  # a fresh cache
    tok_docs.encode_special_tokens = True
    t0 = time.perf_counter()
    hf_doc_tokens = sum(len(tok_docs.encode(d, add_special_tokens=False).ids) for d in docs)
    hf_docs = time.perf_counter() - t0

    batch = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        enc = tok.encode_batch(docs, add_special_tokens=False)
        batch.append(time.perf_counter() - t0)
    hf_batch = statistics.median(batch)
    assert sum(len(e.ids) for e in enc) == hf_doc_tokens

    same = len(hf_ids) == int(ours["tokens"]) and hf_doc_tokens == int(ours["doc_tokens"])
    threads = os.environ.get("RAYON_NUM_THREADS") or str(os.cpu_count())
    rows = [
        ("whole corpus, one `encode`, cold cache", float(ours["cold_mbps"]), mb / hf_cold),
        (f"whole corpus, one `encode`, warm cache (median of {args.reps})", float(ours["warm_mbps"]), mb / hf_warm),
        (f"{len(docs)} documents of ~4 KiB, `encode` each, cold cache", float(ours["docs_mbps"]), mb / hf_docs),
        (f"{len(docs)} documents, HF `encode_batch` ({threads} threads) vs tlm one thread",
         float(ours["docs_mbps"]), mb / hf_batch),
    ]
    lines = [
        "# Tokenizer encode throughput: tlm vs Hugging Face tokenizers",
        "",
        f"- CPU: {cpu_model()} ({os.cpu_count()} logical CPUs visible; the machine may be shared)",
        f"- Corpus: {mb:.2f} MB: /usr/share/common-licenses/*, /usr/share/doc/*/copyright and libstdc++ "
        "bits/*.h in 64 KiB alternating chunks (bench/tokenizer.cpp)",
        f"- Tokens: tlm {ours['tokens']}, HF {len(hf_ids)} (whole); documents tlm {ours['doc_tokens']}, "
        f"HF {hf_doc_tokens}: {'identical counts' if same else 'COUNTS DIFFER'}",
        f"- HF tokenizers {__import__('tokenizers').__version__}, built from the GGUF vocabulary "
        "(tests/reference/tokenizer_common.py); tlm single-threaded, PCRE2 JIT",
        "",
        "| case | tlm MB/s | HF MB/s | tlm / HF |",
        "|---|---:|---:|---:|",
    ]
    for name, a, b in rows:
        lines.append(f"| {name} | {a:.2f} | {b:.2f} | {a / b:.1f}x |")
    lines.append("")
    lines.append(f"tlm decode: {float(ours['decode_mbps']):.1f} MB/s of text.")
    lines.append("")
    report = "\n".join(lines)
    print(report)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
