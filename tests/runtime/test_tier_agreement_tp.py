"""Cross-rank agreement of demotion commits (paper App. B.2; issue 13 item 13): 3 gloo ranks.

Every rank runs the randomized tier simulation with the same host seed and its own device seed,
so each rank's side-stream packs complete at different times; after every step the ranks compare
their whole cache (tiers, values, pending demotions, free lists, counters). ``maintain`` commits
only demotions complete on every rank (``demotion.agree_all``), so the caches stay identical.
``tests/runtime/test_mutations.py`` shows the same run fails when the agreement is ignored.
"""

from __future__ import annotations

import pytest

from tests.support.runtime_fixtures import SGLANG_SKIP_REASON

pytestmark = [pytest.mark.sglang, pytest.mark.slow,
              pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")]


def test_tp_ranks_commit_the_same_demotions(tp_agreement_runs):
    res = tp_agreement_runs["agreement"]
    assert [r for r, *_ in res] == [0, 1, 2]
    assert all(status == "ok" for _, status, _ in res), res
    details = [d for _, _, d in res]
    # the run exercised what it claims: async demotions committed, compressed hits restored exactly
    assert details[0]["committed"] > 50 and details[0]["restore_compressed"] > 10
    # every rank ran its own device schedule, and the agreement held back commits that were complete
    # on one rank only (without it the ranks would have committed different demotions)
    assert len({d["device_ran"] for d in details}) > 1
    assert all(d["agreements"] > 0 for d in details) and sum(d["vetoed"] for d in details) > 0
    # identical counters on every rank (the per-step comparison already required the whole cache)
    keys = ("committed", "started", "sync", "restore_compressed", "restore_dense")
    assert len({tuple(d[k] for k in keys) for d in details}) == 1
