"""Calibrated references meet the paper's published figures when compiled by the real compiler.

Each calibrated checkpoint (bundled in plans/reference/<name>/, or written on demand for Kimi-K3)
goes through ``compile_plan`` at the paper's cutoffs and TP-balanced placement; the plan must give
the published C_ckpt (Eq. 6, §5.3), layer-head structure (App. A.1) and median alpha_s (§3.3)
within :data:`dasc_compile.calibrated_targets.TOLERANCE`.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from dasc_compile import calibrated as cal
from dasc_compile.arch import arch_from_config
from dasc_compile.calibrated_targets import TARGETS, TOLERANCE
from dasc_compile.checkpoint import open_checkpoint, read_decay_tensors, read_safetensors_header
from dasc_compile.compiler import compile_plan, layer_horizons, resolve_family_policy
from dasc_compile.plan_views import head_summary
from dasc_compile.policy import Policy
from dasc_compile.provenance import CALIBRATED_PREFIX, provenance_kind
from dasc_compile.refckpt_formats import REFERENCE_CONFIGS, parameter_table

BUNDLED = Path(__file__).resolve().parents[2] / "plans" / "reference"
PAPER = [n for n, t in TARGETS.items() if t.capacity]          # models with published figures


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> checkpoint directory: the bundled copy, or a fresh write for references not bundled."""
    root = tmp_path_factory.mktemp("calibrated")
    return {n: (BUNDLED / n if t.bundled else cal.write_calibrated(n, root / n)) for n, t in TARGETS.items()}


@pytest.fixture(scope="module")
def compiled(checkpoints, tmp_path_factory):
    """``compiled(name, w)``: the plan ``compile_plan`` writes for a calibrated reference at W_max = w
    with the model's TP degree and balance (each compiled once per module: Kimi-K3 takes seconds)."""
    root, cache = tmp_path_factory.mktemp("plans"), {}

    def get(name: str, w: int):
        if (name, w) not in cache:
            t = TARGETS[name]
            cache[name, w], _ = compile_plan(checkpoints[name], Policy(w_max=w, tp_size=t.tp_size, balance=t.balance),
                                             root / f"{name}-w{w}", with_kernels=False)
        return cache[name, w]

    return get


@pytest.mark.parametrize("name", PAPER)
def test_capacity_matches_paper(name, checkpoints, compiled):
    t = TARGETS[name]
    for point in t.capacity:
        plan = compiled(name, point.w_max)
        assert plan.tp.tp_size == t.tp_size and plan.tp.balance == t.balance
        got = plan.tp.c_ckpt_tp
        assert abs(got - point.c_ckpt) / point.c_ckpt <= TOLERANCE["capacity_rel"], (point, got)
        # the kept count is the one the synthesis solved for, exactly
        spec = arch_from_config(json.loads((checkpoints[name] / "config.json").read_text()))
        assert plan.totals.n_kept == cal.kept_for_capacity(spec, t.tp_size, point.c_ckpt)


@pytest.mark.parametrize("name", [n for n in PAPER if TARGETS[n].heads is not None])
def test_layer_head_structure_matches_paper(name, compiled):
    ht = TARGETS[name].heads
    plan = compiled(name, ht.w_max)
    hs = head_summary(plan)
    assert hs["pairs"] == ht.mixed + ht.all_omitted + ht.all_retained
    for key, want in (("mixed", ht.mixed), ("all_omitted", ht.all_omitted), ("all_retained", ht.all_retained)):
        assert abs(hs[key] - want) <= TOLERANCE["pair_count_abs"], (key, hs[key], want)
    assert abs(hs["layer_mean_fraction_min"] - ht.layer_mean_min) <= TOLERANCE["layer_mean_abs"]
    assert abs(hs["layer_mean_fraction_max"] - ht.layer_mean_max) <= TOLERANCE["layer_mean_abs"]
    if ht.layer_mean_median is not None:
        means = [lp.n_kept / lp.n_units for lp in plan.layers]
        assert abs(float(np.median(means)) - ht.layer_mean_median) <= TOLERANCE["layer_mean_abs"]


