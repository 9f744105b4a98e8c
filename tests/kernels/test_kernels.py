"""State-checkpoint kernels vs the plain-PyTorch reference (paper §4.1, §4.2, App. B, App. E.1).

CPU tests run the rendered Triton kernels under Triton's interpreter: the ``interp`` fixture
imports each rendered module with ``TRITON_INTERPRET=1`` (``kernel_loader(interpret=True)`` sets it
only while the module executes, under a separate module name, so other test modules keep
compiled ``@triton.jit`` functions) and keeps the variable set, via ``monkeypatch``, for the
duration of each test that launches kernels. This works whatever imported triton first (SGLang
does, at collection) because the kernels use no ``@jit`` helper of triton.language
(test_kernel_render checks that). The 64-bit test runs in a subprocess with the variable set
before any import, so a wild pointer cannot take the session down.
Shapes are tiny (the interpreter runs every program in Python) but use small tiles so that every
kernel runs several v-, k- and conv-tiles. GPU tests skip cleanly without CUDA.

Copies and zero-fill must be bit-exact; INT8 (Eq. 8) must equal the reference exactly.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dasc_compile.kernels import make_constants, render_kernel_module
from dasc_runtime import torch_kernels as ref
from dasc_runtime.rank_layout import StateIndex, state_index_from_kept
from dasc_runtime.kernel_loader import load_kernel_module

REPO = Path(__file__).resolve().parents[2]
GDN, KDA, MAMBA2 = "gdn_head", "kda_column", "mamba2_head"
# (L, H, dv, dk, tile): "tiled" forces 2 v-blocks for copies and 2 k-blocks for INT8 tiles;
# "odd" has non-power-of-two dims so every mask is exercised. Mamba2 heads [head_dim, d_state]:
# "m2" is Nemotron-H's head_dim : d_state = 1 : 2 scaled down (4 x 8), "m2-odd" three heads of 3 x 5.
SHAPES = {"tiled": (3, 2, 4, 8, 16), "odd": (2, 2, 3, 5, 8), "m2": (2, 4, 4, 8, 16), "m2-odd": (2, 3, 3, 5, 8)}
CASES = ([pytest.param(kind, shape, id=f"{kind}-{shape}") for kind in (GDN, KDA) for shape in ("tiled", "odd")]
         + [pytest.param(MAMBA2, shape, id=f"{MAMBA2}-{shape}") for shape in ("m2", "m2-odd")])
_MODULES: dict = {}


def conv_shape(kind: str, h: int, d: int, dk: int = 0) -> tuple[int, int]:
    """SGLang layouts: GDN (conv_dim, K-1), Kimi (K-1, 3*H*d), Mamba2 (H*head_dim + 2*n_groups*d_state, K-1)
    with one group; here K = 4."""
    if kind == MAMBA2:
        return (h * d + 2 * dk, 3)
    return (3 * h * d, 3) if kind == GDN else (3, 3 * h * d)


def constants(kind, shape, *, dtype="float32", int8=True):
    L, H, dv, dk, tile = SHAPES[shape]
    return make_constants(num_layers=L, unit_kind=kind, heads=H, dv=dv, dk=dk, tile=tile, int8=int8,
                          conv_shapes=[conv_shape(kind, H, dv, dk)], temporal_dtype=dtype)


@pytest.fixture
def interp(tmp_path_factory, monkeypatch):
    """Return ``get(constants) -> module`` rendered once and imported under the interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    root = tmp_path_factory.getbasetemp() / "interp_kernels"
    root.mkdir(exist_ok=True)

    def get(c):
        name, src = render_kernel_module(c)
        if name not in _MODULES:
            (root / name).write_text(src)
            _MODULES[name] = load_kernel_module(root, name, interpret=True)
        return _MODULES[name]

    return get


def kept_sets(kind, L, H, dk, seed=0) -> list[list[int]]:
    """Uneven kept sets per layer (about 1/3 .. 2/3 of the units), layer 0 keeps unit 0 and the last unit."""
    n = H * (1 if kind != KDA else dk)
    g = torch.Generator().manual_seed(seed)
    out = []
    for l in range(L):
        r = max(1, round(n * (1 / 3 + l / (3 * max(1, L - 1)))))
        ids = torch.randperm(n, generator=g)[:r].tolist()
        if l == 0:
            ids = sorted(set(ids) | {0, n - 1})
        out.append(sorted(ids))
    return out


class Pools:
    """Dense active pool (S+1 slots) and ragged pool (C+1 slots) filled with distinct values."""

    def __init__(self, c, index: StateIndex, *, S=5, C=4, seed=0, device="cpu", int8=False):
        g = torch.Generator().manual_seed(seed)
        L, H, dv, dk = c["NUM_LAYERS"], c["HEADS"], c["DV"], c["DK"]
        dt = getattr(torch, c["TEMPORAL_DTYPE"])
        cdt = getattr(torch, c["CONV_DTYPE"])
        cs = (c["CONV0_ROWS"], c["CONV0_COLS"])
        unit = (dv, dk) if c["WHOLE_HEAD"] else (dv,)
        R = index.num_rows
        self.temporal = torch.randn(L, S + 1, H, dv, dk, generator=g).to(dt).to(device)
        self.conv = [torch.randn(L, S + 1, *cs, generator=g).to(cdt).to(device)]
        self.comp = torch.full((C + 1, R) + unit, 7.0, dtype=dt, device=device)
        self.comp_conv = [torch.full((L, C + 1) + cs, 3.0, dtype=cdt, device=device)]
        if int8:
            self.comp_q = torch.full((C + 1, R) + unit, 5, dtype=torch.int8, device=device)
            self.comp_scale = torch.full((C + 1, R) + ((dk,) if c["WHOLE_HEAD"] else ()), 9.0, dtype=dt,
                                         device=device)

    def clone(self) -> "Pools":
        new = object.__new__(Pools)
        for k, v in vars(self).items():
            setattr(new, k, [t.clone() for t in v] if isinstance(v, list) else v.clone())
        return new


