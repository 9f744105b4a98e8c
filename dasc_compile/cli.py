"""The ``dasc`` command line (typer): ``compile``, ``inspect``, ``reference``.

Every bad input ends in one line ``error: <what, where, expected>`` on stderr and exit status 2;
how every other ending looks (closed pipe, Ctrl-C, an internal error) is :mod:`dasc_compile.cli_exit`.
Things a user should know about a valid plan are ``warning: ...`` lines on stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from dasc_compile.console import console
from dasc_compile.errors import DascInputError, check_seed, error_line
from dasc_compile.userfiles import path_text

ROOT_HELP = ("Decay-Aware State Compression for hybrid linear-attention models: compile a plan from a "
             "checkpoint's decay tensors, choose w_max (sweep), inspect it, size the serving arms (size), "
             "measure its quality cost (eval), write reference checkpoints (reference).")
# Help texts are rich markup (``\[`` for a literal bracket): said here, as typer before 0.20 printed them raw
app = typer.Typer(add_completion=False, no_args_is_help=True, help=ROOT_HELP, rich_markup_mode="rich")
err = console(stderr=True, highlight=False, soft_wrap=True)


def _fail(exc: Exception) -> None:
    err.print(error_line(str(exc)), markup=False)
    raise typer.Exit(code=2)


def _version(value: bool) -> None:
    if value:
        from dasc_compile import __version__
        from dasc_compile.schema import SCHEMA_VERSION

        typer.echo(f"dasc {__version__} (plan schema_version {SCHEMA_VERSION})")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the dasc version and the plan schema version, then exit.")) -> None:
    """Decay-Aware State Compression (see ROOT_HELP)."""


@app.command("compile")
def compile_cmd(
    model_path: Path = typer.Argument(..., metavar="MODEL", help="A .safetensors file, a directory (config.json + shards) or a model.safetensors.index.json.", parser=path_text),
    wmax: Optional[int] = typer.Option(None, "--wmax", help="Retention-horizon cutoff W_max in tokens (units with H_s > W_max are kept); required unless the policy file sets w_max."),
    policy: Optional[Path] = typer.Option(None, "--policy", metavar="FILE", help="YAML policy file; flags override its fields.", parser=path_text),
    tp: Optional[int] = typer.Option(None, "--tp", help="Tensor-parallel degree P the plan is compiled for."),
    balance: Optional[str] = typer.Option(None, "--balance", help="TP placement: off | storage | hybrid."),
    out: Optional[Path] = typer.Option(None, "--out", metavar="DIR", help="Plan directory to write (default: <model name>.dasc in the current folder).", parser=path_text),
    config: Optional[Path] = typer.Option(None, "--config", metavar="FILE", help="config.json for a lone .safetensors file.", parser=path_text),
    a_s: Optional[float] = typer.Option(None, "--a-s", help="Representative gate input a_s (default: family's)."),
    eps: Optional[float] = typer.Option(None, "--eps", help="Horizon threshold epsilon (default 1e-3)."),
    family: Optional[str] = typer.Option(None, "--family", help="Force a decay family: gdn | kda | kda_safe_gate | mamba2."),
    load_policy: Optional[str] = typer.Option(None, "--load-policy", help="nr (zero-fill) or wr (suffix refresh)."),
    int8: Optional[bool] = typer.Option(None, "--int8/--no-int8", help="Store kept units as INT8 (App. E)."),
    seed: Optional[int] = typer.Option(None, "--random-seed", help="Count-matched random mask from this seed (Random baseline)."),
    pool_budget: Optional[str] = typer.Option(None, "--pool-budget", help="Per-rank compressed-pool budget, e.g. 1073741824 or 1GiB (for usable slots)."),
    no_kernels: bool = typer.Option(False, "--no-kernels", help="Do not render the Triton kernel module."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the plan path."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary (path, content hash, totals, warnings) "
                                                       "as one JSON document (keys: docs/cli.md)."),
) -> None:
    """Compile a dasc plan from a checkpoint's decay tensors."""
    model = model_path          # typer shows an argument whose metavar equals its name by its parser's name
    from dasc_compile.artifact import recover_out
    from dasc_compile.compiler import compile_plan, default_out_dir
    from dasc_compile.plan_checks import plan_warnings
    from dasc_compile.policy import POLICY_FLAGS, resolve_policy

    try:
        if quiet and as_json:
            raise DascInputError("--quiet and --json are alternatives: --quiet prints the plan path, --json the "
                                 "whole summary; give one")
        recover_out(out if out is not None else default_out_dir(model))   # first: undo an interrupted replacement
        if pool_budget is not None:
            from dasc_compile.size_report import parse_bytes
            pool_budget = parse_bytes(pool_budget, "--pool-budget")
        pol = resolve_policy(policy, flags=POLICY_FLAGS, w_max=wmax, tp_size=tp, balance=balance, a_s=a_s, eps=eps, family=family,
                             load_policy=load_policy, int8=int8, random_seed=seed, pool_budget_bytes=pool_budget)
        plan, path = compile_plan(model, pol, out, config=config, with_kernels=not no_kernels)
    except DascInputError as exc:
        _fail(exc)
    warnings = plan_warnings(plan) + _policy_family_warnings(policy, plan.model.family)
    for line in warnings:
        err.print(f"warning: {line}", markup=False)
    from dasc_compile.compile_summary import summary_json, summary_line

    if as_json:
        sys.stdout.write(json.dumps(summary_json(plan, path, warnings), indent=1) + "\n")
        return
    con = console(highlight=False, soft_wrap=True)   # one line per message: never wrapped into two
    if quiet:
        con.print(str(path / "plan.json"), markup=False)
        return
    con.print(summary_line(plan, path), markup=False)
    from dasc_compile.provenance import figure_label, short_line

    if figure_label(plan.model.provenance) is not None:   # any generated decay source: say which, in one short line
        con.print(f"note: decay values not trained; {short_line(plan.model.provenance)}", markup=False)


