"""tlm's Llama 3, Qwen2 and SentencePiece tokenizers against Hugging Face, with llama.cpp beside them.

    check_tokenizer_families.py --build BUILD_DIR [--vocab-dir DIR] [--seed N] [--count N]

For each of llama.cpp's vocabulary-only files (models/llama.cpp/vocab, scripts/fetch-vocab):
  1. Hugging Face's tokenizer is built from the GGUF alone with `tokenizers` (below:
     how each vocabulary's tokenizer.json declares its pipeline) and must reproduce
     every .inp/.out case first; only then is it trusted as the reference.
  2. --count random seeded texts (mixed scripts, emoji, CJK, digit runs, whitespace runs,
     newlines, special-token text) and 11 long runs of 10k-20k characters, encoded with and without parse_special: tlm's ids
     (examples/tokenize --batch) must equal HF's. llama.cpp's ids (llama-cpp-python,
     vocab_only) are compared too and the disagreements with HF are counted and a few
     listed, without failing: HF is the target.
  3. Decode: tlm's decode of its ids gives the text back (all these vocabularies can
     spell any text: byte-level BPE, or SentencePiece's byte fallback), and equals HF's.
Exits 1 on any tlm mismatch or when the files are missing (--model is accepted and
ignored, so that tests/CMakeLists.txt can register this script like the others).
"""
import argparse
import pathlib
import random
import sys
import time
import unicodedata

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gguf_file import GGUFFile  # noqa: E402
from tokenizer_common import decode_record, encode_record, run_tlm_batch  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
VOCABS = ["llama-bpe", "qwen2", "llama-spm", "phi-3"]
SPM_SPACE = "\u2581"

# Llama 3's tokenizer.json Split pattern; Qwen2's is the same with single digits.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")


def read_gguf(path):
    r = GGUFFile(path, tensors=False)
    md = {
        "model": r.get("tokenizer.ggml.model"),
        "pre": r.get("tokenizer.ggml.pre"),
        "tokens": r.strings("tokenizer.ggml.tokens"),
        "types": [int(t) for t in r.fields["tokenizer.ggml.token_type"]],
        "unk": r.get("tokenizer.ggml.unknown_token_id"),
        "add_space_prefix": r.get("tokenizer.ggml.add_space_prefix", True),
    }
    if "tokenizer.ggml.merges" in r.fields:
        md["merges"] = r.strings("tokenizer.ggml.merges")
    if "tokenizer.ggml.scores" in r.fields:
        md["scores"] = [float(v) for v in r.fields["tokenizer.ggml.scores"]]
    return md


def spm_merges(tokens, scores):
    # As transformers' SentencePiece conversion: every cut of a piece into two pieces is
    # a merge, ordered by the piece's score (highest first), then by vocabulary order.
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    merges = []
    for i, piece in enumerate(tokens):
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        merges += [(scores[i], i, lr) for lr in local]
    merges.sort(key=lambda m: (-m[0], m[1]))
    return [lr for _, _, lr in merges]


def build_hf(md):
    vocab = {t: i for i, t in reversed(list(enumerate(md["tokens"])))}
    if md["model"] == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in md["merges"]]
        llama3 = md["pre"] == "llama-bpe"
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False, ignore_merges=llama3))
        if md["pre"] == "qwen2":
            tok.normalizer = normalizers.NFC()  # Qwen2's tokenizer.json has it; tlm does not (see README)
        pattern = LLAMA3_PATTERN if llama3 else QWEN2_PATTERN
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
    else:
        unk = md["tokens"][md["unk"]]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=spm_merges(md["tokens"], md["scores"]), unk_token=unk,
                                   byte_fallback=True, fuse_unk=True))
        norm = [normalizers.Replace(" ", SPM_SPACE)]
        if md["add_space_prefix"]:
            norm.insert(0, normalizers.Prepend(SPM_SPACE))
        tok.normalizer = normalizers.Sequence(norm)
        tok.decoder = decoders.Sequence([decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
                                        + ([decoders.Strip(" ", 1, 0)] if md["add_space_prefix"] else []))
    # Control, user-defined and unknown tokens are matched as special tokens (llama.cpp's set).
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(md["tokens"], md["types"])
                            if ty in (2, 3, 4)])
    return tok


