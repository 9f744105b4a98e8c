"""Reference checkpoints (``refckpt``): the real formats of three hybrid models, decay values drawn from
their initialisation. ``dasc reference`` and ``plans/reference/`` are this module's; elsewhere in dasc
"reference" means nothing else.

Trained weights cannot be downloaded here, but each model's config, tensor names, shapes and
dtypes are public. This module writes checkpoints in exactly those formats, with the decay
tensors (A_log, dt_bias) *drawn from the family's published initialisation with a fixed seed*,
so every figure computed from them is an initialisation draw, not a trained model. The draw is
recorded in the safetensors metadata key ``dasc_provenance`` and shown by ``dasc inspect``.
A user with the real weights points ``dasc compile`` at them instead; nothing else changes.

Two forms:

* :func:`write_decay_only`: config.json + one ``model.safetensors`` holding only the decay tensors
  (a few KB to a few hundred KB). The bundled copies live in ``plans/reference/<name>/``.
* :func:`write_full_size`: every parameter of the real checkpoint (names, shapes, dtypes, sharded
  with a ``model.safetensors.index.json``), where every tensor except the decay tensors is a hole:
  the header is written and the file is extended with ``truncate``, so the 163 GB Qwen3-Next
  checkpoint takes about 16 MB of disk (headers and index) on file systems with sparse files
  (ext4, xfs, tmpfs, btrfs).

The formats (published configs, every tensor's name, shape and dtype, and where each comes from)
live in :mod:`dasc_compile.refckpt_formats`; :data:`REFERENCE_CONFIGS`, :data:`MODEL_NAMES`,
:func:`resolve_config` and :func:`parameter_table` are re-exported here.

Initialisation schemes (MODELS.md "How these models are initialised"):

* GDN (transformers Qwen3-Next / Qwen3.5): ``A_log = log(U(0.01, 16))`` per value head,
  ``dt_bias = 1``. transformers 5.12.1 draws ``U(0, 16)``; the 0.01 floor keeps A_log finite.
* KDA (fla): ``A_log = log(U(1, 16))`` per head; ``dt = exp(U(ln 1e-3, ln 1e-1))`` clamped
  ``>= 1e-4`` per (head, key channel); ``dt_bias = dt + log(-expm1(-dt))`` (inverse softplus).
* KDA safe gate (fla): ``A_log = 0``, dt_bias as KDA.

Draws use ``torch.Generator().manual_seed(seed)`` in float64, recurrent layer by layer (A_log
then dt_bias), then cast to the stored dtype: the same seed gives the same bytes (torch's CPU
generator; the bundled files are checked against a fresh draw by tests/compile/test_reference.py).
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from pathlib import Path

import torch

from dasc_compile.arch import ArchSpec, arch_from_config
from dasc_compile.checkpoint import DECAY_DTYPES, DEFAULT_INDEX_NAME, DTYPE_BYTES, PROVENANCE_KEY
from dasc_compile.errors import MAX_SEED, DascInputError, error_line
from dasc_compile.families.base import FAMILIES
from dasc_compile.refckpt_formats import MODEL_NAMES, REFERENCE_CONFIGS, Param, parameter_table, resolve_config

__all__ = [
    "GDN_SCHEME", "KDA_SAFE_SCHEME", "KDA_SCHEME", "MODEL_NAMES", "Param", "REFERENCE_CONFIGS", "draw_decay", "main",
    "full_size_bytes", "parameter_table", "provenance_note", "resolve_config", "write_bundled", "write_decay_only",
    "write_full_size",
    "write_json", "write_sparse_shard",
]

GDN_SCHEME = "gdn (transformers Qwen3-Next/Qwen3.5): A_log = log(U(0.01, 16)) per value head, dt_bias = 1"
KDA_SCHEME = ("kda (fla): A_log = log(U(1, 16)) per head; dt = exp(U(ln 1e-3, ln 1e-1)) clamped >= 1e-4 per "
              "(head, key channel), dt_bias = dt + log(-expm1(-dt))")
KDA_SAFE_SCHEME = ("kda safe gate (fla): A_log = 0; dt = exp(U(ln 1e-3, ln 1e-1)) clamped >= 1e-4 per "
                   "(head, key channel), dt_bias = dt + log(-expm1(-dt))")

#: torch dtype -> safetensors dtype name of the decay tensors written (the reader's file-format table, inverted)
_ST_DTYPE = {dt: name for name, dt in DECAY_DTYPES.items()}


def provenance_note(scheme: str, seed: int) -> str:
    """The ``dasc_provenance`` metadata value: ``"initialisation draw, not trained: <scheme>, seed <s>"``."""
    return f"initialisation draw, not trained: {scheme}, seed {seed}"


# ----------------------------------------------------------------------------- decay draws


#: dt range and floor of the Mamba2-style dt_bias draw (fla's GDN / KDA layers, mamba_ssm), time steps
DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 1e-1, 1e-4


def log_uniform_dt_bias(gen: torch.Generator, n: int) -> torch.Tensor:
    """``[n]`` float64 dt_bias with softplus(dt_bias) = dt, dt = exp(U(ln DT_MIN, ln DT_MAX)) floored at
    DT_FLOOR (the inverse softplus written stably for small dt). Also used by the trained references'
    GDN initialisation (benchmarks/train/models.py)."""
    lo, hi = math.log(DT_MIN), math.log(DT_MAX)
    dt = torch.exp(torch.rand(n, generator=gen, dtype=torch.float64) * (hi - lo) + lo).clamp_min(DT_FLOOR)
    return dt + torch.log(-torch.expm1(-dt))


def draw_decay(config: dict, seed: int = 0, spec: ArchSpec | None = None) -> tuple[list[tuple[str, torch.Tensor]], str]:
    """Draw A_log and dt_bias of every recurrent layer from the family's initialisation.

    Returns ``([(a_log_name, A_log), (dt_bias_name, dt_bias), ...], scheme)`` in recurrent-layer
    order (the order :func:`dasc_compile.checkpoint.read_decay_tensors` returns). GDN:
    ``A_log [H_v]`` float32, ``dt_bias [H_v]`` bfloat16. KDA: ``A_log [1, 1, H, 1]`` float32,
    ``dt_bias [H * d_k]`` float32. A family with its own ``reference_init`` (Mamba2) draws them there;
    both are stored float32 (``A_log [H]``, ``dt_bias [H]``).

    Raises:
        DascInputError: the config is not a supported hybrid model (see :func:`arch_from_config`).
    """
    spec = spec or arch_from_config(config, "reference config")
    gen = torch.Generator().manual_seed(int(seed))
    out: list[tuple[str, torch.Tensor]] = []
    h = spec.num_value_heads
    family = FAMILIES[spec.family]
    if family.reference_init is not None:   # the family module draws its model's own initialisation
        draws, scheme = family.reference_init(spec, config, gen)
        for (a_name, d_name), (a, d) in zip(zip(spec.a_log_names, spec.dt_bias_names), draws):
            out.append((a_name, a.reshape(spec.a_log_shape).to(torch.float32)))
            out.append((d_name, d.reshape(spec.dt_bias_shape).to(torch.float32)))
        return out, scheme
    for a_name, d_name in zip(spec.a_log_names, spec.dt_bias_names):
        if spec.family == "gdn":
            a = torch.log(0.01 + (16.0 - 0.01) * torch.rand(h, generator=gen, dtype=torch.float64))
            d = torch.ones(h, dtype=torch.float64)
            a_dtype, d_dtype, scheme = torch.float32, torch.bfloat16, GDN_SCHEME
        elif spec.family in ("kda", "kda_safe_gate"):
            if spec.family == "kda":
                a = torch.log(1.0 + 15.0 * torch.rand(h, generator=gen, dtype=torch.float64))
                scheme = KDA_SCHEME
            else:
                a = torch.zeros(h, dtype=torch.float64)
                scheme = KDA_SAFE_SCHEME
            d = log_uniform_dt_bias(gen, h * spec.head_k_dim)
            a_dtype, d_dtype = torch.float32, torch.float32
        else:  # pragma: no cover - families without a reference initialisation
            raise DascInputError(f"no reference initialisation for decay family {spec.family!r}")
        out.append((a_name, a.reshape(spec.a_log_shape).to(a_dtype)))
        out.append((d_name, d.reshape(spec.dt_bias_shape).to(d_dtype)))
    return out, scheme


# ----------------------------------------------------------------------------- writers


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def write_json(path: Path, obj) -> None:
    """Write ``obj`` as indented JSON (2 spaces, trailing newline) to ``path`` through a ``.tmp`` sibling."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def write_decay_only(model: str | dict, out_dir: str | Path, seed: int = 0) -> Path:
    """Write ``out_dir/config.json`` and ``out_dir/model.safetensors`` holding only the decay tensors.

    The safetensors metadata carries ``dasc_provenance`` (:func:`provenance_note`). Sizes:
    Qwen3-Next 36 x (128 + 64) bytes, Qwen3.5-27B 48 x (192 + 96) bytes, Kimi-Linear
    20 x (128 + 16384) bytes, plus headers. Byte-identical for the same model and seed.

    Raises:
        DascInputError: unknown model name or unsupported config.
    """
    _name, cfg = resolve_config(model)
    tensors, scheme = draw_decay(cfg, seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", cfg)
    params = [(n, tuple(t.shape), _ST_DTYPE[t.dtype]) for n, t in tensors]
    # own writer rather than safetensors.save_file: its metadata map has no fixed order, these bytes do
    write_sparse_shard(out / "model.safetensors", params, {n: _raw(t) for n, t in tensors},
                        {"format": "pt", PROVENANCE_KEY: provenance_note(scheme, seed)})
    return out


def _shards(params: list[Param], shard_bytes: float) -> list[list[Param]]:
    shards: list[list[Param]] = [[]]
    size = 0
    for prm in params:
        n = math.prod(prm[1]) * DTYPE_BYTES[prm[2]]
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(prm)
        size += n
    return shards


def write_sparse_shard(path: Path, params: list[Param], data: dict[str, bytes], metadata: dict[str, str]) -> int:
    """Write one safetensors file holding ``params`` (name, shape, safetensors dtype), own writer.

    Only the tensors in ``data`` (name -> raw little-endian bytes) are written; every other tensor is a
    hole that reads as zeros. The header (``metadata`` first, tensors widest dtype first) has a fixed
    byte order, so the same inputs give the same file. Returns the bytes of tensor data (holes included).

    Raises:
        AssertionError: a ``data`` entry does not have its tensor's byte size (a caller bug).
    """
    # wider dtypes first (as safetensors' own writer) keeps every tensor aligned to its element size
    order = sorted(params, key=lambda prm: -DTYPE_BYTES[prm[2]])
    header: dict = {"__metadata__": metadata}
    off = 0
    for name, shape, dt in order:
        n = math.prod(shape) * DTYPE_BYTES[dt]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    start = 8 + len(raw)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        os.fchmod(fh.fileno(), 0o644)
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for name, b in data.items():
            begin, end = header[name]["data_offsets"]
            if len(b) != end - begin:
                raise AssertionError(f"{name}: {len(b)} bytes for a {end - begin}-byte slot")
            fh.seek(start + begin)
            fh.write(b)
        fh.truncate(start + off)   # everything not written is a hole: no disk blocks, reads as zeros
    os.replace(tmp, path)
    return off


def full_size_bytes(model: str | dict) -> int:
    """Tensor bytes of :func:`write_full_size`'s checkpoint of ``model`` (its apparent size, headers aside):
    ``sum(prod(shape) * dtype bytes)`` over :func:`parameter_table`. Nearly all of it is holes on disk.

    Raises:
        DascInputError: unknown model name.
    """
    _name, cfg = resolve_config(model)
    return sum(math.prod(shape) * DTYPE_BYTES[dt] for _, shape, dt in parameter_table(cfg))


def write_full_size(model: str | dict, out_dir: str | Path, seed: int = 0, shard_bytes: float = 5e9) -> Path:
    """Write a full-size sharded checkpoint whose non-decay tensors are holes on disk.

    Writes ``config.json``, ``model-XXXXX-of-YYYYY.safetensors`` shards of at most ``shard_bytes``
    bytes of tensor data each (a single larger tensor gets its own shard) and
    ``model.safetensors.index.json`` (``metadata.total_size`` in bytes, ``weight_map``), last.
    Every tensor of :func:`parameter_table` is listed with its real shape and dtype; only the
    decay tensors (:func:`draw_decay`) are written, the rest read as zeros. Apparent size: about
    163 GB (Qwen3-Next-80B), 98 GB (Kimi-Linear-48B), 56 GB (Qwen3.5-27B); disk use: headers plus
    one file-system block per decay tensor.

    Raises:
        DascInputError: unknown model name or a config without a parameter list.
    """
    _name, cfg = resolve_config(model)
    spec = arch_from_config(cfg, "reference config")
    params = parameter_table(cfg, spec)
    tensors, scheme = draw_decay(cfg, seed, spec)
    by_name = {n: (shape, dt) for n, shape, dt in params}
    for n, t in tensors:   # the drawn tensors must fit the real layout exactly
        if by_name.get(n) != (tuple(t.shape), _ST_DTYPE[t.dtype]):
            raise AssertionError(f"{n}: drawn {tuple(t.shape)} {t.dtype} does not match parameter table {by_name.get(n)}")
    data = {n: _raw(t) for n, t in tensors}
    note = provenance_note(scheme, seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", cfg)
    shards = _shards(params, shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        names = {prm[0] for prm in shard}
        total += write_sparse_shard(out / fname, shard, {n: b for n, b in data.items() if n in names},
                                     {"format": "pt", PROVENANCE_KEY: note})
        weight_map.update({prm[0]: fname for prm in shard})
    write_json(out / DEFAULT_INDEX_NAME, {"metadata": {"total_size": total, PROVENANCE_KEY: note},
                                           "weight_map": weight_map})
    for stale in out.glob("model-*-of-*.safetensors"):   # shards of an earlier run with another count
        if stale.name not in set(weight_map.values()):
            stale.unlink()
    return out


def write_bundled(root: str | Path, seed: int = 0) -> list[Path]:
    """Regenerate the bundled decay-only checkpoints: ``root/<name>/`` for every reference model."""
    return [write_decay_only(n, Path(root) / n, seed=seed) for n in MODEL_NAMES]


def main(argv: list[str] | None = None) -> int:
    """``python -m dasc_compile.refckpt --model NAME --out DIR [--full-size] [--seed S]``.

    ``--model all`` writes every reference model to ``DIR/<name>/``.
    """
    from dasc_runtime.one_line_parser import OneLineParser, int_in, out_path   # here: benchmark scripts import this
                                                            # module from a bare checkout, where dasc_runtime is no package

    ap = OneLineParser(prog="python -m dasc_compile.refckpt", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help=f"one of {', '.join(MODEL_NAMES)}, or 'all'")
    ap.add_argument("--out", required=True, type=out_path, help="output directory")
    ap.add_argument("--full-size", action="store_true", help="every real tensor, sparse on disk, sharded with an index")
    ap.add_argument("--seed", type=int_in(0, MAX_SEED), default=0, help="seed of the initialisation draw (default 0)")
    ap.add_argument("--shard-bytes", type=int_in(1, 2**50), default=5_000_000_000,
                    help="tensor bytes per shard for --full-size")
    args = ap.parse_args(argv)
    names = list(MODEL_NAMES) if args.model == "all" else [args.model]
    try:
        for n in names:
            out = args.out / n if args.model == "all" else args.out
            if args.full_size:
                write_full_size(n, out, seed=args.seed, shard_bytes=args.shard_bytes)
            else:
                write_decay_only(n, out, seed=args.seed)
            print(f"wrote {out}")
    except DascInputError as exc:
        print(error_line(str(exc)), file=sys.stderr)
        return 2
    except OSError as exc:
        print(error_line(f"--out {args.out}: cannot write there ({exc.strerror or exc})"), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
