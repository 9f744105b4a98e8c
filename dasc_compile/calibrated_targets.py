"""What the paper publishes about each trained model's decays: the targets :mod:`dasc_compile.calibrated` solves for.

Data only. Each :class:`ModelTargets` row cites where its figures come from in the paper
(``seed/dasc-paper.txt``): median static one-step decay alpha_s = exp(g_s) (§3.3, Fig. 1),
layer-head retained-fraction structure at one cutoff (App. A.1, Figs. 6 and 8), and TP-balanced
state-checkpoint capacity C_ckpt (Eq. 6) at several W_max (§5.3, Fig. 4 a/e/i).

The paper gives no more than that, so the synthesis also needs *shape* assumptions, which are
marked as such here (``tail_anchors``: where the horizon distribution starts and ends; the spread
of A_log or dt_bias). They change how the decay tensors look, never a published figure.

Kimi-K3's config.json is not published: :data:`KIMI_K3_CONFIG` is built from what is known
(paper: 93 model blocks, 69 KDA layers x 96 heads x 128 key channels, safe gate with lower bound
-5, MXFP4 packed weights in App. B.1; MODELS.md) and fills the rest the way Kimi-Linear does
(every 4th block and the last one full attention, conv kernel 4). Each assumed field is listed in
``KIMI_K3_CONFIG["dasc_synthetic_config"]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CALIBRATED_NAMES", "KIMI_K3_CONFIG", "TARGETS", "TOLERANCE", "CapacityPoint", "HeadTargets",
           "ModelTargets", "horizon_of_alpha", "trained_decays_dir"]


def trained_decays_dir() -> Path:
    """``plans/reference/trained-decays/``: copies of the real trained decay values used here."""
    try:
        import dasc_plans
    except ImportError:  # pragma: no cover - a checkout without the install
        return Path(__file__).resolve().parents[1] / "plans" / "reference" / "trained-decays"
    return Path(dasc_plans.__file__).parent / "reference" / "trained-decays"


def horizon_of_alpha(alpha: float, eps: float = 1e-3) -> float:
    """H_s (tokens) of a unit whose static one-step decay is ``alpha`` = exp(g_s): ln(eps) / ln(alpha) (Eq. 3)."""
    return math.log(eps) / math.log(alpha)


@dataclass(frozen=True)
class CapacityPoint:
    """C_ckpt under TP-balanced placement (Eq. 6; §5.3) at one cutoff ``w_max`` (tokens)."""

    w_max: int
    c_ckpt: float


@dataclass(frozen=True)
class HeadTargets:
    """Layer-head structure at cutoff ``w_max`` (App. A.1): pair counts and the range of layer means.

    A pair (l, h) is mixed when 0 < r_{l,h} < 1, all omitted when r = 0, all retained when r = 1;
    a layer mean averages r_{l,h} over heads. ``layer_mean_median``: the middle layer's mean
    (Kimi-Linear Fig. 7 caption: 0.360), or None when not published.
    """

    w_max: int
    mixed: int
    all_omitted: int
    all_retained: int
    layer_mean_min: float
    layer_mean_max: float
    layer_mean_median: float | None = None


@dataclass(frozen=True)
class ModelTargets:
    """Everything the synthesis of one calibrated reference needs.

    Attributes:
        name: CLI / bundle name (``dasc reference NAME``; ``plans/reference/NAME/``).
        base: the reference config it uses (:data:`dasc_compile.refckpt_formats.REFERENCE_CONFIGS`
            key), or None for Kimi-K3 (:data:`KIMI_K3_CONFIG`).
        paper_model: the trained model the figures describe.
        median_alpha: median of alpha_s = exp(g_s) over all units of all recurrent layers, or None.
        capacity: published C_ckpt points, tested at ``tp_size`` with ``balance``.
        heads: published layer-head structure, or None.
        tail_anchors: assumed (H_s tokens, fraction of units with a longer horizon) points that close
            the horizon distribution below the smallest and above the largest published cutoff.
        bundled: the files ship in ``plans/reference/NAME/``; False: written on demand only.
        sources: where each figure comes from.
    """

    name: str
    base: str | None
    paper_model: str
    median_alpha: float | None
    capacity: tuple[CapacityPoint, ...]
    tp_size: int
    balance: str
    heads: HeadTargets | None
    tail_anchors: tuple[tuple[float, float], ...]
    bundled: bool
    sources: str


#: Tolerances the tests hold every calibrated reference to (tests/compile/test_calibrated.py).
TOLERANCE = {
    "capacity_rel": 0.03,        # |C_ckpt - target| / target
    "median_alpha_abs": 0.005,   # |median alpha_s - target|
    "pair_count_abs": 2,         # mixed / all omitted / all retained pairs
    "layer_mean_abs": 0.001,     # layer-mean retained fraction min / max / median
}

TARGETS: dict[str, ModelTargets] = {t.name: t for t in (
    ModelTargets(
        name="kimi-linear-48b-a3b-calibrated", base="kimi-linear-48b-a3b",
        paper_model="Kimi-Linear-48B-A3B-Instruct", median_alpha=0.471,
        capacity=(CapacityPoint(16, 2.64), CapacityPoint(64, 7.06), CapacityPoint(128, 14.72),
                  CapacityPoint(512, 28.24)),
        tp_size=8, balance="storage",
        heads=HeadTargets(w_max=16, mixed=389, all_omitted=215, all_retained=36, layer_mean_min=0.179,
                          layer_mean_max=0.558, layer_mean_median=0.360),
        tail_anchors=((1.25, 1.0), (2048.0, 0.0)), bundled=True,
        sources="median alpha 0.471: §3.3 / Fig. 1; 389 mixed (60.8 %), 215 all omitted, 36 all retained of 640 "
                "pairs at w16, layer means 0.179-0.558: App. A.1 Fig. 6; layer median 0.360: Fig. 7 caption; "
                "C_ckpt 2.64 / 7.06 / 14.72 / 28.24x at w16 / 64 / 128 / 512 (TP8, TP-balanced): §5.3, Fig. 4a"),
    ModelTargets(
        name="qwen3-next-80b-a3b-calibrated", base="qwen3-next-80b-a3b",
        paper_model="Qwen3-Next-80B-A3B-Instruct", median_alpha=0.969,
        capacity=(CapacityPoint(16, 1.10), CapacityPoint(64, 1.32), CapacityPoint(128, 1.60),
                  CapacityPoint(512, 2.49)),
        tp_size=8, balance="storage", heads=None,
        tail_anchors=((2.0, 1.0), (2048.0, 0.21), (16384.0, 0.0)), bundled=True,
        sources="median alpha 0.969: §3.3 / Fig. 1; C_ckpt 1.10 / 1.32 / 1.60 / 2.49x at w16 / 64 / 128 / 512 "
                "(TP8, TP-balanced): §5.3, Fig. 4e"),
    ModelTargets(
        name="kimi-k3-calibrated", base=None, paper_model="Kimi-K3", median_alpha=0.942,
        capacity=(CapacityPoint(64, 1.61), CapacityPoint(128, 2.01), CapacityPoint(512, 3.48)),
        tp_size=8, balance="storage",
        heads=HeadTargets(w_max=64, mixed=6512, all_omitted=108, all_retained=4, layer_mean_min=0.267,
                          layer_mean_max=0.741),
        tail_anchors=((4.0, 1.0), (16.0, 0.86), (2048.0, 0.08), (8192.0, 0.0)), bundled=False,
        sources="median alpha 0.942: §3.3 / Fig. 1; 6,512 mixed (98.3 %), 108 all omitted, 4 all retained of "
                "6,624 pairs at w64, layer means 0.267-0.741: App. A.1 Fig. 8; C_ckpt 1.61 / 2.01 / 3.48x at "
                "w64 / 128 / 512 (TP-balanced; compiled here at TP8 storage, as MXFP4 weights allow): §5.3, "
                "Fig. 4i, App. B.1"),
    ModelTargets(
        name="qwen3.5-27b-calibrated", base="qwen3.5-27b",
        paper_model="27B Qwen3.5-architecture GDN hybrid (trained A_log; not in the paper)", median_alpha=None,
        capacity=(), tp_size=8, balance="storage", heads=None, tail_anchors=(), bundled=True,
        sources="A_log: all 48 x 48 trained values, and dt_bias per-layer statistics (n, min, max, mean, std, "
                "median, n_neg), from /work/shared/data/trained-decays (copied to plans/reference/trained-decays/)"),
)}

CALIBRATED_NAMES = tuple(TARGETS)


def _k3_layers() -> tuple[list[int], list[int]]:
    full = list(range(4, 93, 4)) + [93]                       # 1-indexed, as Kimi-Linear: 23 + the last block
    return [i for i in range(1, 94) if i not in set(full)], full


KIMI_K3_CONFIG: dict = {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "num_hidden_layers": 93,
    "linear_attn_config": {
        "kda_layers": _k3_layers()[0], "full_attn_layers": _k3_layers()[1], "num_heads": 96, "head_dim": 128,
        "short_conv_kernel_size": 4, "gate_lower_bound": -5.0, "safe_gate": True},
    "quantization_config": {"quant_method": "mxfp4"},
    "dtype": "bfloat16",
    "dasc_synthetic_config": (
        "Kimi-K3's config.json is not published. Known (paper App. A.1, App. B.1; SGLang comments): 93 model "
        "blocks, 69 KDA layers, 96 heads x head_dim 128, safe gate with gate_lower_bound -5, MXFP4 packed "
        "weights. Assumed: model_type / architectures of Kimi-Linear, full attention at every 4th block "
        "and the last (Kimi-Linear's pattern, which gives exactly 69 KDA layers), short_conv_kernel_size 4, "
        "quantization_config reduced to its quant_method. No other tensors or fields are modelled."),
}
