"""Builds Hugging Face's tokenizer for SmolLM2 from a GGUF file's tokenizer section.

The reference is independent of tlm: the vocabulary and merges are read with
gguf_file.py (which check_gguf.py compares with the `gguf` package's reader), and the
pipeline is assembled from HF `tokenizers` parts exactly as SmolLM2's tokenizer.json
declares it:
no normalizer; pre-tokenizer Sequence[Digits(individual_digits=True),
ByteLevel(add_prefix_space=False, use_regex=True)]; BPE without byte fallback and
without an unknown token; ByteLevel decoder. Control (3) and user-defined (4)
tokens become added special tokens.
"""
from gguf_file import GGUFFile
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers


def read_tokenizer_metadata(path):
    """Returns dict with tokens, types, merges, bos, eos, chat_template."""
    r = GGUFFile(path, tensors=False)
    return {
        "tokens": r.strings("tokenizer.ggml.tokens"),
        "types": [int(t) for t in r.fields["tokenizer.ggml.token_type"]],
        "merges": r.strings("tokenizer.ggml.merges"),
        "bos": int(r.fields["tokenizer.ggml.bos_token_id"]),
        "eos": int(r.fields["tokenizer.ggml.eos_token_id"]),
        "chat_template": r.get("tokenizer.chat_template"),
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
