"""What dasc installed in this process (one SGLang scheduler process = one TP rank = one pool).

The plugin's hooks are free functions that SGLang calls with its own arguments; the objects they
share (the loaded plan, the pool, the two-tier component) are recorded here once, when the hooks
build them. Nothing here is recurrent state: ``INSTALLED`` is a registry of this process's dasc
objects, empty until a plan is served.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["INSTALLED", "Installed", "status_line"]


@dataclass
class Installed:
    """This process's dasc objects (all None / False until the plugin installs them)."""

    plan: Any = None                 # dasc_compile.schema.Plan once loaded
    plan_dir: Optional[str] = None
    settings: Any = None             # DascSettings
    verified_model: bool = False     # model type + decay fingerprint checked in this process
    fingerprint_match: Optional[dict] = None
    pool: Any = None                 # DascCheckpointPool
    component: Any = None            # DascMambaComponent
    refresh: Any = None              # wr_scratch.ScratchBudget (dasc-wr plans that omit units)
    compressed_off: Optional[str] = None  # why the compressed tier was turned off (weight_updates), or None

    def reset(self) -> None:
        """Forget everything (tests that install several plans in one process)."""
        self.__init__()


INSTALLED = Installed()


def status_line() -> str:
    """Counters for SGLang's prefill/decode log lines: hits and restores by tier, demotions,
    evictions, checkpoints per tier, free compressed slots, states not cached (``skipped``), restore
    batches (mixed dense + compressed, and hint misses: batches split on the device) and, under
    dasc-wr, refreshes and tokens replayed."""
    pool, comp = INSTALLED.pool, INSTALLED.component
    if pool is None:
        return ""
    pc = pool.counters
    parts = [f"dasc restored d/c: {pc.loads_dense}/{pc.loads_compressed}"]
    if comp is not None:
        c = comp.counters
        n = comp.book.counts()
        parts += [
            f"dasc hits d/c: {c.hits_dense}/{c.hits_compressed}",
            f"dasc ckpt d/c: {n['dense']}/{n['compressed']}",
            f"dasc free c: {pool.available_size()}/{pool.num_slots}",
            f"dasc demoted: {c.demotions_committed + c.demotions_sync} (pending {len(comp.pending)})",
            f"dasc evicted d/c: {c.evictions_dense}/{c.evictions_compressed}"
            + (f" (shadowed {c.evictions_shadowed})" if comp.shadows.on else ""),
            f"dasc inserted d/c: {c.inserts_dense}/{c.inserts_compressed}",
            f"dasc skipped: {c.skipped}",
            f"dasc reclaim waits: {c.reclaim_waits} ({c.reclaim_wait_host_s * 1e3:.0f} ms host)",
        ]
    else:
        parts.append(f"dasc free c: {pool.available_size()}/{pool.num_slots}")
    parts.append(f"dasc restore batches: {pc.batches} (mixed {pc.mixed_batches}, hint misses {pc.hint_misses})")
    if INSTALLED.compressed_off is not None:
        parts.append("dasc compressed tier: off (the updated weights no longer match the plan)")
    if INSTALLED.refresh is not None:
        parts.append(INSTALLED.refresh.status())
    return ", ".join(parts)
