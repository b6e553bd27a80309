"""Live comparison of tlm's tokenizer (examples/tokenize --batch) with Hugging Face tokenizers.

    check_tokenizer.py --build BUILD_DIR --model GGUF [--seed N|random] [--count N] [--no-unicode-scan]

Checks, each against HF built from the same GGUF (tokenizer_common.py):
  1. encode of random texts (seed 1 unless --seed; --seed random draws a new one),
     with and without parse_special;
  2. decode of random id sequences;
  3. unless --no-unicode-scan: every code point of planes 0-3 and 14 in contexts that
     expose its class (letter, number, whitespace, other), which is where Unicode-version
     differences between PCRE2 and HF's Oniguruma/Rust would show.
Exits 1 on any mismatch and prints the first few.
"""
import argparse
import pathlib
import random
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_tokenizer_fixtures import FIXED_TEXTS, random_texts  # noqa: E402
from tokenizer_common import (build_hf_tokenizer, decode_record, encode_record, hf_decode,  # noqa: E402
                              run_tlm_batch)


def find_binary(build):
    for cand in (pathlib.Path(build) / "examples" / "tokenize", pathlib.Path(build) / "tokenize"):
        if cand.exists():
            return cand
    raise SystemExit(f"check_tokenizer: no tokenize binary under {build}/examples; build the target `tokenize`")


def compare(label, texts_special, hf_ids, ours, failures):
    bad = 0
    for (text, special), a, b in zip(texts_special, hf_ids, ours):
        if a != b:
            bad += 1
            if len(failures) < 10:
                failures.append(f"{label}: {text!r} special={special}: HF {a} tlm {b}")
    print(f"{label}: {len(texts_special)} texts, {bad} mismatches")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", required=True)
    # A fixed seed, so that CI judges the same texts every run and a failure reproduces;
    # --seed random draws one, for longer hunts outside CI.
    ap.add_argument("--seed", default="1", help="an integer, or 'random'")
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--no-unicode-scan", action="store_true")
    args = ap.parse_args()
    if not pathlib.Path(args.model).exists():
        raise SystemExit(f"check_tokenizer: {args.model} is missing; run scripts/fetch-model")
    binary = find_binary(args.build)
    seed = random.SystemRandom().randrange(1 << 31) if args.seed == "random" else int(args.seed)
    print(f"check_tokenizer: seed {seed} (rerun with --seed {seed})")
    rng = random.Random(seed)
    tok, md = build_hf_tokenizer(args.model)
    failures, mismatches = [], 0

    # 1. encode: the fixed texts plus fresh random ones, each with and without parse_special.
    texts = list(FIXED_TEXTS)
    while len(texts) < args.count:
        texts += random_texts(rng)
    texts = texts[:args.count]
    for special in (False, True):
        tok.encode_special_tokens = not special
        hf_ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        ours = run_tlm_batch(binary, args.model, [encode_record(t, special) for t in texts])
        mismatches += compare(f"encode parse_special={special}", [(t, special) for t in texts], hf_ids, ours,
                              failures)

    # 2. decode of random id sequences.
    vocab = len(md["tokens"])
    seqs = [[rng.randrange(0, 512 if i % 4 == 0 else vocab) for _ in range(rng.randint(1, 24))]
            for i in range(args.count)]
    ours = run_tlm_batch(binary, args.model, [decode_record(s) for s in seqs])
    bad = 0
    for s, b in zip(seqs, ours):
        a = hf_decode(tok, s).encode("utf-8")
        if a != b:
            bad += 1
            if len(failures) < 10:
                failures.append(f"decode {s}: HF {a!r} tlm {b!r}")
    print(f"decode: {len(seqs)} id sequences, {bad} mismatches")
    mismatches += bad

    # 3. every code point in contexts.
    if not args.no_unicode_scan:
        t0 = time.time()
        cps = [c for p in (0, 1, 2, 3, 14) for c in range(p << 16, (p + 1) << 16) if not 0xD800 <= c < 0xE000]
        texts = [f"a{chr(c)}a !{chr(c)}! 1{chr(c)}1  {chr(c)}{chr(c)} x{chr(c)}" for c in cps]
        tok.encode_special_tokens = True
        hf_ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        ours = run_tlm_batch(binary, args.model, [encode_record(t) for t in texts])
        bad = 0
        for c, a, b in zip(cps, hf_ids, ours):
            if a != b:
                bad += 1
                if len(failures) < 10:
                    failures.append(f"unicode scan U+{c:04X}: HF {a} tlm {b}")
        print(f"unicode scan: {len(cps)} code points, {bad} mismatches ({time.time() - t0:.0f} s)")
        mismatches += bad

    for f in failures:
        print("MISMATCH", f)
    print(f"check_tokenizer: {'FAILED' if mismatches else 'OK'}, {mismatches} mismatches (seed {seed})")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
