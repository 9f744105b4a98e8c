"""The horizon bounds a plan records per layer (``horizon_local_max``, ``horizon_global_min``) and the plan reader's
check of ``policy.w_max`` against them (dasc_compile.schema.cutoff), on a hand-made GDN checkpoint whose horizons
are computed by hand (Eq. 2, Eq. 3).

Layer 0, 4 value heads, A_log = [ln 4, 0, ln 0.5, ln 0.1], dt_bias 0.3, a_s -0.3, eps 1e-3:
H_s = ln(1000) / (exp(A_log) softplus(0)) = [2.49, 9.97, 19.93, 99.66] tokens, in the bins [2, 4), [8, 16),
[16, 32), [64, 128); at w_max 16 it keeps heads {2, 3}: horizon_local_max 9.97, horizon_global_min 19.93,
refresh window clamp(next_pow2(9.97), 4, 16) = 16 (Eq. 7). Layer 2: A_log = ln 0.1 everywhere, H_s = 99.66, all
kept: horizon_local_max null, horizon_global_min 99.66, refresh window 0.

w_max 16 -> 20 stays in the bin [16, 32) that holds 19.93, so the histogram's kept-count bounds allow it; the
bounds do not (20 >= 19.93 would keep head 2 no more). w_max 17 .. 19 select the same heads and are accepted.
Also here, as the other edit a redone hash cannot see: a value edited only in its JSON type ("16" for 16).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from dasc_compile.compiler import compile_plan
from dasc_compile.errors import DascInputError
from dasc_compile.policy import Policy
from dasc_compile.schema import Plan, canonical_json, load_plan, with_content_hash
from dasc_compile.schema.cutoff import kept_bounds
from tests.support.clihelp import assert_one_error, dasc, write_ckpt

A_LOG_0 = [math.log(4.0), 0.0, math.log(0.5), math.log(0.1)]
A_LOG_2 = [math.log(0.1)] * 4
CONFIG = {"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 4,
          "full_attention_interval": 2, "linear_num_key_heads": 1, "linear_num_value_heads": 4,
          "linear_key_head_dim": 4, "linear_value_head_dim": 4, "linear_conv_kernel_dim": 4}


def hand_h(a_log: float, dt_bias: float = 0.3, a_s: float = -0.3, eps: float = 1e-3) -> float:
    """Eq. 3 of Eq. 2's GDN gate, from the float32 values the checkpoint stores."""
    a, d = (float(torch.tensor(x, dtype=torch.float32)) for x in (a_log, dt_bias))
    return math.log(eps) / -(math.exp(a) * math.log1p(math.exp(a_s + d)))


H0 = [hand_h(a) for a in A_LOG_0]       # [2.49, 9.97, 19.93, 99.66]
H2 = hand_h(A_LOG_2[0])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return write_ckpt(tmp_path_factory.mktemp("ckpt") / "gdn", CONFIG, _tensors(torch.tensor(A_LOG_2)))


def _tensors(a_log_2: torch.Tensor, dt_bias_2: float = 0.3) -> dict:
    return {"model.layers.0.linear_attn.A_log": torch.tensor(A_LOG_0),
            "model.layers.0.linear_attn.dt_bias": torch.full((4,), 0.3),
            "model.layers.2.linear_attn.A_log": a_log_2, "model.layers.2.linear_attn.dt_bias": torch.full((4,), dt_bias_2)}


@pytest.fixture(scope="module")
def compiled(ckpt, tmp_path_factory):
    return compile_plan(ckpt, Policy(w_max=16), tmp_path_factory.mktemp("plan") / "w16.dasc")


def _forged(src: Path, dst: Path, edit) -> Path:
    """A copy of plan ``src`` with ``edit(raw)`` applied and its content hash redone."""
    shutil.copytree(src, dst)
    raw = json.loads((dst / "plan.json").read_text())
    edit(raw)
    (dst / "plan.json").write_text(canonical_json(with_content_hash(Plan.model_validate(raw))))
    return dst


def _set_w_max(w):
    return lambda raw: raw["policy"].update(w_max=w)


