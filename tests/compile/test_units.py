"""UnitSpec (dasc_compile.schema.units): unit shapes, INT8 scales, bytes and usable slots, by hand."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from dasc_compile.errors import DascInputError
from dasc_compile.schema import UNIT_KINDS, UnitSpec, usable_slots

# Qwen3-Next-80B-A3B GDN layer: H_v 32, H_k 16, d 128, conv_dim 2*16*128 + 32*128 = 8192, K = 4
GDN = UnitSpec(kind="gdn_head", d_v=128, d_k=128, temporal_dtype="float32", conv_dim=8192, conv_kernel=4,
               conv_dtype="bfloat16", int8=False)
# Kimi-Linear-48B-A3B KDA layer: H 32, d 128, conv_dim 3*32*128 = 12288, K = 4
KDA = UnitSpec(kind="kda_column", d_v=128, d_k=128, temporal_dtype="float32", conv_dim=12288, conv_kernel=4,
               conv_dtype="bfloat16", int8=False)


def test_itemsize_is_the_one_dtype_table():
    assert [UnitSpec.itemsize(n) for n in ("float32", "bfloat16", "float16", "int8")] == [4, 2, 2, 1]
    assert UnitSpec.itemsize(str(torch.bfloat16)) == 2
    with pytest.raises(DascInputError, match="'float8'"):
        UnitSpec.itemsize("float8")


def test_gdn_head_unit():
    assert GDN.units_per_head == 1 and GDN.unit_shape == (128, 128) and GDN.unit_elems == 16384
    assert GDN.scale_shape == (128,)
    assert GDN.unit_bytes == GDN.dense_unit_bytes == 16384 * 4
    g8 = dataclasses.replace(GDN, int8=True)
    assert g8.unit_bytes == 16384 * 1 + 128 * 4 and g8.dense_unit_bytes == 16384 * 4
    assert g8.stored_dtype == "int8" and g8.scale_dtype == "float32"
    assert dataclasses.replace(GDN, temporal_dtype="bfloat16", int8=True).unit_bytes == 16384 + 128 * 2


def test_kda_column_unit():
    assert KDA.units_per_head == 128 and KDA.unit_shape == (128,) and KDA.unit_elems == 128
    assert KDA.scale_shape == (1,)
    assert KDA.unit_bytes == 512 and dataclasses.replace(KDA, int8=True).unit_bytes == 128 + 4


def test_layer_shapes_and_conv_bytes_follow_sglang():
    assert GDN.temporal_layer_shape(16) == (16, 128, 128) and GDN.temporal_layer_bytes(32) == 32 * 16384 * 4
    assert GDN.conv_layer_shape() == (8192, 3) and GDN.conv_layer_shape(2) == (4096, 3)
    assert KDA.conv_layer_shape() == (3, 12288) and KDA.conv_layer_shape(4) == (3, 3072)
    assert GDN.conv_bytes_per_layer(1) == 8192 * 3 * 2 and KDA.conv_bytes_per_layer(2) == 6144 * 3 * 2
    with pytest.raises(DascInputError, match="tp_size = 5"):
        GDN.conv_layer_shape(5)


def test_bad_spec_is_refused():
    with pytest.raises(DascInputError, match="'mamba_row'"):
        dataclasses.replace(GDN, kind="mamba_row")
    with pytest.raises(DascInputError, match="d_v"):
        dataclasses.replace(GDN, d_v=0)
    with pytest.raises(DascInputError, match="'int4'"):
        dataclasses.replace(GDN, conv_dtype="int4")
    assert set(UNIT_KINDS) == {"gdn_head", "kda_column", "mamba2_head"}


def test_units_view_rows_are_the_units():
    small_gdn = dataclasses.replace(GDN, d_v=4, d_k=5)
    state = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)   # [N, H, d_v, d_k]
    rows = small_gdn.units_view(state)
    assert rows.shape == (2, 3, 20) and torch.equal(rows[1, 2], state[1, 2].reshape(-1))
    rows[0, 1, 0] = -1.0                                                              # GDN rows are a view
    assert state[0, 1, 0, 0] == -1.0
    small_kda = dataclasses.replace(KDA, d_v=4, d_k=5)
    cols = small_kda.units_view(state)
    assert cols.shape == (2, 15, 4)
    for h in range(3):
        for k in range(5):
            assert torch.equal(cols[1, h * 5 + k], state[1, h, :, k])
    for spec in (small_gdn, small_kda):
        assert torch.equal(spec.state_from_units(spec.units_view(state)), state)
    with pytest.raises(ValueError, match="d_v=4, d_k=5"):
        small_kda.units_view(state[..., :4])


def test_usable_slots_reserves_slot_zero():
    assert usable_slots(1000, 100) == 9 and usable_slots(1099, 100) == 9 and usable_slots(199, 100) == 0
    assert usable_slots(50, 100) == 0 and usable_slots(None, 100) is None
    with pytest.raises(ValueError):
        usable_slots(1000, 0)


def test_from_plan(tmp_path):
    from dasc_compile.compiler import compile_plan
    from dasc_compile.policy import Policy
    ref = Path(__file__).resolve().parents[2] / "plans" / "reference" / "kimi-linear-48b-a3b"
    plan, _ = compile_plan(ref, Policy(w_max=64, int8=True), tmp_path / "p", with_kernels=False)
    spec = UnitSpec.from_plan(plan)
    assert spec == dataclasses.replace(KDA, int8=True)
    assert spec.unit_bytes == plan.totals.unit_bytes == plan.tp.bytes_per_unit
    assert spec.conv_bytes_per_layer(1) == plan.layers[0].bytes_conv
