"""Lossless transport form of a checkpoint directory: what a device call returns and the next one carries.

A directory becomes one tar stream (its top folder named as the directory), byte-plane split (even
bytes, then odd bytes: for bf16 weights that puts the sign/exponent bytes together, which compress
well) and zlib-compressed, then cut into parts ``NAME.tzp.00``, ``NAME.tzp.01``, ... of at most
``PART_BYTES`` (under the 16 MiB a device call returns per file). bf16 weights shrink to about 70 %.
Tar puts file contents at 512-byte offsets, so every tensor starts on an even byte.

``python -m benchmarks.train.pack SRC DEST`` unpacks every packed directory in SRC into DEST (what the
device driver benchmarks/h200/train_refs.sh does with the checkpoints a call carries in packed).
"""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
import zlib
from pathlib import Path

import numpy as np

PART_BYTES = 15 * 2 ** 20
MAGIC = b"DASCTZP1"


def pack(src: Path, out_dir: Path, name: str | None = None) -> list[Path]:
    """Write ``src`` (a directory) as ``out_dir/NAME.tzp.NN`` parts; returns their paths in order."""
    src = Path(src)
    name = name or src.name
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.add(src, arcname=name)
    raw = np.frombuffer(buf.getvalue(), dtype=np.uint8)
    if raw.size % 2:
        raw = np.concatenate([raw, np.zeros(1, np.uint8)])
    planes = np.concatenate([raw[0::2], raw[1::2]]).tobytes()
    body = zlib.compress(planes, 6)
    blob = MAGIC + len(buf.getvalue()).to_bytes(8, "little") + hashlib.sha256(buf.getvalue()).digest() + body
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in parts_of(out_dir, name)[0]:
        old.unlink()
    paths = []
    for i in range(0, len(blob), PART_BYTES):
        p = out_dir / part_name(name, i // PART_BYTES)
        p.write_bytes(blob[i:i + PART_BYTES])
        paths.append(p)
    return paths


def _decode(parts: list[Path]) -> bytes:
    """The tar stream packed in ``parts`` (all of one name, in any order), checked against its length and sha256.

    Raises:
        ValueError: a part is missing or damaged (length or sha256 mismatch).
    """
    parts = sorted(Path(p) for p in parts)
    blob = b"".join(p.read_bytes() for p in parts)
    if blob[:8] != MAGIC:
        raise ValueError(f"{parts[0]}: not a packed checkpoint (expected the {MAGIC!r} header)")
    n = int.from_bytes(blob[8:16], "little")
    digest = blob[16:48]
    try:
        planes = np.frombuffer(zlib.decompress(blob[48:]), dtype=np.uint8)
    except zlib.error as exc:
        raise ValueError(f"{parts[0].name}: damaged or incomplete parts ({len(parts)} read): {exc}") from None
    half = planes.size // 2
    raw = np.empty(planes.size, dtype=np.uint8)
    raw[0::2], raw[1::2] = planes[:half], planes[half:]
    data = raw[:n].tobytes()
    if hashlib.sha256(data).digest() != digest:
        raise ValueError(f"{parts[0].name}: content does not match its sha256 ({len(parts)} parts read)")
    return data


def _top(data: bytes, dest: Path) -> Path:
    """The folder in ``dest`` where the directory in tar stream ``data`` lands."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tf:
        return Path(dest) / tf.getnames()[0].split("/")[0]


def _check_target(data: bytes, dest: Path) -> None:
    """Refuse a ``dest`` that is a file, or a target folder that already holds files (extracting over an older
    checkpoint would leave its files beside the new ones: a resume would then read a mix)."""
    top = _top(data, dest)
    if Path(dest).exists() and not Path(dest).is_dir():
        raise ValueError(f"{dest}: exists and is not a folder; expected a folder to unpack into")
    if top.exists() and (not top.is_dir() or any(top.iterdir())):
        raise ValueError(f"{top}: already holds files (an earlier unpack?); remove it or choose another DEST")


def _extract(data: bytes, dest: Path) -> Path:
    Path(dest).mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tf:
        tf.extractall(dest, filter="data")
    return _top(data, dest)


def unpack(parts: list[Path], dest: Path) -> Path:
    """Extract the directory packed in ``parts`` (all of one name, in any order) into ``dest``; returns it.

    The packed directory lands in ``dest/NAME``, which must not exist yet or be empty.

    Raises:
        ValueError: a part is missing or damaged (length or sha256 mismatch), ``dest`` is a file, or
            ``dest/NAME`` holds files.
    """
    data = _decode(parts)
    _check_target(data, dest)
    return _extract(data, dest)


def part_name(name: str, i: int) -> str:
    """The file name of part ``i`` of packed directory ``name``: ``NAME.tzp.NN``."""
    return f"{name}.tzp.{i:02d}"


def parts_of(folder: Path, name: str) -> tuple[list[Path], list[Path]]:
    """``name``'s parts in ``folder`` (``NAME.tzp.NN`` files, in order) and the other entries whose names start
    like one (``NAME.tzp.00.orig``): the caller decides whether those are an error."""
    found = sorted(Path(folder).glob(f"{name}.tzp.*"))
    ok = [q for q in found if re.fullmatch(rf"{re.escape(name)}\.tzp\.\d\d", q.name) and q.is_file()]
    return ok, [q for q in found if q not in ok]


def unpack_all(src: Path, dest: Path) -> list[Path]:
    """Unpack every directory packed in ``src`` (each group of ``NAME.tzp.NN``) into ``dest``; returns them
    in name order. Every group is decoded and checked before any is extracted, so a damaged group leaves
    ``dest`` as it was.

    Raises:
        ValueError: ``src`` is not a folder or holds no packed directory, or a group is missing a part or damaged
            (:func:`unpack`), or a target folder holds files.
    """
    src = Path(src)
    if not src.is_dir():
        raise ValueError(f"{src}: expected a folder holding packed checkpoints (NAME.tzp.NN files), got "
                         f"{'a file' if src.exists() else 'nothing'}")
    names = sorted({p.name.split(".tzp.")[0] for p in src.glob("*.tzp.*")})
    groups = [parts for parts in (parts_of(src, n)[0] for n in names) if parts]
    if not groups:
        raise ValueError(f"{src}: holds no packed checkpoint (NAME.tzp.NN files)")
    decoded = [_decode(parts) for parts in groups]
    for data in decoded:
        _check_target(data, dest)
    return [_extract(data, dest) for data in decoded]


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3:
        print("usage: python -m benchmarks.train.pack SRC DEST   (unpack every NAME.tzp.NN group in SRC into DEST)",
              file=sys.stderr)
        raise SystemExit(2)
    try:
        done = unpack_all(Path(sys.argv[1]), Path(sys.argv[2]))
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    for d in done:
        print(f"unpacked {d}")
