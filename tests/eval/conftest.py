"""Fixtures of the ``dasc eval`` tests: the tiny real hybrid models of :mod:`tests.support.tiny_models`,
built once per session in tmp."""

from __future__ import annotations

from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from tests.support.tiny_models import (write_falcon_h1, write_gdn, write_kda, write_nemotron_h,  # noqa: E402
                                        write_qwen35)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The tiny models' matrices are far too small to gain from threads; on a loaded 2-core machine
    two threads spin against each other (a 64 x 64 matmul measured 150x slower than with one)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def gdn_dir(tmp_path_factory) -> Path:
    return write_gdn(tmp_path_factory.mktemp("gdn") / "model")


def skip_without_kimi_linear() -> None:
    """Skip a KDA test below transformers 5.17 (no Kimi-Linear model there; dasc eval refuses KDA)."""
    from dasc_compile.eval.hf_compat import MIN_TRANSFORMERS_KDA, transformers_version

    if transformers_version() < MIN_TRANSFORMERS_KDA:
        pytest.skip(f"transformers {transformers.__version__} has no kimi_linear model (needs >= 5.17)")


def is_pure_torch(fn) -> bool:
    """A plain function defined in a transformers modeling module, wrapping nothing: a kernel slot that
    ``hf_compat.pin_torch_kernels`` pinned (not a fallback wrapper, not transformers 5.25's ``Func`` module)."""
    import inspect

    return (inspect.isfunction(fn) and not hasattr(fn, "__wrapped__")
            and fn.__module__.startswith("transformers.models."))


@pytest.fixture(scope="session")
def kda_dir(tmp_path_factory) -> Path:
    skip_without_kimi_linear()
    return write_kda(tmp_path_factory.mktemp("kda") / "model")


@pytest.fixture(scope="session")
def gdn_model(gdn_dir):
    from dasc_compile.eval.models import load_eval_model

    return load_eval_model(gdn_dir)


@pytest.fixture(scope="session")
def kda_model(kda_dir):
    from dasc_compile.eval.models import load_eval_model

    return load_eval_model(kda_dir)


@pytest.fixture(scope="session")
def mamba2_dir(tmp_path_factory) -> Path:
    """Nemotron-H (Mamba2, attention, Mamba2, MLP) with transformers' dt_bias initialisation."""
    return write_nemotron_h(tmp_path_factory.mktemp("nemotron") / "model")


@pytest.fixture(scope="session")
def mamba2_model(mamba2_dir):
    from dasc_compile.eval.models import load_eval_model

    return load_eval_model(mamba2_dir)


@pytest.fixture(scope="session")
def falcon_dir(tmp_path_factory) -> Path:
    """Falcon-H1: attention and Mamba2 side by side in each of two layers (one cache layer each)."""
    return write_falcon_h1(tmp_path_factory.mktemp("falcon") / "model")


@pytest.fixture(scope="session")
def falcon_model(falcon_dir):
    from dasc_compile.eval.models import load_eval_model

    return load_eval_model(falcon_dir)


@pytest.fixture(scope="session")
def qwen35_dir(tmp_path_factory) -> Path:
    return write_qwen35(tmp_path_factory.mktemp("q35") / "model")


@pytest.fixture(scope="session")
def qwen35_model(qwen35_dir):
    from dasc_compile.eval.models import load_eval_model

    return load_eval_model(qwen35_dir)
