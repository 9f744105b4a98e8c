"""The plan's pydantic models (DESIGN.md "Plan artifact"): what ``plan.json`` holds, field by field.

Rules for ``SCHEMA_VERSION``: bump it whenever a field is added, removed, renamed or changes meaning
or type; the committed JSON schema (``dasc_compile/schema/plan.schema.json``) must be regenerated in
the same commit (``python -m dasc_compile.schema --write``); ``tests/compile/test_schema_version.py`` fails
otherwise. Python-side names may differ from the JSON keys through a pydantic alias (the JSON key,
and so the plan bytes, stay; e.g. ``StorageMap.n_packed`` is written as ``n_local``).

Units in this file: token counts are tokens; every ``bytes_*`` field is bytes; unit indices are
flat indices ``u = h * units_per_head + k`` into a layer's ``[H, units_per_head]`` unit grid
(GDN, Mamba2: units_per_head = 1, u = head h; KDA: units_per_head = d_k, u = column S[h, :, k]);
the unit shapes and bytes themselves come from :class:`dasc_compile.schema.units.UnitSpec`.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dasc_compile.policy import Policy

SCHEMA_VERSION = 5
PLAN_FILENAME = "plan.json"

#: ``ModelInfo.unit_kind``: the names of :data:`dasc_compile.schema.units.UNIT_KINDS`.
UnitKindName = Literal["gdn_head", "kda_column", "mamba2_head"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="strings")


class ServedDecay(_Frozen):
    """The decay tensors as SGLang holds them once its loader has transformed them, for a family whose
    served form is not the checkpoint's (Mamba2: ``A = -exp(A_log)`` in FP32 and ``dt_bias`` in the model
    dtype, SGLang ``layers/attention/mamba/mamba.py``). ``-exp`` cannot be inverted bit for bit, so the
    runtime compares the served values with these within ``rtol`` instead of hashing them.
    """

    names: list[str]                        # served parameter names (TP = 1), in Fingerprint.decay_tensors order
    values: list[list[float]]               # float64 values of each served tensor, flattened
    rtol: list[float]                       # relative tolerance of each tensor (its served dtype's rounding)


class Fingerprint(_Frozen):
    """What the plan was compiled from; the runtime recomputes ``decay_sha256`` from loaded weights.

    ``decay_sha256`` hashes, for each decay tensor in ``decay_tensors`` order, its name, dtype,
    shape and raw little-endian bytes (see :func:`dasc_compile.checkpoint.decay_fingerprint`).
    """

    config_sha256: str
    decay_sha256: str
    decay_tensors: list[str]
    served: Optional[ServedDecay] = None   # decay tensors as the server transforms them (Mamba2), else None


class ModelInfo(_Frozen):
    """Architecture facts read from config.json (and cross-checked against tensor names)."""

    model_type: str
    architectures: list[str]
    num_hidden_layers: int
    recurrent_layer_ids: list[int]          # 0-indexed model layer ids, increasing
    full_attention_layer_ids: list[int]
    family: str                             # gdn | kda | kda_safe_gate | mamba2
    unit_kind: UnitKindName
    num_value_heads: int                    # H_v (GDN) / H (KDA, Mamba2)
    num_key_heads: int                      # H_k (GDN); == H for KDA and Mamba2
    head_k_dim: int                         # d_k (Mamba2: d_state)
    head_v_dim: int                         # d_v (Mamba2: head_dim)
    conv_kernel: int                        # K of the short conv; conv state keeps K-1 columns
    conv_dim: int                           # channels of the conv state at TP=1
    provenance: str                         # checkpoint metadata note, e.g. "initialisation draw, not trained"
    conv_groups: Optional[int] = None       # Mamba2 n_groups (B/C groups of the conv state); None otherwise


class HorizonQuantiles(_Frozen):
    """Quantiles of H_s (tokens) over one layer's units; ``inf`` for non-negative static decay."""

    min: float
    p10: float
    p50: float
    p90: float
    max: float


