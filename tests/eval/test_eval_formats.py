"""The checkpoints transformers' own save_pretrained writes (what the trained references are) are read by
dasc compile: a kimi_linear config without ``linear_attn_config``, decays under ``self_attn.``."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.support.tiny_models import compile_for

pytestmark = pytest.mark.transformers_range


def test_compile_reads_transformers_kimi_linear(kda_dir, tmp_path):
    from safetensors.torch import load_file

    from dasc_compile.schema import load_plan

    cfg = json.loads((kda_dir / "config.json").read_text())
    assert "linear_attn_config" not in cfg and cfg["linear_num_heads"] == 2 and cfg["linear_head_dim"] == 8
    plan = load_plan(compile_for(kda_dir, 64, tmp_path / "p.dasc"), verify_kernels=False)
    assert plan.model.recurrent_layer_ids == [0, 2]
    st = load_file(str(kda_dir / "model.safetensors"))
    for lp in plan.layers:
        a = st[f"model.layers.{lp.layer_id}.self_attn.A_log"].reshape(2, 1).double()
        dt = st[f"model.layers.{lp.layer_id}.self_attn.dt_bias"].reshape(2, 8).double()
        g = -a.exp() * torch.nn.functional.softplus(-0.3 + dt)             # Eq. 2, a_s = -0.3
        h = (math.log(1e-3) / g).reshape(-1)                                 # Eq. 3, unit u = h * 8 + k
        assert list(lp.kept_units) == [u for u in range(16) if h[u] > 64]
    assert 0 < plan.totals.n_kept < plan.totals.n_units
