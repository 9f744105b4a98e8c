"""Bad config.json fields (issue 13 items 2 and 3), per family: every field dasc reads is validated (strict
types, bounds, consistency) before anything is sized from it.

Each case edits one field of a tiny checkpoint's config and runs ``dasc compile`` through the real CLI entry:
exit 2, one ``error:`` line naming config.json and the field, fast, and nothing written.
"""

from __future__ import annotations

import copy
import json
import math
import time

import pytest

from tests.support.clihelp import (GDN_CONFIG, KDA_CONFIG, assert_one_error, dasc, gdn_tensors, kda_tensors, snapshot,
                                   write_ckpt)

DELETE = object()


def _edit(cfg: dict, path: str, value) -> dict:
    cfg = copy.deepcopy(cfg)
    *parents, last = path.split(".")
    d = cfg
    for k in parents:
        d = d[k]
    if value is DELETE:
        del d[last]
    else:
        d[last] = value
    return cfg


# (case id, base config, field path, new value, words the error line must hold)
GDN_CASES = [
    ("layers_float_1e8", "num_hidden_layers", 1e8, ["'num_hidden_layers'", "valid integer"]),
    ("layers_int_1e8", "num_hidden_layers", 100_000_000, ["'num_hidden_layers'", "less than or equal to 4096"]),
    ("layers_10_pow_400", "num_hidden_layers", 10**400, ["'num_hidden_layers'", "less than or equal to 4096"]),
    ("layers_bool", "num_hidden_layers", True, ["'num_hidden_layers'", "valid integer"]),
    ("layers_zero", "num_hidden_layers", 0, ["'num_hidden_layers'", "greater than or equal to 1"]),
    ("layers_string", "num_hidden_layers", "4", ["'num_hidden_layers'", "valid integer"]),
    ("layers_nan", "num_hidden_layers", math.nan, ["'num_hidden_layers'"]),
    ("layers_missing", "num_hidden_layers", DELETE, ["'num_hidden_layers' is missing"]),
    ("layer_types_ints", "layer_types", [1, 2, 3, 4], ["'layer_types.0'", "valid string"]),
    ("layer_types_null_entry", "layer_types", ["linear_attention", None, "linear_attention", "full_attention"],
     ["'layer_types.1'", "valid string"]),
    ("layer_types_string", "layer_types", "linear_attention", ["'layer_types'", "valid list"]),
    ("layer_types_short", "layer_types", ["linear_attention"], ["'layer_types' must list 4 layer kinds"]),
    ("layer_types_unknown", "layer_types", ["linear_attention", "mamba", "linear_attention", "full_attention"],
     ["'layer_types' has unknown kind(s) ['mamba']"]),
    ("layer_types_no_recurrent", "layer_types", ["full_attention"] * 4, ["makes no layer recurrent"]),
    ("interval_bool", "full_attention_interval", True, ["'full_attention_interval'", "valid integer"]),
    ("interval_zero", "full_attention_interval", 0, ["'full_attention_interval'", "greater than or equal to 1"]),
    ("interval_float", "full_attention_interval", 2.0, ["'full_attention_interval'", "valid integer"]),
    ("interval_one_no_recurrent", "full_attention_interval", 1, ["makes no layer recurrent"]),
    ("model_type_list", "model_type", ["qwen3_next"], ["'model_type'", "valid string"]),
    ("model_type_int", "model_type", 7, ["'model_type'", "valid string"]),
    ("model_type_missing", "model_type", DELETE, ["'model_type' is missing"]),
    ("model_type_unknown", "model_type", "llama", ["model_type 'llama' is not supported"]),
    ("architectures_string", "architectures", "Qwen3NextForCausalLM", ["'architectures'", "valid list"]),
    ("architectures_ints", "architectures", [1], ["'architectures.0'", "valid string"]),
    ("heads_not_multiple", "linear_num_key_heads", 3, ["linear_num_value_heads (2) must be a multiple"]),
    ("key_heads_huge", "linear_num_key_heads", 10**30, ["'linear_num_key_heads'", "less than or equal to"]),
    ("value_heads_float", "linear_num_value_heads", 2.0, ["'linear_num_value_heads'", "valid integer"]),
    ("head_dim_negative", "linear_key_head_dim", -4, ["'linear_key_head_dim'", "greater than or equal to 1"]),
    ("value_dim_list", "linear_value_head_dim", [4], ["'linear_value_head_dim'", "valid integer"]),
    ("conv_kernel_one", "linear_conv_kernel_dim", 1, ["'linear_conv_kernel_dim'", "greater than or equal to 2"]),
    ("conv_kernel_missing", "linear_conv_kernel_dim", DELETE, ["'linear_conv_kernel_dim' is missing"]),
    ("quantization_string", "quantization_config", "fp8", ["'quantization_config'", "JSON object"]),
    ("text_config_list", "text_config", [1], ["'text_config'", "JSON object"]),
    ("hybrid_pattern_int", "hybrid_override_pattern", 123, ["'hybrid_override_pattern'", "valid string"]),
    ("hybrid_pattern_length", "hybrid_override_pattern", "M*", ["'hybrid_override_pattern' must have one character"]),
    ("long_echo", "model_type", "q" * 100_000, ["'model_type'", "at most 200 characters", "..."]),
]

