"""Pooling per-seed TTFT ratios over sessions (benchmarks/serving_pool.py), against hand-computed values."""

import math

import pytest

from benchmarks import serving_report
from benchmarks.serving_pool import pool_seed_ratios, pooled_table, summarise, t_quantile_975
from benchmarks.serving_tables import pool_points


@pytest.mark.parametrize("df, q", [(1, 12.7062), (2, 4.3027), (3, 3.1824), (5, 2.5706), (9, 2.2622), (30, 2.0423)])
def test_t_quantile_matches_tables(df, q):
    assert t_quantile_975(df) == pytest.approx(q, abs=2e-4)


def test_t_quantile_refuses_zero_df():
    with pytest.raises(ValueError):
        t_quantile_975(0)


def _arm(arm, dense=None, int8=None, pad=6000, clients=24, gpu="NVIDIA H200"):
    return {"arm": arm, "protocol": "closed-loop-paper", "replay": "served-reply", "rho": None, "rate": None,
            "clients": clients, "gpu": gpu,
            "pad_tokens": pad, "initial_prompt_mean": 10000.0, "seeds": [],
            "ttft_ratio_vs_dense_by_seed": dense, "ttft_ratio_vs_int8_by_seed": int8,
            "ttft_ratio_vs_dense_spread": {"n": len(dense or {}), "mean": 0, "min": 0, "max": 0} if dense else None}


def test_a_seed_in_two_sessions_counts_once():
    s1 = [_arm("w16", dense={"t/1": 0.60, "t/2": 0.64}, int8={"t/1": 0.90})]
    s2 = [_arm("w16", dense={"t/2": 0.68, "u/1": 0.50}, int8={"t/2": 1.10})]
    g = pool_seed_ratios([s1, s2], "ttft_ratio_vs_dense_by_seed")
    (key, val), = g.items()
    assert key == ("w16 (closed-loop-paper, served-reply, 24 clients, H200)", 6000, None)
    assert val["seeds"] == {"t/1": [0.60], "t/2": [0.64, 0.68], "u/1": [0.50]}
    pt, = pool_points([s1, s2])
    # seeds: t/1 0.60, t/2 mean(0.64, 0.68) = 0.66, u/1 0.50 -> mean 0.58666..., n 3 (not 4)
    assert pt["n"] == 3 and pt["mean"] == pytest.approx((0.60 + 0.66 + 0.50) / 3)
    assert pt["repeated"] == ["t/2"]


def test_two_client_counts_are_two_conditions_not_one_pool():
    """42 clients on the same cache is another working set: its seeds must not join the 24-client mean."""
    s24 = [_arm("w16-int8", int8={"x1/4": 0.99, "x1/5": 1.01})]
    s42 = [_arm("w16-int8", int8={"x2/1": 0.58, "x2/2": 0.56}, clients=42)]
    rows = [r for r in pooled_table([s24, s42]).splitlines() if r.startswith("| w16-int8")]
    assert len(rows) == 2
    assert "24 clients" in rows[0] and "| 1.000 (0.014), n = 2" in rows[0]
    assert "42 clients" in rows[1] and "| 0.570 (0.014), n = 2" in rows[1]


