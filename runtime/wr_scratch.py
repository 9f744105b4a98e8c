"""dasc-wr's scratch budget: the scratch request rows and Mamba slots, their memory and start-up checks.

dasc-wr (paper §4.2, App. B.2, Eq. 7) refreshes the local (omitted) units of a compressed hit by
re-running the last ``W_replay = min(n_p, w_replay_cap)`` tokens of the cached prefix from a zero
state (:mod:`dasc_runtime.wr_refresh`). That pass runs through SGLang's own model forward, so its
state must live where SGLang's linear-attention backends read and write it: a request row of
``req_to_token`` (KV locations) that maps, through ``req_index_to_mamba_index_mapping``, to a slot
of the native ``MambaPool``. :func:`around_req_pool_init` (AROUND
``HybridReqToTokenPool.__init__``) builds the pool with ``B`` more rows and ``B`` more Mamba slots
than SGLang asked for and hides them from SGLang's allocators, so

* SGLang's capacity is unchanged (``size`` rows, ``M = --max-mamba-cache-size`` schedulable slots,
  ``clear()`` never hands them out);
* the scratch slots are physical native slots ``M+1 .. M+B`` (contiguous, so a pass reads them as
  one ``temporal[:, M+1 : M+1+n]`` view), and the compressed id space starts after them;
* memory: ``B`` native slots (``B * b_dense`` bytes of state, charged to dasc in
  :mod:`dasc_runtime.sizing` and against ``--dasc-pool-bytes``) plus ``B`` rows of ``req_to_token``
  (``B * max_context_len * 4`` bytes). The window's KV tokens are taken from SGLang's KV allocator
  for the pass and freed after it (never cached).

``B`` (``--dasc-refresh-slots``, default :data:`DEFAULT_REFRESH_SLOTS`) is the number of windows one
scratch pass replays; it is capped so a pass holds at most ``--chunked-prefill-size`` tokens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Optional

import torch

# the default B and what counts as a dasc-wr plan belong to the serving rules (dasc size charges the same)
from dasc_runtime.serving_rules import DEFAULT_REFRESH_SLOTS, refresh_active, served_refresh_slots

__all__ = ["DEFAULT_REFRESH_SLOTS", "RefreshCounters", "ScratchBudget", "refresh_active", "check_refresh_startup",
           "around_req_pool_init", "build_pool_with_scratch", "budget_after_scratch", "scratch_state_bytes",
           "window_tokens"]

logger = logging.getLogger("dasc")


@dataclass
class RefreshCounters:
    """dasc-wr counters (SGLang's batch log line): requests refreshed, tokens replayed, passes run,
    requests left at dasc-nr because SGLang's KV pool had no room for their window."""

    refreshed: int = 0
    tokens: int = 0
    passes: int = 0
    skipped: int = 0


@dataclass
class ScratchBudget:
    """The scratch rows and slots of this process (one TP rank), reserved at pool construction.

    Attributes:
        seqs: B, windows per scratch pass (= reserved rows = reserved slots).
        w_cap: the plan's ``refresh.w_replay_cap`` (tokens).
        page_size: SGLang's KV page size (a window starts on a page boundary, see :func:`window_tokens`).
        rows: ``req_to_token`` rows ``size+1 .. size+B`` (host ints).
        slots: native Mamba slots ``M+1 .. M+B`` (host ints, contiguous).
        device: the pool device; ``rows_t`` / ``slots_t``: the same as int64 tensors there.
        state_bytes: ``B * b_dense``, the scratch slots' state memory on this rank (bytes).
        counters: :class:`RefreshCounters`.
    """

    seqs: int
    w_cap: int
    page_size: int
    rows: tuple
    slots: tuple
    device: torch.device
    state_bytes: int = 0
    rows_t: torch.Tensor = None
    slots_t: torch.Tensor = None
    counters: RefreshCounters = field(default_factory=RefreshCounters)

    def __post_init__(self) -> None:
        self.rows_t = torch.tensor(self.rows, dtype=torch.int64, device=self.device)
        self.slots_t = torch.tensor(self.slots, dtype=torch.int64, device=self.device)

    def status(self) -> str:
        """The dasc-wr part of SGLang's batch log line."""
        c = self.counters
        return f"dasc refreshed: {c.refreshed} ({c.tokens} tok replayed, {c.passes} passes, {c.skipped} skipped)"


def window_tokens(n_p: int, w_cap: int, page_size: int = 1) -> int:
    """Tokens a compressed hit replays: ``W_replay = min(n_p, w_cap)`` (Eq. 7), rounded up to whole KV pages.

    The window ``[n_p - W, n_p)`` must start on a page boundary, or its scratch KV would share a
    page with the cached prefix; with ``page_size <= w_cap`` (both powers of two) and a page-aligned
    ``n_p`` (radix matches are) the rounding changes nothing. Returns 0 when ``w_cap`` is 0 or
    ``n_p`` is 0.
    """
    if w_cap <= 0 or n_p <= 0:
        return 0
    w = min(n_p, w_cap)
    if page_size > 1:
        w = min(n_p, -(-w // page_size) * page_size)
    return w


def check_refresh_startup(plan, *, refresh_slots: Optional[int], context_len: int,
                          chunked_prefill_size: Optional[int], server_args=None) -> int:
    """Start-up checks of dasc-wr; returns B, the windows one scratch pass replays.

    Args:
        plan: the loaded plan (``policy.load_policy``, ``refresh.w_replay_cap``).
        refresh_slots: ``--dasc-refresh-slots`` (None: :data:`DEFAULT_REFRESH_SLOTS`).
        context_len: the served context length in tokens (``HybridReqToTokenPool.max_context_len``).
        chunked_prefill_size: SGLang's ``--chunked-prefill-size`` (None or <= 0: off).
        server_args: SGLang's ``ServerArgs`` (DP attention is refused), optional.
    Returns:
        B >= 1 (0 for a plan that runs no refresh).
    Raises:
        DascRefusal: ``--dasc-refresh-slots`` with a plan that runs no refresh, a zero scratch
            budget, a window longer than the served context or than one chunked-prefill chunk,
            or DP attention (a scratch pass on one DP rank would stall the others' collectives).
    """
    from dasc_runtime.serving_rules import serving_refusals
    from dasc_runtime.verify import DascRefusal

    opts = SimpleNamespace(chunked_prefill_size=chunked_prefill_size,   # DP attention as the release spells it
                           enable_dp_attention=server_args is not None and _dp_attention(server_args))
    bad = serving_refusals(opts, plan, refresh_slots=refresh_slots, context_len=context_len, scopes=("refresh",))
    if bad:                                     # one at a time, in rule order
        raise DascRefusal(bad[0].text)
    if not refresh_active(plan):
        return 0
    asked = DEFAULT_REFRESH_SLOTS if refresh_slots is None else int(refresh_slots)
    b = served_refresh_slots(plan, refresh_slots, chunked_prefill_size)
    if b < asked:
        logger.info("dasc: --dasc-refresh-slots %d capped to %d (%d-token windows in a %d-token prefill chunk)",
                    asked, b, int(plan.refresh.w_replay_cap), chunked_prefill_size)
    return b


def scratch_state_bytes(plan, refresh_slots: int) -> int:
    """State memory of B scratch slots on one TP rank: ``B * b_dense`` bytes (native slots, App. C.1)."""
    return int(refresh_slots) * int(plan.tp.bytes_dense_per_slot)


def budget_after_scratch(budget_bytes: int, what: str = "--dasc-pool-bytes") -> int:
    """The part of a per-rank dasc state budget left for the compressed pool once dasc-wr's scratch
    slots are charged (``budget_bytes`` itself without a refresh budget).

    Raises:
        DascRefusal: the budget does not even hold the scratch slots.
    """
    from dasc_runtime.installed import INSTALLED
    from dasc_runtime.verify import DascRefusal

    budget = INSTALLED.refresh
    if budget is None:
        return int(budget_bytes)
    left = int(budget_bytes) - budget.state_bytes
    if left <= 0:
        raise DascRefusal(f"{what} {budget_bytes} bytes leaves no room for dasc-wr's {budget.seqs} scratch slots "
                          f"({budget.state_bytes} bytes); raise it or lower --dasc-refresh-slots")
    return left


def _server_option(server_args):
    """``name -> value in effect`` of SGLang's server options (the release's adapter), None without server args."""
    if server_args is None:
        return lambda name: None
    from dasc_runtime.sglang_api import api

    return lambda name: api().server_option(server_args, name)


def _dp_attention(server_args) -> bool:
    """DP attention configured in ``server_args`` (the release's adapter: ``dp_attention_on``)."""
    from dasc_runtime.sglang_api import api

    return api().dp_attention_on(server_args)


def build_pool_with_scratch(original, pool, kwargs: dict, plan, *, refresh_slots: Optional[int], server_args=None):
    """Run ``HybridReqToTokenPool.__init__`` (``original``) with dasc-wr's hidden scratch rows and slots.

    Builds the pool with ``size + B`` rows and ``mamba_size + B`` slots, then gives SGLang back its
    own sizes (:func:`dasc_runtime.side_channels.hide_scratch_rows`), so rows ``size+1 .. size+B``
    and slots ``M+1 .. M+B`` exist but SGLang never allocates them. ``INSTALLED.refresh`` is set
    before ``original`` runs, so the compressed pool installed inside it charges the scratch slots.

    Args:
        original: ``HybridReqToTokenPool.__init__``; pool: the instance; kwargs: its keyword arguments
            (SGLang passes them all by keyword). plan: the served plan. refresh_slots: ``--dasc-refresh-slots``.
        server_args: SGLang's ``ServerArgs`` (page size, chunked prefill size, DP attention).
    Returns:
        the :class:`ScratchBudget`, or None for a plan that runs no refresh (``original`` then runs as is).
    Raises:
        DascRefusal: see :func:`check_refresh_startup`.
    """
    from dasc_runtime.installed import INSTALLED
    from dasc_runtime.side_channels import hide_scratch_rows

    INSTALLED.refresh = None
    option = _server_option(server_args)
    b = check_refresh_startup(plan, refresh_slots=refresh_slots, context_len=int(kwargs.get("max_context_len", 0)),
                              chunked_prefill_size=option("chunked_prefill_size"), server_args=server_args)
    if b == 0:
        original(pool, **kwargs)
        return None
    size, mamba = int(kwargs["size"]), int(kwargs["mamba_size"])
    budget = ScratchBudget(seqs=b, w_cap=int(plan.refresh.w_replay_cap),
                           page_size=int(option("page_size") or 1),
                           rows=tuple(range(size + 1, size + 1 + b)), slots=tuple(range(mamba + 1, mamba + 1 + b)),
                           device=torch.device(kwargs["device"]), state_bytes=scratch_state_bytes(plan, b))
    INSTALLED.refresh = budget
    original(pool, **{**kwargs, "size": size + b, "mamba_size": mamba + b})
    hide_scratch_rows(pool, size, mamba)
    logger.info("dasc: dasc-wr scratch: %d windows per pass (w_replay_cap %d tokens); hidden request rows %d..%d, "
                "native slots %d..%d (%d bytes of state, %d bytes of req_to_token)", b, budget.w_cap, size + 1,
                size + b, mamba + 1, mamba + b, budget.state_bytes,
                b * pool.req_to_token.shape[1] * pool.req_to_token.element_size())
    return budget


def around_req_pool_init(original, pool, args: tuple, kwargs: dict, *, plan, settings, server_args=None):
    """``plugin.around_req_pool_init`` (AROUND ``HybridReqToTokenPool.__init__``, keyword-only in SGLang
    0.5.17): :func:`build_pool_with_scratch` for the served ``plan``; SGLang's own constructor without one.

    Raises:
        DascRefusal: see :func:`check_refresh_startup`.
    """
    from dasc_runtime.installed import INSTALLED

    if plan is None:
        INSTALLED.refresh = None
        return original(pool, *args, **kwargs)
    build_pool_with_scratch(original, pool, kwargs, plan, refresh_slots=settings.refresh_slots,
                            server_args=server_args)
    return None
