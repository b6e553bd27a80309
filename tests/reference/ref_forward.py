#!/usr/bin/env python3
"""Float64 reference forward pass for Llama-architecture GGUF files.

Written from the architecture's definition, independent of the C++ engine:
the GGUF file is read with the `gguf` package, every tensor is dequantized
with `gguf.quants.dequantize` (which yields float32) and then cast to float64;
all arithmetic after that is float64.

Orientation: a GGUF matrix has dims {ne0, ne1} with ne0 contiguous.  ne0 is
the input (column) count and ne1 the output (row) count, and the reader hands
it to us as a numpy array of shape [ne1, ne0] = [rows, cols], so y = W @ x.
`_load` checks that shape against the tensor info for every matrix.

RoPE pairing: the GGUF converter permutes the rows of attn_q / attn_k inside
each head so that llama.cpp's rotation of ADJACENT pairs (x[2i], x[2i+1])
reproduces Hugging Face's rotation of half-split pairs (x[i], x[i + d/2]).
`RefModel(..., pairing="hf")` undoes the permutation on the weights and uses
the half-split rotation; `python ref_forward.py --check-hf` shows that both
give the same logits, which validates the pairing fact.

Other Llama-family files: `qwen2` files are not permuted (llama.cpp rotates
them with its NEOX rope, the half-split pairing), so their native pairing is
half-split; they carry q/k/v biases (blk.N.attn_{q,k,v}.bias, added after the
products). RoPE frequency scaling divides pair i's frequency by divisor[i]:
`rope.scaling.type = linear` with its factor, or the `rope_freqs` tensor
(Llama 3's per-pair divisors, as llama.cpp's converter writes them), whose
values `llama3_divisors` recomputes from the published formula.

Usage as a script:
    python ref_forward.py --model M.gguf [--prompt-ids 1,2,3 | --text "..."] [-n 32]
    python ref_forward.py --model M.gguf --check-hf
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import time

import numpy as np

import gguf

from gguf_file import GGUFFile


# --------------------------------------------------------------------------
# Hyperparameters, all read from the file's metadata.

@dataclasses.dataclass(frozen=True)
class Hparams:
    arch: str
    n_layer: int
    dim: int
    ffn: int
    n_head: int
    n_kv_head: int
    head_dim: int
    n_rot: int            # rope.dimension_count: how many dims of a head rotate
    rope_base: float
    rms_eps: float
    n_vocab: int
    n_ctx: int            # context_length from the file (a bound, not used for math)
    tied: bool            # True when there is no output.weight
    bos_id: int | None
    eos_id: int | None
    add_bos: bool | None
    rope_linear_factor: float = 1.0   # rope.scaling.type = linear: every frequency / factor

    @property
    def group(self) -> int:
        return self.n_head // self.n_kv_head

    @property
    def kv_dim(self) -> int:
        return self.n_kv_head * self.head_dim


def _field(reader: GGUFFile, key: str, default=None, required=True):
    f = reader.fields.get(key)
    if f is None:
        if required and default is None:
            raise KeyError(f"GGUF metadata key '{key}' is missing from {reader.path}")
        return default
    return f


def read_hparams(reader: GGUFFile) -> Hparams:
    arch = _field(reader, "general.architecture")
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"architecture is '{arch}', this reference implements 'llama' and 'qwen2' only")
    p = arch + "."
    n_head = int(_field(reader, p + "attention.head_count"))
    dim = int(_field(reader, p + "embedding_length"))
    if dim % n_head:
        raise ValueError(f"embedding_length {dim} is not a multiple of head_count {n_head}")
    head_dim = dim // n_head
    n_kv = int(_field(reader, p + "attention.head_count_kv", default=n_head))
    if n_head % n_kv:
        raise ValueError(f"head_count {n_head} is not a multiple of head_count_kv {n_kv}")
    tokens = _field(reader, "tokenizer.ggml.tokens", required=False)
    n_vocab = int(_field(reader, p + "vocab_size", default=len(tokens) if tokens else None))
    names = {t.name for t in reader.tensors}
    return Hparams(
        arch=arch,
        n_layer=int(_field(reader, p + "block_count")),
        dim=dim,
        ffn=int(_field(reader, p + "feed_forward_length")),
        n_head=n_head,
        n_kv_head=n_kv,
        head_dim=head_dim,
        n_rot=int(_field(reader, p + "rope.dimension_count", default=head_dim)),
        rope_base=float(_field(reader, p + "rope.freq_base", default=10000.0)),
        rms_eps=float(_field(reader, p + "attention.layer_norm_rms_epsilon")),
        n_vocab=n_vocab,
        n_ctx=int(_field(reader, p + "context_length")),
        tied="output.weight" not in names,
        bos_id=_field(reader, "tokenizer.ggml.bos_token_id", required=False),
        eos_id=_field(reader, "tokenizer.ggml.eos_token_id", required=False),
        add_bos=_field(reader, "tokenizer.ggml.add_bos_token", required=False),
        rope_linear_factor=_linear_factor(reader, p),
    )


def _linear_factor(reader: GGUFFile, p: str) -> float:
    kind = _field(reader, p + "rope.scaling.type", required=False)
    if kind in (None, "none"):
        return 1.0
    if kind != "linear":
        raise ValueError(f"rope.scaling.type '{kind}' is not implemented by this reference")
    return float(_field(reader, p + "rope.scaling.factor"))


def llama3_divisors(base: float, n_rot: int, factor: float, low: float, high: float, original_context: int) -> np.ndarray:
    """Llama 3.1's per-pair RoPE divisors (Meta's reference code, also llama.cpp's
    converter): by wavelength 2*pi/freq, short ones kept, long ones divided by
    `factor`, a linear blend in original_context/wavelength between.  -> [n_rot/2]"""
    freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    wavelength = 2 * np.pi / freq
    smooth = (original_context / wavelength - low) / (high - low)
    blended = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelength < original_context / high, 1.0,
                    np.where(wavelength > original_context / low, factor, blended))


# --------------------------------------------------------------------------
# Elementwise pieces.

def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x: [T, dim], w: [dim] -> [T, dim]."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(g: np.ndarray) -> np.ndarray:
    # sigmoid via logaddexp so that very negative inputs don't overflow exp().
    return g * np.exp(-np.logaddexp(0.0, -g))


def rope_angles(positions: np.ndarray, n_rot: int, base: float, divisors=None) -> np.ndarray:
    """[T] positions -> [T, n_rot/2] angles pos * base^(-2i/n_rot) / divisors[i]."""
    i = np.arange(n_rot // 2, dtype=np.float64)
    inv_freq = base ** (-2.0 * i / n_rot)
    if divisors is not None:
        inv_freq = inv_freq / divisors
    return positions.astype(np.float64)[:, None] * inv_freq[None, :]


def rope_adjacent(x: np.ndarray, positions: np.ndarray, n_rot: int, base: float, divisors=None) -> np.ndarray:
    """GGUF/llama.cpp pairing: rotate (x[2i], x[2i+1]).  x: [T, heads, d]."""
    ang = rope_angles(positions, n_rot, base, divisors)[:, None, :]      # [T, 1, n_rot/2]
    c, s = np.cos(ang), np.sin(ang)
    out = x.copy()
    x0 = x[..., 0:n_rot:2]
    x1 = x[..., 1:n_rot:2]
    out[..., 0:n_rot:2] = x0 * c - x1 * s
    out[..., 1:n_rot:2] = x0 * s + x1 * c
    return out


def rope_halfsplit(x: np.ndarray, positions: np.ndarray, n_rot: int, base: float, divisors=None) -> np.ndarray:
    """Hugging Face pairing: rotate (x[i], x[i + n_rot/2]).  x: [T, heads, d]."""
    ang = rope_angles(positions, n_rot, base, divisors)[:, None, :]
    c, s = np.cos(ang), np.sin(ang)
    h = n_rot // 2
    out = x.copy()
    x0 = x[..., 0:h]
    x1 = x[..., h:n_rot]
    out[..., 0:h] = x0 * c - x1 * s
    out[..., h:n_rot] = x0 * s + x1 * c
    return out


def gguf_to_hf_rows(n_heads: int, d: int) -> np.ndarray:
    """Row index map: W_hf = W_gguf[perm].

    Within a head of size d, GGUF row 2i+j holds HF row j*d/2+i (j in {0,1}).
    """
    perm = np.empty(n_heads * d, dtype=np.int64)
    half = d // 2
    for h in range(n_heads):
        for j in range(2):
            for i in range(half):
                perm[h * d + j * half + i] = h * d + 2 * i + j
    return perm


def quantize_q8(x: np.ndarray) -> np.ndarray:
    """Round each run of 32 values to int8 times an fp16 scale amax/127 (then back to float)."""
    b = x.reshape(-1, 32)
    d = np.max(np.abs(b), axis=1, keepdims=True) / 127.0
    safe = np.where(d > 0, d, 1.0)
    q = np.where(d > 0, np.round(b / safe), 0.0)
    return (q * d.astype(np.float16).astype(np.float64)).reshape(x.shape)


# --------------------------------------------------------------------------
# The model.

@dataclasses.dataclass
class LayerWeights:
    attn_norm: np.ndarray   # [dim]
    wq: np.ndarray          # [dim, dim]      rows = heads*head_dim outputs
    wk: np.ndarray          # [kv_dim, dim]
    wv: np.ndarray          # [kv_dim, dim]
    wo: np.ndarray          # [dim, dim]
    ffn_norm: np.ndarray    # [dim]
    w_gate: np.ndarray      # [ffn, dim]
    w_up: np.ndarray        # [ffn, dim]
    w_down: np.ndarray      # [dim, ffn]
    bq: np.ndarray | None = None  # [dim]     qwen2's biases, else None
    bk: np.ndarray | None = None  # [kv_dim]
    bv: np.ndarray | None = None  # [kv_dim]


class KVCache:
    """Keys (after RoPE) and values for every layer; positions 0..length-1 are filled."""

    def __init__(self, hp: Hparams, capacity: int):
        self.capacity = capacity
        self.length = 0
        self.k = np.zeros((hp.n_layer, capacity, hp.n_kv_head, hp.head_dim))  # [L, cap, kvh, d]
        self.v = np.zeros((hp.n_layer, capacity, hp.n_kv_head, hp.head_dim))  # [L, cap, kvh, d]


class RefModel:
    def __init__(self, path: str, pairing: str = "gguf", _shared: "RefModel | None" = None,
                 act_quant: str | None = None):
        # act_quant="q8" rounds every matmul input to Q8 blocks (32 values, int8,
        # fp16 scale), as llama.cpp's CPU path does; only used to explain the size
        # of llama.cpp's logit error, never for fixtures.
        if act_quant not in (None, "q8"):
            raise ValueError("act_quant must be None or 'q8'")
        self.act_quant = act_quant
        # "hf_adjacent" (HF weights rotated with the GGUF pairing) is deliberately
        # wrong; it is the negative control of check_hf_pairing.
        if pairing not in ("gguf", "hf", "hf_adjacent"):
            raise ValueError("pairing must be 'gguf', 'hf' or 'hf_adjacent'")
        self.path = path
        self.pairing = pairing
        if _shared is not None:
            # Reuse another instance's dequantized weights (saves ~1 GB and the load time).
            self.hp = _shared.hp
            self.encodings = _shared.encodings
            self.file_encodings = _shared.file_encodings
            self.tok_embd, self.output, self.output_norm = _shared.tok_embd, _shared.output, _shared.output_norm
            self.rope_freqs = _shared.rope_freqs
            self.layers = [dataclasses.replace(lw) for lw in _shared.layers]
            if _shared.pairing != "gguf":
                raise ValueError("share from a gguf-pairing model")
        else:
            reader = GGUFFile(path)
            self.hp = read_hparams(reader)
            self._tensors = {t.name: t for t in reader.tensors}
            self.encodings = {}
            # Every tensor's encoding, read or not, counted: {"Q4_K": 96, "F32": 61, ...}.
            self.file_encodings = collections.Counter(t.tensor_type.name for t in reader.tensors)
            hp = self.hp
            self.tok_embd = self._load("token_embd.weight", (hp.n_vocab, hp.dim))        # [vocab, dim]
            self.output = self.tok_embd if hp.tied else self._load("output.weight", (hp.n_vocab, hp.dim))
            self.output_norm = self._load("output_norm.weight", (hp.dim,))               # [dim]
            # Llama 3: per-pair divisors of the RoPE frequencies, [n_rot/2], or None.
            self.rope_freqs = (self._load("rope_freqs.weight", (hp.n_rot // 2,))
                               if "rope_freqs.weight" in self._tensors else None)
            self.layers = []
            has_bias = f"blk.0.attn_q.bias" in self._tensors
            for l in range(hp.n_layer):
                b = f"blk.{l}."
                self.layers.append(LayerWeights(
                    attn_norm=self._load(b + "attn_norm.weight", (hp.dim,)),
                    wq=self._load(b + "attn_q.weight", (hp.dim, hp.dim)),
                    wk=self._load(b + "attn_k.weight", (hp.kv_dim, hp.dim)),
                    wv=self._load(b + "attn_v.weight", (hp.kv_dim, hp.dim)),
                    wo=self._load(b + "attn_output.weight", (hp.dim, hp.dim)),
                    ffn_norm=self._load(b + "ffn_norm.weight", (hp.dim,)),
                    w_gate=self._load(b + "ffn_gate.weight", (hp.ffn, hp.dim)),
                    w_up=self._load(b + "ffn_up.weight", (hp.ffn, hp.dim)),
                    w_down=self._load(b + "ffn_down.weight", (hp.dim, hp.ffn)),
                    bq=self._load(b + "attn_q.bias", (hp.dim,)) if has_bias else None,
                    bk=self._load(b + "attn_k.bias", (hp.kv_dim,)) if has_bias else None,
                    bv=self._load(b + "attn_v.bias", (hp.kv_dim,)) if has_bias else None,
                ))
            del self._tensors
        if pairing in ("hf", "hf_adjacent"):
            hp = self.hp
            if hp.arch != "llama":
                raise ValueError("the HF pairing check applies to llama files (qwen2 files are in the HF order already)")
            if hp.n_rot != hp.head_dim:
                raise ValueError("the HF pairing check assumes rope.dimension_count == head_dim")
            pq = gguf_to_hf_rows(hp.n_head, hp.head_dim)
            pk = gguf_to_hf_rows(hp.n_kv_head, hp.head_dim)
            for lw in self.layers:
                lw.wq = lw.wq[pq]
                lw.wk = lw.wk[pk]

    def _load(self, name: str, rows_cols: tuple) -> np.ndarray:
        t = self._tensors.get(name)
        if t is None:
            raise KeyError(f"tensor '{name}' is missing from {self.path}")
        dims = [int(v) for v in t.shape]       # GGUF order: dims[0] is contiguous
        # GGUF dims are {cols, rows}; numpy wants [rows, cols].
        if tuple(reversed(dims)) != rows_cols:
            raise ValueError(f"tensor '{name}': GGUF dims {dims}, expected {list(reversed(rows_cols))}")
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        a = np.asarray(a, dtype=np.float64).reshape(rows_cols)
        self.encodings[name] = t.tensor_type.name
        return a

    def _mm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """x: [T, cols], w: [rows, cols] -> [T, rows]."""
        if self.act_quant == "q8":
            x = quantize_q8(x)
        return x @ w.T

    def new_cache(self, capacity: int = 512) -> KVCache:
        if capacity > self.hp.n_ctx:
            raise ValueError(f"capacity {capacity} exceeds context_length {self.hp.n_ctx}")
        return KVCache(self.hp, capacity)

    def rope_divisors(self):
        """[n_rot/2] divisors of the RoPE frequencies, or None (unscaled)."""
        d = self.rope_freqs
        if self.hp.rope_linear_factor != 1.0:
            d = (np.ones(self.hp.n_rot // 2) if d is None else d) * self.hp.rope_linear_factor
        return d

    def _rope(self, x, positions):
        # A file's native pairing: adjacent for llama (converter-permuted rows),
        # half-split (NEOX) for qwen2.
        native_adjacent = self.hp.arch == "llama"
        args = (positions, self.hp.n_rot, self.hp.rope_base, self.rope_divisors())
        if (self.pairing == "gguf" and native_adjacent) or self.pairing == "hf_adjacent":
            return rope_adjacent(x, *args)
        return rope_halfsplit(x, *args)

    def forward(self, tokens, cache: KVCache, trace: dict | None = None,
                trace_layers=(), rms_log: list | None = None, hidden: bool = False) -> np.ndarray:
        """Feed `tokens` at positions cache.length.. ; returns logits [T, vocab], or with
        hidden=True the final hidden states (after output_norm, before the output matrix)
        [T, dim].

        trace: filled with {layer: {name: [T, ...] array}} for layers in trace_layers.
        rms_log: appended with per-position RMS of the residual stream after the
        embedding, then after each attention block and each MLP block ([T] each).
        """
        hp = self.hp
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        p0 = cache.length
        if p0 + T > cache.capacity:
            raise ValueError(f"KV cache full: {p0} + {T} > {cache.capacity}")
        if tokens.min() < 0 or tokens.max() >= hp.n_vocab:
            raise ValueError("token id out of range")
        pos = np.arange(p0, p0 + T)
        S = p0 + T                                         # keys visible to the last query
        d, H, G = hp.head_dim, hp.n_head, hp.n_kv_head
        scale = 1.0 / np.sqrt(float(d))
        # causal mask [T, S]: query t (at position p0+t) sees keys 0..p0+t
        mask = np.arange(S)[None, :] > pos[:, None]

        x = self.tok_embd[tokens].copy()                   # [T, dim]
        if rms_log is not None:
            rms_log.append(np.sqrt(np.mean(x * x, axis=-1)))
        for l, w in enumerate(self.layers):
            rec = {} if (trace is not None and l in trace_layers) else None
            if rec is not None:
                rec["x_in"] = x.copy()
            n = rmsnorm(x, w.attn_norm, hp.rms_eps)        # [T, dim]
            q = self._mm(n, w.wq)  # [T, H*d]
            k = self._mm(n, w.wk)  # [T, G*d]
            v = self._mm(n, w.wv)  # [T, G*d]
            if w.bq is not None:   # qwen2: biases after the products, before RoPE
                q, k, v = q + w.bq, k + w.bk, v + w.bv
            qr = self._rope(q.reshape(T, H, d), pos)       # [T, H, d]
            kr = self._rope(k.reshape(T, G, d), pos)       # [T, G, d]
            cache.k[l, p0:S] = kr
            cache.v[l, p0:S] = v.reshape(T, G, d)
            K = cache.k[l, :S]                             # [S, G, d]
            V = cache.v[l, :S]                             # [S, G, d]
            att = np.empty((T, H, d))
            for h in range(H):
                g = h // hp.group                          # GQA: query head h reads kv head h // group
                sc = (qr[:, h, :] @ K[:, g, :].T) * scale  # [T, S]
                sc = np.where(mask, -np.inf, sc)
                sc = sc - sc.max(axis=1, keepdims=True)
                p = np.exp(sc)
                p /= p.sum(axis=1, keepdims=True)
                att[:, h, :] = p @ V[:, g, :]              # [T, d]
            a = att.reshape(T, H * d)                      # [T, dim]
            o = self._mm(a, w.wo)  # [T, dim]
            x = x + o
            if rms_log is not None:
                rms_log.append(np.sqrt(np.mean(x * x, axis=-1)))
            n2 = rmsnorm(x, w.ffn_norm, hp.rms_eps)        # [T, dim]
            gate = self._mm(n2, w.w_gate)  # [T, ffn]
            up = self._mm(n2, w.w_up)  # [T, ffn]
            act = silu(gate) * up                          # [T, ffn]
            m = self._mm(act, w.w_down)  # [T, dim]
            if rec is not None:
                rec.update(attn_norm=n, q=q, k=k, v=v, q_rope=qr.reshape(T, H * d),
                           k_rope=kr.reshape(T, G * d), attn=a, attn_out=o, h=x.copy(),
                           ffn_norm=n2, gate=gate, up=up, act=act, mlp=m)
            x = x + m
            if rms_log is not None:
                rms_log.append(np.sqrt(np.mean(x * x, axis=-1)))
            if rec is not None:
                rec["out"] = x.copy()
                trace[l] = rec
        cache.length = S
        xf = rmsnorm(x, self.output_norm, hp.rms_eps)      # [T, dim]
        if hidden:
            return xf
        return self._mm(xf, self.output)  # [T, vocab]

    def embedding(self, tokens, pooling: str = "mean") -> np.ndarray:
        """The text's final hidden states pooled (their mean, or the last position's) and
        scaled to unit L2 length: [dim]."""
        h = self.forward(tokens, self.new_cache(max(16, len(tokens))), hidden=True)
        if pooling == "mean":
            e = h.mean(axis=0)
        elif pooling == "last":
            e = h[-1]
        else:
            raise ValueError("pooling must be 'mean' or 'last'")
        return e / np.linalg.norm(e)

    def prompt_logits(self, tokens) -> np.ndarray:
        cache = self.new_cache(max(16, len(tokens)))
        return self.forward(tokens, cache)

    def greedy(self, tokens, n: int, guess=None):
        """Greedy n tokens (never stops at EOS).  Returns (ids, margins, prompt_logits).

        margins[i] is top1 - top2 of the logits that chose ids[i].

        guess: the continuation another engine chose (tlm's), fed with the prompt in one
        batched forward. Greedy decoding is a function of the prefix, so while the
        reference's choice at each position equals the guess, the guess is the reference's
        own greedy sequence; the choices are read from that one pass over the weights
        instead of one pass a token (the reference is memory-bound: 1.1 GB of float64
        weights a token at 135M). Where the guess parts from the reference, or ends,
        decoding goes on one token at a time from the reference's own choice. The result
        is the token-by-token one up to float64 rounding between a batched and a one-row
        product (about 1e-16 of a logit), which could flip only a choice whose margin is
        that small; the margins are returned.
        """
        T = len(tokens)
        fed = [int(t) for t in (guess or [])][: max(n - 1, 0)]
        cache = self.new_cache(T + n)
        logits = self.forward(list(tokens) + fed, cache)  # [T + len(fed), vocab]
        prompt_logits = logits[:T]
        ids, margins = [], []
        last = logits[T - 1]
        following = True  # ids so far equal fed: logits[T - 1 + len(ids)] chooses the next id
        for i in range(n):
            top2 = np.argpartition(-last, 2)[:2]
            a, b = sorted(top2, key=lambda j: -last[j])
            ids.append(int(a))
            margins.append(float(last[a] - last[b]))
            if i + 1 == n:
                break
            if following and i < len(fed) and fed[i] == a:
                last = logits[T + i]
                continue
            if following:
                # The cache holds the prompt and ids[:i] (= fed[:i]) at its first T + i
                # positions; what it holds beyond is overwritten.
                cache.length = T + i
                following = False
            last = self.forward([a], cache)[0]
        return ids, margins, prompt_logits


# --------------------------------------------------------------------------
# Helpers shared by the fixture scripts.

def token_strings(path: str) -> list[str]:
    return GGUFFile(path).strings("tokenizer.ggml.tokens")


def control_token_ids(path: str) -> set[int]:
    tt = GGUFFile(path).fields["tokenizer.ggml.token_type"]
    return {i for i, t in enumerate(tt) if t == 3}


def _byte_decoder() -> dict:
    # GPT-2 byte-level map: printable bytes keep their code point, the rest
    # map in ascending order to U+0100, U+0101, ...
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    m, extra = {}, 0
    for b in range(256):
        if b in keep:
            m[chr(b)] = b
        else:
            m[chr(0x100 + extra)] = b
            extra += 1
    return m


def decode_with_vocab(vocab: list[str], ids, special_ids=()) -> str:
    """Byte-level BPE decoding from the GGUF vocabulary (no llama.cpp needed)."""
    bd = _byte_decoder()
    out = bytearray()
    for i in ids:
        s = vocab[i]
        if i in special_ids:
            out += s.encode()
        else:
            out += bytes(bd[c] for c in s)
    return out.decode("utf-8", errors="replace")


def check_hf_pairing(model: RefModel, prompts: list[list[int]]) -> tuple[float, float]:
    """Max relative logit difference between the GGUF and HF pairings.

    Returns (hf, control): `hf` must be at rounding level; `control` uses the
    HF weights with the adjacent rotation and must be far off, which shows the
    check can fail.
    """
    hf = RefModel(model.path, pairing="hf", _shared=model)
    wrong = RefModel(model.path, pairing="hf_adjacent", _shared=model)
    worst, control = 0.0, float("inf")
    for toks in prompts:
        a = model.prompt_logits(toks)
        b = hf.prompt_logits(toks)
        c = wrong.prompt_logits(toks)
        scale = np.max(np.abs(a))
        worst = max(worst, float(np.max(np.abs(a - b)) / scale))
        if len(toks) > 1:  # at position 0 every rotation is the identity
            control = min(control, float(np.max(np.abs(a - c)) / scale))
    return worst, control


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", help="comma-separated token ids")
    ap.add_argument("--text", help="prompt text (tokenized with llama-cpp-python)")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--check-hf", action="store_true", help="verify GGUF vs HF RoPE pairing")
    args = ap.parse_args(argv)

    t0 = time.time()
    model = RefModel(args.model)
    hp = model.hp
    print(f"loaded in {time.time() - t0:.1f}s: {hp}", file=sys.stderr)
    vocab = token_strings(args.model)
    if args.prompt_ids:
        toks = [int(s) for s in args.prompt_ids.split(",")]
    else:
        from llama_cpp import Llama
        llm = Llama(model_path=args.model, vocab_only=True, verbose=False)
        toks = llm.tokenize((args.text or "The capital of France is").encode(), add_bos=False, special=True)
    if args.check_hf:
        worst, control = check_hf_pairing(model, [toks])
        print(f"max|gguf-hf|/max|gguf| = {worst:.3e} (must be < 1e-12); "
              f"wrong pairing control = {control:.3e} (must be > 1e-3)")
        return 0 if worst < 1e-12 and control > 1e-3 else 1
    ids, margins, _ = model.greedy(toks, args.n)
    print("prompt ids:", ",".join(map(str, toks)))
    print("generated ids:", ",".join(map(str, ids)))
    print("min margin: %.4f" % min(margins))
    print(repr(decode_with_vocab(vocab, toks + ids, special_ids=control_token_ids(args.model))))
    print(f"total {time.time() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
