#!/usr/bin/env python3
"""Live check of tlm's GGUF reader, writer and block encodings against gguf-py.

Run by ctest as:  python check_gguf.py --build BUILD --model GGUF

1. Real file: every tensor of the real model, dequantized by tlm (`inspect --dump`),
   equals gguf.quants.dequantize bit for bit.
2. Synthetic files written by gguf.GGUFWriter with F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 tensors
   (from gguf.quants.quantize) and Q4_K, Q5_K, Q6_K tensors (random blocks with finite
   scales): tlm's dequantization equals gguf-py's bit for bit.
3. Writer: tlm copies the gguf-py file (`inspect --requantize`, which reads every
   value with tlm's reader and writes it with tlm's writer), re-encoding its F32
   matrices; gguf-py reads the copy back with identical metadata (raw bytes of every
   field), identical untouched tensors, and re-encoded tensors whose bytes equal
   gguf.quants.quantize of the same f32 data.
4. The real model copied by tlm's writer is read back by gguf-py with identical
   metadata and tensor bytes.
5. The reference scripts' own reader (gguf_file.py, which skips gguf-py's slow parse
   of the vocabulary) agrees with gguf.GGUFReader on the files of 1 and 2: every
   metadata value, every tensor's name, dims, type, offset and bytes; and it refuses
   every truncation of a header with an error instead of reading past the end.

Prints the figures and exits non-zero on any mismatch.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_file import GGUFError, GGUFFile, StringArray  # noqa: E402


failures = []


def fail(msg):
    failures.append(msg)
    print("MISMATCH:", msg)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"command failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def tensor_f32_shape(t):
    # gguf-py lists shape as GGUF dims (ne0 first); numpy order is reversed.
    return tuple(int(d) for d in reversed(t.shape.tolist()))


def compare_dequantized(inspect, path, reader, tmp, label, stats):
    """Dumps every tensor of `path` with tlm and compares it to gguf-py, bit for bit."""
    for t in reader.tensors:
        out = Path(tmp) / "dump.f32"
        run([inspect, str(path), "--dump", t.name, str(out)])
        ours = np.fromfile(out, dtype=np.float32)
        ref = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(-1)
        enc = t.tensor_type.name
        s = stats.setdefault(enc, {"tensors": 0, "values": 0, "max_abs_diff": 0.0, "bit_mismatches": 0})
        s["tensors"] += 1
        s["values"] += ref.size
        if ours.size != ref.size:
            fail(f"{label}: {t.name}: tlm dumped {ours.size} values, gguf-py has {ref.size}")
            continue
        mism = int(np.count_nonzero(ours.view(np.uint32) != ref.view(np.uint32)))
        s["bit_mismatches"] += mism
        finite = np.isfinite(ref) & np.isfinite(ours)
        if finite.any():
            s["max_abs_diff"] = max(s["max_abs_diff"], float(np.max(np.abs(ours[finite].astype(np.float64) - ref[finite]))))
        if mism:
            i = int(np.flatnonzero(ours.view(np.uint32) != ref.view(np.uint32))[0])
            fail(f"{label}: {t.name} ({enc}): {mism} of {ref.size} values differ; first at {i}: tlm {ours[i]!r} gguf {ref[i]!r}")


def print_stats(title, stats):
    print(title)
    print(f"  {'enc':<6} {'tensors':>8} {'values':>12} {'bit mismatches':>15} {'max abs diff':>13}")
    for enc, s in sorted(stats.items()):
        print(f"  {enc:<6} {s['tensors']:>8} {s['values']:>12} {s['bit_mismatches']:>15} {s['max_abs_diff']:>13.3g}")


def random_kquant_blocks(rng, qtype, n_blocks):
    """Random K-quant super-blocks whose fp16 scales are finite (random bytes elsewhere)."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    halves = lambda n: rng.uniform(-0.05, 0.05, size=(n_blocks, n)).astype(np.float16).view(np.uint8)
    if qtype in (Q.Q4_K, Q.Q5_K):
        raw[:, 0:4] = halves(2)  # d, dmin
    elif qtype == Q.Q6_K:
        raw[:, type_size - 2:] = halves(1)  # d at the end
    return raw


def edge_rows(cols):
    """Blocks that exercise rounding corners: zeros, constants, exact ties, tiny scales."""
    rows = [np.zeros(cols), np.full(cols, 0.75), np.full(cols, -3.0)]
    r = np.zeros(cols)
    r[0::32] = 127.0
    r[1::32] = 2.5
    r[2::32] = -2.5
    r[3::32] = 0.5
    rows.append(r)
    r = np.arange(cols, dtype=np.float64) % 16 - 8
    rows.append(r)
    r = (np.arange(cols, dtype=np.float64) % 32) / 31.0 - 0.5
    rows.append(r)
    rows.append(np.linspace(-1e-6, 1e-6, cols))
    rows.append(np.linspace(-60000, 60000, cols))
    return np.stack(rows).astype(np.float32)


def field_bytes(field):
    return b"".join(np.asarray(p).tobytes() for p in field.parts)


