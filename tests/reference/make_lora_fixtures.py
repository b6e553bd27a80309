#!/usr/bin/env python3
"""Writes tests/fixtures/lora/: small damaged LoRA adapters for SmolLM2-135M (llama,
dim 576), for the CLI tests of `generate --lora` (tests/CMakeLists.txt).

    python make_lora_fixtures.py

  small.gguf      rank 1 on blk.0.attn_q, values ~0.01: valid, and too small to change the text
  nan.gguf        rank 1 on blk.0.attn_q; lora_b holds a NaN at index 3
  wrong_dims.gguf rank 1 on blk.0.attn_q; lora_a of GGUF dims [64, 1], not [576, 1]
"""
from pathlib import Path

import numpy as np
import gguf

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "lora"


def write(name: str, a: np.ndarray, b: np.ndarray) -> None:
    w = gguf.GGUFWriter(str(OUT / name), "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 1.0)
    w.add_tensor("blk.0.attn_q.weight.lora_a", a)  # numpy [r, in]: GGUF dims [in, r]
    w.add_tensor("blk.0.attn_q.weight.lora_b", b)  # numpy [out, r]: GGUF dims [r, out]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1, 576)).astype(np.float32) * 0.01
    b = rng.standard_normal((576, 1)).astype(np.float32) * 0.01
    nan_b = b.copy()
    nan_b[3, 0] = np.nan
    write("small.gguf", a, b)
    write("nan.gguf", a, nan_b)
    write("wrong_dims.gguf", a[:, :64].copy(), b)


if __name__ == "__main__":
    main()
