"""Checkpoint reader: config.json plus the decay tensors (A_log, dt_bias), and nothing else.

``dasc compile`` needs, per recurrent layer, two tiny tensors (paper Eq. 2: the static log-decay
depends only on A_log and dt_bias). This module finds them in a Hugging Face style checkpoint
without touching any other tensor's data:

* a single ``.safetensors`` file (config.json beside it, or passed explicitly);
* a directory with config.json and ``model.safetensors.index.json`` + shards, or one or more
  ``*.safetensors`` files without an index;
* a ``*.index.json`` file (config.json beside it, or passed explicitly).

Headers are parsed by :mod:`dasc_compile.safetensors_header` (so every problem gets a message
naming the file; its :func:`read_safetensors_header`, :class:`SafetensorsHeader`,
:class:`TensorEntry`, :data:`MAX_HEADER_BYTES` and :data:`DTYPE_BYTES` are re-exported here), the
two tensors per layer are then read by name with ``safetensors.safe_open(...).get_tensor``
(memory-mapped: only their pages are touched).

Every OS / JSON / safetensors error becomes a one-line :class:`DascInputError` naming the file,
tensor or field and what was expected.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Iterable

import torch
from safetensors import safe_open

from dasc_compile.errors import DascInputError, short_repr
from dasc_compile.safetensors_header import (
    DTYPE_BYTES,
    MAX_HEADER_BYTES,
    SafetensorsHeader,
    TensorEntry,
    _parse_header,
    _precheck,
    read_safetensors_header,
)
from dasc_compile.schema import decay_sha256
from dasc_compile.userfiles import load_json_file, require_regular_file

if TYPE_CHECKING:  # pragma: no cover
    from dasc_compile.arch import ArchSpec

#: Name of the safetensors metadata key that marks generated (not trained) decay values.
PROVENANCE_KEY = "dasc_provenance"
#: Provenance reported when no file holding decay tensors carries :data:`PROVENANCE_KEY`.
TRAINED_PROVENANCE = "as read from checkpoint (trained weights)"
INDEX_SUFFIX = ".index.json"
DEFAULT_INDEX_NAME = "model.safetensors.index.json"

#: dtypes accepted for decay tensors, with their torch dtype.
DECAY_DTYPES: dict[str, torch.dtype] = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


@dataclass(frozen=True)
class CheckpointSource:
    """A located checkpoint: its config and where each tensor lives. No tensor data is read.

    Attributes:
        config: the parsed config.json.
        config_path: the config.json it came from.
        root: the checkpoint directory (the directory holding the file or index when MODEL is one).
        tensor_files: tensor name -> the ``.safetensors`` file holding it. Without an index this
            comes from the files' headers; with an index it comes from ``weight_map`` (every shard
            it names exists), and :func:`read_decay_tensors` checks each tensor it reads against
            that shard's header.
        provenance: the ``dasc_provenance`` metadata of the files holding decay tensors
            (``*.A_log`` / ``*.dt_bias``), or :data:`TRAINED_PROVENANCE` when none carries it.
        index_path: the ``*.index.json`` used, or None (for error messages).
    """

    config: dict
    config_path: Path
    root: Path
    tensor_files: dict[str, Path]
    provenance: str
    index_path: Path | None = field(default=None)


# ----------------------------------------------------------------------------- locating


#: Largest config.json / index read, bytes (real configs are KBs; indexes of 1T-parameter models a few MB).
MAX_CONFIG_BYTES = 16 * 2**20
MAX_INDEX_BYTES = 256 * 2**20


def _load_json(path: Path, what: str):
    """Parse a config / index (regular file, bounded size and nesting; see :mod:`dasc_compile.userfiles`)."""
    return load_json_file(path, what, MAX_INDEX_BYTES if what == "index" else MAX_CONFIG_BYTES)


def _load_config(config: str | Path | None, beside: Path, model: Path) -> tuple[dict, Path]:
    if config is not None and model.suffix != ".safetensors" and (beside / "config.json").is_file():
        # --config stands in for a missing config.json; silently overriding a checkpoint's own one pairs its
        # tensors with another model's layer kinds, and the error that followed named neither (a user report)
        raise DascInputError(f"--config {config}: {model} has its own config.json ({beside / 'config.json'}); "
                             f"--config is for a lone .safetensors file without one: drop --config")
    cfg_path = Path(config) if config is not None else beside / "config.json"
    if config is None and not cfg_path.exists():
        if (beside / "plan.json").is_file():
            raise DascInputError(f"{model}: a dasc plan (plan.json), not a checkpoint; give the model it was compiled "
                                 f"from (config.json and weights)")
        raise DascInputError(f"{model}: no config.json beside it ({cfg_path}); pass --config PATH")
    cfg = _load_json(cfg_path, "config")
    if not isinstance(cfg, dict):
        raise DascInputError(f"{cfg_path}: config must be a JSON object, got {type(cfg).__name__}")
    return cfg, cfg_path


def _files_from_headers(files: list[Path]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for f in files:
        for name in read_safetensors_header(f).tensors:
            if name in out:
                raise DascInputError(f"{f}: tensor '{name}' is also in {out[name]}; expected each tensor in one file")
            out[name] = f
    return out


def _shard_path(index: Path, tensor: str, shard) -> Path:
    """The file a ``weight_map`` entry names, which must lie inside the index's directory.

    A shard is named relative to the index (plain names, or sub-folders without ``..``); an absolute
    path or one climbing out is refused, so an index never makes dasc read files elsewhere.
    Symbolic links inside the directory (the Hugging Face cache's snapshot links) are followed.
    """
    if not isinstance(shard, str):
        raise DascInputError(f"{index}: field 'weight_map' must map tensor names to shard file names, "
                             f"got {short_repr(shard)} for tensor {short_repr(tensor)}")
    posix = PurePosixPath(shard.replace("\\", "/"))
    if not shard.strip() or posix.is_absolute() or Path(shard).is_absolute() or ".." in posix.parts or "\0" in shard:
        raise DascInputError(
            f"{index}: names shard {short_repr(shard)} for tensor {short_repr(tensor)}; expected a file name inside "
            f"the index's directory (no absolute path, no '..')")
    p = index.parent / shard
    if not os.path.lexists(p):
        raise DascInputError(f"{index}: names shard '{shard}' (for tensor {short_repr(tensor)}), but {p} does not exist")
    require_regular_file(p, "shard")
    return p


def _files_from_index(index: Path) -> dict[str, Path]:
    obj = _load_json(index, "index")
    wm = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wm, dict):
        raise DascInputError(f"{index}: field 'weight_map' must map tensor names to shard file names")
    shards: dict[str, Path] = {}
    out: dict[str, Path] = {}
    for name, shard in wm.items():
        if not (isinstance(shard, str) and shard in shards):
            shards[shard] = _shard_path(index, name, shard)   # raises for a non-string entry
        out[name] = shards[shard]
    return out


_DECAY_SUFFIXES = (".A_log", ".dt_bias")


def _safe_open(path: Path):
    """``safetensors.safe_open`` (the Rust parser validates header, offsets and file length).

    On failure the header is parsed here to name the exact problem; every error is a DascInputError.
    """
    _precheck(path)
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as exc:  # SafetensorError, OSError
        _parse_header(path)   # raises a precise DascInputError when it can name the problem
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DascInputError(f"{path}: not a valid safetensors file ({msg})") from None


_META_PREFIX = b'{"__metadata__":'


def _read_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` map of one file, reading as little of its header as possible.

    safetensors' own writer (and :mod:`dasc_compile.refckpt`) put ``__metadata__`` first in the
    header: then only that object is decoded from the first KiBs. Otherwise the whole header is
    parsed by safetensors. Raises DascInputError as :func:`_safe_open`.
    """
    _precheck(path)
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            head = fh.read(min(n, 65536))
    except OSError as exc:
        raise DascInputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if head.startswith(_META_PREFIX):
        try:
            meta, _end = json.JSONDecoder().raw_decode(head[len(_META_PREFIX):].decode("utf-8", "ignore").lstrip())
            if isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values()):
                return meta
        except (ValueError, RecursionError):
            pass   # metadata longer than the prefix read, or corrupt: let safetensors decide
    with _safe_open(path) as fh:
        return fh.metadata() or {}


