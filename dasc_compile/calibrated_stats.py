"""Values fitted to published statistics (:func:`fit_sorted`), and the Qwen3.5-27B calibrated reference built on it.

:func:`fit_sorted` gives a sorted profile with a set min, max, median, mean, optional std and count
below a value; :mod:`dasc_compile.calibrated` uses it for the layer means of the KDA references, and
this module for Qwen3.5-27B: the real trained A_log plus a dt_bias drawn to match published per-layer
statistics.

Labelled "real A_log plus synthetic dt_bias" (:data:`dasc_compile.provenance.REAL_A_LOG_PREFIX`).
Sources (copies in ``plans/reference/trained-decays/``, each naming its repository and commit):
``qwen3x27b_gdn_A_log_full.json`` holds every A_log value of a 27B Qwen3.5-architecture GDN model
(48 GDN layers x 48 value heads, BF16 values, stored here as FP32 like the reference format);
``qwen3x27b_gdn_A_log_dt_bias_layer_stats.json`` holds, per layer, n / min / max / mean / std
(population) / median / n_neg of that model's dt_bias, but not its values.

Per GDN layer, dt_bias (BF16, ``[48]``) is drawn so that, computed as the source did (numpy float64
over the BF16 values), min and max are exact, the median is exact (the two middle values are BF16
neighbours whose mean is the published median, or both equal to it), and mean and std are matched
by :func:`fit_sorted` and then by one-ulp BF16 moves (what is left is
reported by :func:`layer_stats`; the tests hold it to 0.01 in mean and 1 % in std). The count of
negative values is not fitted and comes out near the published one. Which head gets which value is
a seeded shuffle: the source does not pair dt_bias with A_log.
"""

from __future__ import annotations

import json
import math

import numpy as np
import torch

from dasc_compile.arch import ArchSpec
from dasc_compile.calibrated_targets import trained_decays_dir
from dasc_compile.provenance import REAL_A_LOG_PREFIX

__all__ = ["A_LOG_FILE", "STATS_FILE", "bf16", "fit_sorted", "layer_stats", "load_sources", "synthesize_qwen3_5"]

A_LOG_FILE = "qwen3x27b_gdn_A_log_full.json"
STATS_FILE = "qwen3x27b_gdn_A_log_dt_bias_layer_stats.json"


