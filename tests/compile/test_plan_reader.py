"""The one plan reader (dasc_compile.schema.reader): consistency checks and the kernel file, each a
one-line DascInputError naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dasc_compile.cli import app
from dasc_compile.compiler import compile_plan
from dasc_compile.errors import DascInputError
from dasc_compile.policy import Policy
from dasc_compile.schema import Plan, canonical_json, load_plan, with_content_hash

REF = Path(__file__).resolve().parents[2] / "plans" / "reference"


@pytest.fixture(scope="module")
def kimi_tp2(tmp_path_factory):
    """Kimi-Linear reference plan, W_max 64, TP 2 with storage balancing, kernels rendered."""
    out = tmp_path_factory.mktemp("plan") / "kimi.dasc"
    plan, path = compile_plan(REF / "kimi-linear-48b-a3b", Policy(w_max=64, tp_size=2, balance="storage"), out)
    return plan, path


def _rewrite(path: Path, edit) -> Path:
    """Apply ``edit(raw_dict)`` to plan.json and re-seal it with a valid content hash."""
    raw = json.loads((path / "plan.json").read_text())
    edit(raw)
    (path / "plan.json").write_text(canonical_json(with_content_hash(Plan.model_validate(raw))))
    return path / "plan.json"


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_compiled_plan_loads(kimi_tp2):
    plan, path = kimi_tp2
    assert load_plan(path) == plan and plan.kernels is not None
    assert plan.tp.storage.n_packed == plan.tp.storage.n_local == [sum(r) for r in plan.tp.kept_per_rank_layer]


@pytest.mark.parametrize("field,edit", [
    ("layers[1].offset", lambda r: r["layers"][1].update(offset=r["layers"][1]["offset"] + 1)),
    ("layers[0].n_kept", lambda r: r["layers"][0].update(n_kept=r["layers"][0]["n_kept"] - 1)),
    ("layers[0].kept_units", lambda r: r["layers"][0]["kept_units"].__setitem__(-1, 4096)),
    ("layers[2].kept_units", lambda r: r["layers"][2]["kept_units"].__setitem__(1, r["layers"][2]["kept_units"][0])),
    ("layers[0].units_per_head", lambda r: r["layers"][0].update(units_per_head=1)),
    ("totals.n_kept", lambda r: r["totals"].update(n_kept=r["totals"]["n_kept"] + 1)),
    ("totals.unit_bytes", lambda r: r["totals"].update(unit_bytes=513)),
    ("tp.kept_per_rank_layer", lambda r: r["tp"]["kept_per_rank_layer"][0].__setitem__(0, 0)),
    ("tp.storage.n_local", lambda r: r["tp"]["storage"]["n_local"].__setitem__(0, 1)),
    ("model.recurrent_layer_ids", lambda r: r["model"]["recurrent_layer_ids"].pop()),
])
def test_inconsistent_plan_names_file_and_field(kimi_tp2, tmp_path, field, edit):
    path = _copy(kimi_tp2[1], tmp_path / "p")
    pj = _rewrite(path, edit)
    with pytest.raises(DascInputError) as e:
        load_plan(path)
    msg = str(e.value)
    assert msg.startswith(f"{pj}: plan field '{field}'") and "\n" not in msg


@pytest.mark.parametrize("name, value, want", [("DK", 129, 128), ("HEADS", 32, 16), ("INT8", True, False),
                                               ("UNIT_KIND", "gdn_head", "kda_column"), ("CONV0_COLS", 1, 6144)])
def test_kernel_constants_the_plan_decides_are_checked(kimi_tp2, tmp_path, name, value, want):
    """A forged ``kernels.constants`` entry (hash redone) that the model and policy decide is refused by value: the
    Kimi-Linear reference at TP 2 has d_k 128, 16 of 32 heads per rank, no INT8, conv (K-1, 3*H*d / P) =
    (3, 6144); a tile choice of another dasc version is not the plan's to decide and is accepted."""
    plan = kimi_tp2[0]
    assert plan.kernels.constants[name] == want
    path = _copy(kimi_tp2[1], tmp_path / "p")
    pj = _rewrite(path, lambda r: r["kernels"]["constants"].update({name: value}))
    with pytest.raises(DascInputError) as e:
        load_plan(path, verify_kernels=False)
    assert str(e.value) == (f"{pj}: plan field 'kernels.constants.{name}' = {value!r}, expected {want!r} (what the "
                            f"plan's model and policy give its kernels; the plan was edited or corrupted)")
    tiles = _copy(kimi_tp2[1], tmp_path / "t")
    _rewrite(tiles, lambda r: r["kernels"]["constants"].update(NUM_WARPS=4, BLOCK_V=1))
    assert load_plan(tiles, verify_kernels=False).kernels.constants["NUM_WARPS"] == 4
    ops = _copy(kimi_tp2[1], tmp_path / "o")
    _rewrite(ops, lambda r: r["kernels"]["ops"].append("pack_int8"))
    with pytest.raises(DascInputError, match=r"plan field 'kernels.ops' = \['pack', 'load', 'refresh_copy', "
                                             r"'pack_int8'\], expected \['pack', 'load', 'refresh_copy'\]"):
        load_plan(ops, verify_kernels=False)


