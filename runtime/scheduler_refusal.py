"""A start-up refusal raised inside SGLang's scheduler process: one line, then the server ends, no traceback.

The scheduler-side start-up hooks of :mod:`dasc_runtime.plugin` (``after_init_mamba_pool``,
``after_load_model``, ``around_create_unified_radix_cache``, ``around_req_pool_init``,
``after_build_kv_cache``) raise :class:`~dasc_runtime.refusal.DascRefusal` from inside
``Scheduler.__init__``. Left alone, the refusal reaches the ``except Exception`` of SGLang's
``run_scheduler_process`` (sglang/srt/managers/scheduler.py, line 4949 in 0.5.17, 6370 in 0.5.23), which
logs ``Scheduler hit an exception: Traceback ...`` (some 30 lines) before the refusal line, then sends
SIGQUIT to ``parent_process`` (``psutil.Process().parent()``, taken at the top of that function).
:func:`refuse_in_scheduler` wraps such a hook: a ``DascRefusal`` (or any other ``DascInputError`` the hook
raises: a plan it cannot read, a pool budget too small for one slot, a bad ``DASC_OPS``) that is about to
reach that handler is logged as exactly one line (``dasc: refusing to start: ...``), the server is ended the way that handler
ends it, and the process leaves with :data:`EXIT_CODE` through ``os._exit`` (no traceback, no ``finally``
of SGLang's: ``scheduler`` is still None there, so it would do nothing).

**Where the wrapper acts.** Only when a frame of ``run_scheduler_process`` of module
``sglang.srt.managers.scheduler`` is on the current thread's stack (:func:`scheduler_entry_frame`). Both
tested releases start each scheduler as ``mp.Process(target=run_scheduler_process_func, ...)`` under
``mp.set_start_method("spawn", force=True)`` (sglang/srt/entrypoints/engine.py:
``_launch_scheduler_processes``, ``_set_envs_and_config``; with ``--dp-size`` > 1 from
``DataParallelController.launch_tensor_parallel_group``; 0.5.23's prelaunched DP-attention schedulers
through ``run_scheduler_process_with_init_pipe`` of data_parallel_controller.py, which calls it). That
frame is therefore exactly the case "this refusal would otherwise end in SGLang's traceback + SIGQUIT",
and the wrapper does nothing SGLang would not do. Weaker tests were not used:
``multiprocessing.parent_process() is not None`` holds in any multiprocessing child (a benchmark or test
worker calling a hook would SIGQUIT its own harness), and the process title ``sglang::scheduler...``
needs the optional ``setproctitle`` and says nothing about who catches the exception. Anywhere else (the
main process, unit tests calling hooks directly, SGLang's Ray actors, which build ``Scheduler`` without
``run_scheduler_process``) the exception propagates unchanged; any exception that is not a ``DascInputError`` always
propagates (a bug: SGLang's traceback is wanted).

**Ending the server.** As SGLang's handler: SIGQUIT to ``parent_process`` (read from that frame; psutil's
parent if missing), then, when ``SGLANG_KILLPG_ON_SCHEDULER_EXCEPTION`` is on, SIGKILL to the process
group. Without ``--dp-size`` the parent is the launcher (``Engine`` / ``launch_server``), whose
``launch_phase_sigquit_handler`` (engine.py ``_set_envs_and_config``; ``running_phase_sigquit_handler``
of the tokenizer manager later) logs one line and ``kill_process_tree(os.getpid())``: every child and then
itself by SIGKILL, so its ``_wait_for_scheduler_ready`` never raises ``Rank N scheduler died during
initialization`` (it would, with a traceback, on the pipe's EOF). With ``--dp-size`` > 1 (no DP
attention) the parent is SGLang's DP controller (``run_data_parallel_controller_process``,
data_parallel_controller.py; title ``sglang::data_parallel_controller``), which installs no SIGQUIT handler: the signal
kills it, and the launcher then raises that traceback (SGLang's own failure path does so too). So when the
parent carries that title, its own parent (the launcher) is sent SIGQUIT first, and the DP controller
after it (its default action ends it before it can read our pipe's EOF and log a traceback of its own).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys

from dasc_compile.schema import DascInputError
from dasc_runtime.refusal import DascRefusal

__all__ = ["refuse_in_scheduler", "scheduler_entry_frame", "EXIT_CODE"]

logger = logging.getLogger("dasc")

#: the function whose ``except Exception`` a scheduler's start-up exception reaches, and its module
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
SCHEDULER_ENTRY = "run_scheduler_process"
#: ``setproctitle`` of SGLang's DP controller; /proc/<pid>/comm keeps its first 15 characters
DP_CONTROLLER_TITLE = "sglang::data_parallel_controller"
#: exit status of a scheduler that refused (SGLang's handler returns normally: 0)
EXIT_CODE = 2


def scheduler_entry_frame(frame=None):
    """The frame of SGLang's ``run_scheduler_process`` at or above ``frame`` (default: the caller's), or None."""
    f = frame if frame is not None else sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == SCHEDULER_ENTRY and f.f_globals.get("__name__") == SCHEDULER_MODULE:
            return f
        f = f.f_back
    return None


def refuse_in_scheduler(hook):
    """Wrap a scheduler-side start-up hook: under ``run_scheduler_process`` a ``DascInputError`` ends the
    server with one log line (module docstring); elsewhere, and for any other exception, nothing changes."""

    @functools.wraps(hook)
    def wrapper(*args, **kwargs):
        try:
            return hook(*args, **kwargs)
        except DascInputError as exc:           # DascRefusal, or a plan / budget / option the hook refuses
            entry = scheduler_entry_frame()
            if entry is None:
                raise
            _end_server(exc, entry)

    wrapper.dasc_refuses_in_scheduler = True
    return wrapper


def _is_dp_controller(proc) -> bool:
    import psutil

    try:
        seen = (" ".join(proc.cmdline()), proc.name())
    except psutil.Error:
        return False
    return any(s.startswith(DP_CONTROLLER_TITLE[:15]) for s in seen)


def _end_server(exc: DascInputError, entry) -> None:
    """Log ``exc`` in one line (``dasc: refusing to start: ...``), signal as SGLang's handler in ``entry``
    would, leave with :data:`EXIT_CODE`."""
    try:
        logger.error("%s", exc if isinstance(exc, DascRefusal) else DascRefusal(str(exc)))
        logging.shutdown()                      # flush every handler: os._exit skips it
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        import psutil

        parent = entry.f_locals.get("parent_process")
        if parent is None:
            parent = psutil.Process().parent()
        targets = [parent]
        if parent is not None and _is_dp_controller(parent):
            try:
                targets.insert(0, parent.parent())  # the launcher, whose handler kills the whole tree
            except psutil.Error:
                pass
        for proc in targets:
            if proc is None:
                continue
            try:
                proc.send_signal(signal.SIGQUIT)
            except psutil.Error:
                pass
        envs = entry.f_globals.get("envs")
        try:
            killpg = bool(envs.SGLANG_KILLPG_ON_SCHEDULER_EXCEPTION.get())
        except Exception:
            killpg = False
        if killpg:
            try:
                os.killpg(os.getpgrp(), signal.SIGKILL)
            except Exception:
                pass
    finally:
        os._exit(EXIT_CODE)