def slots(*ids, device="cpu"):
    return torch.tensor(ids, dtype=torch.int64, device=device)


def unit_of(temporal, kind, l, s, u, dk):
    """Hand addressing of a unit in the dense pool: GDN / Mamba2 head [dv, dk]; KDA column S[h, :, k]."""
    return temporal[l, s, u] if kind != KDA else temporal[l, s, u // dk, :, u % dk]


def assert_same(a: torch.Tensor, b: torch.Tensor):
    """Bit-exact comparison (also distinguishes -0.0 and NaN payloads)."""
    assert a.shape == b.shape and a.dtype == b.dtype
    if a.dtype.is_floating_point:
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.view(bits), b.view(bits)
    assert torch.equal(a, b), f"{(a != b).sum().item()} of {a.numel()} elements differ"


def index_for(c, seed=0):
    kept = kept_sets(c["UNIT_KIND"], c["NUM_LAYERS"], c["HEADS"], c["DK"], seed)
    return state_index_from_kept(kept, heads=c["HEADS"], unit_kind=c["UNIT_KIND"], dk=c["DK"]), kept


# ------------------------------------------------------------------ pack / load / refresh (copies)

@pytest.mark.parametrize("kind,shape", CASES)
def test_pack_matches_reference_and_hand_addressing(interp, kind, shape):
    c = constants(kind, shape)
    mod = interp(c)
    idx, kept = index_for(c)
    p = Pools(c, idx)
    want = p.clone()
    args = dict(src_slots=slots(3, 1, 3), dst_slots=slots(2, 4, 1), unit_row=idx.unit_row, kept_heads=idx.kept_heads)
    mod.pack(temporal=p.temporal, conv=p.conv, comp_temporal=p.comp, comp_conv=p.comp_conv, **args)
    ref.pack(temporal=want.temporal, conv=want.conv, comp_temporal=want.comp, comp_conv=want.comp_conv, **args)
    assert_same(p.comp, want.comp)
    assert_same(p.comp_conv[0], want.comp_conv[0])
    # independent of the reference: ragged row o_(l-1) + j holds the j-th kept unit of layer l
    for l, ids in enumerate(kept):
        for j, u in enumerate(ids):
            row = idx.offsets[l].item() + j
            assert_same(p.comp[4, row], unit_of(p.temporal, kind, l, 1, u, c["DK"]))
    assert_same(p.comp_conv[0][:, 2], p.conv[0][:, 3])
    # slot 0 and the unused slot 3 keep their fill values
    assert bool((p.comp[0] == 7).all()) and bool((p.comp[3] == 7).all()) and bool((p.comp_conv[0][:, 0] == 3).all())


@pytest.mark.parametrize("kind,shape", CASES)
def test_load_zero_fills_local_units_and_restores_conv(interp, kind, shape):
    c = constants(kind, shape)
    mod = interp(c)
    idx, kept = index_for(c, seed=1)
    p = Pools(c, idx, seed=1)
    p.comp.copy_(torch.randn(p.comp.shape, generator=torch.Generator().manual_seed(5)).to(p.comp.dtype))
    want = p.clone()
    args = dict(src_slots=slots(2, 4), dst_slots=slots(5, 1), unit_row=idx.unit_row)
    mod.load(comp_temporal=p.comp, comp_conv=p.comp_conv, temporal=p.temporal, conv=p.conv, **args)
    ref.load(comp_temporal=want.comp, comp_conv=want.comp_conv, temporal=want.temporal, conv=want.conv, **args)
    assert_same(p.temporal, want.temporal)
    assert_same(p.conv[0], want.conv[0])
    # hand checks on destination slot 1 (from ragged slot 4)
    n_units = c["HEADS"] * (1 if kind != KDA else c["DK"])
    for l in range(c["NUM_LAYERS"]):
        for u in range(n_units):
            got = unit_of(p.temporal, kind, l, 1, u, c["DK"])
            if u in kept[l]:
                assert_same(got, p.comp[4, idx.unit_row[l, u].item()])
            else:
                assert bool((got == 0).all()) and not bool(torch.signbit(got).any())
    untouched = [0, 2, 3, 4]
    assert_same(p.temporal[:, untouched], Pools(c, idx, seed=1).temporal[:, untouched])
    assert_same(p.conv[0][:, 5], p.comp_conv[0][:, 2])


@pytest.mark.parametrize("kind", [GDN, KDA, MAMBA2])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pack_load_round_trip_single_slot(interp, kind, dtype):
    c = constants(kind, "m2" if kind == MAMBA2 else "tiled", dtype=dtype, int8=False)
    mod = interp(c)
    idx, kept = index_for(c, seed=2)
    p = Pools(c, idx, seed=2)
    original = p.temporal.clone()
    mod.pack(temporal=p.temporal, conv=p.conv, src_slots=slots(4), comp_temporal=p.comp, comp_conv=p.comp_conv,
             dst_slots=slots(3), unit_row=idx.unit_row, kept_heads=idx.kept_heads)
    mod.load(comp_temporal=p.comp, comp_conv=p.comp_conv, src_slots=slots(3), temporal=p.temporal, conv=p.conv,
             dst_slots=slots(2), unit_row=idx.unit_row)
    keep = (idx.unit_row >= 0)
    if kind != KDA:
        mask = keep[:, :, None, None]
    else:
        mask = keep.reshape(c["NUM_LAYERS"], c["HEADS"], 1, c["DK"])
    assert_same(p.temporal[:, 2], torch.where(mask, original[:, 4], torch.zeros((), dtype=original.dtype)))
    assert_same(p.conv[0][:, 2], p.conv[0][:, 4])


@pytest.mark.parametrize("kind,shape", CASES)
def test_refresh_copy_writes_only_local_units(interp, kind, shape):
    c = constants(kind, shape)
    mod = interp(c)
    idx, kept = index_for(c, seed=3)
    p = Pools(c, idx, seed=3)
    before = p.temporal.clone()
    scratch = torch.randn(c["NUM_LAYERS"], 2, c["HEADS"], c["DV"], c["DK"], generator=torch.Generator().manual_seed(9))
    want = before.clone()
    args = dict(scratch=scratch, dst_slots=slots(4, 2), unit_row=idx.unit_row, local_heads=idx.local_heads)
    mod.refresh_copy(temporal=p.temporal, **args)
    ref.refresh_copy(temporal=want, **args)
    assert_same(p.temporal, want)
    n_units = c["HEADS"] * (1 if kind != KDA else c["DK"])
    for l in range(c["NUM_LAYERS"]):
        for u in range(n_units):
            got = unit_of(p.temporal, kind, l, 2, u, c["DK"])
            src = unit_of(scratch, kind, l, 1, u, c["DK"]) if u not in kept[l] else unit_of(before, kind, l, 2, u, c["DK"])
            assert_same(got, src)
    assert_same(p.temporal[:, [0, 1, 3, 5]], before[:, [0, 1, 3, 5]])


@pytest.mark.parametrize("kind", [GDN, KDA])
def test_head_lists_may_list_every_head(interp, kind):
    """kept_heads / local_heads only choose which programs run: listing all heads changes nothing."""
    c = constants(kind, "tiled")
    mod = interp(c)
    # head 0 of layer 0 wholly kept, layer 2 wholly local: both lists are shorter than L * H = 6
    kept = [[0], [0, 1], []] if kind == GDN else [list(range(8)), [3, 12], []]
    idx = state_index_from_kept(kept, heads=2, unit_kind=kind, dk=8)
    assert idx.kept_heads.tolist() == [0, 2, 3]
    assert idx.local_heads.tolist() == ([1, 4, 5] if kind == GDN else [1, 2, 3, 4, 5])
    every = torch.arange(c["NUM_LAYERS"] * c["HEADS"], dtype=torch.int64)
    p = Pools(c, idx, seed=8)
    want = p.clone()
    mod.pack(temporal=p.temporal, conv=p.conv, src_slots=slots(2), comp_temporal=p.comp, comp_conv=p.comp_conv,
             dst_slots=slots(3), unit_row=idx.unit_row, kept_heads=every)
    mod.pack(temporal=want.temporal, conv=want.conv, src_slots=slots(2), comp_temporal=want.comp,
             comp_conv=want.comp_conv, dst_slots=slots(3), unit_row=idx.unit_row, kept_heads=idx.kept_heads)
    assert_same(p.comp, want.comp)
    scratch = torch.randn(c["NUM_LAYERS"], 1, c["HEADS"], c["DV"], c["DK"], generator=torch.Generator().manual_seed(2))
    mod.refresh_copy(scratch=scratch, temporal=p.temporal, dst_slots=slots(5), unit_row=idx.unit_row, local_heads=every)
    mod.refresh_copy(scratch=scratch, temporal=want.temporal, dst_slots=slots(5), unit_row=idx.unit_row,
                     local_heads=idx.local_heads)
    assert_same(p.temporal, want.temporal)


@pytest.mark.parametrize("kind", [GDN, KDA])
def test_nothing_kept_packs_conv_and_loads_zeros(interp, kind):
    c = constants(kind, "tiled")
    mod = interp(c)
    idx = state_index_from_kept([[]] * c["NUM_LAYERS"], heads=c["HEADS"], unit_kind=kind, dk=c["DK"])
    p = Pools(c, idx)
    assert p.comp.shape[1] == 0
    mod.pack(temporal=p.temporal, conv=p.conv, src_slots=slots(1), comp_temporal=p.comp, comp_conv=p.comp_conv,
             dst_slots=slots(1), unit_row=idx.unit_row, kept_heads=idx.kept_heads)
    assert_same(p.comp_conv[0][:, 1], p.conv[0][:, 1])
    mod.load(comp_temporal=p.comp, comp_conv=p.comp_conv, src_slots=slots(1), temporal=p.temporal, conv=p.conv,
             dst_slots=slots(3), unit_row=idx.unit_row)
    assert bool((p.temporal[:, 3] == 0).all())


@pytest.mark.parametrize("conv_shapes", [[(6, 3), (3, 5)], []], ids=["two-conv", "no-conv"])
def test_conv_tensor_count_is_specialised(interp, conv_shapes):
    """The launch carries one pointer pair per conv tensor of MambaPool.State.conv (here 2 or 0)."""
    c = make_constants(num_layers=2, unit_kind=GDN, heads=2, dv=4, dk=8, tile=16, conv_shapes=conv_shapes)
    mod = interp(c)
    idx = state_index_from_kept([[1], [0, 1]], heads=2, unit_kind=GDN, dk=8)
    g = torch.Generator().manual_seed(7)
    temporal = torch.randn(2, 4, 2, 4, 8, generator=g)
    conv = [torch.randn(2, 4, *s, generator=g).bfloat16() for s in conv_shapes]
    comp = torch.zeros(3, idx.num_rows, 4, 8)
    comp_conv = [torch.zeros(2, 3, *s).bfloat16() for s in conv_shapes]
    mod.pack(temporal=temporal, conv=conv, src_slots=slots(3), comp_temporal=comp, comp_conv=comp_conv,
             dst_slots=slots(2), unit_row=idx.unit_row, kept_heads=idx.kept_heads)
    assert_same(comp[2], torch.stack([temporal[0, 3, 1], temporal[1, 3, 0], temporal[1, 3, 1]]))
    for cv, cc in zip(conv, comp_conv):
        assert_same(cc[:, 2], cv[:, 3])
    mod.load(comp_temporal=comp, comp_conv=comp_conv, src_slots=slots(2), temporal=temporal, conv=conv,
             dst_slots=slots(1), unit_row=idx.unit_row)
    assert_same(temporal[:, 1, :, :, :][0, 0], torch.zeros(4, 8))
    assert_same(temporal[1, 1], temporal[1, 3])
    for cv in conv:
        assert_same(cv[:, 1], cv[:, 3])


# ------------------------------------------------------------------ INT8 (App. E.1, Eq. 8)

@pytest.mark.parametrize("kind,shape", CASES)
def test_int8_pack_and_load_equal_reference(interp, kind, shape):
    c = constants(kind, shape)
    mod = interp(c)
    idx, kept = index_for(c, seed=4)
    p = Pools(c, idx, seed=4, int8=True)
    p.temporal.mul_(torch.logspace(-3, 2, p.temporal.shape[-2]).reshape(-1, 1))   # scales span 5 decades
    want = p.clone()
    pk = dict(src_slots=slots(5, 2), dst_slots=slots(1, 3), unit_row=idx.unit_row, kept_heads=idx.kept_heads)
    mod.pack_int8(temporal=p.temporal, conv=p.conv, comp_q=p.comp_q, comp_scale=p.comp_scale, comp_conv=p.comp_conv, **pk)
    ref.pack_int8(temporal=want.temporal, conv=want.conv, comp_q=want.comp_q, comp_scale=want.comp_scale,
                  comp_conv=want.comp_conv, **pk)
    assert_same(p.comp_q, want.comp_q)
    assert_same(p.comp_scale, want.comp_scale)
    assert_same(p.comp_conv[0], want.comp_conv[0])
    ld = dict(src_slots=slots(3, 1), dst_slots=slots(4, 1), unit_row=idx.unit_row)
    mod.load_int8(comp_q=p.comp_q, comp_scale=p.comp_scale, comp_conv=p.comp_conv, temporal=p.temporal, conv=p.conv, **ld)
    ref.load_int8(comp_q=want.comp_q, comp_scale=want.comp_scale, comp_conv=want.comp_conv, temporal=want.temporal,
                  conv=want.conv, **ld)
    assert_same(p.temporal, want.temporal)
    # symmetric rounding error is at most half a step: |S - q s| <= s / 2 for kept units
    orig = Pools(c, idx, seed=4).temporal * torch.logspace(-3, 2, p.temporal.shape[-2]).reshape(-1, 1)
    for l, ids in enumerate(kept):
        for u in ids:
            row = idx.unit_row[l, u].item()
            s = p.comp_scale[3, row]
            err = (unit_of(p.temporal, kind, l, 4, u, c["DK"]) - unit_of(orig, kind, l, 2, u, c["DK"])).abs()
            assert bool((err <= (s if kind == KDA else s[None, :]) / 2 * (1 + 1e-6)).all())


@pytest.mark.parametrize("kind", [GDN, KDA])
def test_int8_hand_computed_scales_and_round_half_even(interp, kind):
    c = make_constants(num_layers=1, unit_kind=kind, heads=1, dv=4, dk=2, conv_shapes=[(2, 3)], int8=True, tile=4)
    mod = interp(c)
    idx = state_index_from_kept([[0, 1] if kind == KDA else [0]], heads=1, unit_kind=kind, dk=2)
    temporal = torch.zeros(1, 2, 1, 4, 2)
    # column k=0: amax 127 -> s = 1, S/s has exact halves: round(2.5) = 2, round(-3.5) = -4, round(0.5) = 0
    temporal[0, 1, 0, :, 0] = torch.tensor([127.0, 2.5, -3.5, 0.5])
    # column k=1: all zero -> s = 1e-8 / 127 (the floor), q = 0
    conv = [torch.ones(1, 2, 2, 3, dtype=torch.bfloat16)]
    unit = (4, 2) if kind == GDN else (4,)
    q = torch.zeros((2, idx.num_rows) + unit, dtype=torch.int8)
    s = torch.zeros((2, idx.num_rows) + ((2,) if kind == GDN else ()))
    cc = [torch.zeros(1, 2, 2, 3, dtype=torch.bfloat16)]
    mod.pack_int8(temporal=temporal, conv=conv, src_slots=slots(1), comp_q=q, comp_scale=s, comp_conv=cc,
                  dst_slots=slots(1), unit_row=idx.unit_row, kept_heads=idx.kept_heads)
    floor = torch.tensor(1e-8, dtype=torch.float32) / 127
    if kind == GDN:
        assert q[1, 0, :, 0].tolist() == [127, 2, -4, 0] and q[1, 0, :, 1].tolist() == [0, 0, 0, 0]
        assert s[1, 0, 0].item() == 1.0 and s[1, 0, 1] == floor
    else:
        assert q[1, 0].tolist() == [127, 2, -4, 0] and q[1, 1].tolist() == [0, 0, 0, 0]
        assert s[1, 0].item() == 1.0 and s[1, 1] == floor


@pytest.mark.parametrize("kind", [GDN, KDA])
def test_int8_scale_is_a_correctly_rounded_division(interp, kind):
    """s = fl(a / 127) (IEEE division), not a * fl(1 / 127): for a = 1.125 the two differ by one ulp.

    PyTorch's CUDA div by a Python scalar multiplies by the reciprocal, which made the GPU
    reference disagree with the kernels on ~4 % of the scales (see ``reference.quantize_int8``).
    """
    a = torch.tensor(1.125)
    exact = a / torch.tensor(127.0)                       # CPU tensor / tensor: IEEE division
    assert exact.item() != (a * (torch.tensor(1.0) / torch.tensor(127.0))).item()
    units = torch.tensor([0.5, -1.125, 0.25, 1.0]).reshape(4, 1) if kind == GDN else torch.tensor([0.5, -1.125, 0.25, 1.0])
    q_ref, s_ref = ref.quantize_int8(units, scale_dtype=torch.float32, kind=kind)
    assert s_ref.reshape(-1)[0].view(torch.int32).item() == exact.view(torch.int32).item()
    c = make_constants(num_layers=1, unit_kind=kind, heads=1, dv=4, dk=1, conv_shapes=[(2, 3)], int8=True, tile=4)
    mod = interp(c)
    idx = state_index_from_kept([[0]], heads=1, unit_kind=kind, dk=1)
    temporal = torch.zeros(1, 2, 1, 4, 1)
    temporal[0, 1, 0, :, 0] = units.reshape(-1)
    unit = (4, 1) if kind == GDN else (4,)
    q = torch.zeros((2, 1) + unit, dtype=torch.int8)
    s = torch.zeros((2, 1) + ((1,) if kind == GDN else ()))
    cc = [torch.zeros(1, 2, 2, 3, dtype=torch.bfloat16)]
    mod.pack_int8(temporal=temporal, conv=[torch.ones(1, 2, 2, 3, dtype=torch.bfloat16)], src_slots=slots(1),
                  comp_q=q, comp_scale=s, comp_conv=cc, dst_slots=slots(1), unit_row=idx.unit_row,
                  kept_heads=idx.kept_heads)
    assert_same(s[1].reshape(-1), exact.reshape(1))
    assert q[1].reshape(-1).tolist() == q_ref.reshape(-1).tolist() == [56, -127, 28, 113]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # interpreter on NaN lanes
@pytest.mark.parametrize("int8", [False, True], ids=["copy", "int8"])
def test_kda_sparse_and_dense_tiles_store_only_kept_columns(interp, int8):
    """KDA pack reads a tile whole when >= 1/4 of its columns are kept, else only the kept columns.

    Heads below keep 1, 2, 4 and 8 of 16 columns (both sides of the switch); the local columns hold
    NaN and +-inf, which a whole-tile read loads into registers but must never store or mix into
    a kept column's INT8 scale.
    """
    c = make_constants(num_layers=2, unit_kind=KDA, heads=2, dv=4, dk=16, conv_shapes=[(3, 24)], int8=True,
                       tile=64)
    assert (c["BLOCK_V"], c["BLOCK_K"], c["Q_BLOCK_V"], c["Q_BLOCK_K"]) == (4, 16, 4, 16)
    mod = interp(c)
    kept = [[3, 16, 18, 20, 22, 24, 26, 28, 30], [0, 5, 9, 15, 18, 27]]
    idx = state_index_from_kept(kept, heads=2, unit_kind=KDA, dk=16)
    p = Pools(c, idx, S=3, C=2, seed=11, int8=True)
    local = (idx.unit_row < 0).reshape(2, 1, 2, 1, 16).expand(2, 4, 2, 4, 16)
    poison = torch.tensor([float("nan"), float("inf"), -float("inf")]).repeat(2 * 4 * 2 * 4 * 16 // 3 + 1)
    p.temporal[local] = poison[: int(local.sum())]
    want = p.clone()
    args = dict(src_slots=slots(3, 1), dst_slots=slots(1, 2), unit_row=idx.unit_row, kept_heads=idx.kept_heads)
    for impl, q in ((mod, p), (ref, want)):
        if int8:
            impl.pack_int8(temporal=q.temporal, conv=q.conv, comp_q=q.comp_q, comp_scale=q.comp_scale,
                           comp_conv=q.comp_conv, **args)
        else:
            impl.pack(temporal=q.temporal, conv=q.conv, comp_temporal=q.comp, comp_conv=q.comp_conv, **args)
    if int8:
        assert_same(p.comp_q, want.comp_q)
        assert_same(p.comp_scale, want.comp_scale)
        assert bool(torch.isfinite(p.comp_scale).all())
    else:
        assert_same(p.comp, want.comp)
        for l, ids in enumerate(kept):
            for j, u in enumerate(ids):
                assert_same(p.comp[1, idx.offsets[l].item() + j], unit_of(p.temporal, KDA, l, 3, u, 16))
        assert bool(torch.isfinite(p.comp).all())


# ------------------------------------------------------------------ input validation (kernels and reference)

def _bad_calls(c, idx):
    p = Pools(c, idx, int8=True)
    good = dict(temporal=p.temporal, conv=p.conv, src_slots=slots(1, 2), comp_temporal=p.comp, comp_conv=p.comp_conv,
                dst_slots=slots(1, 2), unit_row=idx.unit_row, kept_heads=idx.kept_heads)
    wrong_heads = torch.zeros(c["NUM_LAYERS"], 6, c["HEADS"] + 1, c["DV"], c["DK"])
    return {
        "repeated destination": (dict(dst_slots=slots(2, 2)), "must not repeat a destination slot"),
        "slot 0 destination": (dict(dst_slots=slots(0, 1)), r"slot 0 is reserved"),
        "slot 0 source": (dict(src_slots=slots(0, 1)), r"slot 0 is reserved"),
        "out of range": (dict(dst_slots=slots(1, 5)), r"in \[1, 4\]"),
        "int32 slots": (dict(src_slots=slots(1, 2).int()), "1-D torch.int64"),
        "batch mismatch": (dict(dst_slots=slots(1)), "must hold 2 slot ids"),
        "comp dtype": (dict(comp_temporal=p.comp.double()), "comp_temporal must have dtype torch.float32"),
        "conv dtype": (dict(conv=[p.conv[0].float()]), r"conv\[0\] must have dtype"),
        "heads": (dict(temporal=wrong_heads), "(temporal|unit_row) must have shape"),
        "inner strides": (dict(temporal=p.temporal.transpose(-1, -2).contiguous().transpose(-1, -2)),
                          r"contiguous \[H, dv, dk\] rows"),
        "ragged strides": (dict(comp_temporal=p.comp.transpose(0, 1).contiguous().transpose(0, 1)), "contiguous ragged rows"),
        "conv count": (dict(conv=[]), r"must hold \d tensor"),
        "unit_row dtype": (dict(unit_row=idx.unit_row.int()), "unit_row must have dtype torch.int64"),
        "unit_row shape": (dict(unit_row=idx.unit_row[:-1]), "unit_row must have shape"),
        "head list dtype": (dict(kept_heads=idx.kept_heads.int()), "kept_heads must be a contiguous 1-D torch.int64"),
        "head list length": (dict(kept_heads=torch.zeros(c["NUM_LAYERS"] * c["HEADS"] + 1, dtype=torch.int64)),
                             "kept_heads must hold at most"),
    }, good


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("kind", [GDN, KDA])
def test_bad_inputs_raise_value_error(interp, impl, kind):
    c = constants(kind, "tiled")
    mod = interp(c) if impl == "kernel" else ref
    idx, _ = index_for(c)
    cases, good = _bad_calls(c, idx)
    # a good call first: the kernel module then remembers its layout, which must hide no error
    # (value checks such as slot 0 share the good call's layout and must still run)
    mod.pack(**good)
    for name, (change, message) in cases.items():
        with pytest.raises(ValueError, match=message):
            mod.pack(**{**good, **change})
    with pytest.raises(ValueError, match="must not repeat a destination slot"):
        mod.load(comp_temporal=good["comp_temporal"], comp_conv=good["comp_conv"], src_slots=slots(1, 1),
                 temporal=good["temporal"], conv=good["conv"], dst_slots=slots(3, 3), unit_row=idx.unit_row)
    scratch = torch.zeros(c["NUM_LAYERS"], 2, c["HEADS"], c["DV"], c["DK"])
    mod.refresh_copy(scratch=scratch, temporal=good["temporal"].clone(), dst_slots=slots(1, 2), unit_row=idx.unit_row,
                     local_heads=idx.local_heads)
    with pytest.raises(ValueError, match="scratch must have shape"):
        mod.refresh_copy(scratch=scratch[:, :1], temporal=good["temporal"], dst_slots=slots(1, 2), unit_row=idx.unit_row,
                         local_heads=idx.local_heads)
    with pytest.raises(ValueError, match="slot 0 is reserved"):
        mod.refresh_copy(scratch=scratch, temporal=good["temporal"], dst_slots=slots(0, 2), unit_row=idx.unit_row,
                         local_heads=idx.local_heads)
    p = Pools(c, idx, int8=True)
    with pytest.raises(ValueError, match="comp_scale must have shape"):
        mod.pack_int8(temporal=p.temporal, conv=p.conv, src_slots=slots(1), comp_q=p.comp_q,
                      comp_scale=p.comp_scale[:, :-1], comp_conv=p.comp_conv, dst_slots=slots(1), unit_row=idx.unit_row,
                      kept_heads=idx.kept_heads)
    with pytest.raises(ValueError, match="comp_q must have dtype torch.int8"):
        mod.load_int8(comp_q=p.comp_q.float(), comp_scale=p.comp_scale, comp_conv=p.comp_conv, src_slots=slots(1),
                      temporal=p.temporal, conv=p.conv, dst_slots=slots(1), unit_row=idx.unit_row)


@pytest.mark.parametrize("kind", [GDN, KDA])
def test_strided_leading_axes_are_supported(interp, kind):
    """SGLang's envelope layout gives [L, S+1, ...] views with slot-major storage; they must work."""
    c = constants(kind, "tiled")
    mod = interp(c)
    idx, _ = index_for(c, seed=6)
    p = Pools(c, idx, seed=6)
    want = p.clone()
    temporal = p.temporal.transpose(0, 1).contiguous().transpose(0, 1)        # storage [S+1, L, H, dv, dk]
    conv = [p.conv[0].transpose(0, 1).contiguous().transpose(0, 1)]
    big = torch.full((p.comp.shape[0], 3) + p.comp.shape[1:], 7.0)
    comp = big[:, 1]                                                          # slot stride 3x the slot size
    assert not temporal.is_contiguous() and not comp.is_contiguous()
    mod.pack(temporal=temporal, conv=conv, src_slots=slots(3, 5), comp_temporal=comp, comp_conv=p.comp_conv,
             dst_slots=slots(4, 2), unit_row=idx.unit_row, kept_heads=idx.kept_heads)
    ref.pack(temporal=want.temporal, conv=want.conv, src_slots=slots(3, 5), comp_temporal=want.comp,
             comp_conv=want.comp_conv, dst_slots=slots(4, 2), unit_row=idx.unit_row, kept_heads=idx.kept_heads)
    assert_same(comp, want.comp)
    assert_same(p.comp_conv[0], want.comp_conv[0])
    mod.load(comp_temporal=comp, comp_conv=p.comp_conv, src_slots=slots(4), temporal=temporal, conv=conv,
             dst_slots=slots(1), unit_row=idx.unit_row)
    ref.load(comp_temporal=want.comp, comp_conv=want.comp_conv, src_slots=slots(4), temporal=want.temporal,
             conv=want.conv, dst_slots=slots(1), unit_row=idx.unit_row)
    assert_same(temporal, want.temporal)
    assert_same(conv[0], want.conv[0])


# ------------------------------------------------------------------ 64-bit offsets

_BIG_OFFSETS = textwrap.dedent("""
    import os, sys, torch
    os.environ["TRITON_INTERPRET"] = "1"
    from tests.kernels.test_kernels import constants, index_for, slots, assert_same, GDN, KDA
    from dasc_compile.kernels import render_kernel_module
    from dasc_runtime.kernel_loader import load_kernel_module
    from dasc_runtime import torch_kernels as ref
    for kind in (GDN, KDA):
        c = constants(kind, "tiled", dtype="bfloat16")
        name, src = render_kernel_module(c)
        open(os.path.join({tmp!r}, name), "w").write(src)
        mod = load_kernel_module({tmp!r}, name, interpret=True)
        idx, _ = index_for(c)
        L, H, dv, dk = c["NUM_LAYERS"], c["HEADS"], c["DV"], c["DK"]
        # layer stride 2^30 + 32 elements: layer 2 starts past 2^31 (an int32 layer * stride overflows);
        # ragged slot stride 2^29 + 64: slot 5 starts past 2^31. torch.empty leaves untouched pages unmapped.
        sl, ss = 2**30 + 32, 2**29 + 64
        temporal = torch.empty(2 * sl + 6 * H * dv * dk, dtype=torch.bfloat16).as_strided(
            (L, 6, H, dv, dk), (sl, H * dv * dk, dv * dk, dk, 1))
        unit = (dv, dk) if kind == GDN else (dv,)
        comp = torch.empty(5 * ss + idx.num_rows * dv * dk, dtype=torch.bfloat16).as_strided(
            (6, idx.num_rows) + unit, (ss,) + torch.empty((idx.num_rows,) + unit).stride())
        conv = [torch.randn(L, 6, *(c["CONV0_ROWS"], c["CONV0_COLS"])).bfloat16()]
        comp_conv = [torch.zeros(L, 6, c["CONV0_ROWS"], c["CONV0_COLS"]).bfloat16()]
        temporal[:, 4] = torch.randn(L, H, dv, dk).bfloat16()
        comp[5] = 0
        mod.pack(temporal=temporal, conv=conv, src_slots=slots(4), comp_temporal=comp, comp_conv=comp_conv,
                 dst_slots=slots(5), unit_row=idx.unit_row, kept_heads=idx.kept_heads)
        want = torch.zeros((idx.num_rows,) + unit).bfloat16()
        for j, (l, u) in enumerate(zip(idx.unit_layer.tolist(), idx.unit_index.tolist())):
            want[j] = temporal[l, 4, u] if kind == GDN else temporal[l, 4, u // dk, :, u % dk]
        assert_same(comp[5], want)
        temporal[:, 3] = 1
        mod.load(comp_temporal=comp, comp_conv=comp_conv, src_slots=slots(5), temporal=temporal, conv=conv,
                 dst_slots=slots(3), unit_row=idx.unit_row)
        keep = (idx.unit_row >= 0)
        mask = keep[:, :, None, None] if kind == GDN else keep.reshape(L, H, 1, dk)
        assert_same(temporal[:, 3], torch.where(mask, temporal[:, 4], torch.zeros((), dtype=torch.bfloat16)))
    print("ok")
""")


def test_offsets_past_2_pow_31_elements(tmp_path):
    """Pools whose layer and slot offsets pass 2^31 elements (run in a subprocess: a 32-bit
    overflow would be a wild pointer, which must not take the test session down)."""
    script = _BIG_OFFSETS.format(tmp=str(tmp_path))   # run at the root: tests.kernels.test_kernels imports
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          cwd=REPO)
    if proc.returncode != 0 and "can't allocate memory" in proc.stderr.lower():
        pytest.skip("not enough virtual memory for a 2^31-element view")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


# ------------------------------------------------------------------ compiler -> plan dir -> loader -> kernels

@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_compiled_plan_kernels_end_to_end(tmp_path, monkeypatch, kind):
    """``dasc compile`` writes the module beside plan.json; the loader finds it from plan.json alone."""
    from dasc_compile.compiler import compile_plan
    from dasc_compile.kernels import kernel_constants
    from dasc_compile.policy import Policy
    from dasc_runtime.rank_layout import build_state_index
    from dasc_runtime.kernel_loader import load_plan_kernels
    from tests.support.runtime_fixtures import (gdn_config, gdn_decay_tensors, kda_config, kda_decay_tensors,
                                                write_checkpoint)

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ckpt = tmp_path / "ckpt"
    if kind == "gdn":
        write_checkpoint(ckpt, gdn_config(), gdn_decay_tensors())
    else:
        write_checkpoint(ckpt, kda_config(), kda_decay_tensors())
    plan, plan_dir = compile_plan(ckpt, Policy(w_max=16, int8=True), tmp_path / "plan.dasc")
    assert plan.kernels is not None and (plan_dir / plan.kernels.file).is_file()
    c = kernel_constants(plan)
    assert plan.kernels.constants == c
    mod = load_plan_kernels(plan_dir, interpret=True)
    assert mod.KEY == plan.kernels.key
    idx = build_state_index(plan)
    p = Pools(c, idx, int8=True)
    want = p.clone()
    for impl, q in ((mod, p), (ref, want)):
        impl.pack_int8(temporal=q.temporal, conv=q.conv, src_slots=slots(2, 5), comp_q=q.comp_q,
                       comp_scale=q.comp_scale, comp_conv=q.comp_conv, dst_slots=slots(4, 1), unit_row=idx.unit_row,
                       kept_heads=idx.kept_heads)
        impl.load_int8(comp_q=q.comp_q, comp_scale=q.comp_scale, comp_conv=q.comp_conv, src_slots=slots(1),
                       temporal=q.temporal, conv=q.conv, dst_slots=slots(3), unit_row=idx.unit_row)
    for a, b in ((p.comp_q, want.comp_q), (p.comp_scale, want.comp_scale), (p.temporal, want.temporal),
                 (p.conv[0], want.conv[0])):
        assert_same(a, b)


# ------------------------------------------------------------------ benchmark script (CPU smoke run)

@pytest.mark.slow
def test_kernel_bench_smoke_run_writes_markdown(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.kernel_bench", "--smoke", "--no-sglang",
                           "--n", "1", "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert "## State-checkpoint kernels" in text and "Command: `python -m benchmarks.kernel_bench --smoke" in text
    assert "Triton interpreter" in text
    for op in ("pack", "load", "pack_int8", "load_int8"):
        for shape in ("tiny-gdn", "tiny-kda"):
            assert f"| {shape} | {op} | 1 |" in text


# ------------------------------------------------------------------ GPU (skip without CUDA)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture
def compiled(tmp_path_factory, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    root = tmp_path_factory.getbasetemp() / "gpu_kernels"
    root.mkdir(exist_ok=True)

    def get(c):
        name, src = render_kernel_module(c)
        (root / name).write_text(src)
        return load_kernel_module(root, name)

    return get


GPU_SHAPES = {
    # per-rank shapes of the paper's models at TP8 (H = 4), 6 layers to keep the test short
    "qwen3next-tp8": dict(num_layers=6, unit_kind=GDN, heads=4, dv=128, dk=128, conv_shapes=[(1024, 3)]),
    "kimi-tp8": dict(num_layers=6, unit_kind=KDA, heads=4, dv=128, dk=128, conv_shapes=[(3, 1536)]),
}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("shape", list(GPU_SHAPES))
@pytest.mark.parametrize("n", [1, 8])
def test_gpu_kernels_equal_reference(compiled, shape, n):
    c = make_constants(**GPU_SHAPES[shape], int8=True)
    mod = compiled(c)
    idx, _ = index_for(c, seed=n)
    idx = idx.to("cuda")
    p = Pools(c, idx, S=2 * n + 1, C=2 * n + 1, seed=n, device="cuda", int8=True)
    want = p.clone()
    src, dst = slots(*range(2, 2 * n + 2, 2), device="cuda"), slots(*range(n, 0, -1), device="cuda")
    for impl, q in ((mod, p), (ref, want)):
        impl.pack(temporal=q.temporal, conv=q.conv, src_slots=src, comp_temporal=q.comp, comp_conv=q.comp_conv,
                  dst_slots=dst, unit_row=idx.unit_row, kept_heads=idx.kept_heads)
        impl.pack_int8(temporal=q.temporal, conv=q.conv, src_slots=src, comp_q=q.comp_q, comp_scale=q.comp_scale,
                       comp_conv=q.comp_conv, dst_slots=dst, unit_row=idx.unit_row, kept_heads=idx.kept_heads)
    assert_same(p.comp, want.comp)
    assert_same(p.comp_q, want.comp_q)
    assert_same(p.comp_scale, want.comp_scale)
    back = slots(*range(3, 2 * n + 3, 2), device="cuda")
    for impl, q in ((mod, p), (ref, want)):
        impl.load(comp_temporal=q.comp, comp_conv=q.comp_conv, src_slots=dst, temporal=q.temporal, conv=q.conv,
                  dst_slots=back, unit_row=idx.unit_row)
        scratch = torch.randn(c["NUM_LAYERS"], n, c["HEADS"], c["DV"], c["DK"], device="cuda",
                              generator=torch.Generator("cuda").manual_seed(1))
        impl.refresh_copy(scratch=scratch, temporal=q.temporal, dst_slots=back, unit_row=idx.unit_row,
                          local_heads=idx.local_heads)
        impl.load_int8(comp_q=q.comp_q, comp_scale=q.comp_scale, comp_conv=q.comp_conv, src_slots=dst,
                       temporal=q.temporal, conv=q.conv, dst_slots=src, unit_row=idx.unit_row)
    torch.cuda.synchronize()
    assert_same(p.temporal, want.temporal)
    assert_same(p.conv[0], want.conv[0])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("kind", [GDN, KDA])
def test_gpu_reference_quantize_is_device_independent(kind):
    """Eq. 8 in the reference gives bit-identical q and s on CUDA and on the CPU (IEEE divisions)."""
    g = torch.Generator().manual_seed(3)
    units = torch.randn(64, 128, 128, generator=g) * torch.logspace(-3, 2, 128).reshape(-1, 1)
    if kind == KDA:
        units = units.transpose(-1, -2).reshape(-1, 128)
    q_cpu, s_cpu = ref.quantize_int8(units, scale_dtype=torch.float32, kind=kind)
    q_gpu, s_gpu = ref.quantize_int8(units.cuda(), scale_dtype=torch.float32, kind=kind)
    assert_same(s_gpu.cpu(), s_cpu)
    assert_same(q_gpu.cpu(), q_cpu)


@pytest.mark.gpu
@pytest.mark.slow
@needs_cuda
def test_gpu_qwen3next_pool_past_2_pow_31_elements(compiled):
    """A Qwen3-Next TP1 pool [36, 116, 32, 128, 128] FP32 has 2.19e9 elements (8.8 GB)."""
    c = make_constants(num_layers=36, unit_kind=GDN, heads=32, dv=128, dk=128, conv_shapes=[(8192, 3)])
    mod = compiled(c)
    idx, _ = index_for(c)
    idx = idx.to("cuda")
    temporal = torch.empty(36, 116, 32, 128, 128, device="cuda")
    assert temporal.numel() > 2**31
    temporal[:, 114:].normal_()
    conv = [torch.randn(36, 116, 8192, 3, device="cuda").bfloat16()]
    comp = torch.zeros(3, idx.num_rows, 128, 128, device="cuda")
    comp_conv = [torch.zeros(36, 3, 8192, 3, device="cuda").bfloat16()]
    mod.pack(temporal=temporal, conv=conv, src_slots=slots(115, device="cuda"), comp_temporal=comp,
             comp_conv=comp_conv, dst_slots=slots(2, device="cuda"), unit_row=idx.unit_row, kept_heads=idx.kept_heads)
    want = temporal[idx.unit_layer, 115, idx.unit_index]
    assert_same(comp[2], want)
    mod.load(comp_temporal=comp, comp_conv=comp_conv, src_slots=slots(2, device="cuda"), temporal=temporal, conv=conv,
             dst_slots=slots(114, device="cuda"), unit_row=idx.unit_row)
    keep = (idx.unit_row >= 0)[:, :, None, None]
    assert_same(temporal[:, 114], torch.where(keep, temporal[:, 115], torch.zeros((), device="cuda")))
