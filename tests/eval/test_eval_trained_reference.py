"""The bundled trained KDA hybrid (plans/reference/kda-hybrid-3m-sharegpt, trained on the H200 by
benchmarks/train_hybrid.py, run through transformers' KDA layer by dasc_compile.eval.legacy_kda): its
provenance reads as trained, and decay-aware selection costs less than count-matched Random (H200 run:
KL 0.0046 vs 0.032 +- 0.005 at w_max 128). Below transformers 5.17 (no KDA layer) the model is refused
in one line. The reference is bundled (tracked in git), so a missing file fails these tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from dasc_compile.eval.hf_compat import MIN_TRANSFORMERS_KDA, transformers_version
from tests.support.tiny_models import compile_for

pytestmark = pytest.mark.transformers_range

REF = Path(__file__).resolve().parents[2] / "plans" / "reference" / "kda-hybrid-3m-sharegpt"
HAS_KDA = transformers_version() >= MIN_TRANSFORMERS_KDA


@pytest.mark.skipif(not HAS_KDA, reason="transformers < 5.17 has no KDA layer")
def test_trained_reference_nr_beats_random(tmp_path):
    from dasc_compile.eval.command import run_eval
    from dasc_compile.provenance import provenance_kind
    from dasc_compile.schema import load_plan

    path = compile_for(REF, 128, tmp_path / "w128.dasc")
    plan = load_plan(path, verify_kernels=False)
    assert provenance_kind(plan.model.provenance) == "trained"
    assert 0 < plan.totals.n_kept < plan.totals.n_units
    doc = run_eval(REF, [path], retrieval=2, arms="dense,nr,random", prefix_len=256, progress=False)
    nr, rnd = doc["arms"]["nr"], doc["arms"]["random"]
    assert nr["kl"] < rnd["kl"]["mean"] - rnd["kl"]["sd"]


@pytest.mark.skipif(HAS_KDA, reason="transformers >= 5.17 runs KDA models")
def test_kda_below_5_17_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from dasc_compile.cli import app

    path = compile_for(REF, 128, tmp_path / "w128.dasc")
    r = CliRunner().invoke(app, ["eval", str(REF), "--plan", str(path)])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert "needs transformers >= 5.17" in lines[0] and "pip install 'transformers>=5.17'" in lines[0]
    assert "setup_env.sh .venv-newest --newest" in lines[0]    # not an upgrade inside SGLang 0.5.17's environment
