"""Runtime tests (``tests/runtime/``): the helper modules beside the flat tests (``tests/runtime_*.py``)
are importable, and each test starts and ends with nothing installed in this process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


@pytest.fixture(autouse=True)
def _nothing_installed():
    from runtime_fixtures import SGLANG_SKIP_REASON

    if SGLANG_SKIP_REASON:
        yield
        return
    from dasc_runtime.installed import INSTALLED

    INSTALLED.reset()
    yield
    INSTALLED.reset()


#: the cross-rank agreement runs (tests/runtime_tp_sim.py): 3 gloo ranks, one start-up for both runs
AGREEMENT_CFG = dict(mamba_size=10, compressed_slots=5, watermark=4)
AGREEMENT_SEED, AGREEMENT_OPS = 201, 1000


@pytest.fixture(scope="session")
def tp_agreement_runs(tmp_path_factory):
    """``{"agreement": [...], "agreement_ignored": [...]}`` per rank ``(rank, status, detail)``: the
    randomized tier test on 3 ranks, as is and with the ``agreement_ignored`` mutation planted."""
    from runtime_fixtures import SGLANG_SKIP_REASON

    if SGLANG_SKIP_REASON:
        pytest.skip(SGLANG_SKIP_REASON)
    from runtime_tp_sim import run_ranks

    runs = [dict(name="agreement", cfg=AGREEMENT_CFG, seed=AGREEMENT_SEED, n_ops=AGREEMENT_OPS),
            dict(name="agreement_ignored", cfg=AGREEMENT_CFG, seed=AGREEMENT_SEED, n_ops=AGREEMENT_OPS,
                 mutation="agreement_ignored")]
    return run_ranks(3, tmp_path_factory.mktemp("tp-agreement"), runs)
