"""Head-coupled checkpoint tensors: which weights the compute-head permutation must reorder.

The ``hybrid`` balance mode (paper App. B.1, Fig. 9 (a); :mod:`dasc_compile.tp`) moves value heads
between TP ranks. Every checkpoint tensor with a per-head axis must then be reordered the same way
at model load so compute stays rank-local. This module holds, per architecture (Qwen3-Next,
Qwen3.5, Kimi-Linear), the table of those tensors: name, permuted axis and the head-major
segments of that axis, as :class:`~dasc_compile.schema.CoupledTensor` records for the plan.
:func:`coupled_tensors` is re-exported by :mod:`dasc_compile.tp`.
"""

from __future__ import annotations

from dasc_compile.archspec import ArchSpec
from dasc_compile.errors import DascInputError
from dasc_compile.schema import CoupledTensor

__all__ = ["coupled_tensors"]


def coupled_tensors(spec: ArchSpec, layer_index: int) -> list[CoupledTensor]:
    """Every checkpoint tensor of recurrent layer ``layer_index`` whose head axis the permutation moves.

    Layouts (checkpoint, TP = 1), read from SGLang 0.5.17 ``models/qwen3_next.py`` /
    ``models/qwen3_5.py`` / ``models/kimi_linear.py`` weight loading and transformers'
    ``Qwen3NextGatedDeltaNet`` / ``Qwen3_5GatedDeltaNet``:

    * Qwen3-Next (``qwen3_next``): ``in_proj_qkvz.weight [H_k*(2*d_k + 2*B*d_v), hidden]`` is fused
      *per key-head group* ``[q_g, k_g, v_g (B*d_v), z_g (B*d_v)]``; ``in_proj_ba.weight [2*H_v, hidden]``
      per group ``[b_g (B), a_g (B)]``: one segment each, one block per group.
    * Qwen3.5 (``qwen3_5``, ``qwen3_5_moe``): split tensors ``in_proj_qkv.weight [2*H_k*d_k + H_v*d_v,
      hidden]`` (three segments q | k | v), ``in_proj_z.weight [H_v*d_v, hidden]``,
      ``in_proj_b.weight`` / ``in_proj_a.weight [H_v, hidden]``.
    * both GDN: ``conv1d.weight [2*H_k*d_k + H_v*d_v, 1, K]`` (segments q | k | v), ``A_log [H_v]``,
      ``dt_bias [H_v]``, ``out_proj.weight [hidden, H_v*d_v]`` (input columns, axis 1). The gated norm
      ``norm.weight [d_v]`` is shared by all heads: not coupled.
    * Kimi-Linear (``kimi_linear``): ``{q,k,v}_proj.weight [H*d, hidden]``, ``b_proj.weight [H, hidden]``,
      ``f_b_proj.weight`` / ``g_b_proj.weight [H*d, d]``, ``{q,k,v}_conv1d.weight [H*d, 1, K]``,
      ``A_log [1, 1, H, 1]`` (axis 2), ``dt_bias [H*d]``, ``o_proj.weight [hidden, H*d]`` (axis 1).
      ``f_a_proj`` / ``g_a_proj`` (``[d, hidden]``) are replicated and ``o_norm.weight [d]`` is shared:
      not coupled.

    Raises:
        DascInputError: the model type has no known head-coupled layout (use balance='storage').
    """
    prefix = spec.a_log_names[layer_index][: -len("A_log")]
    hv, hk, dk, dv = spec.num_value_heads, spec.num_key_heads, spec.head_k_dim, spec.head_v_dim
    kd, vd = hk * dk, hv * dv

    def t(name: str, axis: int, segments: list[list[int]], note: str = "") -> CoupledTensor:
        return CoupledTensor(name=prefix + name, axis=axis, axis_size=segments[-1][0] + segments[-1][1],
                             segments=segments, note=note)

    if spec.model_type in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        b = hv // hk
        conv = t("conv1d.weight", 0, [[0, kd], [kd, kd], [2 * kd, vd]], "channels q | k | v, each head-major")
        common = [
            conv,
            t("A_log", 0, [[0, hv]]),
            t("dt_bias", 0, [[0, hv]]),
            t("out_proj.weight", 1, [[0, vd]], "input columns, value-head-major"),
        ]
        if spec.model_type == "qwen3_next":
            return [
                t("in_proj_qkvz.weight", 0, [[0, hk * (2 * dk + 2 * b * dv)]],
                  "fused per key-head group [q, k, v (B heads), z (B heads)]"),
                t("in_proj_ba.weight", 0, [[0, 2 * hv]], "fused per key-head group [b (B), a (B)]"),
            ] + common
        return [
            t("in_proj_qkv.weight", 0, [[0, kd], [kd, kd], [2 * kd, vd]], "rows q | k | v, each head-major"),
            t("in_proj_z.weight", 0, [[0, vd]]),
            t("in_proj_b.weight", 0, [[0, hv]]),
            t("in_proj_a.weight", 0, [[0, hv]]),
        ] + common
    if spec.model_type == "kimi_linear":
        hd = hv * dv
        out = [t(f"{n}_proj.weight", 0, [[0, hd]]) for n in ("q", "k", "v")]
        out.append(t("b_proj.weight", 0, [[0, hv]]))
        out += [t(f"{n}_b_proj.weight", 0, [[0, hd]]) for n in ("f", "g")]
        out += [t(f"{n}_conv1d.weight", 0, [[0, hd]]) for n in ("q", "k", "v")]
        out.append(t("A_log", 2, [[0, hv]]))
        out.append(t("dt_bias", 0, [[0, hv * spec.units_per_head]]))
        out.append(t("o_proj.weight", 1, [[0, hd]], "input columns, head-major"))
        return out
    raise DascInputError(
        f"model_type {spec.model_type!r}: policy balance='hybrid' does not know this architecture's "
        f"head-coupled tensors; use balance='storage'")