def read_cases(base):
    inp = (base.parent / (base.name + ".inp")).read_text(encoding="utf-8")
    texts = inp.split("\n__ggml_vocab_test__\n")[:-1]
    outs = (base.parent / (base.name + ".out")).read_text(encoding="utf-8").split("\n")[:len(texts)]
    return list(zip(texts, [[int(x) for x in line.split()] for line in outs]))


def random_text(rng, specials):
    pieces = [
        lambda: "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.randint(1, 6))),   # CJK
        lambda: "".join(chr(rng.randint(0x3040, 0x30FF)) for _ in range(rng.randint(1, 6))),   # kana
        lambda: "".join(chr(rng.randint(0xAC00, 0xD7A3)) for _ in range(rng.randint(1, 4))),   # Hangul
        lambda: "".join(chr(rng.randint(0x1F300, 0x1FAFF)) for _ in range(rng.randint(1, 3))),  # emoji
        lambda: rng.choice(["\U0001F468\u200D\U0001F469\u200D\U0001F467", "\U0001F44D\U0001F3FD", "\u2764\uFE0F"]),
        lambda: "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12))),          # digit runs
        lambda: "".join(chr(rng.randint(0x0660, 0x0669)) for _ in range(rng.randint(1, 4))),   # Arabic digits
        lambda: rng.choice([" ", "  ", "   ", "\t", " \t ", "\u00A0", "\u3000", "\u2009"]) * rng.randint(1, 4),
        lambda: rng.choice(["\n", "\n\n", "\r\n", " \n", "\n ", "\n\n\n  "]),
        lambda: rng.choice(["Hello", "world", "don't", "I'LL", "she's", "The", "quick", "naïve", "Äpfel", "über"]),
        lambda: "".join(chr(rng.randint(0x0400, 0x04FF)) for _ in range(rng.randint(1, 8))),   # Cyrillic
        lambda: "".join(chr(rng.randint(0x0900, 0x097F)) for _ in range(rng.randint(1, 5))),   # Devanagari
        lambda: "".join(chr(rng.randint(0x0590, 0x06FF)) for _ in range(rng.randint(1, 5))),   # Hebrew, Arabic
        lambda: "".join(rng.choice("!?.,;:'\"()[]{}<>|/\\-_=+*&^%$#@~`") for _ in range(rng.randint(1, 5))),
        lambda: rng.choice(specials) if specials else "<s>",                                  # special-token text
        lambda: "".join(chr(rng.randint(0x20, 0x7E)) for _ in range(rng.randint(1, 10))),
        lambda: chr(rng.choice([rng.randint(0x10000, 0x10FFFF), rng.randint(0xE000, 0xF8FF), rng.randint(0x80, 0x2FF)])),
    ]
    text = "".join(rng.choice(pieces)() for _ in range(rng.randint(1, 12)))
    return "".join(c if not 0xD800 <= ord(c) < 0xE000 else "\uFFFD" for c in text)


