"""``DASC_RESTORE_CHECK=N``: an end-to-end check of dasc-nr restores inside a running server (diagnostic).

The kernels are tested against the PyTorch reference on their own (``templates/``, ``dasc_runtime.ops``);
this checks the whole path a server takes between them: the slot SGLang asked to store, the compressed row
the pool gave it, the tier split of a hit, and the active slot it was restored into. The first ``N`` states
stored into the compressed pool are copied (host memory, the native slot's temporal state of every layer
and its conv states) when they are stored; when such a row is restored, the active slot it went to is
compared with what the PyTorch reference (:class:`~dasc_runtime.ops.TorchOps`: kept units exact, or through
Eq. 8's INT8 round trip; local units zero; conv copied) makes of the copy, and one INFO line says how far
apart they are:

    dasc restore check: compressed row 3 -> slot 17: temporal max|diff| 0 (kept 32 of 64 units), conv max|diff| 0

Exact restores give 0 on both (any plan without INT8; with INT8, 0 when the kernels round as the reference
does). A row freed (or flushed) before it is restored is forgotten. Each check reads the device (``.tolist()``, a copy to
the host): off by default, for smoke runs only (``benchmarks/h200/mamba2_smoke.sh`` sets it).
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import torch

from dasc_compile.schema import DascInputError
from dasc_runtime.ops import TorchOps
from dasc_runtime.rank_layout import RankLayout

__all__ = ["RestoreCheck", "expected_restore"]

logger = logging.getLogger(__name__)


def expected_restore(layout: RankLayout, temporal: torch.Tensor) -> torch.Tensor:
    """What a dasc-nr restore of one stored state must give, by the PyTorch reference.

    Args:
        layout: the pool's :class:`RankLayout`.
        temporal: the stored native state, ``[L, *state]`` (one slot of SGLang's ``temporal [L, M+1, ...]``).
    Returns:
        ``[L, *state]`` in ``temporal``'s dtype: kept units as stored (or dequantised after Eq. 8 when the
        layout is INT8), local units zero.
    """
    ops = TorchOps()
    slot = torch.zeros(1, dtype=torch.int64, device=temporal.device)
    units = ops.pack_units(layout, temporal.unsqueeze(1), slot)                  # [1, n_kept, *unit]
    if layout.int8:
        units = ops.dequantize(layout, *ops.quantize(layout, units))
    out = torch.zeros_like(temporal.unsqueeze(1))
    ops.unpack_units(layout, out, slot, units)
    return out[:, 0]


class RestoreCheck:
    """Copies of the first ``budget`` stored states, compared with their restores (module docstring)."""

    def __init__(self, budget: int) -> None:
        self.budget = int(budget)
        self.saved: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        self.checked = 0
        self.worst = 0.0

    @classmethod
    def from_env(cls) -> Optional["RestoreCheck"]:
        """From ``DASC_RESTORE_CHECK`` (a count of states; unset, empty or 0: None, no check).

        Raises:
            DascInputError: a value that is not a count (refused at start-up in one line, like the
                runtime's other environment choices).
        """
        raw = os.environ.get("DASC_RESTORE_CHECK", "").strip()
        if not raw.isdigit() and raw:
            raise DascInputError(f"DASC_RESTORE_CHECK={raw!r}: expected a count of restored states to check "
                                 f"(0 or unset: off)")
        if not raw or int(raw) == 0:
            return None
        logger.info("dasc: restore check on for the first %d stored states (DASC_RESTORE_CHECK; a diagnostic that "
                    "reads the device at each checked store and restore)", int(raw))
        return cls(int(raw))

    def on_store(self, cache, src_slots: torch.Tensor, rows: torch.Tensor) -> None:
        """After a store of native ``src_slots`` (int64 ``[N]``) into pool ``rows`` (int64 ``[N]``)."""
        if self.budget <= 0:
            return
        for s, r in zip(src_slots.tolist(), rows.tolist()):
            if self.budget <= 0:
                break
            self.saved[r] = (cache.temporal[:, s].detach().to("cpu", copy=True),
                             [c[:, s].detach().to("cpu", copy=True) for c in cache.conv])
            self.budget -= 1

    def on_free(self, rows) -> None:
        """Compressed ``rows`` (iterable of int) went back to the free list, one by one or all at once by a
        cache flush (``clear``): their copies no longer describe them."""
        for r in rows:
            self.saved.pop(r, None)

    def on_load(self, layout: RankLayout, cache, rows: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """After a dasc-nr load of pool ``rows`` into active ``dst_slots``: compare and log each checked row."""
        if not self.saved:
            return
        for r, d in zip(rows.tolist(), dst_slots.tolist()):
            ref = self.saved.pop(r, None)
            if ref is None:
                continue
            temporal, conv = ref
            want = expected_restore(layout, temporal)
            got = cache.temporal[:, d].detach().to("cpu")
            dt = (got.float() - want.float()).abs().max().item()
            dc = max([(c[:, d].detach().to("cpu").float() - w.float()).abs().max().item()
                      for c, w in zip(cache.conv, conv)] or [0.0])
            self.checked += 1
            self.worst = max(self.worst, dt, dc)
            logger.info("dasc restore check: compressed row %d -> slot %d: temporal max|diff| %g (kept %d of %d "
                        "units), conv max|diff| %g", r, d, dt, layout.n_kept,
                        layout.num_layers * layout.units_per_layer, dc)