@lru_cache(maxsize=512)
def _cached_metadata(path: str, size: int, mtime_ns: int) -> tuple[tuple[str, str], ...]:
    del size, mtime_ns
    return tuple(sorted(_read_metadata(Path(path)).items()))


def _provenance(files: set[Path]) -> str:
    notes = []
    for f in sorted(files):
        st = f.stat()
        note = dict(_cached_metadata(str(f), st.st_size, st.st_mtime_ns)).get(PROVENANCE_KEY)
        if note and note not in notes:
            notes.append(note)
    return "; ".join(notes) if notes else TRAINED_PROVENANCE


def require_model_path(model: str | Path) -> Path:
    """``model`` as a Path, checked to exist (``compile_plan`` checks it before ``w_max``: the first argument first).

    Raises:
        DascInputError: nothing at ``model``.
    """
    path = Path(model)
    if not path.exists():
        raise DascInputError(f"{path}: model path does not exist; expected a .safetensors file, a checkpoint "
                             f"directory or a {DEFAULT_INDEX_NAME}")
    return path


def open_checkpoint(model: str | Path, config: str | Path | None = None) -> CheckpointSource:
    """Locate a checkpoint's config and tensor files; read headers / the index, no tensor data.

    Args:
        model: a ``.safetensors`` file, a directory (config.json + ``model.safetensors.index.json``
            + shards, or config.json + ``*.safetensors``), or a ``*.index.json``.
        config: config.json to use instead of the one beside / inside ``model``.
    Returns:
        :class:`CheckpointSource`.
    Raises:
        DascInputError: missing path / config / shard, bad JSON, corrupt or truncated safetensors
            header (of a file that is read), directory without safetensors files.
    """
    path = require_model_path(model)
    index: Path | None = None
    if path.is_dir():
        root = path
        cfg, cfg_path = _load_config(config, root, path)
        if (root / DEFAULT_INDEX_NAME).is_file():
            index = root / DEFAULT_INDEX_NAME
            files = _files_from_index(index)
        else:
            shards = sorted(root.glob("*.safetensors"))
            if not shards:
                raise DascInputError(f"{root}: no {DEFAULT_INDEX_NAME} and no *.safetensors files in the directory")
            files = _files_from_headers(shards)
    elif path.name.endswith(INDEX_SUFFIX):
        root = path.parent
        index = path
        cfg, cfg_path = _load_config(config, root, path)
        files = _files_from_index(index)
    elif path.suffix == ".safetensors":
        root = path.parent
        cfg, cfg_path = _load_config(config, root, path)
        files = _files_from_headers([path])
    else:
        raise DascInputError(f"{path}: expected a .safetensors file, a checkpoint directory or a *{INDEX_SUFFIX} file")
    decay_files = {p for n, p in files.items() if n.endswith(_DECAY_SUFFIXES)}
    return CheckpointSource(config=cfg, config_path=cfg_path, root=root, tensor_files=files,
                            provenance=_provenance(decay_files), index_path=index)


