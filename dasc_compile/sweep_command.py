"""``dasc sweep MODEL --wmax 4,16,64,128,512``: the typer command (registered in :mod:`dasc_compile.cli`).

It reads the flags, refuses bad ones with one ``error:`` line (exit status 2) before any work, runs
:func:`dasc_compile.sweep.run_sweep` (and :func:`~dasc_compile.sweep.evaluate` /
:func:`~dasc_compile.sweep.recommend` when asked) and prints with :mod:`dasc_compile.sweep_report`.
Nothing is written unless ``--out DIR`` (the plans) or ``--plot FILE.png`` is given.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Optional

import typer

from dasc_compile.cli_exit import note_pending
from dasc_compile.console import console
from dasc_compile.errors import DascInputError, error_line
from dasc_compile.userfiles import path_text
from dasc_compile.eval.run import EvalInterrupted

_err = console(stderr=True, highlight=False, soft_wrap=True)
_EVAL_SOURCE = re.compile(r"(sharegpt|retrieval):(.*)")
_EVAL_FORMS = "expected a JSON-lines prompt file (dasc eval --prompts), sharegpt:N or retrieval:N"


def _eval_sources(spec: str) -> dict:
    """``--eval``: a JSON-lines file (dasc eval's ``--prompts``), ``sharegpt:N`` or ``retrieval:N``.

    Raises:
        DascInputError: an empty value; ``sharegpt:`` / ``retrieval:`` with a count that is not a whole number of
            1 or more; a path that is not a file.
    """
    if not spec.strip():
        raise DascInputError(f"--eval {spec!r}: empty; {_EVAL_FORMS}")
    m = _EVAL_SOURCE.fullmatch(spec.strip())
    if m is not None and not (m.group(2).isascii() and m.group(2).isdigit()) and not Path(spec).is_file():
        raise DascInputError(f"--eval {spec}: {m.group(1)}:N takes a whole number of prompts N (1 or more), "
                             f"got {m.group(2)!r}")
    if m is None:
        path = Path(spec)
        if not path.is_file():
            raise DascInputError(f"--eval {spec}: {_EVAL_FORMS}; " + ("it is a folder" if path.is_dir() else
                                                                    "not a file" if path.exists() else "no such file"))
        return {"prompts_file": path}
    n = int(m.group(2))
    if n < 1:
        raise DascInputError(f"--eval {spec}: expected at least one prompt")
    return {"sharegpt": n} if m.group(1) == "sharegpt" else {"retrieval": n}


def _int8_settings(text: Optional[str], default: bool) -> tuple[bool, ...]:
    if text is None:
        return (default,)
    table = {"off": (False,), "on": (True,), "both": (False, True)}
    if text not in table:
        raise DascInputError(f"--int8 {text}: expected off, on or both")
    return table[text]


def sweep_cmd(
    model_path: Path = typer.Argument(..., metavar="MODEL", help="A .safetensors file, a directory (config.json + shards) or an index.", parser=path_text),
    wmax: Optional[str] = typer.Option(None, "--wmax", show_default=False,
                                       help="w_max values in tokens, comma-separated, e.g. 4,16,64,128,512 (required)."),
    tp: Optional[str] = typer.Option(None, "--tp", help="TP degrees, comma-separated (default: the policy's, 1)."),
    balance: Optional[str] = typer.Option(None, "--balance", help="TP placement: off | storage | hybrid."),
    int8: Optional[str] = typer.Option(None, "--int8", help="Kept units stored as INT8: off | on | both."),
    policy: Optional[Path] = typer.Option(None, "--policy", metavar="FILE", help="YAML policy file; flags override its fields.", parser=path_text),
    config: Optional[Path] = typer.Option(None, "--config", metavar="FILE", help="config.json for a lone .safetensors file.", parser=path_text),
    a_s: Optional[float] = typer.Option(None, "--a-s", help="Representative gate input a_s (default: family's)."),
    eps: Optional[float] = typer.Option(None, "--eps", help="Horizon threshold epsilon (default 1e-3)."),
    load_policy: Optional[str] = typer.Option(None, "--load-policy", help="nr (zero-fill) or wr (suffix refresh)."),
    budget: Optional[str] = typer.Option(None, "--budget", help="State budget per TP rank (e.g. 8GiB): capacity of "
                                                                "every arm at equal memory, as dasc size."),
    max_running_requests: Optional[int] = typer.Option(None, "--max-running-requests",
                                                       help="R with --budget: running requests of every arm."),
    strategy: Optional[str] = typer.Option(None, "--mamba-radix-cache-strategy",
                                           help="With --budget: extra_buffer (default) | no_buffer (as dasc size)."),
    no_overlap: bool = typer.Option(False, "--disable-overlap-schedule", help="With --budget: size without SGLang's "
                                                                              "overlap scheduler."),
    refresh_slots: Optional[int] = typer.Option(None, "--refresh-slots", help="With --budget, dasc-wr: scratch slots B."),
    eval_prompts: Optional[str] = typer.Option(None, "--eval", help="Measure each w_max with dasc eval on these "
                                               "prompts: a JSON-lines file, sharegpt:N or retrieval:N."),
    prefix_len: Optional[int] = typer.Option(None, "--prefix-len", help="With --eval: cached prefix length, "
                                                                         "tokens (default 512)."),
    suffix_len: Optional[int] = typer.Option(None, "--suffix-len", help="With --eval: scored suffix length, "
                                                                         "tokens (default 64)."),
    device: Optional[str] = typer.Option(None, "--device", help="With --eval: torch device (default cpu)."),
    max_kl: Optional[float] = typer.Option(None, "--max-kl", help="With --eval: mark the largest w_max whose "
                                                                  "KL(dense||arm) per token stays within X nats."),
    max_nll: Optional[float] = typer.Option(None, "--max-nll-delta", help="With --eval: the same for the NLL "
                                                                          "increase per token, nats."),
    out: Optional[Path] = typer.Option(None, "--out", metavar="DIR", help="Write every swept plan into this new directory.", parser=path_text),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document (keys: docs/cli.md)."),
    plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE", help="PNG: C_ckpt, capacity and quality against w_max.", parser=path_text),
) -> None:
    """Choose w_max: compile the plans of a w_max x TP x INT8 grid in memory and compare them."""
    model = model_path          # typer shows an argument whose metavar equals its name by its parser's name
    from dasc_compile import sweep as sw
    from dasc_compile.atomic import check_new_dir
    from dasc_compile.checkpoint import require_model_path
    from dasc_compile.policy import POLICY_FLAGS, resolve_policy

    user_flags = _user_flags(policy, config, a_s, eps, load_policy, balance)
    try:
        require_model_path(model)   # the first argument first, then the one required option (as dasc compile)
        if wmax is None:
            raise DascInputError("Missing option '--wmax': the w_max values to compare, in tokens, e.g. "
                                 "--wmax 4,16,64 (see 'dasc sweep --help')")
        quality = [(m, v) for m, v in (("kl", max_kl), ("nll_delta", max_nll)) if v is not None]
        _check_flags(quality, eval_prompts, budget, max_running_requests, plot)
        _check_companions(eval_prompts, budget, prefix_len=prefix_len, suffix_len=suffix_len, device=device,
                          strategy=strategy, no_overlap=no_overlap)
        base = resolve_policy(policy, flags=POLICY_FLAGS, a_s=a_s, eps=eps, load_policy=load_policy, balance=balance)
        grid = sw.SweepGrid(w_max=sw.parse_int_list(wmax, "--wmax"),
                            tp=sw.parse_int_list(tp, "--tp", lo=1) if tp is not None else (base.tp_size,),
                            int8=_int8_settings(int8, bool(base.int8)), base=base)
        sizing = _sizing(budget, max_running_requests, strategy or "extra_buffer", not no_overlap, refresh_slots)
        eval_kw = _eval_sources(eval_prompts) if eval_prompts is not None else None
        if out is not None:
            check_new_dir(out)      # before the sweep and --eval run, which a bad --out would otherwise cost
        result = sw.run_sweep(model, grid, config=config, sizing=sizing, plan_dir=out)
        if eval_kw is not None:
            sw.evaluate(result, prefix_len=512 if prefix_len is None else prefix_len,
                        suffix_len=suffix_len, device=device or "cpu",
                        progress=sys.stderr.isatty(), **eval_kw)
        if quality:
            sw.recommend(result, *quality[0])
        if out is not None:
            sw.write_plans(result, out)
    except DascInputError as exc:
        _err.print(error_line(str(exc)), markup=False)
        raise typer.Exit(code=2)
    except EvalInterrupted as exc:     # Ctrl-C / SIGTERM during --eval: plans are written after it, so none were
        _err.print(error_line(f"{exc}; nothing written"), markup=False)
        raise typer.Exit(code=exc.exit_code)
    from dasc_compile.sweep_report import plot_sweep, render, sweep_json

    # The figure before the summary, so that a stdout that fails or a Ctrl-C during the table leaves it whole and
    # the error line names it (cli_exit.note_written); a figure that cannot be written is reported after the table.
    failed = None
    if plot is not None:
        note_pending(plot)       # a signal before it is in place says it was not written (cli_exit)
        try:
            plot_sweep(result, plot)
        except DascInputError as exc:
            failed = exc
    for line in _warnings(result):
        _err.print(f"warning: {line}", markup=False)
    if as_json:
        sys.stdout.write(json.dumps(sweep_json(result, user_flags=user_flags, plan_dir=out), indent=1) + "\n")
        said = _err                     # stdout carries only the JSON document
    else:
        said = console(highlight=False, soft_wrap=True) if sys.stdout.isatty() else \
            console(highlight=False, soft_wrap=True, width=200)
        render(result, said, user_flags=user_flags, plan_dir=out)
    if out is not None:
        said.print(f"wrote {len(result.rows)} plans into {out}", markup=False)
    if plot is not None and failed is None:
        said.print(f"wrote {plot}", markup=False)     # stdout as inspect and eval, unless --json holds it
    if failed is not None:
        _err.print(error_line(str(failed)), markup=False)
        raise typer.Exit(code=2)


def _check_flags(quality, eval_prompts, budget, max_running_requests, plot) -> None:
    """Flag combinations that cannot work, refused before any reading."""
    if len(quality) > 1:
        raise DascInputError("--max-kl and --max-nll-delta are alternatives: give one quality budget")
    if quality and eval_prompts is None:
        flag = "--max-kl" if quality[0][0] == "kl" else "--max-nll-delta"
        raise DascInputError(f"{flag} needs --eval PROMPTS: each plan's quality is measured by dasc eval")
    if quality and not quality[0][1] >= 0:
        raise DascInputError(f"{'--max-kl' if quality[0][0] == 'kl' else '--max-nll-delta'} {quality[0][1]}: "
                             f"expected a number >= 0 (nats per token)")
    if (budget is None) != (max_running_requests is None):
        raise DascInputError("--budget and --max-running-requests go together: every arm is sized to run R "
                             "requests in the same state memory")
    if plot is not None:
        from dasc_compile.figures import check_png

        check_png(plot)


def _check_companions(eval_prompts, budget, **given) -> None:
    """A flag that only acts with ``--eval`` or ``--budget`` is refused without it: silently ignoring
    ``--prefix-len 2048`` (or ``--mamba-radix-cache-strategy no_buffer``) would print figures for
    settings the user did not ask for."""
    needs = {"prefix_len": ("--prefix-len", "--eval PROMPTS"), "suffix_len": ("--suffix-len", "--eval PROMPTS"),
             "device": ("--device", "--eval PROMPTS"),
             "strategy": ("--mamba-radix-cache-strategy", "--budget BYTES --max-running-requests R"),
             "no_overlap": ("--disable-overlap-schedule", "--budget BYTES --max-running-requests R")}
    for key, value in given.items():
        flag, partner = needs[key]
        missing = eval_prompts is None if partner.startswith("--eval") else budget is None
        if missing and value not in (None, False):
            raise DascInputError(f"{flag} acts only with {partner}: give it with {partner.split()[0]}, or drop it")


def _sizing(budget, r, strategy, overlap, refresh_slots):
    if budget is None:
        if refresh_slots is not None:
            raise DascInputError("--refresh-slots sizes dasc-wr's scratch slots: give it with --budget")
        return None
    from dasc_compile.size_report import parse_bytes
    from dasc_compile.sweep import Sizing
    from dasc_runtime.sizing import _check_count

    _check_count("--max-running-requests", r)
    if refresh_slots is not None:
        _check_count("--refresh-slots", refresh_slots)
    return Sizing(budget_bytes=parse_bytes(budget), max_running_requests=r, strategy=strategy,
                  overlap_schedule=overlap, refresh_slots=refresh_slots)


def _user_flags(policy, config, a_s, eps, load_policy, balance) -> list[str]:
    """The compile flags the user gave, as ``dasc compile`` takes them (for the recommended command)."""
    out = []
    for flag, value in (("--policy", policy), ("--config", config), ("--a-s", a_s), ("--eps", eps),
                        ("--load-policy", load_policy), ("--balance", balance)):
        if value is not None:
            out += [flag, str(value)]
    return out


def _warnings(result) -> list[str]:
    """Each distinct warning once: what dasc compile would say about a plan, and flags the runtime needs."""
    seen: list[str] = []
    for line in [*(w for r in result.rows for w in r.warnings), *result.notes]:
        if line not in seen:
            seen.append(line)
    return seen
