"""Calibrated reference checkpoints: decay values synthesised to match what the paper publishes about the trained models.

Labelled everywhere "synthetic, calibrated to published statistics; not trained weights"
(:data:`dasc_compile.provenance.CALIBRATED_PREFIX`, stored in the safetensors metadata key
``dasc_provenance``; ``dasc inspect`` shows it as ``provenance.kind = paper-calibrated``). Formats
(config, tensor names, shapes, dtypes) are the real ones of :mod:`dasc_compile.refckpt_formats`;
only the values are made up. Targets: :mod:`dasc_compile.calibrated_targets`.

The synthesis, deterministic for a seed (``numpy.random.default_rng(seed)``):

1. *Horizon pool.* Each published C_ckpt point (Eq. 6) fixes how many units must have H_s > W_max:
   the integer K whose TP-balanced C_ckpt (bottleneck rank stores ceil(K / P) units beside its conv
   state) is nearest the target. The median alpha_s fixes the count above H = ln(eps) / ln(alpha)
   (N / 2). Assumed tail anchors close the distribution. Between consecutive anchors the units are
   spread log-uniformly (one jittered value per slot, away from the anchors), so every count is exact.
2. *Structure.* KDA with published layer-head figures (App. A.1): layer means at the cutoff
   (sorted profile through min, median, max with the right mean, then shuffled over layers), per
   layer the number of all-omitted / all-retained heads (apportioned by (1 - m)^4 and m^4), and kept
   channels per mixed head (Beta draws split to the layer's count). The pool's values above the
   cutoff go to the kept channels, the rest to the omitted ones, longer horizons to channels of
   heads that keep more (score: logit of the head's fraction plus noise). GDN: score = layer
   offset plus head noise.
3. *Inversion of Eq. 2 / Eq. 3* at the family's default a_s: g = ln(eps) / H.
   KDA softplus: A_log per head (spread of Kimi-Linear's one published trained layer, larger for
   faster heads), dt_bias = softplus^-1(-g / exp(A_log)) - a_s (FP32). KDA safe gate:
   A_log ~ N(0, 0.3) (assumed), dt_bias = logit(g / l) / exp(A_log) - a_s (FP32). GDN: dt_bias per
   head BF16 ~ N(-3.5, 1.8) clipped to [-8, 2] (the stored dtype is too coarse to carry H), then
   A_log = ln(-g / softplus(a_s + dt_bias)) (FP32).
4. *Check:* the stored tensors are read back through :func:`dasc_compile.horizons.static_log_decay`
   (what the compiler uses) and every anchor count and the KDA mask at the structure cutoff must
   come out exactly; otherwise AssertionError.

Qwen3.5-27B is different: its A_log is the real trained one (48 x 48 values) and only dt_bias is
drawn, per layer, to match that checkpoint's published statistics (:mod:`dasc_compile.calibrated_stats`);
its label is "real A_log plus synthetic dt_bias".
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

from dasc_compile.arch import ArchSpec, arch_from_config
from dasc_compile.calibrated_stats import fit_sorted, synthesize_qwen3_5
from dasc_compile.calibrated_targets import (
    CALIBRATED_NAMES,
    KIMI_K3_CONFIG,
    TARGETS,
    ModelTargets,
    horizon_of_alpha,
    trained_decays_dir,
)
from dasc_compile.checkpoint import PROVENANCE_KEY
from dasc_compile.errors import MAX_SEED, DascInputError, error_line
from dasc_compile.families.base import FAMILIES
from dasc_compile.horizons import retention_horizon, static_log_decay
from dasc_compile.accounting import conv_bytes_per_layer, dense_temporal_bytes_per_layer, unit_bytes
from dasc_compile.policy import Policy
from dasc_compile.provenance import CALIBRATED_PREFIX
from dasc_compile.refckpt import write_json, write_sparse_shard
from dasc_compile.refckpt_formats import REFERENCE_CONFIGS

__all__ = ["CALIBRATED_NAMES", "calibrated_config", "kept_for_capacity", "provenance_note", "survival_anchors",
           "synthesize", "write_bundled_calibrated", "write_calibrated"]

EPS = 1e-3
LN_EPS = math.log(EPS)
_ST = {torch.float32: "F32", torch.bfloat16: "BF16"}


def calibrated_config(name: str) -> dict:
    """The config.json of a calibrated reference (a copy; Kimi-K3: :data:`KIMI_K3_CONFIG`).

    Raises:
        DascInputError: unknown name.
    """
    if name not in TARGETS:
        raise DascInputError(f"calibrated reference {name!r} is unknown; expected one of {list(CALIBRATED_NAMES)}")
    base = TARGETS[name].base
    return json.loads(json.dumps(KIMI_K3_CONFIG if base is None else REFERENCE_CONFIGS[base]))


def provenance_note(t: ModelTargets, seed: int) -> str:
    """The ``dasc_provenance`` value: the calibrated label, the model and the figures matched."""
    return (f"{CALIBRATED_PREFIX}: decay values synthesised (dasc_compile.calibrated, seed {seed}) to match the "
            f"published statistics of {t.paper_model} ({t.sources})")


# ----------------------------------------------------------------------------- 1. horizon pool


def kept_for_capacity(spec: ArchSpec, tp_size: int, c_target: float) -> int:
    """Kept units K (whole model) whose TP-balanced C_ckpt is nearest ``c_target`` (Eq. 6, App. B.1).

    Per rank: dense = L * (temporal / P + conv / P) bytes; compressed = ceil(K / P) * unit + L * conv / P.
    """
    pol = Policy(w_max=0)
    L, ub = len(spec.recurrent_layer_ids), unit_bytes(spec, pol)
    conv = L * conv_bytes_per_layer(spec, pol, tp_size)
    dense = L * dense_temporal_bytes_per_layer(spec, pol, tp_size) + conv
    n = L * spec.n_units_per_layer
    guess = tp_size * (dense / c_target - conv) / ub
    cands = {min(n, max(0, int(math.floor(guess)) + d)) for d in range(-tp_size, tp_size + 1)}
    return min(sorted(cands), key=lambda k: abs(dense / (math.ceil(k / tp_size) * ub + conv) - c_target))


def survival_anchors(t: ModelTargets, spec: ArchSpec) -> list[tuple[float, int]]:
    """``[(H tokens, units with H_s > H), ...]`` ascending in H, from the targets (step 1).

    Raises:
        AssertionError: the targets are not a valid survival function (counts must not grow with H).
    """
    n = len(spec.recurrent_layer_ids) * spec.n_units_per_layer
    pts = [(float(c.w_max), kept_for_capacity(spec, t.tp_size, c.c_ckpt)) for c in t.capacity]
    if t.median_alpha is not None:
        pts.append((horizon_of_alpha(t.median_alpha, EPS), n // 2))
    pts += [(h, int(round(f * n))) for h, f in t.tail_anchors]
    pts.sort()
    if pts[0][1] != n or pts[-1][1] != 0 or any(b[1] > a[1] for a, b in zip(pts, pts[1:])):
        raise AssertionError(f"{t.name}: anchors {pts} are not a survival function from {n} down to 0")
    return pts


def horizon_pool(anchors: list[tuple[float, int]], rng: np.random.Generator) -> np.ndarray:
    """Sorted float64 ``[N]`` horizons (tokens) with exactly ``count`` values above each anchor.

    Between anchors (h_a, c_a) and (h_b, c_b) the c_a - c_b values sit one per equal log-width
    slot, at a uniform position in the middle 60 % of the slot (never on an anchor).
    """
    parts = []
    for (ha, ca), (hb, cb) in zip(anchors, anchors[1:]):
        m = ca - cb
        pos = (np.arange(m) + rng.uniform(0.2, 0.8, m)) / max(m, 1)
        parts.append(np.exp(math.log(ha) + pos * (math.log(hb) - math.log(ha))))
    return np.concatenate(parts)


# ----------------------------------------------------------------------------- 2. structure


def apportion(total: int, weights: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Integers ``[n]`` summing to ``total``, each <= cap, proportional to ``weights`` (largest remainder).

    Raises:
        AssertionError: the caps leave no room for ``total``.
    """
    x = np.minimum(weights / weights.sum() * total, cap)
    out = np.floor(x).astype(np.int64)
    while out.sum() < total:
        room = np.where(out < cap, x - out + 1e-9 * weights, -np.inf)
        i = int(np.argmax(room))
        if not np.isfinite(room[i]):
            raise AssertionError(f"cannot apportion {total} under caps {cap.tolist()}")
        out[i] += 1
        x[i] = max(x[i], out[i])
    return out