class LayerPlan(_Frozen):
    """One recurrent layer: selection, ragged placement and bytes (paper §4.1, App. B Scheme 2).

    ``horizon_local_max`` / ``horizon_global_min``: the largest retention horizon H_s (Eq. 3, tokens) among the
    layer's omitted (local) units and the smallest among its kept (global) units; null when that set is empty,
    the string ``"Infinity"`` for a unit that never decays (as in ``horizon_quantiles``). A horizon selection has
    ``horizon_local_max <= policy.w_max < horizon_global_min`` (§4.1: a horizon equal to w_max is local); a Random
    plan (§5.2) records the same two figures of the units it drew, in either order.
    """

    layer_id: int                           # model layer index (0-indexed)
    recurrent_index: int                    # l - 1: position among recurrent layers
    family: str
    num_heads: int                          # value heads H_v (GDN) or heads H (KDA, Mamba2)
    units_per_head: int                     # 1 (GDN, Mamba2 head) or d_k (KDA column)
    n_units: int                            # n_l = num_heads * units_per_head
    n_kept: int                             # r_l: global units kept
    offset: int                             # o_{l-1}: first row of this layer in the ragged pool
    kept_units: list[int]                   # sorted flat unit ids (len == n_kept)
    horizon_quantiles: HorizonQuantiles
    horizon_histogram: list[int]            # counts over Plan.horizon_bin_edges (last bin: inf)
    horizon_local_max: Optional[float]      # max H_s over omitted units (tokens); None if none omitted
    horizon_global_min: Optional[float]     # min H_s over kept units (tokens, inf allowed); None if none kept
    refresh_window: int                     # max_{u local} W_u = W(horizon_local_max) (Eq. 7), 0 if none omitted
    bytes_temporal_dense: int               # per state checkpoint, TP=1
    bytes_temporal_kept: int
    bytes_conv: int


class Totals(_Frozen):
    """Whole-model figures at TP=1 (Eq. 6, App. B, App. C.1)."""

    num_recurrent_layers: int               # L
    n_units: int                            # sum_l n_l
    n_kept: int                             # sum_l r_l
    r_max: int                              # R_max = max_l r_l
    r_mean: float                           # r_bar
    c_temp_ragged: float                    # sum n / sum r  (inf when nothing kept)
    c_temp_padded: float                    # sum n / (L * R_max)
    layout_gain: float                      # R_max / r_bar
    bytes_temporal_dense: int               # per state checkpoint
    bytes_temporal_kept: int
    bytes_conv: int
    bytes_dense_checkpoint: int             # B_temp_dense + B_conv
    bytes_compressed_checkpoint: int        # B_temp_kept + B_conv (+ INT8 scales when int8)
    c_ckpt: float                           # Eq. 6
    unit_bytes: int                         # bytes of one temporal unit at temporal_dtype
    usable_slots: Optional[int] = None      # floor(pool_budget / bytes_compressed) - 1, TP=1
    usable_slots_dense: Optional[int] = None


class RankPayload(_Frozen):
    """One TP rank's share of one state checkpoint slot (App. B.1, C.1), at one placement stage.

    Counts are temporal units (GDN head states ``[d_v, d_k]`` or KDA columns ``[d_v]``); bytes are
    bytes per slot. ``n_alloc`` is what the rank reserves per slot: equal to ``n_kept`` in the compute
    layout, ``StorageMap.slot_width`` (= ceil(N / P)) on every rank after storage balancing (Fig. 9 (b)
    step 6). The conv state never moves between ranks, so ``bytes_conv`` is the same at every stage.
    """

    rank: int
    n_kept: int                             # units this rank holds at this stage (n_r, or t_r after balancing)
    n_alloc: int                            # units reserved per slot on this rank (>= n_kept)
    bytes_temporal: int                     # n_alloc * bytes_per_unit (INT8 scales included when int8)
    bytes_conv: int                         # L * conv bytes of one layer on one rank
    bytes_per_slot: int                     # bytes_temporal + bytes_conv


class CoupledTensor(_Frozen):
    """A checkpoint tensor that a compute-head permutation must reorder (App. B.1 (a) step 7).

    Along ``axis``, each ``[start, length]`` range in ``segments`` is made of ``num_bundles`` equal,
    contiguous blocks, block i belonging to original bundle i (one key head of GDN with its
    ``B = H_v / H_k`` value heads, or one KDA head). Permuting means: for every segment, new block i
    is old block ``LayerPermutation.bundle_order[i]``; elements outside the segments stay put.
    ``axis_size`` is the size of ``axis`` in the checkpoint at TP = 1 (for verification by the loader).
    Layouts follow SGLang 0.5.17 ``models/qwen3_next.py``, ``models/qwen3_5.py``,
    ``models/kimi_linear.py`` and transformers' ``modeling_qwen3_next.py`` / ``modeling_qwen3_5.py``.
    """

    name: str                               # full checkpoint tensor name
    axis: int
    axis_size: int                          # size of `axis` at TP = 1
    segments: list[list[int]]               # [[start, length], ...] on `axis`; length % num_bundles == 0
    note: str = ""