def _policy_family_warnings(policy: Optional[Path], family: str) -> list[str]:
    """A policy file named after another decay family than the model's (``gdn.yaml`` on a KDA model):
    one warning line. Policy files carry no family key, so their name is the only hint."""
    from typing import get_args

    from dasc_compile.policy import FamilyName

    if policy is None or policy.stem not in get_args(FamilyName) or policy.stem == family:
        return []
    hint = f" (plans/policies/{family}.yaml holds this family's)" if family in get_args(FamilyName) else ""
    return [f"{policy}: this policy file is named for family '{policy.stem}' but the model is '{family}'; "
            f"its defaults (w_max, a_s) may not suit it{hint}"]


@app.command("inspect")
def inspect_cmd(
    plan_path: Path = typer.Argument(..., metavar="PLAN", help="plan.json or its directory.", parser=path_text),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document (keys: docs/cli.md)."),
    plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE", help="Write a PNG: retained-fraction heatmap and horizon histogram.", parser=path_text),
) -> None:
    """Explain a compiled plan: per-layer counts, ratios, per-rank loads, refresh window."""
    from dasc_compile import inspect as insp
    from dasc_compile.figures import check_png
    from dasc_compile.schema import load_plan

    try:
        if plot is not None:
            check_png(plot)
        plan = load_plan(plan_path)   # also checks the kernel module beside plan.json
        if plot is not None:
            from dasc_compile.plot import plot_plan

            plot_plan(plan, plot)
    except DascInputError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(insp.inspect_json(plan), indent=1) + "\n")
        return
    # a pipe or file gets 160 columns so the per-layer table stays readable; a terminal keeps its width
    con = console() if sys.stdout.isatty() else console(width=160)
    insp.render_report(plan, con)
    if plot is not None:
        con.print(f"wrote {plot}")


