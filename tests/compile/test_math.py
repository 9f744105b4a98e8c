"""Eq. 2, 3, 6, 7 and the layout figures against hand-computed cases."""

import math

import pytest
import torch

from dasc_compile.horizons import (
    horizon_histogram,
    horizon_quantiles,
    replay_window,
    retention_horizon,
    static_log_decay,
)
from dasc_compile.schema.cutoff import next_pow2, unit_refresh_window
from dasc_compile.accounting import compression_ratios, ragged_offsets
from dasc_compile.schema import usable_slots
from dasc_compile.selection import random_count_matched, select_global

LN_EPS = math.log(1e-3)  # -6.907755...


def test_gdn_softplus_gate_hand_values():
    # A_log = 0 -> exp = 1; a_s + dt_bias = 0 -> softplus = ln 2  => g = -ln 2, H = 6.9078/0.6931 = 9.9658
    # A_log = ln 0.1 -> 0.1 * ln 2 => H = 99.658
    a_log = torch.tensor([0.0, math.log(0.1)], dtype=torch.float64)
    dt_bias = torch.tensor([0.3, 0.3], dtype=torch.float64)
    g = static_log_decay("gdn", a_log, dt_bias, a_s=-0.3)
    assert g.dtype == torch.float64
    assert g.tolist() == pytest.approx([-math.log(2), -0.1 * math.log(2)], rel=1e-12)
    h = retention_horizon(g)
    assert h.tolist() == pytest.approx([9.965784284662087, 99.65784284662087], rel=1e-12)


def test_kda_softplus_per_channel_uses_head_scale():
    # 2 heads x 2 channels; head 1 has A_log = ln 2 (scale 2); channel dt_bias differs
    a_log = torch.tensor([0.0, math.log(2.0)], dtype=torch.float64).reshape(1, 1, 2, 1)
    dt_bias = torch.tensor([0.3, 1.3, 0.3, -10.0], dtype=torch.float64)
    g = static_log_decay("kda", a_log, dt_bias, a_s=-0.3)
    sp = lambda x: math.log1p(math.exp(x))  # noqa: E731
    want = [-1 * sp(0.0), -1 * sp(1.0), -2 * sp(0.0), -2 * sp(-10.3)]
    assert g.tolist() == pytest.approx(want, rel=1e-12)


def test_kda_safe_gate_hand_values():
    # g = l * sigmoid(exp(A_log) (a_s + d)); A_log = 0, a_s + d = 0 -> l/2 = -2.5 -> H = 6.9078/2.5
    a_log = torch.tensor([0.0], dtype=torch.float64).reshape(1, 1, 1, 1)
    dt_bias = torch.tensor([-0.8, 1.2], dtype=torch.float64)
    g = static_log_decay("kda_safe_gate", a_log, dt_bias, a_s=0.8, lower_bound=-5.0)
    assert g.tolist() == pytest.approx([-2.5, -5.0 / (1 + math.exp(-2.0))], rel=1e-12)
    assert retention_horizon(g)[0].item() == pytest.approx(-LN_EPS / 2.5, rel=1e-12)


def test_nonnegative_decay_is_infinite_horizon_and_always_kept():
    g = torch.tensor([-1.0, 0.0, 0.5], dtype=torch.float64)
    h = retention_horizon(g)
    assert h[0].item() == pytest.approx(-LN_EPS)
    assert math.isinf(h[1].item()) and math.isinf(h[2].item())
    assert select_global(h, 10**9).tolist() == [1, 2]


def test_selection_is_strictly_greater_than_wmax():
    h = torch.tensor([3.0, 16.0, 16.000001, math.inf], dtype=torch.float64)
    assert select_global(h, 16).tolist() == [2, 3]
    assert select_global(h, 0).tolist() == [0, 1, 2, 3]


