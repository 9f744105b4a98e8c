"""What the dasc runtime serves: every refusal that follows from the server's options, dasc's
settings and the plan, decided by one function, :func:`serving_refusals`.

The launcher before weights load (:func:`dasc_runtime.startup_checks.check_launch`), the server's start-up checks
(:func:`dasc_runtime.verify.check_server_args`, ``verify.check_plan_supported``, ``wr_scratch.check_refresh_startup``)
and ``dasc size`` / ``dasc sweep`` (:func:`dasc_runtime.size_options.settle_size_options`, through :func:`dasc_runtime.sizing.size_arms`) all
call it, so a configuration the server would refuse is refused, or corrected with the flag it needs, before launch.

Each rule is a :class:`Rule` in :data:`RULES` with a name, a scope and the reason it exists:

* ``option``: a server option dasc does not serve (one line lists them all at start-up);
* ``plan``: a plan feature the runtime does not serve yet;
* ``refresh``: dasc-wr's scratch pass (``--dasc-refresh-slots``, the refresh window against the
  context length and the prefill chunk).

A rule may carry a *fix*: flags that make the server serve the plan (storage balancing at TP > 1
needs ``--disable-overlap-schedule``); ``dasc size`` applies fixes and says so, and refuses the rest.
The checks that need the served model itself (its weights, state shapes, SGLang's hooks) cannot be
decided before launch; :data:`STARTUP_ONLY` names them and why. ``python -m dasc_runtime.serving_rules``
prints both lists as the Markdown of ``docs/runtime-refusals.md``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Optional

__all__ = ["DEFAULT_REFRESH_SLOTS", "Refusal", "Rule", "RULES", "SMALLEST_AUTO_CHUNK", "STARTUP_ONLY", "SCOPES",
           "refresh_active", "served_refresh_slots", "serving_refusals", "markdown"]

#: Windows replayed by one dasc-wr scratch pass when ``--dasc-refresh-slots`` is not given.
DEFAULT_REFRESH_SLOTS = 8
SCOPES = ("option", "plan", "refresh")


def refresh_active(plan) -> bool:
    """True when ``plan`` asks for dasc-wr and omits units (a keep-all plan has W_replay = 0: nothing to run)."""
    return plan is not None and plan.policy.load_policy == "wr" and bool(plan.refresh.any_local) \
        and plan.refresh.w_replay_cap > 0


def served_refresh_slots(plan, refresh_slots: Optional[int], chunked_prefill_size: Optional[int]) -> int:
    """B, the windows one dasc-wr scratch pass replays as the server runs it (``wr_scratch.check_refresh_startup``),
    and so the native scratch slots ``dasc size`` charges (App. C.1): ``--dasc-refresh-slots`` (None:
    :data:`DEFAULT_REFRESH_SLOTS`), capped at ``chunked_prefill_size // w_replay_cap`` windows (at least 1) so one
    pass holds at most one prefill chunk (None or <= 0: no chunking, no cap); 0 for a plan that runs no refresh.

    Meaningful once :func:`serving_refusals` found nothing (B >= 1, w_replay_cap <= the chunk).
    """
    if not refresh_active(plan):
        return 0
    b = DEFAULT_REFRESH_SLOTS if refresh_slots is None else int(refresh_slots)
    if chunked_prefill_size is not None and chunked_prefill_size > 0:
        b = min(b, max(int(chunked_prefill_size) // int(plan.refresh.w_replay_cap), 1))
    return b


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """One reason the server refuses to start.

    Attributes:
        rule: the :class:`Rule` name; scope: its scope (:data:`SCOPES`).
        text: one clause naming the flag or plan field and what to do instead.
        fix: ``((flag, ServerArgs field, value), ...)``: options that make the server serve the plan,
            empty when only a change of plan or a dropped option helps.
    """

    rule: str
    scope: str
    text: str
    fix: tuple[tuple[str, str, Any], ...] = ()


@dataclass(frozen=True)
class _Ctx:
    """What a rule reads: SGLang's ``ServerArgs`` (any object with its attribute names; missing ones read
    as unset) through ``read`` (the release's resolved value at start-up, the attribute elsewhere), the
    plan or None, ``--dasc-refresh-slots`` and the served context length (None: unknown)."""

    sa: Any
    plan: Any
    refresh_slots: Optional[int]
    context_len: Optional[int]
    read: Callable[[Any, str, Any], Any] = getattr

    def g(self, name: str, default=None):
        return self.read(self.sa, name, default)

    def dp_attention(self) -> bool:
        """Data-parallel attention in either spelling: ``--enable-dp-attention`` (0.5.17; deprecated in
        0.5.23) or ``--attn-dp-size N > 1`` (0.5.23)."""
        return bool(self.g("enable_dp_attention", False)) or int(self.g("attn_dp_size", 1) or 1) > 1


@dataclass(frozen=True)
class Rule:
    """A refusal of the runtime: ``check(ctx)`` returns ``(clause, fix)`` when it applies, else None; ``fix``
    (text) names the flags that correct it, empty when only another plan or a dropped option helps."""

    name: str
    scope: str
    why: str
    fix: str
    check: Callable[[_Ctx], Optional[tuple[str, tuple]]] = field(repr=False)


RULES: list[Rule] = []


def _rule(name: str, scope: str, why: str, fix: str = ""):
    def deco(fn):
        RULES.append(Rule(name, scope, " ".join(why.split()), fix, fn))
        return fn
    return deco


def _when(cond: bool, text: str, fix: tuple = ()) -> Optional[tuple[str, tuple]]:
    return (text, fix) if cond else None


# ------------------------------------------------------------------ option: SGLang server options

def _option(name: str, attr: str, text: str, why: str, test=bool) -> None:
    """A rule refusing ``ServerArgs.<attr>`` when ``test(value)`` holds; ``text`` may use ``{v}``."""
    _rule(name, "option", why)(lambda c: _when(test(c.g(attr)), text.format(v=c.g(attr))))


_option("disable_radix_cache", "disable_radix_cache", "--disable-radix-cache (dasc compresses radix-cached state "
        "checkpoints)", "dasc's pool holds the radix cache's state checkpoints; without the cache there are none.")
_option("radix_cache_backend", "radix_cache_backend", "--radix-cache-backend={v} (dasc plugs into the built-in cache)",
        "dasc's two-tier component replaces the built-in cache's Mamba component; other backends have none.")
_option("hierarchical_cache", "enable_hierarchical_cache", "--enable-hierarchical-cache (host offload of compressed "
        "checkpoints is not supported)", "host offload would move compressed slots the host tier cannot read.")
_option("unified_memory", "enable_unified_memory", "--enable-unified-memory (the unified memory pool has no "
        "checkpoint pool slot)", "the unified pool has no `mamba_ckpt_pool` for dasc to fill.")
_option("page_major_layout", "enable_page_major_kv_layout", "--enable-page-major-kv-layout (page-major Mamba state "
        "layout is not supported)", "the page-major state layout has no `mamba_ckpt_pool` and another state shape.")
_option("int8_mamba_checkpoint", "enable_int8_mamba_checkpoint", "--enable-int8-mamba-checkpoint (compile the plan "
        "with int8: true instead)", "SGLang's INT8 pool and dasc's pool take the same slot; a plan compiled with "
        "--int8 stores its kept units as INT8 (App. E).")
_option("speculative_decoding", "speculative_algorithm", "--speculative-algorithm {v} (speculative states are not "
        "supported)", "draft states are not written through the checkpoint pool.")
_rule("replayssm", "option", "ReplaySSM (and its speculative variant) keeps ring-buffered states, not one slot per "
      "checkpoint.")(lambda c: _when(bool(c.g("enable_linear_replayssm") or c.g("enable_linear_replayssm_spec")),
                                     "--enable-linear-replayssm (ring-buffered states are not supported)"))
_option("session_radix_cache", "enable_session_radix_cache", "--enable-session-radix-cache (not supported)",
        "the session cache keeps states outside the radix tree dasc drives.")
_option("streaming_session", "enable_streaming_session", "--enable-streaming-session (not supported)",
        "streaming sessions hold states outside the radix tree dasc drives.")
_option("disaggregation", "disaggregation_mode", "--disaggregation-mode {v} (PD disaggregation is not supported)",
        "prefill/decode transfer sends SGLang's native state layout, not compressed slots.",
        test=lambda v: v not in (None, "null"))
_option("device", "device", "--device {v} (the dasc pool and its Triton kernels run on CUDA GPUs: leave --device "
        "unset or pass cuda)", "the compressed pool is allocated on the CUDA device and its pack / load kernels are "
        "Triton kernels built for CUDA GPUs; no other device backend is tested.",
        test=lambda v: v is not None and str(v).split(":")[0] != "cuda")
_option("pipeline_parallel", "pp_size", "--pp-size {v} (pipeline parallelism is not supported)",
        "the plan's layers and ranks are laid out for one pipeline stage.", test=lambda v: (v or 1) > 1)
_option("extra_buffer_lazy", "mamba_radix_cache_strategy", "--mamba-radix-cache-strategy extra_buffer_lazy (use "
        "extra_buffer, what SGLang's auto picks for these models, or no_buffer with --disable-overlap-schedule)",
        "its second ping-pong slot is allocated and freed on demand by SGLang's batch result processor "
        "(`mamba_lazy_*`), a path dasc's insertion (which donates / packs that slot) is not tested on.",
        test=lambda v: v == "extra_buffer_lazy")
_option("mixed_chunk", "enable_mixed_chunk", "--enable-mixed-chunk (drop it)",
        "a MIXED batch joins decode requests to the hit batch whose copy-on-write and dasc-wr refresh dasc "
        "plans; not tested.")
_rule("dp_attention", "option", "each DP rank schedules its own requests while the tier agreement and the decay "
      "fingerprint gather run on the attention-TP group; not tested.")(
    lambda c: _when(c.dp_attention(), "DP attention (--enable-dp-attention / --attn-dp-size > 1: not supported)"))
_option("memory_saver", "enable_memory_saver", "--enable-memory-saver (the dasc pool lies outside the memory it "
        "releases and restores)", "it releases and restores SGLang's tagged allocations; the dasc pool is "
        "allocated outside them, so a release would keep it and a resume would not restore what it held.")
_rule("external_state_store", "option", "external KV stores (LMCache, FlexKV) and SGLang 0.5.23's unified-cache "
      "linker copy a node's Mamba state out by its native slot id; a compressed checkpoint's id names a dasc pool "
      "row, so they would copy the wrong slot.")(
    lambda c: _when(bool(c.g("enable_lmcache") or c.g("enable_flexkv") or c.g("enable_unified_cache_external_linker")),
                    "--enable-lmcache / --enable-flexkv / --enable-unified-cache-external-linker (external stores "
                    "offload Mamba states by native slot id; a compressed checkpoint has none)"))


@_rule("storage_balance_overlap", "option", """a storage-balanced pack is an all-to-all on the attention-TP group
issued on the scheduler's current stream; under SGLang's overlap scheduler that is the schedule stream while the
previous batch's forward (and its TP collectives) may still run on the forward stream, so the two could interleave
differently on different ranks (a cross-rank deadlock). Without overlap scheduling cache work and forwards run on
one stream in one order on every rank.""", fix="--disable-overlap-schedule")
def _storage_overlap(c: _Ctx):
    p = c.plan
    return _when(p is not None and p.tp.balance == "storage" and p.tp.tp_size > 1
                 and not c.g("disable_overlap_schedule", False),
                 f"a storage-balanced plan at TP {p.tp.tp_size if p is not None else '?'} with overlap scheduling "
                 f"(its all-to-all on the schedule stream could interleave with the forward's TP collectives "
                 f"differently on each rank; add --disable-overlap-schedule, or recompile with --balance off)",
                 (("--disable-overlap-schedule", "disable_overlap_schedule", True),))


@_rule("tp_size", "option", "the plan lays out each rank's units for its attention-TP size (`verify.check_state` "
       "checks the served one); `dasc size` prints `--tp-size P`.", fix="--tp-size P (P = the plan's tp_size)")
def _tp_size(c: _Ctx):
    tp, cp, want = int(c.g("tp_size") or 1), int(c.g("attn_cp_size") or 1), c.plan.tp.tp_size if c.plan else 0
    cp_flag = f" with --attn-cp-size {cp}" if cp > 1 else ""
    return _when(c.plan is not None and c.g("tp_size") is not None and not c.dp_attention() and tp // cp != want,
                 f"--tp-size {tp}{cp_flag} (attention TP size {tp // cp}; the plan is compiled for TP {want}: launch "
                 f"with --tp-size {want * cp}, or compile the plan with --tp {tp // cp})",
                 (("--tp-size", "tp_size", want),))


@_rule("no_buffer_overlap", "option", """SGLang itself refuses `--mamba-radix-cache-strategy no_buffer` under its
overlap scheduler (an assertion in ServerArgs, 0.5.17 and 0.5.23): a server started with the flags `dasc size`
printed would end in a traceback before dasc is loaded.""", fix="--disable-overlap-schedule")
def _no_buffer_overlap(c: _Ctx):
    return _when(c.g("mamba_radix_cache_strategy") == "no_buffer" and not c.g("disable_overlap_schedule", False),
                 "--mamba-radix-cache-strategy no_buffer with overlap scheduling (SGLang refuses it; add "
                 "--disable-overlap-schedule)",
                 (("--disable-overlap-schedule", "disable_overlap_schedule", True),))


# ------------------------------------------------------------------ plan features

@_rule("balance_hybrid", "plan", """the compute-head permutation of `--balance hybrid` (App. B.1 (a)) must be applied
to the loaded weights; the runtime does not permute them yet.""")
def _hybrid(c: _Ctx):
    return _when(c.plan is not None and c.plan.tp.balance == "hybrid",
                 "the plan uses balance=hybrid (compute-head permutation of the loaded weights), which this runtime "
                 "does not apply yet; recompile with --balance storage or off")


# ------------------------------------------------------------------ dasc-wr scratch pass (wr_scratch.py)

@_rule("refresh_slots_without_wr", "refresh", """--dasc-refresh-slots reserves scratch rows and slots for dasc-wr;
a plan that runs no refresh would never use them.""")
def _slots_without_wr(c: _Ctx):
    p = c.plan
    return _when(p is not None and not refresh_active(p) and c.refresh_slots is not None,
                 f"--dasc-refresh-slots {c.refresh_slots} needs a plan with load_policy: wr that omits units (this "
                 f"plan is load_policy: {p.policy.load_policy if p else '?'}, w_replay_cap "
                 f"{p.refresh.w_replay_cap if p else '?'})")


@_rule("refresh_slots_zero", "refresh", "a refresh pass needs at least one scratch row and slot.")
def _zero_slots(c: _Ctx):
    return _when(refresh_active(c.plan) and c.refresh_slots is not None and c.refresh_slots < 1,
                 f"--dasc-refresh-slots {c.refresh_slots}: dasc-wr needs at least one scratch slot for its refresh "
                 f"pass (or recompile the plan with load_policy: nr)")


@_rule("refresh_window_over_context", "refresh", """the replayed window (Eq. 7) must fit the served context; checked
when the served context length is known (at start-up, from the model).""")
def _over_context(c: _Ctx):
    w = int(c.plan.refresh.w_replay_cap) if refresh_active(c.plan) else 0
    return _when(w > 0 and c.context_len is not None and w >= c.context_len,
                 f"the plan's refresh window w_replay_cap={w} tokens exceeds the served context length "
                 f"({c.context_len} tokens); recompile with a smaller --wmax or raise --context-length")


@_rule("refresh_window_over_chunk", "refresh", """one scratch pass replays whole windows inside one prefill chunk;
a window longer than --chunked-prefill-size cannot run.""", fix="--chunked-prefill-size W (W = the plan's w_replay_cap)")
def _over_chunk(c: _Ctx):
    w = int(c.plan.refresh.w_replay_cap) if refresh_active(c.plan) else 0
    chunk = c.g("chunked_prefill_size")
    return _when(w > 0 and chunk is not None and chunk > 0 and w > chunk,
                 f"the plan's refresh window w_replay_cap={w} tokens exceeds --chunked-prefill-size {chunk}: one "
                 f"scratch pass could not fit SGLang's prefill budget",
                 (("--chunked-prefill-size", "chunked_prefill_size", w),))


@_rule("refresh_dp_attention", "refresh", "a refresh pass on one DP rank would stall the other ranks' collectives.")
def _wr_dp(c: _Ctx):
    return _when(refresh_active(c.plan) and c.dp_attention(),
                 "DP attention (--enable-dp-attention / --attn-dp-size > 1) with a dasc-wr plan: a refresh pass on "
                 "one DP rank would stall the other ranks' collectives; use a load_policy: nr plan")


#: Start-up refusals that need the served model, its weights or SGLang's objects, so neither
#: ``dasc size`` nor ``dasc sweep`` can decide them: ``module.function -> what it compares``.
STARTUP_ONLY: dict[str, str] = {
    "sglang_api.check_version": "the installed SGLang release against the tested ones (docs/sglang-versions.md)",
    "verify.check_model_type": "the served model_type / architectures against the plan's",
    "verify.check_state": "SGLang's state shapes, dtypes, TP size and recurrent layer ids against the plan's",
    "verify.check_fingerprint": "the decay tensors of the loaded weights against the plan's fingerprint "
                                "(--dasc-dummy-decay-ok only with --load-format dummy and SGLang's weight cache "
                                "off: the launcher refuses it already, on the options as given)",
    "startup_checks.check_gpu_visible": "the launching machine has a CUDA GPU (a machine property, not an option: "
                                        "dasc size, which prints flags for another machine, does not check it)",
    "startup_checks.check_hooks": "every SGLang hook dasc registered is in place",
    "startup_checks.check_component": "the radix cache SGLang built drives the state with dasc's component",
    "plugin.after_init_mamba_pool": "the arguments SGLang passes its state pool (page-major layout, ReplaySSM, "
                                    "speculative draft tokens), the pool-level form of the option rules",
    "plugin.around_create_unified_radix_cache": "the request pool SGLang built has a dasc pool",
    "pool_install.install_pool": "the pool's bytes per slot on this rank against the plan's",
    "wr_scratch.budget_after_scratch": "--dasc-pool-bytes leaves room for dasc-wr's scratch slots (dasc size "
                                       "charges them and prints --dasc-pool-slots instead)",
}


def serving_refusals(server_args, plan=None, *, refresh_slots: Optional[int] = None,
                     context_len: Optional[int] = None, scopes=SCOPES,
                     read_option: Optional[Callable[[Any, str, Any], Any]] = None) -> list[Refusal]:
    """Every :data:`RULES` refusal that applies, in rule order (the one decision shared by the server and
    ``dasc size`` / ``dasc sweep``).

    Args:
        server_args: SGLang's ``ServerArgs`` or any object with its attribute names (unset ones read
            as None / off); None for none at all.
        plan: the loaded :class:`~dasc_compile.schema.Plan`, or None (plan rules then never apply).
        refresh_slots: ``--dasc-refresh-slots`` B (None: not given, the runtime's default applies).
        context_len: the served context length in tokens, or None when not known (before launch).
        scopes: which scopes to check (:data:`SCOPES`).
        read_option: ``(server_args, name, default) -> value``; the start-up check passes the release
            adapter's ``server_option`` (0.5.23 resolves options beside the raw input); default: the attribute.
    Returns:
        the refusals; empty when the server would start as far as these rules see.
    """
    ctx = _Ctx(server_args if server_args is not None else SimpleNamespace(), plan, refresh_slots, context_len,
               read_option or getattr)
    out = []
    for r in RULES:
        if r.scope in scopes:
            hit = r.check(ctx)
            if hit is not None:
                out.append(Refusal(rule=r.name, scope=r.scope, text=hit[0], fix=tuple(hit[1])))
    return out


#: The smallest ``--chunked-prefill-size`` SGLang 0.5.17 picks by itself (by GPU memory, 2048-16384 tokens):
#: what ``dasc size`` assumes when it prints no chunk size of its own.
SMALLEST_AUTO_CHUNK = 2048


def markdown() -> str:
    """``docs/runtime-refusals.md``: every rule and every start-up-only check, with its reason."""
    lines = ["# What the dasc runtime refuses", "",
             "Generated by `python -m dasc_runtime.serving_rules` from `runtime/serving_rules.py`; "
             "`tests/runtime/test_serving_rules.py` checks this file is current.", "",
             "A server launched with a plan refuses to start, with one line naming what differs, when any rule below "
             "applies: the launcher checks the options as given before weights load (`startup_checks.check_launch`; "
             "all but the context length's rule), the scheduler as SGLang resolved them. `dasc size` and `dasc sweep` "
             "call the same function (`serving_rules.serving_refusals`) on the configuration they print: a rule with a "
             "fix is corrected (the flag is added and a `warning:` line says why), any other is refused.", "",
             "## Decided before launch (`dasc size` agrees)", "", "| rule | scope | fix | why |", "|---|---|---|---|"]
    for r in RULES:
        lines.append(f"| `{r.name}` | {r.scope} | {f'`{r.fix}`' if r.fix else '-'} | {r.why} |")
    lines += ["", "## Decided at start-up only (they need the served model)", "", "| check | compares |", "|---|---|"]
    lines += [f"| `{k}` | {v} |" for k, v in STARTUP_ONLY.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