@app.command("reference")
def reference_cmd(
    name: str = typer.Argument(..., metavar="NAME", help="Initialisation draw: qwen3-next-80b-a3b | kimi-linear-48b-a3b | qwen3.5-27b | "
                               "nemotron-h-8b-base-8k | granite-4.0-h-tiny | falcon-h1-0.5b. "
                               "Calibrated to the paper's published figures: kimi-linear-48b-a3b-calibrated | "
                               "qwen3-next-80b-a3b-calibrated | kimi-k3-calibrated | qwen3.5-27b-calibrated."),
    out: Path = typer.Option(..., "--out", metavar="DIR", help="Directory to write.", parser=path_text),
    full_size: bool = typer.Option(False, "--full-size", help="Every real tensor, sparse on disk, sharded with an index."),
    seed: int = typer.Option(0, "--seed", help="Seed of the initialisation draw or calibrated synthesis of the decay tensors."),
) -> None:
    """Write a reference checkpoint (exact names/shapes/dtypes; decay values not trained: an initialisation
    draw, or for *-calibrated names synthesised to match the paper's published statistics)."""
    from dasc_compile import calibrated, refckpt
    from dasc_compile.atomic import write_new_dir

    try:
        check_seed("--seed", seed)
        if name not in calibrated.CALIBRATED_NAMES and name not in refckpt.MODEL_NAMES:
            raise DascInputError(f"reference model {name!r} is unknown; expected one of "
                                 f"{list(refckpt.MODEL_NAMES) + list(calibrated.CALIBRATED_NAMES)}")
        if name in calibrated.CALIBRATED_NAMES:
            if full_size:
                raise DascInputError(f"--full-size: {name} is written decay-only (config.json + decay tensors); "
                                     f"full-size checkpoints exist for {', '.join(refckpt.MODEL_NAMES)}")
            write_new_dir(out, lambda tmp: calibrated.write_calibrated(name, tmp, seed=seed))
        else:
            if full_size:   # before writing: the user should know what lands on disk
                err.print(f"warning: {_full_size_note(name)}", markup=False)
            write_new_dir(out, lambda tmp: (refckpt.write_full_size if full_size else refckpt.write_decay_only)(
                name, tmp, seed=seed))
    except DascInputError as exc:
        _fail(exc)
    console().print(f"wrote {out}", markup=False)


def _full_size_note(name: str) -> str:
    """The ``--full-size`` warning: the apparent size of what is written, and that holes keep it small on disk."""
    from dasc_compile import refckpt

    gb = refckpt.full_size_bytes(name) / 1e9
    return (f"--full-size writes {name} at its real size: {gb:,.0f} GB of tensors ({gb / 1.073741824:,.0f} GiB), "
            f"all but the decay tensors sparse holes (a few MB on a file system with sparse files: ext4, xfs, "
            f"btrfs, tmpfs); a copy or archive that does not keep holes writes all {gb:,.0f} GB")


@app.command("size")
def size_cmd(
    plan_path: Path = typer.Argument(..., metavar="PLAN", help="plan.json or its directory.", parser=path_text),
    max_running_requests: Optional[int] = typer.Option(None, "--max-running-requests", help="R: running requests of every arm (required)."),
    dense_slots: Optional[int] = typer.Option(None, "--dense-slots", help="M: the Dense arm's native slots (or give --budget)."),
    budget: Optional[str] = typer.Option(None, "--budget", help="State budget per TP rank, e.g. 2147483648 or 2GiB (fixes M)."),
    strategy: str = typer.Option("extra_buffer", "--mamba-radix-cache-strategy", help="extra_buffer (default) | no_buffer (extra_buffer_lazy: the dasc runtime refuses it)."),
    no_overlap: bool = typer.Option(False, "--disable-overlap-schedule", help="Size for SGLang without its overlap scheduler."),
    pair_plan: Optional[str] = typer.Option(None, "--pair-plan", help="The same plan compiled with the other --int8 setting (same w_max, load policy, TP size and balance)."),
    as_json: bool = typer.Option(False, "--json", help="Print the arms as one JSON list."),
    refresh_slots: Optional[int] = typer.Option(None, "--refresh-slots",
                                                help="dasc-wr: scratch slots B (--dasc-refresh-slots), each charged as a dense slot; default the runtime's 8, capped as the server caps it so B windows fit one prefill chunk."),
) -> None:
    """Native and compressed slots, capacity and SGLang flags of every arm at equal state memory (App. C.1)."""
    from dasc_compile.size_report import size_command

    try:
        warnings = size_command(str(plan_path), max_running_requests=max_running_requests, dense_slots=dense_slots,
                                budget=budget, strategy=strategy, overlap_schedule=not no_overlap,
                                pair_plan=pair_plan, as_json=as_json, refresh_slots=refresh_slots)
    except DascInputError as exc:
        _fail(exc)
    for line in warnings:
        err.print(f"warning: {line}", markup=False)


