"""Builds Hugging Face's tokenizer for SmolLM2 from a GGUF file's tokenizer section.

The reference is independent of tlm: the vocabulary and merges are read with the
`gguf` package (or, when it is not importable, with the tiny metadata reader below,
which only walks the key/value section), and the pipeline is assembled from HF
`tokenizers` parts exactly as SmolLM2's tokenizer.json declares it:
no normalizer; pre-tokenizer Sequence[Digits(individual_digits=True),
ByteLevel(add_prefix_space=False, use_regex=True)]; BPE without byte fallback and
without an unknown token; ByteLevel decoder. Control (3) and user-defined (4)
tokens become added special tokens.
"""
import struct

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers


def _read_metadata_plain(path):
    # Only the header and key/value pairs; tensor infos and data are never touched.
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as f:
        def read(fmt):
            size = struct.calcsize("<" + fmt)
            return struct.unpack("<" + fmt, f.read(size))[0]

        def read_str():
            return f.read(read("Q")).decode("utf-8")

        def read_value(t):
            if t == 8:
                return read_str()
            if t == 9:
                et, n = read("I"), read("Q")
                return [read_value(et) for _ in range(n)]
            return read(scalar[t])

        if f.read(4) != b"GGUF":
            raise SystemExit(f"{path}: not a GGUF file")
        read("I")
        read("Q")
        n_kv = read("Q")
        out = {}
        for _ in range(n_kv):
            key = read_str()
            out[key] = read_value(read("I"))
        return out


def read_tokenizer_metadata(path):
    """Returns dict with tokens, types, merges, bos, eos, chat_template."""
    try:
        from gguf import GGUFReader  # the pinned reference reader

        r = GGUFReader(path)

        def field(name):
            return r.fields[name]

        def strings(name):
            fl = field(name)
            return [bytes(fl.parts[i]).decode("utf-8") for i in fl.data]

        def scalar(name):
            fl = field(name)
            return fl.parts[fl.data[0]].tolist()[0]

        md = {
            "tokenizer.ggml.tokens": strings("tokenizer.ggml.tokens"),
            "tokenizer.ggml.token_type": [int(field("tokenizer.ggml.token_type").parts[i][0])
                                          for i in field("tokenizer.ggml.token_type").data],
            "tokenizer.ggml.merges": strings("tokenizer.ggml.merges"),
            "tokenizer.ggml.bos_token_id": scalar("tokenizer.ggml.bos_token_id"),
            "tokenizer.ggml.eos_token_id": scalar("tokenizer.ggml.eos_token_id"),
        }
        if "tokenizer.chat_template" in r.fields:
            fl = field("tokenizer.chat_template")
            md["tokenizer.chat_template"] = bytes(fl.parts[fl.data[0]]).decode("utf-8")
    except ImportError:
        md = _read_metadata_plain(path)
    return {
        "tokens": md["tokenizer.ggml.tokens"],
        "types": md["tokenizer.ggml.token_type"],
        "merges": md["tokenizer.ggml.merges"],
        "bos": md["tokenizer.ggml.bos_token_id"],
        "eos": md["tokenizer.ggml.eos_token_id"],
        "chat_template": md.get("tokenizer.chat_template"),
    }


def build_hf_tokenizer(path):
    md = read_tokenizer_metadata(path)
    vocab = {tok: i for i, tok in enumerate(md["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in md["merges"]]
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token=None, byte_fallback=False,
                     fuse_unk=False, dropout=None)
    tok = Tokenizer(bpe)
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)
                for t, ty in zip(md["tokens"], md["types"]) if ty in (3, 4)]
    tok.add_special_tokens(specials)
    return tok, md


def hf_encode(tok, text, parse_special):
    # encode_special_tokens=True makes HF treat special-token strings as plain text.
    tok.encode_special_tokens = not parse_special
    return tok.encode(text, add_special_tokens=False).ids


def hf_decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=False)


# ---- the batch protocol of examples/tokenize (see run_batch there) ----------------

def encode_record(text, parse_special=False, add_bos=False):
    data = text.encode("utf-8") if isinstance(text, str) else text
    flags = (1 if parse_special else 0) | (2 if add_bos else 0)
    return b"E %d %d\n" % (flags, len(data)) + data + b"\n"


def decode_record(ids):
    return b"D %d\n" % len(ids) + " ".join(map(str, ids)).encode() + b"\n"


def run_tlm_batch(binary, model, records):
    """Runs `tokenize --batch` over records (bytes from encode_record/decode_record).

    Returns a list with, per record, a list of ids (encode), bytes (decode), or
    ("error", message)."""
    import os
    import subprocess
    import tempfile

    kinds = [r[:1] for r in records]
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(b"".join(records))
        path = f.name
    try:
        out = subprocess.run([str(binary), "--model", str(model), "--batch", path],
                             check=True, capture_output=True).stdout
    finally:
        os.unlink(path)
    results, pos = [], 0
    for kind in kinds:
        nl = out.index(b"\n", pos)
        line = out[pos:nl]
        pos = nl + 1
        if line.startswith(b"! "):
            results.append(("error", line[2:].decode("utf-8", "replace")))
        elif kind == b"E":
            results.append([int(x) for x in line.split()])
        else:
            n = int(line)
            results.append(out[pos:pos + n])
            pos += n + 1
    return results
