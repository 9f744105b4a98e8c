"""Policy YAML validation and flag overrides."""

from pathlib import Path

import pytest

from dasc_compile.errors import DascInputError
from dasc_compile.policy import resolve_policy

POLICY_DIR = Path(__file__).resolve().parents[2] / "plans" / "policies"


def test_flags_override_file(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("w_max: 64\ntp_size: 2\nint8: true\n")
    pol = resolve_policy(p, w_max=16, tp_size=None)
    assert pol.w_max == 16 and pol.tp_size == 2 and pol.int8 is True


def test_unknown_key_names_file_and_key(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("w_max: 64\nwmax_typo: 3\n")
    with pytest.raises(DascInputError, match=r"p.yaml: unknown policy key 'wmax_typo'"):
        resolve_policy(p)


def test_negative_wmax_rejected_from_file_and_flag(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("w_max: -1\n")
    with pytest.raises(DascInputError, match=r"policy field 'w_max'.*greater than or equal to 0"):
        resolve_policy(p)
    with pytest.raises(DascInputError, match=r"command-line flags: policy field 'w_max'"):
        resolve_policy(None, w_max=-3)


def test_bad_values_and_not_a_mapping(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("balance: sideways\n")
    with pytest.raises(DascInputError, match="'balance'"):
        resolve_policy(p)
    p.write_text("- 1\n- 2\n")
    with pytest.raises(DascInputError, match="must be a YAML mapping"):
        resolve_policy(p)
    with pytest.raises(DascInputError, match="policy file not found"):
        resolve_policy(tmp_path / "nope.yaml")


@pytest.mark.parametrize("name", ["gdn", "kda", "kda_safe_gate", "mamba2"])
def test_bundled_policies_are_valid(name):
    pol = resolve_policy(POLICY_DIR / f"{name}.yaml")
    assert pol.w_max in (16, 64)
