"""``dasc eval`` runs transformers' pure-PyTorch recurrence and convolution on every tested release
(:func:`dasc_compile.eval.hf_compat.pin_torch_kernels` / :func:`~dasc_compile.eval.hf_compat.torch_function`):
transformers 5.25 binds each kernel as a ``kernels`` ``Func`` module, which has no ``__wrapped__``, so a pin
that only read ``__wrapped__`` left the wrapper (and with it flash-linear-attention or a Hub kernel) in place."""

from __future__ import annotations

import functools
import importlib

import pytest
import torch

from dasc_compile.errors import DascInputError
from dasc_compile.eval.hf_compat import _CONV_NAMES, kernel_slots, torch_function
from tests.eval.conftest import is_pure_torch

pytestmark = pytest.mark.transformers_range


@pytest.mark.parametrize("which", ["gdn", "kda", "qwen35", "mamba2", "falcon"])
def test_loaded_models_run_the_pure_pytorch_kernels(which, request):
    em = request.getfixturevalue(f"{which}_model")
    assert getattr(em.model, "use_kernels", False) is False        # no Hub kernels (5.25 loads them by default)
    for mixer in em.mixers.values():
        module = importlib.import_module(type(mixer).__module__)
        slots = [] if hasattr(mixer, "torch_forward") else kernel_slots(mixer)   # 5.12 Mamba2: torch_forward
        slots = [(o, a) for o, a in slots if a != "dasc_observe_decay"]
        slots += [(module, n) for n in _CONV_NAMES if hasattr(module, n) and n not in vars(mixer)]
        assert slots or hasattr(mixer, "torch_forward")
        bad = [(getattr(o, "__name__", type(o).__name__), a, type(getattr(o, a)).__name__)
               for o, a in slots if getattr(o, a) is not None and not is_pure_torch(getattr(o, a))]
        assert not bad, bad


def _reference(x, y=1):
    return x + y


def _kernels_like_module(func):
    """A module built the way the ``kernels`` package builds ``Func``: the function lives only in the
    class's ``forward`` closure."""
    class Func(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return func(*args, **kwargs)
    return Func()


def test_torch_function_unwraps_each_layout():
    @functools.wraps(_reference)
    def fallback_wrapper(*a, **k):          # 5.17-5.25's "use the optional package if it runs here" wrapper
        return _reference(*a, **k)

    assert torch_function(_reference) is _reference                                  # a plain function
    assert torch_function(fallback_wrapper) is _reference                            # 5.17 on, no kernels
    assert torch_function(_kernels_like_module(fallback_wrapper)) is _reference      # with kernels (5.25 always)
    assert torch_function(_kernels_like_module(_reference)) is _reference            # with kernels, no fallback


def test_torch_function_refuses_a_module_it_cannot_read():
    said = r"chunk_gated_delta_rule is a Linear module .*\(tested on transformers 5\.12-5\.25\): pip install "
    with pytest.raises(DascInputError, match=said + r"'transformers>=5\.12,<5\.26'"):
        torch_function(torch.nn.Linear(2, 2), "chunk_gated_delta_rule")


def test_a_release_newer_than_the_tested_ones_is_named_not_refused(monkeypatch):
    from dasc_compile.eval import hf_compat

    monkeypatch.setattr(hf_compat, "transformers_version", lambda: hf_compat.MAX_TESTED_TRANSFORMERS)
    assert hf_compat.require_transformers() is None                       # the newest tested release: silent
    top = hf_compat.MAX_TESTED_TRANSFORMERS
    monkeypatch.setattr(hf_compat, "transformers_version", lambda: (top[0], top[1] + 1))
    note = hf_compat.require_transformers()
    assert note == (f"transformers {top[0]}.{top[1] + 1} is newer than the releases dasc eval is tested on "
                    f"(5.12-{top[0]}.{top[1]}); results may differ from a tested one: pip install "
                    f"'transformers>=5.12,<{top[0]}.{top[1] + 1}'")


def test_pyproject_admits_no_release_newer_than_the_tested_ones():
    """The eval extra's cap is the tested newest (what CI's newest environment installs) plus one minor."""
    import re
    from pathlib import Path

    from dasc_compile.eval.hf_compat import MAX_TESTED_TRANSFORMERS

    root = Path(__file__).resolve().parents[2]
    top = MAX_TESTED_TRANSFORMERS
    assert f'"transformers>=5.12,<{top[0]}.{top[1] + 1}"' in (root / "pyproject.toml").read_text()
    newest = re.search(r'TRANSFORMERS_NEWEST="transformers==(\d+)\.(\d+)\.\*"', (root / "scripts/setup_env.sh").read_text())
    assert newest and (int(newest[1]), int(newest[2])) == top


def test_eval_prints_one_warning_line_on_an_untested_release(gdn_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from dasc_compile.cli import app
    from dasc_compile.eval import hf_compat
    from tests.support.tiny_models import compile_for

    plan = compile_for(gdn_dir, 16, tmp_path / "w16.dasc")
    top = hf_compat.MAX_TESTED_TRANSFORMERS
    monkeypatch.setattr(hf_compat, "transformers_version", lambda: (top[0], top[1] + 1))
    r = CliRunner().invoke(app, ["eval", str(gdn_dir), "--plan", str(plan), "--retrieval", "1", "--prefix-len", "80",
                                 "--arms", "dense,nr", "--json", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.output.splitlines() if line.startswith("warning: transformers")]
    assert len(warnings) == 1 and "is newer than the releases dasc eval is tested on" in warnings[0]