def int_split(total: int, x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Integers ``[n]`` in [lo, hi] summing to ``total``, near ``x * total / sum(x)``.

    Raises:
        AssertionError: ``total`` is outside [lo * n, hi * n].
    """
    n = x.size
    if not lo * n <= total <= hi * n:
        raise AssertionError(f"cannot split {total} into {n} parts in [{lo}, {hi}]")
    want = x / x.sum() * total
    out = np.clip(np.round(want), lo, hi).astype(np.int64)
    while out.sum() != total:
        step = 1 if out.sum() < total else -1
        ok = (out < hi) if step > 0 else (out > lo)
        i = int(np.argmax(np.where(ok, step * (want - out), -np.inf)))
        out[i] += step
    return out


def kda_structure(t: ModelTargets, spec: ArchSpec, kept_total: int, rng: np.random.Generator) -> np.ndarray:
    """Kept channels per (layer, head) at ``t.heads.w_max``: int64 ``[L, H]`` in [0, d_k] (step 2).

    Exactly ``t.heads`` all-omitted / all-retained pairs, layer means from min to max, sum ``kept_total``.
    """
    ht, L, H, K = t.heads, len(spec.recurrent_layer_ids), spec.num_value_heads, spec.head_k_dim
    nl = H * K
    med = None if ht.layer_mean_median is None else (ht.layer_mean_median,) * 2
    means = fit_sorted(L, ht.layer_mean_min, ht.layer_mean_max, kept_total / (L * nl), med, rng)
    counts = np.round(means * nl).astype(np.int64)
    keep = {0, L - 1} | ({(L - 1) // 2, L // 2} if med else set())
    free = np.array([i not in keep for i in range(L)])
    counts[free] += int_split(kept_total - int(counts[~free].sum()), means[free] * nl, 1, nl - 1) - counts[free]
    counts = counts[rng.permutation(L)]
    m = counts / nl
    n_omit = apportion(ht.all_omitted, (1 - m) ** 4, np.full(L, H - 1))
    n_ret = apportion(ht.all_retained, m ** 4, H - 1 - n_omit)
    out = np.zeros((L, H), dtype=np.int64)
    for li in range(L):
        n_mix = H - n_omit[li] - n_ret[li]
        s_mix = int(counts[li]) - K * int(n_ret[li])
        mu = s_mix / (K * n_mix)
        draws = rng.beta(6 * mu, 6 * (1 - mu), n_mix) + 1e-3
        row = np.concatenate([np.zeros(n_omit[li], np.int64), np.full(n_ret[li], K, np.int64),
                              int_split(s_mix, draws, 1, K - 1)])
        out[li] = row[rng.permutation(H)]
    return out


def assign(pool: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Give the sorted ``pool`` to the slots in ascending ``score`` order: float64, ``score``'s shape."""
    out = np.empty(score.size)
    out[np.argsort(score.reshape(-1), kind="stable")] = np.sort(pool)
    return out.reshape(score.shape)


def synth_horizons(t: ModelTargets, spec: ArchSpec, rng: np.random.Generator) -> np.ndarray:
    """Horizons float64 ``[L, H, U]`` (U = units per head) meeting every target of ``t`` (steps 1-2)."""
    L, H, U = len(spec.recurrent_layer_ids), spec.num_value_heads, spec.units_per_head
    anchors = survival_anchors(t, spec)
    pool = horizon_pool(anchors, rng)
    if t.heads is None:
        score = rng.normal(0.0, 0.8, (L, 1, 1)) + rng.normal(0.0, 1.0, (L, H, U))
        return assign(pool, score)
    w = float(t.heads.w_max)
    kept_total = dict(anchors)[w]
    per_head = kda_structure(t, spec, kept_total, rng)
    mask = np.zeros((L, H, U), dtype=bool)
    for li in range(L):
        for h in range(H):
            mask[li, h, rng.permutation(U)[:per_head[li, h]]] = True
    frac = np.clip(per_head / U, 0.5 / U, 1 - 0.5 / U)
    score = np.log(frac / (1 - frac))[:, :, None] + rng.normal(0.0, 1.0, (L, H, U))
    out = np.empty((L, H, U))
    out[mask] = assign(pool[pool > w], score[mask])
    out[~mask] = assign(pool[pool <= w], score[~mask])
    return out


# ----------------------------------------------------------------------------- 3. inversion


def _kimi_a_log_spread() -> np.ndarray:
    doc = json.loads((trained_decays_dir() / "kimi_linear_48b_a3b_layer0_A_log.json").read_text())
    return np.asarray(doc["values"], dtype=np.float64)


def invert(spec: ArchSpec, horizons: np.ndarray, rng: np.random.Generator) -> list[tuple[str, torch.Tensor]]:
    """Decay tensors (stored dtypes and shapes) whose Eq. 2 / Eq. 3 horizons at the default a_s are
    ``horizons`` float64 ``[L, H, U]`` (step 3). Returns ``[(A_log name, A_log), (dt_bias name, dt_bias), ...]``."""
    fam = FAMILIES[spec.family]
    a_s, L, H = fam.default_a_s, horizons.shape[0], horizons.shape[1]
    neg_g = -LN_EPS / horizons                                  # -g_s > 0, [L, H, U]
    out: list[tuple[str, torch.Tensor]] = []
    spread = _kimi_a_log_spread() if spec.family == "kda" else None
    for li, (a_name, d_name) in enumerate(zip(spec.a_log_names, spec.dt_bias_names)):
        ng = neg_g[li]
        if spec.family == "gdn":
            d = torch.tensor(np.clip(rng.normal(-3.5, 1.8, H), -8.0, 2.0)).to(torch.bfloat16)
            sp = torch.nn.functional.softplus(a_s + d.to(torch.float64)).numpy()
            a = torch.tensor(np.log(ng[:, 0] / sp), dtype=torch.float32)
        else:
            if spread is not None:   # faster heads (larger mean -g) get the larger published A_log values
                base = np.sort(spread + rng.normal(0.0, 0.25, spread.size))
                a64 = np.empty(H)
                a64[np.argsort(np.log(ng).mean(axis=1))] = np.interp(np.linspace(0, 1, H),
                                                                     np.linspace(0, 1, base.size), base)
            else:
                a64 = rng.normal(0.0, 0.3, H)
            a = torch.tensor(a64, dtype=torch.float32)
            scale = np.exp(a.to(torch.float64).numpy())[:, None]
            if spec.family == "kda":
                y = ng / scale                                   # softplus(a_s + d) = y
                d64 = np.where(y > 20, y + np.log1p(-np.exp(-np.minimum(y, 700))), np.log(np.expm1(np.minimum(y, 20))))
            else:                                                # safe gate: sigmoid(e^A (a_s + d)) = -g / -l
                s = ng / -spec.safe_gate_lower_bound
                d64 = np.log(s / (1 - s)) / scale
            d = torch.tensor((d64 - a_s).reshape(-1), dtype=torch.float32)
        out.append((a_name, a.reshape(spec.a_log_shape)))
        out.append((d_name, d.reshape(spec.dt_bias_shape)))
    return out


def readback_horizons(spec: ArchSpec, tensors: list[tuple[str, torch.Tensor]]) -> np.ndarray:
    """Horizons float64 ``[L, H * U]`` of stored tensors, computed as the compiler does (Eq. 2, 3)."""
    fam = FAMILIES[spec.family]
    lb = spec.safe_gate_lower_bound if spec.safe_gate_lower_bound is not None else -5.0
    return np.stack([retention_horizon(static_log_decay(spec.family, a, d, fam.default_a_s, lb), EPS).numpy()
                     for (_, a), (_, d) in zip(tensors[0::2], tensors[1::2])])


def synthesize(name: str, seed: int = 0) -> tuple[dict, list[tuple[str, torch.Tensor]], str]:
    """``(config, decay tensors, provenance note)`` of a calibrated reference (steps 1-4).

    Raises:
        DascInputError: unknown name.
        AssertionError: the stored tensors miss a target count (step 4; a bug, not user input).
    """
    cfg = calibrated_config(name)
    t = TARGETS[name]
    spec = arch_from_config(cfg, f"calibrated config {name}")
    if t.base == "qwen3.5-27b":
        return (cfg, *synthesize_qwen3_5(spec, seed))
    rng = np.random.default_rng(seed)
    horizons = synth_horizons(t, spec, rng)
    tensors = invert(spec, horizons, rng)
    back = readback_horizons(spec, tensors)
    for h, count in survival_anchors(t, spec):
        if int((back > h).sum()) != count:
            raise AssertionError(f"{name}: {int((back > h).sum())} units with H_s > {h:g}, expected {count}")
    if t.heads is not None and not np.array_equal(back > t.heads.w_max, horizons.reshape(back.shape) > t.heads.w_max):
        raise AssertionError(f"{name}: the stored tensors change the layer-head mask at w{t.heads.w_max}")
    return cfg, tensors, provenance_note(t, seed)


def write_calibrated(name: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Write ``out_dir/config.json`` and ``out_dir/model.safetensors`` (decay tensors only, metadata
    ``dasc_provenance`` = the calibrated label). Byte-identical for the same name and seed. Sizes:
    Kimi-Linear 327 KiB, Qwen3-Next 14 KiB, Qwen3.5-27B 24 KiB, Kimi-K3 3.3 MiB (not bundled).

    Raises:
        DascInputError: unknown name.
    """
    cfg, tensors, note = synthesize(name, seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", cfg)
    params = [(n, tuple(x.shape), _ST[x.dtype]) for n, x in tensors]
    raw = {n: x.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for n, x in tensors}
    write_sparse_shard(out / "model.safetensors", params, raw, {"format": "pt", PROVENANCE_KEY: note})
    return out


def write_bundled_calibrated(root: str | Path, seed: int = 0) -> list[Path]:
    """Regenerate ``root/<name>/`` for every calibrated reference that is bundled (all but Kimi-K3)."""
    return [write_calibrated(n, Path(root) / n, seed) for n in CALIBRATED_NAMES if TARGETS[n].bundled]


def main(argv: list[str] | None = None) -> int:
    """``python -m dasc_compile.calibrated --model NAME|bundled --out DIR [--seed S]``."""
    from dasc_runtime.one_line_parser import OneLineParser, int_in, out_path   # here: benchmark scripts import this
                                                            # module from a bare checkout, where dasc_runtime is no package

    ap = OneLineParser(prog="python -m dasc_compile.calibrated", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help=f"one of {', '.join(CALIBRATED_NAMES)}, or 'bundled'")
    ap.add_argument("--out", required=True, type=out_path)
    ap.add_argument("--seed", type=int_in(0, MAX_SEED), default=0)
    args = ap.parse_args(argv)
    try:
        paths = (write_bundled_calibrated(args.out, args.seed) if args.model == "bundled"
                 else [write_calibrated(args.model, args.out, args.seed)])
    except DascInputError as exc:
        print(error_line(str(exc)), file=sys.stderr)
        return 2
    except OSError as exc:
        print(error_line(f"--out {args.out}: cannot write there ({exc.strerror or exc})"), file=sys.stderr)
        return 2
    for p in paths:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
