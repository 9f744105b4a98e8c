"""A ``DascRefusal`` inside SGLang's scheduler process is one log line, never a traceback
(:mod:`dasc_runtime.scheduler_refusal`).

The scheduler runs in a real spawned child, under a stand-in of SGLang's ``run_scheduler_process`` (its
name, its module name, its ``parent_process`` local and its ``except Exception`` handler: traceback, then
SIGQUIT to the parent). The parent is an intermediate interpreter (this file run as a script) that catches
SIGQUIT as SGLang's launcher does, so the test runner is never signalled; it reports what it saw as JSON.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dasc_runtime.refusal import DascRefusal
from dasc_runtime.scheduler_refusal import (DP_CONTROLLER_TITLE, EXIT_CODE, SCHEDULER_ENTRY, SCHEDULER_MODULE,
                                            refuse_in_scheduler, scheduler_entry_frame)

WHAT = "decay tensors of the plan and the served model differ (test)"

#: SGLang's run_scheduler_process, reduced to what decides the outcome (scheduler.py ~4930-4960 in 0.5.17)
_STAND_IN = '''
import logging, signal, traceback
import psutil

def run_scheduler_process(hook):
    parent_process = psutil.Process().parent()
    scheduler = None
    try:
        scheduler = hook(None)
    except Exception:
        logging.getLogger("sglang").error("Scheduler hit an exception: %s", traceback.format_exc())
        parent_process.send_signal(signal.SIGQUIT)
'''


@refuse_in_scheduler
def _refusing_hook(result, *args, **kwargs):
    raise DascRefusal(WHAT)


@refuse_in_scheduler
def _buggy_hook(result, *args, **kwargs):
    raise RuntimeError("a dasc bug (test)")


@refuse_in_scheduler
def _input_error_hook(result, *args, **kwargs):
    from dasc_compile.schema import DascInputError

    raise DascInputError(WHAT)                 # e.g. a pool budget too small for one slot (pool.slots_for_budget)


_HOOKS = {"refusal": _refusing_hook, "bug": _buggy_hook, "input": _input_error_hook}


def _scheduler(kind: str) -> None:
    """The spawned scheduler: SGLang-like logging, then the hook under the stand-in entry point."""
    logging.basicConfig(level=logging.INFO, format="[scheduler] %(name)s %(levelname)s %(message)s")
    ns = {"__name__": SCHEDULER_MODULE}
    exec(compile(_STAND_IN, "<stand-in of sglang/srt/managers/scheduler.py>", "exec"), ns)
    ns[SCHEDULER_ENTRY](_HOOKS[kind])


def _dp_controller(kind: str) -> None:
    """SGLang's DP controller as the scheduler sees it: its title (comm) and no SIGQUIT handler."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))          # the default SIGQUIT action dumps core
    with open("/proc/self/comm", "w") as f:
        f.write(DP_CONTROLLER_TITLE[:15])
    proc = mp.get_context("spawn").Process(target=_scheduler, args=(kind,))
    proc.start()
    proc.join()


def _launcher(kind: str, layout: str) -> None:
    """The intermediate process: catches SIGQUIT (as SGLang's launch_phase_sigquit_handler), spawns, reports."""
    got = []
    signal.signal(signal.SIGQUIT, lambda signum, frame: got.append(signum))
    proc = mp.get_context("spawn").Process(target=_dp_controller if layout == "dp" else _scheduler, args=(kind,))
    proc.start()
    proc.join(timeout=60)
    print("RESULT " + json.dumps({"exitcode": proc.exitcode, "sigquit": len(got)}), flush=True)


def _run(kind: str, layout: str = "direct"):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASC_", "SGLANG_"))}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), kind, layout], capture_output=True,
                          text=True, timeout=60, env=env)
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and line, f"launcher failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(line[-1][len("RESULT "):]), proc.stderr


def _assert_one_refusal_line(err: str) -> None:
    assert [l for l in err.splitlines() if "refusing" in l] == [
        f"[scheduler] dasc ERROR dasc: refusing to start: {WHAT}"], err
    assert "Traceback" not in err and "Scheduler hit an exception" not in err, err


def test_refusal_in_scheduler_child_is_one_line_and_sigquits_the_parent():
    out, err = _run("refusal")
    assert out == {"exitcode": EXIT_CODE, "sigquit": 1}
    _assert_one_refusal_line(err)


def test_an_input_error_in_scheduler_child_is_the_same_one_line_refusal():
    out, err = _run("input")
    assert out == {"exitcode": EXIT_CODE, "sigquit": 1}
    _assert_one_refusal_line(err)


def test_refusal_under_a_dp_controller_signals_the_launcher_too():
    out, err = _run("refusal", "dp")
    # the launcher's handler would kill the tree; the DP controller died of SIGQUIT's default action
    assert out == {"exitcode": -signal.SIGQUIT, "sigquit": 1}
    _assert_one_refusal_line(err)


def test_other_exception_in_scheduler_child_keeps_sglangs_traceback():
    out, err = _run("bug")
    assert out == {"exitcode": 0, "sigquit": 1}                # SGLang's handler returns after the SIGQUIT
    assert "Scheduler hit an exception: Traceback" in err and "RuntimeError: a dasc bug (test)" in err
    assert "refusing to start" not in err


def test_refusal_propagates_unchanged_in_the_main_process():
    assert scheduler_entry_frame() is None
    with pytest.raises(DascRefusal, match="refusing to start: decay tensors"):
        _refusing_hook(None)
    mine = DascRefusal("x")

    @refuse_in_scheduler
    def hook():
        raise mine

    with pytest.raises(DascRefusal) as again:
        hook()
    assert again.value is mine
    with pytest.raises(RuntimeError, match="a dasc bug"):
        _buggy_hook(None)


def test_the_scheduler_side_start_up_hooks_are_wrapped():
    from dasc_runtime import plugin

    for name in ("after_init_mamba_pool", "after_load_model", "around_create_unified_radix_cache",
                 "around_req_pool_init", "after_build_kv_cache"):
        fn = getattr(plugin, name)
        assert getattr(fn, "dasc_refuses_in_scheduler", False) and fn.__name__ == name, name
    assert not hasattr(plugin.around_weight_update, "dasc_refuses_in_scheduler")     # mid-serving: not a start-up


def _sglang_source(rel: str) -> ast.Module:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    return ast.parse(path.read_text(), filename=str(path))


def test_installed_sglang_matches_what_the_wrapper_follows():
    """The entry point the wrapper looks for exists with the ``parent_process`` local it signals and the
    ``except Exception`` that SIGQUITs it; the DP controller keeps its title and catches no SIGQUIT."""
    tree = _sglang_source("srt/managers/scheduler.py")
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == SCHEDULER_ENTRY)
    text = ast.unparse(fn)
    assert "parent_process = psutil.Process().parent()" in text
    handlers = [h for n in ast.walk(fn) if isinstance(n, ast.Try) for h in n.handlers
                if isinstance(h.type, ast.Name) and h.type.id == "Exception"]
    assert any("parent_process.send_signal(signal.SIGQUIT)" in ast.unparse(h) for h in handlers)
    dp = ast.unparse(_sglang_source("srt/managers/data_parallel_controller.py"))
    assert f"setproctitle.setproctitle('{DP_CONTROLLER_TITLE}')" in dp
    assert "signal.signal(signal.SIGQUIT" not in dp


if __name__ == "__main__":
    _launcher(sys.argv[1], sys.argv[2])
