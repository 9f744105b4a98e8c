"""The runtime's Eq. 8 quantiser and rank layout each live in one place.

``TorchOps.quantize`` / ``dequantize`` (``dasc_runtime.ops``) go through
``dasc_runtime.torch_kernels.quantize_int8`` / ``dequantize_int8`` (App. E.1, Eq. 8), and
``build_rank_layout`` (``dasc_runtime.rank_layout``) builds the kernels' index once, from the same
rank-local kept units as ``build_state_index`` (App. B Scheme 2).
"""

from __future__ import annotations

import pytest
import torch

from tests.support.runtime_fixtures import compile_tiny


def _layout(kind: str, dtype: torch.dtype, d_v: int, d_k: int):
    """One layer, one head, unit 0 kept; INT8 (conv fields are not used by the quantiser)."""
    from dasc_compile.schema import UnitSpec
    from dasc_runtime.rank_layout import RankLayout, state_index_from_kept

    name = str(dtype).removeprefix("torch.")
    spec = UnitSpec(kind=kind, d_v=d_v, d_k=d_k, temporal_dtype=name, conv_dim=1, conv_kernel=2, conv_dtype=name,
                    int8=True)
    upl = spec.units_per_head
    return RankLayout(spec=spec, num_layers=1, heads_per_rank=1, units_per_layer=upl, rank_units=((0,),),
                      offsets=(0, 1), n_kept=1, width=1,
                      index=state_index_from_kept([[0]], heads=1, unit_kind=kind, dk=d_k),
                      kept_flat=torch.tensor([0]), local_flat=torch.arange(1, upl, dtype=torch.int64),
                      storage=None, tp_rank=0, tp_size=1)


def test_constants_are_defined_once():
    from dasc_runtime import ops, torch_kernels

    assert ops.QMAX is torch_kernels.QMAX and ops.QMAX == 127
    assert ops.SCALE_FLOOR is torch_kernels.SCALE_FLOOR and ops.SCALE_FLOOR == 1e-8


def test_ops_quantize_gdn_head_hand_values():
    """GDN head [d_v=2, d_k=2]: one scale per k over d_v, s = max_v |S| / 127."""
    from dasc_runtime.ops import TorchOps

    layout = _layout("gdn_head", torch.float32, 2, 2)
    units = torch.tensor([[[[1.0, -2.0], [3.0, 0.5]]]])                    # [N=1, n=1, d_v, d_k]
    q, s = TorchOps.quantize(layout, units)
    assert q.dtype == torch.int8 and q.shape == (1, 1, 2, 2) and s.shape == (1, 1, 2) and s.dtype == torch.float32
    # k0: a = 3 -> 1 * 127 / 3 = 42.33 -> 42, 3 -> 127; k1: a = 2 -> -2 -> -127, 0.5 * 127 / 2 = 31.75 -> 32
    assert q.flatten().tolist() == [42, -127, 127, 32]
    assert torch.equal(s.flatten(), torch.div(torch.tensor([3.0, 2.0]), torch.tensor([127.0, 127.0])))
    back = TorchOps.dequantize(layout, q, s)
    assert torch.equal(back, q.to(torch.float32) * s.unsqueeze(-2))
    assert back[0, 0, 1, 0].item() == pytest.approx(3.0, rel=1e-6)


def test_ops_quantize_kda_column_hand_values_and_zero_floor():
    """KDA columns [d_v=3]: one scale per column; an all-zero column takes the 1e-8 floor."""
    from dasc_runtime.ops import TorchOps

    layout = _layout("kda_column", torch.bfloat16, 3, 2)
    units = torch.tensor([[[0.0, -4.0, 1.0], [0.0, 0.0, 0.0]]], dtype=torch.bfloat16)   # [N=1, n=2, d_v]
    q, s = TorchOps.quantize(layout, units)
    assert s.shape == (1, 2) and s.dtype == torch.bfloat16
    assert q.tolist() == [[[0, -127, 32], [0, 0, 0]]]
    floor = torch.div(torch.tensor([1e-8]), torch.tensor([127.0])).to(torch.bfloat16)
    assert s[0, 1] == floor[0] and s[0, 0] == torch.tensor(4.0 / 127).to(torch.bfloat16)
    assert TorchOps.dequantize(layout, q, s).dtype == torch.bfloat16


@pytest.mark.parametrize("kind,tp", [("gdn", 2), ("kda", 1)])
def test_rank_layout_and_state_index_share_the_ragged_order(tmp_path, kind, tp):
    """Per rank: RankLayout.kept_flat / offsets / local_flat equal what its StateIndex says, and that
    index equals the one built from the plan directly."""
    from dasc_runtime.rank_layout import build_rank_layout, build_state_index, rank_kept_units

    plan, _, _ = compile_tiny(tmp_path, kind, tp_size=tp)
    for r in range(tp):
        lay = build_rank_layout(plan, r, tp)
        ix = lay.index
        again = build_state_index(plan, tp_rank=r)
        assert all(torch.equal(getattr(ix, f), getattr(again, f)) for f in
                   ("unit_layer", "unit_index", "offsets", "unit_row", "kept_heads", "local_heads", "scale_lhk"))
        units = rank_kept_units(plan, r)
        assert lay.rank_units == tuple(tuple(u) for u in units)
        assert all(list(u) == sorted(u) for u in units)
        assert list(lay.offsets) == ix.offsets.tolist() and lay.n_kept == ix.num_rows
        assert torch.equal(lay.kept_flat, ix.unit_layer * lay.units_per_layer + ix.unit_index)
        every = torch.cat([lay.kept_flat, lay.local_flat]).sort().values
        assert torch.equal(every, torch.arange(lay.num_layers * lay.units_per_layer))
        assert lay.kept_flat.dtype == lay.local_flat.dtype == torch.int64
        assert lay.local_flat.numel() > 0 and lay.n_kept > 0           # both kinds of unit present
        assert torch.equal(lay.local_flat, torch.nonzero(ix.unit_row.reshape(-1) < 0).flatten())
