"""Architecture detection from config.json and the cross-check against tensor names."""

import pytest

from dasc_compile.arch import arch_from_config, check_against_tensors
from dasc_compile.errors import DascInputError
from dasc_compile.policy import Policy

QWEN3_NEXT = {
    "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 48,
    "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
}
KIMI = {
    "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "num_hidden_layers": 27,
    "linear_attn_config": {"kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
                           "full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "num_heads": 32, "head_dim": 128,
                           "short_conv_kernel_size": 4},
}


def test_qwen3_next_interval_gives_36_gdn_layers():
    s = arch_from_config(QWEN3_NEXT)
    assert len(s.recurrent_layer_ids) == 36 and s.full_attention_layer_ids[:3] == (3, 7, 11)
    assert s.family == "gdn" and s.units_per_head == 1 and s.n_units_per_layer == 32
    assert s.conv_dim == 2 * 16 * 128 + 32 * 128 == 8192
    unit = s.unit_spec(Policy())
    assert unit.temporal_layer_shape(32 // 8) == (4, 128, 128) and unit.conv_layer_shape(8) == (1024, 3)
    assert s.head_fields == ("linear_num_value_heads", "linear_num_key_heads") and s.unit_kind == "gdn_head"
    assert s.a_log_names[0] == "model.layers.0.linear_attn.A_log"


def test_kimi_linear_one_indexed_kda_layers():
    s = arch_from_config(KIMI)
    assert len(s.recurrent_layer_ids) == 20 and s.recurrent_layer_ids[:4] == (0, 1, 2, 4)
    assert s.full_attention_layer_ids == (3, 7, 11, 15, 19, 23, 26)
    assert s.family == "kda" and s.n_units_per_layer == 32 * 128 == 4096
    assert s.a_log_shape == (1, 1, 32, 1) and s.dt_bias_shape == (4096,)
    assert s.unit_spec(Policy()).conv_layer_shape(1) == (3, 3 * 4096) and s.units_per_head == 128
    assert s.unit_kind == "kda_column" and s.head_fields == ("linear_attn_config.num_heads",) * 2


def test_kimi_safe_gate_from_config_and_policy():
    cfg = {**KIMI, "linear_attn_config": {**KIMI["linear_attn_config"], "gate_lower_bound": -5}}
    s = arch_from_config(cfg)
    assert s.family == "kda_safe_gate" and s.safe_gate_lower_bound == -5.0
    assert arch_from_config(cfg, family_override="kda_safe_gate").family == "kda_safe_gate"   # the same: a check
    # issue 22: a family other than the config's is refused like gdn is, never silently applied
    for fam in ("kda_safe_gate", "gdn"):
        with pytest.raises(DascInputError, match=f"family '{fam}' \\(--family or the policy field 'family'\\) "
                                                 "does not fit model_type 'kimi_linear', whose config makes it 'kda'"):
            arch_from_config(KIMI, family_override=fam)
    with pytest.raises(DascInputError, match="declared in config.json's linear_attn_config"):
        arch_from_config(KIMI, family_override="kda_safe_gate")
    with pytest.raises(DascInputError, match="this config declares the safe gate"):
        arch_from_config(cfg, family_override="kda")


def test_qwen35_nested_text_config_and_layer_types_win():
    kinds = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2
    cfg = {"model_type": "qwen3_5", "text_config": {**{k: v for k, v in QWEN3_NEXT.items() if k != "model_type"},
                                                     "num_hidden_layers": 8, "layer_types": kinds,
                                                     "full_attention_interval": 2}}
    s = arch_from_config(cfg)
    assert s.layer_kind_source == "layer_types" and s.recurrent_layer_ids == (0, 1, 2, 4, 5, 6)
    assert s.dt_bias_names[0] == "model.language_model.layers.0.linear_attn.dt_bias"


def test_config_without_layer_kinds_is_an_error():
    cfg = {k: v for k, v in QWEN3_NEXT.items() if k != "full_attention_interval"}
    with pytest.raises(DascInputError, match="config has no layer kinds"):
        arch_from_config(cfg, "x/config.json")


def test_unknown_model_type_and_missing_field():
    with pytest.raises(DascInputError, match="model_type 'llama' is not supported"):
        arch_from_config({"model_type": "llama"})
    cfg = {k: v for k, v in QWEN3_NEXT.items() if k != "linear_num_value_heads"}
    with pytest.raises(DascInputError, match="'linear_num_value_heads' is missing"):
        arch_from_config(cfg)


def test_cross_check_disagreement_fails():
    s = arch_from_config({**QWEN3_NEXT, "num_hidden_layers": 4})   # layers 0,1,2 GDN; 3 full
    names = {n for pair in zip(s.a_log_names, s.dt_bias_names) for n in pair}
    check_against_tensors(s, names, "ckpt")
    with pytest.raises(DascInputError, match="model.layers.3.linear_attn.A_log.*full attention"):
        check_against_tensors(s, names | {"model.layers.3.linear_attn.A_log"}, "ckpt")
    with pytest.raises(DascInputError, match="'model.layers.1.linear_attn.dt_bias' is missing"):
        check_against_tensors(s, names - {"model.layers.1.linear_attn.dt_bias"}, "ckpt")
