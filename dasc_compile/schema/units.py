"""One state unit's shape, INT8 scales and bytes: the single place both compiler and runtime size state from.

A *unit* is what dasc keeps or omits (paper §4.1, DESIGN.md "Decay families"): a GDN value head's
whole temporal state ``[d_v, d_k]`` (``gdn_head``), one KDA column ``S[h, :, k]``, ``[d_v]``
(``kda_column``), or a Mamba2 head's whole ``[head_dim, d_state]`` state (``mamba2_head``: the
``gdn_head`` layout under Mamba2's names). :class:`UnitSpec` is frozen and computes, from the unit kind, the head dims, the
state dtypes and INT8 or not, every shape and byte count that the accounting (App. C.1), the kernels
and the runtime pool need, the way vLLM's ``MambaSpec`` computes its page bytes. It also holds the
one dtype-bytes table (:meth:`UnitSpec.itemsize`), the one usable-slots formula
(:func:`usable_slots`, App. C.1: ``floor(B / b) - 1``, slot 0 reserved as in SGLang) and the one way byte counts
are written for people (:func:`fmt_bytes`, :func:`byte_count`, :func:`flag_bytes`).

Unit kinds are data (:data:`UNIT_KINDS`, one :class:`UnitKind` each); a decay family names its kind
(``DecayFamily.unit_kind``) instead of branching on it, and code that lays units out reads the kind's
``whole_head`` flag, never its name. A new family adds one :class:`UnitKind` here and its name to
``plan.UnitKindName`` (a schema change: bump ``SCHEMA_VERSION``).

This module imports neither torch nor pydantic: the runtime may import it anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dasc_compile.errors import DascInputError

__all__ = ["DTYPE_ITEMSIZE", "STATE_DTYPES", "UNIT_KINDS", "UnitKind", "UnitSpec", "byte_count", "flag_bytes",
           "fmt_bytes", "lookup_unit_kind", "smallest_budget", "usable_slots"]

#: Bytes per element of every dtype name a plan or policy uses (torch names without ``torch.``).
DTYPE_ITEMSIZE: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}
#: Dtypes the temporal and conv state may have (``Policy.temporal_dtype`` / ``conv_dtype``).
STATE_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class UnitKind:
    """How one kind of unit sits in a layer's temporal state ``[H, d_v, d_k]`` (dk fastest).

    Attributes:
        name: the plan's ``ModelInfo.unit_kind`` (``gdn_head`` | ``kda_column`` | ``mamba2_head``).
        whole_head: True when a unit is a head's whole ``[d_v, d_k]`` state (one unit per head, d_k
            INT8 scales per unit); False when a unit is a column ``S[h, :, k]`` (d_k units per head,
            ``[d_v]`` each, one scale).
        conv_channels_first: SGLang 0.5.17's conv state layout per layer and rank
            (``configs/mamba_utils.py``): True for ``Mamba2StateShape`` ``(conv_dim / P, K - 1)``,
            False for ``KimiLinearStateShape`` ``(K - 1, conv_dim / P)``.
        head_name: what a head is called in tables and plots (``value head``, ``head``).
        dim_names: names of the state's ``(d_v, d_k)`` axes in the family's own terms (Mamba2:
            ``(head_dim, d_state)``), for tables and plots.
        unit_name: what one unit is called (``head``, ``key channel``).
    """

    name: str
    whole_head: bool
    conv_channels_first: bool
    head_name: str = "head"
    dim_names: tuple[str, str] = ("d_v", "d_k")
    unit_name: str = "head"


UNIT_KINDS: dict[str, UnitKind] = {
    k.name: k for k in (
        UnitKind(name="gdn_head", whole_head=True, conv_channels_first=True,        # GDN value head
                 head_name="value head", unit_name="value head"),
        UnitKind(name="kda_column", whole_head=False, conv_channels_first=False,    # KDA column S[h, :, k]
                 unit_name="key channel"),
        # Mamba2 head: SGLang's Mamba2StateShape, temporal [H, head_dim, d_state], conv (conv_dim / P, K - 1)
        UnitKind(name="mamba2_head", whole_head=True, conv_channels_first=True,
                 dim_names=("head_dim", "d_state")),
    )
}


def lookup_unit_kind(name: str) -> UnitKind:
    """The :class:`UnitKind` called ``name``.

    Raises:
        DascInputError: ``name`` is not a known unit kind (the message lists the known ones).
    """
    try:
        return UNIT_KINDS[name]
    except (KeyError, TypeError):
        raise DascInputError(f"unit kind {name!r} is not known; expected one of {sorted(UNIT_KINDS)}") from None


def usable_slots(budget_bytes: int | None, bytes_per_slot: int) -> int | None:
    """Usable slots of a pool of ``budget_bytes``: ``max(0, floor(B / b) - 1)`` (App. C.1).

    Slot 0 of every SGLang state pool is reserved padding, hence the ``- 1``; under TP, ``b`` is the
    bottleneck rank's bytes per slot and ``B`` the per-rank budget.

    Args:
        budget_bytes: pool budget B in bytes, or ``None`` (no budget given: returns ``None``).
        bytes_per_slot: bytes of one slot b (> 0).
    Returns:
        the number of usable slots (>= 0), or ``None`` without a budget.
    Raises:
        ValueError: ``bytes_per_slot <= 0``.
    """
    if budget_bytes is None:
        return None
    if bytes_per_slot <= 0:
        raise ValueError(f"bytes_per_slot must be > 0, got {bytes_per_slot}")
    return max(0, int(budget_bytes) // int(bytes_per_slot) - 1)


def smallest_budget(bytes_per_slot: int, usable: int = 1) -> int:
    """The fewest bytes B with ``usable_slots(B, b) >= usable``: ``(usable + 1) * b`` (slot 0 is reserved padding).

    Raises:
        ValueError: ``bytes_per_slot <= 0`` or ``usable < 0``.
    """
    if bytes_per_slot <= 0 or usable < 0:
        raise ValueError(f"expected bytes_per_slot > 0 and usable >= 0, got {bytes_per_slot}, {usable}")
    return (int(usable) + 1) * int(bytes_per_slot)


@dataclass(frozen=True)
class UnitSpec:
    """Shapes, INT8 scales and bytes of one model's state units (paper §4.1, App. B Scheme 2, App. E.1).

    Attributes:
        kind: ``gdn_head`` | ``kda_column`` (see :data:`UNIT_KINDS`).
        d_v / d_k: value and key dims of one head's temporal state ``[d_v, d_k]``.
        temporal_dtype: dtype name of the temporal state (``float32`` in SGLang); INT8 scales use it.
        conv_dim: conv-state channels of one layer at TP = 1. conv_kernel: K (the state keeps K - 1 columns).
        conv_dtype: dtype name of the conv state (``bfloat16`` in SGLang).
        int8: kept units are stored as symmetric INT8 with one scale per (layer, head, k) over d_v (Eq. 8).
        conv_groups: Mamba2's ``n_groups`` when the conv state ends in ``2 * n_groups * d_k`` channels of
            B and C groups that SGLang shards with the heads (``Mamba2StateShape.create``); 0 when the
            conv channels simply split over the ranks (GDN, KDA).
    Raises (at construction):
        DascInputError: unknown kind or dtype name, or a non-positive dimension.
    """

    kind: str
    d_v: int
    d_k: int
    temporal_dtype: str
    conv_dim: int
    conv_kernel: int
    conv_dtype: str
    int8: bool
    conv_groups: int = 0

    def __post_init__(self) -> None:
        lookup_unit_kind(self.kind)
        for name in ("d_v", "d_k", "conv_dim", "conv_kernel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DascInputError(f"unit spec: {name} must be a positive integer, got {value!r}")
        if isinstance(self.conv_groups, bool) or not isinstance(self.conv_groups, int) or self.conv_groups < 0 \
                or 2 * self.conv_groups * self.d_k > self.conv_dim:
            raise DascInputError(f"unit spec: conv_groups must be an integer in [0, conv_dim / (2 d_k)], "
                                 f"got {self.conv_groups!r}")
        self.itemsize(self.temporal_dtype)
        self.itemsize(self.conv_dtype)

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_plan(cls, plan) -> "UnitSpec":
        """The unit spec of a :class:`~dasc_compile.schema.Plan` (its ``model`` and ``policy``)."""
        m, pol = plan.model, plan.policy
        return cls(kind=m.unit_kind, d_v=m.head_v_dim, d_k=m.head_k_dim, temporal_dtype=pol.temporal_dtype,
                   conv_dim=m.conv_dim, conv_kernel=m.conv_kernel, conv_dtype=pol.conv_dtype, int8=bool(pol.int8),
                   conv_groups=m.conv_groups or 0)

    # -- dtypes -------------------------------------------------------------------------------

    @staticmethod
    def itemsize(dtype_name: str) -> int:
        """Bytes per element of ``dtype_name``: float32 4, bfloat16 2, float16 2, int8 1.

        A ``torch.`` prefix (``str(torch.float32)``) is accepted.

        Raises:
            DascInputError: an unknown dtype name (the message names it and lists the known ones).
        """
        name = dtype_name[6:] if isinstance(dtype_name, str) and dtype_name.startswith("torch.") else dtype_name
        try:
            return DTYPE_ITEMSIZE[name]
        except (KeyError, TypeError):
            raise DascInputError(f"dtype {dtype_name!r} is not a state dtype dasc knows; expected one of "
                                 f"{sorted(DTYPE_ITEMSIZE)}") from None

    @property
    def stored_dtype(self) -> str:
        """Dtype name of a kept unit's payload in the compressed pool: ``int8`` or the temporal dtype."""
        return "int8" if self.int8 else self.temporal_dtype

    @property
    def scale_dtype(self) -> str:
        """Dtype name of the INT8 scales (the temporal dtype, App. E.1)."""
        return self.temporal_dtype

    # -- one unit -----------------------------------------------------------------------------

    @property
    def unit_layout(self) -> UnitKind:
        """The :class:`UnitKind` of :attr:`kind` (how a unit sits in the ``[H, d_v, d_k]`` state)."""
        return UNIT_KINDS[self.kind]

    @property
    def units_per_head(self) -> int:
        """Units per head U: 1 (whole head, GDN) or d_k (columns, KDA); flat id ``u = h * U + k``."""
        return 1 if self.unit_layout.whole_head else self.d_k

    @property
    def unit_shape(self) -> tuple[int, ...]:
        """Shape of one unit: ``(d_v, d_k)`` (GDN head) or ``(d_v,)`` (KDA column ``S[h, :, k]``)."""
        return (self.d_v, self.d_k) if self.unit_layout.whole_head else (self.d_v,)

    @property
    def unit_elems(self) -> int:
        """Elements of one unit: d_v * d_k (GDN) or d_v (KDA)."""
        return math.prod(self.unit_shape)

    @property
    def scale_shape(self) -> tuple[int, ...]:
        """INT8 scales of one unit: ``(d_k,)`` (GDN head) or ``(1,)`` (KDA column).

        One scale per (layer, head, k), shared over d_v (App. E.1 Eq. 8). The kernels' ragged scale
        tensor is ``[C+1, R, d_k]`` (GDN) and ``[C+1, R]`` (KDA: the trailing 1 is dropped).
        """
        return (self.d_k,) if self.unit_layout.whole_head else (1,)

    @property
    def scale_elems(self) -> int:
        """INT8 scales per unit: d_k (GDN head) or 1 (KDA column)."""
        return math.prod(self.scale_shape)

    @property
    def unit_bytes(self) -> int:
        """Bytes of one kept unit in the compressed pool.

        ``unit_elems * itemsize(temporal_dtype)``; with INT8: ``unit_elems * 1 + scale_elems *
        itemsize(temporal_dtype)`` (payload plus its scales, App. E.1).
        """
        if self.int8:
            return self.unit_elems * self.itemsize("int8") + self.scale_elems * self.itemsize(self.scale_dtype)
        return self.unit_elems * self.itemsize(self.temporal_dtype)

    @property
    def dense_unit_bytes(self) -> int:
        """Bytes of one unit in SGLang's dense temporal state (temporal dtype, no INT8)."""
        return self.unit_elems * self.itemsize(self.temporal_dtype)

    # -- one layer ----------------------------------------------------------------------------

    def temporal_layer_shape(self, num_heads_on_rank: int) -> tuple[int, int, int]:
        """One layer's dense temporal state on one rank: ``(H, d_v, d_k)`` (SGLang, dk fastest)."""
        return (int(num_heads_on_rank), self.d_v, self.d_k)

    def temporal_layer_bytes(self, num_heads_on_rank: int) -> int:
        """Bytes of one layer's dense temporal state ``[H, d_v, d_k]`` at the temporal dtype."""
        return math.prod(self.temporal_layer_shape(num_heads_on_rank)) * self.itemsize(self.temporal_dtype)

    def conv_layer_shape(self, tp_size: int = 1) -> tuple[int, int]:
        """One layer's conv state on one rank, as SGLang 0.5.17 lays it out.

        ``(conv_dim / P, K - 1)`` for ``conv_channels_first`` kinds (GDN, Mamba2: ``Mamba2StateShape``),
        else ``(K - 1, conv_dim / P)`` (KDA, ``KimiLinearStateShape``). With :attr:`conv_groups` G that
        P does not divide, SGLang (``extra_groups_for_head_shards``, allowed only for G = 1) gives every
        rank its own copy of the group: the channels become ``(conv_dim + (P - G) * 2 * d_k) / P``.

        Raises:
            DascInputError: ``tp_size`` < 1; it does not divide the conv channels; ``conv_groups`` > 1
                that P does not divide (SGLang's ``MambaMixer2`` refuses it too).
        """
        if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
            raise DascInputError(f"unit spec: tp_size must be a positive integer, got {tp_size!r}")
        conv_dim, groups = self.conv_dim, self.conv_groups
        if groups and groups % tp_size:
            if groups != 1:
                raise DascInputError(f"n_groups = {groups} does not split over tp_size = {tp_size} ranks; SGLang "
                                     f"shards the B/C groups with the heads and replicates only a single group")
            conv_dim += (tp_size - groups) * 2 * self.d_k
        if conv_dim % tp_size:
            raise DascInputError(f"conv_dim = {conv_dim} does not split evenly over tp_size = {tp_size} ranks")
        channels, window = conv_dim // tp_size, self.conv_kernel - 1
        return (channels, window) if self.unit_layout.conv_channels_first else (window, channels)

    def conv_bytes_per_layer(self, tp_size: int = 1) -> int:
        """Bytes of one layer's conv state on one rank: (conv_dim / P) * (K - 1) * itemsize(conv_dtype)."""
        return math.prod(self.conv_layer_shape(tp_size)) * self.itemsize(self.conv_dtype)

    # -- tensors (torch is used only through the tensor passed in) -----------------------------

    def units_view(self, state):
        """A layer's temporal state ``[..., H, d_v, d_k]`` as unit rows ``[..., H * U, unit_elems]``.

        Row ``u = h * U + k`` is unit u: GDN (U = 1) the head's ``[d_v, d_k]`` flattened; KDA
        (U = d_k) the column ``S[h, :, k]`` (d_v elements). Follows ``torch.reshape``: GDN rows are a
        view of ``state`` when its ``[H, d_v, d_k]`` axes are contiguous; KDA columns are strided in
        memory, so they come back as a copy (write them back with :meth:`state_from_units`).

        Raises:
            ValueError: ``state`` does not end in ``[H, d_v, d_k]`` with this spec's d_v, d_k.
        """
        shape = tuple(state.shape)
        if len(shape) < 3 or shape[-2:] != (self.d_v, self.d_k):
            raise ValueError(f"state must have shape [..., H, d_v={self.d_v}, d_k={self.d_k}], got {list(shape)}")
        lead, h = shape[:-3], shape[-3]
        if self.unit_layout.whole_head:
            return state.reshape(*lead, h, self.unit_elems)
        return state.transpose(-1, -2).reshape(*lead, h * self.d_k, self.d_v)

    def state_from_units(self, rows):
        """Inverse of :meth:`units_view`: rows ``[..., H * U, unit_elems]`` -> state ``[..., H, d_v, d_k]``.

        Raises:
            ValueError: the rows' trailing shape is not ``[H * U, unit_elems]``.
        """
        shape = tuple(rows.shape)
        u = self.units_per_head
        if len(shape) < 2 or shape[-1] != self.unit_elems or shape[-2] % u:
            raise ValueError(f"rows must have shape [..., H * {u}, {self.unit_elems}], got {list(shape)}")
        lead, h = shape[:-2], shape[-2] // u
        if self.unit_layout.whole_head:
            return rows.reshape(*lead, h, self.d_v, self.d_k)
        return rows.reshape(*lead, h, self.d_k, self.d_v).transpose(-1, -2)