def compare_files(label, a_path, b_path, requantized=None):
    """a: the original (gguf-py's or the real model), b: tlm's copy. Returns (fields, tensors, quant checks)."""
    a, b = gguf.GGUFReader(a_path), gguf.GGUFReader(b_path)
    fields = 0
    a_keys = [k for k in a.fields if not k.startswith("GGUF.")]
    b_keys = [k for k in b.fields if not k.startswith("GGUF.")]
    if a_keys != b_keys:
        fail(f"{label}: metadata keys differ: {a_keys} vs {b_keys}")
    for k in a_keys:
        if k not in b.fields:
            continue
        fa, fb = a.fields[k], b.fields[k]
        if fa.types != fb.types or field_bytes(fa) != field_bytes(fb):
            fail(f"{label}: metadata '{k}' differs: {fa.types} {fa.contents()!r:.80} vs {fb.types} {fb.contents()!r:.80}")
        fields += 1
    tensors = quantized = 0
    tb = {t.name: t for t in b.tensors}
    for t in a.tensors:
        u = tb.get(t.name)
        if u is None:
            fail(f"{label}: tensor {t.name} missing from tlm's copy")
            continue
        if list(t.shape) != list(u.shape):
            fail(f"{label}: tensor {t.name} shape {list(t.shape)} vs {list(u.shape)}")
            continue
        if requantized is not None and t.tensor_type == Q.F32 and len(t.shape) >= 2 and u.tensor_type == requantized:
            src = np.asarray(t.data, dtype=np.float32).reshape(tensor_f32_shape(t))
            ref = quantize(src, requantized)
            ours = np.asarray(u.data).view(np.uint8).reshape(-1)
            ref = np.asarray(ref).view(np.uint8).reshape(-1)
            if ours.size != ref.size or not np.array_equal(ours, ref):
                n = int(np.count_nonzero(ours != ref)) if ours.size == ref.size else -1
                fail(f"{label}: {t.name} re-encoded as {requantized.name}: {n} of {ref.size} bytes differ from gguf.quants.quantize")
            quantized += 1
        else:
            if t.tensor_type != u.tensor_type or np.asarray(t.data).tobytes() != np.asarray(u.data).tobytes():
                fail(f"{label}: tensor {t.name} ({t.tensor_type.name}) data or type differs in tlm's copy")
            tensors += 1
    return fields, tensors, quantized