def test_bounds_are_the_hand_computed_horizons(compiled):
    plan, path = compiled
    assert H0 == pytest.approx([2.4914, 9.9658, 19.9316, 99.6578], abs=1e-4) and H2 == pytest.approx(99.6578, abs=1e-4)
    l0, l2 = plan.layers
    assert [l0.kept_units, l2.kept_units] == [[2, 3], [0, 1, 2, 3]]
    assert l0.horizon_local_max == pytest.approx(H0[1], rel=1e-12)
    assert l0.horizon_global_min == pytest.approx(H0[2], rel=1e-12)
    assert l2.horizon_local_max is None and l2.horizon_global_min == pytest.approx(H2, rel=1e-12)
    assert [l0.refresh_window, l2.refresh_window] == [16, 0]
    # in plan.json: floats in tokens, null for an empty set
    raw = json.loads((path / "plan.json").read_text())["layers"]
    assert raw[1]["horizon_local_max"] is None and isinstance(raw[0]["horizon_global_min"], float)
    assert load_plan(path) == plan


def test_infinite_horizon_is_written_as_in_the_quantiles(tmp_path):
    """Kept units that never decay (softplus(a_s - 1000) underflows to 0 -> g_s = 0 -> H_s inf) make
    horizon_global_min "Infinity", as horizon_quantiles writes it."""
    ck = write_ckpt(tmp_path / "inf", CONFIG, _tensors(torch.zeros(4), dt_bias_2=-1000.0))
    plan, path = compile_plan(ck, Policy(w_max=16), tmp_path / "p", with_kernels=False)
    assert math.isinf(plan.layers[1].horizon_global_min)
    raw = json.loads((path / "plan.json").read_text())["layers"][1]
    assert raw["horizon_global_min"] == raw["horizon_quantiles"]["min"] == "Infinity"
    assert load_plan(path) == plan


def test_w_max_edited_inside_one_histogram_bin_is_refused(compiled, tmp_path):
    plan, src = compiled
    # the defect: the histogram's kept-count bounds alone allow w_max 20 (no unit crosses a bin edge)
    for lp in plan.layers:
        lo, hi = kept_bounds(plan.horizon_bin_edges, lp.horizon_histogram, 20)
        assert lo <= lp.n_kept <= hi
    p = _forged(src, tmp_path / "w20.dasc", _set_w_max(20))
    with pytest.raises(DascInputError) as e:
        load_plan(p)
    l0 = plan.layers[0]
    # 16 to 19: w_max >= 16 keeps layer 0's Eq. 7 window at next_pow2(9.97) = 16, and w_max < 19.93 its selection
    assert str(e.value) == (
        f"{p / 'plan.json'}: plan field 'policy.w_max' = 20, expected an integer from 16 to 19 (the cutoffs that "
        f"select its kept units, layers[0].horizon_local_max {l0.horizon_local_max!r} <= w_max, w_max < "
        f"layers[0].horizon_global_min {l0.horizon_global_min!r}, a horizon equal to w_max being local, §4.1, and "
        f"give its refresh windows, Eq. 7); the plan was edited or corrupted; recompile it")
    # the commands that read plans (and the runtime, through the same load_plan) refuse it in one line
    assert_one_error(dasc("inspect", p), "'policy.w_max' = 20", "horizon_global_min")
    assert_one_error(dasc("size", p, "--budget", "1GiB", "--max-running-requests", 8), "'policy.w_max' = 20")


@pytest.mark.parametrize("w_max, accepted", [(15, False), (16, True), (17, True), (19, True), (20, False)])
def test_the_range_the_refusal_names_is_exactly_what_is_accepted(compiled, tmp_path, w_max, accepted):
    """The refusal above names 16 to 19: each is accepted, and its neighbours are refused (15 by its Eq. 7 window,
    clamp(16, 4, 15) = 15 against the recorded 16; 20 by the selection)."""
    p = _forged(compiled[1], tmp_path / "w.dasc", _set_w_max(w_max))
    if accepted:
        assert load_plan(p).policy.w_max == w_max
    else:
        with pytest.raises(DascInputError, match=r"'layers\[0\].refresh_window' = 16, expected 15" if w_max == 15
                           else r"'policy.w_max' = 20, expected an integer from 16 to 19"):
            load_plan(p)


@pytest.mark.parametrize("w_max", [17, 18, 19])
def test_w_max_edit_that_selects_the_same_units_is_accepted(compiled, tmp_path, w_max):
    p = _forged(compiled[1], tmp_path / "same.dasc", _set_w_max(w_max))
    plan = load_plan(p)
    assert plan.policy.w_max == w_max and plan.layers == compiled[0].layers


