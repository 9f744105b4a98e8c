"""The H200 Mamba2 smoke (benchmarks/h200/mamba2_smoke.sh) checked on a CPU as far as a CPU can: its config
is read by SGLang 0.5.17's own NemotronHConfig into the state the plans were compiled for, its decay-only
checkpoint gives the plans the script announces, and the script parses."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.runtime_fixtures import SGLANG_SKIP_REASON

ROOT = Path(__file__).resolve().parents[2]
CFG = ROOT / "benchmarks" / "h200" / "sglang" / "nemotronh-tiny.config.json"


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    from benchmarks.h200.mamba2_smoke_model import write
    from dasc_compile.compiler import compile_plan
    from dasc_compile.policy import Policy

    d = tmp_path_factory.mktemp("m2smoke")
    ckpt = write(str(CFG), str(d / "nemo"))
    other = write(str(CFG), str(d / "other"), shift=1)
    out = {w: compile_plan(ckpt, Policy(w_max=w), d / f"w{w}.dasc", with_kernels=False)[0] for w in (0, 16)}
    out["other"] = compile_plan(other, Policy(w_max=16), d / "other.dasc", with_kernels=False)[0]
    return out


def test_smoke_plans_keep_what_the_script_says(plans):
    assert plans[16].totals.n_kept == 32 and plans[0].totals.n_kept == 64 and plans[16].totals.n_units == 64
    assert all(lp.n_kept == 8 for lp in plans[16].layers)
    assert plans["other"].fingerprint.decay_sha256 != plans[16].fingerprint.decay_sha256


@pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")
def test_sglang_reads_the_smoke_config_into_the_plans_state(plans, monkeypatch):
    import sglang.srt.configs.nemotron_h as nh

    from dasc_runtime.verify import check_state

    monkeypatch.setattr(nh, "get_parallel", lambda: SimpleNamespace(attn_tp_size=1))
    raw = json.loads(CFG.read_text())
    cfg = nh.NemotronHConfig(**{k: v for k, v in raw.items() if k != "architectures"})
    plan = plans[16]
    assert list(cfg.mamba_layer_ids) == plan.model.recurrent_layer_ids == [0, 2, 4, 6]
    # SGLang sizes the state with n_groups and builds MambaMixer2 with mamba_n_groups: both must be the plan's
    assert cfg.n_groups == cfg.mamba_n_groups == plan.model.conv_groups == 8
    cp = cfg.mamba2_cache_params
    assert cp.shape.temporal == (16, 64, 128) and cp.shape.conv == [(16 * 64 + 2 * 8 * 128, 3)]
    check_state(plan, layer_ids=cp.layers, temporal_shape=cp.shape.temporal, conv_shapes=cp.shape.conv,
                temporal_dtype=cp.dtype.temporal, conv_dtype=cp.dtype.conv, tp_rank=0, tp_size=1)


def test_smoke_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "h200" / "mamba2_smoke.sh")], check=True)
