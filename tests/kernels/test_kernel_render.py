"""Kernel specialisation, rendering, cache keys, loading and index tensors (no kernel launches).

Launch tests live in tests/kernels/test_kernels.py. Plans come from the real compiler on the tiny checkpoints
of runtime_fixtures; conv / temporal shapes are checked against SGLang 0.5.17's own
``Mamba2StateShape`` / ``KimiLinearStateShape`` when SGLang imports.
"""

from __future__ import annotations

import re
import shutil
import sys

import jinja2
import hashlib

import pytest
import torch

from dasc_compile import kernels as K
from dasc_compile.errors import DascInputError
from dasc_compile.schema import KernelModule
from dasc_runtime import rank_layout
from dasc_runtime.kernel_loader import load_kernel_module, load_plan_kernels, module_name
from tests.support.runtime_fixtures import GDN_KEPT_W16, SGLANG_SKIP_REASON, compile_tiny

QWEN3_NEXT = dict(num_layers=36, unit_kind="gdn_head", heads=32, dv=128, dk=128, conv_shapes=[(8192, 3)])
KIMI_LINEAR = dict(num_layers=20, unit_kind="kda_column", heads=32, dv=128, dk=128, conv_shapes=[(3, 12288)])


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plans")
    return {
        "gdn": compile_tiny(tmp, "gdn")[0],
        "gdn_tp2": compile_tiny(tmp, "gdn", tp_size=2)[0],
        "kda": compile_tiny(tmp, "kda", int8=True)[0],
        "kda_tp2": compile_tiny(tmp, "kda", tp_size=2)[0],
    }


# ------------------------------------------------------------------ constants from a plan

def test_constants_gdn_plan_follow_the_model(plans):
    c = K.kernel_constants(plans["gdn"])
    # tiny qwen3_next: 3 GDN layers, 4 value heads, d = 16, conv (2*2*16 + 4*16, K-1) = (128, 3)
    assert (c["NUM_LAYERS"], c["UNIT_KIND"], c["HEADS"], c["DV"], c["DK"]) == (3, "gdn_head", 4, 16, 16)
    assert (c["UNITS_PER_HEAD"], c["NUM_CONV"], c["CONV0_ROWS"], c["CONV0_COLS"]) == (1, 1, 128, 3)
    assert (c["TEMPORAL_DTYPE"], c["CONV_DTYPE"], c["SCALE_DTYPE"], c["INT8"]) == ("float32", "bfloat16", "float32", False)
    # per-rank heads: the conv channels split with them
    c2 = K.kernel_constants(plans["gdn"], tp_rank_heads=2)
    assert (c2["HEADS"], c2["CONV0_ROWS"], c2["CONV0_COLS"]) == (2, 64, 3)
    assert K.kernel_constants(plans["gdn_tp2"]) == c2


def test_constants_kda_plan_conv_is_transposed(plans):
    c = K.kernel_constants(plans["kda"])
    # tiny kimi_linear: 3 KDA layers, 2 heads, d = 8 -> units per head 8, conv (K-1, 3*H*d) = (3, 48)
    assert (c["NUM_LAYERS"], c["UNIT_KIND"], c["HEADS"], c["DV"], c["DK"], c["UNITS_PER_HEAD"]) == \
        (3, "kda_column", 2, 8, 8, 8)
    assert (c["CONV0_ROWS"], c["CONV0_COLS"], c["INT8"]) == (3, 48, True)
    assert K.kernel_constants(plans["kda_tp2"])["CONV0_COLS"] == 24


@pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang")
@pytest.mark.parametrize("kind,tp", [("gdn", 1), ("gdn", 2), ("kda", 1), ("kda", 2)])
def test_constants_match_sglang_state_shapes(plans, kind, tp):
    from tests.support.runtime_fixtures import gdn_cache_params, kda_cache_params

    shape = (gdn_cache_params(tp) if kind == "gdn" else kda_cache_params(tp)).shape
    c = K.kernel_constants(plans[kind], tp_rank_heads=plans[kind].model.num_value_heads // tp)
    assert [(c["CONV0_ROWS"], c["CONV0_COLS"])] == [tuple(s) for s in shape.conv]
    assert (c["HEADS"], c["DV"], c["DK"]) == tuple(shape.temporal)


def test_constants_reject_bad_heads(plans):
    with pytest.raises(DascInputError, match="tp_rank_heads must divide"):
        K.kernel_constants(plans["gdn"], tp_rank_heads=3)


def test_make_constants_block_sizes():
    c = K.make_constants(**QWEN3_NEXT)
    # copy tiles: full dk rows (128) x 32 dv rows = 4096 elements; INT8 tiles: all dv x 32 k
    assert (c["BLOCK_V"], c["BLOCK_K"], c["Q_BLOCK_V"], c["Q_BLOCK_K"], c["BLOCK_C"]) == (32, 128, 128, 32, 4096)
    odd = K.make_constants(num_layers=2, unit_kind="kda_column", heads=1, dv=3, dk=5, conv_shapes=[(3, 4)], tile=16)
    assert (odd["BLOCK_V"], odd["BLOCK_K"], odd["Q_BLOCK_V"], odd["Q_BLOCK_K"], odd["BLOCK_C"]) == (2, 8, 4, 4, 16)
    for bad in (dict(unit_kind="head"), dict(dv=0), dict(temporal_dtype="float64"), dict(tile=12),
                dict(conv_shapes=[(3,)])):
        with pytest.raises(DascInputError):
            K.make_constants(**{**QWEN3_NEXT, **bad})


# ------------------------------------------------------------------ rendering and keys

def test_render_is_deterministic_and_keyed():
    c = K.make_constants(**KIMI_LINEAR, int8=True)
    name1, src1 = K.render_kernel_module(c)
    name2, src2 = K.render_kernel_module(dict(c))
    assert (name1, src1) == (name2, src2)
    key = K.kernel_key(c)
    assert name1 == f"dasc_kernels_{key[:16]}.py" and len(key) == 64
    assert f'KEY = "{key}"' in src1
    other = K.render_kernel_module({**c, "NUM_WARPS": 4})[0]
    assert other != name1
    for op in ("def pack(", "def load(", "def refresh_copy(", "def pack_int8(", "def load_int8("):
        assert op in src1
    assert "NUM_LAYERS = tl.constexpr(20)" in src1 and "CONV0_NUMEL = tl.constexpr(36864)" in src1
    # every constant value lands in the module's CONSTANTS record
    assert "'UNIT_KIND': 'kda_column'" in src1


def test_int8_off_renders_no_int8_ops():
    name, src = K.render_kernel_module(K.make_constants(**QWEN3_NEXT))
    assert "def pack_int8(" not in src and "OPS = ['pack', 'load', 'refresh_copy']" in src
    assert K.kernel_ops(K.make_constants(**QWEN3_NEXT, int8=True))[-2:] == ["pack_int8", "load_int8"]


def test_missing_constant_fails_at_render_time():
    c = K.make_constants(**QWEN3_NEXT)
    del c["BLOCK_K"]
    with pytest.raises(jinja2.UndefinedError, match="BLOCK_K"):
        K.render_kernel_module(c)


def test_changed_template_gives_new_key(tmp_path, monkeypatch):
    c = K.make_constants(**QWEN3_NEXT)
    before = K.kernel_key(c)
    copy = tmp_path / "templates"
    shutil.copytree(K._template_dir(), copy)
    monkeypatch.setattr(K, "_template_dir", lambda: copy)
    assert K.kernel_key(c) == before
    (copy / "load.py.jinja").write_text((copy / "load.py.jinja").read_text() + "\n# changed\n")
    assert K.kernel_key(c) != before
    (copy / "load.py.jinja").write_text((K.TEMPLATE_DIR / "load.py.jinja").read_text())
    (copy / "checks.py").write_text((copy / "checks.py").read_text() + "\n# changed\n")
    assert K.kernel_key(c) != before


@pytest.mark.parametrize("shape", [QWEN3_NEXT, KIMI_LINEAR], ids=["gdn", "kda"])
def test_kernels_use_no_jit_helpers_of_triton_language(shape):
    """tl.max / tl.zeros / ... are @jit functions that only run under the interpreter when
    TRITON_INTERPRET=1 preceded the first triton import; the kernels must not depend on that."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    _, src = K.render_kernel_module(K.make_constants(**shape, int8=True))
    code = "\n".join(line.split("#", 1)[0] for line in src.splitlines())
    used = set(re.findall(r"\btl\.([A-Za-z_]\w*)", code))
    assert {"reduce", "load", "store"} <= used
    assert not [n for n in used if isinstance(getattr(tl, n, None), JITFunction)]


@pytest.mark.parametrize("shape", [QWEN3_NEXT, KIMI_LINEAR], ids=["gdn", "kda"])
def test_kernels_read_no_module_globals(tmp_path, shape):
    """Triton re-checks every module global a kernel reads on each launch (Python, ~1 us each):
    the kernels declare their constants as local constexprs instead, so that list stays empty."""
    from triton.runtime.jit import JITFunction

    name, src = K.render_kernel_module(K.make_constants(**shape, int8=True))
    (tmp_path / name).write_text(src)
    mod = load_kernel_module(tmp_path, name)
    kernels = [v for v in vars(mod).values() if isinstance(v, JITFunction)]
    assert {"pack_kernel", "load_kernel", "refresh_copy_kernel", "pack_int8_kernel", "load_int8_kernel",
            "_conv_tile_copy"} <= {k.__name__ for k in kernels}
    for k in kernels:
        assert k.cache_key and not k.used_global_vals, (k.__name__, sorted(n for n, _ in k.used_global_vals))
    assert mod.TILES_PER_HEAD.value == 4 and mod.HEADS.value == shape["heads"]


def test_checks_module_has_no_jinja_delimiters():
    text = (K._template_dir() / "checks.py").read_text()
    assert not re.search(r"\{\{|\{%|\{#", text)
    assert not re.search(r"^from __future__", text, re.M)


def test_kernel_module_entry_round_trip():
    c = K.make_constants(**QWEN3_NEXT, int8=True)
    name, _ = K.render_kernel_module(c)
    entry = K.kernel_module_entry(c, name)
    assert entry.key == K.kernel_key(c) and entry.file == name
    assert entry.ops == ["pack", "load", "refresh_copy", "pack_int8", "load_int8"]
    again = KernelModule.model_validate_json(entry.model_dump_json())
    assert again.constants == c and again.constants["INT8"] is True
    with pytest.raises(ValueError, match="file_name must be"):
        K.kernel_module_entry(c, "dasc_kernels_0000000000000000.py")


# ------------------------------------------------------------------ loader

def test_loader_imports_once_per_key_and_checks_key(tmp_path):
    c = K.make_constants(**QWEN3_NEXT)
    name, src = K.render_kernel_module(c)
    (tmp_path / name).write_text(src)
    entry = K.kernel_module_entry(c, name)
    mod = load_plan_kernels(tmp_path, entry)
    assert mod.KEY == entry.key and mod.CONSTANTS == c and callable(mod.pack)
    assert load_kernel_module(tmp_path, name) is mod
    assert sys.modules[module_name(entry.key)] is mod
    assert type(mod.pack_kernel).__name__ == "JITFunction"
    interp = load_kernel_module(tmp_path, name, interpret=True)
    assert interp is not mod and type(interp.pack_kernel).__name__ == "InterpretedFunction"
    with pytest.raises(DascInputError, match="does not match"):
        load_kernel_module(tmp_path, name, key="f" * 64)
    with pytest.raises(DascInputError, match="not found"):
        load_kernel_module(tmp_path, "dasc_kernels_missing.py")
    with pytest.raises(DascInputError, match="lacks op"):
        load_kernel_module(tmp_path, name, ops=["pack_int8"])
    (tmp_path / "other.py").write_text("x = 1\n")
    with pytest.raises(DascInputError, match="not a dasc kernel module"):
        load_kernel_module(tmp_path, "other.py")


# ------------------------------------------------------------------ index tensors

def test_state_index_gdn_plan_hand_computed(plans):
    idx = rank_layout.build_state_index(plans["gdn"])
    # runtime_fixtures: W_max = 16 keeps heads {0, 1} / {0, 3} / {0, 1, 2}
    assert [sorted(l.kept_units) for l in plans["gdn"].layers] == GDN_KEPT_W16
    assert idx.unit_layer.tolist() == [0, 0, 1, 1, 2, 2, 2]
    assert idx.unit_index.tolist() == [0, 1, 0, 3, 0, 1, 2]
    assert idx.offsets.tolist() == [0, 2, 4, 7]
    assert idx.unit_row.tolist() == [[0, 1, -1, -1], [2, -1, -1, 3], [4, 5, 6, -1]]
    assert idx.num_rows == 7 and idx.scale_shape == (7, 16)
    # work lists (flat l * H + h): heads with a kept unit for pack, with a local unit for refresh
    assert idx.kept_heads.tolist() == [0, 1, 4, 7, 8, 9, 10]
    assert idx.local_heads.tolist() == [2, 3, 5, 6, 11]
    # INT8 scales of a GDN row: one per k of the kept head
    assert idx.scale_lhk.shape == (7 * 16, 3)
    assert idx.scale_lhk[16 * 3 + 5].tolist() == [1, 3, 5]


def test_state_index_tp_rank_is_rank_local(plans):
    # TP=2: rank 1 holds heads {2, 3}: layer 0 keeps none, layer 1 keeps head 3 -> local 1, layer 2 head 2 -> 0
    idx = rank_layout.build_state_index(plans["gdn_tp2"], tp_rank=1)
    assert idx.unit_row.tolist() == [[-1, -1], [-1, 0], [1, -1]]
    assert idx.offsets.tolist() == [0, 0, 1, 2]
    with pytest.raises(DascInputError, match="tp_rank"):
        rank_layout.build_state_index(plans["gdn_tp2"], tp_rank=2)


def test_state_index_kda_columns():
    idx = rank_layout.state_index_from_kept([[9, 0, 7], [], [15]], heads=2, unit_kind="kda_column", dk=8)
    assert idx.unit_layer.tolist() == [0, 0, 0, 2] and idx.unit_index.tolist() == [0, 7, 9, 15]
    assert idx.offsets.tolist() == [0, 3, 3, 4]
    row = idx.unit_row
    assert row.shape == (3, 16) and row[0, 9].item() == 2 and row[2, 15].item() == 3
    assert int((row >= 0).sum()) == 4
    assert idx.kept_heads.tolist() == [0, 1, 5] and idx.local_heads.tolist() == [0, 1, 2, 3, 4, 5]
    # KDA scale per kept column: (layer, head, k) = (0, 1, 1) for unit 9
    assert idx.scale_shape == (4,) and idx.scale_lhk.tolist() == [[0, 0, 0], [0, 0, 7], [0, 1, 1], [2, 1, 7]]
    with pytest.raises(DascInputError, match="must lie in"):
        rank_layout.state_index_from_kept([[16]], heads=2, unit_kind="kda_column", dk=8)
    with pytest.raises(DascInputError, match="repeats"):
        rank_layout.state_index_from_kept([[1, 1]], heads=2, unit_kind="kda_column", dk=8)


def test_ragged_pool_shapes():
    c = K.make_constants(**KIMI_LINEAR, int8=True)
    shapes = rank_layout.ragged_pool_shapes(c, num_slots=10, num_rows=1000)
    assert shapes == {"comp_q": ((11, 1000, 128), "int8"), "comp_scale": ((11, 1000), "float32"),
                      "comp_conv0": ((20, 11, 3, 12288), "bfloat16")}
    g = rank_layout.ragged_pool_shapes(K.make_constants(**QWEN3_NEXT), num_slots=3, num_rows=7)
    assert g["comp_temporal"] == ((4, 7, 128, 128), "float32")


# ------------------------------------------------------------------ compile for the H200 (no GPU needed)

def _ptx(fn, types, num_warps=8):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import triton

    assert len(types) == len(fn.arg_names), (fn.arg_names, types)
    sig = dict(zip(fn.arg_names, types))
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(types))}
    compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs={}, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    return compiled.asm["ptx"]


@pytest.mark.slow
@pytest.mark.parametrize("shape", [QWEN3_NEXT, KIMI_LINEAR], ids=["qwen3next", "kimi"])
def test_real_shapes_compile_for_sm90(tmp_path, shape):
    """Ahead-of-time compile every kernel for sm_90 with Triton's bundled ptxas (CPU only)."""
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception as exc:  # pragma: no cover - depends on the triton build
        pytest.skip(f"triton has no CUDA backend here: {exc}")
    c = K.make_constants(**shape, int8=True)
    name, src = K.render_kernel_module(c)
    (tmp_path / name).write_text(src)
    mod = load_kernel_module(tmp_path, name)
    conv = ["*bf16", "*bf16", "i64", "i32", "i64", "i32"]
    slots_strides = ["*i64", "*i64", "i64", "i32", "i32"]
    ptx = {
        # (pointers..., unit_row, [head list], src_slots, dst_slots, [n_temporal_tiles], strides..., conv...)
        "pack": _ptx(mod.pack_kernel, ["*fp32", "*fp32", "*i64", "*i64", "*i64", "*i64", "i32", "i64", "i32", "i32"] + conv),
        "load": _ptx(mod.load_kernel, ["*fp32", "*fp32"] + ["*i64"] + slots_strides + conv),
        "refresh_copy": _ptx(mod.refresh_copy_kernel,
                             ["*fp32", "*fp32", "*i64", "*i64", "*i64", "i64", "i32", "i64", "i32"]),
        "pack_int8": _ptx(mod.pack_int8_kernel, ["*fp32", "*i8", "*fp32", "*i64", "*i64", "*i64", "*i64", "i32",
                                                 "i64", "i32", "i32", "i32"] + conv),
        "load_int8": _ptx(mod.load_int8_kernel, ["*i8", "*fp32", "*fp32", "*i64", "*i64", "*i64", "i64", "i32", "i32",
                                                 "i32"] + conv),
    }
    # dense-side accesses are 128-bit vectors (loads for pack, stores for load)
    assert re.search(r"st\.global\.v4", ptx["load"]) and re.search(r"ld\.global\.v4", ptx["load"])
    assert re.search(r"st\.global\.v4", ptx["pack"])
    if shape is KIMI_LINEAR:   # KDA pack reads whole tiles of kept columns with 128-bit vectors
        assert re.search(r"ld\.global\.v4", ptx["pack"]) and re.search(r"ld\.global\.v4", ptx["pack_int8"])
    # Eq. 8 uses IEEE division (round to nearest, never div.approx / div.full) and the round-half-even constant
    # 1.5 * 2^23 survives compilation. Triton 3.5 (torch 2.9, the floor) emits div.rn.ftz.f32, later releases
    # div.rn.f32: flushing subnormals cannot change q here, since the divisor s >= 1e-8 / 127 is normal and a
    # subnormal |S| gives |S| / s < 2^-126 / 7.9e-11 ~ 1.5e-28, which rounds to q = 0 flushed or not.
    divs = set(re.findall(r"\bdiv\.[a-z0-9.]*f32\b", ptx["pack_int8"]))
    assert divs and divs <= {"div.rn.f32", "div.rn.ftz.f32"}, divs
    assert "0f4B400000" in ptx["pack_int8"]


def test_edited_kernel_module_is_refused(tmp_path):
    """plan.json records the rendered file's sha256; an edit that keeps the KEY line is still refused."""
    from dasc_compile.compiler import compile_plan
    from dasc_compile.policy import Policy
    from dasc_compile.refckpt import write_decay_only
    from dasc_compile.schema import DascInputError
    from dasc_runtime.kernel_loader import load_plan_kernels

    ck = write_decay_only("kimi-linear-48b-a3b", tmp_path / "ck")
    plan, out = compile_plan(ck, Policy(w_max=16), tmp_path / "p")
    path = out / plan.kernels.file
    assert hashlib.sha256(path.read_bytes()).hexdigest() == plan.kernels.source_sha256
    path.write_text(path.read_text(encoding="utf-8") + "\n# harmless-looking edit\n", encoding="utf-8")
    with pytest.raises(DascInputError, match="it was edited"):
        load_plan_kernels(out)


def test_checks_whole_head_kinds_mirror_the_unit_kinds():
    """templates/checks.py imports nothing from dasc; its copy of the whole-head kinds must match the schema's."""
    from dasc_compile.schema.units import UNIT_KINDS
    from dasc_templates.checks import WHOLE_HEAD_KINDS

    assert set(WHOLE_HEAD_KINDS) == {k.name for k in UNIT_KINDS.values() if k.whole_head}
