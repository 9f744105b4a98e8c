"""Storage-balanced plans and overlap scheduling (issue 13 item 9), on 2 gloo ranks.

A storage-balanced pack or restore is an all-to-all on the attention-TP group. dasc refuses such a
plan at TP > 1 under SGLang's overlap scheduler (its schedule stream and forward stream could order
the pool's and the model's collectives differently on different ranks) and serves it with
``--disable-overlap-schedule``, where the scheduler thread issues every cache transfer in the same
order on every rank. The test runs, on both ranks: the start-up check for the plan with and without
overlap scheduling, and the randomized tier simulation on the storage-balanced TP-2 plan with the
pool's real all-to-all (every insert, synchronous demotion and restore), the ranks comparing their
whole cache after every step and every restore checked against the rank's own dasc-nr image.
"""

from __future__ import annotations

import pytest

from tests.support.runtime_fixtures import SGLANG_SKIP_REASON

pytestmark = [pytest.mark.sglang, pytest.mark.slow,
              pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")]


@pytest.fixture(scope="module")
def storage_runs(tmp_path_factory):
    from tests.support.runtime_tp_sim import run_ranks

    cfg = dict(mamba_size=10, compressed_slots=4, watermark=3, balance="storage", streams=False)
    runs = [dict(name="storage", cfg=cfg, seed=301, n_ops=800, startup=True),
            dict(name="storage-compressed-only", cfg=dict(cfg, compressed_only=True, watermark=0), seed=302,
                 n_ops=400)]
    return run_ranks(2, tmp_path_factory.mktemp("tp-storage"), runs)


def test_storage_plan_refused_with_overlap_scheduling_on_every_rank(storage_runs):
    res = storage_runs["storage"]
    assert all(status == "ok" for _, status, _ in res), res
    lines = [d["startup"] for _, _, d in res]
    assert lines[0] == lines[1]
    assert lines[0]["no_overlap"] == "started"
    assert lines[0]["overlap"] == (
        "dasc: refusing to start: unsupported option(s): a storage-balanced plan at TP 2 with overlap scheduling "
        "(its all-to-all on the schedule stream could interleave with the forward's TP collectives differently on "
        "each rank; add --disable-overlap-schedule, or recompile with --balance off)")


def test_storage_plan_without_overlap_moves_units_identically_on_both_ranks(storage_runs):
    for name in ("storage", "storage-compressed-only"):
        res = storage_runs[name]
        assert all(status == "ok" for _, status, _ in res), res
        d0, d1 = (d for _, _, d in res)
        # a real storage map: the ranks keep different numbers of units, stored in equal-width slots
        assert d0["storage"] and (d0["n_kept"], d1["n_kept"]) == (5, 2) and d0["width"] == d1["width"] == 4
        assert d0["restore_compressed"] > 10 and d0["restore_compressed"] == d1["restore_compressed"]
        assert d0["started"] == 0                              # storage pools never demote on a side stream
    assert storage_runs["storage"][0][2]["sync"] > 20          # synchronous demotions, each an all-to-all
