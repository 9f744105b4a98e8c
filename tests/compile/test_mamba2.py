"""Mamba2 family (issue 23): the three reference formats compile to the kept counts of the formula, computed
here independently of dasc; hand-computed horizons; per-rank conv sizes; bad configs give one error line."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from safetensors import safe_open

from dasc_compile import refckpt as ref
from dasc_compile.arch import arch_from_config
from dasc_compile.compiler import compile_plan
from dasc_compile.policy import Policy
from dasc_compile.refckpt_mamba2 import MAMBA2_REFERENCE_CONFIGS
from dasc_compile.schema import UnitSpec, load_plan
from tests.compile.test_reference import BUNDLED
from tests.support.clihelp import assert_one_error, dasc, snapshot, write_ckpt

NAMES = list(MAMBA2_REFERENCE_CONFIGS)
W_MAX = (16, 64, 128, 512)
LN_EPS = math.log(1e-3)


def independent_kept(path, a_s: float = 0.0) -> dict[str, dict[int, list[int]]]:
    """Per A_log tensor name: {w_max: kept heads}, from the file's bytes and the issue's formula
    g = -exp(A_log) * softplus(a_s + dt_bias) (SGLang's step limit (0, inf) clamps nothing), H = ln(eps) / g."""
    out = {}
    with safe_open(str(path), "pt") as f:
        for name in sorted(f.keys()):
            if not name.endswith(".A_log"):
                continue
            a = [float(x) for x in f.get_tensor(name).double()]
            d = [float(x) for x in f.get_tensor(name[: -len("A_log")] + "dt_bias").double()]
            hs = [LN_EPS / (-math.exp(ai) * math.log1p(math.exp(a_s + di))) for ai, di in zip(a, d)]
            out[name] = {w: [h for h, x in enumerate(hs) if x > w] for w in W_MAX}
    return out


@pytest.mark.parametrize("name", NAMES)
def test_reference_plans_keep_what_the_formula_keeps(tmp_path, name):
    want = independent_kept(BUNDLED / name / "model.safetensors")
    for w in W_MAX:
        plan, _ = compile_plan(BUNDLED / name, Policy(w_max=w), tmp_path / f"w{w}", with_kernels=False)
        assert plan.model.family == "mamba2" and plan.model.unit_kind == "mamba2_head" and plan.policy.a_s == 0.0
        got = {plan.fingerprint.decay_tensors[2 * i]: lp.kept_units for i, lp in enumerate(plan.layers)}
        assert got == {n: kept[w] for n, kept in want.items()}, w
        assert load_plan(tmp_path / f"w{w}", verify_kernels=False).totals.n_kept == sum(len(k[w]) for k in want.values())


def test_reference_facts():
    """Layer counts, head shapes and conv widths from the configs' sources (refckpt_mamba2 docstring)."""
    facts = {  # name: (recurrent layers, first A_log, H, head_dim, d_state, n_groups, conv_dim)
        "nemotron-h-8b-base-8k": (24, "backbone.layers.0.mixer.A_log", 128, 64, 128, 8, 128 * 64 + 2 * 8 * 128),
        "granite-4.0-h-tiny": (36, "model.layers.0.mamba.A_log", 48, 64, 128, 1, 48 * 64 + 2 * 128),
        "falcon-h1-0.5b": (36, "model.layers.0.mamba.A_log", 24, 64, 128, 1, 24 * 64 + 2 * 128),
    }
    for name, (n_rec, first, h, p, n, g, conv) in facts.items():
        spec = arch_from_config(MAMBA2_REFERENCE_CONFIGS[name])
        assert (len(spec.recurrent_layer_ids), spec.a_log_names[0], spec.num_value_heads, spec.head_v_dim,
                spec.head_k_dim, spec.conv_groups, spec.conv_dim) == (n_rec, first, h, p, n, g, conv)
        with safe_open(str(BUNDLED / name / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
            assert keys == set(spec.a_log_names) | set(spec.dt_bias_names)
            for k in keys:
                sl = f.get_slice(k)
                assert (tuple(sl.get_shape()), sl.get_dtype()) == ((h,), "F32")
            assert f.metadata()["dasc_provenance"].startswith("initialisation draw, not trained: ")
    nem = arch_from_config(MAMBA2_REFERENCE_CONFIGS["nemotron-h-8b-base-8k"])
    assert nem.full_attention_layer_ids == (7, 18, 29, 40)        # the four '*' of M-M-M-M*-...
    gra = arch_from_config(MAMBA2_REFERENCE_CONFIGS["granite-4.0-h-tiny"])
    assert gra.full_attention_layer_ids == (5, 15, 25, 35)


@pytest.mark.parametrize("name, mix", [
    ("nemotron-h-8b-base-8k", "24 recurrent + 4 full-attention + 24 MLP / MoE (no state) of 52 layers;"),
    ("granite-4.0-h-tiny", "36 recurrent + 4 full-attention of 40 layers;"),
    ("falcon-h1-0.5b", "36 layers, each with a recurrent mixer beside full attention;"),
])
def test_inspect_accounts_for_every_layer(tmp_path, name, mix):
    """Nemotron-H's pattern has stateless MLP blocks ('-') and Falcon-H1 runs Mamba2 beside attention in
    each layer: `dasc inspect`'s model line must add up to num_hidden_layers either way."""
    from rich.console import Console
    from dasc_compile.inspect import render_report
    plan, _ = compile_plan(BUNDLED / name, Policy(w_max=64), tmp_path / "p", with_kernels=False)
    con = Console(record=True, width=400)
    render_report(plan, con)
    text = con.export_text()
    assert f"mamba2 / mamba2_head: {mix}" in text
    # Granite's and Falcon's initialisation draws keep no head at w_max 64: inspect repeats compile's warning
    assert ("warning: nothing is kept" in text) == (plan.totals.n_kept == 0) and "W_l wr: the tokens" in text


@pytest.mark.parametrize("name", NAMES)
def test_bundled_references_are_reproducible(tmp_path, name):
    out = ref.write_decay_only(name, tmp_path / name, seed=0)
    for f in ("config.json", "model.safetensors"):
        assert (out / f).read_bytes() == (BUNDLED / name / f).read_bytes(), f


def test_initialisation_draws_are_each_models_own():
    tensors, scheme = ref.draw_decay(MAMBA2_REFERENCE_CONFIGS["granite-4.0-h-tiny"])
    assert "dt_bias = 1" in scheme
    assert torch.equal(tensors[0][1], torch.log(torch.arange(1, 49, dtype=torch.float64)).float())
    assert bool((tensors[1][1] == 1).all())
    tensors, scheme = ref.draw_decay(MAMBA2_REFERENCE_CONFIGS["nemotron-h-8b-base-8k"], seed=4)
    dt = torch.nn.functional.softplus(torch.stack([t for n, t in tensors if n.endswith("dt_bias")]).double())
    assert dt.shape == (24, 128) and 1e-3 * (1 - 1e-5) <= dt.min() and dt.max() <= 0.1 * (1 + 1e-5)
    assert abs(dt.log10().mean().item() + 2) < 0.03          # log-uniform on [1e-3, 1e-1]


# ---- hand-computed horizons -----------------------------------------------------------------------

TINY_NEMOTRON = {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "num_hidden_layers": 4,
                 "hybrid_override_pattern": "M*M-", "mamba_num_heads": 4, "mamba_head_dim": 2, "ssm_state_size": 3,
                 "n_groups": 2, "conv_kernel": 4}


def _inv_softplus(x: float) -> float:
    return math.log(math.expm1(x))


def tiny_tensors():
    # layer 0: A = [1, 2, 4, 8], dt = 0.01 -> H = 690.8 / A = [690.8, 345.4, 172.7, 86.3] tokens
    # layer 2: A = 1, dt = [1, 0.1, 0.02, 0.001] -> H = [6.9, 69.1, 345.4, 6907.8] tokens
    return {
        "backbone.layers.0.mixer.A_log": torch.log(torch.tensor([1.0, 2.0, 4.0, 8.0])),
        "backbone.layers.0.mixer.dt_bias": torch.full((4,), _inv_softplus(0.01)),
        "backbone.layers.2.mixer.A_log": torch.zeros(4),
        "backbone.layers.2.mixer.dt_bias": torch.tensor([_inv_softplus(x) for x in (1.0, 0.1, 0.02, 0.001)]),
    }


@pytest.mark.parametrize("w_max,kept0,kept2", [(16, [0, 1, 2, 3], [1, 2, 3]), (100, [0, 1, 2], [2, 3]),
                                                 (512, [0], [3]), (7000, [], [])])
def test_hand_computed_horizons(tmp_path, w_max, kept0, kept2):
    ck = write_ckpt(tmp_path / "ck", TINY_NEMOTRON, tiny_tensors())
    plan, _ = compile_plan(ck, Policy(w_max=w_max), tmp_path / "out", with_kernels=False)
    assert [lp.kept_units for lp in plan.layers] == [kept0, kept2]
    assert plan.layers[0].horizon_quantiles.max == pytest.approx(6.907755 / 0.01, rel=1e-5)
    assert plan.layers[1].horizon_quantiles.min == pytest.approx(6.907755, rel=1e-5)
    # unit = head [head_dim 2, d_state 3] FP32; conv (4*2 + 2*2*3, K-1 = 3) BF16 per layer
    assert plan.totals.unit_bytes == 2 * 3 * 4 and plan.layers[0].bytes_conv == 20 * 3 * 2
    served = plan.fingerprint.served
    assert served.names[:2] == ["model.layers.0.mixer.A", "model.layers.0.mixer.dt_bias"]
    assert served.values[0] == pytest.approx([-1.0, -2.0, -4.0, -8.0], rel=1e-6)


def test_conv_per_rank_follows_sglang_group_sharding():
    """Mamba2StateShape: groups split with the heads; a lone group (n_groups = 1) is copied to every rank."""
    nem = arch_from_config(MAMBA2_REFERENCE_CONFIGS["nemotron-h-8b-base-8k"]).unit_spec(Policy(w_max=16))
    assert nem.conv_layer_shape(1) == (10240, 3) and nem.conv_layer_shape(8) == (1280, 3)
    gra = arch_from_config(MAMBA2_REFERENCE_CONFIGS["granite-4.0-h-tiny"]).unit_spec(Policy(w_max=16))
    assert gra.conv_layer_shape(1) == (3328, 3)
    assert gra.conv_layer_shape(2) == (3072 // 2 + 2 * 128, 3) and gra.conv_layer_shape(4) == (768 + 256, 3)
    two = UnitSpec(kind="mamba2_head", d_v=2, d_k=3, temporal_dtype="float32", conv_dim=4 * 2 + 2 * 2 * 3,
                   conv_kernel=4, conv_dtype="bfloat16", int8=False, conv_groups=2)
    assert two.conv_layer_shape(2) == (10, 3)
    with pytest.raises(Exception, match="n_groups = 2 does not split over tp_size = 4"):
        two.conv_layer_shape(4)


def test_tp2_granite_plan_charges_the_replicated_group(tmp_path):
    plan, _ = compile_plan(BUNDLED / "granite-4.0-h-tiny", Policy(w_max=16, tp_size=2), tmp_path / "o",
                           with_kernels=False)
    assert plan.tp.payload_contiguous[0].bytes_conv == 36 * 1792 * 3 * 2


# ---- bad configs: one error line, exit 2, nothing written -----------------------------------------

DELETE = object()
GRANITE = {"model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "num_hidden_layers": 2,
           "layer_types": ["mamba", "attention"], "mamba_n_heads": 4, "mamba_d_head": 2, "mamba_d_state": 3,
           "mamba_n_groups": 1, "mamba_d_conv": 4, "hidden_size": 4, "mamba_expand": 2}
GRANITE_TENSORS = {"model.layers.0.mamba.A_log": torch.zeros(4), "model.layers.0.mamba.dt_bias": torch.zeros(4)}
FALCON = {**{k: v for k, v in GRANITE.items() if k != "layer_types"}, "model_type": "falcon_h1",
          "architectures": ["FalconH1ForCausalLM"], "num_hidden_layers": 1, "mamba_d_head": "auto",
          "ssm_multipliers": [1.0, 1.0, 1.0, 1.0, 0.5]}
FALCON_TENSORS = GRANITE_TENSORS

CASES = [  # (id, base, tensors, field, value, words of the error line)
    ("nem_heads_missing", TINY_NEMOTRON, "mamba_num_heads", DELETE, ["'mamba_num_heads' is missing"]),
    ("nem_heads_float", TINY_NEMOTRON, "mamba_num_heads", 4.0, ["'mamba_num_heads'", "valid integer"]),
    ("nem_state_zero", TINY_NEMOTRON, "ssm_state_size", 0, ["'ssm_state_size'", "greater than or equal to 1"]),
    ("nem_groups_missing", TINY_NEMOTRON, "n_groups", DELETE, ["'n_groups' is missing"]),
    ("nem_groups_uneven", TINY_NEMOTRON, "n_groups", 3, ["'mamba_num_heads' (4) must be a multiple", "n_groups"]),
    ("nem_pattern_char", TINY_NEMOTRON, "hybrid_override_pattern", "M*X-", ["'hybrid_override_pattern'", "['X']"]),
    ("nem_pattern_length", TINY_NEMOTRON, "hybrid_override_pattern", "M*M", ["lists 3 layers", "'num_hidden_layers' is 4"]),
    ("nem_no_kinds", TINY_NEMOTRON, "hybrid_override_pattern", DELETE, ["no layer kinds", "'layers_block_type'"]),
    ("nem_blocks_disagree", TINY_NEMOTRON, "layers_block_type", ["mamba", "mlp", "mamba", "mlp"],
     ["'layers_block_type' and 'hybrid_override_pattern' give different layer kinds"]),
    ("nem_alias_disagree", TINY_NEMOTRON, "mamba_n_groups", 4, ["'n_groups' (2) and 'mamba_n_groups' (4) disagree"]),
    ("nem_limit_reversed", TINY_NEMOTRON, "time_step_limit", [0.1, 0.001], ["'time_step_limit'", "low <= high"]),
    ("nem_limit_negative", TINY_NEMOTRON, "time_step_limit", [-1.0, 1.0], ["'time_step_limit.0'"]),
    ("nem_limit_string", TINY_NEMOTRON, "time_step_limit", "0,inf", ["'time_step_limit'", "valid list"]),
    ("nem_no_mamba", TINY_NEMOTRON, "hybrid_override_pattern", "**--", ["makes no layer recurrent"]),
    ("gra_layer_types_missing", GRANITE, "layer_types", DELETE, ["'layer_types' is missing"]),
    ("gra_layer_type_unknown", GRANITE, "layer_types", ["mamba", "full_attention"], ["'layer_types.1'"]),
    ("gra_width_mismatch", GRANITE, "mamba_d_head", 3, ["mamba_n_heads * mamba_d_head = 4 * 3 must equal"]),
    ("gra_conv_one", GRANITE, "mamba_d_conv", 1, ["'mamba_d_conv'", "greater than or equal to 2"]),
    ("fal_multipliers_four", FALCON, "ssm_multipliers", [1.0] * 4, ["'ssm_multipliers'", "at least 5"]),
    ("fal_multiplier_nan", FALCON, "ssm_multipliers", [1.0, 1.0, 1.0, 1.0, math.nan], ["'ssm_multipliers.4'"]),
    ("fal_auto_uneven", FALCON, "mamba_n_heads", 3, ["'mamba_d_head' is 'auto'", "not a multiple of mamba_n_heads (3)"]),
]


def _edit(cfg, field, value):
    cfg = copy.deepcopy(cfg)
    if value is DELETE:
        del cfg[field]
    else:
        cfg[field] = value
    return cfg


@pytest.mark.parametrize("case,base,field,value,needles", CASES, ids=[c[0] for c in CASES])
def test_bad_mamba2_config_gives_one_error_line(tmp_path, case, base, field, value, needles):
    tensors = tiny_tensors() if base is TINY_NEMOTRON else GRANITE_TENSORS
    ck = write_ckpt(tmp_path / "ck", _edit(base, field, value), tensors)
    before = snapshot(tmp_path)
    line = assert_one_error(dasc("compile", ck, "--wmax", "16", "--out", tmp_path / "out.dasc"), *needles)
    assert "config.json" in line or "makes no layer recurrent" in line
    assert snapshot(tmp_path) == before                          # nothing written


def test_bad_tp_for_the_groups_gives_one_error_line(tmp_path):
    ck = write_ckpt(tmp_path / "ck", TINY_NEMOTRON, tiny_tensors())      # 4 heads, 2 groups
    assert_one_error(dasc("compile", ck, "--wmax", "16", "--tp", "4", "--out", tmp_path / "o"),
                     "n_groups = 2 does not split over tp_size = 4")
    assert_one_error(dasc("compile", ck, "--wmax", "16", "--tp", "2", "--balance", "hybrid", "--out", tmp_path / "o"),
                     "balance='hybrid'", "use balance='storage'")


def test_valid_variants_compile(tmp_path):
    """transformers 5 spellings: layers_block_type, aliases, inf written as {"__float__": "Infinity"}."""
    cfg = _edit(TINY_NEMOTRON, "hybrid_override_pattern", DELETE)
    cfg.update({"layers_block_type": ["mamba", "attention", "mamba", "mlp"], "mamba_n_groups": 2,
                "time_step_limit": [0.0, {"__float__": "Infinity"}], "time_step_min": 0.001})
    del cfg["n_groups"]
    ck = write_ckpt(tmp_path / "a", cfg, tiny_tensors())
    r = dasc("compile", ck, "--wmax", "100", "--out", tmp_path / "a.dasc")
    assert r.code == 0, r.err
    plan = json.loads((tmp_path / "a.dasc" / "plan.json").read_text())
    assert [lp["kept_units"] for lp in plan["layers"]] == [[0, 1, 2], [2, 3]]
    ck = write_ckpt(tmp_path / "f", FALCON, FALCON_TENSORS)                      # d_head 'auto' = 8 / 4 = 2
    assert dasc("compile", ck, "--wmax", "16", "--out", tmp_path / "f.dasc").code == 0
