"""Render the plan's Triton kernels from Jinja2 templates (DESIGN.md "Kernels").

A plan's kernels are specialised by one explicit dict of scalar constants
(:func:`kernel_constants` from a :class:`~dasc_compile.schema.Plan`, or :func:`make_constants`
from dims). :func:`render_kernel_module` renders ``templates/state_kernels.py.jinja`` (which
includes the other ``*.py.jinja`` files and ``checks.py``) with a ``StrictUndefined``
environment, so a missing constant fails at render time. The module's file name carries a key
that hashes the template sources, the constants, the dasc version and the triton version: a
changed template, constant or toolchain gives a new file (Triton's own cache-key rule).

The compiler writes the source into the plan directory and records
:func:`kernel_module_entry` in ``Plan.kernels``; ``dasc_runtime.kernel_loader`` imports it.

Layouts (SGLang 0.5.17, see the template header): dense temporal ``[L, slots+1, H, dv, dk]``
with dk fastest for both GDN and KDA; ragged temporal ``[slots+1, sum_l r_l, dv, dk]`` (GDN
head) or ``[slots+1, sum_l r_l, dv]`` (KDA column ``S[h, :, k]``, paper App. B Scheme 2).
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Optional, Sequence

import jinja2

import dasc_compile
from dasc_compile.errors import DascInputError
from dasc_compile.schema.plan import KernelModule, Plan
from dasc_compile.schema.units import STATE_DTYPES, UNIT_KINDS, UnitSpec

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
MODULE_TEMPLATE = "state_kernels.py.jinja"
FILE_PREFIX = "dasc_kernels_"
BASE_OPS = ("pack", "load", "refresh_copy")
INT8_OPS = ("pack_int8", "load_int8")
DEFAULT_TILE = 4096          # elements per program: 16 KiB of FP32, 16 per thread at 8 warps
DEFAULT_NUM_WARPS = 8
#: Constants a dasc version chooses for speed (tiles, warps); every other constant follows from the plan's model
#: and policy (:func:`kernel_constants`), which the plan reader checks.
TILE_CONSTANTS = ("BLOCK_V", "BLOCK_K", "Q_BLOCK_V", "Q_BLOCK_K", "BLOCK_C", "NUM_WARPS")


def _template_dir() -> Path:
    try:  # installed package (pyproject maps templates/ -> dasc_templates)
        import dasc_templates

        return Path(dasc_templates.__file__).resolve().parent
    except ImportError:  # pragma: no cover - checkout without install
        return TEMPLATE_DIR


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def make_constants(*, num_layers: int, unit_kind: str, heads: int, dv: int, dk: int,
                   conv_shapes: Sequence[Sequence[int]], temporal_dtype: str = "float32",
                   conv_dtype: str = "bfloat16", int8: bool = False, tile: int = DEFAULT_TILE,
                   num_warps: int = DEFAULT_NUM_WARPS) -> dict:
    """The explicit specialisation dict of one rank's kernels.

    Args:
        num_layers: L, recurrent layers. unit_kind: ``gdn_head`` | ``kda_column`` | ``mamba2_head``.
        heads: value heads H on this rank. dv / dk: per-head state ``[dv, dk]``.
        conv_shapes: inner 2-D shape of each conv tensor, e.g. ``[(8192, 3)]`` (GDN
            ``(conv_dim, K-1)``) or ``[(3, 12288)]`` (Kimi ``(K-1, 3*H*d)``).
        temporal_dtype / conv_dtype: torch dtype names; INT8 scales use temporal_dtype (App. E.1).
        int8: also render ``pack_int8`` / ``load_int8``.
        tile: elements per program (power of two); tests pass a tiny value to force many tiles.
        num_warps: warps per program.

    Returns:
        dict of scalars: NUM_LAYERS, UNIT_KIND, WHOLE_HEAD, HEADS, DV, DK, UNITS_PER_HEAD, TEMPORAL_DTYPE,
        CONV_DTYPE, SCALE_DTYPE, INT8, NUM_CONV, CONV{i}_ROWS, CONV{i}_COLS, BLOCK_V, BLOCK_K
        (copy tiles: full dk rows), Q_BLOCK_V, Q_BLOCK_K (INT8 tiles: full dv columns),
        BLOCK_C (conv tile), NUM_WARPS.

    Raises:
        DascInputError: a non-positive dim, unknown unit kind or dtype, a conv shape that is
            not 2-D, or a tile that is not a power of two.
    """
    if unit_kind not in UNIT_KINDS:
        raise DascInputError(f"kernel constants: unit_kind must be one of {tuple(UNIT_KINDS)}, got {unit_kind!r}")
    for name, value in (("num_layers", num_layers), ("heads", heads), ("dv", dv), ("dk", dk),
                        ("num_warps", num_warps)):
        if int(value) < 1:
            raise DascInputError(f"kernel constants: {name} must be >= 1, got {value}")
    for name, value in (("temporal_dtype", temporal_dtype), ("conv_dtype", conv_dtype)):
        if value not in STATE_DTYPES:
            raise DascInputError(f"kernel constants: {name} must be one of {STATE_DTYPES}, got {value!r}")
    if tile < 1 or tile & (tile - 1):
        raise DascInputError(f"kernel constants: tile must be a power of two, got {tile}")
    block_k = _next_pow2(dk)
    q_block_v = _next_pow2(dv)
    consts: dict = {
        "NUM_LAYERS": int(num_layers),
        "UNIT_KIND": unit_kind,
        "HEADS": int(heads),
        "DV": int(dv),
        "DK": int(dk),
        "WHOLE_HEAD": bool(UNIT_KINDS[unit_kind].whole_head),
        "UNITS_PER_HEAD": 1 if UNIT_KINDS[unit_kind].whole_head else int(dk),
        "TEMPORAL_DTYPE": temporal_dtype,
        "CONV_DTYPE": conv_dtype,
        "SCALE_DTYPE": temporal_dtype,
        "INT8": bool(int8),
        "NUM_CONV": len(conv_shapes),
    }
    for i, shape in enumerate(conv_shapes):
        if len(shape) != 2 or min(shape) < 1:
            raise DascInputError(f"kernel constants: conv shape {i} must be 2-D and positive, got {tuple(shape)}")
        consts[f"CONV{i}_ROWS"], consts[f"CONV{i}_COLS"] = int(shape[0]), int(shape[1])
    max_conv = max((r * c for r, c in conv_shapes), default=1)
    consts.update({
        "BLOCK_V": max(1, min(_next_pow2(dv), tile // block_k)),
        "BLOCK_K": block_k,
        "Q_BLOCK_V": q_block_v,
        "Q_BLOCK_K": max(1, min(block_k, tile // q_block_v)),
        "BLOCK_C": min(_next_pow2(max_conv), tile),
        "NUM_WARPS": int(num_warps),
    })
    return consts


def kernel_constants(plan: Plan, tp_rank_heads: Optional[int] = None) -> dict:
    """Specialisation dict for one TP rank of ``plan`` (see :func:`make_constants`).

    H is ``tp_rank_heads`` or ``plan.tp.heads_per_rank``; the conv channels are split over
    P = num_value_heads / H ranks. The conv layout is :meth:`UnitSpec.conv_layer_shape` (SGLang 0.5.17
    ``configs/mamba_utils.py``): ``Mamba2StateShape`` ``(conv_dim / P, K-1)`` for head units,
    ``KimiLinearStateShape`` ``(K-1, conv_dim / P)`` for KDA columns. Dtypes and INT8 come
    from the plan's policy; the ragged row count R is *not* a constant (it is the length of
    the index tensors and varies per rank under storage balancing).

    Raises:
        DascInputError: H does not divide the model's value heads, or the conv channels do not split
            over the ranks (:meth:`UnitSpec.conv_layer_shape`).
    """
    m = plan.model
    heads = int(tp_rank_heads) if tp_rank_heads is not None else int(plan.tp.heads_per_rank)
    if heads < 1 or m.num_value_heads % heads:
        raise DascInputError(f"plan.json: tp_rank_heads must divide model.num_value_heads="
                             f"{m.num_value_heads}, got {heads}")
    tp = m.num_value_heads // heads
    conv_shape = UnitSpec.from_plan(plan).conv_layer_shape(tp)   # raises when the conv channels cannot split
    return make_constants(
        num_layers=len(plan.layers), unit_kind=m.unit_kind, heads=heads, dv=m.head_v_dim,
        dk=m.head_k_dim, conv_shapes=[conv_shape], temporal_dtype=plan.policy.temporal_dtype,
        conv_dtype=plan.policy.conv_dtype, int8=plan.policy.int8)


def kernel_ops(constants: dict) -> list[str]:
    """Names of the host wrappers a module rendered from ``constants`` defines."""
    return list(BASE_OPS) + (list(INT8_OPS) if constants["INT8"] else [])


def template_sources() -> dict[str, str]:
    """Every file the module template may include (``*.jinja`` and ``checks.py``), by name."""
    root = _template_dir()
    files = sorted(list(root.glob("*.jinja")) + [root / "checks.py"])
    return {p.name: p.read_text() for p in files}


def _versions() -> dict[str, str]:
    try:
        triton_version = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton_version = "none"
    return {"dasc": dasc_compile.__version__, "triton": triton_version}


def kernel_key(constants: dict) -> str:
    """sha256 hex over (template sources, sorted constants, dasc version, triton version)."""
    payload = json.dumps({"templates": template_sources(), "constants": constants, "versions": _versions()},
                         sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def kernel_file_name(key: str) -> str:
    """``dasc_kernels_<key[:16]>.py``: the module's file name inside the plan directory."""
    return f"{FILE_PREFIX}{key[:16]}.py"


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_template_dir())),
        undefined=jinja2.StrictUndefined,
        extensions=["jinja2.ext.do"],
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_kernel_module(constants: dict) -> tuple[str, str]:
    """Render the kernel module for ``constants``.

    Returns:
        ``(file_name, source)``: ``dasc_kernels_<key[:16]>.py`` and the Python source, which
        defines the host wrappers of :func:`kernel_ops` plus ``KEY``, ``CONSTANTS``, ``OPS``.

    Raises:
        jinja2.UndefinedError: a constant the templates use is missing from ``constants``.
        SyntaxError: the rendered source does not compile (a template bug).
    """
    key = kernel_key(constants)
    versions = _versions()
    ctx = dict(constants)
    ctx.update(KEY=key, CONSTANTS=dict(constants), CONSTANTS_REPR=repr(dict(sorted(constants.items()))),
               OPS=kernel_ops(constants),
               VERSIONS=", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    source = _environment().get_template(MODULE_TEMPLATE).render(**ctx)
    file_name = kernel_file_name(key)
    compile(source, file_name, "exec")
    return file_name, source


def kernel_module_entry(constants: dict, file_name: str, source: str | None = None) -> KernelModule:
    """The ``Plan.kernels`` record of a rendered module.

    Args:
        constants: the specialisation dict. file_name: the name :func:`render_kernel_module` gave.
        source: the rendered text (rendered again from ``constants`` when omitted); its sha256 is
            recorded so the runtime refuses an edited module.
    Raises:
        ValueError: ``file_name`` is not the name :func:`render_kernel_module` gives these constants.
    """
    key = kernel_key(constants)
    if file_name != kernel_file_name(key):
        raise ValueError(f"file_name must be {kernel_file_name(key)} for these constants, got {file_name}")
    if source is None:
        source = render_kernel_module(constants)[1]
    return KernelModule(file=file_name, key=key, ops=kernel_ops(constants), constants=dict(constants),
                        source_sha256=hashlib.sha256(source.encode("utf-8")).hexdigest())
