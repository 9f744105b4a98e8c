"""Matched state memory for the serving arms (paper App. C.1, §5.3): the one place arms are sized.

``dasc size PLAN`` and the serving benchmarks (``benchmarks/serving_arms.py``) both call
:func:`size_arms`. All byte figures are per TP rank (one slot's, in :mod:`dasc_runtime.sizing_bytes`):

* ``b_dense``: one SGLang native Mamba slot, temporal ``[L, H/P, d_v, d_k]`` + conv windows
  (the plan's ``tp.bytes_dense_per_slot``; SGLang's ``mamba2_cache_params.mamba_cache_per_req``);
* ``b_int8``: one slot of SGLang's INT8 checkpoint pool (:func:`int8_bytes_per_slot`, after
  ``MambaCheckpointPool.estimate_mem_usage_bytes``);
* ``b_c``: one dasc compressed slot (the bottleneck rank's ``tp.bottleneck_bytes_per_slot``), and
  ``b_c8`` for the same kept units stored as INT8 (:func:`compressed_bytes_per_slot`).

Rules (SGLang 0.5.17, ``mem_cache/kv_cache_configurator.py``):

* **Running capacity.** SGLang caps running requests at ``floor(native slots / k)``, ``k`` from
  ``KVCacheConfigurator._calculate_mamba_ratio``: 3, plus 2 for ``extra_buffer`` with the overlap
  scheduler (1 without it, 1 for ``extra_buffer_lazy``), plus 0 for ``no_buffer``
  (:func:`slots_per_running_request`). Every arm runs the same ``R = --max-running-requests``, so
  the arms with a checkpoint pool keep ``M' = k * R`` native slots, the fewest that run R.
* **Equal memory.** Dense keeps ``M`` native slots, ``(M + 1) * b_dense`` bytes (SGLang allocates
  one padding slot, ``(max_mamba_cache_size + 1) * mamba_cache_per_req``); that is every arm's
  budget B. An arm with a pool of C slots of b bytes uses ``(M' + 1) b_dense + (C + 1) b`` (slot 0
  of every pool reserved) and C is the largest that fits (:func:`matched_memory`).
  A budget in bytes fixes ``M = floor(B / b_dense) - 1`` and then charges Dense's real allocation.
* **Checkpoint capacity** (``capacity``, no request running). Dense: M (shared with running
  requests). SGLang INT8: C only (with ``--enable-int8-mamba-checkpoint`` SGLang commits every cached
  state into that pool). dasc: ``M' + C`` (dense checkpoints stay in native slots and are demoted into
  the C compressed ones).
* **Capacity under load** (``capacity_under_load``, R requests running; :func:`capacity_under_load`):
  the ``k * R`` native slots are the running requests' reservation, so what survives is the pool plus
  any native slot beyond it: Dense ``max(0, M - k R)``, INT8 C, dasc C (``M' = k R``). This is what
  serving sees: in the H200 chat runs (``benchmarks/results/2026-12-01-h200-chat-six-arms/``, R = 8,
  M' = 40) every dasc hit came from the compressed pool, none from a dense checkpoint.

Example::

    dasc size kimi.dasc --dense-slots 512 --max-running-requests 32
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional, Sequence

from dasc_runtime.one_line_parser import OneLineParser
from dasc_compile.schema.units import byte_count, flag_bytes, smallest_budget
from dasc_compile.schema import DascInputError, load_plan, usable_slots
from dasc_runtime.serving_rules import DEFAULT_REFRESH_SLOTS, refresh_active
from dasc_runtime.size_options import settle_size_options
from dasc_runtime.sizing_bytes import pool_arm_bytes, compressed_bytes_per_slot, int8_bytes_per_slot
from dasc_runtime.sizing_fit import GIB, MAX_BUDGET_BYTES, MAX_SLOTS, check_pools_fit, smallest_fit

__all__ = ["STRATEGIES", "MatchedMemory", "matched_memory", "ArmSizing", "slots_per_running_request",
           "int8_bytes_per_slot", "compressed_bytes_per_slot", "dense_slots_for_budget", "capacity_under_load",
           "size_arms", "plan_matched_memory", "main", "GIB", "MAX_BUDGET_BYTES", "MAX_SLOTS"]

#: ``--mamba-radix-cache-strategy`` values dasc sizes for (SGLang's ``auto`` resolves to
#: ``extra_buffer`` for Kimi-Linear / Qwen3-Next with the overlap scheduler; name it explicitly).
STRATEGIES: tuple[str, ...] = ("extra_buffer", "extra_buffer_lazy", "no_buffer")
#: What "capacity" counts in each arm (printed under the ``dasc size`` table).
CAPACITY_LEGEND = ("capacity = cached states an arm can hold with no request running: dense its M native slots; "
                   "int8 its INT8 pool alone (SGLang commits every cached state there); dasc arms native + "
                   "compressed pool.\nunder load = what it keeps while R requests run: the M' = k*R native slots "
                   "are the running requests' reservation, so the surviving checkpoints are the pool's (dense: "
                   "M - k*R); the H200 chat runs measured this, every dasc hit from the compressed pool "
                   "(benchmarks/results/2026-12-01-h200-chat-six-arms/)")


def _check_count(flag: str, value, limit: int = MAX_SLOTS) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise DascInputError(f"{flag}: expected an integer >= 1 and <= {limit} (2**{limit.bit_length() - 1}), "
                             f"got {value!r}")


def slots_per_running_request(strategy: str, *, overlap_schedule: bool = True) -> int:
    """Native Mamba slots SGLang 0.5.17 reserves per running request, k (``_calculate_mamba_ratio``).

    ``k = 3 + {extra_buffer: 2 with the overlap scheduler, else 1; extra_buffer_lazy: 1;
    no_buffer: 0}``, with ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK`` unset and the radix cache on.
    SGLang then caps ``--max-running-requests`` at ``floor(--max-mamba-cache-size / k)``.

    Raises:
        DascInputError: an unknown strategy, or ``extra_buffer_lazy`` without the overlap scheduler
            (SGLang asserts the same).
    """
    if strategy not in STRATEGIES:
        hint = (" (SGLang's auto resolves per model; name what it picks: extra_buffer for Kimi-Linear and Qwen3-Next)"
                if strategy == "auto" else "")
        raise DascInputError(f"--mamba-radix-cache-strategy: expected one of {', '.join(STRATEGIES)}, got "
                             f"{strategy!r}{hint}")
    if strategy == "extra_buffer_lazy" and not overlap_schedule:
        raise DascInputError("--mamba-radix-cache-strategy extra_buffer_lazy needs the overlap scheduler "
                             "(drop --disable-overlap-schedule)")
    extra = {"extra_buffer": 2 if overlap_schedule else 1, "extra_buffer_lazy": 1, "no_buffer": 0}[strategy]
    return 3 + extra


@dataclass(frozen=True, kw_only=True)
class MatchedMemory:
    """Matched state-memory settings (App. C.1): Dense M native slots vs dasc M' native + C compressed.

    All byte figures are per TP rank. ``reserved`` rows (slot 0 of each pool) are charged.
    """

    dense_slots: int            # M: the Dense arm's --max-mamba-cache-size
    native_slots: int           # M': the dasc arm's --max-mamba-cache-size
    compressed_slots: int       # C: the dasc arm's --dasc-pool-slots
    bytes_dense_slot: int       # b_dense: one native slot (temporal + conv), bytes
    bytes_compressed_slot: int  # b_compressed: one compressed slot, bytes
    scratch_bytes: int          # staging / scratch charged to dasc, bytes
    budget_bytes: int           # (M + 1) * b_dense
    used_bytes: int             # (M' + 1) * b_dense + (C + 1) * b_compressed + scratch <= budget
    refresh_slots: int = 0      # B: a dasc-wr plan's --dasc-refresh-slots (charged in scratch_bytes), else 0

    def flags(self) -> str:
        """The launch flags of the dasc arm."""
        return (f"--max-mamba-cache-size {self.native_slots} --dasc-pool-slots {self.compressed_slots}"
                + (f" --dasc-refresh-slots {self.refresh_slots}" if self.refresh_slots else ""))


def matched_memory(*, dense_slots: int, native_slots: int, bytes_dense_slot: int, bytes_compressed_slot: int,
                   scratch_bytes: int = 0) -> MatchedMemory:
    """Largest C with ``(M'+1) b_dense + (C+1) b_compressed + scratch <= (M+1) b_dense`` (App. C.1).

    The paper's budget equation ``B_native^Dense + B_tmp^Dense = B_native^dasc + B_compressed + B_tmp``
    with SGLang's reserved slot 0 counted in both pools and the Dense arm's temporary memory taken
    as 0 (its copy-on-write needs none).

    Raises:
        DascInputError: ``native_slots > dense_slots`` or no compressed slot fits.
    """
    if native_slots > dense_slots or native_slots < 1:
        raise DascInputError(f"--native-slots {native_slots}: M' must be in [1, M={dense_slots}] (M: --dense-slots)")
    budget = (dense_slots + 1) * bytes_dense_slot
    left = budget - (native_slots + 1) * bytes_dense_slot - scratch_bytes
    c = usable_slots(max(left, 0), bytes_compressed_slot)
    if c < 1:
        raise DascInputError(
            f"no compressed slot fits: M={dense_slots}, M'={native_slots}, b_dense "
            f"{byte_count(bytes_dense_slot)}, b_compressed {byte_count(bytes_compressed_slot)}, scratch "
            f"{byte_count(scratch_bytes)}; raise --dense-slots or lower "
            f"--native-slots" + (" (or the scratch: --refresh-slots, --scratch-slots)" if scratch_bytes else ""))
    used = (native_slots + 1) * bytes_dense_slot + (c + 1) * bytes_compressed_slot + scratch_bytes
    return MatchedMemory(dense_slots=dense_slots, native_slots=native_slots, compressed_slots=int(c),
                         bytes_dense_slot=bytes_dense_slot, bytes_compressed_slot=bytes_compressed_slot,
                         scratch_bytes=scratch_bytes, budget_bytes=budget, used_bytes=used)


def dense_slots_for_budget(budget_bytes: int, bytes_dense_slot: int) -> int:
    """Dense native slots M a per-rank state budget holds: ``floor(B / b_dense) - 1`` (slot 0 is padding).

    Raises:
        DascInputError: the budget holds no usable slot.
    """
    m = usable_slots(budget_bytes, bytes_dense_slot)
    if m < 1:
        raise DascInputError(f"--budget {byte_count(budget_bytes)} holds no dense slot: a slot takes "
                             f"{byte_count(bytes_dense_slot)} on one TP rank, and one padding slot is reserved; "
                             f"expected at least {flag_bytes(smallest_budget(bytes_dense_slot))}")
    return m


def capacity_under_load(*, native_slots: int, pool_slots: int, running_reserve: int) -> int:
    """Cached states an arm keeps while R requests run, in slots: ``pool_slots + max(0, native_slots -
    running_reserve)`` (module docstring). ``running_reserve`` is ``k * R`` native slots; ``pool_slots`` the
    INT8 or dasc compressed pool's usable slots (0 for Dense).

    Raises:
        DascInputError: a negative or non-integer count.
    """
    for name, v in (("native_slots", native_slots), ("pool_slots", pool_slots), ("running_reserve", running_reserve)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise DascInputError(f"{name}: expected a whole number of slots >= 0, got {v!r}")
    return pool_slots + max(0, native_slots - running_reserve)


@dataclass(frozen=True)
class ArmSizing:
    """One arm at matched state memory (per TP rank; slots are SGLang pool slots, bytes are bytes).

    Attributes:
        arm: ``dense`` | ``int8`` | ``dasc-nr-w{W}`` | ``dasc-nr-w{W}-int8`` (``dasc-wr-...`` for a dasc-wr plan,
            whose B scratch slots are charged); kind: dense | int8 | dasc.
        native_slots: ``--max-mamba-cache-size``; ckpt_slots: INT8 or dasc pool slots (usable).
        capacity: checkpoint capacity in slots with no request running; capacity_under_load: the slots
            still holding cached states while R requests run (module docstring); max_running_requests: R.
        budget_bytes / used_bytes: state memory, used <= budget; bytes_native_slot / bytes_ckpt_slot.
        c_ckpt: ``b_dense / b_ckpt`` (1 for Dense). flags: the SGLang launch flags of this arm;
        ``{plan}`` stands for the arm's plan path where ``plan`` is None (no plan given for it).
        w_max / int8 / plan: the dasc plan's w_max, INT8 storage and path (None for Dense / INT8).
    """

    arm: str
    kind: str
    native_slots: int
    ckpt_slots: int
    capacity: int
    capacity_under_load: int
    max_running_requests: int
    budget_bytes: int
    used_bytes: int
    bytes_native_slot: int
    bytes_ckpt_slot: int
    c_ckpt: float
    flags: tuple[str, ...]
    w_max: Optional[int] = None
    int8: bool = False
    plan: Optional[str] = None


def size_arms(plan, *, max_running_requests: int, dense_slots: Optional[int] = None,
              budget_bytes: Optional[int] = None, strategy: str = "extra_buffer", overlap_schedule: bool = True,
              arms: Sequence[str] = ("dense", "int8", "dasc", "dasc-int8"), plan_path: Optional[str] = None,
              pair_plan_path: Optional[str] = None, scratch_slots: int = 0,
              refresh_slots: Optional[int] = None) -> list[ArmSizing]:
    """Size the arms at equal running capacity and equal state memory (module docstring).

    Args:
        plan: the dasc plan (a loaded Plan): its model gives b_dense / b_int8, its selection b_c.
        max_running_requests: R, the same for every arm (>= 1).
        dense_slots / budget_bytes: exactly one: Dense's M, or a per-rank budget that fixes M.
        strategy / overlap_schedule: SGLang's ``--mamba-radix-cache-strategy`` and whether the
            overlap scheduler runs (``--disable-overlap-schedule`` absent); they fix k.
        arms: which arms, any of ``dense``, ``int8``, ``dasc`` (the plan's kept units in the
            temporal dtype), ``dasc-int8`` (the same units INT8, App. E).
        plan_path / pair_plan_path: paths for ``--dasc-plan`` of the arm with the plan's own INT8
            setting / the other one (``{plan}`` in the flags where None).
        scratch_slots: staging charged to dasc, in compressed slots (0 with generated kernels).
        refresh_slots: a dasc-wr plan's scratch slots B (``--dasc-refresh-slots``; default
            ``serving_rules.DEFAULT_REFRESH_SLOTS``), capped as the server caps them under the printed or
            assumed prefill chunk (``serving_rules.served_refresh_slots``), charged as B native slots
            (``B * b_dense``); such an arm is labelled ``dasc-wr-w{W}`` and its flags name B.
    Returns:
        one :class:`ArmSizing` per arm, in the order asked.
    The options are checked as the server checks them
    (:func:`dasc_runtime.size_options.settle_size_options`): a storage-balanced plan at TP > 1 is sized
    and flagged without the overlap scheduler (``--disable-overlap-schedule``), since the runtime needs it.

    Raises:
        DascInputError: R or M outside [1, 2**31], a budget outside [1, 2**50] bytes, both or neither
            of M and budget, M < k * R (Dense could not run R; with a budget, the smallest that does),
            no pool slot fits (the smallest M or budget that does), an unknown arm or strategy, or a
            configuration the dasc runtime refuses (``extra_buffer_lazy``, ``balance: hybrid``, ...).
    """
    slots_per_running_request(strategy)           # an unknown strategy first, then what dasc serves
    settled = settle_size_options(plan, strategy=strategy, overlap_schedule=overlap_schedule,
                                  refresh_slots=refresh_slots)
    overlap_schedule = settled.overlap_schedule
    k = slots_per_running_request(strategy, overlap_schedule=overlap_schedule)
    r = max_running_requests
    _check_count("--max-running-requests", r)
    if (dense_slots is None) == (budget_bytes is None):
        raise DascInputError("give exactly one of --dense-slots M and --budget BYTES")
    if dense_slots is not None:
        _check_count("--dense-slots", dense_slots)
    else:
        _check_count("--budget", budget_bytes, MAX_BUDGET_BYTES)
    b_dense = int(plan.tp.bytes_dense_per_slot)
    m_native = k * r
    n_wr = settled.refresh_slots               # B as the server runs it under the printed flags (0: no refresh)
    pools = {name: pool_arm_bytes(plan, name, b_dense=b_dense, scratch_slots=scratch_slots, refresh_slots=n_wr)
             for name in arms if name != "dense"}
    by_budget = budget_bytes is not None
    if by_budget and budget_bytes // b_dense - 1 < 1:
        raise DascInputError(f"--budget {byte_count(budget_bytes)} holds no dense slot: a slot takes "
                             f"{byte_count(b_dense)} on one TP rank, and one padding slot is reserved; "
                             + smallest_fit(None, m_native, k, r, b_dense, pools.values(), by_budget=True))
    m = dense_slots if dense_slots is not None else dense_slots_for_budget(budget_bytes, b_dense)
    if isinstance(m, bool) or not isinstance(m, int) or m < m_native:
        runs = (f"SGLang runs at most floor(M / {k}) requests with {strategy}"
                f"{'' if overlap_schedule else ' without the overlap scheduler'}")
        need = smallest_fit(m, m_native, k, r, b_dense, pools.values(), by_budget=by_budget, given=budget_bytes)
        if by_budget:
            raise DascInputError(f"--budget {byte_count(budget_bytes)} holds Dense M={m} native slots of "
                                 f"{byte_count(b_dense)} on one TP rank (and one padding slot); {runs}, so "
                                 f"--max-running-requests {r} needs M >= {m_native} for Dense alone; {need}")
        raise DascInputError(f"--dense-slots {m}: {runs}, so --max-running-requests {r} needs M >= {m_native} "
                             f"for Dense alone; {need}")
    common = ("--max-running-requests", str(r), "--mamba-radix-cache-strategy", strategy) + \
        (() if overlap_schedule else ("--disable-overlap-schedule",)) + settled.extra_flags
    budget = (m + 1) * b_dense
    check_pools_fit(m, m_native, k, r, b_dense, pools.values(), by_budget=by_budget, given=budget_bytes)
    out: list[ArmSizing] = []
    for name in arms:
        if name == "dense":
            out.append(ArmSizing(arm="dense", kind="dense", native_slots=m, ckpt_slots=0, capacity=m,
                                 capacity_under_load=capacity_under_load(native_slots=m, pool_slots=0,
                                                                         running_reserve=m_native),
                                 max_running_requests=r, budget_bytes=budget, used_bytes=budget,
                                 bytes_native_slot=b_dense, bytes_ckpt_slot=0, c_ckpt=1.0,
                                 flags=common + ("--max-mamba-cache-size", str(m))))
            continue
        _, b, scratch = pools[name]
        mm = matched_memory(dense_slots=m, native_slots=m_native, bytes_dense_slot=b_dense, bytes_compressed_slot=b,
                            scratch_bytes=scratch)
        c = mm.compressed_slots
        loaded = capacity_under_load(native_slots=m_native, pool_slots=c, running_reserve=m_native)
        sized = dict(native_slots=m_native, ckpt_slots=c, capacity_under_load=loaded, max_running_requests=r,
                     budget_bytes=budget, used_bytes=mm.used_bytes, bytes_native_slot=b_dense, bytes_ckpt_slot=b,
                     c_ckpt=b_dense / b)
        if name == "int8":
            out.append(ArmSizing(arm="int8", kind="int8", capacity=c, int8=True, **sized,
                                 flags=common + ("--max-mamba-cache-size", str(m_native),
                                                 "--enable-int8-mamba-checkpoint", "--int8-mamba-ckpt-size", str(c))))
            continue
        i8 = name == "dasc-int8"
        path = plan_path if i8 == bool(plan.policy.int8) else pair_plan_path
        wr = refresh_active(plan)
        label = f"dasc-{'wr' if wr else 'nr'}-w{plan.policy.w_max}{'-int8' if i8 else ''}"
        out.append(ArmSizing(arm=label, kind="dasc", capacity=m_native + c, w_max=plan.policy.w_max, int8=i8,
                             plan=path, **sized,
                             flags=common + ("--max-mamba-cache-size", str(m_native), "--dasc-plan",
                                             path if path is not None else "{plan}", "--dasc-pool-slots", str(c))
                             + (("--dasc-refresh-slots", str(n_wr)) if wr else ())))
    return out


def plan_matched_memory(plan, *, dense_slots: int, native_slots: int, scratch_slots: int = 0,
                        refresh_slots: Optional[int] = None) -> MatchedMemory:
    """:func:`matched_memory` of the plan's own dasc arm (any M'), its pool and scratch as :func:`size_arms` charges
    them (:func:`pool_arm_bytes`): the bottleneck rank's compressed slot, and for a dasc-wr plan B = ``refresh_slots``
    (default :data:`DEFAULT_REFRESH_SLOTS`; capped as ``dasc size`` caps it) native scratch slots, named in
    :meth:`MatchedMemory.flags`.

    ``scratch_slots``: staging charged to dasc in compressed-slot units (the PyTorch store/load path
    stages up to one batch of hits; the generated kernels stage nothing).
    """
    from dataclasses import replace

    b_dense = int(plan.tp.bytes_dense_per_slot)
    n_wr = settle_size_options(plan, strategy="extra_buffer", overlap_schedule=True,
                               refresh_slots=refresh_slots).refresh_slots
    _, b_comp, scratch = pool_arm_bytes(plan, "dasc-int8" if plan.policy.int8 else "dasc", b_dense=b_dense,
                                   scratch_slots=scratch_slots, refresh_slots=n_wr)
    mm = matched_memory(dense_slots=dense_slots, native_slots=native_slots, bytes_dense_slot=b_dense,
                        bytes_compressed_slot=b_comp, scratch_bytes=scratch)
    return replace(mm, refresh_slots=n_wr)


def main(argv=None) -> int:
    """``python -m dasc_runtime.sizing --plan P --dense-slots M --native-slots M'``: the dasc arm's flags
    for a chosen M' (``dasc size`` sizes M' from --max-running-requests; both charge a dasc-wr plan's
    refresh scratch slots through :func:`plan_matched_memory`). Returns 0, or 2 with one ``error:`` line
    on stderr."""
    ap = OneLineParser(prog="python -m dasc_runtime.sizing", description=main.__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, help="plan directory or plan.json")
    ap.add_argument("--dense-slots", type=int, required=True, help="M: the Dense arm's --max-mamba-cache-size")
    ap.add_argument("--native-slots", type=int, required=True, help="M': native slots kept for the dasc arm")
    ap.add_argument("--scratch-slots", type=int, default=0, help="staging charged to dasc, in compressed slots")
    ap.add_argument("--refresh-slots", type=int, default=None,
                    help=f"dasc-wr: scratch slots B (--dasc-refresh-slots), each charged as a dense slot; default "
                         f"the runtime's {DEFAULT_REFRESH_SLOTS}, fewer where a prefill chunk caps them")
    a = ap.parse_args(argv)
    try:
        _check_count("--dense-slots", a.dense_slots)        # each flag named for its own value, before any sum
        _check_count("--native-slots", a.native_slots)
        if not 0 <= a.scratch_slots <= MAX_SLOTS:
            raise DascInputError(f"--scratch-slots: expected an integer >= 0 and <= {MAX_SLOTS}, got {a.scratch_slots}")
        plan = load_plan(a.plan)
        if a.refresh_slots is not None:     # this tool's flag is named, before what the plan or the server takes
            _check_count("--refresh-slots", a.refresh_slots)
        settled = settle_size_options(plan, strategy="extra_buffer", overlap_schedule=True,
                                      refresh_slots=a.refresh_slots)
        for note in settled.notes:         # before a refusal too: the cap note explains the scratch it names
            print(f"warning: {note}", file=sys.stderr)
        k = slots_per_running_request("extra_buffer", overlap_schedule=settled.overlap_schedule)
        for flag, n in (("--dense-slots", a.dense_slots), ("--native-slots", a.native_slots)):
            if n < k:                       # SGLang refuses a cache that runs no request ("too small to serve")
                raise DascInputError(f"{flag} {n}: SGLang reserves k = {k} native slots per running request "
                                     f"(extra_buffer{'' if settled.overlap_schedule else ' without overlap'}), so "
                                     f"fewer than {k} serves no request; give at least {k} (k R for R running)")
        mm = plan_matched_memory(plan, dense_slots=a.dense_slots, native_slots=a.native_slots,
                                 scratch_slots=a.scratch_slots, refresh_slots=a.refresh_slots)
    except DascInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    scratch = f", scratch={mm.scratch_bytes} B" if mm.scratch_bytes else ""
    print(f"per TP rank: b_dense={mm.bytes_dense_slot} B, b_compressed={mm.bytes_compressed_slot} B{scratch}, "
          f"budget={mm.budget_bytes} B, used={mm.used_bytes} B")
    common = (() if settled.overlap_schedule else ("--disable-overlap-schedule",)) + settled.extra_flags
    print(f"Dense arm: {' '.join(('--max-mamba-cache-size', str(mm.dense_slots)) + common)}")
    print(f"dasc arm:  {' '.join((mm.flags(), '--dasc-plan', a.plan) + common)}   (capacity "
          f"{mm.native_slots + mm.compressed_slots} with no request running vs Dense's {mm.dense_slots}; running "
          f"requests hold native slots: at M' = k R it keeps its {mm.compressed_slots} compressed ones)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
