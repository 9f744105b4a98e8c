"""Fixtures of the CLI bad-input corpus: tiny checkpoints in tmp (helpers live in tests/support/clihelp.py)."""

from pathlib import Path

import pytest

from tests.support.clihelp import GDN_CONFIG, KDA_CONFIG, gdn_tensors, kda_tensors, write_ckpt


@pytest.fixture
def gdn(tmp_path) -> Path:
    """A tiny Qwen3-Next style checkpoint (2 GDN layers of 2 value heads)."""
    return write_ckpt(tmp_path / "gdn", GDN_CONFIG, gdn_tensors())


@pytest.fixture
def kda(tmp_path) -> Path:
    """A tiny Kimi-Linear style checkpoint (1 KDA layer, 2 heads x 2 channels)."""
    return write_ckpt(tmp_path / "kda", KDA_CONFIG, kda_tensors())