def test_random_plan_records_the_units_it_drew_and_is_accepted(ckpt, tmp_path):
    # seed 4 draws heads {0, 3} of layer 0 (H 2.49 and 99.66): its bounds are not ordered around w_max
    plan, path = compile_plan(ckpt, Policy(w_max=16, random_seed=4), tmp_path / "rnd", with_kernels=False)
    l0 = plan.layers[0]
    assert plan.selection == "random" and l0.kept_units == [0, 3]
    assert l0.horizon_global_min == pytest.approx(H0[0], rel=1e-12) and l0.horizon_global_min < 16
    assert l0.horizon_local_max == pytest.approx(H0[2], rel=1e-12) and l0.horizon_local_max > 16
    assert l0.refresh_window == 16             # clamp(next_pow2(19.93) = 32, 4, 16)
    assert load_plan(path) == plan
    # the reader takes the selection from policy.random_seed: a Random plan relabelled 'horizon' is refused
    p = _forged(path, tmp_path / "relabelled", lambda raw: raw.update(selection="horizon"))
    with pytest.raises(DascInputError, match=r"plan field 'selection' = 'horizon', expected 'random'"):
        load_plan(p)


def _layer_field(i: int, name: str, value):
    return lambda raw: raw["layers"][i].update({name: value})


@pytest.mark.parametrize("i, name, value, needle", [
    (0, "horizon_global_min", 2.0, "'layers[0].horizon_global_min' = 2.0, expected a value in [2.49"),
    (0, "horizon_local_max", math.nan, "'layers[0].horizon_local_max' = nan, expected a value in [2.49"),
    (0, "horizon_global_min", 40.0, "'layers[0].horizon_global_min' = 40.0, expected a horizon in a bin of its "
                                    "horizon_histogram that holds units (it falls in the bin from 32.0 tokens, which "
                                    "holds none)"),
    (0, "horizon_local_max", 5.0, "'layers[0].horizon_local_max' = 5.0, expected a horizon in a bin"),
    (0, "horizon_local_max", 17.0, "'policy.w_max' = 16, expected no integer: its layers' bounds and refresh windows "
                                   "exclude every cutoff (the cutoffs that select its kept units, "
                                   "layers[0].horizon_local_max 17.0 <= w_max, w_max < layers[0].horizon_global_min 19.93"),
    (0, "horizon_global_min", None, "'layers[0].horizon_global_min' = None, expected a horizon in tokens"),
    (1, "horizon_local_max", 99.0, "'layers[1].horizon_local_max' = 99.0, expected null"),
    (1, "horizon_global_min", 120.0, "'layers[1].horizon_global_min' = 120.0, expected 99.65"),
])
def test_edited_bound_is_refused(compiled, tmp_path, i, name, value, needle):
    p = _forged(compiled[1], tmp_path / "edited.dasc", _layer_field(i, name, value))
    with pytest.raises(DascInputError) as e:
        load_plan(p)
    msg = str(e.value)
    assert msg.startswith(f"{p / 'plan.json'}: plan field '") and needle in msg and "\n" not in msg, msg
    assert msg.endswith("the plan was edited or corrupted; recompile it")


def test_edited_refresh_window_names_eq7(compiled, tmp_path):
    p = _forged(compiled[1], tmp_path / "rw.dasc", _layer_field(0, "refresh_window", 8))
    with pytest.raises(DascInputError, match=r"'layers\[0\].refresh_window' = 8, expected 16 \(clamp\(next_pow2"
                                             r"\(horizon_local_max\), 4, w_max\), 0 when no unit is omitted, Eq. 7\)"):
        load_plan(p)