def fmt_bytes(n: int | float) -> str:
    """Bytes in the largest binary unit that keeps the figure under 1024: whole bytes, else two decimals below 100
    of the unit and whole figures from 100: ``640 B``, ``1.50 KiB``, ``41.41 MiB``, ``1000 MiB``, ``1.00 MiB`` for
    1,048,575 bytes (1024 KiB when rounded moves up a unit)."""
    n = float(n)
    if abs(n) < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        text = f"{n:.0f}" if abs(n) >= 99.995 else f"{n:.2f}"
        if abs(float(text)) < 1024 or unit == "TiB":
            return f"{text} {unit}"
    raise AssertionError("unreachable")


def byte_count(n: int) -> str:
    """A byte count in a sizing message: ``"41.41 MiB (43,417,600 bytes)"``; under 1 KiB only ``"1 byte"`` /
    ``"512 bytes"``. A figure a user is told to pass back as a flag (``--budget N``) is printed whole instead, as the
    flag takes it."""
    n = int(n)
    return f"{fmt_bytes(n)} ({n:,} bytes)" if abs(n) >= 1024 else f"{n} byte" + ("" if n == 1 else "s")


def flag_bytes(n: int) -> str:
    """A byte count a message asks the user to pass back as a flag (``--budget N``): whole, so it pastes, then
    in units from 1 KiB: ``"1823539200 bytes (1.70 GiB)"``, ``"768 bytes"``."""
    n = int(n)
    return f"{n} bytes" + (f" ({fmt_bytes(n)})" if abs(n) >= 1024 else "")
