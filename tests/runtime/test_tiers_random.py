"""Randomized insert / match / evict / demote sequences against the installed SGLang's UnifiedRadixCache.

Every step is followed by :meth:`runtime_sim.Sim.check`: SGLang's own tree sanity check plus
dasc's invariants (no native or compressed slot leaked or owned twice, tier counts, locked nodes
never demoted or evicted, pending demotions pinned, stored payloads equal to the state of their
prefix) and, for steps that access no state, the survivors' LRU order unchanged (demotion is not
an access). Every restore is compared with the exact dense state (dense hit) or its dasc-nr image
(compressed hit) when it runs on the simulated device (``tests/support/runtime_streams.py``: stores, loads,
state writes and side-stream packs run later, packs in random order). ``DASC_RANDOM_OPS`` sets the
total number of operations (default 100000); every configuration has a fixed seed, printed, and a
failure names the seed and step with the command that replays it (``DASC_RANDOM_SEED`` overrides).
"""

from __future__ import annotations

import gc
import os

import pytest
import torch

from tests.support.runtime_fixtures import SGLANG_SKIP_REASON

pytestmark = [pytest.mark.sglang, pytest.mark.slow,
              pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")]

TOTAL_OPS = int(os.environ.get("DASC_RANDOM_OPS", "100000"))
#: ``DASC_RANDOM_SEED=N`` replaces every configuration's fixed seed (to reproduce or explore)
SEED_OVERRIDE = os.environ.get("DASC_RANDOM_SEED")

# (name, Sim kwargs, share of TOTAL_OPS, fixed seed)
CONFIGS = [
    ("two-tier", dict(mamba_size=10, compressed_slots=5, watermark=2), 0.20, 101),
    ("two-tier-tight", dict(mamba_size=7, compressed_slots=2, watermark=3, kv_size=160), 0.15, 102),
    ("compressed-only", dict(mamba_size=8, compressed_slots=6, compressed_only=True), 0.10, 103),
    ("two-tier-int8", dict(mamba_size=9, compressed_slots=4, watermark=1, int8=True), 0.10, 104),
    # SGLang's default strategy on GPUs: states tracked at chunk boundaries in ping-pong slots
    ("extra-buffer", dict(extra_buffer=True, mamba_size=14, compressed_slots=5, watermark=2), 0.15, 105),
    ("extra-buffer-compressed-only", dict(extra_buffer=True, mamba_size=12, compressed_slots=4,
                                          compressed_only=True), 0.10, 106),
    # --mamba-max-states-per-path 2: SGLang's own path cap evicts interior states of both tiers
    ("path-cap", dict(mamba_size=10, compressed_slots=4, watermark=2, max_states_per_path=2), 0.05, 110),
    # dasc-wr: every compressed hit is refreshed by a scratch pass on hidden rows / slots
    # (tests/support/runtime_wr_sim.py); KV tight enough that some windows find no room and stay dasc-nr
    ("wr", dict(wr=True, mamba_size=10, compressed_slots=5, watermark=2, kv_size=200), 0.10, 107),
    ("wr-int8-extra-buffer", dict(wr=True, int8=True, extra_buffer=True, mamba_size=14, compressed_slots=4,
                                  watermark=2), 0.05, 108),
    ("wr-storage-compressed-only", dict(wr=True, balance="storage", mamba_size=8, compressed_slots=5,
                                        compressed_only=True), 0.05, 109),
    # DASC_EVICT_SHADOWED_FIRST: shadowed checkpoints are evicted before the plain LRU; the descendant
    # counts are rechecked against the tree after every step (Sim._check_shadows)
    ("shadowed-first", dict(shadowed_first=True, mamba_size=10, compressed_slots=5, watermark=2), 0.10, 112),
    ("shadowed-first-tight", dict(shadowed_first=True, mamba_size=7, compressed_slots=2, watermark=3, kv_size=160),
     0.05, 113),
    ("shadowed-first-compressed-only", dict(shadowed_first=True, mamba_size=8, compressed_slots=6,
                                            compressed_only=True), 0.05, 114),
    ("shadowed-first-extra-buffer", dict(shadowed_first=True, extra_buffer=True, mamba_size=14, compressed_slots=5,
                                         watermark=2), 0.05, 115),
    ("shadowed-first-path-cap", dict(shadowed_first=True, mamba_size=10, compressed_slots=4, watermark=2,
                                     max_states_per_path=2), 0.05, 117),
]
BY_NAME = {c[0]: c for c in CONFIGS}


def run_config(tmp_path, name: str, n_ops: int, seed=None):
    """Build the simulation of configuration ``name`` and run ``n_ops`` seeded steps; returns the sim.

    The seed (the configuration's own, else ``DASC_RANDOM_SEED``, else ``seed``) is printed, and a
    failure names it with the step and the command that replays it.
    """
    from tests.support.runtime_sim import Sim, run_ops

    _, kwargs, _, fixed = BY_NAME[name]
    seed = int(SEED_OVERRIDE) if SEED_OVERRIDE is not None else (fixed if seed is None else seed)
    print(f"[random {name}] seed {seed}, {n_ops} ops")
    sim = Sim(tmp_path, seed=seed, check_content_every=25, **kwargs)
    if kwargs.get("shadowed_first"):
        _count_rule_choices(sim)
    run_ops(sim, n_ops, f"reproduce: DASC_RANDOM_SEED={seed} .venv/bin/python -m pytest -q "
                        f"'tests/runtime/test_tiers_random.py::test_random_ops_keep_invariants[{name}]'")
    return sim


def _count_rule_choices(sim) -> None:
    """Count in ``sim.stats`` the victims the shadowed-first rule chose (``victim_shadowed``) and those where
    it differs from the plain LRU's oldest eligible node (``victim_not_oldest``), and check each choice:
    a shadowed victim whenever an eligible shadowed node exists, never a locked, pending or staged one."""
    comp, victim = sim.comp, sim.comp._victim

    def counted(tier):
        x = victim(tier)
        oldest = comp._oldest(tier)
        if x is not None:
            assert comp.eligible(x) and (tier is None or comp.tier(x) == tier), f"victim {x.id} is not eligible"
            shadowed = comp._oldest(tier, where=comp.shadows.shadowed)
            assert x is (shadowed if shadowed is not None else oldest), f"victim {x.id} is not the rule's choice"
            sim.stats["victim_shadowed"] += comp.shadows.shadowed(x)
            sim.stats["victim_not_oldest"] += x is not oldest
        return x

    comp._victim = counted


@pytest.fixture(autouse=True)
def _wr_on_one_cpu_process(monkeypatch):
    """dasc-wr builds SGLang ForwardBatches: no MoE-EP parallel state exists in this process."""
    import sglang.srt.model_executor.forward_batch_info as fbi

    from dasc_runtime.installed import INSTALLED

    monkeypatch.setattr(fbi, "enable_num_token_non_padded", lambda: False)
    yield
    INSTALLED.reset()


@pytest.fixture(autouse=True)
def _fast_cpu():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)        # tiny tensors: thread hand-off costs more than the copy
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", [c[0] for c in CONFIGS])
def test_random_ops_keep_invariants(tmp_path, name):
    _, kwargs, share, _ = BY_NAME[name]
    n_ops = max(1, int(TOTAL_OPS * share))
    sim = run_config(tmp_path, name, n_ops)
    s, c = sim.stats, sim.comp.counters
    # the sequence must actually have exercised every path it claims to test
    assert s["finished"] > n_ops // 10 and s["unfinished"] > 0
    assert s["restore_compressed"] > 0 and c.evictions_compressed > 0 and c.inserts_compressed > 0
    if kwargs.get("wr"):
        assert s["wr_refreshed"] > 0 and s["wr_refreshed"] + s["wr_skipped"] == s["restore_compressed"]
        assert sim.wr.budget.counters.refreshed == s["wr_refreshed"] == sim.wr.runner.eager_runner.passes
    if kwargs.get("compressed_only"):
        assert c.inserts_dense == 0 and s["restore_dense"] == 0 and c.demotions_sync == 0
        assert sim.comp.book.counts()["dense"] == 0
    else:
        assert s["restore_dense"] > 0 and c.inserts_dense > 0
        assert c.demotions_committed > 0 and c.demotions_sync > 0 and c.evictions_dense > 0
    # batches of the plugin's hint path mixed both tiers; requests matched and not admitted, and
    # matched with a Mamba eviction before their lock, ran (hits still equal admitted restores)
    assert s["matched_not_admitted"] > 0 and s["pressure"] > 0
    if not kwargs.get("compressed_only") and kwargs["compressed_slots"] >= 4 and n_ops >= 2000:   # rare otherwise
        assert s["batch_mixed"] > 0 and sim.dpool.counters.mixed_batches >= s["batch_mixed"]
    assert sim.dpool.counters.hint_misses == 0
    if kwargs.get("shadowed_first"):      # the rule chose victims, and some differ from the plain LRU's
        assert s["victim_shadowed"] > 0 and s["victim_not_oldest"] > 0


