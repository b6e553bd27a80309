#!/usr/bin/env python3
"""Write tests/fixtures/gguf/tiny.gguf (also the first seed of fuzz/seeds/fuzz_gguf).

    .venv/bin/python tests/reference/make_tiny_gguf.py [--out PATH] [--check]

A small GGUF v3 file written by the gguf package's own writer (independent of tlm's),
with one metadata value of each kind the reader decodes and one tensor of each
encoding family:
  general.architecture "llama", llama.context_length u32 64, llama.rope.freq_base f32
  10000, t.i64 -3, t.f64 2.5, t.bool true, tokenizer.ggml.tokens ["<s>", "a", "b c"],
  tokenizer.ggml.token_type i32 [3, 1, 1], t.scores f32 [0, -1, -2];
  f32 and f16 [32] = sinf(0.1f i); q8 (Q8_0, 2 rows of 32), q40 (Q4_0, 32) and q41
  (Q4_1, 64) = sin(0.1 i) for i = 0, 1, ... quantized by gguf.quants; q6k (Q6_K, 256),
  one block of 0x11 bytes, written raw because gguf.quants cannot quantize Q6_K.
--check compares with the committed file instead of writing (exit 1 when they differ).
"""
import argparse
import ctypes
import ctypes.util
import sys
import tempfile
from pathlib import Path

import numpy as np

import gguf
from gguf import quants

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "gguf" / "tiny.gguf"
Q = gguf.GGMLQuantizationType


def sines(n: int) -> np.ndarray:
    # C's sinf(0.1f * i), from the C library itself: test_gguf.cpp compares the f32 tensor
    # with std::sin(0.1f * i) exactly, and numpy's sine (float32, or float64 rounded once)
    # differs from the C library's in the last bit for some i.
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.sinf.restype = ctypes.c_float
    libm.sinf.argtypes = [ctypes.c_float]
    args = np.float32(0.1) * np.arange(n, dtype=np.float32)
    return np.array([libm.sinf(float(a)) for a in args], dtype=np.float32)


def write(path: Path) -> None:
    w = gguf.GGUFWriter(str(path), arch="llama")   # writes general.architecture first
    w.add_uint32("llama.context_length", 64)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_int64("t.i64", -3)
    w.add_float64("t.f64", 2.5)
    w.add_bool("t.bool", True)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b c"])
    w.add_key_value("tokenizer.ggml.token_type", [3, 1, 1], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    w.add_array("t.scores", [0.0, -1.0, -2.0])
    w.add_tensor("f32", sines(32))
    w.add_tensor("f16", sines(32).astype(np.float16))
    for name, kind, rows, cols in (("q8", Q.Q8_0, 2, 32), ("q40", Q.Q4_0, 1, 32), ("q41", Q.Q4_1, 1, 64)):
        values = sines(rows * cols)
        data = quants.quantize(values.reshape(rows, cols) if rows > 1 else values, kind)  # one row: 1-D
        w.add_tensor(name, data, raw_dtype=kind)  # the element shape follows from the byte shape
    q6k = np.full(210, 0x11, dtype=np.uint8)
    w.add_tensor("q6k", q6k, raw_dtype=Q.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if not args.check:
        write(args.out)
        print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
        return 0
    with tempfile.TemporaryDirectory() as td:
        fresh = Path(td) / "tiny.gguf"
        write(fresh)
        same = fresh.read_bytes() == args.out.read_bytes()
    print(f"{args.out}: {'identical to' if same else 'DIFFERS from'} what this script writes")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
