"""Each planted bug of ``tests/support/runtime_mutations.py`` makes the randomized tier tests fail (issue 13 item 13).

The single-rank mutations run the ``two-tier-tight`` configuration of
``tests/runtime/test_tiers_random.py`` (its fixed seed, fewer operations) with the bug planted by
``monkeypatch``; the same run without it passes. ``agreement_ignored`` needs several ranks: it is
the 3-rank run of ``tests/runtime/test_tier_agreement_tp.py`` with the bug planted in every rank.
Each failure must be the invariant the bug breaks, not any error.
"""

from __future__ import annotations

import pytest
import torch

from tests.support import runtime_mutations
from tests.support.runtime_fixtures import SGLANG_SKIP_REASON

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")]

CONFIG = "two-tier-tight"
N_OPS = 1500
#: what each bug breaks, as the simulation reports it
EXPECTED = {
    # the freed native slot / the committed compressed row is read before the pack ran
    "reclaim_commit_before_pack": r"payload corrupted|restored state of node \d+ \(compressed\) is wrong",
    "maintain_commits_unfinished": r"payload corrupted|restored state of node \d+ \(compressed\) is wrong",
    # the pack read the dense slot before the schedule stream's write of it
    "side_stream_no_wait": r"payload corrupted|restored state of node \d+ \(compressed\) is wrong",
    # the matched source was demoted or evicted before the request locked it
    "no_staging_protection": r"copy-on-write source \d+ is no longer held by the tree",
}


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _run(tmp_path):
    from tests.runtime.test_tiers_random import run_config

    return run_config(tmp_path, CONFIG, N_OPS)


def test_mutations_are_the_listed_five():
    assert set(runtime_mutations.MUTATIONS) == set(EXPECTED) | {"agreement_ignored"}
    with pytest.raises(KeyError, match="unknown mutation"):
        runtime_mutations.apply("nothing")


def test_control_run_passes(tmp_path):
    sim = _run(tmp_path)
    assert sim.comp.counters.demotions_committed > 0 and sim.stats["pressure"] > 0


@pytest.mark.parametrize("mutation", sorted(EXPECTED))
def test_each_single_rank_mutation_fails_the_randomized_test(tmp_path, monkeypatch, mutation):
    runtime_mutations.apply(mutation, monkeypatch.setattr)
    with pytest.raises(AssertionError, match=EXPECTED[mutation]) as info:
        _run(tmp_path)
    # the failure names the seed and the step, and how to replay it
    assert "seed 102 failed at step" in str(info.value) and "DASC_RANDOM_SEED=102" in str(info.value)


def test_ignoring_the_cross_rank_agreement_fails_the_tp_test(tp_agreement_runs):
    assert all(status == "ok" for _, status, _ in tp_agreement_runs["agreement"])
    res = tp_agreement_runs["agreement_ignored"]
    assert all(status == "fail" for _, status, _ in res), res
    msgs = {detail for _, _, detail in res}
    assert len(msgs) == 1                      # every rank stopped at the same step, for the same reason
    assert "disagree with rank 0 on the cache" in msgs.pop()
