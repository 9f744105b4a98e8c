"""``dasc compile``: checkpoint -> arch spec -> horizons -> selection -> layout -> TP maps -> Plan -> kernels.

One direction, one module per stage (DESIGN.md "Data flow"); this module only wires them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dasc_compile import __version__
from dasc_compile.arch import ArchSpec, arch_from_config, check_against_tensors, text_config
from dasc_compile.artifact import write_plan_dir
from dasc_compile.checkpoint import config_fingerprint, decay_fingerprint, open_checkpoint, read_decay_tensors
from dasc_compile.errors import DascInputError
from dasc_compile.families.base import FAMILIES
from dasc_compile.horizons import (
    HORIZON_BIN_EDGES,
    horizon_histogram,
    horizon_quantiles,
    retention_horizon,
    static_log_decay,
    unit_refresh_window,
)
from dasc_compile.layout import (
    compression_ratios,
    conv_bytes_per_layer,
    dense_temporal_bytes_per_layer,
    ragged_offsets,
    ratio,
    unit_bytes,
    usable_slots,
)
from dasc_compile.policy import Policy
from dasc_compile.schema import (
    Fingerprint,
    HorizonQuantiles,
    LayerPlan,
    ModelInfo,
    Plan,
    RefreshPlan,
    Totals,
    with_content_hash,
)
from dasc_compile.selection import random_count_matched, select_global


def default_out_dir(model: str | Path) -> Path:
    """``<model dir name>.dasc`` in the current directory (the dir holding a file or index)."""
    p = Path(model)
    name = p.name if p.is_dir() else p.parent.resolve().name
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
    """Retention horizons per recurrent layer (Eq. 2, 3): float64 ``[n_units]`` each, tokens."""
    out = []
    for i in range(len(spec.recurrent_layer_ids)):
        a_log = tensors[2 * i][1]
        dt_bias = tensors[2 * i + 1][1]
        g = static_log_decay(spec.family, a_log, dt_bias, policy.a_s, policy.safe_gate_lower_bound)
        out.append(retention_horizon(g, policy.eps))
    return out


def build_plan(spec: ArchSpec, policy: Policy, horizons: list[torch.Tensor], *, fingerprint: Fingerprint,
               provenance: str, quantization_config: dict | None = None) -> Plan:
    """Assemble the :class:`Plan` (without kernels) from per-layer horizons.

    Args:
        spec: architecture; policy: resolved policy (``w_max`` and ``a_s`` set).
        horizons: per recurrent layer, float64 ``[n_units]`` retention horizons (tokens).
        quantization_config: the config's ``quantization_config`` (quantized weights cannot be
            permuted, so ``balance: hybrid`` is refused for them).
    Raises:
        DascInputError: ``tp_size`` incompatible with the heads (from the TP stage).
    """
    from dasc_compile.tp import build_tp_plan  # TP stage (App. B.1)

    w_max = policy.w_max
    n_l = spec.n_units_per_layer
    ub = unit_bytes(spec, policy)
    dense_l = dense_temporal_bytes_per_layer(spec, policy)
    conv_l = conv_bytes_per_layer(spec, policy)

    kept_sets: list[torch.Tensor] = []
    for layer_id, h in zip(spec.recurrent_layer_ids, horizons):
        kept = select_global(h, w_max)
        if policy.random_seed is not None:
            kept = random_count_matched(n_l, int(kept.numel()), policy.random_seed, layer_id)
        kept_sets.append(kept)
    offsets = ragged_offsets([int(k.numel()) for k in kept_sets])

    layers = []
    w_cap = 0
    for i, (layer_id, h, kept) in enumerate(zip(spec.recurrent_layer_ids, horizons, kept_sets)):
        local = torch.ones(n_l, dtype=torch.bool)
        local[kept] = False
        local_h = h[local]
        # Eq. 7: W_u is monotone in H_s, so the layer's max is at its longest local horizon
        w_layer = unit_refresh_window(float(local_h.max()), w_max) if local_h.numel() else 0
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
            kept_units=[int(u) for u in kept.tolist()],
            horizon_quantiles=HorizonQuantiles(**horizon_quantiles(h)),
            horizon_histogram=horizon_histogram(h, HORIZON_BIN_EDGES),
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
    P = policy.tp_size
    tp = build_tp_plan(
        spec, [lp.kept_units for lp in layers], policy,
        bytes_per_unit=ub,
        conv_bytes_per_layer_rank=conv_bytes_per_layer(spec, policy, P),
        dense_temporal_bytes_per_layer_rank=dense_l // P,
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
    )
    return Plan(
        dasc_version=__version__,
        model=model,
        fingerprint=fingerprint,
        policy=policy,
        selection="random" if policy.random_seed is not None else "horizon",
        horizon_bin_edges=list(HORIZON_BIN_EDGES),
        layers=layers,
        totals=totals,
        tp=tp,
        refresh=RefreshPlan(w_replay_cap=w_cap, any_local=totals.n_kept < totals.n_units),
    )


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
    if policy.w_max is None:
        raise DascInputError("w_max is not set: pass --wmax N or set 'w_max' in the policy file")
    src = open_checkpoint(model, config)
    spec = arch_from_config(src.config, str(src.config_path), policy.family)
    check_against_tensors(spec, src.tensor_files.keys(), str(src.root))
    policy = resolve_family_policy(spec, policy)
    tensors = read_decay_tensors(src, spec)
    fingerprint = Fingerprint(
        config_sha256=config_fingerprint(src.config),
        decay_sha256=decay_fingerprint(tensors),
        decay_tensors=[name for name, _ in tensors],
    )
    horizons = layer_horizons(spec, policy, tensors)
    plan = build_plan(spec, policy, horizons, fingerprint=fingerprint, provenance=src.provenance,
                      quantization_config=text_config(src.config).get("quantization_config")
                      or src.config.get("quantization_config"))
    files: dict[str, str] = {}
    if with_kernels:
        from dasc_compile.kernels import kernel_constants, kernel_module_entry, render_kernel_module

        constants = kernel_constants(plan)
        file_name, source = render_kernel_module(constants)
        files[file_name] = source
        plan = plan.model_copy(update={"kernels": kernel_module_entry(constants, file_name, source)})
    plan = with_content_hash(plan)
    out = Path(out_dir) if out_dir is not None else default_out_dir(model)
    return plan, write_plan_dir(plan, out, files)