def _alphas(ck: Path) -> np.ndarray:
    """alpha_s = exp(g_s) of every unit, through the compiler's own Eq. 2 / Eq. 3 code."""
    src = open_checkpoint(ck)
    spec = arch_from_config(src.config)
    pol = resolve_family_policy(spec, Policy(w_max=0))
    hs = layer_horizons(spec, pol, read_decay_tensors(src, spec))
    return np.exp(np.log(pol.eps) / torch.cat(hs).numpy())


@pytest.mark.parametrize("name", [n for n in PAPER if TARGETS[n].median_alpha is not None])
def test_median_alpha_matches_paper(name, checkpoints):
    got = float(np.median(_alphas(checkpoints[name])))
    assert abs(got - TARGETS[name].median_alpha) <= TOLERANCE["median_alpha_abs"], got


def test_hand_computed_kept_count_for_kimi_w16():
    """Eq. 6 by hand, Kimi-Linear at TP8: a rank holds 20 layers x (4 heads x 128 x 128 x 4 B temporal
    + 3 x 512 x 3 x 2 B conv) = 20 x (262144 + 9216) B dense; C = 2.64 leaves 5427200 / 2.64 = 2055757.6 B,
    of which 20 x 9216 B is conv, so (2055757.6 - 184320) / 512 B = 3655.2 kept channels on the bottleneck
    rank: ceil(K / 8) = 3655, and the smallest such K is 29233."""
    spec = arch_from_config(REFERENCE_CONFIGS["kimi-linear-48b-a3b"])
    assert cal.kept_for_capacity(spec, 8, 2.64) == 29233


@pytest.mark.parametrize("name", list(TARGETS))
def test_provenance_label_and_formats(name, checkpoints):
    ck = checkpoints[name]
    cfg = json.loads((ck / "config.json").read_text())
    assert cfg == cal.calibrated_config(name)
    hdr = read_safetensors_header(ck / "model.safetensors")
    note = hdr.metadata["dasc_provenance"]
    kind = provenance_kind(note)
    assert kind == ("real-A_log+synthetic-dt_bias" if name.startswith("qwen3.5") else "paper-calibrated")
    if kind == "paper-calibrated":
        assert note.startswith(CALIBRATED_PREFIX + ": ")
    base = TARGETS[name].base
    if base is not None:   # the real model's tensor names, shapes and dtypes
        want = {n: (s, d) for n, s, d in parameter_table(cfg) if n.endswith(("A_log", "dt_bias"))}
        assert {n: (e.shape, e.dtype) for n, e in hdr.tensors.items()} == want
    else:                  # Kimi-K3: 69 KDA layers x 96 heads x 128, FP32 as the real model
        spec = arch_from_config(cfg)
        assert (len(spec.recurrent_layer_ids), spec.num_value_heads, spec.head_k_dim) == (69, 96, 128)
        assert spec.family == "kda_safe_gate" and spec.safe_gate_lower_bound == -5.0
        assert {e.dtype for e in hdr.tensors.values()} == {"F32"}


@pytest.mark.parametrize("name", [n for n, t in TARGETS.items() if t.bundled])
def test_bundled_files_reproduce(name, tmp_path):
    """A fresh synthesis gives the bundled tensors (numpy's generator; equal up to float rounding)."""
    fresh = cal.write_calibrated(name, tmp_path / name)
    assert (fresh / "config.json").read_bytes() == (BUNDLED / name / "config.json").read_bytes()
    with safe_open(str(fresh / "model.safetensors"), "pt") as a, \
            safe_open(str(BUNDLED / name / "model.safetensors"), "pt") as b:
        assert a.metadata() == b.metadata() and sorted(a.keys()) == sorted(b.keys())
        for k in a.keys():
            torch.testing.assert_close(a.get_tensor(k), b.get_tensor(k), rtol=1e-5, atol=1e-6)


def test_synthesis_is_seeded():
    _, t0, _ = cal.synthesize("qwen3-next-80b-a3b-calibrated", seed=0)
    _, t1, _ = cal.synthesize("qwen3-next-80b-a3b-calibrated", seed=1)
    _, t0b, note = cal.synthesize("qwen3-next-80b-a3b-calibrated", seed=0)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(t0, t0b))
    assert not all(torch.equal(a[1], b[1]) for a, b in zip(t0, t1))
    assert "seed 0" in note