def refuse_one_shard_of_several(model: Path, required: Iterable[str], tensor_files) -> None:
    """Refuse a lone ``...-0000K-of-0000N.safetensors`` (N > 1) that lacks one of the ``required`` tensors (the
    config's decay tensors): one shard of a sharded checkpoint, given where its folder or index was meant (a
    user report: the error named only the folder and a missing tensor).

    Raises:
        DascInputError: naming the file, which shard it is, a missing tensor and what to pass instead.
    """
    m = re.search(r"-(\d+)-of-(\d+)\.safetensors$", model.name)
    if model.is_dir() or not m or int(m.group(2)) < 2:
        return
    missing = [n for n in required if n not in tensor_files]
    if missing:
        raise DascInputError(f"{model}: shard {int(m.group(1))} of {int(m.group(2))} of a checkpoint, without "
                             f"'{missing[0]}' (another shard holds it); pass the folder {model.parent} or its "
                             f"{DEFAULT_INDEX_NAME}")


# ----------------------------------------------------------------------------- reading


def _missing(src: CheckpointSource, name: str, layer: int) -> DascInputError:
    return DascInputError(
        f"{src.index_path or src.root}: tensor '{name}' is missing, but the config makes layer {layer} recurrent "
        f"(expected A_log and dt_bias for it)")