KDA_CASES = [
    ("kda_layers_int", "linear_attn_config.kda_layers", 2, ["'linear_attn_config.kda_layers'", "valid list"]),
    ("kda_layers_duplicate", "linear_attn_config.kda_layers", [1, 1], ["'kda_layers' lists layer 1 twice"]),
    ("kda_layers_zero", "linear_attn_config.kda_layers", [0], ["'linear_attn_config.kda_layers.0'",
                                                               "greater than or equal to 1"]),
    ("kda_layers_past_end", "linear_attn_config.kda_layers", [3], ["'linear_attn_config.kda_layers'", "[1, 2]"]),
    ("kda_layers_strings", "linear_attn_config.kda_layers", ["1"], ["'linear_attn_config.kda_layers.0'",
                                                                   "valid integer"]),
    ("kda_layers_bool", "linear_attn_config.kda_layers", [True], ["'linear_attn_config.kda_layers.0'"]),
    ("kda_layers_empty", "linear_attn_config.kda_layers", [], ["makes no layer recurrent"]),
    ("bound_string", "linear_attn_config.gate_lower_bound", "abc", ["'linear_attn_config.gate_lower_bound'",
                                                                    "valid number", "'abc'"]),
    ("bound_list", "linear_attn_config.gate_lower_bound", [1], ["'linear_attn_config.gate_lower_bound'",
                                                                "valid number"]),
    ("bound_nan", "linear_attn_config.gate_lower_bound", math.nan, ["'linear_attn_config.gate_lower_bound'",
                                                                    "finite"]),
    ("bound_inf", "linear_attn_config.gate_lower_bound", -math.inf, ["'linear_attn_config.gate_lower_bound'"]),
    ("bound_positive", "linear_attn_config.gate_lower_bound", 5.0, ["'linear_attn_config.gate_lower_bound'",
                                                                    "less than 0"]),
    ("bound_zero_at_root", "gate_lower_bound", 0, ["'gate_lower_bound'", "less than 0"]),
    ("lower_bound_string", "linear_attn_config.lower_bound", "x", ["'linear_attn_config.lower_bound'"]),
    ("safe_gate_string", "linear_attn_config.safe_gate", "yes", ["'linear_attn_config.safe_gate'",
                                                                 "valid boolean"]),
    ("heads_float", "linear_attn_config.num_heads", 1e30, ["'linear_attn_config.num_heads'", "valid integer"]),
    ("heads_huge", "linear_attn_config.num_heads", 10**12, ["'linear_attn_config.num_heads'",
                                                            "less than or equal to"]),
    ("head_dim_bool", "linear_attn_config.head_dim", True, ["'linear_attn_config.head_dim'"]),
    ("conv_zero", "linear_attn_config.short_conv_kernel_size", 0, ["'linear_attn_config.short_conv_kernel_size'"]),
    ("attn_config_list", "linear_attn_config", [], ["'linear_attn_config'", "JSON object"]),
    ("attn_config_missing", "linear_attn_config", DELETE, ["'linear_attn_config' is missing"]),
    ("layers_huge", "num_hidden_layers", 10**9, ["'num_hidden_layers'", "less than or equal to 4096"]),
    ("layer_types_ints", "layer_types", [1, 2], ["'layer_types.0'", "valid string"]),
]


