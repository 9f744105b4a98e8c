"""DASC_RESTORE_CHECK (runtime/restore_check.py): the in-server restore check finds a wrong restore and
passes a right one, on SGLang 0.5.17's own MambaPool on CPU."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.support.runtime_fixtures import (GDN_HEADS, GDN_KEPT_W16, SGLANG_SKIP_REASON, compile_tiny, fill_random,
                                            gdn_cache_params, hybrid_pools, set_server_args)

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")]


def _make(tmp_path, monkeypatch, check="4", **policy):
    from dasc_runtime.pool import DascCheckpointPool
    from dasc_runtime.rank_layout import build_rank_layout

    monkeypatch.setenv("DASC_RESTORE_CHECK", check)
    set_server_args()
    plan, _, _ = compile_tiny(tmp_path, "gdn", **policy)
    cp = gdn_cache_params()
    pool, _ = hybrid_pools(cp, mamba_size=8)
    fill_random(pool.mamba_pool, seed=5)
    layout = build_rank_layout(plan, 0, 1, num_layers=len(cp.layers))
    dp = DascCheckpointPool(layout=layout, num_slots=6, conv_shapes=cp.shape.conv,
                            native_size=pool.mamba_pool.size, device="cpu")
    return pool.mamba_pool, dp


def _lines(caplog):
    return [r.getMessage() for r in caplog.records if "dasc restore check" in r.getMessage()]


def _diff(line: str) -> tuple[float, float]:
    t = float(line.split("temporal max|diff| ")[1].split(" ")[0])
    c = float(line.split("conv max|diff| ")[1])
    return t, c


def test_expected_restore_keeps_the_kept_heads_and_zeroes_the_rest(tmp_path, monkeypatch):
    from dasc_runtime.restore_check import expected_restore

    mp, dp = _make(tmp_path, monkeypatch)
    state = mp.mamba_cache.temporal[:, 3].clone()                              # [L, H, dv, dk]
    want = expected_restore(dp.layout, state)
    for l, kept in enumerate(GDN_KEPT_W16):
        for h in range(GDN_HEADS):
            if h in kept:
                assert torch.equal(want[l, h], state[l, h])
            else:
                assert torch.count_nonzero(want[l, h]) == 0


def test_a_right_restore_reports_zero_and_a_corrupted_row_does_not(tmp_path, monkeypatch, caplog):
    mp, dp = _make(tmp_path, monkeypatch)
    caplog.set_level(logging.INFO)
    ids = torch.cat([dp.alloc(1), dp.alloc(1)])
    dp.store_from_active(mp, torch.tensor([2, 5]), ids)
    rows = dp.slots_of(ids)
    dp.temporal[rows[1], 0] += 0.25                      # a wrong kept unit in the second checkpoint
    dp.load_compressed(mp, ids, torch.tensor([7, 1]))
    lines = _lines(caplog)
    assert len(lines) == 2 and f"compressed row {rows[0]} -> slot 7" in lines[0]
    assert _diff(lines[0]) == (0.0, 0.0)
    assert _diff(lines[1])[0] == pytest.approx(0.25) and _diff(lines[1])[1] == 0.0
    assert dp.restore_check.checked == 2 and dp.restore_check.worst == pytest.approx(0.25)


def test_only_the_first_n_stores_are_checked_and_a_freed_row_is_forgotten(tmp_path, monkeypatch, caplog):
    mp, dp = _make(tmp_path, monkeypatch, check="1")
    caplog.set_level(logging.INFO)
    a = dp.alloc(1)
    dp.store_from_active(mp, torch.tensor([2]), a)       # copied (budget 1 -> 0)
    dp.free(a)                                           # forgotten: the row will hold another state
    b = dp.alloc(1)
    assert dp.slots_of(b) == dp.slots_of(a)              # the same row again: a stale copy would be compared
    dp.store_from_active(mp, torch.tensor([4]), b)       # budget spent: not copied
    dp.load_compressed(mp, b, torch.tensor([6]))
    assert _lines(caplog) == []


def test_the_unsplit_path_is_checked_too(tmp_path, monkeypatch, caplog):
    mp, dp = _make(tmp_path, monkeypatch)
    caplog.set_level(logging.INFO)
    ids = torch.cat([dp.alloc(1), dp.alloc(1)])          # concatenated, no tier hint: split on the device
    dp.store_from_active(mp, torch.tensor([2, 5]), ids)
    dp.load_to_active(mp, torch.cat([ids, torch.tensor([3])]), torch.tensor([7, 1, 6]))   # 2 compressed + 1 dense
    assert dp.counters.hint_misses == 1
    lines = _lines(caplog)
    assert len(lines) == 2 and all(_diff(x) == (0.0, 0.0) for x in lines)


def test_int8_restores_match_the_reference_round_trip(tmp_path, monkeypatch, caplog):
    mp, dp = _make(tmp_path, monkeypatch, int8=True)
    caplog.set_level(logging.INFO)
    ids = dp.alloc(1)
    dp.store_from_active(mp, torch.tensor([3]), ids)
    dp.load_compressed(mp, ids, torch.tensor([6]))
    (line,) = _lines(caplog)
    assert _diff(line) == (0.0, 0.0)
    # and the restore is not the raw state (Eq. 8 rounding): the check compares against the round trip
    assert not torch.equal(mp.mamba_cache.temporal[:, 6], mp.mamba_cache.temporal[:, 3])


def test_off_by_default_and_a_value_that_is_no_count_is_refused(tmp_path, monkeypatch):
    from dasc_compile.schema import DascInputError

    for off in ("", "0"):
        _, dp = _make(tmp_path, monkeypatch, check=off)
        assert dp.restore_check is None
    with pytest.raises(DascInputError, match=r"DASC_RESTORE_CHECK='many': expected a count"):
        _make(tmp_path, monkeypatch, check="many")


def test_a_cache_flush_forgets_the_copies(tmp_path, monkeypatch, caplog):
    # SGLang's flush calls clear(); a row handed out again must not be compared with the state it held before
    mp, dp = _make(tmp_path, monkeypatch, check="1")
    caplog.set_level(logging.INFO)
    a = dp.alloc(1)
    dp.store_from_active(mp, torch.tensor([2]), a)
    dp.clear()
    b = dp.alloc(1)
    assert dp.slots_of(b) == dp.slots_of(a)
    dp.store_from_active(mp, torch.tensor([4]), b)       # budget spent: not copied
    dp.load_compressed(mp, b, torch.tensor([6]))
    assert _lines(caplog) == [] and dp.restore_check.saved == {}


def test_the_smoke_verdict_reads_the_line_the_check_logs(tmp_path, monkeypatch, caplog):
    from benchmarks.h200.mamba2_smoke_verdict import CHECK_RE

    mp, dp = _make(tmp_path, monkeypatch)
    caplog.set_level(logging.INFO)
    ids = dp.alloc(1)
    dp.store_from_active(mp, torch.tensor([3]), ids)
    dp.temporal[dp.slots_of(ids)[0], 0] += 0.5
    dp.load_compressed(mp, ids, torch.tensor([6]))
    (line,) = _lines(caplog)
    m = CHECK_RE.search(line)
    assert m and float(m.group(1)) == pytest.approx(0.5) and float(m.group(2)) == 0.0
