"""Store / load through the ops alone (paper §4.1-4.2): the ops need the rank layout, SGLang's cache
and the pool's tensors, never the pool object (the dependency runs pool -> ops only)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.support.runtime_fixtures import GDN_D, GDN_KEPT_W16, compile_tiny

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


def test_ops_do_not_import_the_pool():
    tree = ast.parse((RUNTIME / "ops.py").read_text())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "dasc_runtime.pool" not in mods and not any("mamba_component" in (m or "") for m in mods)


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
def test_torch_ops_store_load_on_bare_tensors(tmp_path, int8):
    from dasc_runtime.ops import CheckpointTensors, TorchOps
    from dasc_runtime.rank_layout import build_rank_layout

    plan, _, _ = compile_tiny(tmp_path, int8=int8)
    lay = build_rank_layout(plan, 0, 1, 3)
    g = torch.Generator().manual_seed(5)
    temporal = torch.randn((3, 6, 4, GDN_D, GDN_D), generator=g)                 # [L, M+1, H, d_v, d_k]
    conv = [torch.randn((3, 6, 64, 3), generator=g).to(torch.bfloat16)]
    cache = SimpleNamespace(temporal=temporal, conv=conv)
    ckpt = CheckpointTensors(
        temporal=torch.zeros((4, lay.width, *lay.unit_shape), dtype=torch.int8 if int8 else torch.float32),
        scale=torch.zeros((4, lay.width, *lay.scale_shape)) if int8 else None,
        conv=[torch.zeros((3, 4, 64, 3), dtype=torch.bfloat16)])
    ops, rows = TorchOps(), torch.tensor([1, 3])
    ops.store(lay, cache, torch.tensor([2, 5]), rows, ckpt)
    # row 1 holds native slot 2's kept heads in ragged order (layer by layer, heads ascending)
    want = torch.stack([temporal[l, 2, h] for l, kept in enumerate(GDN_KEPT_W16) for h in kept])
    if int8:
        q, s = ops.quantize(lay, want.unsqueeze(0))
        assert torch.equal(ckpt.temporal[1], q[0]) and torch.equal(ckpt.scale[1], s[0])
        want = ops.dequantize(lay, q, s)[0]
    else:
        assert torch.equal(ckpt.temporal[1], want)
    assert torch.count_nonzero(ckpt.temporal[2]) == 0 and torch.equal(ckpt.conv[0][:, 3], conv[0][:, 5])
    ops.load(lay, cache, rows[:1], torch.tensor([4]), ckpt)                      # dasc-nr into native slot 4
    got = temporal[:, 4]
    for l, kept in enumerate(GDN_KEPT_W16):
        for h in range(4):
            assert torch.equal(got[l, h], want[kept.index(h) + sum(map(len, GDN_KEPT_W16[:l]))] if h in kept
                               else torch.zeros_like(got[l, h]))
    assert torch.equal(conv[0][:, 4], conv[0][:, 2])


def test_dasc_ops_env_is_checked(monkeypatch, tmp_path):
    from dasc_compile.schema import DascInputError
    from dasc_runtime.ops import TorchOps, select_ops
    from dasc_runtime.rank_layout import build_rank_layout

    plan, pdir, _ = compile_tiny(tmp_path)
    lay = build_rank_layout(plan, 0, 1, 3)
    monkeypatch.setenv("DASC_OPS", "torch")
    assert type(select_ops(plan, pdir, lay, "cpu", interpret=True)) is TorchOps
    monkeypatch.setenv("DASC_OPS", "reference")
    with pytest.raises(DascInputError, match="DASC_OPS: expected 'auto' or 'torch', got 'reference'"):
        select_ops(plan, pdir, lay, "cpu")