def test_unknown_name_is_one_clear_error():
    from dasc_compile.errors import DascInputError

    with pytest.raises(DascInputError, match="calibrated reference 'kimi-k9-calibrated' is unknown"):
        cal.calibrated_config("kimi-k9-calibrated")


def test_qwen3_5_real_a_log_and_dt_bias_statistics(checkpoints):
    """A_log is the trained one, value for value; dt_bias meets each layer's published statistics
    (min, max, median and count of negatives exactly; mean within 0.01, std within 1 %)."""
    from dasc_compile.calibrated_stats import layer_stats, load_sources

    layers, a_log, stats, _ = load_sources()
    src = open_checkpoint(checkpoints["qwen3.5-27b-calibrated"])
    spec = arch_from_config(src.config)
    assert list(spec.recurrent_layer_ids) == layers
    tensors = read_decay_tensors(src, spec)
    for i, st in enumerate(stats):
        (_, a), (_, d) = tensors[2 * i], tensors[2 * i + 1]
        assert a.dtype == torch.float32 and d.dtype == torch.bfloat16
        np.testing.assert_array_equal(a.numpy().astype(np.float64), a_log[i])
        got = layer_stats(d.to(torch.float64).numpy())
        for key in ("n", "min", "max", "median", "n_neg"):
            assert got[key] == st[key], (layers[i], key, got[key], st[key])
        assert abs(got["mean"] - st["mean"]) <= 0.01, (layers[i], got["mean"], st["mean"])
        assert abs(got["std"] - st["std"]) <= 0.01 * st["std"], (layers[i], got["std"], st["std"])


@pytest.mark.parametrize("name,kind", [("kimi-linear-48b-a3b-calibrated", "paper-calibrated"),
                                       ("qwen3.5-27b-calibrated", "real-A_log+synthetic-dt_bias")])
def test_inspect_and_plot_carry_the_label(name, kind, compiled, tmp_path, monkeypatch):
    from matplotlib.figure import Figure
    from rich.console import Console

    from dasc_compile import inspect as insp
    from dasc_compile.plot import plot_plan
    from dasc_compile.provenance import figure_label

    plan = compiled(name, 16)
    doc = insp.inspect_json(plan)
    assert doc["provenance"]["kind"] == kind and doc["provenance"]["initialisation_draw"] is False
    label = figure_label(plan.model.provenance)
    assert label.startswith(CALIBRATED_PREFIX if kind == "paper-calibrated" else "real A_log plus synthetic dt_bias")
    con = Console(record=True, width=200)
    insp.render_report(plan, con)
    text = " ".join(con.export_text().split())
    assert label in text and "WARNING: decay values not trained" not in text
    drawn = []
    real = Figure.supxlabel
    monkeypatch.setattr(Figure, "supxlabel", lambda self, s, **kw: (drawn.append(s), real(self, s, **kw))[1])
    plot_plan(plan, tmp_path / "p.png")
    assert len(drawn) == 1 and label.upper() in " ".join(drawn[0].split())


def test_cli_writes_the_bundled_calibrated_reference(tmp_path, capsys):
    from dasc_compile.cli import run

    out = tmp_path / "kimi"
    assert run(["reference", "kimi-linear-48b-a3b-calibrated", "--out", str(out)]) == 0
    for f in ("config.json", "model.safetensors"):
        assert (out / f).read_bytes() == (BUNDLED / "kimi-linear-48b-a3b-calibrated" / f).read_bytes()
    assert run(["compile", str(out), "--wmax", "16", "--out", str(tmp_path / "p"), "--no-kernels"]) == 0
    assert "note: decay values not trained; provenance: " + CALIBRATED_PREFIX in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("args,msg", [
    (["reference", "kimi-k9-calibrated"], "reference model 'kimi-k9-calibrated' is unknown; expected one of"),
    (["reference", "kimi-k3-calibrated", "--full-size"], "--full-size: kimi-k3-calibrated is written decay-only"),
])
def test_cli_reference_errors_are_one_line(args, msg, tmp_path, capsys):
    from dasc_compile.cli import run

    assert run(args + ["--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and msg in err and "\n" not in err
    assert not (tmp_path / "x").exists()