def fit_sorted(n: int, lo: float, hi: float, mean: float, median: tuple[float, float] | None,
               rng: np.random.Generator, std: float | None = None,
               below: tuple[float, int] | None = None) -> np.ndarray:
    """Sorted float64 ``[n]`` with v[0] = lo, v[-1] = hi and mean ``mean``.

    ``median = (a, b)``: the middle value is a (odd n), or the two middle ones are a, b (even n).
    ``below = (c, z)``: exactly z values are < c (when c falls inside a free segment). Free values
    fill each segment [s, e] as s + (e - s) * t^p (sorted uniform t in (0.02, 0.98)), one power p
    for every segment below the median and q above it: p = q solved by bisection for the mean or,
    with ``std`` (population; needs ``median``), q for the mean and p for the std.
    """
    fixed = {0: lo, n - 1: hi}
    if median is not None:
        fixed.update({n // 2: median[0]} if n % 2 else {n // 2 - 1: median[0], n // 2: median[1]})
    idx = sorted(fixed)
    segs: list[tuple[float, float, int, int]] = []          # (start, end, count, group)
    for i0, i1 in zip(idx, idx[1:]):
        s, e, k, grp = fixed[i0], fixed[i1], i1 - i0 - 1, int(median is not None and i0 >= n // 2 - 1)
        if below is not None and s < below[0] < e:
            kb = min(max(below[1] - (i0 + 1), 0), k)
            segs += [(s, below[0], kb, grp), (below[0], e, k - kb, grp)]
        else:
            segs.append((s, e, k, grp))
    ts = [np.sort(rng.uniform(0.02, 0.98, k)) for _, _, k, _ in segs]
    base = np.asarray([fixed[i] for i in idx], dtype=np.float64)

    def build(p: float, q: float | None = None) -> np.ndarray:
        pw = (p, p if q is None else q)
        return np.sort(np.concatenate([base] + [s + (e - s) * t ** pw[g] for (s, e, _, g), t in zip(segs, ts)]))

    def solve(f, target: float, rising: bool) -> float:     # bisection on log p, f monotone in p
        lo_p, hi_p = -6.0, 6.0
        for _ in range(32):
            mid = (lo_p + hi_p) / 2
            lo_p, hi_p = (mid, hi_p) if (f(math.exp(mid)) < target) == rising else (lo_p, mid)
        return math.exp((lo_p + hi_p) / 2)

    if std is None:                                         # the mean falls as p grows
        return build(solve(lambda p: build(p).mean(), mean, rising=False))
    q_of = lambda p: solve(lambda q: build(p, q).mean(), mean, rising=False)   # noqa: E731
    p = solve(lambda p: build(p, q_of(p)).std(), std, rising=True)             # spread grows with p
    return build(p, q_of(p))


def bf16(x: np.ndarray | float) -> np.ndarray:
    """Round float64 values to the nearest BF16 (returned as float64, exactly representable)."""
    return torch.tensor(np.asarray(x, dtype=np.float64)).to(torch.bfloat16).to(torch.float64).numpy()


def _bf16_step(x: float, up: bool) -> float:
    """The BF16 neighbour of a non-zero BF16 value ``x``, one step up or down in value."""
    bits = int(np.array(x, dtype=np.float32).view(np.uint32)) >> 16
    bits += 1 if (up == (x > 0)) else -1
    return float(np.array(bits << 16, dtype=np.uint32).view(np.float32))


def _median_pair(median: float) -> tuple[float, float]:
    """The closest BF16 values a <= b with (a + b) / 2 == median (the published median of an even
    count of BF16 values is such a mean; a and b need not be neighbours across a binade edge)."""
    a = float(bf16(median))
    if a > median:
        a = _bf16_step(a, up=False) if a != 0 else -1e-38
    for _ in range(256):
        b = 2 * median - a
        if float(bf16(b)) == b:
            return a, b
        a = _bf16_step(a, up=False)
    raise AssertionError(f"no two BF16 values have mean {median!r}")


def layer_stats(v: np.ndarray) -> dict:
    """The source's statistics of one layer's values: n, min, max, mean, std (population), median, n_neg."""
    return {"n": int(v.size), "min": float(v.min()), "max": float(v.max()), "mean": float(v.mean()),
            "std": float(v.std()), "median": float(np.median(v)), "n_neg": int((v < 0).sum())}


def load_sources() -> tuple[list[int], np.ndarray, list[dict], dict]:
    """``(layer ids, A_log float64 [48, 48], dt_bias stats per layer, source records)`` from the copies."""
    root = trained_decays_dir()
    a_doc = json.loads((root / A_LOG_FILE).read_text())
    s_doc = json.loads((root / STATS_FILE).read_text())
    layers = list(a_doc["layers"])
    stats = {r["L"]: r for r in s_doc["stats"]["dt_bias"]}
    if sorted(stats) != sorted(layers):
        raise AssertionError(f"{STATS_FILE}: dt_bias statistics cover layers {sorted(stats)}, A_log {layers}")
    return layers, np.asarray(a_doc["values"], dtype=np.float64), [stats[i] for i in layers], \
        {"A_log": a_doc["source"], "dt_bias_stats": s_doc["source"]}


def draw_layer(st: dict, rng: np.random.Generator) -> np.ndarray:
    """dt_bias float64 ``[n]`` (BF16 values, unsorted) matching one layer's statistics ``st``."""
    n, lo, hi = st["n"], st["min"], st["max"]
    a, b = _median_pair(st["median"])
    v = bf16(fit_sorted(n, lo, hi, st["mean"], (a, b), rng, std=st["std"], below=(0.0, st["n_neg"])))
    v[0], v[-1], v[(n - 1) // 2], v[n // 2] = lo, hi, a, b
    movable = np.r_[1:(n - 1) // 2, n // 2 + 1:n - 1]         # lower half within [lo, a], upper within [b, hi]
    seg_lo = np.where(movable < n // 2, lo, b)
    seg_hi = np.where(movable < n // 2, a, hi)

    def err(mean: np.ndarray, std: np.ndarray) -> np.ndarray:
        return ((mean - st["mean"]) / 1e-3) ** 2 + ((std - st["std"]) / (1e-3 * st["std"])) ** 2

    for _ in range(400):                                      # greedy one-ulp moves, best first
        cur = v[movable]
        cand = np.concatenate([[_bf16_step(x, True) for x in cur], [_bf16_step(x, False) for x in cur]])
        src = np.concatenate([cur, cur])
        ok = (cand >= np.r_[seg_lo, seg_lo]) & (cand <= np.r_[seg_hi, seg_hi]) & (cand != 0) & \
            ((cand < 0) == (src < 0))
        s1 = v.sum() + cand - src
        s2 = (v * v).sum() + cand * cand - src * src
        e = np.where(ok, err(s1 / n, np.sqrt(np.maximum(s2 / n - (s1 / n) ** 2, 0.0))), np.inf)
        k = int(np.argmin(e))
        if not e[k] < err(np.array(v.mean()), np.array(v.std())):
            break
        v[movable[k % movable.size]] = cand[k]
    return v[rng.permutation(n)]


def synthesize_qwen3_5(spec: ArchSpec, seed: int = 0) -> tuple[list[tuple[str, torch.Tensor]], str]:
    """``(decay tensors, provenance note)`` for ``qwen3.5-27b-calibrated``: A_log FP32 ``[48]`` = the real
    values, dt_bias BF16 ``[48]`` drawn per layer (seeded ``numpy.random.default_rng(seed)``).

    Raises:
        AssertionError: the source's layers are not the config's GDN layers.
    """
    layers, a_log, stats, src = load_sources()
    if list(spec.recurrent_layer_ids) != layers or a_log.shape != (len(layers), spec.num_value_heads):
        raise AssertionError(f"trained A_log covers layers {layers} x {a_log.shape[1]} heads; the config has "
                             f"{list(spec.recurrent_layer_ids)} x {spec.num_value_heads}")
    rng = np.random.default_rng(seed)
    out: list[tuple[str, torch.Tensor]] = []
    for i, (a_name, d_name) in enumerate(zip(spec.a_log_names, spec.dt_bias_names)):
        out.append((a_name, torch.tensor(a_log[i], dtype=torch.float32).reshape(spec.a_log_shape)))
        out.append((d_name, torch.tensor(draw_layer(stats[i], rng)).to(torch.bfloat16).reshape(spec.dt_bias_shape)))
    a, s = src["A_log"], src["dt_bias_stats"]
    note = (f"{REAL_A_LOG_PREFIX}: A_log = the trained values of all 48 GDN layers x 48 heads of a 27B "
            f"Qwen3.5-architecture model ({a['repo']} {a['path']} at {a['commit']}); dt_bias synthetic "
            f"(dasc_compile.calibrated_stats, seed {seed}), drawn per layer to match that model's published "
            f"dt_bias statistics ({s['repo']} {s['path']}): not trained weights")
    return out, note
