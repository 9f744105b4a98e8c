"""``dasc inspect`` on plans that are damaged, edited, or edited and re-hashed (issue 13 item 5).

The one plan reader (``dasc_compile.schema.load_plan``, also the runtime's) refuses what the runtime would
refuse (an edited or missing kernel module) and every internal inconsistency an edit can introduce (offsets,
counts, unit ids, bytes, ratios, slots, refresh windows, histograms), so inspect never renders impossible
values or raises a traceback. Each case: ``dasc inspect`` and ``dasc inspect --json`` exit 2 with one line
naming the file and the field; ``--plot`` writes nothing.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest

from dasc_compile.schema import SCHEMA_VERSION
from tests.support.clihelp import assert_one_error, dasc, deadline


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """A TP-2 storage-balanced KDA plan with kernels, and a GDN plan with a pool budget (compiled once)."""
    import torch

    from tests.support.clihelp import GDN_CONFIG, KDA_CONFIG, write_ckpt

    root = tmp_path_factory.mktemp("plans")
    kda = write_ckpt(root / "kda", KDA_CONFIG, {"model.layers.0.self_attn.A_log": torch.zeros(1, 1, 2, 1),
                                               "model.layers.0.self_attn.dt_bias": torch.tensor([0.3, 5.0, -3.0, 0.3])})
    gdn = write_ckpt(root / "gdn", GDN_CONFIG, {
        "model.layers.0.linear_attn.A_log": torch.tensor([0.0, -2.302585]),
        "model.layers.0.linear_attn.dt_bias": torch.tensor([0.3, 0.3]),
        "model.layers.2.linear_attn.A_log": torch.tensor([-2.302585, -2.302585]),
        "model.layers.2.linear_attn.dt_bias": torch.tensor([0.3, 0.3])})
    assert dasc("compile", kda, "--wmax", 4, "--tp", 2, "--balance", "storage", "--out", root / "kda.dasc").code == 0
    assert dasc("compile", gdn, "--wmax", 16, "--pool-budget", 10_000, "--out", root / "gdn.dasc").code == 0
    return {"kda": root / "kda.dasc", "gdn": root / "gdn.dasc"}


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _reseal(path: Path, edit) -> None:
    """Apply ``edit(raw)`` to plan.json and write it back with a valid content hash (a deliberate forgery)."""
    from dasc_compile.schema import Plan, canonical_json, with_content_hash

    raw = json.loads((path / "plan.json").read_text())
    edit(raw)
    (path / "plan.json").write_text(canonical_json(with_content_hash(Plan.model_validate(raw))))


def _refused(path: Path, *needles: str, tmp_path: Path) -> None:
    for extra in ([], ["--json"], ["--plot", tmp_path / "fig.png"]):
        with deadline(30):
            r = dasc("inspect", path, *extra)
        assert_one_error(r, *needles)
        assert r.out == ""
        assert not (tmp_path / "fig.png").exists()


def _kernel(p: Path) -> Path:
    (k,) = p.glob("dasc_kernels_*.py")
    return k


@pytest.mark.parametrize("damage, needles", [
    ("kernel_edited", ["kernel module content", "it was edited"]),
    ("kernel_deleted", ["kernel module recorded in plan.json", "cannot be read"]),
    ("kernel_fifo", ["kernel module recorded in plan.json", "cannot be read"]),
    ("kernel_directory", ["kernel module recorded in plan.json", "cannot be read"]),
    ("plan_edited", ["plan.json", "content_hash does not match", "edited or corrupted"]),
    ("plan_truncated", ["plan.json", "not a readable JSON plan"]),
    ("plan_binary", ["plan.json", "not a readable JSON plan"]),
    ("plan_nested", ["plan.json", "nested too deeply"]),
    ("plan_deleted", ["dasc plan not found"]),
    ("schema_version", ["plan schema_version 999 is not"]),
])
def test_damaged_plan_directory(plans, tmp_path, damage, needles):
    p = _copy(plans["kda"], tmp_path / "p")
    pj, k = p / "plan.json", _kernel(p)
    if damage == "kernel_edited":
        k.write_text(k.read_text() + "\n# tuned by hand\n")
    elif damage == "kernel_deleted":
        k.unlink()
    elif damage == "kernel_fifo":
        k.unlink()
        os.mkfifo(k)
    elif damage == "kernel_directory":
        k.unlink()
        k.mkdir()
    elif damage == "plan_edited":
        pj.write_text(pj.read_text().replace('"w_max":4', '"w_max":5'))
    elif damage == "plan_truncated":
        pj.write_text(pj.read_text()[:100])
    elif damage == "plan_binary":
        pj.write_bytes(b"\xff\xfe" + os.urandom(64))
    elif damage == "plan_nested":
        pj.write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "plan_deleted":
        pj.unlink()
    elif damage == "schema_version":
        pj.write_text(pj.read_text().replace(f'"schema_version":{SCHEMA_VERSION}', '"schema_version":999', 1))
    _refused(p, *needles, tmp_path=tmp_path)


def _set(path: str, value):
    def edit(raw):
        *parents, last = path.split(".")
        d = raw
        for k in parents:
            d = d[int(k)] if isinstance(d, list) else d[k]
        if isinstance(d, list):
            d[int(last)] = value
        else:
            d[last] = value
    return edit


# edits re-sealed with a fresh content hash: only the consistency checks can catch them
KDA_FORGERIES = [
    ("unit_out_of_range", "layers.0.kept_units", [0, 2, 99], ["'layers[0].kept_units' holds unit id 99 outside [0, 4)"]),
    ("unit_negative", "layers.0.kept_units", [-1, 0, 2], ["'layers[0].kept_units' holds unit id -1"]),
    ("units_unsorted", "layers.0.kept_units", [3, 2, 0], ["'layers[0].kept_units' must be sorted"]),
    ("n_kept", "layers.0.n_kept", 2, ["'layers[0].n_kept' = 2, expected 3"]),
    ("n_units", "layers.0.n_units", 8, ["'layers[0].n_units' = 8"]),
    ("offset", "layers.0.offset", 5, ["'layers[0].offset' = 5, expected 0"]),
    ("layer_id", "layers.0.layer_id", 1, ["'layers[0].layer_id' = 1"]),
    ("totals_kept", "totals.n_kept", 4, ["'totals.n_kept' = 4, expected 3"]),
    ("totals_r_max", "totals.r_max", 9, ["'totals.r_max' = 9"]),
    ("c_temp", "totals.c_temp_ragged", 99.0, ["'totals.c_temp_ragged' = 99.0"]),
    ("c_temp_nan", "totals.c_temp_ragged", math.nan, ["'totals.c_temp_ragged'"]),
    ("c_ckpt", "totals.c_ckpt", 3.0, ["'totals.c_ckpt' = 3.0"]),
    ("bytes_kept", "layers.0.bytes_temporal_kept", 1, ["'layers[0].bytes_temporal_kept' = 1, expected 24"]),
    ("bytes_negative", "totals.bytes_conv", -72, ["'totals.bytes_conv' = -72"]),
    ("unit_bytes", "totals.unit_bytes", 7, ["'totals.unit_bytes' = 7"]),
    ("histogram_len", "layers.0.horizon_histogram", [4], ["'layers[0].horizon_histogram'"]),
    # w_max edited after compiling: the kept units no longer match the horizons the histogram records
    ("w_max_raised", "policy.w_max", 1024, ["'layers[0].n_kept' = 3, expected 0", "policy.w_max = 1024"]),
    ("w_max_lowered", "policy.w_max", 0, ["'layers[0].n_kept' = 3, expected 4", "policy.w_max = 0"]),
    ("w_max_null", "policy.w_max", None, ["'policy.w_max' = None"]),
    ("a_s_null", "policy.a_s", None, ["'policy.a_s' = None"]),          # eval would compute horizons from it
    ("quantiles_nan", "layers.0.horizon_quantiles.p50", math.nan, ["'layers[0].horizon_quantiles' must be ordered"]),
    ("refresh_window", "layers.0.refresh_window", 4096, ["'layers[0].refresh_window' = 4096", "Eq. 7"]),
    ("refresh_cap", "refresh.w_replay_cap", 64, ["'refresh.w_replay_cap' = 64"]),
    ("any_local", "refresh.any_local", False, ["'refresh.any_local' = False"]),
    ("tp_size", "tp.tp_size", 4, ["'tp.tp_size' = 4"]),
    ("rank_counts", "tp.kept_per_rank_layer", [[3], [1]], ["'tp.kept_per_rank_layer'"]),
    ("payload_bytes", "tp.payload_storage.0.bytes_per_slot", 1, ["'tp.payload_storage[0].bytes_per_slot' = 1"]),
    ("payload_alloc", "tp.payload_storage.1.n_kept", 50, ["'tp.payload_storage[1].n_kept' = 50"]),
    ("bottleneck", "tp.bottleneck_bytes_per_slot", 1, ["'tp.bottleneck_bytes_per_slot' = 1"]),
    ("bottleneck_rank", "tp.bottleneck_rank", 1, ["'tp.bottleneck_rank' = 1"]),
    ("c_ckpt_tp", "tp.c_ckpt_tp", 9.5, ["'tp.c_ckpt_tp' = 9.5"]),
    ("dense_per_slot", "tp.bytes_dense_per_slot", 1, ["'tp.bytes_dense_per_slot' = 1"]),
    ("storage_targets", "tp.storage.targets", [1, 1], ["'tp.storage.targets'"]),
    ("kernel_path_escape", "kernels.file", "../dasc_kernels_x.py", ["'kernels.file'", "inside the plan directory"]),
]
GDN_FORGERIES = [
    ("usable_slots", "totals.usable_slots", 1000, ["'totals.usable_slots' = 1000"]),
    ("usable_slots_tp", "tp.usable_slots", 1000, ["'tp.usable_slots' = 1000"]),
    ("heads_per_rank", "tp.heads_per_rank", 3, ["'tp.heads_per_rank'"]),
]


@pytest.mark.parametrize("case, field, value, needles", KDA_FORGERIES + GDN_FORGERIES,
                         ids=[c[0] for c in KDA_FORGERIES + GDN_FORGERIES])
def test_rehashed_impossible_plan_is_refused(plans, tmp_path, case, field, value, needles):
    src = plans["gdn"] if (case, field, value, needles) in GDN_FORGERIES else plans["kda"]
    p = _copy(src, tmp_path / "p")
    _reseal(p, _set(field, value))
    _refused(p, "plan.json", *needles, tmp_path=tmp_path)


def test_intact_plans_are_shown(plans, tmp_path):
    for p in plans.values():
        r = dasc("inspect", p)
        assert r.code == 0 and r.err == "", r.err
        assert json.loads(dasc("inspect", p, "--json").out)["totals"]["n_units"] > 0
    r = dasc("inspect", plans["kda"], "--plot", tmp_path / "fig.png")
    assert r.code == 0 and (tmp_path / "fig.png").stat().st_size > 0


def test_plot_that_cannot_be_written_is_one_line(plans, tmp_path):
    (tmp_path / "afile").write_text("x")
    for target, needle in ((tmp_path / "afile" / "fig.png", "afile/fig.png"), (tmp_path / "fig.svg", ".png")):
        r = dasc("inspect", plans["gdn"], "--plot", target)
        assert_one_error(r, needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
