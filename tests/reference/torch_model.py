#!/usr/bin/env python3
"""A Llama model in PyTorch, the reference for tlm's training (gradients, AdamW).

Written from the architecture's definition and independent of the C++ engine and of
ref_forward.py (which it is cross-checked against: `python torch_model.py --self-test`).
The conventions are tlm's and the GGUF file's:

- Weights are named as GGUF tensors and shaped [rows = outputs, cols = inputs]; a
  linear layer is y = x Wᵀ.
- RMSNorm y = x / sqrt(mean(x²) + eps) * g.
- H = kv_heads·group query heads of width E = 2·half_head; query head h reads kv head
  h // group (GQA).
- RoPE on ADJACENT pairs (x[2i], x[2i+1]) inside each head, angle pos·theta^(−2i/E),
  (u, v) → (u cos − v sin, u sin + v cos); positions 0..T−1 in every sequence.
- Causal attention written as a plain masked softmax over the T×T scores (not a
  blockwise/flash computation), scale 1/sqrt(E).
- SwiGLU MLP silu(gate)·up → ffn_down; residual adds around attention and MLP.
- Final RMSNorm, logits = x Wᵀ with W = output.weight, or token_embd.weight when tied.
- The traits of other families, as config fields: q/k/v biases (Qwen2: y = x Wᵀ + b);
  RoPE on the two HALVES (x[i], x[i + E/2]) for `qwen2` files, which are not permuted;
  Llama 3's per-pair frequency divisors, written here from Meta's published rule
  (wavelength below original/high: 1; above original/low: factor; a blend between).
- LoRA: a targeted matrix computes x Wᵀ + (alpha / r)·(x Aᵀ) Bᵀ with A [r, in], B [out, r]
  (PEFT's and llama.cpp's convention), W frozen.
- Loss: mean cross-entropy over the positions whose target is not −1.
- AdamW: torch.optim.AdamW itself, weight decay on rank-2 tensors only, gradients
  clipped by global norm (torch.nn.utils.clip_grad_norm_) before every step, and the
  learning rate of step t = 1..S set by `lr_at` (linear warm-up, then cosine).

Everything runs in the dtype of the parameters handed in (float64 for references,
float32 for a float comparison).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch


# --------------------------------------------------------------------------
# Configurations (the same free hyperparameters as include/tlm/config.hpp).

@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    kv_heads: int
    group: int
    half_head: int
    ffn: int
    layers: int
    vocab: int
    rms_eps: float
    rope_theta: float
    tied: bool
    context: int
    bias: bool = False               # q/k/v biases (Qwen2)
    pairing: str = "adjacent"        # "adjacent" (llama files) or "half" (qwen2 files)
    llama3: tuple | None = None      # (factor, low_freq_factor, high_freq_factor, original_context)

    @property
    def heads(self) -> int:
        return self.kv_heads * self.group

    @property
    def head_dim(self) -> int:
        return 2 * self.half_head

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


CONFIGS = {c.name: c for c in [
    #      name            kvh grp half  ffn  L  vocab  eps    theta     tied   context
    Config("tiny_gqa",       2, 2,  4,   64, 2,    96, 1e-5, 10000.0,  True,    64),
    Config("tiny_untied",    1, 4, 16,   96, 2,   256, 1e-6, 10000.0,  False,  128),
    Config("tiny_train",     2, 2,  8,  256, 2,   512, 1e-5, 10000.0,  True,    64),
    Config("smollm2_135m",   3, 3, 32, 1536, 30, 49152, 1e-5, 100000.0, True,  8192),
    Config("tiny_qwen2",     2, 2,  4,   64, 2,    96, 1e-6, 10000.0,  True,    64, bias=True, pairing="half"),
    Config("tiny_traits",    2, 2,  4,   64, 2,    96, 1e-5, 10000.0,  False,   64, bias=True, pairing="half",
           llama3=(8.0, 1.0, 4.0, 1024)),
]}

BIASES = {"attn_q": "dim", "attn_k": "kv_dim", "attn_v": "kv_dim"}

LAYER_TENSORS = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]


def layer_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """The 9 tensors of one block, by short name, as [rows, cols]."""
    D, K, F = cfg.dim, cfg.kv_dim, cfg.ffn
    return {
        "attn_norm": (D,), "attn_q": (D, D), "attn_k": (K, D), "attn_v": (K, D),
        "attn_output": (D, D), "ffn_norm": (D,), "ffn_gate": (F, D), "ffn_up": (F, D),
        "ffn_down": (D, F),
    }


def tensor_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every weight by GGUF name, in file order, as [rows, cols] (1-D for norm gains)."""
    shapes = {"token_embd.weight": (cfg.vocab, cfg.dim)}
    for l in range(cfg.layers):
        for short, shape in layer_shapes(cfg).items():
            shapes[f"blk.{l}.{short}.weight"] = shape
        if cfg.bias:
            for short, width in BIASES.items():
                shapes[f"blk.{l}.{short}.bias"] = (getattr(cfg, width),)
    shapes["output_norm.weight"] = (cfg.dim,)
    if not cfg.tied:
        shapes["output.weight"] = (cfg.vocab, cfg.dim)
    if cfg.llama3:
        shapes["rope_freqs.weight"] = (cfg.half_head,)
    return shapes


