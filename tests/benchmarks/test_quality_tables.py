"""benchmarks/quality_tables.py: issue 20's tables and figure from real dasc eval outputs (tiny GDN model
with the controls), and its target checks on hand-made rows."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from benchmarks.quality_tables import HEAD_METRIC, _paired, main, targets  # noqa: E402
from tests.support.tiny_models import compile_for, write_gdn  # noqa: E402

pytestmark = pytest.mark.transformers_range


def _row(**kw):
    base = {"w_max": 16, f"{HEAD_METRIC}.nr": 0.10, f"{HEAD_METRIC}.random": 0.50, f"{HEAD_METRIC}.random_sd": 0.10,
            f"{HEAD_METRIC}.init": 0.20, f"{HEAD_METRIC}.wr": 0.04, "retrieval_acc_far.dense": 0.95,
            "retrieval_acc_far.nr": 0.91}
    base.update(kw)
    return base


def test_targets_hand_cases():
    t = targets(_row(), 0.7)
    assert t == {"nr_below_random_2sd": True, "nr_below_init": True, "dense_retrieval_ge_0.9": True,
                 "nr_retrieval_within_0.05": True, "wr_closes_half_gap": True, "jaccard_64_le_0.8": True}
    # 0.10 is not below 0.28 - 2 * 0.10 = 0.08; wr 0.06 > half of 0.10; retrieval 0.89 < 0.95 - 0.05
    t = targets(_row(**{f"{HEAD_METRIC}.random": 0.28, f"{HEAD_METRIC}.wr": 0.06, "retrieval_acc_far.nr": 0.89}), 0.85)
    assert (t["nr_below_random_2sd"], t["wr_closes_half_gap"], t["nr_retrieval_within_0.05"], t["jaccard_64_le_0.8"]) \
        == (False, False, False, False)
    assert targets(_row(w_max=64), None)["nr_retrieval_within_0.05"] is None     # checked at w_max 16 only
    # a dense that does not retrieve leaves nothing to be within 0.05 of: no verdict, not a pass
    t = targets(_row(**{"retrieval_acc_far.dense": 0.0, "retrieval_acc_far.nr": 0.0}), None)
    assert t["dense_retrieval_ge_0.9"] is False and t["nr_retrieval_within_0.05"] is None
    assert targets(_row(**{f"{HEAD_METRIC}.init": None}), None)["nr_below_init"] is None


def test_paired_cell_hand_cases():
    assert _paired({"mean": -0.02, "sd": 0.05, "se": 0.0079, "n": 40, "frac_nr_lower": 0.7, "frac_tied": 0.0}) \
        == "-0.0200 ± 0.0500 (28/40)"
    assert _paired({"mean": 0.0, "sd": 0.0, "se": 0.0, "n": 6, "frac_nr_lower": 0.0, "frac_tied": 1.0}) \
        == "+0.0000 ± 0.0000 (0/6, 6 tied)"
    assert _paired(None) == "-" and _paired({"n": 0}) == "-"


def test_tables_and_figure_from_real_runs(tmp_path):
    import torch

    from dasc_compile.eval.run import run_eval, run_horizons, write_json

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        d = write_gdn(tmp_path / "gdn")           # A_log set by hand after transformers' seed-0 initialisation
        plans = [compile_for(d, w, tmp_path / f"w{w}.dasc") for w in (1, 4)]
        doc = run_eval(d, plans, retrieval=2, arms="dense,nr,wr,random,init,untrained", prefix_len=80,
                       init_seed=0, progress=False)
        hdoc = run_horizons(d, retrieval=2, prefix_len=80, init_seed=0, progress=False)
    finally:
        torch.set_num_threads(threads)
    write_json(doc, tmp_path / "e.json")
    write_json(hdoc, tmp_path / "h.json")
    assert main(["--eval", str(tmp_path / "e.json"), "--horizons", str(tmp_path / "h.json"), "--out", str(tmp_path / "q")]) == 0
    md = (tmp_path / "q" / "quality.md").read_text()
    got = json.loads((tmp_path / "q" / "quality.json").read_text())["gdn"]
    rows = got["runs"]["80"]["rows"]
    assert [r["w_max"] for r in rows] == [1, 4]
    nr = doc["plans"][1]["arms"]["nr"][HEAD_METRIC]
    assert rows[1][f"{HEAD_METRIC}.nr"] == pytest.approx(nr) and f"| {nr:.4f} |" in md
    assert rows[1][f"{HEAD_METRIC}.untrained_nr"] == pytest.approx(doc["plans"][1]["untrained"]["nr"][HEAD_METRIC])
    assert got["drift"]["spearman_per_layer"] == pytest.approx(doc["init"]["drift"]["spearman_per_layer"])
    assert set(got["table_1b"]) == {"trained", "untrained"}
    assert "Table 1(b)" in md and "| untrained |" in md and "Jaccard" in md
    assert (tmp_path / "q" / "quality.png").stat().st_size > 5000
    # the paired differences over prompts: nr - init on the first 16 tokens, with its SD and n
    d = doc["plans"][1]["paired"]["nr_minus_init"][HEAD_METRIC]
    assert rows[1][f"{HEAD_METRIC}.nr_minus_init"]["mean"] == pytest.approx(d["mean"])
    assert "Paired over prompts" in md
    tied = round(d["frac_tied"] * d["n"])
    assert (f"| 4 | {d['mean']:+.4f} ± {d['sd']:.4f} ({round(d['frac_nr_lower'] * d['n'])}/{d['n']}"
            f"{f', {tied} tied' if tied else ''}) |") in md

    # the same runs gzipped (how benchmarks/results keeps them): the same tables
    import gzip
    for n in ("e", "h"):
        (tmp_path / f"{n}.json.gz").write_bytes(gzip.compress((tmp_path / f"{n}.json").read_bytes()))
    assert main(["--eval", str(tmp_path / "e.json.gz"), "--horizons", str(tmp_path / "h.json.gz"),
                 "--out", str(tmp_path / "qz")]) == 0
    assert (tmp_path / "qz" / "quality.md").read_text() == md

    # a run written before per-prompt values (dasc eval JSON version 2): the same tables, no paired one
    old = {k: v for k, v in doc.items()}
    old["plans"] = [{k: v for k, v in e.items() if k in ("plan", "arms", "untrained")} for e in doc["plans"]]
    old["protocol"] = {k: v for k, v in doc["protocol"].items() if k != "prompts"}
    write_json(old, tmp_path / "old.json")
    assert main(["--eval", str(tmp_path / "old.json"), "--out", str(tmp_path / "q2")]) == 0
    md2 = (tmp_path / "q2" / "quality.md").read_text()
    assert "Paired over prompts" not in md2 and f"| {nr:.4f} |" in md2
    rows2 = json.loads((tmp_path / "q2" / "quality.json").read_text())["gdn"]["runs"]["80"]["rows"]
    assert rows2[1][f"{HEAD_METRIC}.nr_minus_init"] is None
    assert rows2[1][f"{HEAD_METRIC}.nr"] == rows[1][f"{HEAD_METRIC}.nr"]