class LayerPermutation(_Frozen):
    """Compute-head permutation of one recurrent layer (Fig. 9 (a)).

    After the permutation, SGLang's contiguous sharding gives rank r the new positions
    ``[r*K, (r+1)*K)`` of ``bundle_order`` (K = bundles per rank), i.e. the original bundles owned by r.
    """

    layer_id: int
    bundle_size: int                        # B: 1 (KDA) or H_v / H_k (GDN) value heads per bundle
    bundle_owner: list[int]                 # rank of each original bundle
    bundle_order: list[int]                 # new bundle position i holds original bundle bundle_order[i]
    head_order: list[int]                   # same at value-head granularity (len H_v)
    coupled_tensors: list[CoupledTensor]


class StorageMap(_Frozen):
    """Storage balancing of packed units across ranks (Fig. 9 (b)); an exact reindexing.

    Rank r packs ``n_local[r]`` units (its kept units of all layers, in ragged order). It keeps the first
    ``keep[r] = min(n_r, t_r)`` at storage positions ``0 .. keep[r]-1`` and sends the rest. ``runs[r]``
    covers ``[0, n_r)`` in order with ``[local_start, count, dest_rank, dest_pos]``: packed units
    ``local_start + i`` go to rank ``dest_rank`` at storage position ``dest_pos + i``. Because excess
    units and deficit positions are both listed in increasing order and paired in order, rank r's
    excess units ``[keep_r, n_r)`` are sorted by destination rank and arrive at rank s's positions
    ``[n_s, t_s)`` in source-rank order: store is one ``all_to_all_single`` with input splits
    ``send_splits[r]`` and output splits ``recv_splits(s)``; load is the same call with the roles
    swapped. ``send_splits[r][r] == 0`` (kept units are copied locally).
    """
    # This docstring is part of the published JSON schema (its "description"): editing it changes the
    # schema hash and needs a SCHEMA_VERSION bump. ``n_local`` in it is the JSON key of ``n_packed``
    # (the units are kept ones; "local" there meant rank-local), and ``local_start`` is the start in
    # the rank's packed order.

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="strings", populate_by_name=True)

    n_packed: list[int] = Field(alias="n_local")   # n_r: units rank r packs (compute layout)
    targets: list[int]                      # t_r: units rank r stores
    keep: list[int]                         # min(n_r, t_r)
    slot_width: int                         # ceil(N / P) units allocated per slot on every rank
    runs: list[list[list[int]]]             # per rank: [[packed_start, count, dest_rank, dest_pos], ...]
    send_splits: list[list[int]]            # [P][P] units rank r sends to rank s during store
    m_remote: int                           # sum_r max(0, n_r - t_r): units that cross ranks

    @property
    def n_local(self) -> list[int]:
        """Old Python name of :attr:`n_packed` (kept until ``dasc_runtime`` reads ``n_packed``)."""
        return self.n_packed

    @property
    def tp_size(self) -> int:
        """P: the number of ranks the map covers."""
        return len(self.n_packed)

    @property
    def skip_all_to_all(self) -> bool:
        """True when no unit moves (M_remote = 0): store and load are local copies only."""
        return self.m_remote == 0

    def recv_splits(self, rank: int) -> list[int]:
        """Units rank ``rank`` receives from each source rank during store (column of send_splits)."""
        return [self.send_splits[s][rank] for s in range(self.tp_size)]

    def dest_map(self, rank: int) -> tuple[list[int], list[int]]:
        """Expanded destination map of rank ``rank``: ``(dest_rank[j], dest_pos[j])`` for j < n_r."""
        ranks: list[int] = []
        pos: list[int] = []
        for start, count, dst, dpos in self.runs[rank]:
            assert start == len(ranks), f"rank {rank}: runs not contiguous at {start}"
            ranks.extend([dst] * count)
            pos.extend(range(dpos, dpos + count))
        return ranks, pos