def compare_readers(label, path, reader, tmp):
    """gguf_file.GGUFFile against gguf.GGUFReader on one file. Returns (fields, tensors)."""
    mine = GGUFFile(path)
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    if keys != list(mine.fields):
        fail(f"{label}: gguf_file keys {list(mine.fields)[:5]}... vs gguf-py {keys[:5]}...")
    for k in keys:
        want, got = reader.fields[k].contents(), mine.fields.get(k)
        if isinstance(got, StringArray):
            got = got.strings()
        elif isinstance(got, np.ndarray):
            got = got.tolist()
        if isinstance(want, float) or (isinstance(want, list) and want and isinstance(want[0], float)):
            same = np.array_equal(np.asarray(want, dtype=np.float64), np.asarray(got, dtype=np.float64))
        else:
            same = want == got
        if not same:
            fail(f"{label}: gguf_file reads '{k}' as {got!r:.80}, gguf-py as {want!r:.80}")
    if len(mine.tensors) != len(reader.tensors):
        fail(f"{label}: gguf_file finds {len(mine.tensors)} tensors, gguf-py {len(reader.tensors)}")
    for a, b in zip(reader.tensors, mine.tensors):
        if (a.name, [int(d) for d in a.shape], a.tensor_type, int(a.data_offset), int(a.n_bytes)) != \
                (b.name, list(b.shape), b.tensor_type, b.data_offset, b.n_bytes):
            fail(f"{label}: tensor {a.name} {list(a.shape)} {a.tensor_type.name} at {a.data_offset}: gguf_file has "
                 f"{b.name} {list(b.shape)} {b.tensor_type.name} at {b.data_offset}")
        elif a.data.dtype != b.data.dtype or a.data.shape != b.data.shape or a.data.tobytes() != b.data.tobytes():
            fail(f"{label}: tensor {a.name}: gguf_file's data {b.data.dtype}{b.data.shape} differs from "
                 f"gguf-py's {a.data.dtype}{a.data.shape}")
    # Every cut inside the metadata and tensor infos is refused by name, never read past.
    data = Path(path).read_bytes()
    head = mine.tensors[0].data_offset if mine.tensors else len(data)
    cut = Path(tmp) / "cut.gguf"
    for n in sorted({0, 3, 4, 23, 24, 40, head // 3, head // 2, head - 200, head - 1}):
        if not 0 <= n < head:
            continue
        cut.write_bytes(data[:n])
        try:
            GGUFFile(cut)
            fail(f"{label}: gguf_file read a copy cut at byte {n} of {head} without an error")
        except GGUFError:
            pass
    cut.unlink(missing_ok=True)
    return len(keys), len(mine.tensors)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, type=Path)
    ap.add_argument("--model", required=True, type=Path)
    args = ap.parse_args()
    inspect = args.build / "examples" / "inspect"
    if not inspect.exists():
        raise SystemExit(f"{inspect} is missing; build it with `ninja -C {args.build} inspect`")
    if not args.model.exists():
        raise SystemExit(f"{args.model} is missing; run scripts/fetch-model")
    rng = np.random.default_rng(20261129)

    with tempfile.TemporaryDirectory(prefix="check_gguf_") as tmp:
        # 1. the real file
        real = gguf.GGUFReader(args.model)
        stats = {}
        compare_dequantized(inspect, args.model, real, tmp, "real", stats)
        print_stats(f"1. real file {args.model.name}: tlm dequantization vs gguf.quants.dequantize", stats)

        # 2. synthetic files from gguf-py
        syn = Path(tmp) / "gguf_py.gguf"
        w = gguf.GGUFWriter(syn, "llama")
        w.add_uint8("t.u8", 200)
        w.add_int8("t.i8", -5)
        w.add_uint16("t.u16", 60000)
        w.add_int16("t.i16", -30000)
        w.add_uint32("t.u32", 4000000000)
        w.add_int32("t.i32", -2000000000)
        w.add_float32("t.f32", 0.1)
        w.add_bool("t.bool", True)
        w.add_string("t.string", "héllo\nworld")
        w.add_uint64("t.u64", 2**64 - 1)
        w.add_int64("t.i64", -(2**63))
        w.add_float64("t.f64", 1e300)
        w.add_array("t.arr.i32", [-1, 0, 7])
        w.add_array("t.arr.f32", [0.5, -1.25])
        w.add_array("t.arr.str", ["a", "bc", "long string with spaces"])
        w.add_context_length(2048)
        cols = 512
        for qtype in (Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1):
            data = np.concatenate([rng.normal(0, 0.02, size=(24, cols)), edge_rows(cols)]).astype(np.float32)
            if qtype == Q.F16:
                w.add_tensor(f"syn.{qtype.name}", data.astype(np.float16))
            else:
                q = quantize(data, qtype)
                w.add_tensor(f"syn.{qtype.name}", q, raw_dtype=qtype)  # byte shape; gguf-py derives the dims
        for qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
            rows = 16
            raw = random_kquant_blocks(rng, qtype, rows * cols // 256).reshape(rows, -1)
            w.add_tensor(f"syn.{qtype.name}", raw, raw_dtype=qtype)
        # F32 matrices that tlm re-encodes in step 3, with the edge rows included.
        f32_src = np.concatenate([rng.normal(0, 1.0, size=(56, cols)), edge_rows(cols)]).astype(np.float32)
        w.add_tensor("src.matrix", f32_src)
        w.add_tensor("src.norm", rng.normal(1, 0.1, size=(cols,)).astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        stats = {}
        compare_dequantized(inspect, syn, gguf.GGUFReader(syn), tmp, "synthetic", stats)
        print_stats("2. gguf-py-written file: tlm dequantization vs gguf.quants.dequantize", stats)

        # 3. tlm's writer: copy gguf-py's file, re-encoding the F32 matrices
        total_q = 0
        for qtype, name in ((Q.F16, "f16"), (Q.BF16, "bf16"), (Q.Q8_0, "q8_0"), (Q.Q4_0, "q4_0"), (Q.Q4_1, "q4_1"),
                            (Q.Q5_0, "q5_0"), (Q.Q5_1, "q5_1")):
            out = Path(tmp) / f"tlm_{name}.gguf"
            run([inspect, str(syn), "--requantize", name, str(out)])
            fields, tensors, quantized = compare_files(f"tlm copy ({name})", syn, out, requantized=qtype)
            total_q += quantized
            if quantized != 1:
                fail(f"tlm copy ({name}): expected 1 re-encoded tensor, found {quantized}")
        print(f"3. tlm writer: {fields} metadata fields and {tensors} tensors identical in each copy; "
              f"{total_q} tensors re-encoded by tlm (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) byte-identical to gguf.quants.quantize")

        # 4. the real model through tlm's reader and writer
        out = Path(tmp) / "real_copy.gguf"
        run([inspect, str(args.model), "--requantize", "q8_0", str(out)])
        fields, tensors, _ = compare_files("real copy", args.model, out)
        same = Path(out).read_bytes() == args.model.read_bytes()
        print(f"4. real model copied by tlm: {fields} metadata fields, {tensors} tensors identical in gguf-py; "
              f"file byte-identical to the original: {same}")

        # 5. the reference scripts' reader against gguf-py's
        for label, path, reader in (("real", args.model, real), ("synthetic", syn, gguf.GGUFReader(syn))):
            fields, tensors = compare_readers(f"gguf_file ({label})", path, reader, tmp)
            print(f"5. gguf_file.py vs gguf.GGUFReader, {label} file: {fields} metadata values, {tensors} tensors "
                  f"(dims, type, offset, bytes) identical; truncated headers refused")

    if failures:
        print(f"FAILED: {len(failures)} mismatches")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