def llama3_divisors(cfg: Config) -> np.ndarray:
    """[E/2] the divisor of each pair's frequency under Llama 3's scaling (1 without it)."""
    E = cfg.head_dim
    if not cfg.llama3:
        return np.ones(E // 2)
    factor, low, high, original = cfg.llama3
    out = np.empty(E // 2)
    for i in range(E // 2):
        wavelength = 2 * math.pi * cfg.rope_theta ** (2.0 * i / E)
        if wavelength < original / high:
            out[i] = 1.0
        elif wavelength > original / low:
            out[i] = factor
        else:
            smooth = (original / wavelength - low) / (high - low)
            out[i] = 1.0 / ((1.0 - smooth) / factor + smooth)
    return out


def init_weights(cfg: Config, seed: int, scheme: str = "unit") -> dict[str, np.ndarray]:
    """Seeded float32 weights by GGUF name.

    scheme "unit" (the fixtures): matrices N(0, 1/in_features), norm gains 1 + 0.1·N(0, 1),
    so activations and gradients are O(1); token_embd N(0, 1) when untied, but N(0, 1/dim)
    when tied, since it is then the output matrix too (with N(0, 1) the logits would have a
    spread of sqrt(dim) and the softmax would saturate: a loss of 20 on tiny_gqa).
    scheme "llama" (the benchmark): matrices and embeddings N(0, 0.02²), gains 1.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in tensor_shapes(cfg).items():
        if name == "rope_freqs.weight":   # a constant of the config, not drawn
            out[name] = llama3_divisors(cfg).astype(np.float32)
            continue
        if name.endswith(".bias"):
            a = 0.1 * rng.standard_normal(shape)
        elif len(shape) == 1:
            a = 1.0 + 0.1 * rng.standard_normal(shape) if scheme == "unit" else np.ones(shape)
        elif scheme == "unit":
            std = 1.0 if (name == "token_embd.weight" and not cfg.tied) else 1.0 / math.sqrt(shape[1])
            a = std * rng.standard_normal(shape)
        elif scheme == "llama":
            a = 0.02 * rng.standard_normal(shape)
        else:
            raise ValueError(f"unknown init scheme '{scheme}'")
        out[name] = a.astype(np.float32)
    return out


# --------------------------------------------------------------------------
# The ops, each on [..., width] tensors.

def rmsnorm(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * g


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., cols], w [rows, cols] -> [..., rows]."""
    return x @ w.t()


def rope_tables(T: int, head_dim: int, theta: float, dtype,
                divisors: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, head_dim/2] of the angles pos·theta^(−2i/head_dim) / divisor[i], built in float64."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / head_dim)
    if divisors is not None:
        inv_freq = inv_freq / torch.tensor(divisors, dtype=torch.float64)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def rope_adjacent(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, E]: rotate each adjacent pair (x[2i], x[2i+1]) by the angle of (t, i)."""
    B, T, n, E = x.shape
    pairs = x.reshape(B, T, n, E // 2, 2)
    u, v = pairs[..., 0], pairs[..., 1]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    return torch.stack((u * c - v * s, u * s + v * c), dim=-1).reshape(B, T, n, E)


def rope_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, E]: rotate each pair (x[i], x[i + E/2]) by the angle of (t, i)."""
    E = x.shape[-1]
    u, v = x[..., : E // 2], x[..., E // 2:]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    return torch.cat((u * c - v * s, u * s + v * c), dim=-1)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int) -> torch.Tensor:
    """q [B, T, H, E], k and v [B, T, G, E] -> [B, T, H, E], plain masked softmax over T×T."""
    B, T, H, E = q.shape
    # Query head h reads kv head h // group: repeat each kv head `group` times in a row.
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bthe,bshe->bhts", q, k) / math.sqrt(E)         # [B, H, T, T]
    future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)          # key s > query t
    scores = scores.masked_fill(future, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return torch.einsum("bhts,bshe->bthe", p, v)


def block(x: torch.Tensor, w: dict[str, torch.Tensor], cfg: Config,
          cos: torch.Tensor, sin: torch.Tensor, lora: dict | None = None) -> torch.Tensor:
    """One Llama block. x [B, T, D]; w holds the 9 layer tensors by short name (and the
    biases as "<short>.bias"); lora maps a short name to (A, B, scale) for the targeted ones."""
    B, T, _ = x.shape
    H, G, E = cfg.heads, cfg.kv_heads, cfg.head_dim
    rope = rope_half if cfg.pairing == "half" else rope_adjacent

    def proj(short: str, inp: torch.Tensor) -> torch.Tensor:
        y = linear(inp, w[short])
        if short + ".bias" in w:
            y = y + w[short + ".bias"]
        if lora and short in lora:
            a, b, scale = lora[short]
            y = y + scale * linear(linear(inp, a), b)
        return y

    n = rmsnorm(x, w["attn_norm"], cfg.rms_eps)
    q = rope(proj("attn_q", n).reshape(B, T, H, E), cos, sin)
    k = rope(proj("attn_k", n).reshape(B, T, G, E), cos, sin)
    v = proj("attn_v", n).reshape(B, T, G, E)
    a = causal_attention(q, k, v, cfg.group).reshape(B, T, H * E)
    x = x + proj("attn_output", a)
    n2 = rmsnorm(x, w["ffn_norm"], cfg.rms_eps)
    gate = proj("ffn_gate", n2)
    up = proj("ffn_up", n2)
    h = gate * torch.sigmoid(gate) * up
    return x + proj("ffn_down", h)


def layer_weights(params: dict[str, torch.Tensor], l: int) -> dict[str, torch.Tensor]:
    w = {short: params[f"blk.{l}.{short}.weight"] for short in LAYER_TENSORS}
    for short in BIASES:
        if f"blk.{l}.{short}.bias" in params:
            w[short + ".bias"] = params[f"blk.{l}.{short}.bias"]
    return w


def layer_lora(adapter: dict[str, torch.Tensor], scale: float, l: int) -> dict:
    """The (A, B, scale) of layer l's targeted matrices from adapter tensors named as
    llama.cpp's files name them: blk.<l>.<short>.weight.lora_a / .lora_b."""
    out = {}
    for short in LAYER_TENSORS:
        a = adapter.get(f"blk.{l}.{short}.weight.lora_a")
        if a is not None:
            out[short] = (a, adapter[f"blk.{l}.{short}.weight.lora_b"], scale)
    return out


def forward(params: dict[str, torch.Tensor], cfg: Config, tokens: torch.Tensor,
            adapter: dict[str, torch.Tensor] | None = None, scale: float = 0.0) -> torch.Tensor:
    """tokens [B, T] (int64) -> logits [B, T, V]; with the LoRA `adapter` scaled by `scale`."""
    B, T = tokens.shape
    emb = params["token_embd.weight"]
    cos, sin = rope_tables(T, cfg.head_dim, cfg.rope_theta, emb.dtype, llama3_divisors(cfg))
    x = emb[tokens]                                                       # [B, T, D]
    for l in range(cfg.layers):
        x = block(x, layer_weights(params, l), cfg, cos, sin, layer_lora(adapter, scale, l) if adapter else None)
    x = rmsnorm(x, params["output_norm.weight"], cfg.rms_eps)
    out = emb if cfg.tied else params["output.weight"]
    return linear(x, out)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore: int = -1) -> torch.Tensor:
    """Mean over the positions whose target is not `ignore` of −log softmax(logits)[target]."""
    z = logits.reshape(-1, logits.shape[-1])
    y = targets.reshape(-1)
    keep = y != ignore
    if not bool(keep.any()):
        raise ValueError("every target is masked: the mean cross-entropy is undefined")
    z, y = z[keep], y[keep]
    m = z.max(dim=-1, keepdim=True).values.detach()
    lse = (m + torch.log(torch.exp(z - m).sum(dim=-1, keepdim=True))).squeeze(-1)
    picked = z.gather(1, y[:, None]).squeeze(1)
    return (lse - picked).mean()


def loss_fn(params, cfg, tokens, targets, adapter=None, scale=0.0) -> torch.Tensor:
    return cross_entropy(forward(params, cfg, tokens, adapter, scale), targets)


# --------------------------------------------------------------------------
# Training: AdamW as torch.optim.AdamW, clipping, the learning-rate schedule.

@dataclasses.dataclass(frozen=True)
class TrainHparams:
    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip: float = 1.0
    warmup: int = 3
    steps: int = 10
    min_lr: float = 3e-4


def lr_at(t: int, hp: TrainHparams) -> float:
    """Learning rate of step t = 1..steps: linear warm-up, then cosine towards min_lr.

    As tlm::learning_rate: the first step after warm-up is at the peak (progress 0) and
    the last step still above min_lr (progress (steps - warmup - 1) / (steps - warmup)).
    """
    if t <= hp.warmup:
        return hp.lr * t / hp.warmup
    frac = (t - hp.warmup - 1) / (hp.steps - hp.warmup)
    return hp.min_lr + 0.5 * (hp.lr - hp.min_lr) * (1.0 + math.cos(math.pi * frac))


def make_params(weights: dict[str, np.ndarray], dtype=torch.float64) -> dict[str, torch.Tensor]:
    """Trainable leaf tensors from float32 numpy weights (the f32 values, widened exactly)."""
    return {n: torch.tensor(a, dtype=dtype, requires_grad=True) for n, a in weights.items()}


def make_optimizer(params: dict[str, torch.Tensor], hp: TrainHparams) -> torch.optim.AdamW:
    decay = [p for p in params.values() if p.dim() == 2]
    no_decay = [p for p in params.values() if p.dim() != 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": hp.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=hp.lr, betas=(hp.beta1, hp.beta2), eps=hp.eps)


def train_step(params, opt, cfg, tokens, targets, t: int, hp: TrainHparams) -> tuple[float, float]:
    """One step t (1-based): loss, backward, clip, AdamW at lr_at(t). Returns (loss, grad norm before clipping)."""
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(params, cfg, tokens, targets)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(list(params.values()), hp.clip)
    for g in opt.param_groups:
        g["lr"] = lr_at(t, hp)
    opt.step()
    return float(loss.detach()), float(norm)


# --------------------------------------------------------------------------
# Self-test: this model against the numpy reference of ref_forward.py on random
# weights (forward), and against central finite differences (gradients).

def _self_test() -> int:
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    import ref_forward as rf

    ok = True
    for name in ("tiny_gqa", "tiny_untied", "tiny_qwen2", "tiny_traits"):
        cfg = CONFIGS[name]
        w = init_weights(cfg, seed=7)
        params = make_params(w)
        tokens = torch.tensor(np.random.default_rng(1).integers(0, cfg.vocab, size=(2, 9)))
        with torch.no_grad():
            ours = forward(params, cfg, tokens).numpy()
        # The numpy reference, fed the same weights without a GGUF file. Its Llama 3
        # divisors come from the file's rope_freqs tensor, here this module's
        # llama3_divisors: that rule is checked against tlm's, not by this test.
        m = rf.RefModel.__new__(rf.RefModel)
        m.act_quant, m.pairing = None, "gguf"
        m.hp = rf.Hparams(arch="qwen2" if cfg.pairing == "half" else "llama", n_layer=cfg.layers, dim=cfg.dim,
                          ffn=cfg.ffn, n_head=cfg.heads,
                          n_kv_head=cfg.kv_heads, head_dim=cfg.head_dim, n_rot=cfg.head_dim,
                          rope_base=cfg.rope_theta, rms_eps=cfg.rms_eps, n_vocab=cfg.vocab, n_ctx=cfg.context,
                          tied=cfg.tied, bos_id=None, eos_id=None, add_bos=None)
        f64 = {k: v.astype(np.float64) for k, v in w.items()}
        m.tok_embd = f64["token_embd.weight"]
        m.output = m.tok_embd if cfg.tied else f64["output.weight"]
        m.output_norm = f64["output_norm.weight"]
        m.rope_freqs = llama3_divisors(cfg) if cfg.llama3 else None   # exact, not the f32 tensor
        m.layers = [rf.LayerWeights(*(f64[f"blk.{l}.{s}.weight"] for s in LAYER_TENSORS),
                                    *(f64.get(f"blk.{l}.{s}.bias") for s in BIASES))
                    for l in range(cfg.layers)]
        ref = np.stack([m.prompt_logits(list(map(int, row))) for row in tokens])
        fwd = np.abs(ours - ref).max() / np.abs(ref).max()

        targets = torch.tensor(np.random.default_rng(2).integers(0, cfg.vocab, size=(2, 9)))
        targets[0, :3] = -1
        loss = loss_fn(params, cfg, tokens, targets)
        loss.backward()
        ce = float(torch.nn.functional.cross_entropy(
            forward(params, cfg, tokens).reshape(-1, cfg.vocab), targets.reshape(-1), ignore_index=-1))
        worst_fd = 0.0
        rng = np.random.default_rng(3)
        for pname, p in params.items():
            if pname == "rope_freqs.weight":   # a constant: the forward uses llama3_divisors(cfg)
                continue
            flat = p.detach().view(-1)
            for idx in rng.choice(flat.numel(), size=min(4, flat.numel()), replace=False):
                h = 1e-5
                old = float(flat[idx])
                with torch.no_grad():
                    flat[idx] = old + h
                    up = float(loss_fn(params, cfg, tokens, targets))
                    flat[idx] = old - h
                    dn = float(loss_fn(params, cfg, tokens, targets))
                    flat[idx] = old
                fd = (up - dn) / (2 * h)
                an = float(p.grad.view(-1)[idx])
                worst_fd = max(worst_fd, abs(fd - an) / max(1e-3, float(p.grad.abs().max())))
        print(f"{name}: forward vs ref_forward.py {fwd:.2e} (< 1e-12); loss vs F.cross_entropy "
              f"{abs(ce - float(loss)):.2e} (< 1e-12); gradient vs finite differences {worst_fd:.2e} (< 1e-7)")
        ok &= fwd < 1e-12 and abs(ce - float(loss)) < 1e-12 and worst_fd < 1e-7
    print("self-test", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    import sys
    if sys.argv[1:] != ["--self-test"]:
        sys.exit("usage: torch_model.py --self-test   (the model is a module for the other scripts)")
    sys.exit(_self_test())
