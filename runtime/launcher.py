"""The process that launches SGLang: dasc's ``--dasc-*`` flags and ``Engine(dasc_*=...)`` keyword arguments.

Three hooks of :mod:`dasc_runtime.plugin` run here (``ServerArgs.add_cli_args``, ``ServerArgs.from_cli_args``, and
the adapter's ``ENGINE_KWARGS_TARGET``). Each resolves the flags or keywords with the ``DASC_*`` variables
(:func:`dasc_runtime.settings.resolve_settings`: a flag wins over its variable, the variables fill the rest, a
setting without a plan is refused), checks what the launch decides before SGLang builds its ``ServerArgs`` and
before any weights load (:func:`dasc_runtime.startup_checks.check_launch`, for a plan from ``--dasc-plan`` or
``DASC_PLAN`` alike), then carries the settings to every process (the ``ServerArgs`` attribute, the environment).

In the launcher no scheduler frame turns a refusal into one line (:mod:`dasc_runtime.scheduler_refusal`), so
:func:`from_cli_args` prints it as one ``dasc: refusing to start:`` line and exits with status 2, as argparse does,
without argparse's usage block. ``Engine`` raises the refusal (a ``DascInputError``) before its constructor runs.
Nothing here imports torch or SGLang at import time.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from types import SimpleNamespace

__all__ = ["CHECKED_VAR", "FLAGS", "add_cli_args", "from_cli_args", "engine_kwargs_init", "first_engine_launch",
           "settle", "publish", "take_running_engine_kwargs"]


def _int_or_text(text: str):
    """argparse ``type`` of the integer flags: the integer, or the text itself, which the settings refuse in one line
    naming the flag (argparse's own refusal prints its whole usage first)."""
    try:
        return int(text)
    except ValueError:
        return text


#: ``(flag, field, argparse keyword arguments)`` of every ``--dasc-*`` flag (``settings.ENV_VARS`` names the fields).
FLAGS = (
    ("--dasc-plan", "plan", dict(default=None, help="dasc plan directory (or its plan.json): serve compressed state "
                                                    "checkpoints (or DASC_PLAN)")),
    ("--dasc-pool-slots", "pool_slots", dict(type=_int_or_text, default=None,
                                             help="dasc: usable compressed checkpoint slots per rank (at least 1)")),
    ("--dasc-pool-bytes", "pool_bytes", dict(type=_int_or_text, default=None,
                                             help="dasc: per-rank byte budget of the compressed pool, e.g. "
                                                  "2147483648 or 2GiB (slots = budget // bytes_per_slot - 1)")),
    ("--dasc-compressed-only", "compressed_only", dict(action="store_true", default=False,
                                                       help="dasc: cache checkpoints only in the compressed pool "
                                                            "(no dense spill; quality runs)")),
    ("--dasc-demote-watermark", "demote_watermark", dict(type=_int_or_text, default=None,
                                                         help="dasc: free native slots below which dense checkpoints "
                                                              "are demoted in the background (default 10%% of them)")),
    ("--dasc-dummy-decay-ok", "dummy_decay_ok", dict(action="store_true", default=False,
                                                     help="dasc: with --load-format dummy only (and SGLang's "
                                                          "weight cache off), serve a plan compiled from another "
                                                          "checkpoint's decay values (latency benchmarks; the "
                                                          "random weights cannot match)")),
    ("--dasc-refresh-slots", "refresh_slots", dict(type=_int_or_text, default=None,
                                                   help="dasc-wr: windows one scratch refresh pass replays "
                                                        "(hidden request rows and native Mamba slots; default 8)")),
)
_FLAG_NAMES = {field: flag for flag, field, _ in FLAGS}
_KWARG_NAMES = {field: "dasc_" + field for _, field, _ in FLAGS}


def add_cli_args(result, parser) -> None:
    """AFTER ``ServerArgs.add_cli_args``: the ``--dasc-*`` flags."""
    group = parser.add_argument_group("dasc (decay-aware state compression)")
    for flag, field, kw in FLAGS:
        if not any(flag in a.option_strings for a in parser._actions):
            group.add_argument(flag, dest="dasc_" + field, **kw)


def settle(given: dict, names: dict, options):
    """The settings of a launch, checked: :func:`~dasc_runtime.settings.resolve_settings` of ``given`` (field -> the
    flag's or keyword's value, named in a refusal by ``names``) with the environment, then, with a plan,
    :func:`~dasc_runtime.startup_checks.check_launch` on ``options`` (SGLang's options as given) and the settings
    exported as ``DASC_*`` (child processes inherit them; a refused launch exports nothing).

    Returns:
        the active ``DascSettings``, or None when no plan is given anywhere (dasc is off).
    Raises:
        DascInputError / DascRefusal: see ``resolve_settings`` and ``check_launch``.
    """
    from dasc_runtime.settings import resolve_settings
    from dasc_runtime.startup_checks import check_launch

    settings, source = resolve_settings(given, names)
    if not settings.active:
        return None
    check_launch(settings, options, source)
    settings.export()
    os.environ[CHECKED_VAR] = checked_mark(os.environ, os.getpid())
    return settings


#: Set by :func:`settle` in the environment it exports (children inherit it): the ``DASC_*`` settings a launch of
#: this process tree has checked and the process that checked them (:func:`checked_mark`), so that a child process
#: (a scheduler) that sees the same variables does not check them again. The launching process itself checks every
#: later launch: a second ``Engine(...)`` may bring options the first did not. Any descendant skips the launch check
#: while the ``DASC_*`` values are unchanged (a script started from a process that launched dasc, too): there the
#: scheduler's own start-up check (``verify.check_server_args``) is what refuses, after the weights load.
CHECKED_VAR = "_DASC_LAUNCH_CHECKED"


def checked_mark(env, pid: int) -> str:
    """The value of :data:`CHECKED_VAR`: process ``pid`` checked the ``DASC_*`` settings of ``env`` (unset and empty
    alike)."""
    from dasc_runtime.settings import ENV_VARS

    return f"{pid}:" + ";".join(f"{var}={env.get(var) or ''}" for var in ENV_VARS.values())


def _unchecked_env_settings() -> bool:
    """True when the environment sets a ``DASC_*`` setting that no parent process of this one has checked (its own
    earlier checks do not count: each launch in the launching process is checked with its own options)."""
    from dasc_runtime.settings import ENV_VARS

    if not any(os.environ.get(var) for var in ENV_VARS.values()):
        return False
    pid, _, _ = (os.environ.get(CHECKED_VAR) or "").partition(":")
    return not pid.isdigit() or pid == str(os.getpid()) \
        or os.environ.get(CHECKED_VAR) != checked_mark(os.environ, int(pid))


#: The launches of this thread that :func:`settle` has checked and whose constructors are running, innermost last,
#: each with its settings (None: dasc off): a ``ServerArgs(...)`` those constructors build is that launch's, not a new
#: one (0.5.17's ``from_cli_args`` builds one), and 0.5.23's ``Engine._launch_subprocesses`` inside one publishes its
#: settings on the ``ServerArgs`` the constructor built, before the subprocesses start (:func:`first_engine_launch`).
_LAUNCHING = threading.local()


# a child forked inside a launch (the thread-local is copied) starts outside it: its own launches are checked
os.register_at_fork(after_in_child=lambda: _LAUNCHING.__dict__.pop("stack", None))


@contextmanager
def _launching(settings):
    stack = _LAUNCHING.__dict__.setdefault("stack", [])
    stack.append(settings)
    try:
        yield
    finally:
        stack.pop()


def _in_launch() -> bool:
    return bool(getattr(_LAUNCHING, "stack", None))


def publish(server_args, settings) -> None:
    """Record ``settings`` on ``server_args`` (pickled into every scheduler process; ``side_channels``)."""
    from dataclasses import asdict

    from dasc_runtime.side_channels import attach_settings

    attach_settings(server_args, asdict(settings))


def from_cli_args(original, cls, args):
    """AROUND ``ServerArgs.from_cli_args``: settle the ``--dasc-*`` values and ``DASC_*`` (:func:`settle`) on the
    options as parsed, before SGLang builds (0.5.17: and checks) its ``ServerArgs``, then record them on it.

    A refusal is one ``dasc: refusing to start: ...`` line on stderr and ``SystemExit(2)`` (module docstring).
    """
    from dasc_compile.schema import DascInputError
    from dasc_runtime.refusal import PREFIX

    given = {field: getattr(args, "dasc_" + field, None) for _, field, _ in FLAGS}
    try:
        settings = settle(given, _FLAG_NAMES, args)
    except DascInputError as exc:
        msg = " ".join(str(exc).split())                      # one line, whatever the message held
        print(msg if msg.startswith(PREFIX) else PREFIX + msg, file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    with _launching(settings):
        result = original(cls, args)
    if settings is not None:
        publish(result, settings)
    return result


def engine_kwargs_init(original, self, *args, **kwargs):
    """AROUND the constructor that receives ``Engine(..., dasc_plan=..., dasc_pool_slots=...)`` keyword arguments
    (the adapter's ``ENGINE_KWARGS_TARGET``: ``ServerArgs.__init__`` in 0.5.17, ``Engine.__init__`` in 0.5.23):
    pops them, settles them with ``DASC_*`` (:func:`settle`) before the constructor runs (it may start the
    scheduler processes, which inherit the environment), then records them on the ``ServerArgs`` it built.
    Without any ``dasc_*`` keyword the constructor runs untouched (in 0.5.17 it is every ``ServerArgs(...)``),
    unless the environment sets ``DASC_*`` settings that no parent process has checked (:data:`CHECKED_VAR`; this
    process's own earlier launches do not count): ``Engine(...)`` with the plan only in ``DASC_PLAN`` is settled and
    refused here as well, not after the model has loaded. The options checked are the keywords, or the
    ``server_args`` given (0.5.23's ``Engine(server_args=sa)``).

    Raises:
        DascInputError / DascRefusal: see :func:`settle`; an untested SGLang release.
    """
    from dasc_runtime.sglang_api import api

    _FIRST_ENGINE.pop(threading.get_ident(), None)   # a hooked constructor runs in this thread: its first Engine(...)
    #                                                  is over (it may have failed before its launch)
    raw = {field: kwargs.pop(kw) for field, kw in _KWARG_NAMES.items() if kw in kwargs}
    if not raw and (_in_launch() or not _unchecked_env_settings()):
        return original(self, *args, **kwargs)
    adapter = api()                                   # an untested SGLang is refused here, in one line
    # 0.5.23's Engine(server_args=sa) brings its options in sa, not as keywords
    options = kwargs["server_args"] if kwargs.get("server_args") is not None else SimpleNamespace(**kwargs)
    settings = settle(raw, _KWARG_NAMES, options)
    with _launching(settings):
        original(self, *args, **kwargs)
    sa = adapter.server_args_of(self)
    if sa is not None and settings is not None:
        publish(sa, settings)


#: The ``dasc_*`` keywords of the first ``Engine(...)`` of the process, taken out of its keyword dict while it loads the
#: plugins (:func:`take_running_engine_kwargs`), until :func:`first_engine_launch` settles them.
_FIRST_ENGINE: dict = {}       # thread id -> {field: value}: the thread whose Engine(...) loads the plugins


def take_running_engine_kwargs(adapter) -> None:
    """At plugin registration: where the release loads the plugins inside ``Engine.__init__`` (0.5.23,
    ``adapter.FIRST_ENGINE_TARGET``), take the ``dasc_*`` keywords out of the call in progress, which runs the
    constructor from before dasc's hook (SGLang would refuse them as unknown), and keep them for
    :func:`first_engine_launch`. Raises nothing: an exception here would be logged and dropped by ``load_plugins``."""
    kwargs = adapter.running_engine_kwargs() if adapter.FIRST_ENGINE_TARGET else None
    if kwargs is not None:
        _FIRST_ENGINE[threading.get_ident()] = {field: kwargs.pop(kw) for field, kw in _KWARG_NAMES.items()
                                                if kw in kwargs}


def first_engine_launch(original, *args, **kwargs):
    """AROUND ``Engine._launch_subprocesses`` (0.5.23; ``cls, server_args, ...``): for the first ``Engine(...)`` of the
    process, the settling :func:`engine_kwargs_init` gives every later one (:func:`settle` of its ``dasc_*`` keywords
    and ``DASC_*`` on the ``ServerArgs`` it built, then :func:`publish`), before any subprocess starts; for a later
    one, :func:`publish` of the settings its :func:`engine_kwargs_init` settled (the constructor launches the
    subprocesses itself, so publishing after it returned reached no scheduler).

    Raises:
        DascInputError / DascRefusal: see :func:`settle`.
    """
    server_args = kwargs.get("server_args", args[1] if len(args) > 1 else None)
    raw = _FIRST_ENGINE.pop(threading.get_ident(), None)
    if raw is not None and (raw or _unchecked_env_settings()):
        settings = settle(raw, _KWARG_NAMES, server_args)
    else:           # a later Engine(...): engine_kwargs_init settled it; publish before the subprocesses, not after
        settings = _LAUNCHING.stack[-1] if _in_launch() else None
    if settings is not None and server_args is not None:
        publish(server_args, settings)
    with _launching(settings):
        return original(*args, **kwargs)
