"""``dasc inspect`` (dasc_compile/inspect.py, plan_views.py, plot.py) on two hand-built plans with hand-computed figures.

GDN plan (Qwen3-Next-like, tiny): model layers 0..3, recurrent [0, 2], 4 value heads, 2 key heads,
d_k = d_v = 4, conv K = 4, TP = 2 with storage balancing.
  layer 0 keeps heads {1, 2, 3}, layer 2 keeps head {3} -> r = [3, 1], offsets [0, 3)
  and [3, 4); r_{l,h} = [[0,1,1,1], [0,0,0,1]].
  unit (head) bytes 4*4*4 = 64; dense temporal 4*64 = 256 per layer; conv (2*2*4 + 4*4) = 32
  channels * 3 * 2 B = 192 per layer. Totals: temporal 512 dense / 256 kept, conv 384,
  checkpoint 896 / 640 -> C_ckpt 1.40; C_temp ragged 8/4 = 2, padded 8/(2*3) = 1.33,
  layout gain 3/2 = 1.5; pool 6400 B -> usable slots 6400//640 - 1 = 9, dense 6400//896 - 1 = 6.
  TP = 2, contiguous heads {0,1} | {2,3}: rank 0 keeps 1 unit, rank 1 keeps 3; per-rank conv
  2 * 96 = 192 B -> 256 / 384 B per slot. Storage balancing to targets [2, 2]: rank 1's
  third packed unit goes to rank 0 -> M_remote 1, both ranks 2*64 + 192 = 320 B; dense per rank
  2*2*64 + 192 = 448 -> C_ckpt under TP 1.40; usable 6400 // 320 - 1 = 19.
KDA plan (Kimi-Linear-like, tiny): model layers 0..2, recurrent [1, 2], 2 heads x 4 key channels,
TP = 1, kernels rendered, decay values an initialisation draw.
  layer 1 keeps units {0, 1, 5} -> heads [2, 1] -> r_{l,h} = [0.5, 0.25];
  layer 2 keeps {4, 5, 6, 7} -> heads [0, 4] -> [0.0, 1.0]; offsets 0 and 3.
  Pairs: mixed 2, all omitted 1, all retained 1; layer means 0.375 and 0.5.
  C_temp ragged 16/7 = 2.29, padded 16/(2*4) = 2.00, layout gain 4/3.5 = 1.14;
  column bytes 4*4 = 16, dense temporal 2*4*4*4 = 128 per layer, conv 3*24*2 = 144 per layer;
  checkpoint 544 dense / 400 compressed -> C_ckpt 1.36.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from rich.console import Console

from dasc_compile import inspect as insp
from dasc_compile import plan_views
from dasc_compile.plot import plot_plan
from dasc_compile.errors import DascInputError
from dasc_compile.horizons import HORIZON_BIN_EDGES, horizon_histogram, horizon_quantiles
from dasc_compile.policy import Policy
from dasc_compile.schema import (
    Fingerprint,
    HorizonQuantiles,
    KernelModule,
    LayerPlan,
    ModelInfo,
    Plan,
    RankPayload,
    RefreshPlan,
    StorageMap,
    Totals,
    TPPlan,
    canonical_json,
    load_plan,
    with_content_hash,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _layer(layer_id, rec, family, heads, per_head, kept, offset, horizons, w, dense, ub, conv):
    h = torch.tensor(horizons, dtype=torch.float64)
    local = [x for u, x in enumerate(horizons) if u not in kept]
    return LayerPlan(
        layer_id=layer_id, recurrent_index=rec, family=family, num_heads=heads, units_per_head=per_head,
        n_units=heads * per_head, n_kept=len(kept), offset=offset, kept_units=kept,
        horizon_quantiles=HorizonQuantiles(**horizon_quantiles(h)),
        horizon_histogram=horizon_histogram(h, HORIZON_BIN_EDGES),
        horizon_local_max=max(local, default=None), horizon_global_min=min((horizons[u] for u in kept), default=None),
        refresh_window=w,
        bytes_temporal_dense=dense, bytes_temporal_kept=len(kept) * ub, bytes_conv=conv)


def gdn_plan() -> Plan:
    policy = Policy(w_max=16, a_s=-0.3, tp_size=2, balance="storage", pool_budget_bytes=6400, family="gdn")
    model = ModelInfo(
        model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], num_hidden_layers=4,
        recurrent_layer_ids=[0, 2], full_attention_layer_ids=[1, 3], family="gdn", unit_kind="gdn_head",
        num_value_heads=4, num_key_heads=2, head_k_dim=4, head_v_dim=4, conv_kernel=4, conv_dim=32,
        provenance="trained checkpoint (test fixture)")
    layers = [
        # horizons (tokens): head 0 local (H=3), heads 1-3 global; layer 2: only head 3 global (inf)
        _layer(0, 0, "gdn", 4, 1, [1, 2, 3], 0, [3.0, 40.0, 100.0, 5000.0], 4, 256, 64, 192),
        _layer(2, 1, "gdn", 4, 1, [3], 3, [2.0, 6.0, 12.0, math.inf], 16, 256, 64, 192),
    ]
    totals = Totals(
        num_recurrent_layers=2, n_units=8, n_kept=4, r_max=3, r_mean=2.0, c_temp_ragged=2.0,
        c_temp_padded=8 / 6, layout_gain=1.5, bytes_temporal_dense=512, bytes_temporal_kept=256,
        bytes_conv=384, bytes_dense_checkpoint=896, bytes_compressed_checkpoint=640, c_ckpt=896 / 640,
        unit_bytes=64, usable_slots=9, usable_slots_dense=6)
    contiguous = [RankPayload(rank=0, n_kept=1, n_alloc=1, bytes_temporal=64, bytes_conv=192, bytes_per_slot=256),
                  RankPayload(rank=1, n_kept=3, n_alloc=3, bytes_temporal=192, bytes_conv=192, bytes_per_slot=384)]
    storage = [RankPayload(rank=r, n_kept=2, n_alloc=2, bytes_temporal=128, bytes_conv=192, bytes_per_slot=320)
               for r in (0, 1)]
    tp = TPPlan(
        tp_size=2, balance="storage", heads_per_rank=2, units_per_head=1, bytes_per_unit=64,
        kept_per_rank_layer=[[1, 0], [2, 1]], m_remote=1, payload_contiguous=contiguous,
        payload_compute=contiguous, payload_storage=storage, bottleneck_rank=0, bottleneck_bytes_per_slot=320,
        bytes_dense_per_slot=448, c_ckpt_tp=448 / 320, usable_slots=19,
        storage=StorageMap(n_local=[1, 3], targets=[2, 2], keep=[1, 2], slot_width=2,
                           runs=[[[0, 1, 0, 0]], [[0, 2, 1, 0], [2, 1, 0, 1]]],
                           send_splits=[[0, 0], [1, 0]], m_remote=1))
    return with_content_hash(Plan(
        dasc_version="0.1.0", model=model,
        fingerprint=Fingerprint(config_sha256="c" * 64, decay_sha256="d" * 64,
                                decay_tensors=["model.layers.0.linear_attn.A_log"]),
        policy=policy, selection="horizon", horizon_bin_edges=list(HORIZON_BIN_EDGES), layers=layers,
        totals=totals, tp=tp, refresh=RefreshPlan(w_replay_cap=16, any_local=True)))


def kda_plan() -> Plan:
    policy = Policy(w_max=16, a_s=-0.3, load_policy="wr", family="kda")
    model = ModelInfo(
        model_type="kimi_linear", architectures=["KimiLinearForCausalLM"], num_hidden_layers=3,
        recurrent_layer_ids=[1, 2], full_attention_layer_ids=[0], family="kda", unit_kind="kda_column",
        num_value_heads=2, num_key_heads=2, head_k_dim=4, head_v_dim=4, conv_kernel=4, conv_dim=24,
        provenance="initialisation draw, not trained")
    layers = [
        _layer(1, 0, "kda", 2, 4, [0, 1, 5], 0, [20.0, 30.0, 5.0, 1.0, 0.5, 17.0, 2.0, 9.0], 16, 128, 16, 144),
        _layer(2, 1, "kda", 2, 4, [4, 5, 6, 7], 3, [1.0, 2.0, 3.0, 4.0, 64.0, 65.0, 1e5, math.inf], 4, 128, 16, 144),
    ]
    totals = Totals(
        num_recurrent_layers=2, n_units=16, n_kept=7, r_max=4, r_mean=3.5, c_temp_ragged=16 / 7,
        c_temp_padded=2.0, layout_gain=4 / 3.5, bytes_temporal_dense=256, bytes_temporal_kept=112,
        bytes_conv=288, bytes_dense_checkpoint=544, bytes_compressed_checkpoint=400, c_ckpt=544 / 400,
        unit_bytes=16)
    only = [RankPayload(rank=0, n_kept=7, n_alloc=7, bytes_temporal=112, bytes_conv=288, bytes_per_slot=400)]
    tp = TPPlan(tp_size=1, balance="off", heads_per_rank=2, units_per_head=4, bytes_per_unit=16,
                kept_per_rank_layer=[[3, 4]], payload_contiguous=only, payload_compute=only,
                payload_storage=only, bottleneck_rank=0, bottleneck_bytes_per_slot=400, bytes_dense_per_slot=544,
                c_ckpt_tp=544 / 400)
    kernels = KernelModule(file="dasc_kernels_0123abcd.py", key="0123abcd" * 8,
                           ops=["pack", "load", "refresh_copy"], constants={"NUM_LAYERS": 2, "GDN": False},
                           source_sha256="c" * 64)
    return with_content_hash(Plan(
        dasc_version="0.1.0", model=model,
        fingerprint=Fingerprint(config_sha256="a" * 64, decay_sha256="b" * 64, decay_tensors=[]),
        policy=policy, selection="horizon", horizon_bin_edges=list(HORIZON_BIN_EDGES), layers=layers,
        totals=totals, tp=tp, refresh=RefreshPlan(w_replay_cap=16, any_local=True), kernels=kernels))


@pytest.fixture(params=["gdn", "kda"])
def plan(request) -> Plan:
    return gdn_plan() if request.param == "gdn" else kda_plan()


# ---- heatmap data ----------------------------------------------------------------------------

def test_retained_fraction_matrix_gdn_is_head_indicator():
    ids, mat = plan_views.retained_fraction_matrix(gdn_plan())
    assert ids == [0, 2]
    assert mat.dtype == np.float64 and mat.shape == (2, 4)
    np.testing.assert_array_equal(mat, [[0, 1, 1, 1], [0, 0, 0, 1]])


def test_retained_fraction_matrix_kda_is_channel_fraction():
    ids, mat = plan_views.retained_fraction_matrix(kda_plan())
    assert ids == [1, 2]
    np.testing.assert_array_equal(mat, [[0.5, 0.25], [0.0, 1.0]])


def test_kept_unit_out_of_range_is_an_input_error():
    p = kda_plan()
    bad = p.layers[0].model_copy(update={"kept_units": [0, 1, 8]})
    with pytest.raises(DascInputError, match="layer 1: kept unit 8 outside"):
        plan_views.retained_fraction_matrix(p.model_copy(update={"layers": [bad, p.layers[1]]}))


def test_head_summary_counts_mixed_pairs():
    hs = plan_views.head_summary(kda_plan())
    assert hs == {"pairs": 4, "mixed": 2, "all_omitted": 1, "all_retained": 1,
                  "layer_mean_fraction_min": 0.375, "layer_mean_fraction_max": 0.5}


# ---- --json ----------------------------------------------------------------------------------

def test_json_document_gdn_counts_offsets_and_tp():
    doc = insp.inspect_json(gdn_plan())
    json.dumps(doc, allow_nan=False)   # plain JSON: inf spelled as a string
    assert doc["inspect_format"] == insp.INSPECT_FORMAT
    assert [(d["layer_id"], d["n_units"], d["n_kept"], d["offset"], d["offset_end"]) for d in doc["layers"]] == \
        [(0, 4, 3, 0, 3), (2, 4, 1, 3, 4)]
    assert doc["layers"][0]["kept_per_head"] == [0, 1, 1, 1]
    assert doc["layers"][1]["retained_fraction_per_head"] == [0.0, 0.0, 0.0, 1.0]
    assert doc["layers"][1]["horizon_quantiles"]["max"] == "Infinity"
    assert doc["layers"][0]["n_local"] == 1 and doc["layers"][0]["kept_fraction"] == 0.75
    assert doc["totals"]["c_ckpt"] == pytest.approx(1.4) and doc["totals"]["usable_slots"] == 9
    assert doc["provenance"] == {"note": "trained checkpoint (test fixture)", "kind": "trained",
                                 "initialisation_draw": False}
    tp = doc["tp"]
    assert (tp["tp_size"], tp["bottleneck_rank"], tp["m_remote"], tp["slot_width"], tp["usable_slots"]) == \
        (2, 0, 1, 2, 19)
    assert tp["c_ckpt_tp"] == pytest.approx(1.4)
    assert [r["contiguous"]["bytes_per_slot"] for r in tp["ranks"]] == [256, 384]
    assert [r["storage"]["n_kept"] for r in tp["ranks"]] == [2, 2]
    assert [r["storage"]["n_alloc"] for r in tp["ranks"]] == [2, 2]
    assert tp["kept_per_rank_layer"] == [[1, 0], [2, 1]] and tp["storage_targets"] == [2, 2]
    assert tp["permuted_layer_ids"] is None and doc["kernels"] is None
    assert doc["refresh"] == {"load_policy": "nr", "w_replay_cap": 16, "any_local": True}


def test_json_document_kda_kernels_and_provenance():
    doc = insp.inspect_json(kda_plan())
    assert [(d["layer_id"], d["n_kept"], d["offset"]) for d in doc["layers"]] == [(1, 3, 0), (2, 4, 3)]
    assert doc["layers"][0]["kept_per_head"] == [2, 1]
    assert doc["provenance"]["initialisation_draw"] is True
    assert doc["provenance"]["kind"] == "initialisation-draw"
    assert doc["kernels"]["key"] == "0123abcd" * 8 and doc["kernels"]["ops"] == ["pack", "load", "refresh_copy"]
    assert doc["tp"]["m_remote"] == 0 and doc["tp"]["storage_targets"] is None
    assert doc["tp"]["kept_per_rank_layer"] == [[3, 4]]
    assert doc["totals"]["layout_gain"] == pytest.approx(4 / 3.5)
    # the histogram sums to the unit count of the layer
    assert sum(doc["layers"][1]["horizon_histogram"]) == 8
    assert len(doc["horizon_bin_edges"]) == len(doc["layers"][0]["horizon_histogram"])


def test_json_keys_are_documented():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    doc = insp.inspect_json(gdn_plan())
    keys = (set(doc) | set(doc["layers"][0]) | set(doc["tp"]) | set(doc["tp"]["ranks"][0])
            | set(doc["tp"]["ranks"][0]["storage"]) | set(doc["head_summary"]) | set(doc["provenance"]))
    missing = sorted(k for k in keys if f"`{k}`" not in text)
    assert not missing, f"undocumented --json keys: {missing}"


# ---- rich report -----------------------------------------------------------------------------

def _report(p: Plan) -> str:
    con = Console(record=True, width=160)
    insp.render_report(p, con)
    return con.export_text()


def test_report_gdn_key_figures():
    text = _report(gdn_plan())
    assert "provenance: trained checkpoint (test fixture)" in text
    assert "WARNING" not in text
    assert "[0, 3)" in text and "[3, 4)" in text                      # ragged offsets
    assert "C_ckpt" in text and "1.40x" in text
    assert "2.00x" in text and "1.33x" in text and "1.50x" in text    # C_temp ragged, padded, layout gain
    assert "bottleneck rank 0" in text and "usable slots 19" in text
    assert "M_remote = 1" in text
    assert "640 B compressed vs 896 B dense" in text
    assert "9 compressed vs 6 dense" in text
    assert "min(n_p, 16)" in text and "dasc-nr zero-fills" in text


def test_report_prints_bracketed_provenance_verbatim():
    p = gdn_plan()
    p = p.model_copy(update={"model": p.model.model_copy(update={"provenance": "[red]hub[/red] snapshot"})})
    assert "provenance: [red]hub[/red] snapshot" in _report(p)


def test_report_kda_provenance_and_kernels():
    text = _report(kda_plan())
    assert "WARNING: decay values not trained" in text
    assert "provenance: initialisation draw, not trained" in text
    assert "1.36x" in text and "2.29x" in text and "1.14x" in text
    assert "mixed (0 < r < 1) 2, all omitted 1, all retained 1" in text
    # no pool budget: the slots line says which command counts them (inspect has no --pool-budget)
    assert "- compressed vs - dense (compile with --pool-budget SIZE to count them, or see dasc size)" in text
    assert "0123abcd" * 8 in text and "pack, load, refresh_copy" in text
    assert "used by dasc-wr" in text
    assert "inf" in text                                              # H_s max of layer 2


# ---- --plot ----------------------------------------------------------------------------------

def test_plot_writes_a_png_atomically(plan, tmp_path):
    import matplotlib.image

    out = tmp_path / "plan.png"
    plot_plan(plan, out)
    assert out.read_bytes()[:8] == PNG_MAGIC
    img = matplotlib.image.imread(out)
    assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 300
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]      # no temporary file left


def test_plot_replaces_only_a_png_a_dasc_command_wrote(plan, tmp_path):
    """A fresh user's --plot replaced a photo that happened to be a PNG: every dasc figure carries a tEXt
    chunk (figures.PNG_KEY), and check_png refuses an existing PNG without it, keeping the file."""
    from dasc_compile.figures import PNG_KEY, check_png, png_text_keys, pyplot

    ours = tmp_path / "plan.png"
    plot_plan(plan, ours)
    assert PNG_KEY in png_text_keys(ours)
    assert check_png(ours) == ours                                    # a re-run replaces its own figure
    plot_plan(plan, ours)

    plt = pyplot()
    fig = plt.figure()
    photo = tmp_path / "photo.png"
    fig.savefig(photo)                                                # matplotlib's own PNG, no dasc mark
    plt.close(fig)
    before = photo.read_bytes()
    assert before[:8] == PNG_MAGIC and PNG_KEY not in png_text_keys(photo)
    with pytest.raises(DascInputError, match="exists and is a PNG image no dasc command wrote"):
        check_png(photo)
    assert photo.read_bytes() == before
    truncated = tmp_path / "cut.png"                                  # signature only: not ours either
    truncated.write_bytes(PNG_MAGIC)
    with pytest.raises(DascInputError, match="no dasc command wrote"):
        check_png(truncated)
    (tmp_path / "empty.png").write_bytes(b"")                         # empty: nothing to lose
    check_png(tmp_path / "empty.png")
    with pytest.raises(DascInputError, match="folder .*nope does not exist; create it"):   # as eval and sweep say
        check_png(tmp_path / "nope" / "x.png")


def test_plot_into_missing_directory_is_an_input_error(tmp_path):
    with pytest.raises(DascInputError, match="cannot write the plot"):
        plot_plan(gdn_plan(), tmp_path / "no-such-dir" / "x.png")


# ---- loading ---------------------------------------------------------------------------------

def test_load_plan_from_file_or_directory(tmp_path):
    p = gdn_plan()
    (tmp_path / "plan.json").write_text(canonical_json(p))
    assert load_plan(tmp_path) == p
    assert load_plan(tmp_path / "plan.json") == p
    with pytest.raises(DascInputError):
        load_plan(tmp_path / "missing")


def test_a_random_band_stays_inside_what_its_metric_can_take():
    """The sweep figure's Random ±SD band of KL went below 0 (KL >= 0); agreement is in [0, 1]; ΔNLL is unbounded."""
    from dasc_compile.figures import sd_band

    assert sd_band("kl", [0.01, 0.2], [0.03, 0.05]) == ([0.0, pytest.approx(0.15)], [0.04, 0.25])
    assert sd_band("gen_agreement", [0.9, 0.1], [0.2, 0.2]) == ([pytest.approx(0.7), 0.0], [1.0, pytest.approx(0.3)])
    assert sd_band("nll_delta", [0.01], [0.03]) == ([pytest.approx(-0.02)], [0.04])


def test_quality_figures_print_one_way_in_eval_and_sweep():
    from dasc_compile.plan_views import fmt_quality

    assert fmt_quality(-0.00001) == "0.0000" and fmt_quality(-0.00051) == "-0.0005" and fmt_quality(None) == "-"
    assert fmt_quality({"mean": 0.01234, "sd": -0.0}) == "0.0123 ± 0.0000" and fmt_quality({"mean": None}) == "-"
    assert fmt_quality(0.12345, 3) == "0.123"
