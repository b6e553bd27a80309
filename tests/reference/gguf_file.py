"""A small GGUF reader for the reference scripts: metadata and tensor locations.

Why not gguf.GGUFReader: it turns every element of every array into numpy parts in
Python before anything can be read, 3.7 s for SmolLM2's 49,152-token vocabulary and
13 s for Llama 3's 128,256 tokens and 280,147 merges; the reference checks open
such files dozens of times per CI run. This reader walks the key/value section with
struct on one mapping of the file (arrays of numbers become numpy views, arrays of
strings are decoded only when asked for) and locates every tensor's bytes.

The numerics stay the gguf package's: tensors are dequantized with
gguf.quants.dequantize, and GGML_QUANT_SIZES gives each encoding's block geometry.
check_gguf.py compares this reader with gguf.GGUFReader on the real model file, key
by key and tensor by tensor, so the two cannot drift apart unnoticed.
"""
from __future__ import annotations

import dataclasses
import mmap
import pathlib
import struct

import numpy as np

# GGUF value types (the GGUF specification's numbering).
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
          6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    pass


class StringArray:
    """An array of strings, decoded on first use (a 128k vocabulary costs ~0.1 s)."""

    def __init__(self, buf, offset: int, count: int, path: str, key: str):
        self._buf, self._offset, self._count = buf, offset, count
        self._path, self._key = path, key
        self._items: list[bytes] | None = None
        self.end = self._walk(decode=False)

    def _walk(self, decode: bool):
        buf, pos, items = self._buf, self._offset, [] if decode else None
        size = len(buf)
        for i in range(self._count):
            if pos + 8 > size:
                raise GGUFError(f"{self._path}: '{self._key}' element {i} runs past the end of the file")
            (n,) = struct.unpack_from("<Q", buf, pos)
            pos += 8
            if pos + n > size:
                raise GGUFError(f"{self._path}: '{self._key}' element {i} ({n} bytes) runs past the end of the file")
            if decode:
                items.append(bytes(buf[pos:pos + n]))
            pos += n
        if decode:
            self._items = items
        return pos

    def raw(self) -> list[bytes]:
        if self._items is None:
            self._walk(decode=True)
        return self._items

    def strings(self) -> list[str]:
        return [b.decode("utf-8") for b in self.raw()]

    def __len__(self) -> int:
        return self._count


@dataclasses.dataclass
class Tensor:
    name: str
    shape: tuple          # GGUF order: shape[0] is the contiguous dimension
    tensor_type: object   # gguf.GGMLQuantizationType
    data_offset: int      # from the start of the file
    n_bytes: int
    data: np.ndarray      # what gguf.quants.dequantize takes: float32/float16 values, else uint8 rows


class GGUFFile:
    """fields: key -> int | float | bool | str | np.ndarray (numeric arrays) | StringArray
    | list (arrays of arrays, rare). tensors: in file order."""

    def __init__(self, path, tensors: bool = True):
        """tensors=False reads the metadata only, and works without the gguf package."""
        self.path = str(path)
        with open(self.path, "rb") as f:
            size = pathlib.Path(self.path).stat().st_size
            if size < 24:
                raise GGUFError(f"{self.path}: {size} bytes, too short for a GGUF header")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buf = memoryview(self._map)
        self._pos = 0
        if bytes(buf[:4]) != b"GGUF":
            raise GGUFError(f"{self.path}: not a GGUF file (magic {bytes(buf[:4])!r})")
        self._pos = 4
        self.version = self._take(buf, "<I")
        if self.version not in (2, 3):
            raise GGUFError(f"{self.path}: GGUF version {self.version}, this reader knows 2 and 3")
        n_tensors, n_kv = self._take(buf, "<Q"), self._take(buf, "<Q")
        self.fields: dict = {}
        for _ in range(n_kv):
            key = self._string(buf).decode("utf-8")
            self.fields[key] = self._value(buf, self._take(buf, "<I"), key)
        infos = []
        for _ in range(n_tensors):
            name = self._string(buf).decode("utf-8")
            n_dims = self._take(buf, "<I")
            shape = tuple(self._take(buf, "<Q") for _ in range(n_dims))
            kind, rel = self._take(buf, "<I"), self._take(buf, "<Q")
            infos.append((name, shape, kind, rel))
        self.tensors: list[Tensor] = []
        if not tensors:
            return
        import gguf  # the block geometry and the type enum are the gguf package's

        align = int(self.fields.get("general.alignment", 32))
        start = (self._pos + align - 1) // align * align
        for name, shape, kind, rel in infos:
            try:
                qtype = gguf.GGMLQuantizationType(kind)
            except ValueError:
                raise GGUFError(f"{self.path}: tensor '{name}' has unknown type {kind}") from None
            block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
            count = int(np.prod(shape)) if shape else 1
            if not shape or shape[0] % block:
                raise GGUFError(f"{self.path}: tensor '{name}' dims {list(shape)} do not fit {qtype.name} blocks of {block}")
            n_bytes = count // block * block_bytes
            at = start + rel
            if at + n_bytes > size:
                raise GGUFError(f"{self.path}: tensor '{name}' ({n_bytes} bytes at {at}) runs past the end of the file ({size} bytes)")
            rows = tuple(reversed(shape[1:]))
            raw = np.frombuffer(self._map, dtype=np.uint8, count=n_bytes, offset=at)
            if qtype == gguf.GGMLQuantizationType.F32:
                data = raw.view(np.float32).reshape(rows + (shape[0],))
            elif qtype == gguf.GGMLQuantizationType.F16:
                data = raw.view(np.float16).reshape(rows + (shape[0],))
            else:
                data = raw.reshape(rows + (shape[0] // block * block_bytes,))
            self.tensors.append(Tensor(name, shape, qtype, at, n_bytes, data))

    # -- metadata
    def get(self, key: str, default=None):
        return self.fields.get(key, default)

    def strings(self, key: str) -> list[str]:
        v = self.fields[key]
        if not isinstance(v, StringArray):
            raise GGUFError(f"{self.path}: '{key}' is not an array of strings")
        return v.strings()

    # -- parsing
    def _take(self, buf, fmt):
        try:
            (v,) = struct.unpack_from(fmt, buf, self._pos)
        except struct.error:
            raise GGUFError(f"{self.path}: truncated at byte {self._pos}") from None
        self._pos += struct.calcsize(fmt)
        return v

    def _string(self, buf) -> bytes:
        n = self._take(buf, "<Q")
        if self._pos + n > len(buf):
            raise GGUFError(f"{self.path}: a {n}-byte string at byte {self._pos} runs past the end of the file")
        self._pos += n
        return bytes(buf[self._pos - n:self._pos])

    def _value(self, buf, t: int, key: str):
        if t == _STRING:
            return self._string(buf).decode("utf-8")
        if t in _SCALAR:
            return self._take(buf, _SCALAR[t])
        if t != _ARRAY:
            raise GGUFError(f"{self.path}: '{key}' has unknown value type {t}")
        et, n = self._take(buf, "<I"), self._take(buf, "<Q")
        if et in _NUMPY:
            width = np.dtype(_NUMPY[et]).itemsize
            if self._pos + n * width > len(buf):
                raise GGUFError(f"{self.path}: array '{key}' of {n} runs past the end of the file")
            a = np.frombuffer(self._map, dtype=_NUMPY[et], count=n, offset=self._pos)
            self._pos += n * width
            return a
        if et == _STRING:
            s = StringArray(buf, self._pos, n, self.path, key)
            self._pos = s.end
            return s
        return [self._value(buf, et, key) for _ in range(n)]