def test_eq7_refresh_windows():
    assert next_pow2(9.97) == 16 and next_pow2(16.0) == 16 and next_pow2(0.0) == 4 and next_pow2(1.0) == 1
    assert unit_refresh_window(9.97, 64) == 16      # next_pow2 -> 16, inside [4, 64]
    assert unit_refresh_window(2.76, 64) == 4       # clamped up to 4
    assert unit_refresh_window(40.0, 32) == 32      # clamped down to W_max
    local = torch.tensor([2.0, 9.97, 5.0], dtype=torch.float64)
    assert replay_window(local, 64) == 16
    assert replay_window(local, 64, n_p=10) == 10   # capped by the cached prefix length
    assert replay_window(torch.empty(0, dtype=torch.float64), 64, n_p=100) == 0


def test_ragged_offsets_and_ratios():
    assert ragged_offsets([1, 3, 0, 2]) == [0, 1, 4, 4, 6]
    r = compression_ratios([4, 4], [1, 3])
    assert r["c_temp_ragged"] == pytest.approx(2.0)          # 8 / 4
    assert r["c_temp_padded"] == pytest.approx(8 / 6)         # 8 / (2 * 3)
    assert r["layout_gain"] == pytest.approx(1.5)             # R_max / r_bar = 3 / 2
    assert compression_ratios([4], [0])["c_temp_ragged"] == math.inf


def test_usable_slots_reserves_slot_zero():
    assert usable_slots(1000, 100) == 9
    assert usable_slots(999, 100) == 8
    assert usable_slots(50, 100) == 0
    assert usable_slots(None, 100) is None


def test_random_mask_count_matched_and_deterministic():
    a = random_count_matched(128, 37, seed=1234, layer_id=5)
    b = random_count_matched(128, 37, seed=1234, layer_id=5)
    c = random_count_matched(128, 37, seed=2027, layer_id=5)
    assert a.tolist() == b.tolist() and len(set(a.tolist())) == 37
    assert a.tolist() == sorted(a.tolist()) and a.tolist() != c.tolist()


def test_quantiles_and_histogram():
    h = torch.tensor([1.5, 3.0, 100.0, math.inf], dtype=torch.float64)
    q = horizon_quantiles(h)
    assert q["min"] == 1.5 and math.isinf(q["max"]) and q["p50"] == 3.0
    counts = horizon_histogram(h, [0.0, 1.0, 2.0, 4.0, 128.0])
    assert counts == [0, 1, 1, 1, 1]   # [0,1) [1,2) [2,4) [4,128) [128,inf]


def test_kept_count_bounds_from_histogram_agree_with_selection():
    """The plan reader's bounds on n_kept (units with H_s > w_max, §4.1) from a layer's histogram alone:
    the bin holding w_max may hold units on both sides (a horizon equal to w_max is local), the bins above
    it only global ones; the true count always lies inside."""
    from dasc_compile.schema.cutoff import kept_bounds as _kept_bounds

    edges = [0.0, 1.0, 2.0, 4.0, 128.0]
    h = torch.tensor([1.5, 3.0, 4.0, 100.0, 128.0, math.inf], dtype=torch.float64)
    counts = horizon_histogram(h, edges)
    assert counts == [0, 1, 1, 2, 2]                    # [0,1) [1,2) [2,4) [4,128) [128,inf]
    assert _kept_bounds(edges, counts, 4) == (2, 4)     # [4,128) holds 4.0 (local) and 100 (global): unplaced
    assert _kept_bounds(edges, counts, 3) == (4, 5)     # [2,4) holds w_max 3
    assert _kept_bounds(edges, counts, 128) == (0, 2)   # [128,inf] holds 128 (local) and inf
    assert _kept_bounds(edges, counts, 1000) == (0, 2)
    assert _kept_bounds(edges, counts, 0) == (6, 6)     # [0,1) is empty, every bin above starts past 0
    for w in (0, 1, 2, 3, 4, 50, 100, 127, 128, 1000):
        lo, hi = _kept_bounds(edges, counts, w)
        assert lo <= int(select_global(h, w).numel()) <= hi, w
