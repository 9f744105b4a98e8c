"""Horizon validation (paper §3.4, Eq. 4 and 5, Table 1(b)): do static horizons rank like observed ones?

For each prefix, the recurrent layers' kernels are wrapped to record the observed token-dependent
log-decay ``g`` (GDN ``[B, T, H_v]``, KDA ``[B, T, H, d_k]``, Mamba2 ``[B, T, H]`` from its
observer, :mod:`dasc_compile.eval.mamba2`) while the model runs the prefix. Then,
per layer and unit u:

* empirical horizon (Eq. 4): ``H_e(u) = ln(eps) / mean_t g_t(u)`` over the prefix tokens;
* state magnitude (Eq. 5) at the final prefix position: GDN ``||S_h||_F`` over the head's
  ``[d_k, d_v]`` state, KDA ``||S_{h,k}||_2`` over the column's d_v values;
* Spearman correlations across the layer's units of H_s with H_e and with M_S.

Units of different layers are never pooled. The report gives the median and IQR over all
(prefix, layer) pairs, as Table 1(b).
"""

from __future__ import annotations

import math

import torch

from dasc_compile.eval.hf_compat import kernel_slots, recurrent_state
from dasc_compile.eval.metrics import median_iqr, spearman


class DecayRecorder:
    """Context manager: wraps the recurrence kernels of ``em``'s mixers to collect the log-decay ``g``
    each layer passes them, per layer (float32, CPU).

    The kernels may be shared module globals (:func:`dasc_compile.eval.hf_compat.kernel_slots`), so a
    forward pre-hook on each mixer says which layer is calling.
    """

    def __init__(self, em):
        self.em = em
        self.g: dict[int, list[torch.Tensor]] = {}
        self._saved: list[tuple[object, str, object]] = []
        self._hooks: list = []
        self._layer: int | None = None

    def __enter__(self):
        slots = {}
        for lid, mixer in self.em.mixers.items():
            self._hooks.append(mixer.register_forward_pre_hook(lambda _m, _a, lid=lid: self._enter_layer(lid)))
            for owner, attr in kernel_slots(mixer):
                slots[(id(owner), attr)] = (owner, attr)
        for owner, attr in slots.values():
            orig = getattr(owner, attr)
            self._saved.append((owner, attr, orig))
            setattr(owner, attr, self._wrap(orig))
        return self

    def _enter_layer(self, lid: int) -> None:
        self._layer = lid

    def _wrap(self, fn):
        def wrapped(*args, **kwargs):
            g = kwargs["g"] if "g" in kwargs else args[3]
            self.g.setdefault(self._layer, []).append(g.detach().float().cpu())
            return fn(*args, **kwargs)
        return wrapped

    def __exit__(self, *exc):
        for owner, attr, orig in reversed(self._saved):
            setattr(owner, attr, orig)
        for h in self._hooks:
            h.remove()
        self._saved.clear()
        self._hooks.clear()
        return False

    def mean_log_decay(self, lid: int) -> torch.Tensor:
        """Mean over all recorded tokens of layer ``lid``'s g, flattened to ``[n_units]`` (unit id order)."""
        g = torch.cat([x.reshape(-1, *x.shape[2:]) for x in self.g[lid]], dim=0)   # [T, H] or [T, H, d_k]
        return g.mean(0).reshape(-1).to(torch.float64)


def empirical_horizon(mean_g: torch.Tensor, eps: float) -> torch.Tensor:
    """Eq. 4: ``ln(eps) / mean g``, +inf where the mean decay is not negative; float64 ``[n_units]``."""
    return torch.where(mean_g < 0, math.log(eps) / mean_g, torch.full_like(mean_g, math.inf))


def state_magnitude(state: torch.Tensor, units_per_head: int) -> torch.Tensor:
    """Eq. 5 from a key-major state ``[1, H, d_k, d_v]``: GDN Frobenius norm per head ``[H]``, KDA 2-norm
    per column (h, k) over d_v ``[H * d_k]``; float64."""
    s = state[0].detach().cpu().to(torch.float64)
    if units_per_head == 1:
        return s.flatten(1).norm(dim=1)
    return s.norm(dim=-1).reshape(-1)


def validate_prefix(em, prefix: list[int], static_h: list[torch.Tensor], eps: float) -> list[dict]:
    """Spearman rho(H_s, H_e) and rho(H_s, M_S) per recurrent layer for one prefix.

    Args:
        static_h: per recurrent layer (``em.layer_ids`` order), float64 ``[n_units]`` static horizons H_s.
    """
    cache = em.new_cache()
    with DecayRecorder(em) as rec:
        em.forward(prefix, cache)
    rows = []
    for lid, hs in zip(em.layer_ids, static_h):
        he = empirical_horizon(rec.mean_log_decay(lid), eps)
        ms = state_magnitude(recurrent_state(cache.layers[lid]), em.units_per_head)
        rows.append({"layer_id": lid, "rho_hs_he": spearman(hs, he), "rho_hs_ms": spearman(hs, ms)})
    return rows


def summarize(rows: list[dict]) -> dict:
    """Table 1(b): median and IQR over all (prefix, layer) pairs, plus per-layer medians."""
    per_layer: dict[int, list[dict]] = {}
    for r in rows:
        per_layer.setdefault(r["layer_id"], []).append(r)
    return {
        "hs_he": median_iqr([r["rho_hs_he"] for r in rows]),
        "hs_ms": median_iqr([r["rho_hs_ms"] for r in rows]),
        "n_pairs": len(rows),
        "per_layer": {str(lid): {"hs_he": median_iqr([r["rho_hs_he"] for r in rs])["median"],
                                 "hs_ms": median_iqr([r["rho_hs_ms"] for r in rs])["median"]}
                      for lid, rs in sorted(per_layer.items())},
    }
