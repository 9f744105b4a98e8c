"""Runtime tests (``tests/runtime/``): each test starts and ends with nothing installed in this process, and its
launches see a CUDA GPU (``runtime_fixtures.as_on_a_gpu_machine``; the helpers are :mod:`tests.support`)."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Every runtime test is SGLang-version sensitive: mark it ``sglang``, so CI's second environment (the
    newest tested SGLang) selects the whole directory with ``-m "sglang or transformers_range"``."""
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.sglang)


@pytest.fixture(autouse=True)
def _nothing_installed():
    from tests.support.runtime_fixtures import SGLANG_SKIP_REASON

    if SGLANG_SKIP_REASON:
        yield
        return
    from dasc_runtime import startup_checks
    from dasc_runtime.installed import INSTALLED
    from tests.support.runtime_fixtures import as_on_a_gpu_machine

    INSTALLED.reset()
    machine = as_on_a_gpu_machine()       # launches here run as on a GPU machine (test_startup_checks tests both)
    yield
    startup_checks.cuda_visible = machine
    INSTALLED.reset()


#: the cross-rank agreement runs (tests/support/runtime_tp_sim.py): 3 gloo ranks, one start-up for both runs
AGREEMENT_CFG = dict(mamba_size=10, compressed_slots=5, watermark=4)
AGREEMENT_SEED, AGREEMENT_OPS = 201, 1000


@pytest.fixture(scope="session")
def tp_agreement_runs(tmp_path_factory):
    """``{"agreement": [...], "agreement_ignored": [...]}`` per rank ``(rank, status, detail)``: the
    randomized tier test on 3 ranks, as is and with the ``agreement_ignored`` mutation planted."""
    from tests.support.runtime_fixtures import SGLANG_SKIP_REASON

    if SGLANG_SKIP_REASON:
        pytest.skip(SGLANG_SKIP_REASON)
    from tests.support.runtime_tp_sim import run_ranks

    runs = [dict(name="agreement", cfg=AGREEMENT_CFG, seed=AGREEMENT_SEED, n_ops=AGREEMENT_OPS),
            dict(name="agreement_ignored", cfg=AGREEMENT_CFG, seed=AGREEMENT_SEED, n_ops=AGREEMENT_OPS,
                 mutation="agreement_ignored")]
    return run_ranks(3, tmp_path_factory.mktemp("tp-agreement"), runs)
