"""``dasc compile``: checkpoint -> arch spec -> horizons -> selection -> layout -> TP maps -> Plan -> kernels.

One direction, one module per stage (DESIGN.md "Data flow"); this module only wires them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from dasc_compile import __version__
from dasc_compile.arch import ArchSpec, arch_from_config, check_against_tensors, text_config
from dasc_compile.artifact import prepare_out, write_plan_dir
from dasc_compile.checkpoint import (config_fingerprint, decay_fingerprint, open_checkpoint, read_decay_tensors,
                                     refuse_one_shard_of_several, require_model_path)
from dasc_compile.errors import DascInputError
from dasc_compile.families.base import FAMILIES
from dasc_compile.horizons import (
    HORIZON_BIN_EDGES,
    horizon_histogram,
    horizon_quantiles,
    retention_horizon,
    static_log_decay,
)
from dasc_compile.accounting import compression_ratios, ragged_offsets, ratio
from dasc_compile.schema.cutoff import layer_refresh_window
from dasc_compile.policy import Policy
from dasc_compile.schema import (
    Fingerprint,
    HorizonQuantiles,
    LayerPlan,
    ModelInfo,
    Plan,
    RefreshPlan,
    Totals,
    usable_slots,
    with_content_hash,
)
from dasc_compile.plan_checks import check_servable
from dasc_compile.selection import layer_kept_sets


def default_out_dir(model: str | Path) -> Path:
    """``<model dir name>.dasc`` in the current directory (the dir holding a file or index)."""
    p = Path(model)
    name = p.resolve().name if p.is_dir() else p.parent.resolve().name     # resolve: '.' and '..' have no name
    return Path(f"{name or 'model'}.dasc")


def resolve_family_policy(spec: ArchSpec, policy: Policy) -> Policy:
    """Fill policy defaults that depend on the model: a_s (family default), family, safe-gate bound."""
    fam = FAMILIES[spec.family]
    upd: dict = {"family": spec.family}
    if policy.a_s is None:
        upd["a_s"] = fam.default_a_s
    if spec.safe_gate_lower_bound is not None and "safe_gate_lower_bound" not in policy.model_fields_set:
        upd["safe_gate_lower_bound"] = spec.safe_gate_lower_bound
    return policy.model_copy(update=upd)


def layer_horizons(spec: ArchSpec, policy: Policy, tensors: list[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
    """Retention horizons per recurrent layer (Eq. 2, 3): float64 ``[n_units]`` each, tokens.

    Raises:
        DascInputError: a unit's static log-decay is NaN (e.g. ``exp(A_log)`` overflows to inf while
            ``softplus(a_s + dt_bias)`` underflows to 0: ``inf * 0``), naming both tensors and the unit.
    """
    out = []
    for i in range(len(spec.recurrent_layer_ids)):
        (a_name, a_log), (d_name, dt_bias) = tensors[2 * i], tensors[2 * i + 1]
        g = static_log_decay(spec.family, a_log, dt_bias, policy.a_s, policy.safe_gate_lower_bound)
        bad = torch.isnan(g).nonzero().flatten()
        if bad.numel():
            u = int(bad[0])
            raise DascInputError(
                f"{a_name} / {d_name}: the static log-decay of {bad.numel()} unit(s) is not a number (first: unit {u}, "
                f"A_log {float(a_log.reshape(-1)[u // (g.numel() // a_log.numel())]):.3g}, dt_bias "
                f"{float(dt_bias.reshape(-1)[u]):.3g}: exp(A_log) * softplus(a_s + dt_bias) is inf * 0); "
                f"expected decay values whose product is finite")
        out.append(retention_horizon(g, policy.eps))
    return out


def layer_horizon_stats(horizons: list[torch.Tensor]) -> list[tuple[HorizonQuantiles, list[int]]]:
    """Per recurrent layer, the quantiles and histogram (over ``HORIZON_BIN_EDGES``) of its horizons (tokens)."""
    return [(HorizonQuantiles(**horizon_quantiles(h)), horizon_histogram(h, HORIZON_BIN_EDGES)) for h in horizons]


def build_plan(spec: ArchSpec, policy: Policy, horizons: list[torch.Tensor], *, fingerprint: Fingerprint,
               provenance: str, quantization_config: dict | None = None,
               stats: list[tuple[HorizonQuantiles, list[int]]] | None = None) -> Plan:
    """Assemble the :class:`Plan` (without kernels) from per-layer horizons.

    Args:
        spec: architecture; policy: resolved policy (``w_max`` and ``a_s`` set).
        horizons: per recurrent layer, float64 ``[n_units]`` retention horizons (tokens).
        quantization_config: the config's ``quantization_config`` (quantized weights cannot be
            permuted, so ``balance: hybrid`` is refused for them).
        stats: :func:`layer_horizon_stats` of ``horizons`` when already computed (they do not depend on
            w_max, TP or INT8).
    Raises:
        DascInputError: ``tp_size`` incompatible with the heads (from the TP stage).
    """
    from dasc_compile.tp import build_tp_plan, check_tp_config  # TP stage (App. B.1)

    P = policy.tp_size
    check_tp_config(spec, P, policy.balance, quantization_config)   # before any per-rank shape is taken
    w_max = policy.w_max
    n_l = spec.n_units_per_layer
    unit = spec.unit_spec(policy)                   # shapes and bytes of one unit, layer and conv state
    ub = unit.unit_bytes
    dense_l = unit.temporal_layer_bytes(spec.num_value_heads)
    conv_l = unit.conv_bytes_per_layer(1)

    kept_sets = layer_kept_sets(spec, policy, horizons)
    offsets = ragged_offsets([int(k.numel()) for k in kept_sets])

    layers = []
    w_cap = 0
    stats = stats if stats is not None else layer_horizon_stats(horizons)
    for i, (layer_id, h, kept) in enumerate(zip(spec.recurrent_layer_ids, horizons, kept_sets)):
        local = torch.ones(n_l, dtype=torch.bool)
        local[kept] = False
        # the bounds of the units actually omitted / kept (a Random plan's too); None for an empty set
        local_max = float(h[local].max()) if bool(local.any()) else None
        global_min = float(h[kept].min()) if kept.numel() else None
        w_layer = layer_refresh_window(local_max, w_max)   # Eq. 7, at the longest local horizon
        w_cap = max(w_cap, w_layer)
        layers.append(LayerPlan(
            layer_id=layer_id,
            recurrent_index=i,
            family=spec.family,
            num_heads=spec.num_value_heads,
            units_per_head=spec.units_per_head,
            n_units=n_l,
            n_kept=int(kept.numel()),
            offset=offsets[i],
            kept_units=kept.tolist(),               # int64 tensor -> Python ints
            horizon_quantiles=stats[i][0],
            horizon_histogram=stats[i][1],
            horizon_local_max=local_max,
            horizon_global_min=global_min,
            refresh_window=w_layer,
            bytes_temporal_dense=dense_l,
            bytes_temporal_kept=int(kept.numel()) * ub,
            bytes_conv=conv_l,
        ))

    kept_counts = [lp.n_kept for lp in layers]
    ratios = compression_ratios([n_l] * len(layers), kept_counts)
    L = len(layers)
    b_dense_t = dense_l * L
    b_kept_t = sum(lp.bytes_temporal_kept for lp in layers)
    b_conv = conv_l * L
    totals = Totals(
        num_recurrent_layers=L,
        n_units=n_l * L,
        n_kept=sum(kept_counts),
        r_max=ratios["r_max"],
        r_mean=ratios["r_mean"],
        c_temp_ragged=ratios["c_temp_ragged"],
        c_temp_padded=ratios["c_temp_padded"],
        layout_gain=ratios["layout_gain"],
        bytes_temporal_dense=b_dense_t,
        bytes_temporal_kept=b_kept_t,
        bytes_conv=b_conv,
        bytes_dense_checkpoint=b_dense_t + b_conv,
        bytes_compressed_checkpoint=b_kept_t + b_conv,
        c_ckpt=ratio(b_dense_t + b_conv, b_kept_t + b_conv),
        unit_bytes=ub,
        # pool_budget_bytes is per rank: the whole-model slot count is meaningful only at TP = 1
        # (under TP the bottleneck rank decides: plan.tp.usable_slots)
        usable_slots=usable_slots(policy.pool_budget_bytes, b_kept_t + b_conv) if policy.tp_size == 1 else None,
        usable_slots_dense=(usable_slots(policy.pool_budget_bytes, b_dense_t + b_conv)
                            if policy.tp_size == 1 else None),
    )
    tp = build_tp_plan(
        spec, [lp.kept_units for lp in layers], policy,
        bytes_per_unit=ub,
        conv_bytes_per_layer_rank=unit.conv_bytes_per_layer(P),
        dense_temporal_bytes_per_layer_rank=unit.temporal_layer_bytes(spec.num_value_heads // P),
        quantization_config=quantization_config,
    )
    model = ModelInfo(
        model_type=spec.model_type,
        architectures=list(spec.architectures),
        num_hidden_layers=spec.num_hidden_layers,
        recurrent_layer_ids=list(spec.recurrent_layer_ids),
        full_attention_layer_ids=list(spec.full_attention_layer_ids),
        family=spec.family,
        unit_kind=spec.unit_kind,
        num_value_heads=spec.num_value_heads,
        num_key_heads=spec.num_key_heads,
        head_k_dim=spec.head_k_dim,
        head_v_dim=spec.head_v_dim,
        conv_kernel=spec.conv_kernel,
        conv_dim=spec.conv_dim,
        provenance=provenance,
        conv_groups=spec.conv_groups or None,
    )
    return Plan(
        dasc_version=__version__,
        model=model,
        fingerprint=fingerprint,
        policy=policy,
        selection=policy.selection,
        horizon_bin_edges=list(HORIZON_BIN_EDGES),
        layers=layers,
        totals=totals,
        tp=tp,
        refresh=RefreshPlan(w_replay_cap=w_cap, any_local=totals.n_kept < totals.n_units),
    )


@dataclass(frozen=True)
class DecaySource:
    """A checkpoint read once (``~KB``: config.json and the decay tensors): what every plan of it is built from.

    Attributes:
        spec: the architecture (:class:`ArchSpec`); tensors: ``[(name, tensor)]``, per recurrent layer
            ``A_log`` then ``dt_bias`` (shapes ``spec.a_log_shape`` / ``spec.dt_bias_shape``, as stored);
        fingerprint: the :class:`Fingerprint` a plan records; provenance: the checkpoint's note;
        quantization_config: the config's, or None (quantized weights cannot be permuted).
    """

    spec: ArchSpec
    tensors: list
    fingerprint: Fingerprint
    provenance: str
    quantization_config: dict | None


def read_decay_source(model: str | Path, *, config: str | Path | None = None,
                      family: str | None = None) -> DecaySource:
    """Open ``model`` (file, directory or index), check its config against its tensors, read the decay tensors.

    Args:
        family: the policy's ``family`` (a check against the config's, see :func:`arch_from_config`).
    Raises:
        DascInputError: any bad file, tensor or config field; a config with no recurrent layer.
    """
    src = open_checkpoint(model, config)
    spec = arch_from_config(src.config, str(src.config_path), family)
    if not spec.recurrent_layer_ids:
        raise DascInputError(
            f"{src.config_path}: the config makes no layer recurrent ({spec.layer_kind_source} lists only full "
            f"attention); dasc compresses recurrent state, expected at least one linear-attention layer")
    refuse_one_shard_of_several(Path(model), (*spec.a_log_names, *spec.dt_bias_names), src.tensor_files)
    check_against_tensors(spec, src.tensor_files.keys(), str(src.root))
    tensors = read_decay_tensors(src, spec)
    served = FAMILIES[spec.family].served_decay   # the family's served form, when the server transforms it
    fingerprint = Fingerprint(
        config_sha256=config_fingerprint(src.config),
        decay_sha256=decay_fingerprint(tensors),
        decay_tensors=[name for name, _ in tensors],
        served=served(tensors) if served is not None else None,
    )
    return DecaySource(spec=spec, tensors=tensors, fingerprint=fingerprint, provenance=src.provenance,
                       quantization_config=text_config(src.config).get("quantization_config")
                       or src.config.get("quantization_config"))


def plan_from_source(source: DecaySource, policy: Policy, *, horizons: dict | None = None) -> Plan:
    """The plan of ``source`` under ``policy``, in memory: no kernels, no content hash (see :func:`finish_plan`).

    Args:
        horizons: a cache shared across calls (``dasc sweep``): the per-layer horizons of Eq. 3 depend only
            on (a_s, eps, safe-gate bound), not on w_max, TP or INT8.
    Raises:
        DascInputError: ``w_max`` unset, a TP size the heads do not divide, a pool budget that holds no slot.
    """
    if policy.w_max is None:
        raise DascInputError("w_max is not set: pass --wmax N or set 'w_max' in the policy file")
    policy = resolve_family_policy(source.spec, policy)
    key = (policy.a_s, policy.eps, policy.safe_gate_lower_bound)
    cached = horizons.get(key) if horizons is not None else None
    if cached is None:
        h = layer_horizons(source.spec, policy, source.tensors)
        cached = (h, layer_horizon_stats(h))
        if horizons is not None:
            horizons[key] = cached
    plan = build_plan(source.spec, policy, cached[0], fingerprint=source.fingerprint, provenance=source.provenance,
                      quantization_config=source.quantization_config, stats=cached[1])
    check_servable(plan)
    return plan


def finish_plan(plan: Plan, *, with_kernels: bool = True) -> tuple[Plan, dict[str, str]]:
    """Render the kernel module (optional) and set the content hash: the plan as ``dasc compile`` writes it.

    Returns:
        (plan, {file name: source} of the files beside plan.json).
    """
    files: dict[str, str] = {}
    if with_kernels:
        from dasc_compile.kernels import kernel_constants, kernel_module_entry, render_kernel_module

        constants = kernel_constants(plan)
        file_name, source = render_kernel_module(constants)
        files[file_name] = source
        plan = plan.model_copy(update={"kernels": kernel_module_entry(constants, file_name, source)})
    return with_content_hash(plan), files


def compile_plan(model: str | Path, policy: Policy, out_dir: str | Path | None = None, *,
                 config: str | Path | None = None, with_kernels: bool = True) -> tuple[Plan, Path]:
    """Compile a plan for the checkpoint at ``model`` and write it atomically to ``out_dir``.

    Reads only the decay tensors (A_log, dt_bias) of the recurrent layers.

    Args:
        model: a ``.safetensors`` file, a directory with config.json + shards, or a
            ``model.safetensors.index.json``.
        policy: settings (``w_max`` required).
        out_dir: plan directory (default ``<model>.dasc``).
        config: config.json for a lone ``.safetensors`` file when it is not beside it.
        with_kernels: render the Triton kernel module into the plan directory.
    Returns:
        (plan, path of the written plan directory).
    Raises:
        DascInputError: any bad input (file, tensor, config field, policy value); nothing is written.
    """
    require_model_path(model)   # the first argument first: a missing path is named before a missing --wmax
    if policy.w_max is None:
        raise DascInputError("w_max is not set: pass --wmax N or set 'w_max' in the policy file")
    out = Path(out_dir) if out_dir is not None else default_out_dir(model)
    prepare_out(out)   # early: a refused --out costs no reading; an interrupted replacement is undone
    return write_plan(plan_from_source(read_decay_source(model, config=config, family=policy.family), policy),
                      out, with_kernels=with_kernels)


def write_plan(plan: Plan, out: Path, *, with_kernels: bool = True) -> tuple[Plan, Path]:
    """:func:`finish_plan`, check it as its reader will, and write it atomically to ``out``.

    Raises:
        DascInputError: ``out`` cannot hold a plan (see :func:`dasc_compile.artifact.write_plan_dir`).
    """
    plan, files = finish_plan(plan, with_kernels=with_kernels)
    _check_own_plan(plan, out)
    return plan, write_plan_dir(plan, out, files)


def _check_own_plan(plan: Plan, out: Path) -> None:
    """Run the plan reader's consistency checks on the plan about to be written: dasc never writes a plan
    that its own reader (``dasc inspect``, the runtime) would refuse.

    Raises:
        RuntimeError: the compiler built an inconsistent plan (a bug in dasc, not bad input).
    """
    from dasc_compile.schema.reader import check_plan

    try:
        check_plan(plan, out / "plan.json")
    except DascInputError as exc:
        raise RuntimeError(f"the compiled plan fails its own consistency check, nothing was written: {exc}") from None