def _check_entry(src: CheckpointSource, path: Path, fh, name: str, expected_shape: tuple[int, ...], layer: int):
    """dtype and shape from the shard header (no data read); the index is checked against the header."""
    try:
        sl = fh.get_slice(name)
    except Exception:
        if src.index_path is None:
            raise _missing(src, name, layer) from None
        raise DascInputError(
            f"{src.index_path}: names shard '{path.name}' for tensor '{name}', but that shard's header has no "
            f"such tensor") from None
    dtype, shape = sl.get_dtype(), tuple(sl.get_shape())
    if dtype not in DECAY_DTYPES:
        raise DascInputError(
            f"{path}: tensor '{name}' has dtype {dtype}; expected a floating dtype ({', '.join(DECAY_DTYPES)})")
    if shape != tuple(expected_shape):
        raise DascInputError(
            f"{path}: tensor '{name}' has shape {list(shape)}; expected {list(expected_shape)} from the config")


def read_decay_tensors(src: CheckpointSource, spec: ArchSpec) -> list[tuple[str, torch.Tensor]]:
    """Read A_log and dt_bias of every recurrent layer, in layer order; no other tensor is read.

    Returns ``[(a_log_name, A_log), (dt_bias_name, dt_bias), ...]``, one pair per entry of
    ``spec.recurrent_layer_ids``. Shapes: GDN ``A_log [H_v]``, ``dt_bias [H_v]``; KDA
    ``A_log [1, 1, H, 1]``, ``dt_bias [H * d_k]`` (``spec.a_log_shape`` / ``spec.dt_bias_shape``).
    Dtypes as stored (float32, bfloat16 or float16; Qwen3-Next: A_log FP32, dt_bias BF16).
    Each shard holding one of them is opened once (``safe_open``: header parsed, file mapped);
    dtype and shape are checked from the header before any data is read, then only these
    tensors' bytes are read (:func:`decay_bytes`: a few KB to a few hundred KB per model).

    Raises:
        DascInputError: tensor missing from the checkpoint; index names a shard whose header lacks
            the tensor; wrong shape or a non-floating dtype; NaN or Inf values; unreadable file.
    """
    wanted: list[tuple[str, tuple[int, ...], int]] = []
    for layer, a, d in zip(spec.recurrent_layer_ids, spec.a_log_names, spec.dt_bias_names):
        wanted += [(a, tuple(spec.a_log_shape), layer), (d, tuple(spec.dt_bias_shape), layer)]
    for name, _shape, layer in wanted:
        if name not in src.tensor_files:
            raise _missing(src, name, layer)
    out = []
    with contextlib.ExitStack() as stack:
        handles: dict[Path, object] = {}
        for name, shape, layer in wanted:
            path = src.tensor_files[name]
            if path not in handles:
                handles[path] = stack.enter_context(_safe_open(path))
            fh = handles[path]
            _check_entry(src, path, fh, name, shape, layer)
            try:
                t = fh.get_tensor(name)
            except Exception as exc:  # SafetensorError, OSError: name the file and tensor
                msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise DascInputError(f"{path}: cannot read tensor '{name}' ({msg})") from None
            finite = torch.isfinite(t)
            if not bool(finite.all()):
                bad = (~finite).flatten().nonzero().flatten()
                first = int(bad[0])
                raise DascInputError(
                    f"{path}: tensor '{name}' holds {bad.numel()} non-finite value(s) (NaN/Inf), first at flat "
                    f"index {first} ({t.flatten()[first].item()}); expected finite values")
            out.append((name, t))
    return out


def decay_bytes(tensors: list[tuple[str, torch.Tensor]]) -> int:
    """Bytes of tensor data in ``tensors`` (what :func:`read_decay_tensors` read from disk)."""
    return sum(t.numel() * t.element_size() for _, t in tensors)


def decay_fingerprint(tensors: list[tuple[str, torch.Tensor]]) -> str:
    """sha256 (hex) over the decay tensors, in order: name, dtype, shape and raw bytes of each.

    The byte format is part of the plan contract and lives in
    :func:`dasc_compile.schema.decay_sha256`; the runtime recomputes it from the weights SGLang loaded.
    """
    return decay_sha256(tensors)


def config_fingerprint(config: dict) -> str:
    """sha256 (hex) of ``json.dumps(config, sort_keys=True, separators=(",", ":"))``, UTF-8."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


__all__ = [
    "CheckpointSource", "SafetensorsHeader", "TensorEntry", "open_checkpoint", "read_decay_tensors",
    "read_safetensors_header", "decay_fingerprint", "config_fingerprint", "decay_bytes",
    "MAX_HEADER_BYTES", "PROVENANCE_KEY", "TRAINED_PROVENANCE", "DTYPE_BYTES",
]