def llama_cpp_vocab(path):
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def check_vocab(name, args, rng, binary):
    path = pathlib.Path(args.vocab_dir) / f"ggml-vocab-{name}.gguf"
    if not path.exists():
        raise SystemExit(f"check_tokenizer_families: {path} is missing; run scripts/fetch-vocab")
    md = read_gguf(path)
    t0 = time.time()
    hf = build_hf(md)
    failures, bad = [], 0

    # 1. The reference must reproduce llama.cpp's own cases first.
    cases = read_cases(path)
    hf.encode_special_tokens = True
    ref_ok = sum(hf.encode(t, add_special_tokens=False).ids == ids for t, ids in cases)
    print(f"{name}: HF reference built in {time.time() - t0:.1f} s, {ref_ok}/{len(cases)} .out cases")
    if ref_ok != len(cases):
        print(f"{name}: FAILED, the HF reference does not reproduce the .out cases; it cannot be trusted")
        return 1

    # 2. Random texts, with and without parse_special.
    specials = [t for t, ty in zip(md["tokens"], md["types"]) if ty in (3, 4)][:64]
    texts = [random_text(rng, specials) for _ in range(args.count)]
    # Letters Unicode 15+ added (CJK Extension H, Kawi, Garay) next to punctuation, where
    # PCRE2 10.42 alone would cut the pre-tokens elsewhere (a random seed found the first).
    texts += ["\U0003228d#]g;\U0003228d[PAD151679]", "x\U0003228d[x", "!\U00011f05,\U00010d50.", "\u1c89?\U0001e5d0)"]
    # Long runs, where a pattern's backtracking or PCRE2's JIT stack would show.
    texts += ["!" * 20000, " " * 20000 + "a", "\n" * 20000, "7" * 20000, "a" * 20000, " \n" * 10000 + "x",
              "\t \r\n" * 5000, "\u00e9" * 10000, "\U0001F600" * 5000, "a " * 10000, "x" + " " * 20000 + "\n" + " " * 9999]
    if md["pre"] == "qwen2":
        # tlm, like llama.cpp, does not apply Qwen2's NFC normalizer: the texts are given in NFC.
        texts = [unicodedata.normalize("NFC", t) for t in texts]
    llama = llama_cpp_vocab(path)
    for special in (False, True):
        hf.encode_special_tokens = not special
        hf_ids = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
        ours = run_tlm_batch(binary, path, [encode_record(t, special) for t in texts])
        mism = [(t, a, b) for t, a, b in zip(texts, hf_ids, ours) if a != b]
        bad += len(mism)
        failures += [f"{name} special={special}: {t!r}: HF {a} tlm {b}" for t, a, b in mism[:5]]
        line = f"{name} parse_special={special}: {len(texts)} texts, tlm differs from HF on {len(mism)}"
        if llama is not None:
            lc = [llama.tokenize(t.encode("utf-8"), add_bos=False, special=special) for t in texts]
            diff = [(t, a, b) for t, a, b in zip(texts, hf_ids, lc) if a != b]
            line += f"; llama.cpp differs from HF on {len(diff)}"
            for t, a, b in diff[:args.show]:
                print(f"  llama.cpp vs HF: {t!r}: HF {a} llama.cpp {b}")
        print(line)

    # 3. Decode: back to the text, and as HF decodes the same ids.
    hf.encode_special_tokens = True
    ids = run_tlm_batch(binary, path, [encode_record(t) for t in texts])
    decoded = run_tlm_batch(binary, path, [decode_record(x) for x in ids])
    trips = sum(d == t.encode("utf-8") for t, d in zip(texts, decoded))
    same = sum(d == hf.decode(x, skip_special_tokens=False).encode("utf-8") for x, d in zip(ids, decoded))
    print(f"{name} decode: {trips}/{len(texts)} round trips, {same}/{len(texts)} equal to HF's decode")
    for t, d in [(t, d) for t, d in zip(texts, decoded) if d != t.encode("utf-8")][:3]:
        failures.append(f"{name} round trip: {t!r} -> {d!r}")
    bad += (len(texts) - trips) + (len(texts) - same)
    for f in failures:
        print("MISMATCH", f)
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", help="ignored (the vocabularies are under --vocab-dir)")
    ap.add_argument("--vocab-dir", default=str(ROOT / "models" / "llama.cpp" / "vocab"))
    # A fixed seed, so that CI judges the same texts every run; --seed random draws one
    # (for longer hunts outside CI: a random seed found Qwen2's Unicode 15 letters, below).
    ap.add_argument("--seed", default="1", help="an integer, or 'random'")
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--show", type=int, default=3, help="llama.cpp disagreements to list per vocabulary")
    ap.add_argument("--vocab", action="append", choices=VOCABS, help="only these (default: all)")
    args = ap.parse_args()
    binary = next((c for c in (pathlib.Path(args.build) / "examples" / "tokenize", pathlib.Path(args.build) / "tokenize")
                   if c.exists()), None)
    if binary is None:
        raise SystemExit(f"check_tokenizer_families: no tokenize binary under {args.build}; build the target `tokenize`")
    seed = random.SystemRandom().randrange(1 << 31) if args.seed == "random" else int(args.seed)
    print(f"check_tokenizer_families: seed {seed} (rerun with --seed {seed})")
    bad = 0
    for name in args.vocab or VOCABS:
        bad += check_vocab(name, args, random.Random(f"{seed}/{name}"), binary)
    print(f"check_tokenizer_families: {'FAILED' if bad else 'OK'}, {bad} mismatches (seed {seed})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