@pytest.mark.parametrize("field, value, shown, written", [
    (("policy", "w_max"), "16", '"16"', "16"),
    (("policy", "w_max"), 16.0, "16.0", "16"),
    (("policy", "int8"), 0, "0", "false"),
    (("layers", 0, "n_kept"), "2", '"2"', "2"),
])
def test_a_value_edited_only_in_its_json_type_is_refused(compiled, tmp_path, field, value, shown, written):
    """Validation reads "16", 16.0 and 16 alike (and 0 as false), so the content hash of the validated plan cannot
    see such an edit; the reader compares the file with the plan as dasc writes it. Re-indenting is no edit."""
    dst = tmp_path / "typed.dasc"
    shutil.copytree(compiled[1], dst)
    raw = json.loads((dst / "plan.json").read_text())
    (dst / "plan.json").write_text(json.dumps(raw, indent=2))         # a JSON tool's layout: the same plan
    assert load_plan(dst) == compiled[0]
    *parents, key = field
    node = raw
    for k in parents:
        node = node[k]
    assert json.dumps(node[key]) == written
    node[key] = value
    (dst / "plan.json").write_text(json.dumps(raw, indent=2))
    where = ".".join(str(k) for k in parents).replace(".0", "[0]") + f".{key}"
    with pytest.raises(DascInputError) as e:
        load_plan(dst)
    assert str(e.value) == (f"{dst / 'plan.json'}: plan field '{where}' = {shown}, expected {written} as dasc writes "
                            f"it (validation reads both alike, the content hash cannot tell them apart): the plan was "
                            f"edited or corrupted; recompile it")


def test_json_tool_forms_are_the_same_plan_and_a_missing_key_is_named(compiled, tmp_path):
    """jq writes dasc's -5.0 as -5: a whole number where dasc wrote a float is the same value (the reverse, 16.0
    for an integer, is refused above). A key the file lacks is named as missing, not shown as null."""
    dst = tmp_path / "jq.dasc"
    shutil.copytree(compiled[1], dst)
    raw = json.loads((dst / "plan.json").read_text())
    assert raw["policy"]["safe_gate_lower_bound"] == -5.0 and isinstance(raw["policy"]["safe_gate_lower_bound"], float)
    raw["policy"]["safe_gate_lower_bound"] = -5
    (dst / "plan.json").write_text(json.dumps(raw, indent=1))
    assert load_plan(dst) == compiled[0]
    del raw["tp"]["m_remote"]           # its default is what dasc writes, so the hash alone passes it
    (dst / "plan.json").write_text(json.dumps(raw))
    with pytest.raises(DascInputError) as e:
        load_plan(dst)
    assert str(e.value).startswith(f"{dst / 'plan.json'}: plan field 'tp.m_remote' missing, expected 0 as dasc "
                                   f"writes it"), str(e.value)


def test_a_single_cutoff_is_named_as_one_value(tmp_path):
    """The calibrated Kimi-Linear reference at w_max 16 has a local horizon of 15.9998 (layer 9) and a kept one of
    16.0004 (layer 6): 16 is the only cutoff that selects its units, and the refusal says so."""
    from tests.support.clihelp import ROOT

    src = compile_plan(ROOT / "plans/reference/kimi-linear-48b-a3b-calibrated", Policy(w_max=16), tmp_path / "k")[1]
    with pytest.raises(DascInputError, match=r"plan field 'policy.w_max' = 17, expected 16 \(the cutoffs that select "
                                             r"its kept units, layers\[9\].horizon_local_max 15.99"):
        load_plan(_forged(src, tmp_path / "k17", _set_w_max(17)))


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_kernel_constants_in_any_key_order_are_the_same_plan(compiled, tmp_path, order):
    """jq -S and json.tool --sort-keys rewrite every object's keys in sorted order, kernels.constants too; their order
    carries no meaning, so such a rewrite (or any other key order) is the plan dasc wrote. Schema 4 hashed them in the
    compiler's order, and a sorted rewrite failed the content hash."""
    dst = tmp_path / f"{order}.dasc"
    shutil.copytree(compiled[1], dst)
    raw = json.loads((dst / "plan.json").read_text())
    consts = raw["kernels"]["constants"]
    assert len(consts) > 10 and list(consts) == sorted(consts)       # dasc writes them sorted
    if order == "sorted":
        (dst / "plan.json").write_text(json.dumps(raw, indent=2, sort_keys=True))
    else:
        raw["kernels"]["constants"] = dict(reversed(consts.items()))
        (dst / "plan.json").write_text(json.dumps(raw))
    assert load_plan(dst) == compiled[0]
    raw = json.loads((dst / "plan.json").read_text())
    raw["kernels"]["constants"]["DK"] += 1                            # a value edit is still one
    (dst / "plan.json").write_text(json.dumps(raw))
    with pytest.raises(DascInputError, match="content_hash does not match the plan.s content"):
        load_plan(dst)
