"""Hits are counted at admission, not at match time (issue 13 item 12).

SGLang matches the head of its waiting queue on every scheduling step and reverts the match when
``add_one_req`` rejects the request; only the batch it admits collects its copy-on-write
(``ScheduleBatch._collect_deferred_mamba_cow_and_clear``, where ``plugin.around_collect_cow``
counts). The simulation drives both through SGLang's own classes.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.runtime_fixtures import SGLANG_SKIP_REASON

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")]


def test_rematched_requests_count_one_hit_when_admitted(tmp_path):
    from tests.support.runtime_sim import Sim

    from dasc_runtime.installed import status_line

    torch.set_num_threads(1)
    sim = Sim(tmp_path, streams=False, compressed_slots=1, watermark=0)

    def pick(seq):
        sim.rng.choice = lambda xs, _s=seq: _s

    for seq in ([11, 12, 13], [21, 22]):                 # a compressed, then a dense (spill) checkpoint
        pick(seq)
        sim.admit(k=1)
        sim.rng.randrange = lambda k: k - 1
        sim.finish()
    child_c = sim.request_tokens([11, 12, 13]) + [90]
    child_d = sim.request_tokens([21, 22]) + [91]
    for _ in range(3):                                    # matched (copy-on-write staged), not admitted
        for seq in (child_c, child_d):
            pick(seq)
            sim.match_drop()
    assert sim.stats["matched_not_admitted"] == 6
    c = sim.comp.counters
    assert (c.hits_dense, c.hits_compressed) == (0, 0)
    assert "dasc hits d/c: 0/0" in status_line()
    pick(child_c)                                         # admitted, together with a dense hit
    sim.admit(k=1)
    pick(child_d)
    sim.admit(k=1)
    assert (c.hits_dense, c.hits_compressed) == (1, 1)
    assert "dasc hits d/c: 1/1" in status_line() and "dasc restored d/c: 1/1" in status_line()
    sim.check(0, content=True)


def test_one_batch_restores_both_tiers_through_the_plugin_hint(tmp_path):
    """A batch of a dense and a compressed hit: one ``load_to_active`` with the plugin's host hint
    (no hint miss), each restore checked against its exact / dasc-nr state."""
    from tests.support.runtime_sim import Sim

    torch.set_num_threads(1)
    sim = Sim(tmp_path, compressed_slots=1, watermark=0)           # simulated device: restores run later
    for seq in ([11, 12, 13], [21, 22]):
        sim.rng.choice = lambda xs, _s=seq: _s
        sim.admit(k=1)
        sim.rng.randrange = lambda k: k - 1
        sim.finish()
    picks = iter([sim.request_tokens([11, 12, 13]) + [90], sim.request_tokens([21, 22]) + [91]])
    sim.rng.choice = lambda xs: next(picks)
    sim.admit(k=2)
    pc = sim.dpool.counters
    assert (pc.mixed_batches, pc.hint_misses, pc.loads_dense, pc.loads_compressed) == (1, 0, 1, 1)
    assert sim.stats["batch_mixed"] == 1
    sim.check(1, content=True)                                     # runs the restores and their checks