class TPPlan(_Frozen):
    """TP placement and accounting for degree P (App. B.1, Fig. 9, C.1): the bottleneck rank decides.

    Stages: ``payload_contiguous`` (SGLang's contiguous head sharding), ``payload_compute`` (after the
    optional compute-head permutation; equals contiguous unless ``balance == "hybrid"``),
    ``payload_storage`` (what each rank stores and reserves per slot; equals compute when
    ``balance == "off"``). ``kept_per_rank_layer[r][i]`` is the number of kept units rank r packs in
    recurrent layer i in the compute layout: its per-rank ragged counts. Per-rank unit lists:
    :meth:`rank_local_units`.
    """

    tp_size: int
    balance: Literal["off", "storage", "hybrid"]
    heads_per_rank: int                     # value heads per rank (H_v / P)
    units_per_head: int                     # 1 (GDN) or d_k (KDA)
    bytes_per_unit: int                     # bytes of one stored temporal unit (incl. INT8 scales)
    kept_per_rank_layer: list[list[int]]    # [P][L] compute layout
    payload_contiguous: list[RankPayload]   # SGLang's contiguous head sharding
    payload_compute: list[RankPayload]      # after the optional compute-head permutation
    payload_storage: list[RankPayload]      # what each rank stores (after storage balancing)
    bottleneck_rank: int                    # first rank with the largest storage bytes_per_slot
    bottleneck_bytes_per_slot: int
    bytes_dense_per_slot: int               # per rank, dense checkpoint: L * (dense temporal + conv)
    c_ckpt_tp: float                        # bytes_dense_per_slot / bottleneck_bytes_per_slot
    m_remote: int = 0                       # units moved per store (0 when balance == "off")
    usable_slots: Optional[int] = None      # floor(pool_budget / bottleneck) - 1
    permutation: Optional[list[LayerPermutation]] = None   # one per recurrent layer (hybrid only)
    storage: Optional[StorageMap] = None                   # storage / hybrid only

    def head_order(self, layer_index: int) -> list[int]:
        """Value-head order of recurrent layer ``layer_index`` in the compute layout (identity
        unless hybrid): new head position i holds original head ``head_order[i]``."""
        if self.permutation is None:
            return list(range(self.heads_per_rank * self.tp_size))
        return list(self.permutation[layer_index].head_order)

    def rank_kept_units(self, kept_units: list[list[int]], rank: int) -> list[list[int]]:
        """Per layer, the kept units rank ``rank`` packs, as ids into its own heads, in ragged (packing) order.

        Args:
            kept_units: per recurrent layer, the kept flat unit ids ``u = h * units_per_head + k`` in
                the checkpoint's original head numbering (``LayerPlan.kept_units``).
            rank: TP rank in ``[0, tp_size)``.
        Returns:
            per layer, sorted rank-local ids ``j * units_per_head + k`` where j in ``[0, H_v / P)``
            indexes the rank's local temporal state ``[H_v / P, d_v, d_k]`` after the permutation.
            Concatenating the layers gives the rank's packed order (length ``StorageMap.n_packed[rank]``)
            that :class:`StorageMap` indexes.
        Raises:
            ValueError: rank out of range or a layer count that does not match the plan.
        """
        if not 0 <= rank < self.tp_size:
            raise ValueError(f"rank must be in [0, {self.tp_size}), got {rank}")
        if len(kept_units) != len(self.kept_per_rank_layer[0]):
            raise ValueError(f"kept_units must list {len(self.kept_per_rank_layer[0])} layers, got {len(kept_units)}")
        u_h, hl = self.units_per_head, self.heads_per_rank
        out: list[list[int]] = []
        for i, kept in enumerate(kept_units):
            order = self.head_order(i)
            local_of = {order[rank * hl + j]: j for j in range(hl)}
            ids = sorted(local_of[u // u_h] * u_h + u % u_h for u in kept if u // u_h in local_of)
            assert len(ids) == self.kept_per_rank_layer[rank][i], (rank, i, len(ids))
            out.append(ids)
        return out

    #: Old name of :meth:`rank_kept_units` (the class docstring, part of the JSON schema, names it).
    rank_local_units = rank_kept_units


class RefreshPlan(_Frozen):
    """dasc-wr refresh windows (Eq. 7). W_replay = min(n_p, w_replay_cap); 0 means skip refresh."""

    w_replay_cap: int                       # max over all local units of W_u (tokens)
    any_local: bool


class KernelModule(_Frozen):
    """The rendered kernel module written beside plan.json (DESIGN.md "Kernels")."""

    file: str                               # file name inside the plan directory
    key: str                                # hash of (template sources, constants, dasc, triton versions)
    ops: list[str]
    constants: dict[str, int | str | bool] = Field(
        description="the kernels' specialisation constants, written in key order: their order carries no meaning, so "
                    "a plan whose keys a JSON tool sorted hashes as the plan dasc wrote")
    source_sha256: str                      # sha256 of the rendered file's UTF-8 bytes: an edited file is refused

    @field_validator("constants")
    @classmethod
    def _key_order(cls, constants: dict) -> dict:
        """Key order is not content: the canonical JSON (and so the content hash) sees the keys sorted."""
        return dict(sorted(constants.items()))


class Plan(_Frozen):
    """A compiled dasc plan (``plan.json``). See module docstring for versioning rules."""

    schema_version: int = SCHEMA_VERSION
    dasc_version: str
    content_hash: str = ""                  # sha256 of the canonical JSON with this field empty
    model: ModelInfo
    fingerprint: Fingerprint
    policy: Policy
    selection: Literal["horizon", "random"]
    horizon_bin_edges: list[float]          # tokens; histogram bin i is [edge_i, edge_{i+1}), last is [edge_-1, inf]
    layers: list[LayerPlan]
    totals: Totals
    tp: TPPlan
    refresh: RefreshPlan
    kernels: Optional[KernelModule] = None