# `dasc eval` (quality cost of a plan, horizon validation): its body lives in dasc_compile.eval.command
from dasc_compile.eval.command import eval_cmd  # noqa: E402

app.command("eval")(eval_cmd)

# `dasc sweep` (choose w_max: a w_max x TP x INT8 grid in memory): its body lives in dasc_compile.sweep_command
from dasc_compile.sweep_command import sweep_cmd  # noqa: E402

app.command("sweep")(sweep_cmd)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default ``sys.argv[1:]``) and return the exit status; never raises.

    Usage errors (a non-integer ``--wmax``, an unknown option, a missing argument) are one
    ``error:`` line with status 2, like every other bad input; closed pipes, signals and internal
    errors end as :func:`dasc_compile.cli_exit.run_guarded` describes.
    """
    from dasc_compile.cli_exit import run_guarded

    try:  # typer >= 0.26 vendors click as typer._click
        from typer._click import exceptions as cx
    except ImportError:  # older typer (>= 0.18, pyproject's floor) runs on plain click (>= 8.3)
        from click import exceptions as cx

    def body() -> int:
        from typer.main import get_command

        from dasc_compile import cli_argv

        words = list(sys.argv[1:] if argv is None else argv)
        group = get_command(app) if isinstance(app, typer.Typer) else None   # None: a test's stand-in for the app
        before = (cli_argv.option_swallowed_option(group, words) or cli_argv.repeated_option(group, words)
                  or cli_argv.loose_number(group, words))
        if before is not None:
            err.print(error_line(before), markup=False)
            return 2
        try:
            rc = app(args=argv, prog_name="dasc", standalone_mode=False)
        except cx.UsageError as exc:
            msg = exc.format_message()
            if isinstance(exc, cx.NoSuchOption) and exc.possibilities:   # click: "...: --x Did you mean --y?"
                # difflib's order, the closest first; --help only for a name that starts like it (click offered
                # it for `dasc size --tp 2`, an option of another command)
                near = [p for p in exc.possibilities if p != "--help" or exc.option_name.startswith("--h")]
                msg = exc.message.rstrip(".")                 # click 8.5 ends it with a stop
                if near:
                    names = near[0] if len(near) == 1 else f"{', '.join(near[:-1])} or {near[-1]}"
                    msg += f"; did you mean {names}?"
            split = cli_argv.size_split_in_two(words) if "extra argument" in msg else None
            msg = split or msg
            no_args = isinstance(exc, cx.NoArgsIsHelpError)    # a bare `dasc`
            if no_args or (msg == "Missing command." and exc.ctx is not None and exc.ctx.parent is None):
                if no_args and msg:     # the help as text (typer's rich help prints itself and leaves it empty)
                    typer.echo(msg)
                names = f"; choose one of {', '.join(sorted(group.commands))}" if group is not None else ""
                err.print(error_line(f"no command given{names} (see 'dasc --help')"), markup=False)
            else:
                hint = cli_argv.help_hint(group, words, exc.ctx) + cli_argv.wmax_list_hint(words, msg)
                err.print(error_line(f"{msg}{hint}"), markup=False)
            return 2
        except cx.ClickException as exc:   # other click errors (e.g. a file option that cannot be opened)
            err.print(error_line(exc.format_message()), markup=False)
            return exc.exit_code or 2
        return rc if isinstance(rc, int) else 0

    return run_guarded(body)


def main() -> None:
    """``sys.exit(run())``, a signal after the command ignored (:func:`dasc_compile.cli_exit.finish`)."""
    from dasc_compile.cli_exit import finish

    finish(run())


if __name__ == "__main__":
    main()