def _run_case(tmp_path, base, tensors, path, value, needles):
    ck = write_ckpt(tmp_path / "m", _edit(base, path, value), tensors)
    before = snapshot(tmp_path)
    t0 = time.monotonic()
    r = dasc("compile", ck, "--wmax", 4, "--out", tmp_path / "plan")
    took = time.monotonic() - t0
    assert_one_error(r, "config.json", *needles)
    assert took < 5, f"refusing took {took:.1f} s"
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("case, path, value, needles", GDN_CASES, ids=[c[0] for c in GDN_CASES])
def test_bad_gdn_config_field(tmp_path, case, path, value, needles):
    _run_case(tmp_path, GDN_CONFIG, gdn_tensors(), path, value, needles)


@pytest.mark.parametrize("case, path, value, needles", KDA_CASES, ids=[c[0] for c in KDA_CASES])
def test_bad_kda_config_field(tmp_path, case, path, value, needles):
    _run_case(tmp_path, KDA_CONFIG, kda_tensors(), path, value, needles)


QWEN35_CONFIG = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                 "text_config": {k: v for k, v in GDN_CONFIG.items() if k not in ("model_type", "architectures")}}


def _qwen35_tensors():
    return {k.replace("model.layers.", "model.language_model.layers."): v for k, v in gdn_tensors().items()}


@pytest.mark.parametrize("path, value, needles", [
    ("text_config.num_hidden_layers", 10**8, ["(text_config)", "'num_hidden_layers'", "less than or equal"]),
    ("text_config.layer_types", [0, 1, 0, 1], ["(text_config)", "'layer_types.0'"]),
    ("text_config.linear_num_value_heads", DELETE, ["(text_config)", "'linear_num_value_heads' is missing"]),
])
def test_bad_nested_text_config_field(tmp_path, path, value, needles):
    _run_case(tmp_path, QWEN35_CONFIG, _qwen35_tensors(), path, value, needles)


def test_valid_configs_still_compile(tmp_path):
    # the checks accept what real configs hold: layer_types beside the interval, K3's safe-gate fields, Qwen3.5 nesting
    cfg = _edit(GDN_CONFIG, "layer_types", ["linear_attention", "full_attention"] * 2)
    assert dasc("compile", write_ckpt(tmp_path / "a", cfg, gdn_tensors()), "--wmax", 4, "--out",
                tmp_path / "pa").code == 0
    k3 = _edit(KDA_CONFIG, "linear_attn_config.gate_lower_bound", -5)
    k3["linear_attn_config"]["safe_gate"] = True
    r = dasc("compile", write_ckpt(tmp_path / "b", k3, kda_tensors()), "--wmax", 4, "--out", tmp_path / "pb")
    assert r.code == 0, r.err
    assert json.loads((tmp_path / "pb" / "plan.json").read_text())["model"]["family"] == "kda_safe_gate"
    r = dasc("compile", write_ckpt(tmp_path / "c", QWEN35_CONFIG, _qwen35_tensors()), "--wmax", 4, "--out",
             tmp_path / "pc")
    assert r.code == 0, r.err


def test_duplicate_kda_layers_never_reach_a_plan(tmp_path):
    # before: a plan listing layer 0 twice; the library entry refuses it as the CLI does
    from dasc_compile.compiler import compile_plan
    from dasc_compile.errors import DascInputError
    from dasc_compile.policy import Policy

    ck = write_ckpt(tmp_path / "m", _edit(KDA_CONFIG, "linear_attn_config.kda_layers", [1, 1]), kda_tensors())
    with pytest.raises(DascInputError, match="lists layer 1 twice"):
        compile_plan(ck, Policy(w_max=4), tmp_path / "plan", with_kernels=False)
    assert not (tmp_path / "plan").exists()