def test_offsets_are_checked_against_kept_counts_by_value(kimi_tp2, tmp_path):
    path = _copy(kimi_tp2[1], tmp_path / "p")
    _rewrite(path, lambda r: r["layers"][1].update(offset=0))
    want = kimi_tp2[0].layers[0].n_kept
    with pytest.raises(DascInputError, match=rf"'layers\[1\].offset' = 0, expected {want} \(ragged offset"):
        load_plan(path)


def test_missing_or_edited_kernel_file(kimi_tp2, tmp_path):
    plan, src = kimi_tp2
    path = _copy(src, tmp_path / "p")
    kfile = path / plan.kernels.file
    kfile.write_text(kfile.read_text() + "# edited\n")
    with pytest.raises(DascInputError, match=rf"^{kfile}: kernel module content .* it was edited"):
        load_plan(path)
    assert load_plan(path, verify_kernels=False) == plan
    kfile.unlink()
    with pytest.raises(DascInputError, match=rf"^{kfile}: kernel module recorded in plan.json .* cannot be read"):
        load_plan(path / "plan.json")
    assert load_plan(path, verify_kernels=False) == plan


def test_inspect_reports_a_missing_kernel_file_as_one_error_line(kimi_tp2, tmp_path):
    plan, src = kimi_tp2
    path = _copy(src, tmp_path / "p")
    (path / plan.kernels.file).unlink()
    r = CliRunner().invoke(app, ["inspect", str(path)])
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path / plan.kernels.file}: kernel module recorded")


@pytest.mark.parametrize("old, new, key", [('"w_max":64', '"w_max":999,"w_max":64', "w_max"),
                                           ('"offset":0', '"offset":0,"offset":0', "offset")])
def test_a_key_given_twice_is_refused(kimi_tp2, tmp_path, old, new, key):
    """Python's JSON keeps a repeated key's last value, so an edit written before it would pass the content hash;
    the reader refuses the repeat itself, the same value twice too, and dasc compile will not replace such a file."""
    path = _copy(kimi_tp2[1], tmp_path / "p")
    pj = path / "plan.json"
    text = pj.read_text()
    assert text.count(old) >= 1
    pj.write_text(text.replace(old, new, 1))
    with pytest.raises(DascInputError) as e:
        load_plan(path)
    assert str(e.value) == (f"{pj}: key '{key}' appears twice in one JSON object; dasc writes each key once and the "
                            f"content hash sees only the last: the plan was edited or corrupted; recompile it")
    from dasc_compile.artifact import is_dasc_plan_file

    assert is_dasc_plan_file(pj) == (False, f"key '{key}' appears twice in one JSON object (edited since dasc wrote "
                                            f"it)")
    pj.write_text(text)
    assert load_plan(path) == kimi_tp2[0] and is_dasc_plan_file(pj) == (True, "")


def test_a_plan_json_that_is_not_a_file_is_named_so(tmp_path):
    import os

    os.mkfifo(tmp_path / "plan.json")           # exists, but is no file to read (a directory is read as holding one)
    with pytest.raises(DascInputError, match=r"plan.json: not a regular file \(a dasc plan is the file plan.json\)$"):
        load_plan(tmp_path / "plan.json")
    with pytest.raises(DascInputError, match=r"dasc plan not found"):
        load_plan(tmp_path / "nothing" / "plan.json")


@pytest.mark.parametrize("digits, refused", [(20, False), (21, True), (5000, True)])
def test_an_over_long_integer_is_named_by_its_digits(kimi_tp2, tmp_path, digits, refused):
    """Past 4,300 digits Python's own message named sys.set_int_max_str_digits; the reader counts the digits
    first. Twenty digits still parse (and fail the plan's own checks, not the JSON reading)."""
    path = _copy(kimi_tp2[1], tmp_path / "p")
    pj = path / "plan.json"
    pj.write_text(pj.read_text().replace('"w_max":64', '"w_max":' + "1" * digits, 1))
    with pytest.raises(DascInputError) as e:
        load_plan(path)
    msg = f"{pj}: not a readable JSON plan (an integer of {digits} digits; no plan field holds more than 20)"
    assert (str(e.value) == msg) is refused
    assert "set_int_max_str_digits" not in str(e.value)
    from dasc_compile.artifact import is_dasc_plan_file      # what dasc compile --out says of such a file

    why = is_dasc_plan_file(pj)[1]
    want = f"an integer of {digits} digits; no plan field holds more than 20 (edited since dasc wrote it)"
    assert (why == want) is refused