def test_two_cards_are_two_series_and_a_summary_without_a_card_stays_apart(tmp_path, capsys):
    """rho is a fraction of one card's saturation and a prefill weighs differently on each card: an H100 seed must
    not join an H200 mean, nor a summary that records no card; the pooled table and the map's labels name it."""
    import json

    h200 = [_arm("w16", dense={"t/1": 0.60, "t/2": 0.64})]
    h100 = [_arm("w16", dense={"t/3": 0.50}, gpu="NVIDIA H100 80GB HBM3")]
    old = [_arm("w16", dense={"t/4": 0.70}, gpu=None)]
    pts = {p["label"]: (p["n"], p["mean"]) for p in pool_points([h200, h100, old])}
    assert pts == {"w16 (closed-loop-paper, served-reply, 24 clients, H200)": (2, pytest.approx(0.62)),
                   "w16 (closed-loop-paper, served-reply, 24 clients, H100 80GB HBM3)": (1, pytest.approx(0.50)),
                   "w16 (closed-loop-paper, served-reply, 24 clients, card not recorded)": (1, pytest.approx(0.70))}
    paths = []
    for i, doc in enumerate((h200, h100, old)):
        paths.append(tmp_path / f"s{i}.json")
        paths[-1].write_text(json.dumps(doc))
    assert serving_report.main(["pooled", *map(str, paths)]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| w16")]
    assert [r.split(" | ")[0] for r in rows] == [
        "| w16 (closed-loop-paper, served-reply, 24 clients, H100 80GB HBM3)",
        "| w16 (closed-loop-paper, served-reply, 24 clients, H200)",
        "| w16 (closed-loop-paper, served-reply, 24 clients, card not recorded)"]
    assert "0.620 (0.028), n = 2" in rows[1] and "0.500, n = 1" in rows[0]


@pytest.mark.parametrize("word", ["pool", "mpa"])
def test_a_mistyped_subcommand_is_named_as_such(tmp_path, capsys, monkeypatch, word):
    """`serving_report pool S` used to say "the following arguments are required: --out, --model, --decays"."""
    monkeypatch.chdir(tmp_path)
    assert serving_report.main([word, "s.json", "--out", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {word}: no such work folder, and not a subcommand (rates, map, pooled)"]


def test_a_card_that_is_not_a_string_is_refused_naming_the_file_and_field(tmp_path, capsys):
    import json

    p = tmp_path / "s.json"
    p.write_text(json.dumps([_arm("w16", dense={"t/1": 0.6}, gpu=80)]))
    assert serving_report.main(["pooled", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{p}: arm w16: field 'gpu' is '80'; expected the card's name" in err[0], err


@pytest.mark.parametrize("recorded, given, want", [
    (["NVIDIA H100 80GB HBM3"] * 2, None, "NVIDIA H100 80GB HBM3"),
    ([None, None], None, None),
    ([None, None], "NVIDIA H200", "NVIDIA H200"),
    ([None, None], " NVIDIA   H200 ", "NVIDIA H200"),                # spaces collapsed
    (["NVIDIA H200", None], "NVIDIA H200", "NVIDIA H200"),
    (["NVIDIA H200", None], "nvidia  h200", "NVIDIA H200"),       # the recorded spelling wins
    (["NVIDIA H200", "NVIDIA H100 80GB HBM3"], None, "2 kinds of card"),
    (["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"], None, "2 kinds of card"),
    (["NVIDIA H100 80GB HBM3"], "NVIDIA H200", "--gpu-name 'NVIDIA H200': every work folder records its card "
                                               "('NVIDIA H100 80GB HBM3'); leave --gpu-name out"),
    (["NVIDIA H100 80GB HBM3", None], "NVIDIA H200", "--gpu-name 'NVIDIA H200': w1 would then have run on another "
                                                     "card than the 'NVIDIA H100 80GB HBM3' the other folders record"),
    (["NVIDIA H200", None], None, "w1: records no card while the other folders record 'NVIDIA H200'"),
    ([80], None, "w0: a run's 'gpu' is 80"),
])
def test_a_report_pairs_runs_of_one_card_only(recorded, given, want):
    from benchmarks.card import one_card
    from dasc_compile.errors import DascInputError

    runs = [{"gpu": g, "work": f"w{i}"} for i, g in enumerate(recorded)]
    if want is None or want.startswith("NVIDIA"):
        assert one_card(runs, given) == want
    else:
        with pytest.raises(DascInputError) as exc:
            one_card(runs, given)
        assert want in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("name, label", [("NVIDIA H100 80GB HBM3", "H100 80GB HBM3"), ("NVIDIA H200", "H200"),
                                         ("nvidia   H100  PCIe ", "H100 PCIE"), ("Some Card", "SOME CARD"),
                                         ("nvidia h100 80gb hbm3", "H100 80GB HBM3"),
                                         (None, "card not recorded"), ("  ", "card not recorded")])
def test_card_label(name, label):
    from benchmarks.card import card_label

    assert card_label(name) == label


def test_summarise_sd_interval_and_below_one():
    s = summarise([0.9, 1.0, 1.1])
    assert s["mean"] == pytest.approx(1.0) and s["sd"] == pytest.approx(0.1)
    h = t_quantile_975(2) * 0.1 / math.sqrt(3)        # 4.3027 * 0.0577 = 0.2484
    assert s["ci95"] == pytest.approx((1.0 - h, 1.0 + h), abs=1e-6)
    assert s["below_1"] == 1 and s["n"] == 3
    one = summarise([0.7])
    assert one["sd"] is None and one["ci95"] is None


def test_pooled_table_filters_pad_and_prints_both_baselines():
    docs = [[_arm("w16", dense={"t/1": 0.6, "t/2": 0.7}, int8={"t/1": 0.9, "t/2": 1.0}),
             _arm("w16", dense={"t/3": 0.9}, pad=0)]]
    text = pooled_table(docs, pad=6000)
    row = [ln for ln in text.splitlines() if ln.startswith("| w16")]
    assert len(row) == 1                                # the pad-0 object is left out
    assert "0.650 (0.071), n = 2" in row[0] and "0.950 (0.071), n = 2" in row[0]
    assert "below 1: 2" in row[0] and "below 1: 1" in row[0]


def test_pooled_subcommand_refuses_a_file_that_is_not_a_summary(tmp_path, capsys):
    bad = tmp_path / "summary.json"
    bad.write_text('{"not": "a list"}')
    assert serving_report.main(["pooled", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err and err.startswith("error:")


def test_pooled_refuses_to_print_an_empty_table(tmp_path, capsys):
    import json

    docs = [[_arm("w16", dense={"t/1": 0.6}, int8={"t/1": 0.9})]]
    with pytest.raises(Exception, match=r"at pad 1234 .*pads present: 6000"):
        pooled_table(docs, pad=1234)
    old = tmp_path / "summary.json"                      # a summary written before per-seed ratios were kept
    old.write_text(json.dumps([{"arm": "dense", "protocol": "closed-loop-paper", "replay": "served-reply"}]))
    assert serving_report.main(["pooled", str(old)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {old}: no arm with per-seed TTFT ratios") and "regenerate" in err
    assert len(err.strip().splitlines()) == 1


def test_regime_map_draws_the_int8_panel_by_client_count(tmp_path, monkeypatch):
    """Left: ratios to Dense over context; right: ratios to INT8 over clients, one series per arm whose points
    are the client counts measured (24 and 42 here), not one merged point; Dense is left out of the right panel."""
    import json

    import matplotlib.figure

    from benchmarks.serving_tables import regime_map

    drawn = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: (drawn.append(self), real(self, *a, **k)))
    s24 = tmp_path / "s24.json"
    s24.write_text(json.dumps([_arm("w16-int8", dense={"x1/4": 0.57}, int8={"x1/4": 0.99, "x1/5": 1.01}),
                               _arm("dense", int8={"x1/4": 1.7})]))
    s42 = tmp_path / "s42.json"
    s42.write_text(json.dumps([_arm("w16-int8", int8={"x2/1": 0.58, "x2/2": 0.56}, clients=42)]))
    regime_map([s24, s42], tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 0
    left, right = drawn[0].axes
    (line,) = [c for c in right.containers]                      # one series: w16-int8 (Dense left out)
    xs, ys = line.lines[0].get_data()
    assert list(ys) == pytest.approx([1.0, 0.57]) and list(xs) == pytest.approx([24, 42])
    assert "w16-int8" in right.get_legend().get_texts()[0].get_text()


def test_regime_map_draws_series_with_more_clients_hollow(tmp_path, monkeypatch):
    """On the left panel a 42-client series (the working set beyond INT8's checkpoints) is hollow, a 24-client one
    filled in its colour, so two series of one arm and card at one context stay apart."""
    import json

    import matplotlib.figure

    from benchmarks.serving_tables import _face, regime_map

    assert (_face("dasc-nr-w16 (closed-loop-paper, served-reply, 42 clients, H200)"), _face("x (24 clients)"),
            _face("dasc-nr-w16 (open-loop, rho 0.7)")) == ("none", None, None)
    drawn = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: (drawn.append(self), real(self, *a, **k)))
    s24 = tmp_path / "s24.json"
    s24.write_text(json.dumps([_arm("w16-int8", dense={"x1/4": 0.57})]))
    s42 = tmp_path / "s42.json"
    s42.write_text(json.dumps([_arm("w16-int8", dense={"x2/1": 0.69}, clients=42)]))
    regime_map([s24, s42], tmp_path / "m.png")
    left = drawn[0].axes[0]
    faces = {c.get_label().split(", n=")[0]: c.lines[0].get_markerfacecolor() for c in left.containers}
    assert len(faces) == 2
    assert [f for lab, f in faces.items() if "42 clients" in lab] == ["none"]
    assert [f for lab, f in faces.items() if "24 clients" in lab][0] != "none"
