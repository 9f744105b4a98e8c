"""Raw safetensors header parsing: validate one file's header and list its tensors, reading no tensor data.

Safetensors layout (the format's spec): 8-byte little-endian header length N, N bytes of JSON
header ``{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}``, then
the data section; offsets are relative to the data section. The header is parsed and checked
here (so every problem gets a one-line :class:`DascInputError` naming the file) into a
:class:`SafetensorsHeader` of :class:`TensorEntry` records.

:mod:`dasc_compile.checkpoint` builds on this to locate a checkpoint and read its decay tensors;
it re-exports :func:`read_safetensors_header`, :class:`SafetensorsHeader`, :class:`TensorEntry`,
:data:`MAX_HEADER_BYTES` and :data:`DTYPE_BYTES`, so imports from there keep working.
"""

from __future__ import annotations

import json
import math
import stat
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from dasc_compile.errors import DascInputError

__all__ = ["DTYPE_BYTES", "MAX_HEADER_BYTES", "SafetensorsHeader", "TensorEntry", "read_safetensors_header"]

#: safetensors refuses headers larger than this (``MAX_HEADER_SIZE`` in the Rust crate), bytes.
MAX_HEADER_BYTES = 100_000_000

#: safetensors dtype code -> bytes per element (the codes of the format's spec).
DTYPE_BYTES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "F4": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}


@dataclass(frozen=True, kw_only=True)
class TensorEntry:
    """One tensor of a safetensors header.

    Attributes:
        dtype: safetensors dtype code (``F32``, ``BF16``, ...).
        shape: tensor shape.
        begin / end: byte offsets of its data, relative to the start of the data section.
    """

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True, kw_only=True)
class SafetensorsHeader:
    """The parsed, validated header of one ``.safetensors`` file.

    Attributes:
        path: the file.
        header_bytes: N, the JSON header length in bytes.
        data_start: 8 + N, absolute byte offset of the data section.
        data_bytes: size of the data section (file size - 8 - N), bytes.
        tensors: tensor name -> :class:`TensorEntry`.
        metadata: the ``__metadata__`` string map (empty when absent).
    """

    path: Path
    header_bytes: int
    data_start: int
    data_bytes: int
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]


# ----------------------------------------------------------------------------- parsing


def _prod(shape: tuple[int, ...]) -> int:
    return math.prod(shape) if shape else 1


def _precheck(path: Path) -> None:
    """Cheap checks before safetensors parses the header: exists, 8-byte length, limit, truncation."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):   # a FIFO or device would block or never end
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, device or socket)"
            raise DascInputError(f"{path}: is {kind}, expected a .safetensors file")
        size = st.st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
    except FileNotFoundError:
        raise DascInputError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise DascInputError(f"{path}: is a directory, expected a .safetensors file") from None
    except OSError as exc:
        raise DascInputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(head) < 8:
        raise DascInputError(
            f"{path}: truncated safetensors file: {size} bytes, expected at least the 8-byte header length")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_BYTES:
        raise DascInputError(
            f"{path}: safetensors header length {n} bytes exceeds the {MAX_HEADER_BYTES}-byte limit "
            f"(corrupt file or not safetensors)")
    if 8 + n > size:
        raise DascInputError(
            f"{path}: truncated safetensors file: header claims {n} bytes but the file has {size} bytes")


def _parse_header(path: Path) -> SafetensorsHeader:
    _precheck(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            raw = fh.read(n)
    except OSError as exc:
        raise DascInputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:   # ValueError: also a number Python cannot convert
        raise DascInputError(f"{path}: corrupt safetensors header: not valid JSON ({str(exc)[:160]})") from None
    except RecursionError:
        raise DascInputError(f"{path}: corrupt safetensors header: JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise DascInputError(f"{path}: corrupt safetensors header: expected a JSON object, got {type(obj).__name__}")
    data_bytes = size - 8 - n
    meta = obj.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise DascInputError(f"{path}: corrupt safetensors header: '__metadata__' must map strings to strings")
    tensors: dict[str, TensorEntry] = {}
    max_end = 0
    for name, e in obj.items():
        try:
            dtype, shape, (begin, end) = e["dtype"], tuple(e["shape"]), e["data_offsets"]
            ok = (isinstance(dtype, str) and all(isinstance(d, int) and d >= 0 for d in shape)
                  and isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end)
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise DascInputError(
                f"{path}: corrupt safetensors header: entry for tensor '{name}' must have a dtype string, "
                f"a shape of non-negative integers and data_offsets [begin, end]")
        if dtype in DTYPE_BYTES and dtype != "F4" and end - begin != _prod(shape) * DTYPE_BYTES[dtype]:
            raise DascInputError(
                f"{path}: corrupt safetensors header: tensor '{name}' ({dtype} {list(shape)}) spans "
                f"{end - begin} bytes, expected {_prod(shape) * DTYPE_BYTES[dtype]}")
        tensors[name] = TensorEntry(dtype=dtype, shape=shape, begin=begin, end=end)
        max_end = max(max_end, end)
    if max_end > data_bytes:
        last = max(tensors, key=lambda k: tensors[k].end)
        raise DascInputError(
            f"{path}: truncated safetensors file: tensor '{last}' ends at data byte {max_end} but the data "
            f"section holds {data_bytes} bytes (file size {size})")
    return SafetensorsHeader(path=path, header_bytes=n, data_start=8 + n, data_bytes=data_bytes,
                             tensors=tensors, metadata=dict(meta))


@lru_cache(maxsize=512)
def _cached_header(path: str, size: int, mtime_ns: int) -> SafetensorsHeader:
    del size, mtime_ns  # part of the cache key only: a rewritten file is parsed again
    return _parse_header(Path(path))


def read_safetensors_header(path: str | Path) -> SafetensorsHeader:
    """Parse and validate the header of one ``.safetensors`` file; reads 8 + N bytes, no tensor data.

    Results are cached per (path, size, mtime), so the reader parses each shard once per process.

    Raises:
        DascInputError: missing file, truncated file, header longer than :data:`MAX_HEADER_BYTES`,
            header that is not a JSON object of well-formed entries, tensor data past the end of file.
    """
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise DascInputError(f"{p}: file not found") from None
    except OSError as exc:
        raise DascInputError(f"{p}: cannot read ({exc.strerror or exc})") from None
    return _cached_header(str(p), st.st_size, st.st_mtime_ns)