def _eviction_policies() -> list[str]:
    """``--radix-eviction-policy`` choices of the installed SGLang (0.5.23 adds ``tlru``)."""
    if SGLANG_SKIP_REASON:
        return []
    from sglang.srt.server_args import RADIX_EVICTION_POLICY_CHOICES

    return list(RADIX_EVICTION_POLICY_CHOICES)


@pytest.mark.parametrize("policy", _eviction_policies())
def test_random_ops_under_each_eviction_policy(tmp_path, policy):
    """SGLang's eviction policy orders Full-KV leaf eviction, which cascades to the Mamba states of either tier;
    dasc's invariants hold under every policy the release offers (a short run of the tight two-tier mix)."""
    from tests.support.runtime_sim import Sim, run_ops

    seed = int(SEED_OVERRIDE) if SEED_OVERRIDE is not None else 111
    sim = Sim(tmp_path, seed=seed, check_content_every=25, mamba_size=10, compressed_slots=5, watermark=2, kv_size=160,
              eviction_policy=policy)
    assert sim.comp.tree_core.eviction_strategy.__class__.__name__.lower().startswith(policy)
    run_ops(sim, 600, f"reproduce: DASC_RANDOM_SEED={seed} .venv/bin/python -m pytest -q "
                      f"'tests/runtime/test_tiers_random.py::test_random_ops_under_each_eviction_policy[{policy}]'")
    c = sim.comp.counters
    assert sim.stats["finished"] > 100 and c.evictions_compressed > 0 and c.evictions_dense > 0
